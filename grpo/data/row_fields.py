"""A row's fields as a task uses them: filled into its prompt template (plain `{field}` substitution,
grpo/config/templates.py), and the required fields a row lacks."""

from __future__ import annotations

from typing import Any, Iterable

from grpo.config import templates


class TemplateFieldError(ValueError):
    """A prompt template names a field the rows do not have: a configuration error, never a skipped row."""


def fill_template(template: str, fields: dict[str, Any], where: str) -> str:
    """`template` with each {field} replaced by that field's text: plain substitution only (grpo/config/templates.py
    refuses attribute access, indexing, conversions and format specs), with a clear error naming `where` when a
    placeholder is not a plain name or names an absent field."""
    try:
        return templates.fill(template, fields, where)
    except templates.TemplateError as err:
        raise TemplateFieldError(str(err)) from None
    except KeyError as err:
        raise TemplateFieldError(
            f"{where}: the prompt template uses {{{err.args[0]}}}, but rows only have the fields {sorted(fields)}; "
            "fix the template (double literal braces)"
        ) from err


def missing_fields(row: dict[str, Any], required: Iterable[str]) -> list[str]:
    """The required fields that are absent or None in `row`."""
    return [name for name in required if row.get(name) is None]
