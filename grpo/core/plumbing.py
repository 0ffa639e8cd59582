"""Plumbing without heavy imports (standard library only): file hashes, fsync, the guard that names the file a failed
write was for, the one line for a cache folder that cannot be used, and importing the user's code named by a
"package.module:function" or "path/to/file.py:function" reference (reward functions, tools, environment factories),
with the "did you mean" of a misspelt name. Shared by grpo/models/pretrained.py (which must stay importable before
torch: `check_model_name` runs before anything heavy), the checkpoint files, the graders and the tools."""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any


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


def did_you_mean(unknown: Iterable[str], valid: Iterable[str], where: str = "") -> str:
    """" (did you mean `rollout.k`?)" for the unknown names that are close to a valid one (a typo), else ""."""
    prefix = f"{where}." if where else ""
    guesses = [f"`{prefix}{match[0]}`" for name in unknown
               if (match := difflib.get_close_matches(name, sorted(valid), n=1, cutoff=0.6))]
    return f" (did you mean {', '.join(guesses)}?)" if guesses else ""


FILE_MODULE_PREFIX = "_grpo_grader_"  # private module names for user code imported from a file path (graders first)


class UserCodeError(ValueError):
    """The user's code named by a reference cannot be imported, or has no callable of that name. The message says
    which and how to write the reference; the caller names what the code was for (a grader, a tool, an environment)."""


def _file_module(path: Path) -> Any:
    """The module of a .py file under a private name (`FILE_MODULE_PREFIX` + stem + hash of the path), imported
    once per process; sys.path stays as it is, so the file cannot shadow any other import."""
    name = f"{FILE_MODULE_PREFIX}{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UserCodeError(f"{path} cannot be imported as Python source")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickle look a class's module up here while the file runs
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # whatever the file raises at import is the user's error to see, named
        del sys.modules[name]
        raise UserCodeError(f"importing {path} raised {type(err).__name__}: {err}") from err
    return module


def import_callable(ref: str) -> Callable[..., Any]:
    """The function of "package.module:function" or "path/to/file.py:function"."""
    source, sep, attr = ref.rpartition(":")
    if not sep or not source or not attr:
        raise UserCodeError("write a module path 'package.module:function' or a file path 'path/to/file.py:function'")
    if source.endswith(".py") or "/" in source or "\\" in source:
        path = Path(source).expanduser().resolve()
        if not path.is_file():
            raise UserCodeError(f"file {path} not found")
        module = _file_module(path)
    else:
        try:
            module = importlib.import_module(source)
        except ImportError as err:
            raise UserCodeError(f"cannot import module {source!r} ({err}); give a file path 'path/to/file.py:{attr}' "
                                "to import a file that is not on the Python path") from err
        except Exception as err:  # the module itself failed while importing
            raise UserCodeError(f"importing module {source!r} raised {type(err).__name__}: {err}") from err
    fn = getattr(module, attr, None)
    if not callable(fn):
        own = [name for name, value in vars(module).items() if callable(value) and not name.startswith("_")
               and getattr(value, "__module__", None) == module.__name__]  # its own functions, not its imports
        raise UserCodeError(f"{source!r} has no callable {attr!r}{did_you_mean([attr], own)}")
    return fn


def importable_ref(fn: Any) -> str | None:
    """"module:name" when `import_callable` of it gives `fn` back (a config file can then name it and a resumed run
    find it again); None for a function of __main__, a notebook, a closure or a method."""
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if module in (None, "__main__") or not name or "." in name:
        return None
    try:
        return f"{module}:{name}" if import_callable(f"{module}:{name}") is fn else None
    except UserCodeError:
        return None
