"""Prompt and rubric templates: plain field substitution, nothing more.

A template is text with `{name}` placeholders, each replaced by the named field's text (literal braces doubled:
`{{` and `}}`). str.format would also follow `{row.__class__}` into an object's attributes, `{row[0]}` into its
items and `{a!r:>{b}}` through conversions and nested specs: a template read from a config file or a data folder must
never reach into the objects it is filled from, so every placeholder that is not one plain name is refused, when the
config is loaded (grpo/config/settings.TaskSourceConfig.validate) and again when the template is filled.
Standard library only, beside grpo/config/building.py.
"""

from __future__ import annotations

import string
from typing import Any, Mapping

_FORBIDDEN = ".[]!:{}"
"""Characters that make a str.format field more than a name: attribute access, indexing, conversion, format spec."""


class TemplateError(ValueError):
    """A template that is not plain field substitution (a bad placeholder, an unmatched brace). The message names
    the template's place (`where`) and the placeholder at fault."""


def problem(template: str) -> str | None:
    """Why `template` is not plain field substitution (None: it is): an unmatched brace, or a placeholder that is
    not a plain name: `{}` / `{0}` (positional), `{a.b}`, `{a[0]}`, `{a!r}`, `{a:>5}`."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as err:  # "Single '}' encountered", "expected '}' before end of string"
        return f"{err}; double literal braces ({{{{ and }}}})"
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        shown = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
        if not name.strip() or name.strip().isdigit():
            return f"name every placeholder after a field, e.g. {{question}}: the placeholder {shown} names none"
        if conversion or spec or any(c in name for c in _FORBIDDEN):
            return (f"the placeholder {shown} is not a plain field name; a template is filled by plain substitution "
                    "only ({field}): no attribute access (.), indexing ([]), conversion (!r) or format spec (:)")
    return None


def placeholders(template: str, where: str) -> list[str]:
    """The field names of `template`, in order (repeats kept); TemplateError naming `where` and the bad placeholder
    when it is not plain field substitution (`problem`)."""
    why = problem(template)
    if why is not None:
        raise TemplateError(f"{where}: template {template[:200]!r}: {why}")
    return [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]


def fill(template: str, fields: Mapping[str, Any], where: str) -> str:
    """`template` with each `{name}` replaced by str(fields[name]) and `{{` / `}}` by single braces. TemplateError
    (see `placeholders`) for a placeholder that is not a plain name; KeyError(name) for a name `fields` lacks."""
    placeholders(template, where)
    out = []
    for literal, name, _, _ in string.Formatter().parse(template):
        out.append(literal)
        if name is not None:
            out.append(str(fields[name]))
    return "".join(out)
