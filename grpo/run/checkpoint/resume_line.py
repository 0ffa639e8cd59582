"""How to resume this run: the one home of the advice every early end prints (an interrupt, a signal, a full disk, a
crash, a final model that could not be written).

The advice is the user's own command as they typed it (sys.argv of the `grpo-dual` / `python grpo_train.py` process,
TRL's flags and config file included, quoted for a POSIX shell) with `--resume auto` in place of any --resume, no
--overwrite (which would delete the checkpoints it resumes from), and `--run-name` added where the run folder was
named after the clock (else `--resume auto` would look in a new folder). A run started from Python (`train(...)`)
gets the Python form instead: the command line is not how it was started.
"""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path
from typing import Sequence

from grpo.run.checkpoint.files import list_complete

__all__ = ["note_command_line", "python_resume", "resume_advice", "resume_command"]

_started_by: list[str] | None = None
"""sys.argv of the command line that started this process's run; None for a run started from Python."""

_RESUME = {"--resume", "--checkpoint.resume"}
_OVERWRITE = {"--overwrite"}
_VALUED_OVERWRITE = {"--train.overwrite"}
_DOTTED = ("checkpoint.resume=", "train.overwrite=")


def note_command_line(argv: Sequence[str] | None) -> None:
    """Record how this process's run was started: `argv` = its sys.argv (the program first), None from Python."""
    global _started_by
    _started_by = None if argv is None else list(argv)


def _program(argv0: str) -> list[str]:
    """The program as the user can type it again: `python grpo_train.py` (the path as given), the installed
    `grpo-dual` by its name when that name finds it, else its path."""
    name = Path(argv0).name
    if name.endswith(".py"):
        return ["python", argv0]
    found = shutil.which(name)
    return [name] if found and Path(found).resolve() == Path(argv0).resolve() else [argv0 or "grpo-dual"]


def resume_command(argv: Sequence[str], run_name: str = "") -> str:
    """`argv` (a sys.argv: the program, then its arguments) as a shell line that resumes the run: every --resume
    (--resume X, --resume=X, --checkpoint.resume, --set checkpoint.resume=X) and --overwrite left out, `--resume
    auto` added, and `--run-name run_name` when given (a run folder named after the clock)."""
    args, kept, i = list(argv[1:]), [], 0
    while i < len(args):
        arg = args[i]
        key = arg.split("=", 1)[0]
        if key in _RESUME or key in _VALUED_OVERWRITE:
            i += 1 if "=" in arg else 2
            continue
        if key in _OVERWRITE:
            i += 1
            continue
        if arg == "--set" and i + 1 < len(args) and args[i + 1].startswith(_DOTTED):
            i += 2
            continue
        kept.append(arg)
        i += 1
    named = ["--run-name", run_name] if run_name else []
    return shlex.join([*_program(argv[0] if argv else "grpo-dual"), *kept, *named, "--resume", "auto"])


def python_resume() -> str:
    """The Python form of the advice (a run started by `train(...)`, or by TRL's GRPOTrainer)."""
    return ('call the same train(...) again with checkpoint={"resume": "auto"} (with a GRPOTrainer: '
            "trainer.train(resume_from_checkpoint=True))")


def resume_advice(run_dir: Path | None, run_name: str, first: str = "") -> str:
    """How to go on after this run stopped early: the last complete checkpoint of `run_dir` and the command (or the
    Python call) that resumes from it; or, without one, that the same command starts the run again. `run_name`: the
    run name the config gave ("" = the folder was named after the clock); `first`: what to do before resuming
    ("free space")."""
    complete = list_complete(run_dir) if run_dir is not None else []
    argv = _started_by
    if not complete:
        again = ("the same call" if argv is None
                 else f"the same command:\n  {shlex.join([*_program(argv[0]), *argv[1:]])}")
        return f"No complete checkpoint was written: {first + ', then ' if first else ''}start it again with {again}"
    how = (python_resume() if argv is None else
           "resume with:\n  " + resume_command(argv, "" if run_name else Path(run_dir).name))
    return f"The last complete checkpoint is {complete[-1]}: {first + ', then ' if first else ''}{how}"
