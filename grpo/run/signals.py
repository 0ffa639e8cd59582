"""Ctrl-C / SIGTERM. In the RL loop (`StopRequest`): finish the current step, write a checkpoint, then the command
line exits 130 / 143. Anywhere else (set-up, SFT, evaluations: `signals_raise` + `Interrupted`): a one-line message
and the same exit status, no traceback; a run folder without a checkpoint stays restartable (grpo/run/checkpoint/folder.py)."""

from __future__ import annotations

import contextlib
import signal
import threading


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
