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
import filecmp
import json
import os
import re
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
    return (f"PID {info['pid']}" + (f" on host {info['host']}" if info.get("host") else "") +
            (f" since {info['since']}" if info.get("since") else ""))


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


# ----------------------------------------------------------------------------- the final model's own folder
FINAL_MANIFEST = ".grpo-dual-final"
"""Written into checkpoint.final_model_dir (TRL's output_dir) before the final model's files are put there: the
names of the files a run wrote at its top (JSON), so that a later run may write them again and nothing else there."""
MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "adapter_config.json")
MODEL_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".index.json")
DATA_FILES = ("dataset_dict.json", "dataset_info.json", "state.json")
DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv", ".parquet", ".arrow", ".txt")


def _written_by_a_run(folder: Path) -> set[str]:
    """The files of `folder` that a run's final save wrote (FINAL_MANIFEST's list; an empty set without it)."""
    try:
        names = json.loads((folder / FINAL_MANIFEST).read_text()).get("files", [])
    except (OSError, ValueError, AttributeError):
        return set()
    return {str(n) for n in names} if isinstance(names, list) else set()


def _same_as_final(folder: Path, name: str, run_dir: Path) -> bool:
    """Whether folder/name is byte for byte the run's final/name (a final save before FINAL_MANIFEST existed)."""
    mine, theirs = folder / name, run_dir / "final" / name
    return mine.is_file() and theirs.is_file() and filecmp.cmp(mine, theirs, shallow=False)


def _partial(name: str, own: set[str]) -> bool:
    """Whether `name` is a file publish_final was writing when it was stopped (`.NAME.tmpPID` of a listed NAME, or
    the list's own temporary file)."""
    if re.fullmatch(rf"{re.escape(FINAL_MANIFEST)}\.tmp\d+", name):
        return True
    match = re.fullmatch(r"\.(.+)\.tmp\d+", name)
    return bool(match) and match.group(1) in own


def _looks_like(entries: list[str]) -> str:
    """What a folder holding `entries` is, for the message: a model, a dataset, a run folder, or files."""
    if MARKER in entries or any(e in entries for e in ("metrics.jsonl", "checkpoints")):
        return "another run's folder"
    if any(e in MODEL_FILES or e.endswith(MODEL_SUFFIXES) for e in entries):
        return "a model's folder"
    if any(e in DATA_FILES or e.endswith(DATA_SUFFIXES) for e in entries):
        return "a dataset's folder"
    return "a folder of other files"


def _trl_checkpoint(path: Path, run_dir: Path) -> bool:
    """Whether `path` is a TRL checkpoint folder (checkpoint-N) of the run of `run_dir`, or one it was writing."""
    from grpo.run.checkpoint.files import TRL_CHECKPOINT, TRL_MARKER

    if re.fullmatch(r"\.(tmp|old)-checkpoint-\d+-\d+", path.name):
        return True
    try:
        record = json.loads((path / TRL_MARKER).read_text())
    except (OSError, ValueError):
        return False
    named = record.get("run_dir") if isinstance(record, dict) else None
    return (bool(TRL_CHECKPOINT.fullmatch(path.name)) and isinstance(named, str) and
            (path.parent / named).resolve() == run_dir.resolve())


def check_final_model_dir(folder: str | Path, run_dir: Path, model_name: str) -> None:
    """checkpoint.final_model_dir (TRL's output_dir) before anything is written or loaded: RunFolderError when it is
    the folder of the model being trained, or holds an entry no run wrote there (a model, a dataset, another run's
    files: anything but this run's own folder and the files FINAL_MANIFEST lists). The final save would write its
    config.json and weights over them; nothing is ever written into such a folder."""
    folder = expand_home(folder)
    inside = folder.resolve()
    if inside == run_dir.resolve() or inside.is_relative_to(run_dir.resolve() / "checkpoints"):
        where = "the run folder itself" if inside == run_dir.resolve() else "inside the run's checkpoints/"
        raise RunFolderError(f"checkpoint.final_model_dir {folder} is {where} ({run_dir}): the final model's "
                             "config.json would be written over the run's own record, or mixed among its "
                             "checkpoints. The run keeps its final model in final/ anyway; choose a folder outside "
                             f"{run_dir} (or leave checkpoint.final_model_dir empty); nothing was touched")
    model = Path(model_name).expanduser()
    if model.exists() and folder.exists() and os.path.samefile(model, folder):
        raise RunFolderError(f"output folder {folder} (checkpoint.final_model_dir, TRL's output_dir) is the folder of "
                             "the model being trained (model.name, TRL's model_name_or_path): the final model would "
                             "be written over it. Choose another output folder (--output_dir); nothing in it was "
                             "touched")
    if not folder.is_dir():
        return
    own = _written_by_a_run(folder)
    foreign = sorted(e.name for e in folder.iterdir() if e.name not in (FINAL_MANIFEST, *own)
                     and not _partial(e.name, own)
                     and not (e.name == run_dir.name and run_dir.parent.resolve() == folder.resolve())
                     and not _trl_checkpoint(folder / e.name, run_dir)
                     and not _same_as_final(folder, e.name, run_dir))
    if foreign:
        raise RunFolderError(f"output folder {folder} (checkpoint.final_model_dir, TRL's output_dir) holds files no "
                             f"run wrote there ({_shown(foreign)}): it looks like {_looks_like(foreign)}, and the "
                             "final model's config.json, weights and tokenizer would be written among them, over "
                             "those of the same name. Choose another output folder (--output_dir: a new or empty "
                             "one); nothing in it was touched")


def publish_final(final: Path, folder: str | Path) -> Path:
    """The files of the run's `final` folder copied to the top of `folder` (checkpoint.final_model_dir, where TRL's
    trainer.save_model leaves them). FINAL_MANIFEST lists every name before any file appears; each file is written
    under a temporary name and renamed into place, so the folder holds the old file or the new one, never a torn
    one; files an earlier final save wrote that this one does not (a full model's weights after an adapter run)
    are removed after."""
    folder = expand_home(folder)
    folder.mkdir(parents=True, exist_ok=True)
    names = sorted(p.name for p in final.iterdir() if p.is_file())
    before = _written_by_a_run(folder)
    for stale in [e for e in folder.iterdir() if _partial(e.name, before)]:  # a copy a stopped save left
        stale.unlink(missing_ok=True)
    _write_manifest(folder, sorted(before | set(names)), final)
    for name in names:
        part = folder / f".{name}.tmp{os.getpid()}"
        shutil.copyfile(final / name, part)
        os.replace(part, folder / name)
    for stale in sorted(before - set(names)):
        (folder / stale).unlink(missing_ok=True)
    _write_manifest(folder, names, final)
    return folder


def _write_manifest(folder: Path, names: list[str], final: Path) -> None:
    tmp = folder / f"{FINAL_MANIFEST}.tmp{os.getpid()}"
    tmp.write_text(json.dumps({"files": names, "from": str(final)}, indent=1) + "\n")
    os.replace(tmp, folder / FINAL_MANIFEST)
