"""Generic task rows: a JSONL file of {task, prompt | messages, id?, target?, gold? | ...gold fields}, and a thin
adapter over `datasets.load_dataset` for local files (csv, json, parquet, ...).

Row contract (`row_to_sample`): `messages` (a list of {"role", "content"} without the answer) or `prompt` (a
string, optionally formatted through `template` with the row's fields); `gold` (a dict) if present, else every
field that is not task / id / prompt / messages / target / meta becomes a gold field; `id` if present, else a
sha256 of the prompt (stable across machines).
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

from grpo.records import Sample
from grpo.tasks.jsonio import (
    MAX_WARNINGS_PER_FILE, LoadResult, TemplateFieldError, content_id, fill_template, read_records,
)

RESERVED = ("task", "id", "prompt", "messages", "target", "meta", "gold")


def row_to_sample(
    row: dict[str, Any], *, default_task: str | None, system_prompt: str | None = None, template: str | None = None,
    id_field: str = "id", prompt_field: str = "prompt",
) -> Sample:
    """One generic row as a Sample. Raises ValueError naming what is missing."""
    task = row.get("task", default_task)
    if not task:
        raise ValueError("no 'task' field and no default task given")
    messages: list[dict[str, str]] = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    if row.get("messages") is not None:
        given = row["messages"]
        well_formed = isinstance(given, list) and all(
            isinstance(m, dict) and {"role", "content"} <= m.keys() for m in given
        )
        if not well_formed:
            raise ValueError("'messages' must be a list of {'role', 'content'} objects")
        messages.extend({"role": str(m["role"]), "content": str(m["content"])} for m in given)
    elif row.get(prompt_field) is not None or template is not None:
        text = fill_template(template, row, "generic rows") if template is not None else str(row[prompt_field])
        messages.append({"role": "user", "content": text})
    else:
        raise ValueError(f"neither 'messages' nor {prompt_field!r} (and no template)")
    if isinstance(row.get("gold"), dict):
        gold = dict(row["gold"])
    else:
        gold = {k: v for k, v in row.items() if k not in RESERVED and k not in (id_field, prompt_field)}
    raw_id = row.get(id_field)
    sample_id = str(raw_id) if raw_id is not None else content_id(*(m["content"] for m in messages))
    target = row.get("target")
    return Sample(task=str(task), id=sample_id, messages=tuple(messages), gold=gold,
                  meta=dict(row.get("meta") or {}), target=None if target is None else str(target))


def load_jsonl_tasks(
    path: str | Path, default_task: str | None = None, system_prompt: str | None = None, template: str | None = None,
    limit: int | None = None,
) -> LoadResult:
    """Samples from a generic JSON-lines (or array / concatenated) file; bad rows warned, counted and skipped."""
    read = read_records(path)
    result = LoadResult()
    for line, row in read.rows:
        if limit is not None and len(result.samples) >= limit:
            break
        try:
            sample = row_to_sample(row, default_task=default_task, system_prompt=system_prompt, template=template)
        except TemplateFieldError:
            raise
        except (ValueError, KeyError, TypeError, IndexError) as err:
            read.reject(line, f"{type(err).__name__}: {err}")
            continue
        result.samples.append(replace(sample, meta={**sample.meta, "source": read.path, "line": line}))
    read.finish()
    result.skipped = read.skipped
    return result


def load_hf_dataset(
    builder: str, data_files: str | list[str] | dict[str, Any], *, task: str, split: str = "train",
    template: str | None = None, prompt_field: str = "prompt", id_field: str = "id",
    system_prompt: str | None = None, limit: int | None = None,
) -> LoadResult:
    """Samples from local files read by `datasets.load_dataset(builder, data_files=..., split=...)`.

    builder: "json", "csv", "parquet", ... Each row goes through `row_to_sample` (template formats the prompt
    from the row's fields). Needs the optional `datasets` package.
    """
    try:
        import datasets  # lazy: optional dependency, heavy import
    except ImportError as err:
        raise ImportError("load_hf_dataset needs the 'datasets' package: pip install datasets") from err
    files = [data_files] if isinstance(data_files, str) else data_files
    if isinstance(files, list):
        absent = [f for f in files if not Path(f).exists()]
        if absent:
            raise FileNotFoundError(f"load_hf_dataset: data files not found: {absent}")
    table = datasets.load_dataset(builder, data_files=data_files, split=split)
    result = LoadResult()
    for index, row in enumerate(table):
        if limit is not None and len(result.samples) >= limit:
            break
        try:
            result.samples.append(row_to_sample(dict(row), default_task=task, system_prompt=system_prompt,
                                                template=template, id_field=id_field, prompt_field=prompt_field))
        except TemplateFieldError:
            raise
        except (ValueError, KeyError, TypeError, IndexError) as err:
            result.skipped += 1
            if result.skipped <= MAX_WARNINGS_PER_FILE:
                warnings.warn(f"{builder}:{data_files} row {index}: skipped bad row: {err}", stacklevel=2)
    if result.skipped > MAX_WARNINGS_PER_FILE:
        warnings.warn(f"{builder}:{data_files}: {result.skipped} bad rows skipped in all", stacklevel=2)
    return result
