"""Task sources: one `TaskSource` per task (the `tasks.<task>` config section) -> train and held-out Samples.

    load_sources({task: source}, heldout_fraction, system_prompt, salt) -> Loaded(train, heldout, metrics)
    load_source_samples(task, source, system_prompt) -> (samples, metrics)     no split: for callers that split

The task's name is the key (as for `kl.<task>` and `rewards.<task>`), never a field copied into the section.

Every form a source may take (a JSON / JSONL / CSV / Parquet file, a folder of them, a datasets builder over local
files, a save_to_disk folder, a Hub id) is read by grpo/data/tables.py; every row then goes through the one
column mapping of grpo/data/generic.py. Held-out rows: the source's `heldout` (a split name, or a second file or
folder) when given, else the stable hash split of grpo/data/heldout_split.py (a row is held out iff
sha256(salt:id) / 2**64 < heldout_fraction), per source, so adding a task never moves another task's rows.

Errors: a source that cannot be read, a mapping that names a column the table lacks, or a source that yields no
row raise DataSourceError naming `tasks.<task>.<field>` and the file; a bad row is skipped, counted and warned
about as `<file>:<line>` (JSON) or `<file> row <n>` (tables read through datasets), naming the column.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Mapping, Sequence

from grpo.config import TaskSourceConfig
from grpo.core.step_types import Sample
from grpo.data.generic import RowError, row_to_sample
from grpo.data.heldout_split import split_heldout
from grpo.data.json_rows import LoadResult, RecordsRead
from grpo.data.row_fields import TemplateFieldError
from grpo.data.tables import DATA_SUFFIXES, DataSourceError, looks_like_hub_id, read_tables

__all__ = ["DataSourceError", "Loaded", "TaskSource", "load_source_samples", "load_sources"]


TaskSource = TaskSourceConfig
"""A task's source is its `tasks.<task>` config section itself (grpo/config/sections.py: fields, docstrings,
`validate`): one home for the settings, whether they come from the command line, a config file or Python."""


@dataclass
class Loaded:
    """The Samples of every source, split into train and held-out, and the `data/<task>/...` counts."""

    train: list[Sample] = field(default_factory=list)
    heldout: list[Sample] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)


def _columns(tables: Sequence[RecordsRead]) -> set[str]:
    return {key for read in tables for _, row in read.rows for key in row}


def _check_columns(task: str, source: TaskSource, tables: Sequence[RecordsRead], where: str) -> None:
    """Mapping fields that name no column of any row: a configuration error, not a bad row per row."""
    columns = _columns(tables)
    if not columns:
        return
    files = ", ".join(t.path for t in tables[:3]) + (" ..." if len(tables) > 3 else "")
    have = f"the columns of {files} are {sorted(columns)}"
    if not source.template and not {source.prompt_field, source.messages_field} & columns:
        raise DataSourceError(f"{where}.prompt_field: no column {source.prompt_field!r} (nor "
                              f"{source.messages_field!r}) to take prompts from; {have}: set prompt_field, "
                              "messages_field or template")
    # Optional columns are checked only when renamed (a default name absent from the rows is normal); the task
    # column only when no task name stands in for it.
    defaults = {f.name: f.default for f in fields(type(source))}
    named = [(f"{where}.gold_fields", g) for g in source.gold_fields] + [
        (f"{where}.{name}", getattr(source, name)) for name in ("target_field", "id_field")
        if getattr(source, name) != defaults[name]]
    if source.task_field and not task:
        named.append((f"{where}.task_field", source.task_field))
    for field_name, column in named:
        if column not in columns:
            raise DataSourceError(f"{field_name}: no column {column!r}; {have}")


def _samples(tables: list[RecordsRead], task: str, source: TaskSource, system_prompt: str, where: str,
             limit: int) -> LoadResult:
    _check_columns(task, source, tables, where)
    result = LoadResult()
    for read in tables:
        for number, row in read.rows:
            if limit and len(result.samples) >= limit:
                break
            try:
                sample = row_to_sample(row, source, task, system_prompt)
            except TemplateFieldError as err:
                raise DataSourceError(f"{where}.template: {read.where(number)}: {err}") from None
            except RowError as err:
                read.reject(number, str(err))
                continue
            result.samples.append(replace(sample, meta={**sample.meta, "source": read.path, read.unit: number}))
        read.finish()
        result.skipped += read.skipped
    if not result.samples:
        problems = [p for read in tables for p in read.problems]
        first = f"; first problem: {problems[0]}" if problems else ""
        raise DataSourceError(f"{where}: no usable row in {', '.join(t.path for t in tables) or source.path}{first}")
    return result


def _read(source: TaskSource, where: str, path: str, split: str) -> list[RecordsRead]:
    return read_tables(path, where=where, builder=source.builder, data_files=source.data_files if path ==
                       source.path else (), split=split, config_name=source.config_name)


def _metrics(samples: list[Sample], key: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in samples:
        out[f"data/{s.task}/{key}"] = out.get(f"data/{s.task}/{key}", 0.0) + 1.0
    return out


def _name(task: str, source: TaskSource) -> str:
    """How messages name the source: its config section, or data.source for a file whose rows name their tasks."""
    return f"tasks.{task}" if task else "data.source"


def load_source_samples(task: str, source: TaskSource,
                        system_prompt: str = "") -> tuple[list[Sample], dict[str, float]]:
    """Every training row of one source as Samples (no split), and its `data/<task>/rows` / `skipped` counts.
    `task` names every row ("" only with `source.task_field`: then each row must name its own)."""
    where = _name(task, source)
    source.validate(where)  # a source built in Python is checked here, before anything is read
    result = _samples(_read(source, where, source.path, source.split), task, source, system_prompt, where,
                      source.limit)
    metrics = _metrics(result.samples, "rows")
    metrics[f"data/{task or 'all'}/skipped"] = float(result.skipped)
    return result.samples, metrics


def _heldout_location(source: TaskSource, where: str) -> tuple[str, str]:
    """(path, split) of the given held-out rows: a second file or folder, or another split of the source."""
    given = source.heldout
    if Path(given).expanduser().exists() or given.lower().endswith(DATA_SUFFIXES):
        return given, "train"
    local = Path(source.path).expanduser()
    splits = (local / "dataset_dict.json").is_file() or (not local.exists() and looks_like_hub_id(source.path))
    if not splits:
        raise DataSourceError(f"{where}.heldout: {given!r} is not an existing file or folder, and "
                              f"{source.path!r} has no named splits (only a Hub dataset or a save_to_disk "
                              "DatasetDict has); give a second file, or leave it empty for the hash split")
    return source.path, given


def load_sources(sources: Mapping[str, TaskSource], heldout_fraction: float, system_prompt: str = "",
                 salt: str = "") -> Loaded:
    """Train and held-out Samples of every source, in source order, and their counts (`data/<task>/rows`,
    `data/<task>/heldout`, `data/<task>/skipped`). A source with `heldout` uses those rows as its held-out set
    (a training row with a held-out id is warned about: the evaluation would score memorised rows)."""
    loaded = Loaded()
    for task, source in sources.items():
        samples, metrics = load_source_samples(task, source, system_prompt)
        loaded.metrics.update({k: v for k, v in metrics.items() if k.endswith("/skipped")})
        if not source.heldout:
            train, heldout = split_heldout(samples, [s.id for s in samples], heldout_fraction, salt)
        else:
            where = _name(task, source)
            path, split = _heldout_location(source, where)
            train = samples
            heldout = _samples(_read(source, f"{where}.heldout", path, split), task, source, system_prompt,
                               f"{where}.heldout", 0).samples
            leaked = {s.id for s in heldout} & {s.id for s in train}
            if leaked:
                warnings.warn(f"{where}: {len(leaked)} held-out row ids also appear in the training rows "
                              f"(e.g. {sorted(leaked)[:3]}); the held-out reward will flatter the model",
                              stacklevel=2)
        loaded.train += train
        loaded.heldout += heldout
        for key, samples_of in (("rows", train), ("heldout", heldout)):
            for name, count in _metrics(samples_of, key).items():
                loaded.metrics[name] = loaded.metrics.get(name, 0.0) + count
    return loaded

