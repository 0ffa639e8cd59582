"""File helpers without heavy imports, shared by grpo/run/checkpoint.py and grpo/models/pretrained.py (which must stay importable
before torch: `check_model_name` runs before anything heavy)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def sha256(path: Path) -> str:
    """The hex sha256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fsync(path: Path) -> None:
    """Flush a file's or a folder's data and entries to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
