"""The run doctor wing: the checks over a moving window of the step metrics and at the end of a run
(thresholds.py, window_checks.py, end_checks.py), the `Doctor` that runs them every RL step and the verdict
(verdict.py), the doctor inside a run (in_run.py: started, consulted, its findings on the console, train.doctor's
stop / restore), and what a finished run folder gives: report.json with the before/after table and verdict
(report.py) and plot.png (plot.py). grpo_train.py sees the wing through the names below."""

from .in_run import consult_doctor, doctor_line, doctor_stops, start_doctor
from .plot import plot_run
from .report import build_report, format_report

__all__ = ["build_report", "consult_doctor", "doctor_line", "doctor_stops", "format_report", "plot_run",
           "start_doctor"]
