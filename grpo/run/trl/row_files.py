"""Rows in memory as files: written once, as JSON lines, into a folder named by their sha256 under
$GRPO_DUAL_CACHE/datasets (else ~/.cache/grpo-dual/datasets), so a run's config.json names a file that holds exactly
those rows and the run can be resumed and repeated like one from a file (`train(tasks={...: rows})`, grpo/run/api.py;
a TRL command line's dataset, grpo/run/trl/record_tables.py)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from grpo import config as C
from grpo.models.pretrained import CACHE_ENV, DEFAULT_CACHE


def _jsonable(value: Any) -> Any:
    """numpy scalars and arrays (as pandas and datasets hand them out) as plain JSON values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "isoformat"):
        return value.isoformat()
    raise TypeError(f"a value of type {type(value).__name__} cannot be written as JSON")


def write_rows(train_rows: list[dict[str, Any]], heldout_rows: list[dict[str, Any]] | None,
               where: str = "tasks") -> Path:
    """Write the rows once into a folder named by their sha256 (train.jsonl, heldout.jsonl); returns the folder.
    A value JSON cannot hold is a ConfigError naming `where` (the setting the rows came from)."""
    try:
        texts = {name: "".join(json.dumps(r, default=_jsonable, sort_keys=True) + "\n" for r in rows)
                 for name, rows in (("train.jsonl", train_rows), ("heldout.jsonl", heldout_rows)) if rows is not None}
    except TypeError as err:
        raise C.ConfigError(f"{'train(tasks=...)' if where == 'tasks' else where}: a row holds a value that is not "
                            f"JSON: {err}", field=where) from None
    digest = hashlib.sha256("\0".join(f"{k}\0{v}" for k, v in sorted(texts.items())).encode()).hexdigest()[:24]
    folder = Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE).expanduser() / "datasets" / digest
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in texts.items():
        path = folder / name
        if not path.is_file() or path.read_text() != text:
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(text)
            tmp.replace(path)  # atomic: a concurrent run sees the old file or the new, never a half
    return folder
