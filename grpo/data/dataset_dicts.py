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

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from grpo.data.tables import (BUILDER_OF_SUFFIX, DATA_SUFFIXES, OFFLINE_VARS, DataSourceError, _datasets,
                              hub_reachable, is_saved_dataset, looks_like_hub_id)

Rows = list[dict[str, Any]]
MIXTURE_KEYS = ("path", "name", "data_dir", "data_files", "split", "columns", "fraction")
"""The fields of TRL's DatasetConfig (trl/scripts/utils.py), one entry of DatasetMixtureConfig.datasets."""


def _offline() -> bool:
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on") for v in OFFLINE_VARS)


def check_hub(name: str, where: str, what: str = "dataset") -> None:
    """A Hub id that cannot be read here: DataSourceError naming `where` with the fix (no network and no
    HF_HUB_OFFLINE). Passes when HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set (the local cache is read) or the Hub
    answers."""
    if _offline():
        return
    ok, endpoint = hub_reachable()
    if not ok:
        fix = ("datasets.load_dataset(NAME).save_to_disk(FOLDER)" if what == "dataset"
               else "huggingface-cli download NAME --local-dir FOLDER")
        raise DataSourceError(f"{where}={name!r} is not a local file or folder and the Hugging Face Hub ({endpoint}) "
                              f"cannot be reached (offline?): download the {what} where there is a network ({fix}) "
                              f"and give {where}=FOLDER, or set HF_HUB_OFFLINE=1 to read the local Hugging Face cache")


def _rows(table: Any) -> Rows:
    return [dict(row) for row in table]


def _splits(loaded: Any) -> dict[str, Rows]:
    if hasattr(loaded, "keys"):  # a DatasetDict
        return {str(split): _rows(loaded[split]) for split in loaded.keys()}
    return {"train": _rows(loaded)}


def _load(where: str, call: str, *args: Any, **kwargs: Any) -> Any:
    """datasets' `call` (load_dataset / load_from_disk); its failure as a DataSourceError naming `where`."""
    datasets = _datasets()
    shown = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # one line per split and shard is noise on a command line
    try:
        return getattr(datasets, call)(*args, **kwargs)
    except Exception as err:  # datasets raises many types for "cannot read it"; all are the user's input
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
        if "scripts are no longer supported" in first:
            first += (f" (datasets {datasets.__version__} runs no dataset scripts: run the script once with a "
                      "datasets < 4 and save_to_disk the result, or give its data files)")
        raise DataSourceError(f"{where}: datasets.{call}{args!r} cannot be read: {type(err).__name__}: {first}"
                              ) from err
    finally:
        if shown:
            datasets.enable_progress_bars()


def load_named(name: str, config: str | None, where: str) -> dict[str, Rows]:
    """`dataset_name` (+ `dataset_config`) as TRL's script loads it (module docstring), every split's rows."""
    local = Path(name).expanduser()
    if local.is_file():
        builder = "json" if local.suffix.lower() in (".json", ".jsonl") else BUILDER_OF_SUFFIX.get(local.suffix.lower())
        if builder is None:
            raise DataSourceError(f"{where}={name!r} is a file with suffix {local.suffix!r}; data files are "
                                  f"{', '.join(DATA_SUFFIXES)}, or give a folder or a save_to_disk folder")
        extra = {"delimiter": "\t"} if local.suffix.lower() == ".tsv" else {}
        return _splits(_load(where, "load_dataset", builder, data_files=str(local), **extra))
    if local.is_dir():
        if is_saved_dataset(local):
            return _splits(_load(where, "load_from_disk", str(local)))
        return _splits(_load(where, "load_dataset", str(local), name=config))
    if not looks_like_hub_id(name):
        raise DataSourceError(f"{where}={name!r} does not exist: give a data file, a folder or a Hub id 'owner/name'")
    check_hub(name, where)
    return _splits(_load(where, "load_dataset", name, name=config))


def load_mixture(entries: Sequence[Mapping[str, Any]], test_size: float | None, seed: int,
                 where: str) -> dict[str, Rows]:
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
            table = _load(here, "load_dataset", builder, data_files=str(local), split=entry.get("split") or "train")
        else:
            table = _load(here, "load_dataset", path, name=entry.get("name"), data_dir=entry.get("data_dir"),
                          data_files=entry.get("data_files"), split=entry.get("split") or "train")
        if entry.get("columns") is not None:
            table = table.select_columns(list(entry["columns"]))
        tables.append(table)
    fractions = [entry.get("fraction") for entry in entries]
    if any(f is not None for f in fractions):  # trl.get_dataset: shares of the mixture, no dataset oversampled
        if any(f is None for f in fractions):
            raise DataSourceError(f"{where}: `fraction` is set for some datasets and not others; set it for all of "
                                  "them or none (as TRL requires)")
        weights = [float(f) / sum(float(x) for x in fractions) for f in fractions]
        total = min(len(t) / w for t, w in zip(tables, weights) if w > 0)
        tables = [t.select(range(round(w * total))) for t, w in zip(tables, weights)]
    combined = datasets.concatenate_datasets(tables)
    if test_size is not None:
        return _splits(combined.train_test_split(test_size=test_size, seed=seed))
    return {"train": _rows(combined)}
