"""What a run was started with, beyond its config: a sha256 of every local data file its sources name, of each task's
rows as loaded, and of each user reward function's source. Saved with every checkpoint (inputs.json); a resume
compares them with its own (`input_changes`) and names what changed (grpo/run/checkpoint/save_resume.py: check_resume).

    files    {path: {"sha256", "setting"}}  every file under data.source / tasks.<task>.path, data_files, heldout
                                            (a folder: each file in it) and data.data_dir's bbq/ and halueval/ for
                                            data.source=dual; a Hub id is no file (its rows are compared)
    rows     {task: sha256}                 the task's rows as loaded (prompts, gold, targets): catches what no
                                            file shows (a Hub dataset, the demo's generator)
    rewards  {grader: {"sha256", "tasks"}}  a file-path grader ('path/to/file.py:fn'): the file; a user function
                                            (train(rewards=...), 'package.module:fn'): its source (inspect); built-in
                                            graders and reward models are the program's or named by the config
"""

from __future__ import annotations

import hashlib
import inspect
import json
import tokenize
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from grpo import config as C
from grpo.core.plumbing import sha256
from grpo.core.step_types import Sample
from grpo.grading.graders import USER_KINDS

SHORT_HASH = 12  # enough hex digits to tell two versions apart in a message


def _files_under(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file())
    return []  # a Hub id, or a path the loader reported already


def data_files(data: C.DataConfig, tasks: Mapping[str, C.TaskSourceConfig]) -> dict[Path, str]:
    """Every local file the data settings name -> the setting that names it."""
    named: list[tuple[str, str]] = []
    if data.source == "dual":
        named += [("data.data_dir", str(Path(data.data_dir) / sub)) for sub in ("bbq", "halueval")]
    elif data.source not in C.BUILTIN_SOURCES:
        named.append(("data.source", data.source))
    for task, source in sorted(tasks.items()):
        named.append((f"tasks.{task}.path", source.path))
        named += [(f"tasks.{task}.data_files", f) for f in source.data_files]
        if source.heldout:
            named.append((f"tasks.{task}.heldout", source.heldout))
    files: dict[Path, str] = {}
    for setting, given in named:
        for f in _files_under(Path(given).expanduser()):
            files.setdefault(f.resolve(), setting)
    return files


def rows_hash(rows: Iterable[Sample]) -> str:
    """sha256 of rows as loaded, in order (any value JSON cannot hold written as its repr)."""
    h = hashlib.sha256()
    for s in rows:
        h.update(json.dumps([s.id, s.messages, s.gold, s.target, s.conversational], sort_keys=True,
                            default=repr).encode())
        h.update(b"\n")
    return h.hexdigest()


def source_hash(name: str, fn: Callable[..., Any]) -> str | None:
    """sha256 of what defines the grader `name`: the file of 'path/to/file.py:function', else the source of the
    function (unwrapped); None when Python cannot show it (a lambda typed at a prompt, a builtin)."""
    source, sep, _ = name.rpartition(":")
    if sep and (source.endswith(".py") or "/" in source or "\\" in source):
        path = Path(source).expanduser()
        if path.is_file():
            return sha256(path)
    try:
        text = inspect.getsource(inspect.unwrap(fn))
    except (OSError, TypeError, SyntaxError, tokenize.TokenError):  # exec'd under a file name that is not its source
        return None
    return hashlib.sha256(text.encode()).hexdigest()


def input_fingerprints(data: C.DataConfig, tasks: Mapping[str, C.TaskSourceConfig], rows: Sequence[Sample],
                       graders: Mapping[str, Any], users: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """The run's inputs (see the module docstring). `graders`: resolved Graders by name; `users`: grader name ->
    the tasks whose rewards use it (grpo.grading.graders.term_names)."""
    by_task: dict[str, list[Sample]] = {}
    for s in rows:
        by_task.setdefault(s.task, []).append(s)
    rewards = {}
    for name, grader in sorted(graders.items()):
        if grader.kind in USER_KINDS:
            rewards[name] = {"sha256": source_hash(name, grader.fn), "tasks": sorted(users.get(name, []))}
    return {"files": {str(p): {"sha256": sha256(p), "setting": s} for p, s in data_files(data, tasks).items()},
            "rows": {t: rows_hash(r) for t, r in sorted(by_task.items())},
            "rewards": rewards}


def _short(digest: str | None) -> str:
    return "unknown" if digest is None else digest[:SHORT_HASH]


def input_changes(saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """What differs between the inputs a checkpoint saved and this run's, data files first: one line each."""
    lines = []
    before, after = saved.get("files", {}), now.get("files", {})
    for path in sorted(set(before) | set(after)):
        old, new = before.get(path), after.get(path)
        if old is None:
            lines.append(f"data file {path} ({new['setting']}) is read now, not by the checkpoint's run")
        elif new is None:
            lines.append(f"data file {path} ({old['setting']}) was read by the checkpoint's run, not now")
        elif old["sha256"] != new["sha256"]:
            lines.append(f"data file {path} ({new['setting']}) changed: sha256 {_short(old['sha256'])}... at the "
                         f"checkpoint, {_short(new['sha256'])}... now")
    if not lines:  # a changed file changes its task's rows: name the rows only when no file explains it
        rows_then, rows_now = saved.get("rows", {}), now.get("rows", {})
        for task in sorted(set(rows_then) | set(rows_now)):
            if rows_then.get(task) != rows_now.get(task):
                lines.append(f"the rows of task {task!r} differ from the checkpoint's (sha256 "
                             f"{_short(rows_then.get(task))}... then, {_short(rows_now.get(task))}... now)")
    then, current = saved.get("rewards", {}), now.get("rewards", {})
    for name in sorted(set(then) | set(current)):
        old, new = then.get(name), current.get(name)
        if old is None or new is None:
            continue  # a grader added or dropped: rewards.<task> differs, which the config comparison names
        if old["sha256"] and new["sha256"] and old["sha256"] != new["sha256"]:
            lines.append(f"reward function {name!r} (rewards.{', rewards.'.join(new['tasks'])}): its source changed "
                         f"(sha256 {_short(old['sha256'])}... at the checkpoint, {_short(new['sha256'])}... now)")
    return lines
