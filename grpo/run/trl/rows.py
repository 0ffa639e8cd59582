"""TRL's records, row by row: the machinery every table shares. A Row is one TRL field, the grpo-dual field(s) it
sets and its rule; the converters' helpers (`_only`, `_noted`, `_part_of`, `error`, `note`), the type check of a
field's value (`typed`), a table applied to a config tree (`apply_rows`) and the translation's origins as the user's
names (`user_names`, train.trl_names).

The tables are GRPOConfig's (grpo/run/trl/config_table.py TABLE) and the three other records `trl grpo` reads
(grpo/run/trl/record_tables.py RECORDS); docs/TRL.md shows all four (`python -m grpo.run.trl.docs > docs/TRL.md`). A
converter gets (the field's value, every field's value of the four records, the grpo-dual config tree being built,
the notes) and sets what the field means, refuses a value by name with why (ConfigError), or names in a note what it
applies differently. The command line that reads them is grpo/run/trl/command_line.py.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Any, Callable, Iterator, Mapping

from grpo import config as C

Converter = Callable[[Any, Mapping[str, Any], dict, list], None]
"""(the field's value, every TRL field's value, the grpo-dual config tree being built, notes) -> None."""


@dataclasses.dataclass(frozen=True)
class Row:
    trl: str
    """The TRL field."""
    ours: str
    """The grpo-dual field(s) it sets ("" when none)."""
    default: Any
    """TRL 1.16's default (before the record's __post_init__ resolves it)."""
    rule: str
    """What the field means here: the documentation."""
    convert: Converter | None = None
    """None: the value is copied into `ours` unchanged."""
    copies: str = ""
    """The grpo-dual field that holds this value as it is, when a converter writes it (`ours` for a row without one):
    a rule of that field that the value breaks is reported under this TRL field's name."""

    @property
    def copied_into(self) -> str:
        return self.copies or (self.ours if self.convert is None else "")


TEXT_OR_LIST = "a name or a list of names"
"""The type of the fields TRL takes as one word or several (reward_funcs, lora_target_modules)."""
NUMBERS = "a list of numbers"
"""The type of reward_weights."""
NOT_EMPTY = {"output_dir": "an empty folder name: name the folder the run writes into, or leave it unset (TRL's "
                           "default: trainer_output)",
             "metric_for_best_model": "an empty metric name: use reward (the mean held-out reward), or leave it "
                                      "unset"}
"""TRL fields whose empty text would be read as unset (TRL's default) without a word: refused, with the fix."""
FIELD_TYPES: dict[str, Any] = {
    **dict.fromkeys(("steps_per_generation", "generation_batch_size", "max_tool_calling_iterations", "top_k",
                     "save_total_limit", "num_completions_to_print", "num_generations_eval"), int | None),
    **dict.fromkeys(("epsilon_high", "min_p", "eval_steps", "test_split_size"), float | None),
    **dict.fromkeys(("warmup_steps", "logging_steps", "save_steps"), float),
    **dict.fromkeys(("cache_implementation", "output_dir", "run_name", "dataset_name", "dataset_config",
                     "reward_model_name_or_path", "model_name_or_path", "attn_implementation", "bnb_4bit_quant_storage",
                     "dtype"), str | None),
    "bf16": bool | None,
    "greater_is_better": bool | None,
    "metric_for_best_model": str | None,
    **dict.fromkeys(("reward_funcs", "lora_target_modules"), TEXT_OR_LIST),
    "reward_weights": NUMBERS,
    # checked by their rows' converters (tables, a list of tables, a word or a list, text or true / false, unset-only)
    **dict.fromkeys(("lr_scheduler_kwargs", "generation_kwargs", "chat_template_kwargs", "model_init_kwargs",
                     "report_to", "scale_rewards", "datasets", "delta", "lora_target_parameters",
                     "lora_modules_to_save"), Any),
}
"""TRL 1.16's type of each field whose default does not tell it (None, or an int where TRL takes a float); every
other field has its default's type."""


def field_type(row: Row) -> Any:
    """The type a value of `row`'s field must have (FIELD_TYPES, else its default's)."""
    return FIELD_TYPES.get(row.trl, type(row.default))


def typed(name: str, value: Any, kind: Any) -> Any:
    """`value` of TRL field `name` as `kind` by the config's own rules (C.coerce_value: a number from its text, true /
    false and nothing else for a bool, no float where an int is meant), or a ConfigError naming the field; checked
    before any converter reads it."""
    if kind is Any or value is None and kind not in (int, float, bool, str):
        return value
    if name in NOT_EMPTY and isinstance(value, str) and not value.strip():  # else read as unset: TRL's default
        raise C.field_error(name, value, NOT_EMPTY[name])
    if kind is TEXT_OR_LIST:
        if isinstance(value, str) or (isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)):
            return value if isinstance(value, str) else list(value)
        raise C.field_error(name, value, f"expected {TEXT_OR_LIST}")
    if kind is NUMBERS:
        if not isinstance(value, (list, tuple)):
            raise C.field_error(name, value, "expected a list of numbers, one weight per reward function")
        return [C.coerce_value(v, float, name) for v in value]
    if kind in (bool, bool | None) and type(value) is int and value in (0, 1):  # as the flag's 1 / 0: one rule
        return bool(value)
    if kind in (str, str | None) and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)  # `run_name: 2024` in a YAML file is a name
    return C.coerce_value(value, kind, name)


def typed_fields(fields: Mapping[str, Any], rows: tuple[Row, ...]) -> dict[str, Any]:
    """`fields` with the value of every field of `rows` in it `typed`."""
    kinds = {row.trl: field_type(row) for row in rows}
    return {name: typed(name, value, kinds[name]) if name in kinds else value for name, value in fields.items()}


def leaves(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """The dotted names of a nested tree's values, with the values."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        out.update(leaves(value, f"{dotted}.") if isinstance(value, Mapping) and value else {dotted: value})
    return out


def apply_rows(rows: tuple[Row, ...], values: Mapping[str, Any], out: dict, notes: list,
               origins: dict[str, tuple[str, Any, bool]]) -> None:
    """Every row of `rows` applied to `out`; `origins` gets, for each grpo-dual field written, the TRL field it came
    from, its value and whether the field holds it as it is (Row.copied_into): a rule that grpo-dual field breaks is
    then reported under the TRL field the user wrote (grpo/config/command_line.py: `blamed`)."""
    for row in rows:
        before = leaves(out)
        if row.convert is not None:
            row.convert(values[row.trl], values, out, notes)
        else:
            _set(out, row.ours, values[row.trl])
        for dotted, value in leaves(out).items():
            if dotted not in before or before[dotted] != value:
                origins[dotted] = (row.trl, values[row.trl], False)
    written = leaves(out)
    for row in rows:
        if row.copied_into in written:
            origins[row.copied_into] = (row.trl, values[row.trl], True)


def user_names(origins: Mapping[str, tuple[str, Any, bool]], tree: Mapping[str, Any], flags: bool) -> dict[str, str]:
    """train.trl_names of a translation (grpo/run/trl/vocabulary.py): each grpo-dual field of `tree` that holds its TRL
    field's value as it is (max_steps under num_iterations=1, not under 2) -> that TRL field, as a flag (`flags`:
    `--num_generations`, a command line or file) or a field name (a GRPOConfig). A field a converter derives
    (train.prompts_per_micro_step from per_device_train_batch_size) is left out: a value of ours would be no value of
    theirs."""
    written = leaves(tree)
    return {dotted: f"--{trl}" if flags else trl for dotted, (trl, value, _) in origins.items()
            if dotted in written and _same(written[dotted], value)}


def _same(ours: Any, theirs: Any) -> bool:
    """A translated value that is the TRL value as it is (numbers by value, 2 == 2.0; a bool only as a bool)."""
    if isinstance(ours, bool) or isinstance(theirs, bool):
        return ours is theirs
    if isinstance(ours, (int, float)) and isinstance(theirs, (int, float)):
        return float(ours) == float(theirs)
    return ours == theirs


def _set(out: dict[str, Any], dotted: str, value: Any) -> None:
    *sections, name = dotted.split(".")
    node = out
    for part in sections:
        node = node.setdefault(part, {})
    node[name] = value


def _name(value: Any) -> Any:
    """An enum's value (transformers' SchedulerType, IntervalStrategy, OptimizerNames), else the value."""
    return getattr(value, "value", value)


def error(record: str, field: str, value: Any, fix: str) -> C.ConfigError:
    """The ConfigError of a TRL field: `Record.field=value: fix`, its `field` the TRL field."""
    return C.ConfigError(f"{record}.{field}={_name(value)!r}: {fix}", field=field)


def note(notes: list, record: str, field: str, value: Any, what: str) -> None:
    notes.append(f"{record}.{field}={_name(value)!r}: {what}")


def _only(allowed: Any, instead: str) -> Converter:
    """A field whose other values grpo-dual cannot honour: refused, saying what grpo-dual does."""
    def convert(value: Any, fields: Mapping[str, Any], out: dict, notes: list) -> None:
        if _name(value) not in (allowed if isinstance(allowed, tuple) else (allowed,)):
            raise error(convert.record, convert.field, value, f"grpo-dual cannot honour it: {instead}")
    convert.instead = f"another value is refused: {instead}"  # the docs' rule text
    return convert


def _noted(instead: str) -> Converter:
    """A field grpo-dual does not apply: a value other than TRL's default is named in a note with what it does."""
    def convert(value: Any, fields: Mapping[str, Any], out: dict, notes: list) -> None:
        if value != convert.default:
            note(notes, convert.record, convert.field, value, f"not applied: {instead}")
    convert.instead = f"not applied: {instead}"  # the docs' rule text
    return convert


def _part_of(field: str) -> Converter:
    """Read by `field`'s row."""
    return lambda value, fields, out, notes: None


def bind(table: tuple[Row, ...], record: str) -> None:
    """Give each converter of `table` its field, record and default (the rules that name them)."""
    for row in table:
        if row.convert is not None:
            for attr, value in (("field", row.trl), ("default", row.default), ("record", record)):
                try:
                    setattr(row.convert, attr, value)
                except AttributeError:
                    pass


ESTIMATING: contextvars.ContextVar[bool] = contextvars.ContextVar("estimating", default=False)
"""True while a TRL command line is translated for the GPU-memory estimate (grpo/run/assembly/gpu_memory_check.py): the
run it describes is on a GPU whatever this machine has, and its dataset and model are not read (the estimate needs their
shapes, not their rows; a Hub id's shape comes from the bundled table)."""


@contextlib.contextmanager
def estimating() -> Iterator[None]:
    """Translate as for the GPU-memory estimate (ESTIMATING) inside the block."""
    token = ESTIMATING.set(True)
    try:
        yield
    finally:
        ESTIMATING.reset(token)


def on_cpu(fields: Mapping[str, Any]) -> bool:
    """Whether the run will be on the CPU: GRPOConfig.use_cpu, or no CUDA device here (a GPU, for an estimate)."""
    import torch

    return bool(fields["use_cpu"]) or (not ESTIMATING.get() and not torch.cuda.is_available())
