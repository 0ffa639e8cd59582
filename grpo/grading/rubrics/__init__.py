"""Judge rubrics (`<task>.txt`, falling back to `default.txt`) and the parsing of the judge's score reply.

A rubric file: header lines starting with "#" (the first one "# rubric: <name> <version>"), then a template
filled by plain substitution (grpo/config/templates.py) of the fields {prompt}, {response}, {gold} (literal braces
doubled).
Rubric version = "<declared version>:<sha256(body)[:8]>", so editing a rubric without bumping it still changes
every cache key.
Score reply: a JSON object with "score" — plain, ```json fenced, or embedded in prose. Accepted values: a number
on the 0..scale range (score/scale), "a/b" (a/b), "x%" (x/100), or a numeric string. Anything else is invalid.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo.config import templates

RUBRIC_DIR = Path(__file__).resolve().parent
DEFAULT_RUBRIC = "default"
HASH_CHARS = 8  # enough to tell rubric edits apart in a cache key
GOLD_VALUE_MAX_CHARS = 6000  # a gold document longer than this is cut: the judge's context is finite
_FENCED = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL | re.IGNORECASE)
_FRACTION = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)\s*$")
_PERCENT = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*%\s*$")
_HIDDEN_GOLD = ("format",)  # layout hints for rule graders, meaningless to the judge


class JudgeReplyError(ValueError):
    """The judge answered, but not with a usable score. `kind` is a short stable label for counting."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Rubric:
    name: str
    version: str
    template: str

    def render(self, prompt: str, response: str, gold: dict[str, Any]) -> str:
        """The judge's user message: the rubric with the prompt, the response and the gold fields filled in."""
        return templates.fill(self.template, {"prompt": prompt, "response": response, "gold": render_gold(gold)},
                              f"rubric {self.name}")


def render_gold(gold: dict[str, Any]) -> str:
    """Gold fields as "- key: value" lines (lists joined with " | "), so the judge sees labels and knowledge."""
    lines = []
    for key, value in gold.items():
        if key in _HIDDEN_GOLD:
            continue
        if isinstance(value, (list, tuple)):
            value = " | ".join(str(v) for v in value)
        text = str(value)
        if len(text) > GOLD_VALUE_MAX_CHARS:
            text = text[:GOLD_VALUE_MAX_CHARS] + " …"
        lines.append(f"- {key}: {text}")
    return "\n".join(lines) if lines else "- (none)"


def load_rubric(task: str, rubric_dir: str | Path | None = None) -> Rubric:
    """The rubric for `task` from `<rubric_dir>/<task>.txt`, else `default.txt`; checked by a trial render."""
    folder = Path(rubric_dir) if rubric_dir else RUBRIC_DIR
    path = folder / f"{task}.txt"
    if not path.is_file():
        path = folder / f"{DEFAULT_RUBRIC}.txt"
    if not path.is_file():
        raise FileNotFoundError(f"no rubric for task {task!r}: neither {task}.txt nor {DEFAULT_RUBRIC}.txt in {folder}")
    lines = path.read_text(encoding="utf-8").splitlines()
    header = []
    while lines and lines[0].startswith("#"):
        header.append(lines.pop(0))
    body = "\n".join(lines).strip() + "\n"
    declared = re.search(r"rubric:\s*(\S+)\s+(\S+)", header[0]) if header else None
    version = declared.group(2) if declared else "unversioned"
    digest = hashlib.sha256(body.encode("utf-8")).hexdigest()[:HASH_CHARS]
    rubric = Rubric(name=path.stem, version=f"{version}:{digest}", template=body)
    try:
        rubric.render("p", "r", {"g": 1})
    except (KeyError, IndexError, ValueError) as err:
        raise ValueError(
            f"rubric {path} is not a valid template ({type(err).__name__}: {err}); use only {{prompt}}, "
            "{response}, {gold} and double every literal brace"
        ) from err
    return rubric


def _json_candidates(text: str) -> list[Any]:
    stripped = text.strip()
    found: list[Any] = []
    for chunk in [stripped, *_FENCED.findall(stripped)]:
        try:
            found.append(json.loads(chunk))
        except json.JSONDecodeError:
            pass
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", stripped):  # objects embedded in prose
        try:
            found.append(decoder.raw_decode(stripped, match.start())[0])
        except json.JSONDecodeError:
            pass
    return found


def _to_unit(value: Any, scale: float) -> float:
    if isinstance(value, bool) or value is None:
        raise JudgeReplyError("bad_score", f'"score" must be a number, got {value!r}')
    if isinstance(value, str):
        if (m := _FRACTION.match(value)) and float(m.group(2)) > 0:
            unit = float(m.group(1)) / float(m.group(2))
        elif m := _PERCENT.match(value):
            unit = float(m.group(1)) / 100.0
        else:
            try:
                unit = float(value) / scale
            except ValueError:
                raise JudgeReplyError("bad_score", f'"score" string {value!r} is not a number, "a/b" or "x%"') from None
    elif isinstance(value, (int, float)):
        unit = float(value) / scale
    else:
        raise JudgeReplyError("bad_score", f'"score" must be a number, got {type(value).__name__}')
    if not math.isfinite(unit) or not 0.0 <= unit <= 1.0:
        raise JudgeReplyError("out_of_range", f'"score" {value!r} is outside 0..{scale:g}')
    return unit


def parse_score(text: str | None, scale: float = 10.0) -> float:
    """The judge's score mapped to [0, 1]; raises JudgeReplyError naming what was wrong."""
    if text is None or not text.strip():
        raise JudgeReplyError("empty", "the judge reply has no content")
    objects = [c for c in _json_candidates(text) if isinstance(c, dict)]
    if not objects:
        raise JudgeReplyError("no_json", f"no JSON object in the judge reply: {text[:120]!r}")
    with_score = [o for o in objects if "score" in o]
    if not with_score:
        raise JudgeReplyError("no_score", f'the judge reply JSON has no "score" key: {text[:120]!r}')
    return _to_unit(with_score[0]["score"], scale)
