"""Reading JSON record files robustly.

Accepted layouts (all seen in the wild for the same datasets):
  - JSON lines: one object per line;
  - a whole JSON array of objects;
  - concatenated objects (pretty-printed, back to back), read with `json.JSONDecoder.raw_decode`.
A row that does not parse, or is not an object, or lacks a required field, is reported as
`<file>:<line>: <reason>` through `warnings.warn` (the first few per file, then one summary with the count),
skipped, and counted in `RecordsRead.skipped`; it is never dropped silently; so is a row nested more than MAX_DEPTH
levels deep (Python's decoder would raise RecursionError on it). A file in which no row parses as a JSON object, or
that is not UTF-8, is not a data file at all: `DataFileError`, naming the file, stops the run before anything is
built. A UTF-8 byte-order mark at the start of the file is dropped.

The rows' template fields are grpo/data/row_fields.py's; the train / held-out split grpo/data/heldout_split.py's.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_WARNINGS_PER_FILE = 5  # enough to see the pattern of a broken file without flooding the log
MAX_DEPTH = 64
"""Deepest nesting of lists / objects a row may have. Real rows nest a few levels; a row nested ~1000 deep makes
Python's JSON decoder (and every later recursive walk: copying, json.dumps of the samples) raise RecursionError."""


class DataFileError(ValueError):
    """A data file that cannot be used at all (not JSON, no usable row). The message names the file."""


@dataclass
class RecordsRead:
    """The good rows of one file with their 1-based start line, and how many rows were skipped."""

    path: str
    rows: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    skipped: int = 0
    problems: list[str] = field(default_factory=list)
    """Every `<file>:<line>: <reason>` message, in file order."""
    unit: str = "line"
    """What the row numbers count: "line" (JSON files: the line a row starts on) or "row" (1-based data rows of a
    table read through `datasets`; a CSV file's row n is on line n + 1)."""

    def where(self, number: int) -> str:
        """`<file>:<line>` or `<file> row <n>`: how messages point at one row."""
        return f"{self.path}:{number}" if self.unit == "line" else f"{self.path} row {number}"

    def reject(self, line: int, reason: str) -> None:
        """Skip one row: count it and remember the message (warned about in `finish`)."""
        self.skipped += 1
        self.problems.append(f"{self.where(line)}: skipped bad row: {reason}")

    def finish(self) -> "RecordsRead":
        """Emit the warnings for the skipped rows: the first few in full, then one summary with the count."""
        for message in self.problems[:MAX_WARNINGS_PER_FILE]:
            warnings.warn(message, stacklevel=3)
        if self.skipped > MAX_WARNINGS_PER_FILE:
            warnings.warn(
                f"{self.path}: {self.skipped} bad rows skipped in all "
                f"(only the first {MAX_WARNINGS_PER_FILE} shown)",
                stacklevel=3,
            )
        return self


@dataclass
class LoadResult:
    """Samples of one loader call, plus how many source rows were skipped as bad (already warned about)."""

    samples: list[Any] = field(default_factory=list)
    """grpo.core.step_types.Sample objects."""
    skipped: int = 0


def nesting_depth(value: Any) -> int:
    """How deeply lists and objects nest in `value` (a scalar: 0, [] or {}: 1), walked without recursion."""
    depth, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            depth = max(depth, level)
            stack.extend((child, level + 1) for child in children)
    return depth


def _row_problem(value: Any) -> str | None:
    """Why a parsed value cannot be a row (not an object, nested too deeply), or None."""
    if not isinstance(value, dict):
        return f"a {type(value).__name__}, not an object"
    if nesting_depth(value) > MAX_DEPTH:
        return f"nested more than {MAX_DEPTH} levels deep"
    return None


def _too_deep(pos: int) -> str:
    return f"nested too deeply to parse (more than Python's recursion limit, near character {pos})"


def _read_array(text: str, read: RecordsRead) -> None:
    try:
        items = json.loads(text)
    except json.JSONDecodeError as err:
        raise DataFileError(
            f"{read.path}:{err.lineno}: the file starts with '[' but is not a valid JSON array ({err.msg}); "
            "fix the file or convert it to JSON lines so bad rows can be skipped one by one"
        ) from err
    except RecursionError:
        raise DataFileError(f"{read.path}: the JSON array is {_too_deep(0)}; convert it to JSON lines so a bad row "
                            "can be skipped alone") from None
    if not isinstance(items, list):
        raise DataFileError(f"{read.path}: expected a JSON array of objects, got {type(items).__name__}")
    for index, item in enumerate(items):
        # An array has no per-row line number; the 1-based element index stands in for it.
        problem = _row_problem(item)
        if problem is None:
            read.rows.append((index + 1, item))
        else:
            read.reject(index + 1, f"array element {index} is {problem}")


def _read_stream(text: str, read: RecordsRead) -> None:
    decoder = json.JSONDecoder()
    pos, end = 0, len(text)
    line, line_pos = 1, 0  # line number of offset line_pos; advanced incrementally (counting from 0 is O(n^2))
    while True:
        while pos < end and text[pos].isspace():
            pos += 1
        if pos >= end:
            return
        line, line_pos = line + text.count("\n", line_pos, pos), pos
        try:
            value, pos = decoder.raw_decode(text, pos)
        except (json.JSONDecodeError, RecursionError) as err:
            read.reject(line, f"invalid JSON ({err.msg})" if isinstance(err, json.JSONDecodeError) else _too_deep(pos))
            nxt = text.find("\n", pos)  # resynchronise at the next line: JSON lines is the common layout
            pos = end if nxt < 0 else nxt + 1
            continue
        problem = _row_problem(value)
        if problem is None:
            read.rows.append((line, value))
        else:
            read.reject(line, problem)


def read_records(path: str | Path) -> RecordsRead:
    """All JSON objects in `path` (JSON lines, one array, or concatenated objects).

    Rows that do not parse are counted in `.skipped` and described in `.problems`; the caller may reject more
    rows (`.reject`) and then calls `.finish()` once to warn about all of them."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"data file not found: {p} (check the data path in the config)")
    try:  # utf-8-sig: a byte-order mark (what some Windows editors write first) is not part of the first row
        text = p.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as err:
        line = p.read_bytes()[:err.start].count(b"\n") + 1
        raise DataFileError(f"{p}:{line}: not UTF-8 text (byte {err.object[err.start]:#04x} at offset {err.start}); "
                            "save the file as UTF-8") from None
    read = RecordsRead(path=str(p))
    if text.lstrip().startswith("["):
        _read_array(text, read)
    else:
        _read_stream(text, read)
    if read.problems and not read.rows:
        raise DataFileError(
            f"{p}: not a JSON data file: none of its {read.skipped} rows is a JSON object (first: "
            f"{read.problems[0].removeprefix(f'{p}:')}); expected JSON lines, one JSON array of objects, or "
            "concatenated objects"
        )
    return read
