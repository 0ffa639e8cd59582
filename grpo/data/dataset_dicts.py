"""A dataset loaded with `datasets` as TRL's command line (trl/scripts/grpo.py) loads it, as {split: rows}.

    load_named(name, config, where)      `--dataset_name NAME --dataset_config CONFIG`: datasets.load_dataset(NAME,
                                         name=CONFIG), with what TRL's call does not cover on a local path:
      a data file (.jsonl / .json / .csv / .tsv / .parquet / .arrow)   load_dataset(<its builder>, data_files=FILE)
                                                                      (one split, train), as datasets reads a file
      a save_to_disk folder                                           load_from_disk (its splits, or train)
      any other folder                                                load_dataset(FOLDER): the splits from the file
                                                                      names (train.jsonl, test.jsonl, ...); a folder
                                                                      holding a dataset script is run only by a
                                                                      `datasets` that still runs scripts (< 4)
      a Hub id                                                        load_dataset(NAME) when the Hub can be reached
                                                                      (or HF_HUB_OFFLINE=1 reads the local cache)
    load_mixture(entries, test_size, seed, where)   TRL's DatasetMixtureConfig (`datasets:`), as trl.get_dataset:
                                         each entry load_dataset(path, name, data_dir, data_files, split), its
                                         `columns` kept, `fraction` shares, concatenated, then train_test_split

Errors are DataSourceError naming `where` (the TRL field) and the fix; nothing is read at import.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from grpo.data.tables import (
    BUILDER_OF_SUFFIX,
    DATA_SUFFIXES,
    OFFLINE_VARS,
    DataSourceError,
    _datasets,
    hub_reachable,
    is_saved_dataset,
    looks_like_hub_id,
)

DictRows = list[dict[str, Any]]
MIXTURE_KEYS = ("path", "name", "data_dir", "data_files", "split", "columns", "fraction")
"""The fields of TRL's DatasetConfig (trl/scripts/utils.py), one entry of DatasetMixtureConfig.datasets."""


def _offline() -> bool:
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on") for v in OFFLINE_VARS)


def hub_cache() -> Path:
    """The Hugging Face hub cache as huggingface_hub places it ($HF_HUB_CACHE, else $HF_HOME/hub, else
    $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub), read from the environment now."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or str(Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface")
    return Path(home).expanduser() / "hub"


def cached_offline(name: str, what: str = "dataset") -> bool:
    """Whether Hub id `name` has a copy in the local caches an offline load reads: the hub cache's
    `datasets--owner--name` / `models--owner--name`, and for a dataset datasets' own cache (`owner___name`)."""
    kind = "datasets" if what == "dataset" else "models"
    if (hub_cache() / f"{kind}--{name.replace('/', '--')}").is_dir():
        return True
    if what != "dataset":
        return False
    home = os.environ.get("HF_HOME") or str(Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface")
    folder = Path(os.environ.get("HF_DATASETS_CACHE") or Path(home) / "datasets").expanduser()
    return (folder / name.replace("/", "___")).is_dir()


def offline_message(name: str, where: str, what: str = "dataset") -> str | None:
    """The reason Hub id `name` cannot load here when the Hub is switched off (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE)
    and it is not in the local cache; None when online or cached."""
    if not _offline() or cached_offline(name, what):
        return None
    switch = next(v for v in OFFLINE_VARS if os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on"))
    fix = ("datasets.load_dataset(NAME).save_to_disk(FOLDER)" if what == "dataset"
           else "huggingface-cli download NAME --local-dir FOLDER")
    return (f"{where}={name!r}: the Hugging Face Hub is switched off here ({switch}=1) and {name} is not in the local "
            f"Hugging Face cache ({hub_cache()}): download the {what} where there is a network ({fix}) and give "
            f"{where}=FOLDER, or unset {switch} to download it")


def check_hub(name: str, where: str, what: str = "dataset") -> None:
    """A Hub id that cannot be read here: DataSourceError naming `where` with the fix (no network and no
    HF_HUB_OFFLINE; or HF_HUB_OFFLINE and no copy in the local cache). Passes when the Hub answers, or when it is
    switched off (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE) and the local cache holds `name`."""
    if _offline():
        if problem := offline_message(name, where, what):
            raise DataSourceError(problem)
        return
    ok, endpoint = hub_reachable()
    if not ok:
        fix = ("datasets.load_dataset(NAME).save_to_disk(FOLDER)" if what == "dataset"
               else "huggingface-cli download NAME --local-dir FOLDER")
        raise DataSourceError(f"{where}={name!r} is not a local file or folder and the Hugging Face Hub ({endpoint}) "
                              f"cannot be reached (offline?): download the {what} where there is a network ({fix}) "
                              f"and give {where}=FOLDER, or set HF_HUB_OFFLINE=1 to read the local Hugging Face cache")


def _rows(table: Any) -> DictRows:
    return [dict(row) for row in table]


def _splits(loaded: Any) -> dict[str, DictRows]:
    if hasattr(loaded, "keys"):  # a DatasetDict
        return {str(split): _rows(loaded[split]) for split in loaded.keys()}
    return {"train": _rows(loaded)}


SCANNED_FILES = 200
"""At most this many JSON files of a local dataset are read again to name the one that failed (a folder of shards)."""


def _json_problem(file: Path) -> str | None:
    """Why datasets' json builder cannot read `file`: empty, or its first line that is not JSON (`file:line`); None
    when it reads as JSON (a whole-file array or object) or JSON lines."""
    try:
        text = file.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as err:
        return f"{file} cannot be read as UTF-8 text ({err})"
    if not text.strip():
        return f"{file} is empty: it holds no rows"
    try:
        json.loads(text)
        return None
    except ValueError:
        pass
    for number, line in enumerate(text.splitlines(), 1):
        try:
            if line.strip():
                json.loads(line)
        except ValueError as err:
            return f"{file}:{number}: not valid JSON ({getattr(err, 'msg', err)}): fix or delete that line"
    return None


def _local_problem(local: Path | None) -> str | None:
    """The file and line of a local JSON / JSON-lines dataset that datasets could not read (its own message names
    neither: StopIteration for an empty file, DatasetGenerationError for a bad line); None when none is found."""
    if local is None or not local.exists():
        return None
    files = [local] if local.is_file() else sorted(p for p in local.rglob("*") if p.is_file())
    for file in [f for f in files if f.suffix.lower() in (".json", ".jsonl")][:SCANNED_FILES]:
        if problem := _json_problem(file):
            return problem
    return None


def _load(where: str, call: str, *args: Any, local: Path | None = None, **kwargs: Any) -> Any:
    """datasets' `call` (load_dataset / load_from_disk); its failure as a DataSourceError naming `where` (and, for a
    `local` JSON dataset, the file and line at fault)."""
    datasets = _datasets()
    shown = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # one line per split and shard is noise on a command line
    try:
        return getattr(datasets, call)(*args, **kwargs)
    except Exception as err:  # datasets raises many types for "cannot read it"; all are the user's input
        if problem := _local_problem(local):
            raise DataSourceError(f"{where}: {problem}") from err
        while err.__cause__ is not None and "error occurred while generating" in str(err):  # the real one is inside
            err = err.__cause__
        first = (" ".join(str(err).split()) or type(err).__name__)[:300]
        if "scripts are no longer supported" in first:
            first += (f" (datasets {datasets.__version__} runs no dataset scripts: run the script once with a "
                      "datasets < 4 and save_to_disk the result, or give its data files)")
        raise DataSourceError(f"{where}: datasets.{call}{args!r} cannot be read: {type(err).__name__}: {first}"
                              ) from err
    finally:
        if shown:
            datasets.enable_progress_bars()


def load_named(name: str, config: str | None, where: str) -> dict[str, DictRows]:
    """`dataset_name` (+ `dataset_config`) as TRL's script loads it (module docstring), every split's rows."""
    local = Path(name).expanduser()
    if local.is_file():
        builder = "json" if local.suffix.lower() in (".json", ".jsonl") else BUILDER_OF_SUFFIX.get(local.suffix.lower())
        if builder is None:
            raise DataSourceError(f"{where}={name!r} is a file with suffix {local.suffix!r}; data files are "
                                  f"{', '.join(DATA_SUFFIXES)}, or give a folder or a save_to_disk folder")
        extra = {"delimiter": "\t"} if local.suffix.lower() == ".tsv" else {}
        return _splits(_load(where, "load_dataset", builder, data_files=str(local), local=local, **extra))
    if local.is_dir():
        if is_saved_dataset(local):
            return _splits(_load(where, "load_from_disk", str(local)))
        return _splits(_load(where, "load_dataset", str(local), name=config, local=local))
    if not looks_like_hub_id(name):
        raise DataSourceError(f"{where}={name!r} does not exist: give a data file, a folder or a Hub id 'owner/name'")
    check_hub(name, where)
    return _splits(_load(where, "load_dataset", name, name=config))


def load_mixture(entries: Sequence[Mapping[str, Any]], test_size: float | None, seed: int,
                 where: str) -> dict[str, DictRows]:
    """TRL's get_dataset(DatasetMixtureConfig) (module docstring): {"train": rows} or, with `test_size`,
    {"train", "test"} split by datasets' train_test_split with `seed`."""
    datasets = _datasets()
    tables = []
    for i, entry in enumerate(entries):
        here = f"{where}[{i}]"
        path = str(entry["path"])
        local = Path(path).expanduser()
        builders = set(getattr(datasets.packaged_modules, "_PACKAGED_DATASETS_MODULES", {}))
        if not local.exists() and path not in builders:
            if not looks_like_hub_id(path):
                raise DataSourceError(f"{here}.path={path!r} does not exist: give a data file, a folder, a datasets "
                                      "builder (json, csv, parquet, ...) with data_files, or a Hub id 'owner/name'")
            check_hub(path, f"{here}.path")
        if local.is_file():  # a file as its builder reads it (datasets takes no file as a path)
            builder = "json" if local.suffix.lower() in (".json", ".jsonl") else BUILDER_OF_SUFFIX.get(local.suffix)
            table = _load(here, "load_dataset", builder, data_files=str(local), split=entry.get("split") or "train",
                          local=local)
        else:
            table = _load(here, "load_dataset", path, name=entry.get("name"), data_dir=entry.get("data_dir"),
                          data_files=entry.get("data_files"), split=entry.get("split") or "train",
                          local=local if local.is_dir() else None)
        if entry.get("columns") is not None:
            table = table.select_columns(list(entry["columns"]))
        tables.append(table)
    fractions = [entry.get("fraction") for entry in entries]
    if any(f is not None for f in fractions):  # trl.get_dataset: shares of the mixture, no dataset oversampled
        if any(f is None for f in fractions):
            raise DataSourceError(f"{where}: `fraction` is set for some datasets and not others; set it for all of "
                                  "them or none (as TRL requires)")
        weights = [float(f) / sum(float(x) for x in fractions) for f in fractions]
        total = min(len(t) / w for t, w in zip(tables, weights, strict=True) if w > 0)
        tables = [t.select(range(round(w * total))) for t, w in zip(tables, weights, strict=True)]
    combined = datasets.concatenate_datasets(tables)
    if test_size is not None:
        return _splits(combined.train_test_split(test_size=test_size, seed=seed))
    return {"train": _rows(combined)}
