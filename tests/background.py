"""Subprocess work of a slow test, started in the background when the session's collection ends.

Most of the suite runs in the pytest process on one core; a test whose work is only command lines run in
subprocesses (the demo for the results table, a pip install) need not wait for its turn to start them. When such a
test is among the collected ones, tests/conftest.py starts its work (`start`) in one worker process of its own, one
job after another, so that it fills the core the in-process tests leave idle; the test then
takes the finished result (`result`) and checks it exactly as it would have checked a run of its own. The worker is a
process, not a thread: it keeps the environment and the working folder of the session's start, whatever a test
running meanwhile sets (monkeypatch.setenv, chdir). Run alone, or with -k, the test does the same work itself and
waits for it: the commands, their folders' contents and the assertions are the same either way; only the moment the
commands start differs. Work with a time budget of its own (benchmarks/gpu_check.py's parts) or timed signals stays
in the foreground: beside the in-process tests it would run slower than its budget allows on a busy machine.

`python -m tests.background FOLDER KEY...` is the worker.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
JOBS: dict[str, Callable[[Path], Any]] = {}
"""A test's or a fixture's key (`key_of`) -> its work: a function of a new, empty folder that runs the commands and
returns what the test checks (picklable)."""
WANTED_BY: dict[str, set[str]] = {}
"""A job's key -> the keys of the tests whose collection starts it (a fixture's job: the tests that use the fixture)."""
POLL_S = 0.5
"""How often a test waiting for its job looks for the result."""

_worker: dict[str, Any] = {}
"""The session's worker: its process, its folder and the keys it runs."""


def key_of(file_name: str, name: str) -> str:
    """A test's or a fixture's key here: its file's name and its own, as `file.py::name` (whatever folder pytest
    started in; a test's parameters left out)."""
    return f"{file_name}::{name}"


def job(key: str, wanted_by: tuple[str, ...] = ()) -> Callable[[Callable[[Path], Any]], Callable[[Path], Any]]:
    """Registers the decorated function (a module-level function of a test module) as the work of `key`, started when
    the test `key` or one of the tests `wanted_by` is collected."""
    def register(fn: Callable[[Path], Any]) -> Callable[[Path], Any]:
        JOBS[key] = fn
        WANTED_BY[key] = {key, *wanted_by}
        return fn
    return register


def start(keys: list[str]) -> None:
    """Starts the worker on the registered work that the collected tests `keys` want, in the order the session
    reaches them."""
    first: dict[str, int] = {}
    for i, key in enumerate(keys):
        first.setdefault(key, i)
    wanted = sorted((k for k in JOBS if any(t in first for t in WANTED_BY[k])),
                    key=lambda k: min(first[t] for t in WANTED_BY[k] if t in first))
    if not wanted or _worker:
        return
    folder = Path(tempfile.mkdtemp(prefix="grpo-dual-background-"))
    modules = [f"{JOBS[k].__module__}:{JOBS[k].__name__}:{k}" for k in wanted]
    log = open(folder / "worker.log", "w")  # noqa: SIM115 - the worker's output, read when it fails
    proc = subprocess.Popen([sys.executable, "-m", "tests.background", str(folder), *modules], cwd=ROOT,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    _worker.update(proc=proc, folder=folder, keys=wanted, log=log)


def _result_file(folder: Path, key: str) -> Path:
    return folder / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.pkl"  # hash() differs between processes


def result(key: str, folder: Path) -> Any:
    """The work of `key`: what the worker returned (waiting for it; its exception raised here), or, when the session
    did not start it, the work run now in `folder`."""
    if key not in _worker.get("keys", ()):
        return JOBS[key](folder)
    done = _result_file(_worker["folder"], key)
    while not done.exists():
        if _worker["proc"].poll() is not None and not done.exists():
            text = (_worker["folder"] / "worker.log").read_text()
            raise RuntimeError(f"the background worker ended (exit {_worker['proc'].returncode}) before {key}:\n"
                               f"{text[-4000:]}")
        time.sleep(POLL_S)
    ok, value = pickle.loads(done.read_bytes())
    if not ok:
        raise value
    return value


def stop() -> None:
    """The end of the session: the worker and the commands it started are ended, its folder removed."""
    proc = _worker.get("proc")
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the worker and every process it started
    if proc is not None:
        proc.wait()
        _worker["log"].close()
        shutil.rmtree(_worker["folder"], ignore_errors=True)
    _worker.clear()


def work(folder: Path, jobs: list[str]) -> None:
    """The worker: each `module:function:key` in turn, in a folder of its own under `folder`, its return value (or
    its exception) pickled to the key's result file, written whole (a rename) so that a reader never sees a part."""
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]  # as pytest imports the test modules (rootdir conftest)
    for i, spec in enumerate(jobs):
        module, function, key = spec.split(":", 2)
        own = folder / f"job{i}"
        own.mkdir()
        try:
            out = (True, getattr(importlib.import_module(module), function)(own))
        except BaseException as err:  # noqa: BLE001 - an assertion or a skip is the test's to raise
            out = (False, err)
        try:
            data = pickle.dumps(out)
        except Exception as err:  # noqa: BLE001 - an exception that does not pickle is sent as its text
            data = pickle.dumps((False, RuntimeError(f"{type(out[1]).__name__}: {out[1]}\n({err})")))
        tmp = _result_file(folder, key).with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.rename(_result_file(folder, key))


if __name__ == "__main__":
    work(Path(sys.argv[1]), sys.argv[2:])
