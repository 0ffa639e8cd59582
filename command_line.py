"""The command line of the entry points: `--section.field VALUE` flags into config overrides, and the `--help` text.

    --rollout.k 8 | --rollout.k=8 | --set rollout.k=8        -> "rollout.k=8"
    --seed 3 (a shortcut, ALIASES)                            -> "train.seed=3"
    anything else (--preset, --print-config, ...)             -> left for the entry point's own argparse parser

Standard library only; the schema, its validation and `load_config` are config.py's, the presets presets.py's.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import typing
from typing import Any

import config as C
from presets import PRESETS

ALIASES = {"model": "model.name", "data-dir": "data.data_dir", "max-steps": "train.max_steps",
           "seed": "train.seed", "output-dir": "train.output_dir", "run-name": "train.run_name",
           "resume": "checkpoint.resume", "device": "train.device"}
"""Short command-line flags users know, mapped to dotted fields."""


def _dotted(item: str) -> str:
    """"seed=3" -> "train.seed=3"; anything that is not a shortcut is returned as it is."""
    key, eq, value = item.partition("=")
    return f"{ALIASES.get(key.strip(), key.strip())}{eq}{value}" if eq else item


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """Turn `--section.field value`, `--section.field=value`, `--set k=v` and the ALIASES shortcuts into
    `section.field=value` overrides (for config.load_config).

    Returns (overrides, rest) where rest holds the flags the entry point handles itself.
    """
    overrides, rest = [], []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--set":
            if i + 1 >= len(argv):
                raise C.ConfigError("--set needs section.field=value")
            overrides.append(_dotted(argv[i + 1]))
            i += 2
            continue
        if arg.startswith("--") and len(arg) > 2:
            body = arg[2:]
            key = body.split("=", 1)[0]
            if "." in key or key in ALIASES:
                if "=" in body:
                    overrides.append(_dotted(body))
                    i += 1
                else:
                    if i + 1 >= len(argv):
                        raise C.ConfigError(f"{arg} needs a value")
                    overrides.append(_dotted(f"{key}={argv[i + 1]}"))
                    i += 2
                continue
        rest.append(arg)
        i += 1
    return overrides, rest


def describe_fields() -> str:
    """Every field with its type, default and docstring (read from config.py's source), for --help."""
    docs: dict[str, dict[str, str]] = {}
    for node in ast.parse(inspect.getsource(C)).body:
        if isinstance(node, ast.ClassDef):
            body = node.body
            for a, b in zip(body, body[1:]):
                if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant):
                    docs.setdefault(node.name, {})[a.target.id] = " ".join(str(b.value.value).split())
    lines = []
    defaults = C.Config()
    for sname in (f.name for f in dataclasses.fields(C.Config)):
        if sname == "preset":
            continue
        if sname in ("kl", "rewards", *C.DICT_SECTIONS):
            key = "<name>" if sname == "reward_models" else "<task>"
            lines.append(f"\n[{sname}.{key}]  {docs['Config'].get(sname, '')}")
            cls = C.TaskKLConfig if sname == "kl" else C.DICT_SECTIONS.get(sname)
            if cls is not None:
                for fname, ftype in typing.get_type_hints(cls).items():
                    default = getattr(cls(), fname)
                    lines.append(f"  --{sname}.{key}.{fname} ({_tname(ftype)}, default {default!r}): "
                                 f"{docs[cls.__name__].get(fname, '')}")
            if sname == "rewards":
                # imported here, not at module level: the command line imports no grpo module (docs/DESIGN.md)
                from grpo.graders import builtin_graders

                lines.append("  built-in graders (or a reward_models name, package.module:function, "
                             "path/to/file.py:function; docs/CUSTOM_TASKS.md):")
                lines += [f"    {name}: {doc}" for name, doc in builtin_graders().items()]
            continue
        section = getattr(defaults, sname)
        lines.append(f"\n[{sname}]")
        for fname, ftype in typing.get_type_hints(type(section)).items():
            lines.append(f"  --{sname}.{fname} ({_tname(ftype)}, default {getattr(section, fname)!r}): "
                         f"{docs.get(type(section).__name__, {}).get(fname, '')}")
    return "\n".join(lines)


def _tname(t: Any) -> str:
    return getattr(t, "__name__", None) or str(t).replace("typing.", "")


def trainer_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """grpo_train.py's own flags (--preset, --print-config), with every config field described in the epilog."""
    parser = argparse.ArgumentParser(
        prog=prog, formatter_class=argparse.RawDescriptionHelpFormatter, description=description,
        epilog="Config fields (override with --section.field VALUE or --set section.field=VALUE; shortcuts: "
               + ", ".join(f"--{k}" for k in ALIASES) + "):" + describe_fields())
    parser.add_argument("--preset", default="demo", help=f"one of {sorted(PRESETS)} (default: demo)")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("--overwrite", action="store_true",
                        help="delete the contents of an existing run folder first (train.overwrite=true)")
    return parser


def parse_trainer_argv(argv: list[str], prog: str, description: str) -> tuple[C.Config, argparse.Namespace]:
    """(the Config the command line asks for, the trainer's own flags). Raises ConfigError naming the field;
    --help prints and exits as argparse does."""
    overrides, rest = split_argv(argv)
    args = trainer_parser(prog, description).parse_args(rest)
    return C.load_config(args.preset, overrides + (["train.overwrite=true"] if args.overwrite else [])), args
