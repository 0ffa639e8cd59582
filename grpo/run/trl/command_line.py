"""TRL's command line as it is: `trl grpo`'s config file and flags read by `grpo-dual` / `python grpo_train.py`.

    grpo-dual --config grpo.yaml [--learning_rate 1e-5 --use_peft ...] [--section.field VALUE ...]
    grpo-dual --model_name_or_path M --dataset_name D --reward_funcs accuracy_reward [...]

A config file holds either grpo-dual's own sections (`{"rollout": {"k": 8}}`, optionally `"preset": NAME`) or the
fields of TRL 1.16's four records that `trl grpo` reads (trl/scripts/grpo.py): GRPOScriptArguments, ModelConfig,
DatasetMixtureConfig and GRPOConfig, flat, recognised by its keys (and TrlParser's `env:` table of environment
variables, set as TRL sets them). TRL's flags are the same fields; they are read in a TRL command line: one whose
--config file holds TRL's fields, or that gives a field of GRPOScriptArguments, ModelConfig or DatasetMixtureConfig
(--model_name_or_path, --dataset_name, --reward_funcs, --use_peft, ...), which no grpo-dual command line has. Flags
are over the file (TRL's precedence); grpo-dual's own --section.field flags are over both. Elsewhere a TRL flag gets
"did you mean" its grpo-dual field (--learning_rate: --train.lr).

Each record means what it means in TRL, its defaults included: GRPOConfig whole (grpo/run/trl/config_table.py TABLE),
GRPOScriptArguments and DatasetMixtureConfig whole, ModelConfig whole when any of its fields is given (else the model
is grpo-dual's: the preset's or --model.*); their tables are grpo/run/trl/record_tables.py's, all four documented in
docs/TRL.md. A field grpo-dual cannot apply is refused by name with why; one it applies differently is named in a
printed note; a field of none of the four gets "did you mean" across TRL's names. The run starts from the preset
`custom` (your tasks only) unless --preset is given.

The entry point takes what it needs of this module through the wing's face (grpo/run/trl/__init__.py); neither it
nor the Python API (grpo/run/api.py, which takes `from_trl` from translation.py) takes anything of the tables behind
them (config_table.py, config_rules.py, record_tables.py, rows.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any, Mapping

from grpo import config as C
from grpo.config.command_line import BOOL_WORDS, FileTree, OtherFlags
from grpo.run.trl.config_table import DEFAULTS, ROWS, TABLE
from grpo.run.trl.record_tables import MIXTURE_TABLE, MODEL_TABLE, RECORDS, SCRIPT_TABLE
from grpo.run.trl.rows import apply_rows, typed_fields, user_names
from grpo.run.trl.translation import translate, trl_field_names

TRL_PRESET = "custom"
"""The preset under a TRL config file or command line (unless --preset is given): the user's own tasks, nothing
else."""

LAUNCHER = {"num_processes": "launch several processes with `accelerate launch --num_processes N grpo_train.py ...` "
                             "(docs/SCALING.md)",
            "accelerate_config": "give the accelerate config to `accelerate launch --config_file FILE grpo_train.py "
                                 "...` (docs/SCALING.md)"}
"""Keys of `trl`'s launcher (accelerate's), which TRL's documented config files may hold: refused with the fix."""

OTHER_RECORD_FIELDS = {row.trl: record for record, table in RECORDS.items() for row in table}
"""GRPOScriptArguments', ModelConfig's and DatasetMixtureConfig's fields -> their record."""

LIST_FIELDS = {"reward_funcs", "lora_target_modules", "lora_target_parameters", "lora_modules_to_save", "report_to",
               "reward_weights"}
"""The fields of the four records a flag gives as several words (`--reward_funcs a b`): TRL's list-typed ones."""
STR_FIELDS = {"dataset_name", "dataset_config", "reward_model_name_or_path", "model_name_or_path",
              "attn_implementation", "bnb_4bit_quant_storage", "output_dir", "run_name", "cache_implementation",
              "metric_for_best_model"}
"""Fields without a default whose flag value stays text (`--dataset_config 1` names configuration "1")."""
BOOL_FIELDS = {"bf16", "greater_is_better"}
"""Fields without a default that are bool (a bare `--bf16` is true)."""


def _rows() -> list:
    return [*TABLE, *(row for table in RECORDS.values() for row in table)]


def _kind_of_type(annotation: Any) -> str:
    text = str(annotation)
    if "list[" in text:
        return "list"
    return "bool" if annotation is bool or text in ("bool | None", "typing.Optional[bool]") else "value"


class FlagKinds(Mapping[str, str]):
    """Every field of the four records -> its flag's kind (command_line.OtherFlags): from the tables' defaults, and,
    asked about another name, from the installed TRL's GRPOConfig (its other fields, which must keep TRL's default;
    TRL is imported only then: a plain grpo-dual command line does not wait for it)."""

    def __init__(self) -> None:
        self.known = {row.trl: ("list" if row.trl in LIST_FIELDS else "bool" if isinstance(row.default, bool)
                                or row.trl in BOOL_FIELDS else "value") for row in _rows() if row.trl != "datasets"}
        self.theirs: dict[str, str] | None = None  # `datasets` (a list of tables) is a config file's, no flag

    def _all(self) -> dict[str, str]:
        if self.theirs is None:
            self.theirs = {}
            if trl_field_names() is not None:
                from trl import GRPOConfig

                self.theirs = {f.name: _kind_of_type(f.type) for f in dataclasses.fields(GRPOConfig) if f.init}
        return {**self.theirs, **self.known}

    def __getitem__(self, name: str) -> str:
        return self.known[name] if name in self.known else self._all()[name]

    def __contains__(self, name: object) -> bool:
        return name in self.known or name in self._all()

    def __iter__(self):
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


EQUIVALENTS = {"beta": "--kl.default.beta", "reward_model_name_or_path": "--reward_models.<name>.path"}
"""The grpo-dual flag of a TRL field whose row names a section rather than one field."""


def _first_field(row: Any) -> str:
    """The --section.field a TRL field sets (the first its row names), for "did you mean"; "" when none."""
    if row.trl in EQUIVALENTS:
        return EQUIVALENTS[row.trl]
    word = row.ours.split(",")[0].split(" ")[0].strip()
    return f"--{word}" if "." in word and "<" not in word else ""


def trl_flags() -> OtherFlags:
    """TRL's flags as the command line reads them (grpo/config/command_line.py), with what each sets (the tables'
    `ours`, GRPOConfig's then the other records', for --help)."""
    kinds = FlagKinds()
    return OtherFlags(kinds=kinds, negatable=frozenset(row.trl for row in _rows() if row.default is True),
                      equivalents={row.trl: same for row in _rows() if (same := _first_field(row))},
                      sets={row.trl: row.ours for row in _rows() if row.trl != "datasets"},
                      when="read in a TRL command line: one with --model_name_or_path, --dataset_name or "
                           "--reward_funcs, or a --config file of TRL's fields; docs/TRL.md has every rule")


def flag_value(name: str, raw: Any) -> Any:
    """A TRL flag's words as the field's value: true / false for bool fields, text for text fields, else a number,
    None (none / null), JSON ({...}, [...]) or the text."""
    if isinstance(raw, list):
        return [flag_value(name if name != "reward_weights" else "", item) for item in raw]
    if raw is True:
        return True
    text = str(raw)
    defaults = {row.trl: row.default for row in _rows()}
    if isinstance(defaults.get(name), bool) or name in BOOL_FIELDS:
        low = text.strip().lower()
        if low not in BOOL_WORDS:
            raise C.ConfigError(f"--{name} {text}: use true or false (or --{name} alone for true)", field=name)
        return low in ("1", "true", "yes", "on")
    if isinstance(defaults.get(name), str) or name in STR_FIELDS:
        return text
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    if text.strip().lower() in ("none", "null"):
        return None
    if text.strip()[:1] in "{[":
        try:
            return json.loads(text)
        except ValueError:
            pass
    return text


class RepeatedKey(ValueError):
    """A key given twice in one table of a config file (YAML and JSON parsers keep the last one silently)."""


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json.loads' object_pairs_hook: a table, or RepeatedKey for a key given twice."""
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise RepeatedKey(f"`{key}` is given twice in one table; keep one")
        seen.add(key)
    return dict(pairs)


def _yaml_tables(text: str) -> Any:
    """yaml.safe_load of `text`, a key given twice in one mapping a RepeatedKey naming both lines."""
    import yaml

    class UniqueKeys(yaml.SafeLoader):
        pass

    def mapping(loader: UniqueKeys, node: Any) -> dict:
        lines: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: its keys may be overridden on purpose
                continue
            key = loader.construct_object(key_node, deep=True)
            if key in lines:
                raise RepeatedKey(f"line {key_node.start_mark.line + 1}: `{key}` is given twice (first at line "
                                  f"{lines[key]}); keep one")
            lines[key] = key_node.start_mark.line + 1
        return loader.construct_mapping(node, deep=True)

    UniqueKeys.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    return yaml.load(text, Loader=UniqueKeys)  # noqa: S506 - a SafeLoader subclass: no Python objects are built


def read_file_tree(path: str) -> dict[str, Any]:
    """A config file (YAML or JSON) as the table it holds; ConfigError naming --config when it cannot be read, or a
    key is given twice in one table (the parsers would keep the last silently)."""
    file = Path(path)
    if file.is_dir():
        raise C.ConfigError(f"--config {path} is a folder: give the YAML or JSON config file itself (e.g. "
                            f"--config {file / 'config.yaml'})", field="config")
    if not file.is_file():
        raise C.ConfigError(f"--config {path}: no such file", field="config")
    try:
        text = file.read_text(encoding="utf-8-sig")  # -sig: a byte-order mark (Windows editors) is dropped
    except UnicodeDecodeError as err:  # a binary file, or text in another encoding
        raise C.ConfigError(f"--config {path} is not a UTF-8 text file (byte {err.start} is "
                            f"{err.object[err.start]:#04x}): give a YAML or JSON config saved as UTF-8",
                            field="config") from None
    try:
        tree = json.loads(text, object_pairs_hook=_unique_pairs) if file.suffix == ".json" else _yaml_tables(text)
    except RepeatedKey as err:
        raise C.ConfigError(f"--config {path}: {err}", field="config") from None
    except Exception as err:  # json.JSONDecodeError, yaml.YAMLError: the parser's message names the line
        raise C.ConfigError(f"--config {path} is not valid {'JSON' if file.suffix == '.json' else 'YAML'}: "
                            f"{err}", field="config") from None
    if tree is None:  # YAML reads an empty file (or one of comments only) as nothing at all
        raise C.ConfigError(f"--config {path} is empty: give a table of fields (TRL's, e.g. `model_name_or_path: "
                            "...`, or grpo-dual's sections), or leave --config out", field="config")
    if not isinstance(tree, dict):
        what = {"list": "a list", "str": "a line of text", "int": "a number", "float": "a number", "bool": "true or "
                "false"}.get(type(tree).__name__, type(tree).__name__)
        raise C.ConfigError(f"--config {path} must hold a table of fields (name: value lines), not {what}",
                            field="config")
    return tree


def looks_like_trl(tree: Mapping[str, Any]) -> bool:
    """A flat table of TRL field names rather than grpo-dual sections (its keys are not our section names)."""
    sections = {f.name for f in dataclasses.fields(C.Config)}
    return bool(tree) and not set(tree) & sections


def _not_here(flags: Mapping[str, Any], where: str) -> C.ConfigError:
    """A TRL flag where TRL's flags are not read, with "did you mean" its grpo-dual field."""
    name = sorted(flags)[0]
    same = {row.trl: _first_field(row) for row in _rows()}.get(name, "")
    guess = f" (did you mean {same}?)" if same else ""
    return C.ConfigError(f"--{name} is TRL's flag, and {where}: TRL's flags are read in a TRL command line (a --config "
                         "file of TRL's fields, or --model_name_or_path / --dataset_name / --reward_funcs ...); give "
                         f"grpo-dual's --section.field flags here{guess}", field=name)


def read_config_file(path: str, flags: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The config tree of `--config FILE` ("" for none) and TRL's flags (`flags`, as command_line.OtherFlags took
    them): a file of grpo-dual's sections as it is; TRL's fields (the file's, then the flags over them) translated
    under the preset custom. ConfigError naming the field at fault."""
    tree = read_file_tree(path) if path else {}
    given = {name: flag_value(name, raw) for name, raw in (flags or {}).items()}
    if tree and not looks_like_trl(tree):
        trl_keys = sorted(set(tree) & (set(ROWS) | set(OTHER_RECORD_FIELDS) | (trl_field_names() or set())))
        if trl_keys:  # else from_dict would call them unknown sections and guess a section name
            raise C.ConfigError(f"--config {path} mixes grpo-dual's sections with TRL's fields {trl_keys}: a file "
                                "holds one or the other (TRL's fields, then grpo-dual fields as --section.field flags)",
                                field=trl_keys[0])
        if given:
            raise _not_here(given, f"--config {path} holds grpo-dual's sections")
        return tree
    if not tree and not given:  # an empty table: nothing set
        return tree
    if not tree and not set(given) & set(OTHER_RECORD_FIELDS):
        raise _not_here(given, "this command line is grpo-dual's")
    translated = translate_command_line({**tree, **given})
    return FileTree({"preset": TRL_PRESET, **translated}, translated.origins)


def _set_environment(env: Any) -> None:
    """TrlParser's `env:` table: each variable set in this process's environment before anything runs."""
    if not isinstance(env, Mapping):
        raise C.ConfigError(f"env={env!r}: give a table of environment variables (NAME: value), as TRL reads it",
                            field="env")
    for key, value in env.items():
        os.environ[str(key)] = str(value)


def _unknown(fields: Mapping[str, Any]) -> C.ConfigError | None:
    grpo = trl_field_names()
    valid = set(ROWS) | set(OTHER_RECORD_FIELDS) | (grpo or set())
    unknown = sorted(str(k) for k in fields if k not in valid)
    if not unknown:
        return None
    launcher = [k for k in unknown if k in LAUNCHER]
    if launcher:
        return C.ConfigError(f"{launcher[0]} is the `trl` launcher's (accelerate's), not a field of TRL's records: "
                             f"{LAUNCHER[launcher[0]]}", field=launcher[0])
    why = "" if grpo is not None else " (TRL is not installed here: only docs/TRL.md's fields are known)"
    return C.ConfigError(f"TRL's records (GRPOScriptArguments, ModelConfig, DatasetMixtureConfig, GRPOConfig) have no "
                         f"field(s) {unknown}{C.did_you_mean(unknown, valid)}{why}", field=unknown[0])


def translate_command_line(fields: Mapping[str, Any]) -> FileTree:
    """TRL's fields of the four records (a `trl grpo` config file and flags, merged) as a grpo-dual config tree:
    GRPOConfig's (grpo/run/trl/translation.py: translate), then DatasetMixtureConfig's, GRPOScriptArguments' and,
    when any of its fields is given, ModelConfig's rows (grpo/run/trl/record_tables.py). Every value is checked
    against its field's type first; the tree's `origins` name the TRL field behind each grpo-dual field. Notes are
    printed to stderr."""
    fields = dict(fields)
    if "env" in fields:
        _set_environment(fields.pop("env"))
    problem = _unknown(fields)
    if problem is not None:
        raise problem
    fields = typed_fields(fields, tuple(_rows()))  # before any row reads one: `max_steps: abc` names max_steps
    grpo = {k: v for k, v in fields.items() if k not in OTHER_RECORD_FIELDS}
    done = translate(grpo)
    values = {**DEFAULTS, **{row.trl: row.default for table in RECORDS.values() for row in table}, **fields}
    tables = [MIXTURE_TABLE, SCRIPT_TABLE]
    if set(fields) & {row.trl for row in MODEL_TABLE}:  # the model named TRL's way: ModelConfig whole
        tables.append(MODEL_TABLE)
    for table in tables:
        apply_rows(table, values, done.tree, done.notes, done.origins)
    if done.weights is not None and not (values["reward_funcs"] or values["reward_model_name_or_path"]):
        raise C.ConfigError("reward_weights need the reward functions they weigh: give reward_funcs (and/or "
                            "reward_model_name_or_path), or rewards.<task>=name:weight,...", field="reward_weights")
    for text in done.notes:
        print(f"TRL config: {text}", file=sys.stderr)
    done.tree.setdefault("train", {})["trl_names"] = user_names(done.origins, done.tree, flags=True)
    return FileTree(done.tree, done.origins)
