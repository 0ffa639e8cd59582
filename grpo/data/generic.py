"""Generic task rows -> Samples, through a column mapping (`grpo.data.sources.TaskSource` is the one that is used).

Row contract (`row_to_sample`), every column name set by the mapping:
  prompt      the user message (a string), or `template` formatted with the row's columns; or
  messages    a list of {"role", "content"} without the answer (TRL's conversational format; in a CSV cell, the
              list written as JSON). Used when present; the prompt column otherwise. A prompt column that holds
              such a list (as TRL's conversational datasets do) counts as messages.
  target      optional reference completion (SFT warm-up; also a gold field).
  id          optional row id; missing = a sha256 of the prompt text (stable across machines).
  task        with `task_field` set, the row's own task name (rows without one get the source's task).
  gold        the columns the graders see: `gold_fields` when given, else a `gold` column holding a dict, else
              every column with a value that is not the prompt, messages, id, task or meta column.
A row that breaks the contract raises RowError naming the column; the loader skips it, naming file and line.
"""

from __future__ import annotations

import json
from typing import Any, Protocol, Sequence

from grpo.core.step_types import Sample
from grpo.data.heldout_split import content_id
from grpo.data.row_fields import fill_template

CHAT_ROLES = ("system", "user", "assistant", "tool", "developer", "ipython", "function")
"""The message roles chat templates know (Llama 3.1's ipython, OpenAI's developer and function among them): a row
with another role is a bad row, named by file and line, before a chat template raises on it after the model loaded."""
GOLD_COLUMN = "gold"  # a column holding the whole gold dict (the original JSONL row format)
META_COLUMN = "meta"  # a column holding a dict kept as Sample.meta


class RowError(ValueError):
    """One row breaks the row contract; the message names the column."""


class ColumnMap(Protocol):
    """What `row_to_sample` reads of a source's spec (grpo.data.sources.TaskSource has these fields)."""

    task_field: str
    prompt_field: str
    messages_field: str
    target_field: str
    id_field: str
    gold_fields: Sequence[str]
    template: str


def _messages(value: Any, column: str) -> list[dict[str, str]]:
    if isinstance(value, str):  # CSV cells hold the list as JSON text
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise RowError(f"column {column!r} is text but not a JSON list of messages ({err.msg})") from err
    if not (isinstance(value, list) and value and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in value)):
        raise RowError(f"column {column!r} must be a non-empty list of {{'role': str, 'content': str}} objects")
    unknown = [m["role"] for m in value if m["role"] not in CHAT_ROLES]
    if unknown:
        raise RowError(f"column {column!r} has a message of the role {unknown[0]!r}; chat templates know "
                       f"{', '.join(CHAT_ROLES[:4])} (and some {', '.join(CHAT_ROLES[4:])})")
    if value[-1]["role"] == "assistant":
        raise RowError(f"column {column!r} ends with an assistant turn: the prompt must not hold the answer "
                       "(put it in the target column)")
    return [{"role": m["role"], "content": m["content"]} for m in value]


def _gold(row: dict[str, Any], cols: ColumnMap) -> dict[str, Any]:
    if cols.gold_fields:
        absent = [f for f in cols.gold_fields if f not in row]
        if absent:
            raise RowError(f"gold_fields {absent} are not columns of the row (columns: {sorted(row)})")
        return {f: row[f] for f in cols.gold_fields}
    if isinstance(row.get(GOLD_COLUMN), dict):
        return dict(row[GOLD_COLUMN])
    structural = {cols.prompt_field, cols.messages_field, cols.id_field, cols.task_field, META_COLUMN}
    # A table read through datasets has every column in every row (None where a row has no value); leaving None
    # out makes a row's gold the same whichever form it was stored in.
    return {k: v for k, v in row.items() if k not in structural and v is not None}


def row_to_sample(row: dict[str, Any], cols: ColumnMap, task: str, system_prompt: str = "") -> Sample:
    """One row of task `task` as a Sample (a row's own `task_field` column, when set, names its task instead).
    Raises RowError naming the column at fault (TemplateFieldError for a template that names an absent column: a
    configuration error, not a bad row)."""
    own = row.get(cols.task_field) if cols.task_field else None
    task = str(own) if own not in (None, "") else task
    if not task:
        raise RowError(f"no task name: column {cols.task_field!r} is empty and the source names no task")
    messages: list[dict[str, str]] = [{"role": "system", "content": system_prompt}] if system_prompt else []
    # TRL's conversational datasets keep the message list in the prompt column itself.
    if row.get(cols.messages_field) is not None:
        column = cols.messages_field
    else:
        column = cols.prompt_field if isinstance(row.get(cols.prompt_field), list) else ""
    conversational = bool(column)
    if conversational:
        messages += _messages(row[column], column)
    elif cols.template:
        messages.append({"role": "user", "content": fill_template(cols.template, row, "the prompt template")})
    elif row.get(cols.prompt_field) not in (None, ""):
        messages.append({"role": "user", "content": str(row[cols.prompt_field])})
    else:
        raise RowError(f"neither column {cols.messages_field!r} nor {cols.prompt_field!r} holds a prompt (and no "
                       "template is set)")
    raw_id = row.get(cols.id_field)
    sample_id = str(raw_id) if raw_id not in (None, "") else content_id(*(m["content"] for m in messages))
    target = row.get(cols.target_field)
    meta = row.get(META_COLUMN)
    return Sample(task=task, id=sample_id, messages=tuple(messages), gold=_gold(row, cols),
                  meta=dict(meta) if isinstance(meta, dict) else {},
                  target=None if target in (None, "") else str(target), conversational=conversational)
