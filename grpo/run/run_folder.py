"""One run folder, one run: the run folder is checked (and made ready) before any expensive work starts.

`prepare_run_dir(path, resume, overwrite)`:
  * a path whose folder or a parent of it is a file, or a folder that cannot be created or written -> RunFolderError
    naming the path and the setting to change (train.output_dir / train.run_name), not an OSError traceback;
  * a fresh run (no resume) into a folder that already holds files -> RunFolderError naming the folder and the two
    ways out: `--resume auto` (continue it) or `--overwrite` (delete its contents first); a fresh run never appends
    to another run's metrics or competes with its checkpoints;
  * `overwrite` deletes the contents only of a folder that looks like a run folder (config.json, metrics.jsonl or
    checkpoints/ in it), so a mistyped --output-dir cannot wipe an unrelated folder;
  * a fresh run marks its folder restartable (RESTARTABLE, written here) until its first checkpoint or its end
    (`run_started`): a run that failed or was stopped before that left nothing worth keeping, so the same command
    run again reuses the folder (its contents deleted) instead of asking for --resume auto or --overwrite;
  * a start that fails while building its run, in a folder named after the start's clock (no train.run_name): the
    retry gets another name, so `discard_unstarted` removes the folder when it holds only the restart marker.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

RUN_MARKERS = ("config.json", "metrics.jsonl", "checkpoints")
"""Entries that only a grpo-dual run writes: a folder holding one of them may be overwritten."""
RESTARTABLE = ".restartable"
"""Marker of a run folder whose run has not written a checkpoint yet: a fresh start may reuse it."""
SHOWN_ENTRIES = 5  # enough names to recognise the folder in the message


class RunFolderError(ValueError):
    """The run folder cannot be used; the message names it and the fix."""


def _check_writable(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test-"):
            pass
    except OSError as e:
        raise RunFolderError(f"run folder {path} cannot be created or written ({e.strerror or e}); choose a "
                             "writable --output-dir (train.output_dir)") from None


def prepare_run_dir(path: str | Path, resume: str, overwrite: bool) -> Path:
    """The run folder `path`, existing and writable, empty for a fresh run. See the module docstring."""
    path = Path(path)
    for p in [path, *path.parents]:
        if p.exists() and not p.is_dir():
            what = ("the run folder (train.output_dir/train.run_name)" if p == path
                    else "a parent of the run folder (train.output_dir)")
            raise RunFolderError(f"{p} is a file, but {what} must be a folder; choose another --output-dir or "
                                 "--run-name")
    _check_writable(path)
    entries = sorted(p.name for p in path.iterdir())
    if resume and entries:
        return path
    if not entries:  # also a --resume into nothing: a retry without --resume may use the folder
        (path / RESTARTABLE).write_text("no checkpoint yet: a fresh start may reuse this folder\n")
        return path
    if RESTARTABLE in entries and not any((path / "checkpoints").glob("step_*")):  # stopped before a checkpoint
        print(f"note: {path} holds a run that stopped before its first checkpoint; starting it again")
        overwrite = True
    if not overwrite:
        shown = ", ".join(entries[:SHOWN_ENTRIES]) + (", ..." if len(entries) > SHOWN_ENTRIES else "")
        raise RunFolderError(f"run folder {path} is not empty ({shown}): a fresh run there would mix with the run "
                             "it holds. Continue that run with --resume auto, start over with --overwrite (deletes "
                             "its contents), or choose another --run-name")
    if not any((path / m).exists() for m in RUN_MARKERS):
        raise RunFolderError(f"refusing to --overwrite {path}: it does not look like a run folder (none of "
                             f"{list(RUN_MARKERS)} in it); choose another --output-dir / --run-name")
    for entry in path.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    (path / RESTARTABLE).write_text("no checkpoint yet: a fresh start may reuse this folder\n")
    return path


def blocks_fresh_start(path: str | Path) -> bool:
    """True when a fresh run into `path` would stop (a folder with contents, not marked restartable)."""
    path = Path(path)
    if not path.is_dir():
        return False
    entries = {p.name for p in path.iterdir()}
    return bool(entries) and (RESTARTABLE not in entries or any((path / "checkpoints").glob("step_*")))


def run_started(path: str | Path) -> None:
    """The run in `path` wrote a checkpoint (or finished): from now on only --resume or --overwrite reuse it."""
    (Path(path) / RESTARTABLE).unlink(missing_ok=True)


def discard_unstarted(path: str | Path) -> bool:
    """Remove the run folder `path` when it holds nothing but the RESTARTABLE marker (a start that failed before
    writing anything); True when removed."""
    path = Path(path)
    if path.is_dir() and [p.name for p in path.iterdir()] == [RESTARTABLE]:
        shutil.rmtree(path)
        return True
    return False


@contextlib.contextmanager
def discarded_if_unstarted(path: str | Path, enabled: bool) -> Iterator[None]:
    """On an exception inside the block (when `enabled`), remove the run folder `path` if it holds nothing but the
    RESTARTABLE marker, then re-raise: a start that failed before writing anything leaves no empty folder behind."""
    try:
        yield
    except BaseException:
        path = Path(path)
        if enabled and path.is_dir() and [p.name for p in path.iterdir()] == [RESTARTABLE]:
            shutil.rmtree(path)
        raise
