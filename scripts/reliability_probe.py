"""A tester's probe of the command line: bad inputs and faults a user meets, each tried as a user would.

    python -m scripts.reliability_probe                   # every case (docs/VALIDATION.md: how long it takes)
    python -m scripts.reliability_probe --only seed-2e70-config temperature-1e-300
    python -m scripts.reliability_probe --list            # the cases, their groups and the words each message needs

Each case writes what it needs (rows, a reward function, a config file, a fake model folder) into a temporary folder
of its own, runs `python grpo_train.py` there on the tiny demo model (a few RL steps, no warm-up) under a time limit,
and classifies what came out:

    OK-refused   exit status not 0, no traceback, and the message names every word the case lists (field, file)
    OK-handled   valid input (or a fault the program may absorb), exit status 0, nothing lost
    TRACEBACK    a Python traceback anywhere in the output
    SILENT       exit status 0 where the input should be refused, or something the user owns lost or mangled
    HANG         still running at the case's time limit (killed)
    VAGUE        refused, but the message does not name what the case lists
    REFUSED      valid input refused

A message is the standard error plus the last lines of the standard output; words are matched case-sensitively (a
field name is lower case, an environment variable upper case). Prints a table and a count per outcome; exit status
1 when any case is not OK-*. Words that may take several forms are alternatives ("train.max_steps" or
"--max-steps"). The cases are listed by group (what goes wrong); `baseline` is a valid run that checks the probe
itself. The cases live in scripts/probe_cases.py, the way a case runs and is classified in scripts/probe_lab.py.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from scripts.probe_cases import CASES
from scripts.probe_lab import (
    EITHER,
    FAILURES,
    HANDLE,
    OK_HANDLED,
    OK_REFUSED,
    OUTCOMES,
    REFUSE,
    Case,
    Lab,
    Proc,
    Trial,
    classify,
    show,
)

__all__ = ["CASES", "EITHER", "FAILURES", "HANDLE", "OUTCOMES", "REFUSE", "Case", "Proc", "Trial", "classify", "main"]
"""What the probe offers its tests: the cases, the outcomes and the classification (from scripts/probe_cases.py and
scripts/probe_lab.py), and main."""

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------------ the fake judge
class JudgeServer:
    """tests/judge_server.py as a subprocess on a free port, started on first use."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def __call__(self) -> str:
        if self.proc is None:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            self.proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "judge_server.py"), "--port", str(port)],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.time() + 30
            while time.time() < deadline:
                with socket.socket() as s:
                    if s.connect_ex(("127.0.0.1", port)) == 0:
                        break
                time.sleep(0.1)
            self.url = f"http://127.0.0.1:{port}/v1"
        return self.url

    def close(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


# ------------------------------------------------------------------------------------------------ the probe
@dataclass
class Result:
    case: Case
    outcome: str
    note: str
    seconds: float


def run_case(case: Case, root: Path, judge: JudgeServer) -> Result:
    folder = root / case.name
    folder.mkdir(parents=True)
    lab = Lab(folder, case.limit_s, judge)
    start = time.time()
    try:
        trial = case.act(lab)
        outcome, note = classify(case, trial)
    except (RuntimeError, OSError) as e:  # the case could not be set up: the probe's failure, shown as such
        outcome, note = "TRACEBACK", f"probe set-up failed: {e}"
    finally:
        lab.stop_background()
    return Result(case, outcome, note, time.time() - start)


def table(results: list[Result], width: int = 150) -> str:
    name_w = max(len(r.case.name) for r in results)
    lines = [f"{'case':{name_w}}  {'group':15} {'outcome':10} {'s':>4}  note", "-" * width]
    for r in results:
        row = f"{r.case.name:{name_w}}  {r.case.group:15} {r.outcome:10} {r.seconds:4.0f}  {r.note}"
        lines.append(row if len(row) <= width else row[: width - 3] + "...")
    return "\n".join(lines)


def summary(results: list[Result]) -> str:
    counts = {o: sum(r.outcome == o for r in results) for o in OUTCOMES}
    shown = [f"{o} {n}" for o, n in counts.items() if n or o in (OK_REFUSED, OK_HANDLED)]
    return f"{len(results)} cases: " + ", ".join(shown)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.reliability_probe",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run these cases only")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--keep", metavar="DIR", help="write the case folders here and keep them (default: a "
                        "temporary folder, deleted after)")
    args = parser.parse_args(argv)
    if args.list:
        for case in CASES:
            words = ", ".join(show(w) for w in case.words) or "-"
            print(f"{case.name:32} {case.group:15} {case.expect:7} needs: {words:45} {case.why}")
        return 0
    names = {c.name for c in CASES}
    unknown = sorted(set(args.only or ()) - names)
    if unknown:
        parser.error(f"no case named {', '.join(unknown)}; the cases: {', '.join(c.name for c in CASES)}")
    chosen = [c for c in CASES if not args.only or c.name in args.only]
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="grpo_probe_"))
    root.mkdir(parents=True, exist_ok=True)
    judge = JudgeServer()
    results = []
    try:
        for case in chosen:
            result = run_case(case, root, judge)
            print(f"  {case.name}: {result.outcome} ({result.seconds:.0f} s)", flush=True)
            results.append(result)
    finally:
        judge.close()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(table(results))
    print(summary(results))
    return 1 if any(r.outcome in FAILURES for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
