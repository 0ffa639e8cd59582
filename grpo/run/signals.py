"""Ctrl-C / SIGTERM during training: finish the current step, write a checkpoint, exit 0."""

from __future__ import annotations

import contextlib
import signal
import threading


class StopRequest:
    """Ctrl-C / SIGTERM: finish the current step, write a checkpoint, exit 0. A second Ctrl-C exits at once."""

    def __init__(self) -> None:
        self.requested = False

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
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
