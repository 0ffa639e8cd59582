"""File helpers without heavy imports, shared by grpo/run/checkpoint/files.py and grpo/models/pretrained.py (which must stay importable
before torch: `check_model_name` runs before anything heavy)."""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Iterator


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


@contextlib.contextmanager
def writing(where: Path | str) -> Iterator[None]:
    """Around writes under `where`: a failure the disk causes (full, a file-size limit, no permission) that a library
    reports without the path (safetensors says only "I/O error: File too large") becomes an OSError naming `where`,
    so the entry point's one-line message says which file could not be written."""
    try:
        yield
    except OSError as err:
        if err.filename:
            raise
        raise OSError(err.errno, f"could not write {where}: {err.strerror or err}") from None
    except Exception as err:  # safetensors' SafetensorError, matched by name: this module imports nothing heavy
        if type(err).__name__ != "SafetensorError":
            raise
        raise OSError(f"could not write {where}: {err}") from None


CACHE_HOME_VARIABLES = ("HF_HOME", "XDG_CACHE_HOME", "HOME")
"""What places the Hugging Face caches, first set wins (huggingface_hub.constants, datasets.config): $HF_HOME, else
$XDG_CACHE_HOME/huggingface, else $HOME/.cache/huggingface."""


def cache_error(error: BaseException, cache: str | Path, what: str, variable: str = "HF_HOME") -> str | None:
    """The one line for a file error on the folder a library keeps its cache in (`cache`), a path inside it, or one
    of its parents (a HOME that is missing or read-only): `what` the cache is, where it comes from, and `variable`,
    the environment variable to set; None when `error` (or an error it was raised from) is about another file."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        filename = getattr(error, "filename", None) if isinstance(error, OSError) else None
        if filename:
            path, folder = Path(str(filename)).expanduser().absolute(), Path(cache).expanduser().absolute()
            if path.is_relative_to(folder) or (folder.is_relative_to(path) and path != Path(path.anchor)):
                origin = next((v for v in dict.fromkeys((variable, *CACHE_HOME_VARIABLES)) if os.environ.get(v)),
                              "HOME")
                return (f"{what} {folder} (from ${origin}) cannot be used ({error.strerror or error}: {filename}); "
                        f"set {variable} to a writable folder")
        error = error.__cause__ or error.__context__
    return None
