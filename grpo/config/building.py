"""The Config built: presets, overrides and config files into a checked `Config`, and back (`load_config`,
`from_dict`, `to_dict`, `dumps`); values parsed into each field's declared type (`parse_value`, `coerce_value`), a
number that no float holds refused (`_finite`). Standard library only; the sections are grpo/config/sections.py's and
its parts', the presets grpo/config/presets.py's, and the package grpo/config/__init__.py re-exports every name
(`C.load_config`, ...).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import types
import typing
from typing import Any

from grpo.config.algorithm_sections import TaskKLConfig
from grpo.config.checks import ConfigError, _check, field_error
from grpo.config.input_sections import RewardModelConfig, TaskSourceConfig
from grpo.config.presets import DEMO_KL, PRESETS
from grpo.config.sections import Config
from grpo.core.plumbing import did_you_mean

# ----------------------------------------------------------------------------------------------------- building
DICT_SECTIONS: dict[str, type] = {"tasks": TaskSourceConfig, "reward_models": RewardModelConfig}
"""Config fields holding one section per user-chosen key (besides kl.<task>): the key's section class."""


def _sections() -> dict[str, type]:
    return {f.name: f.type for f in dataclasses.fields(Config)}


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


MAX_FLOAT_INT = 2**1024
"""Integers from here up have no float (float(2**1024) raises OverflowError): such a number is infinite to a float
field."""


def parse_value(text: str, annotation: Any, name: str) -> Any:
    """Parse a command-line string into the field's declared type (numbers through `_finite`)."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if text.strip().lower() in ("none", "null", ""):
            return None
        inner = [a for a in args if a is not type(None)]
        return parse_value(text, inner[0], name)
    if annotation is bool:
        low = text.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise field_error(name, text, "use true or false")
    if annotation in (int, float):
        try:
            number = annotation(text)
        except ValueError:
            raise field_error(name, text, f"expected {annotation.__name__}") from None
        return _finite(number, name)
    if origin is list:
        return [s.strip() for s in text.split(",") if s.strip()]
    if origin is dict:  # `--loss.params a=1,b=2`: a table of named values
        pairs = [item.partition("=") for item in text.split(",") if item.strip()]
        if any(not eq or not key.strip() for key, eq, _ in pairs):
            raise field_error(name, text, f"write name=value,name=value, or set one as {name}.<name>=value")
        return {key.strip(): parse_value(value, args[1], f"{name}.{key.strip()}") for key, _, value in pairs}
    return text


def _finite(value: int | float, name: str) -> int | float:
    """The one rule on numbers, whichever way they come in (command line, config.json, a preset, Python): inf and
    nan are refused. No field means anything by them: a non-finite learning rate, timeout or KL bound only turns
    into NaN weights or a hung run later, far from the setting that caused it."""
    _check(not isinstance(value, float) or math.isfinite(value), name, value,
           "use a finite number (inf and nan are not accepted)")
    return value


def coerce_value(value: Any, annotation: Any, name: str) -> Any:
    """A field's value from a command-line string (`parse_value`) or a JSON / Python value, checked against the
    field's declared type; raises ConfigError naming the field. JSON numbers may be ints where a float is expected."""
    if isinstance(value, str) and annotation is not str:
        return parse_value(value, annotation, name)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
        origin = typing.get_origin(annotation)
    if annotation is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        too_big = isinstance(value, int) and abs(value) >= MAX_FLOAT_INT  # float(10**400) would overflow
        return _finite(math.inf if too_big else float(value), name)
    if annotation is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if annotation in (bool, str) and isinstance(value, annotation):
        return value
    if origin is list and isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    if origin is dict and isinstance(value, dict):  # loss.params: each value checked as its own field
        return {str(k): coerce_value(v, typing.get_args(annotation)[1], f"{name}.{k}") for k, v in value.items()}
    expected = ("a list of strings" if origin is list else "a table of name: value" if origin is dict
                else getattr(annotation, "__name__", str(annotation)))
    raise field_error(name, value, f"expected {expected}")


def _leaves(tree: dict, prefix: str) -> list[str]:
    """The dotted names of the values in a nested dict: what an override like `rollout.k.x=3` asked to set."""
    out = []
    for key, value in tree.items():
        out += _leaves(value, f"{prefix}.{key}") if isinstance(value, dict) and value else [f"{prefix}.{key}"]
    return out


def _table(values: Any, where: str, how: str) -> dict:
    """`values` when it is a table (dict), else a ConfigError naming `where` (e.g. `--kl.fairness 3`) that says `how`
    to set what it holds."""
    if not isinstance(values, dict):
        raise ConfigError(f"config field `{where}` = {values!r} is invalid: `{where}` is a section, not a value; "
                          f"write {how}", field=where)
    return values


def _coerce_section(cls: type, values: dict[str, Any], where: str) -> Any:
    hints = _field_types(cls)
    values = _table(values, where, f"{where}.<field>=value (fields: {sorted(hints)})")
    unknown = sorted(set(values) - set(hints))
    if unknown:
        guess = did_you_mean(unknown, hints, where)
        if not guess and typing.get_origin(hints.get("params")) is dict:  # loss.cispo_max_ratio, before loss.params
            guess = (f" (did you mean {', '.join(f'`{where}.params.{u}`' for u in unknown)}? a policy loss's own "
                     f"hyper-parameters are set as {where}.params.<name>)")
        raise ConfigError(f"unknown config field(s) {[f'{where}.{u}' for u in unknown]}{guess}"
                          f": valid fields of `{where}` are {sorted(hints)}", field=f"{where}.{unknown[0]}")
    out = {}
    for key, value in values.items():
        # `rollout.k.x=3`: a field used as if it were a section
        if isinstance(value, dict) and typing.get_origin(hints[key]) is not dict:
            raise ConfigError(f"unknown config field(s) {_leaves(value, f'{where}.{key}')}: `{where}.{key}` is a "
                              f"field, not a section; set it with {where}.{key}=value", field=f"{where}.{key}")
        out[key] = coerce_value(value, hints[key], f"{where}.{key}")
    return cls(**out)


def _keyed_section(name: str, key: str, value: Any) -> Any:
    """The section of `name.key` (tasks.qa, reward_models.rm) from a dict of its fields, or the section itself."""
    cls = DICT_SECTIONS[name]
    if isinstance(value, cls):
        return value
    if not isinstance(value, dict):
        raise ConfigError(f"config field `{name}.{key}` = {value!r} is invalid: it is a section; set its fields, e.g. "
                          f"{name}.{key}.path=...  (fields: {sorted(_field_types(cls))})", field=f"{name}.{key}")
    return _coerce_section(cls, value, f"{name}.{key}")


def _merge(base: dict, extra: dict) -> dict:
    merged = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def from_dict(d: dict[str, Any]) -> Config:
    """Build and validate a Config from a nested dict (as written to config.json or given by a preset)."""
    sections = _sections()
    if not isinstance(d, dict):
        raise ConfigError(f"a config is a table of sections {sorted(sections)}, not a {type(d).__name__}")
    unknown = sorted(set(d) - set(sections))
    if unknown:
        raise ConfigError(f"unknown config section(s) {unknown}{did_you_mean(unknown, sections)}: valid sections are "
                          f"{sorted(sections)}", field=unknown[0])
    kwargs: dict[str, Any] = {}
    for name, value in d.items():
        if name == "kl":
            kl = {"default": asdict_section(TaskKLConfig())}
            kl = _merge(kl, _table(value, "kl", "kl.<task>.<field>=value"))
            kwargs["kl"] = {t: _coerce_section(TaskKLConfig, v, f"kl.{t}") for t, v in kl.items()}
        elif name == "rewards":
            kwargs["rewards"] = {str(t): _reward_spec(v, f"rewards.{t}")
                                 for t, v in _table(value, "rewards", 'rewards.<task>="grader:weight,..."').items()}
        elif name in DICT_SECTIONS:  # tasks.<task>, reward_models.<name>: one section per key
            kwargs[name] = {str(k): _keyed_section(name, str(k), v)
                            for k, v in _table(value, name, f"{name}.<key>.path=...").items()}
        elif name == "preset":
            kwargs["preset"] = str(value)
        else:
            cls = typing.get_type_hints(Config)[name]
            kwargs[name] = _coerce_section(cls, value, name)
    return Config(**kwargs)


def _reward_spec(value: Any, where: str) -> str:
    """A rewards.<task> entry: a "grader:weight,..." string (`rewards.qa.x=1` or a number is refused, by name)."""
    if isinstance(value, dict):
        raise ConfigError(f"unknown config field(s) {_leaves(value, where)}: `{where}` is a reward spec, not a "
                          f'section; write {where}="grader:weight,grader:weight"', field=where)
    if not isinstance(value, str):
        raise field_error(where, value, 'write "grader:weight,grader:weight", e.g. "bbq_rule:1,format:0.2"')
    return value


def asdict_section(section: Any) -> dict[str, Any]:
    return dataclasses.asdict(section)


def to_dict(cfg: Config) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def _override_tree(overrides: list[str]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is malformed: write section.field=value, e.g. rollout.k=8")
        key, value = item.split("=", 1)
        key = key.strip().replace("-", "_")
        parts = key.split(".")
        if len(parts) < 2:
            raise ConfigError(f"override {item!r}: `{key}` is not a field; write section.field=value "
                              f"(sections: {sorted(_sections())})")
        node = tree
        for depth, p in enumerate(parts[:-1]):
            node = node.setdefault(p, {})
            if not isinstance(node, dict):  # `rollout.k=3` and then `rollout.k.x=4`
                raise ConfigError(f"override {item!r}: `{key}` treats `{'.'.join(parts[:depth + 1])}` as a "
                                  "section, but it was given a value; it is a field: drop one of the two", field=key)
        if isinstance(node.get(parts[-1]), dict):  # `rollout.k.x=4` and then `rollout.k=3`
            raise ConfigError(f"override {item!r}: `{key}` was also used as a section ({key}.<field>=...); it is "
                              "one or the other: drop one of the two", field=key)
        node[parts[-1]] = value
    return tree


def load_config(preset: str | None = None, overrides: list[str] | None = None,
                file_tree: dict[str, Any] | None = None) -> Config:
    """The preset (default "demo") with a config file's tree and then `section.field=value` overrides applied,
    validated."""
    return from_dict(config_tree(preset, overrides, file_tree))


def config_tree(preset: str | None = None, overrides: list[str] | None = None,
                file_tree: dict[str, Any] | None = None) -> dict[str, Any]:
    """What `load_config` validates: the preset over the defaults, then a config file's sections (`--config FILE`),
    then the overrides, as a nested dict (for callers that add to it before the one validation, e.g.
    grpo_train.train)."""
    name = preset or "demo"
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}: choose one of {sorted(PRESETS)}")
    base = to_dict(Config())
    base["kl"] = copy.deepcopy(DEMO_KL)
    merged = _merge(base, PRESETS[name])
    if "kl" in PRESETS[name]:  # a preset's KL table replaces the demo's, it does not extend it
        merged["kl"] = copy.deepcopy(PRESETS[name]["kl"])
    merged["preset"] = name
    if file_tree:
        merged = _merge(merged, _table({k: v for k, v in file_tree.items() if k != "preset"}, "config file",
                                       "a table of sections"))
    return _merge(merged, _override_tree(overrides or []))


def dumps(cfg: Config) -> str:
    return json.dumps(to_dict(cfg), indent=2, sort_keys=False)
