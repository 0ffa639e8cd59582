"""What a finished (or running) run folder gives, from the command line:

    python -m grpo.run.doctor report RUN_DIR   # writes RUN_DIR/report.json and prints the before/after summary
    python -m grpo.run.doctor plot RUN_DIR     # draws RUN_DIR/plot.png and prints its path

Run through the package, not as `python -m grpo.run.doctor.report`: the package's face has loaded report.py and
plot.py already, and Python would run a second copy of the module (and warn so). A folder that is not a run folder
exits with status 2 and the reason on stderr.
"""

from __future__ import annotations

import argparse
import sys

from grpo.run.doctor.plot import plot_run
from grpo.run.doctor.report import build_report, format_report

TOOLS = {"report": ("write RUN_DIR/report.json and print the summary",
                    lambda run_dir: format_report(build_report(run_dir))),
         "plot": ("plot a grpo-dual run folder into RUN_DIR/plot.png", lambda run_dir: str(plot_run(run_dir)))}
"""Each command: what it does (its --help line), and what it prints for a run folder."""


def doctor_cli(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m grpo.run.doctor", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, (what, _) in TOOLS.items():
        command = commands.add_parser(name, help=what, description=what[0].upper() + what[1:] + ".")
        command.add_argument("run_dir", help="folder holding metrics.jsonl (and optionally config.json, eval.json)")
    args = parser.parse_args(argv)
    try:
        print(TOOLS[args.command][1](args.run_dir))
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    doctor_cli()
