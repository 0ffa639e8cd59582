"""One run folder, one run: the run folder is checked, locked and made ready before any expensive work starts.

`prepare_run_dir(path, resume, overwrite)`:
  * `~` at the start of the path is the home folder (no shell expanded it); a `~user` that names no home is refused,
    never made into a folder literally named `~...`;
  * a path whose folder or a parent of it is a file, or a folder that cannot be created or written -> RunFolderError
    naming the path and the setting to change (train.output_dir / train.run_name), not an OSError traceback;
  * a run folder is this program's only when it holds MARKER (`.grpo-dual-run`, written when the folder is made a
    run folder, with the run's identity). Nothing is ever deleted from a folder without it: `--overwrite` of a folder
    that is not empty and has no marker is refused, naming the folder and why (a Hugging Face model folder holds
    config.json too). A run folder written by a version before the marker is refused by --overwrite as well: delete
    it by hand (or choose another --run-name) to start over; `--resume` of it still works (it holds checkpoints/) and
    marks it;
  * the folder is locked (LOCK_FILE, `fcntl.flock`, held open for the run's lifetime) before anything in it is
    deleted or written: a second run into a folder that a running process holds (fresh, --resume or --overwrite) is
    refused at once, naming that process's PID and the folder. The kernel drops the lock when its process ends, also
    by SIGKILL, so no lock is ever stale. `release_run_dir` (the end of `grpo_train.main`, `finish`, a failed
    `setup`) releases it; a second prepare in the same process (a notebook running `setup` again) takes it over;
  * a fresh run (no resume) into a folder that already holds a run -> RunFolderError naming the folder and the two
    ways out: `--resume auto` (continue it) or `--overwrite` (delete its contents first); a fresh run never appends
    to another run's metrics or competes with its checkpoints;
  * a fresh run marks its folder restartable (RESTARTABLE, written here) until its first checkpoint or its end
    (`run_started`): a run that failed or was stopped before that left nothing worth keeping, so the same command
    run again reuses the folder (its contents deleted) instead of asking for --resume auto or --overwrite. A folder
    holding only the bookkeeping files (marker, lock, RESTARTABLE: a start that failed before writing anything) is
    reused as an empty one;
  * a start that fails while building its run, in a folder named after the start's clock (no train.run_name): the
    retry gets another name, so `discard_unstarted` removes the folder when it holds only the bookkeeping files.

Locking needs `fcntl` (POSIX); where it is missing (Windows) folders are not locked.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import tempfile
import time
import uuid
from pathlib import Path
from typing import Iterator

try:
    import fcntl
except ImportError:  # Windows: no flock; run folders are not locked there
    fcntl = None  # type: ignore[assignment]

MARKER = ".grpo-dual-run"
"""Written when a folder becomes a run folder (JSON: program, run id, folder, time, host, PID): only a folder holding
it may be overwritten or reused."""
LOCK_FILE = ".grpo-dual.lock"
"""The file a running run holds an exclusive flock on (its holder's PID written in it); never deleted while in use."""
RESTARTABLE = ".restartable"
"""Marker of a run folder whose run has not written a checkpoint yet: a fresh start may reuse it."""
BOOKKEEPING = (MARKER, LOCK_FILE, RESTARTABLE)
"""Entries that are no run output: a folder holding only these is as good as empty."""
RUN_MARKERS = ("config.json", "metrics.jsonl", "checkpoints")
"""Entries a grpo-dual run writes (and other programs may: a model folder holds config.json): a folder holding one
of them without MARKER is named in the message as a run folder of an older version."""
SHOWN_ENTRIES = 5  # enough names to recognise the folder in the message
LOCK_TRIES = 3  # the lock file removed between open and flock (a failed start discarding its folder): try again

_held: dict[str, "RunLock"] = {}
"""The run folders this process holds locked, by real path."""


class RunFolderError(ValueError):
    """The run folder cannot be used; the message names it and the fix."""


class RunLock:
    """An exclusive flock on `folder`/LOCK_FILE, held while the file stays open; `release` ends it."""

    def __init__(self, folder: Path, fd: int) -> None:
        self.folder, self.fd = folder, fd

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing the only descriptor of the open file drops the flock
            self.fd = -1


def expand_home(path: str | Path) -> Path:
    """`path` with a leading `~` / `~user` expanded (nothing else expands it when no shell read the value); a
    RunFolderError when it names no home folder."""
    expanded = Path(os.path.expanduser(path))  # leaves an unknown ~user as it is (Path.expanduser raises)
    if expanded.parts and expanded.parts[0].startswith("~"):
        raise RunFolderError(f"run folder {path}: {expanded.parts[0]!r} names no home folder here, and a folder "
                             "literally named so would be made instead; give the full path in --output-dir "
                             "(train.output_dir)")
    return expanded


def _check_writable(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test-"):
            pass
    except OSError as e:
        raise RunFolderError(f"run folder {path} cannot be created or written ({e.strerror or e}); choose a "
                             "writable --output-dir (train.output_dir)") from None


def _holder(fd: int) -> str:
    """Who holds the lock, as the holder wrote it ("PID 123 on host h since ..."), read without taking the lock."""
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        info = {}
    if not isinstance(info, dict) or "pid" not in info:
        return "a process that is starting (PID not written yet)"
    return f"PID {info['pid']}" + (f" on host {info['host']}" if info.get("host") else "") + \
        (f" since {info['since']}" if info.get("since") else "")


def lock_run_dir(path: str | Path) -> RunLock:
    """Lock the existing folder `path` for this process (see the module docstring); RunFolderError naming the PID
    holding it when another process does. A lock this process holds already is released and taken again."""
    folder = Path(path)
    key = os.path.realpath(folder)
    if key in _held:  # this process's earlier run of the folder (a notebook's setup run again): it passes on
        _held.pop(key).release()
    if fcntl is None:
        return RunLock(folder, -1)
    for _ in range(LOCK_TRIES):
        folder.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:  # the folder was removed between mkdir and open
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise RunFolderError(f"run folder {folder} is in use: the run of {holder} is writing it (it holds "
                                 f"{folder / LOCK_FILE}). Two runs in one folder would mix their metrics and "
                                 "checkpoints: wait for that run to end (or stop it), or choose another --run-name"
                                 ) from None
        try:  # the file we locked must still be the folder's lock file (not one unlinked by a discarding start)
            same = os.path.samestat(os.fstat(fd), os.stat(folder / LOCK_FILE))
        except FileNotFoundError:
            same = False
        if same:
            info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
            lock = RunLock(folder, fd)
            _held[key] = lock
            return lock
        os.close(fd)
    raise RunFolderError(f"run folder {folder}: its lock file {LOCK_FILE} kept disappearing (another process is "
                         "removing the folder); try again")


def release_run_dir(path: str | Path) -> None:
    """Release this process's lock of the run folder `path` (nothing when it holds none): the end of a run."""
    lock = _held.pop(os.path.realpath(path), None)
    if lock is not None:
        lock.release()


def holds_lock(path: str | Path) -> bool:
    """True when this process holds the lock of the run folder `path`."""
    return os.path.realpath(path) in _held


def _write_marker(path: Path) -> None:
    info = {"program": "grpo-dual", "run_id": uuid.uuid4().hex, "folder": str(path.resolve()),
            "created": time.strftime("%Y-%m-%d %H:%M:%S"), "host": socket.gethostname(), "pid": os.getpid()}
    (path / MARKER).write_text(json.dumps(info, indent=2) + "\n")


def _shown(entries: list[str]) -> str:
    return ", ".join(entries[:SHOWN_ENTRIES]) + (", ..." if len(entries) > SHOWN_ENTRIES else "")


def _not_ours(path: Path, entries: list[str], resume: str, overwrite: bool) -> RunFolderError:
    """Why a folder with contents but no MARKER is not used (nothing in it has been touched)."""
    shown = _shown(entries)
    if any(m in entries for m in RUN_MARKERS):
        older = (f"run folder {path} ({shown}) has no {MARKER} marker: it is not a run folder this version made (a "
                 "run folder of an older grpo-dual, or another program's folder, such as a model's, holding "
                 f"{', '.join(m for m in RUN_MARKERS if m in entries)})")
        if resume:
            return RunFolderError(f"{older} and holds no checkpoint to resume; check --output-dir / --run-name")
        what = "--overwrite will not delete its contents" if overwrite else "a fresh run will not use it"
        return RunFolderError(f"{older}, so {what}. If it is a run folder you no longer need, delete it by hand "
                              f"(rm -r {path}); else choose another --run-name or --output-dir")
    return RunFolderError(f"refusing to use {path} as a run folder: it holds files ({shown}) and no {MARKER} marker, "
                          "so it is not a run folder this program made; nothing in it was touched. Choose another "
                          "--output-dir / --run-name")


def prepare_run_dir(path: str | Path, resume: str, overwrite: bool) -> Path:
    """The run folder `path`, existing, writable, locked by this process and marked; empty (but for the bookkeeping
    files) for a fresh run. See the module docstring. The lock stays held until `release_run_dir(path)`."""
    path = expand_home(path)
    for p in [path, *path.parents]:
        if p.exists() and not p.is_dir():
            what = ("the run folder (train.output_dir/train.run_name)" if p == path
                    else "a parent of the run folder (train.output_dir)")
            raise RunFolderError(f"{p} is a file, but {what} must be a folder; choose another --output-dir or "
                                 "--run-name")
    existing = sorted(p.name for p in path.iterdir()) if path.is_dir() else []
    contents = [e for e in existing if e not in BOOKKEEPING]
    legacy_checkpoints = resume and any((path / "checkpoints").glob("step_*"))
    if contents and MARKER not in existing and not legacy_checkpoints:
        raise _not_ours(path, contents, resume, overwrite)  # before any file is written into it
    _check_writable(path)
    lock_run_dir(path)  # before anything is deleted: a running run's folder is refused here
    try:
        return _prepare_locked(path, resume, overwrite)
    except BaseException:
        release_run_dir(path)
        raise


def _prepare_locked(path: Path, resume: str, overwrite: bool) -> Path:
    entries = sorted(p.name for p in path.iterdir())
    contents = [e for e in entries if e not in BOOKKEEPING]
    if MARKER not in entries:
        if contents:  # only a resume of an older version's run folder (holding checkpoints) gets here
            print(f"note: {path} is a run folder of an older version (no {MARKER}); marking it as this run's")
        _write_marker(path)
    if resume and contents:
        return path
    if not contents:  # also a --resume into nothing: a retry without --resume may use the folder
        (path / RESTARTABLE).write_text("no checkpoint yet: a fresh start may reuse this folder\n")
        return path
    if RESTARTABLE in entries and not any((path / "checkpoints").glob("step_*")):  # stopped before a checkpoint
        print(f"note: {path} holds a run that stopped before its first checkpoint; starting it again")
        overwrite = True
    if not overwrite:
        raise RunFolderError(f"run folder {path} is not empty ({_shown(contents)}): a fresh run there would mix with "
                             "the run it holds. Continue that run with --resume auto, start over with --overwrite "
                             "(deletes its contents), or choose another --run-name")
    for entry in path.iterdir():
        if entry.name == LOCK_FILE:  # held: a new file of that name would be a second, free lock
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    _write_marker(path)  # a new run: a new identity
    (path / RESTARTABLE).write_text("no checkpoint yet: a fresh start may reuse this folder\n")
    return path


def run_started(path: str | Path) -> None:
    """The run in `path` wrote a checkpoint (or finished): from now on only --resume or --overwrite reuse it."""
    (Path(path) / RESTARTABLE).unlink(missing_ok=True)


def discard_unstarted(path: str | Path) -> bool:
    """Remove the run folder `path` when this process holds its lock and it holds nothing but the bookkeeping files
    (a start that failed before writing anything); True when removed. The lock is released either way."""
    path = Path(path)
    removed = False
    if holds_lock(path) and path.is_dir() and all(p.name in BOOKKEEPING for p in path.iterdir()):
        shutil.rmtree(path)
        removed = True
    release_run_dir(path)
    return removed


@contextlib.contextmanager
def discarded_if_unstarted(path: str | Path, enabled: bool) -> Iterator[None]:
    """On an exception inside the block: when `enabled`, remove the run folder `path` if it holds nothing but the
    bookkeeping files (`discard_unstarted`); release this process's lock of it either way; then re-raise. A start
    that failed before writing anything leaves no empty folder behind, and no lock held."""
    try:
        yield
    except BaseException:
        if enabled:
            discard_unstarted(path)
        release_run_dir(path)
        raise
