"""The run doctor inside a run (rank 0): started with the history metrics.jsonl holds, fed every RL step, its findings
as the console shows them, and `train.doctor` stop / restore acted on by every process at the same step. The checks
themselves are grpo/run/doctor/window_checks.py's and end_checks.py's, run by grpo/run/doctor/verdict.py's `Doctor`;
the loop (grpo_train.py) sees the doctor through the face grpo/run/doctor/__init__.py alone."""

from __future__ import annotations

from typing import Any

from grpo import config as C
from grpo.run.checkpoint.save_resume import restore_best
from grpo.run.doctor.report import configured_kl_bands
from grpo.run.doctor.thresholds import Finding
from grpo.run.doctor.verdict import Doctor
from grpo.run.record import Run
from grpo.run.tracking import METRICS_FILE, read_metrics

__all__ = ["start_doctor", "consult_doctor", "doctor_line", "doctor_stops"]


def start_doctor(run: Run) -> None:
    """Start the run doctor on rank 0 and feed it what metrics.jsonl holds so far: the evaluations and the SFT loss
    before RL and, after a resume, the RL steps already run, so its windows and streaks go on where they were."""
    if not run.dist.is_main:
        return
    settings = C.to_dict(run.cfg)
    run.doctor = Doctor(kl_bands=configured_kl_bands(settings, run.tasks), config=settings)
    if (run.run_dir / METRICS_FILE).is_file():
        run.doctor.replay(read_metrics(run.run_dir))


def consult_doctor(run: Run, metrics: dict[str, Any]) -> dict[str, float]:
    """Feed one RL step's metrics (and the held-out evaluations so far) to the doctor on rank 0; the findings that
    fired go to `run.progress.alarms`. Returns doctor/<code> (1.0 while active) and doctor/red for the step's row; {}
    elsewhere."""
    if not run.dist.is_main:
        return {}
    if run.doctor is None:
        start_doctor(run)
    run.progress.alarms = run.doctor.update(metrics, run.progress.evals)
    return run.doctor.metrics()


def doctor_line(f: Finding, when: str) -> str:
    """A finding as the console shows it: level, code, when, what was seen, then the one next step."""
    return f"doctor: [{f.level}] {f.code} ({when}): {f.message}\n  -> {f.suggestion}"


def doctor_stops(run: Run) -> bool:
    """Whether RL ends after this step: train.doctor is stop or restore and a red finding is active. Rank 0 decides
    (it alone holds the doctor), every rank gets the same answer; under restore every rank first loads the best
    Pareto point's weights (`restore_best`)."""
    action = run.cfg.train.doctor
    if action == "warn":
        return False
    red = [f for f in run.doctor.findings() if f.level == "red"] if run.doctor is not None else []
    if not run.dist.any(bool(red)):
        return False
    say = print if run.dist.is_main else (lambda *a, **k: None)
    say(f"doctor: RL stopped after step {run.progress.step} (train.doctor={action}): "
        + ", ".join(sorted({f.code for f in red})), flush=True)
    if action == "restore":
        folder = restore_best(run)
        say(f"doctor: weights restored from the best Pareto point {folder}" if folder is not None else
            "doctor: no Pareto point yet (no evaluation since RL started): the weights stay as they are", flush=True)
    return True
