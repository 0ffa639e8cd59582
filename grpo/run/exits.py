"""How a run ends early: on a signal, or on an error a user can cause; one line naming why, no traceback.

Ctrl-C / SIGTERM. In the RL loop (`StopRequest`): finish the current step, write a checkpoint, then the command
line exits 130 / 143. Anywhere else (set-up, SFT, evaluations: `signals_raise` + `Interrupted`): a one-line message
and the same exit status, no traceback; a run folder without a checkpoint stays restartable
(grpo/run/checkpoint/folder.py).

`USER_ERRORS` are the exception classes bad input produces (a config value, a data file, a grader, a model path, a
missing SDK, an unreadable or full disk, a pickle given as a model); `user_error` prints one line and returns the exit
status the caller chose (2 before the model loads, 1 after). `exit_interrupted`: Ctrl-C / SIGTERM outside the RL loop.
"""

from __future__ import annotations

import contextlib
import pickle
import signal
import sys
import threading

from grpo.config import ConfigError
from grpo.core.weight_guard import TrainingUnstable
from grpo.data.json_rows import DataFileError
from grpo.grading.graders import GraderError

__all__ = ["RUN_FAILURES", "USER_ERRORS", "Interrupted", "StopRequest", "exit_interrupted", "signals_raise",
           "user_error"]
"""The names the entry point takes from this module, its face (tests/test_house.py); the rest serve the package."""


class Interrupted(Exception):
    """SIGINT / SIGTERM outside the RL loop; `code` = 128 + the signal number (130, 143)."""

    def __init__(self, signum: int):
        super().__init__(f"{signal.Signals(signum).name}")
        self.signum = signum
        self.code = 128 + signum


def _raise(signum, frame) -> None:
    raise Interrupted(signum)


@contextlib.contextmanager
def signals_raise():
    """Inside: SIGINT and SIGTERM raise `Interrupted` (caught by the entry point: a message and exit 130 / 143)
    instead of a KeyboardInterrupt traceback or a silent death by SIGTERM. Main thread only; else nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _raise) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


class StopRequest:
    """Ctrl-C / SIGTERM: finish the current step, write a checkpoint; `signum` says which signal asked. A second
    Ctrl-C exits at once."""

    def __init__(self) -> None:
        self.requested = False
        self.signum = 0

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self.signum = signum
        print(f"\n{signal.Signals(signum).name}: finishing this step, then saving a checkpoint "
              "(press Ctrl-C again to exit at once)", flush=True)

    def installed(self):
        @contextlib.contextmanager
        def scope():
            if threading.current_thread() is not threading.main_thread():
                yield self
                return
            previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield self
            finally:
                for s, handler in previous.items():
                    signal.signal(s, handler)
        return scope()


USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, KeyError, OSError, ImportError, pickle.UnpicklingError,
                                                EOFError)
"""ValueError covers ConfigError, DataFileError, GraderError, RunFolderError, CheckpointError's and transformers'
validation errors; OSError covers missing files, full disks, permission errors (their message names the path)."""

RUN_FAILURES: tuple[type[BaseException], ...] = (*USER_ERRORS, TrainingUnstable)
"""What ends a run after set-up with its one-line message and exit 1 (a bad weight step that the guard could not
restore from, besides the user's errors); the last checkpoint, if any, is intact."""


def user_error(error: BaseException, code: int) -> int:
    """Print `error` as the entry point's one message and return `code`. Errors that name their field or file
    (config, data, grader) print as they are; others after their class name; a KeyError without its quotes, an
    OSError with its path when the message lacks it."""
    text = str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)
    if isinstance(error, OSError) and error.filename and str(error.filename) not in text:
        text = f"{text} ({error.filename})"
    named = isinstance(error, (ConfigError, DataFileError, GraderError))
    print(f"error: {text}" if named else f"error: {type(error).__name__}: {text}", file=sys.stderr)
    return code


def exit_interrupted(error: BaseException, where: str, advice: str) -> int:
    """Ctrl-C (KeyboardInterrupt or Interrupted(SIGINT)) -> 130, SIGTERM -> 143, with one line saying where, then
    `advice`: how to go on (grpo/run/checkpoint/resume_line.py's resume_advice)."""
    signum = error.signum if isinstance(error, Interrupted) else signal.SIGINT
    print(f"\ninterrupted by {signal.Signals(signum).name} {where}: no checkpoint written since the last one. {advice}",
          file=sys.stderr)
    return 128 + int(signum)
