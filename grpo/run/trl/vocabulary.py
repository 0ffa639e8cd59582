"""A run's advice in the words its user configured it with.

A run configured through TRL's fields (a GRPOConfig, a `trl grpo` config file or its flags) records, in
train.trl_names, the TRL field or flag behind each grpo-dual field that holds its value as it is (the translation's
origins, grpo/run/trl/rows.py: `user_names`). `in_user_terms` rewrites a text that names grpo-dual fields (a doctor
finding, the verdict's next step, an error) so that each such field is named as the user wrote it, ours in brackets:

    try `rollout.k=16`: ...        ->  try `--num_generations 16` (rollout.k): ...     (a command line or file)
                                   ->  try `num_generations=16` (rollout.k): ...       (a GRPOConfig)
    a smaller train.lr             ->  a smaller --learning_rate (train.lr)
    kl.<task>.beta=0.08            ->  --beta 0.08 (kl.default.beta)                   (a task without its own kl entry)

A field TRL has no name for, or one the user set with grpo-dual's own flag, stays as it is; a text without TRL names
is returned unchanged. Applied once to each text, where it is shown (doctor/verdict.py, doctor/report.py, the entry
point's errors); a second application changes nothing (a field already shown in brackets is left alone). Pure text and
the config's dict (config.json's), no torch.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping

from grpo import config as C

SECTIONS = tuple(f.name for f in dataclasses.fields(C.Config) if f.name != "preset")
FIELD = re.compile(r"(?P<open>`?)(?<![\w./<>-])(?P<field>(?:" + "|".join(SECTIONS) + r")\.[A-Za-z0-9_<>]+"
                   r"(?:\.[A-Za-z0-9_<>]+)?)(?:=(?P<value><[^>]*>|[^\s`,;)]+))?(?P<close>`?)")
"""A grpo-dual field in a text, `section.field` (or `kl.<task>.field`), with its `=value` when it has one, and the
backticks around it when it is quoted."""


def trl_names(settings: Mapping[str, Any]) -> dict[str, str]:
    """train.trl_names of a config's dict (config.json's, or C.to_dict(cfg)); {} without."""
    train = settings.get("train") if isinstance(settings, Mapping) else None
    names = train.get("trl_names") if isinstance(train, Mapping) else None
    return dict(names) if isinstance(names, Mapping) else {}


def in_user_terms(text: str, settings: Mapping[str, Any]) -> str:
    """`text` with every grpo-dual field that a TRL field or flag set in this run (`settings`: the config's dict)
    named by that field or flag, ours in brackets (the module docstring's examples)."""
    names = trl_names(settings)
    if not names or not text:
        return text
    own_kl = {task for task in (settings.get("kl") or {}) if task != "default"}

    def spoken(match: re.Match) -> str:
        field, value, opened, closed = match.group("field", "value", "open", "close")
        start, end = match.span()
        if text[start - 1:start] == "(" and text[end:end + 1] == ")":  # already shown as ours, in brackets
            return match.group(0)
        parts = field.split(".")
        if parts[0] == "kl" and len(parts) == 3 and parts[1] not in own_kl:  # a task on kl.default's setting
            field = f"kl.default.{parts[2]}"
        name = names.get(field)
        if name is None:
            return match.group(0)
        said = name if value is None else f"{name} {value}" if name.startswith("--") else f"{name}={value}"
        if opened and closed:  # `rollout.k=16` -> `--num_generations 16` (rollout.k)
            return f"`{said}` ({field})"
        return f"{opened}{said} ({field}){closed}"

    return FIELD.sub(spoken, text)


def error_in_user_terms(err: Exception, settings: Mapping[str, Any]) -> Exception:
    """A ConfigError raised once the config was built, its message `in_user_terms` (same type, same field); any
    other error as it is."""
    if not isinstance(err, C.ConfigError) or not trl_names(settings):
        return err
    text = in_user_terms(str(err), settings)
    fix = in_user_terms(err.fix, settings) if err.fix else err.fix
    return err if text == str(err) else C.ConfigError(text, field=err.field, fix=fix)
