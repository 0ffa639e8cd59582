"""The command line of the entry points: `--section.field VALUE` flags into config overrides, and the `--help` text.

    --rollout.k 8 | --rollout.k=8 | --set rollout.k=8        -> "rollout.k=8"
    --seed 3 (a shortcut, ALIASES)                            -> "train.seed=3"
    --learning_rate 1e-5, --use_peft, --reward_funcs a b      -> another program's flags (`OtherFlags`: TRL's `trl grpo`
                                                                 flags, which the run layer translates), when given
    anything else (--preset, --print-config, --help-all, ...) -> left for the entry point's own argparse parser

Standard library only; the schema and its validation are grpo/config/sections.py's (and its parts'), `load_config`
grpo/config/building.py's, the presets grpo/config/presets.py's.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import inspect
import re
import sys
import textwrap
import typing
from itertools import pairwise
from pathlib import Path
from typing import Any, Callable, Mapping

from grpo import config as C
from grpo.config.presets import PRESETS

ALIASES = {"model": "model.name", "data-dir": "data.data_dir", "max-steps": "train.max_steps",
           "seed": "train.seed", "output-dir": "train.output_dir", "run-name": "train.run_name",
           "resume": "checkpoint.resume", "device": "train.device"}
"""Short command-line flags users know, mapped to dotted fields."""


def command_typed(argv0: str | None = None) -> str:
    """The command as the user typed it, for messages: `grpo-dual` (the installed command) or `python grpo_train.py`
    (sys.argv[0] unless `argv0` is given)."""
    name = Path(sys.argv[0] if argv0 is None else argv0).name or "grpo_train.py"
    return f"python {name}" if name.endswith(".py") else name


@dataclasses.dataclass(frozen=True)
class OtherFlags:
    """Another program's flags an entry point reads besides its own: TRL's `trl grpo` flags (the run layer builds it,
    grpo/run/trl/command_line.py, and translates what they set). The words are only taken apart here."""

    kinds: Mapping[str, str]
    """flag name (without --) -> "bool" (a bare flag is true, or one of true/false follows), "list" (the words up to
    the next flag) or "value" (one word)."""
    negatable: frozenset[str]
    """Bool flags that `--no_NAME` sets false (their default is true, as transformers' HfArgumentParser adds them)."""
    equivalents: Mapping[str, str]
    """flag name -> the --section.field that means the same here (for "did you mean" where the flags are not read)."""
    owner: str = "TRL"
    """Whose flags they are, for messages."""
    sets: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """flag name -> the grpo-dual field(s) it sets ("" for none: it is refused unless left at its default, or named
    in a note), for --help; in the order the help lists them."""
    when: str = ""
    """When these flags are read, for --help."""

    def take(self, words: list[str], own: set[str] = frozenset()) -> tuple[dict[str, Any], list[str]]:
        """(the flags' values: a string, a list of strings or True, the words left). `own`: the entry point's own
        flag names, never taken. A value flag without a value is a ConfigError naming it."""
        taken: dict[str, Any] = {}
        rest: list[str] = []
        i = 0
        while i < len(words):
            word = words[i]
            name, eq, inline = word[2:].partition("=") if word.startswith("--") else ("", "", "")
            negated = name.startswith("no_") and name[3:] in self.negatable and not eq
            if not name or name in own or (name not in self.kinds and not negated):
                rest.append(word)
                i += 1
                continue
            if negated:
                if name[3:] in taken:
                    raise repeated_flag(name[3:], taken[name[3:]], "false", "bool")
                taken[name[3:]] = "false"
                i += 1
                continue
            kind, after = self.kinds[name], []
            j = i + 1
            while not eq and j < len(words) and not looks_like_flag(words[j]) and (kind == "list" or not after):
                after.append(words[j])
                j += 1
            if eq:
                after = [inline]
            if kind == "bool" and after and after[0].strip().lower() not in BOOL_WORDS:  # as TRL's parser refuses it
                raise C.ConfigError(f"--{name} {after[0]}: use true or false (or --{name} alone for true)", field=name)
            if not after and kind != "bool":
                where = "it ends the command line" if j >= len(words) else f"the flag {words[j]} follows it"
                raise C.ConfigError(f"--{name} has no value: {where}; write --{name} VALUE", field=name)
            value = after if kind == "list" else (after[0] if after else True)
            if name in taken:  # argparse would keep the last silently
                raise repeated_flag(name, taken[name], value, kind)
            taken[name] = value
            i = j
        return taken, rest

    def hint(self, name: str) -> str | None:
        """The closest of these flags to `name` (a typo), or None."""
        match = difflib.get_close_matches(name, sorted(self.kinds), n=1, cutoff=0.75)
        return match[0] if match else None


BOOL_WORDS = ("1", "0", "true", "false", "yes", "no", "on", "off")
"""The values a bool flag takes (parse_value's)."""


def _words(value: Any) -> str:
    return " ".join(value) if isinstance(value, list) else "(alone)" if value is True else str(value)


def repeated_flag(name: str, first: Any, then: Any, kind: str) -> C.ConfigError:
    """A flag of another program given twice: refused, both values named (its parser would keep the last)."""
    more = f"; a list flag takes several words: --{name} {_words(first)} {_words(then)}" if kind == "list" else ""
    return C.ConfigError(f"--{name} is given twice ({_words(first)}, then {_words(then)}): give it once{more}",
                         field=name)


def repeated_note(argv: list[str]) -> str | None:
    """One line naming each config field a command line sets more than once (--rollout.k 4 ... --rollout.k 8, or
    --max-steps and --train.max_steps) and the value that applies (the last, as in every override); else None."""
    overrides, _ = split_argv(argv)
    values: dict[str, list[str]] = {}
    for item in overrides:
        key, _, value = item.partition("=")
        values.setdefault(key, []).append(value)
    repeats = [f"{key} ({', '.join(v)}: {v[-1]} applies)" for key, v in values.items() if len(v) > 1]
    return (f"note: set more than once on the command line, the last value applies: {'; '.join(repeats)}"
            if repeats else None)


class FileTree(dict):
    """A config tree read from a config file or another program's flags (`read_file`'s), with `origins`: each dotted
    field it sets that came from another program's field -> (that field, its value, whether the dotted field holds the
    value as it is). A rule a field breaks is then reported under the name the user wrote (`blamed`)."""

    def __init__(self, tree: Mapping[str, Any] = (), origins: Mapping[str, tuple[str, Any, bool]] | None = None):
        super().__init__(tree)
        self.origins = dict(origins or {})


def blamed(err: C.ConfigError, overrides: list[str], origins: Mapping[str, tuple[str, Any, bool]]) -> C.ConfigError:
    """`err` about the field the user set. A field given by a --section.field flag is named as it is; a rule
    between it and a field the file or preset set (`rollout.max_trajectory_tokens` under `--rollout.max_new_tokens`)
    names the flag's field; a field another program's field set (`origins`: TRL's max_completion_length sets
    rollout.max_new_tokens) is named as that field."""
    field = err.field or ""
    given = dict(o.split("=", 1) for o in overrides if "=" in o)
    if not field or field in given:
        return err
    origin = origins.get(field)
    whence = f"TRL's {origin[0]}={origin[1]!r}" if origin else "the config file or preset"
    section = field.rpartition(".")[0]
    for dotted, text in given.items():  # the rule names the other field as `name=value`: that one was given
        if dotted.rpartition(".")[0] == section and re.search(rf"(?<![\w.]){re.escape(dotted.rpartition('.')[2])}=",
                                                               str(err)):
            instead = f", or set {origin[0]} instead" if origin else f", or set {field} too"
            return C.ConfigError(f"config field `{dotted}` = {text!r} is invalid: it breaks the rule of `{field}` "
                                 f"(from {whence}): {err.fix or err}; change --{dotted}{instead}", field=dotted)
    if origin is None:
        return err
    name, value, direct = origin
    if direct and err.fix:
        return C.ConfigError(f"config field `{name}` = {value!r} is invalid: {err.fix} (TRL's {name} is "
                             f"grpo-dual's {field})", field=name, fix=err.fix)
    return C.ConfigError(f"{err} ({field} comes from TRL's {name}={value!r})", field=name)


def unknown_flags(unknown: list[str], parser: argparse.ArgumentParser,
                  other: OtherFlags | None = None) -> C.ConfigError:
    """A ConfigError naming the command-line words no parser took, with a "did you mean" among the flags (the
    entry point's, the shortcuts, every --section.field, and `other`'s: `--lerning_rate` -> `--learning_rate`) and
    the command that was typed."""
    flags = [a.split("=", 1)[0][2:] for a in unknown if a.startswith("--")]
    sections = {name: hint for name, hint in typing.get_type_hints(C.Config).items() if dataclasses.is_dataclass(hint)}
    valid = sorted({o[2:] for action in parser._actions for o in action.option_strings if o.startswith("--")}
                   | set(ALIASES) | {f"{s}.{f.name}" for s, cls in sections.items() for f in dataclasses.fields(cls)})
    guesses = []
    for flag in flags:
        theirs = other.hint(flag) if other is not None and "." not in flag else None
        ours = difflib.get_close_matches(flag, valid, n=1, cutoff=0.6)
        if theirs and (not ours or difflib.SequenceMatcher(None, flag, theirs).ratio()
                       >= difflib.SequenceMatcher(None, flag, ours[0]).ratio()):
            same = other.equivalents.get(theirs)
            guesses.append(f"--{theirs} ({other.owner}'s" + (f"; grpo-dual's {same})" if same else ")"))
        elif ours:
            guesses.append(f"--{ours[0]}")
    hint = f" (did you mean {', '.join(guesses)}?)" if guesses else ""
    return C.ConfigError(f"unrecognized argument(s) {' '.join(unknown)}{hint}: `{command_typed()} --help` lists the "
                         "flags, `--help-all` every config field", field=flags[0] if flags else None)


def other_names_hint(err: C.ConfigError, other: OtherFlags | None) -> C.ConfigError:
    """`--train.lerning_rate`: an unknown field of a section whose name is close to one of `other`'s flags that
    means a grpo-dual field: the error with "did you mean `train.lr`?" (its message had no guess of its own)."""
    dotted = err.field or ""
    if (other is None or "did you mean" in str(err) or not str(err).startswith("unknown config field") or
            dotted.count(".") != 1):
        return err
    theirs = other.hint(dotted.split(".", 1)[1])
    same = other.equivalents.get(theirs or "")
    if not same:
        return err
    return C.ConfigError(f"{err} (did you mean `{same.removeprefix('--')}`? {other.owner}'s {theirs} is {same} here)",
                         field=err.field)


SMOKE_TEST_STEPS = 5
"""A command line's --max-steps at or below this is a smoke test: `smoke_test_note` says what still runs in full."""


def smoke_test_note(argv: list[str], cfg: C.Config) -> str | None:
    """When the command line asks for a smoke test (--max-steps / --train.max_steps <= SMOKE_TEST_STEPS) and the SFT
    warm-up or the held-out evaluations are longer than the RL it asks for: one line saying so and how to shorten
    them (they are not scaled behind the user's back: the preset chose them). Else None."""
    overrides, _ = split_argv(argv)
    if not any(o.split("=", 1)[0] == "train.max_steps" for o in overrides) or cfg.train.max_steps > SMOKE_TEST_STEPS:
        return None
    n, warm_up, eval_size = cfg.train.max_steps, cfg.sft.steps, cfg.data.eval_size
    if warm_up <= n and eval_size <= cfg.prompts_per_step:
        return None
    return (f"--max-steps {n} runs {n} RL step(s), but the SFT warm-up ({warm_up} steps) and the held-out evaluations "
            f"({eval_size} prompts a task, before and after the warm-up and after RL) run in full; for a smoke test "
            f"shorten them too: --sft.steps {min(warm_up, n)} --data.eval_size {min(eval_size, cfg.prompts_per_step)}")


def _dotted(item: str) -> str:
    """"seed=3" -> "train.seed=3"; anything that is not a shortcut is returned as it is."""
    key, eq, value = item.partition("=")
    return f"{ALIASES.get(key.strip(), key.strip())}{eq}{value}" if eq else item


def looks_like_flag(arg: str) -> bool:
    """`--name...`: what the next flag looks like. A value that starts so (`--rollout.k --max-steps 5` took
    `--max-steps` as k's value) must be given as `--field=value`."""
    return arg.startswith("--") and arg[2:3].isalpha()


def _value_after(argv: list[str], i: int, field: str | None) -> str:
    """The value of the flag argv[i], which sets `field` (None: --set); a ConfigError naming the field when the
    flag has no value: it ends the command line, or the next flag follows it."""
    flag = argv[i]
    if i + 1 < len(argv) and not looks_like_flag(argv[i + 1]):
        return argv[i + 1]
    what = f"config field `{field}` has no value" if field else f"{flag} has no section.field=value"
    after = f"{flag} is followed by the flag {argv[i + 1]}" if i + 1 < len(argv) else f"{flag} ends the command line"
    how = (f"write {flag} VALUE (a value that starts with -- as {flag}=VALUE)" if field
           else f"write {flag} section.field=value")
    raise C.ConfigError(f"{what}: {after}; {how}", field=field)


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """Turn `--section.field value`, `--section.field=value`, `--set k=v` and the ALIASES shortcuts into
    `section.field=value` overrides (for config.load_config).

    Returns (overrides, rest) where rest holds the flags the entry point handles itself. A flag that sets a field
    and is followed by another flag instead of its value, or a bare `--section`, is a ConfigError naming the field.
    """
    sections = {f.name for f in dataclasses.fields(C.Config)} - {"preset"}
    overrides, rest = [], []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--set":
            overrides.append(_dotted(_value_after(argv, i, None)))
            i += 2
            continue
        if arg.startswith("--") and len(arg) > 2:
            body = arg[2:]
            key = body.split("=", 1)[0]
            if key in sections and key not in ALIASES:  # `--rollout 8`: a section has no value of its own
                raise C.ConfigError(f"`{key}` is a config section, not a field: write --{key}.<field> VALUE "
                                    f"({command_typed()} --help-all lists the fields)", field=key)
            if "." in key or key in ALIASES:
                if "=" in body:
                    overrides.append(_dotted(body))
                    i += 1
                else:
                    field = ALIASES.get(key, key)
                    overrides.append(_dotted(f"{key}={_value_after(argv, i, field)}"))
                    i += 2
                continue
        rest.append(arg)
        i += 1
    return overrides, rest


DEFAULT_PRESET = "demo"
"""The preset of a command line without --preset (config.load_config's default)."""


def describe_fields(preset: str = DEFAULT_PRESET) -> str:
    """Every field with its type, its value under `preset` (what a run gets without an override; "set by preset X"
    where the preset changes the dataclass default) and its docstring (read from the source of the module that defines
    each section class: grpo/config/sections.py, input_sections.py, algorithm_sections.py), for --help.
    Per-task sections: the generic `kl.<task>` fields with the preset's kl.default values, then the preset's own
    `kl.<task>` and `rewards.<task>` entries. Raises ConfigError for an unknown preset."""
    docs: dict[str, dict[str, str]] = {}
    classes = [C.Config, *(h for h in typing.get_type_hints(C.Config).values() if dataclasses.is_dataclass(h)),
               C.TaskKLConfig, *C.DICT_SECTIONS.values()]
    modules = dict.fromkeys(inspect.getmodule(cls) for cls in classes)  # each parsed once
    for node in (n for module in modules for n in ast.parse(inspect.getsource(module)).body):
        if isinstance(node, ast.ClassDef):
            body = node.body
            for a, b in pairwise(body):
                if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant):
                    docs.setdefault(node.name, {})[a.target.id] = " ".join(str(b.value.value).split())
    lines = []
    cfg, plain = C.load_config(preset), C.Config()

    def value(now: Any, dataclass_default: Any) -> str:
        return f"default {now!r}" + (f", set by preset {preset}" if now != dataclass_default else "")

    for sname in (f.name for f in dataclasses.fields(C.Config)):
        if sname == "preset":
            continue
        if sname in ("kl", "rewards", *C.DICT_SECTIONS):
            key = "<name>" if sname == "reward_models" else "<task>"
            lines.append(f"\n[{sname}.{key}]  {docs['Config'].get(sname, '')}")
            if sname == "kl":  # a task without its own entry gets kl.default
                for fname, ftype in typing.get_type_hints(C.TaskKLConfig).items():
                    lines.append(f"  --{sname}.<task>.{fname} ({_tname(ftype)}, "
                                 f"{value(getattr(cfg.kl['default'], fname), getattr(C.TaskKLConfig(), fname))}): "
                                 f"{docs['TaskKLConfig'].get(fname, '')}")
                for task, section in cfg.kl.items():
                    changed = [f"{f.name}={getattr(section, f.name)!r}" for f in dataclasses.fields(section)
                               if getattr(section, f.name) != getattr(C.TaskKLConfig(), f.name)]
                    lines.append(f"  preset {preset} sets kl.{task}: {', '.join(changed) or 'the defaults above'}")
            elif sname == "rewards":
                lines += [f"  preset {preset} sets rewards.{task} = {spec!r}" for task, spec in cfg.rewards.items()]
                # the command line imports no grpo module (docs/DESIGN.md): grpo_train adds the built-in graders
                lines.append("  a grader is a built-in name (listed at the end of grpo_train.py --help-all), "
                             "llm_judge, a "
                             "reward_models name, package.module:function or path/to/file.py:function")
            else:
                cls = C.DICT_SECTIONS[sname]
                for fname, ftype in typing.get_type_hints(cls).items():
                    lines.append(f"  --{sname}.{key}.{fname} ({_tname(ftype)}, default {getattr(cls(), fname)!r}): "
                                 f"{docs[cls.__name__].get(fname, '')}")
                lines += [f"  preset {preset} sets {sname}.{k}" for k in getattr(cfg, sname)]
            continue
        section = getattr(cfg, sname)
        lines.append(f"\n[{sname}]")
        for fname, ftype in typing.get_type_hints(type(section)).items():
            lines.append(f"  --{sname}.{fname} ({_tname(ftype)}, "
                         f"{value(getattr(section, fname), getattr(getattr(plain, sname), fname))}): "
                         f"{docs.get(type(section).__name__, {}).get(fname, '')}")
    return "\n".join(lines)


def _tname(t: Any) -> str:
    return getattr(t, "__name__", None) or str(t).replace("typing.", "")


def preset_in(argv: list[str]) -> str:
    """The --preset NAME (or --preset=NAME) of a command line, else DEFAULT_PRESET: --help describes that preset."""
    finder = argparse.ArgumentParser(add_help=False)
    finder.add_argument("--preset", default=DEFAULT_PRESET)
    return finder.parse_known_args(argv)[0].preset


def wrapped(text: str, width: int) -> str:
    """`text` laid out within `width` columns, at word boundaries (a longer word broken): --help fits the terminal.
    Consecutive unindented lines are a paragraph, filled as one; an indented line (a command, a field) is wrapped
    alone, its continuation lines indented 4 more than it; blank lines stay."""
    out: list[str] = []
    prose: list[str] = []

    def fill(lines: list[str], indent: str = "") -> None:
        out.extend(textwrap.wrap(" ".join(lines), width, subsequent_indent=indent, break_on_hyphens=False))

    for line in text.splitlines():
        if line and not line[0].isspace():
            prose.append(line)
            continue
        if prose:
            fill(prose)
            prose = []
        if len(line) <= width:
            out.append(line)
        else:
            indent = " " * min(len(line) - len(line.lstrip()) + 4, width // 2)
            out.extend(textwrap.wrap(line, width, subsequent_indent=indent, break_on_hyphens=False))
    if prose:
        fill(prose)
    return "\n".join(out)


class WrappedHelp(argparse.RawDescriptionHelpFormatter):
    """argparse's formatter with the description and the epilog laid out as written, each line wrapped to the
    terminal's width (COLUMNS, as argparse reads it) instead of running past it."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "\n".join(indent + line for line in wrapped(text, max(width, 20)).splitlines())


class HelpAll(argparse.Action):
    """--help-all: the help with every config field, the losses and the graders (`text`: that epilog, built when
    asked), then exit."""

    def __init__(self, option_strings: list[str], dest: str, text: Callable[[], str], **kwargs: Any):
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, **kwargs)
        self.text = text

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        parser.epilog = self.text()
        parser.print_help()
        parser.exit()


def other_flags_help(other: OtherFlags) -> str:
    """--help's section on another program's flags (TRL's): when they are read, then one line per flag, `--flag
    -> what it sets`, and the flags that set nothing here."""
    setting = {flag: ours for flag, ours in other.sets.items() if ours}
    nothing = [f"--{flag}" for flag, ours in other.sets.items() if not ours]
    column = max(map(len, setting), default=0) + 2
    return (f"\n\n{other.owner}'s flags, each with what it sets here ({other.when}):\n"
            + "\n".join(f"  {'--' + flag:<{column}} -> {ours}" for flag, ours in setting.items())
            + (f"\n{other.owner}'s flags that set nothing here (refused unless left at {other.owner}'s default, or "
               f"named in a note):\n  " + ", ".join(nothing) if nothing else ""))


def trainer_parser(prog: str, description: str, preset: str = DEFAULT_PRESET, more_help: str = "",
                   other: OtherFlags | None = None) -> argparse.ArgumentParser:
    """grpo_train.py's own flags (--preset, --print-config, --help-all); --help shows how config fields are set and
    `other`'s flags (TRL's) with what each sets, --help-all every config field and its value under `preset`, then
    `more_help` (what the entry point adds: the losses, the built-in graders). Both wrap to the terminal's width."""
    how = ("Config fields: any field is a flag, --section.field VALUE (or --set section.field=VALUE), over the preset "
           "and a --config file; shortcuts: " + ", ".join(f"--{k}" for k in ALIASES) + ". --help-all lists every "
           f"field with its documentation and its value under --preset {preset} (--preset NAME --help-all: "
           "another preset's), the policy losses and the graders.")
    parser = argparse.ArgumentParser(prog=prog, formatter_class=WrappedHelp, description=description,
                                     epilog=how + (other_flags_help(other) if other is not None else ""))
    parser.add_argument("--help-all", action=HelpAll, help="show the help with every config field and exit",
                        text=lambda: f"Config fields with their values under --preset {preset} (override any with "
                                     "--section.field VALUE or --set section.field=VALUE; shortcuts: "
                                     + ", ".join(f"--{k}" for k in ALIASES) + "):" + describe_fields(preset)
                                     + more_help + (other_flags_help(other) if other is not None else ""))
    parser.add_argument("--preset", default=DEFAULT_PRESET,
                        help=f"one of {sorted(PRESETS)} (default: {DEFAULT_PRESET})")
    parser.add_argument("--config", metavar="FILE", default="",
                        help="a YAML or JSON config file: grpo-dual's sections, or the fields of TRL's `trl grpo` "
                             "records (GRPOScriptArguments, ModelConfig, DatasetMixtureConfig, GRPOConfig; translated "
                             "field by field, one without an equivalent is an error; docs/TRL.md); --preset and the "
                             "field flags override it. TRL's flags (--model_name_or_path, --dataset_name, "
                             "--reward_funcs, --learning_rate, --use_peft, ...) are read with such a file, or when "
                             "the command line gives --model_name_or_path, --dataset_name, --reward_funcs, ...")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("--overwrite", action="store_true",
                        help="delete the contents of an existing run folder first (train.overwrite=true); only a "
                             "folder this program made a run folder")
    parser.add_argument("--accept-changes", action="store_true",
                        help="with --resume: go on although the config, data files or reward functions differ from "
                             "the checkpoint's, recording the changes in the run folder "
                             "(checkpoint.accept_changes=true)")
    return parser


def _one_value_each(overrides: list[str], theirs: Mapping[str, Any], origins: Mapping[str, tuple]) -> None:
    """ConfigError when another program's flag (TRL's --learning_rate) and our --section.field flag (--train.lr) both
    set one field on the command line: one would be dropped without a word, as a flag given twice would (refused)."""
    for dotted in (o.split("=", 1)[0] for o in overrides):
        source = origins.get(dotted)
        if source is not None and source[2] and source[0] in theirs:
            raise C.ConfigError(f"--{source[0]} and --{dotted} both set {dotted} on this command line: one value "
                                f"would be dropped; give one of them", field=source[0])


FOLDER_FIELDS = ("train.output_dir", "train.run_name")
"""Our fields that name where the run goes (--output-dir, --run-name)."""


def _own_folders(tree: FileTree, overrides: list[str], other: OtherFlags | None) -> None:
    """Where another program's config leaves its output folder unset (TRL's output_dir: its default trainer_output,
    origin value None), the folders the user named decide: --output-dir X holds the final model and the run folder,
    as output_dir X would; --run-name alone leaves the preset's output folder. With neither, that program's default
    applies, and a note says so. Nothing is written where the user named no folder."""
    source = tree.origins.get("checkpoint.final_model_dir")
    if source is None or source[1] is not None:
        return
    flagged = dict(o.split("=", 1) for o in overrides)
    named = [f for f in FOLDER_FIELDS if f in flagged]
    owner = other.owner if other is not None else "the other program"
    if not named:
        folder = tree.get("checkpoint", {}).get("final_model_dir")
        print(f"note: {source[0]} is not set: the run and its final model go to {folder} ({owner}'s default); name "
              f"the folder with --{source[0]} or --output-dir", file=sys.stderr)
        return
    for dotted in ("checkpoint.final_model_dir", "train.output_dir"):  # the unset default's, not the user's
        section, _, field = dotted.partition(".")
        if tree.origins.get(dotted, ("",))[0] == source[0]:
            tree.get(section, {}).pop(field, None)
    if "train.output_dir" in flagged:  # the run folder keeps the name it has under that program's folder
        tree.setdefault("checkpoint", {})["final_model_dir"] = flagged["train.output_dir"]


def parse_trainer_argv(argv: list[str], prog: str, description: str, more_help: str = "",
                       read_file: Callable[[str, dict[str, Any]], dict[str, Any]] | None = None,
                       other: OtherFlags | None = None) -> tuple[C.Config, argparse.Namespace]:
    """(the Config the command line asks for, the trainer's own flags). Raises ConfigError naming the field;
    --help prints and exits as argparse does (`more_help` at the end of it). `other`: another program's flags read
    too (TRL's); `read_file(path, their values)` reads `--config FILE` and those flags into a config tree (the entry
    point's: TRL's fields are translated above this layer; path "" when only flags are given); its "preset" applies
    unless --preset is given. The --section.field flags override what it gives."""
    overrides, rest = split_argv(argv)
    parser = trainer_parser(prog, description, preset_in(rest), more_help, other)
    own = {o[2:] for action in parser._actions for o in action.option_strings if o.startswith("--")}
    theirs, rest = other.take(rest, own) if other is not None else ({}, rest)
    args, unknown = parser.parse_known_args(rest)
    if unknown:
        raise unknown_flags(unknown, parser, other)
    files = [v for i, a in enumerate(rest) for v in ([a.partition("=")[2]] if a.startswith("--config=") else
                                                     rest[i + 1:i + 2] if a == "--config" else [])]
    if len(files) > 1:  # argparse would keep the last silently
        raise C.ConfigError(f"--config is given {len(files)} times ({', '.join(files)}): one config file a run; give "
                            "the other's fields as flags", field="config")
    tree: dict[str, Any] = {}
    if args.config or theirs:
        if read_file is None:
            raise C.ConfigError(f"--config {args.config}: this entry point reads no config files", field="config")
        tree = read_file(args.config, theirs)
    given = any(a == "--preset" or a.startswith("--preset=") for a in rest)
    preset = args.preset if given or "preset" not in tree else str(tree["preset"])
    if isinstance(tree, FileTree):
        _one_value_each(overrides, theirs, tree.origins)
        _own_folders(tree, overrides, other)
    if isinstance(tree.get("train"), dict) and tree["train"].get("trl_names"):  # a field given as --section.field
        flagged = {o.split("=", 1)[0] for o in overrides}  # is named as the user wrote it, not by TRL's flag
        tree["train"]["trl_names"] = {f: n for f, n in tree["train"]["trl_names"].items() if f not in flagged}
    args.preset = preset
    flags = ((["train.overwrite=true"] if args.overwrite else []) +
             (["checkpoint.accept_changes=true"] if args.accept_changes else []))
    try:
        return C.load_config(preset, overrides + flags, tree), args
    except C.ConfigError as err:
        raise other_names_hint(blamed(err, overrides, getattr(tree, "origins", {})), other) from None
