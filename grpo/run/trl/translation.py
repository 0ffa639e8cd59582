"""A GRPOConfig (object or dict) translated: every row of TABLE (grpo/run/trl/config_table.py) applied with its
value, TRL's defaults for what a dict leaves out; a field outside TABLE set to something but TRL's default refused
by name. `from_trl` is the Python API's (`train(args=...)`); TRL's command line reads its four records through
grpo/run/trl/command_line.py, which translates GRPOConfig's fields here.
"""

from __future__ import annotations

import dataclasses
import sys
import warnings
from typing import Any, Mapping

from grpo import config as C
from grpo.run.trl.config_table import DEFAULTS, INSTEAD, ROWS, TABLE
from grpo.run.trl.rows import _set, apply_rows, typed_fields, user_names


@dataclasses.dataclass
class Translation:
    tree: dict[str, Any]
    """The grpo-dual config tree every field of TABLE sets."""
    weights: list[float] | None
    """reward_weights, or None."""
    notes: list[str]
    """Values applied differently from TRL, each with what grpo-dual does (printed by the caller)."""
    origins: dict[str, tuple[str, Any, bool]] = dataclasses.field(default_factory=dict)
    """Each grpo-dual field of `tree` -> (the TRL field it came from, that field's value, whether it holds the value
    as it is): a rule the grpo-dual field breaks is reported under the TRL field (grpo/run/trl/rows.py: apply_rows)."""


def trl_field_names() -> set[str] | None:
    """Every GRPOConfig field of the installed TRL, or None when TRL is not installed."""
    try:
        from trl import GRPOConfig
    except ImportError:
        return None
    return {f.name for f in dataclasses.fields(GRPOConfig) if f.init}


def _field_default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _rebuilt(args: Any, names: set[str]) -> Any:
    """A GRPOConfig of args' class from args' values of `names` alone (None when it cannot be built here)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return type(args)(**{name: getattr(args, name) for name in names})
    except Exception:  # e.g. a precision this machine cannot check: compare with the dataclass defaults instead
        return None


def all_fields(args: Any) -> tuple[dict[str, Any], list[str]]:
    """(every TABLE field's value, the other fields set to something but TRL's default). An object gives its
    values; a dict its keys over DEFAULTS. An unknown key of a dict is a ConfigError with a "did you mean"."""
    if isinstance(args, Mapping):
        known = trl_field_names()
        valid = set(ROWS) | (known or set())
        unknown = sorted(str(k) for k in args if k not in valid)
        if unknown:
            why = "" if known is not None else " (TRL is not installed here: only docs/TRL.md's fields are known)"
            raise C.ConfigError(f"GRPOConfig has no field(s) {unknown}{C.did_you_mean(unknown, valid)}{why}",
                                field=unknown[0])
        defaults = {}
        if known is not None:
            from trl import GRPOConfig

            defaults = {f.name: _field_default(f) for f in dataclasses.fields(GRPOConfig) if f.init}
        others = sorted(k for k in args if k not in ROWS and args[k] != defaults.get(k))
        return {**DEFAULTS, **args}, others
    if not dataclasses.is_dataclass(args):
        raise C.ConfigError(f"a TRL config is a GRPOConfig or a dict of its fields; got {type(args).__name__}",
                            field="args")
    fields = [f for f in dataclasses.fields(args) if f.init]
    mine = {f.name for f in fields} & set(ROWS)
    # what TRL derives from TABLE's fields does not count as set (the generation batch is derived from the others)
    reference = _rebuilt(args, mine - {"generation_batch_size", "steps_per_generation"})
    others = sorted(f.name for f in fields if f.name not in ROWS and getattr(args, f.name) != (
        getattr(reference, f.name) if reference is not None else _field_default(f)))
    values = {name: getattr(args, name) for name in mine}
    if values.get("bf16") == (not values.get("fp16")):  # what TRL's __post_init__ derives from bf16 left unset
        values["bf16"] = None
    values["world_size"] = getattr(args, "world_size", 1)
    return {**DEFAULTS, **values}, others


def translate(args: Any) -> Translation:
    """A GRPOConfig (object or dict) as a grpo-dual config tree: every TABLE row applied (TRL's defaults for what a
    dict leaves out). Raises ConfigError naming a field outside TABLE that is set, or a value a row refuses."""
    fields, others = all_fields(args)
    instead = [name for name in others if name in INSTEAD]
    if instead:
        raise C.ConfigError(f"GRPOConfig.{instead[0]}={fields.get(instead[0], getattr(args, instead[0], None))!r}: "
                            f"{INSTEAD[instead[0]]}", field=instead[0])
    if others:
        raise C.ConfigError(f"GRPOConfig fields grpo-dual cannot honour: {others} (docs/TRL.md lists what it "
                            f"translates); leave them at TRL's defaults", field=others[0])
    fields = typed_fields(fields, TABLE)  # every value of the type TRL gives it, before any converter reads it
    out: dict[str, Any] = {}
    notes: list[str] = []
    origins: dict[str, tuple[str, Any, bool]] = {}
    apply_rows(TABLE, fields, out, notes, origins)
    _set(out, "data.prompt_format", "trl")  # string prompts as they are, messages through the chat template
    _set(out, "data.heldout_fraction", 0.0)  # TRL trains every row; it evaluates only an eval split it is given
    weights = fields.get("reward_weights")
    return Translation(out, None if weights is None else [float(w) for w in weights], notes, origins)


def from_trl(args: Any) -> tuple[dict[str, Any], list[float] | None]:
    """(grpo-dual config tree, reward_weights or None) of a GRPOConfig, with train.trl_names (its field names: the
    run's advice names them); its notes are printed to stderr."""
    done = translate(args)
    for text in done.notes:
        print(f"TRL config: {text}", file=sys.stderr)
    _set(done.tree, "train.trl_names", user_names(done.origins, done.tree, flags=False))
    return done.tree, done.weights
