"""The config checks that need the code: names against the registries that own them, and the KL controllers' rules.

The config layer is standard library only, so its section dataclasses (grpo/config/sections.py, input_sections.py,
algorithm_sections.py) check what needs no code (ranges, types, combinations of fields) in `__post_init__`. A name such
as `loss.policy_loss` is valid when the registry that implements it holds it (grpo/core/losses.py POLICY_LOSSES, ...),
`loss.params` when the chosen loss's registration takes each and its rule holds, and a kl.<task> section when its
controller accepts its arguments (grpo/core/kl_control.py RULES): those checks live here, next to the registries, and
each entry point runs `check_config` right after building the Config, before any model or data is loaded
(grpo_train.setup / cli, grpo/run/assembly/gpu_memory_check.py). Every error is a ConfigError naming the field, the bad
value and the fix. `check_installed` adds what a config asks of this machine that a look can tell before any data or
model is loaded (the W&B package and a key for train.wandb_project, a judge.cache_path that is not a folder).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from grpo.config import Config, LossConfig, TaskKLConfig, did_you_mean, field_error
from grpo.config.command_line import command_typed, parse_trainer_argv, repeated_note, smoke_test_note
from grpo.core.advantages import ADV_SCALES, MULTI_OBJECTIVE_AGGREGATIONS
from grpo.core.gradient_surgery import SURGERY_METHODS
from grpo.core.kl_control import CONFIG_FIELDS, KL_CONTROLLERS, controller_args, controller_problem
from grpo.core.losses import AGG_MODES, KL_ESTIMATORS, POLICY_LOSSES, losses_help
from grpo.core.registry import Registry
from grpo.grading.graders import graders_help
from grpo.grading.judge import CACHE_FILE as JUDGE_CACHE_FILE
from grpo.grading.reward_models import check_spec as check_reward_model
from grpo.grading.scoring import REWARD_AGGREGATIONS
from grpo.phases.generate import CACHE_IMPLEMENTATIONS, ENGINES
from grpo.run.tracking import WANDB_MISSING, WANDB_NO_KEY, wandb_can_log, wandb_installed
from grpo.run.trl.command_line import read_config_file, trl_flags

REGISTRY_FIELDS: dict[str, Registry[Any]] = {
    "rollout.cache_implementation": CACHE_IMPLEMENTATIONS,
    "rollout.engine": ENGINES,
    "loss.policy_loss": POLICY_LOSSES,
    "loss.agg_mode": AGG_MODES,
    "loss.kl_estimator": KL_ESTIMATORS,
    "loss.adv_scale": ADV_SCALES,
    "loss.reward_aggregation": REWARD_AGGREGATIONS,
    "loss.multi_objective_aggregation": MULTI_OBJECTIVE_AGGREGATIONS,
    "multi.combine": SURGERY_METHODS,
}
"""Dotted config field -> the registry whose names it must be one of (kl.<task>.controller: KL_CONTROLLERS, checked
per task; the rule graders of rewards.<task>: GRADERS, resolved with the other graders)."""


def registries_help() -> str:
    """Every choice made by name, registry by registry, with its doc: the --help section the registries write."""
    registries = [*REGISTRY_FIELDS.values(), KL_CONTROLLERS]
    return "\n\nChoices by name (each registered beside its code):\n" + "\n".join(
        "  " + r.help().replace("\n", "\n  ") for r in registries if r is not POLICY_LOSSES)


def choices_help() -> str:
    """--help-all's choices: the policy losses with their parameters, every other registry, the graders by name."""
    return losses_help() + registries_help() + graders_help()


def parse_command_line(argv: list[str], description: str) -> tuple[Config, Any]:
    """The trainer's command line as one checked Config and argparse's namespace: grpo-dual's sections and flags, a
    `--config` file of ours or of TRL's records, TRL's flags (grpo/config/command_line.py,
    grpo/run/trl/command_line.py); then the notes on a short run's long warm-up and on a field set twice. A ConfigError
    names the field."""
    cfg, args = parse_trainer_argv(argv, prog=command_typed(), description=description, more_help=choices_help(),
                                   read_file=read_config_file, other=trl_flags())
    check_config(cfg)
    for note in (smoke_test_note(argv, cfg), repeated_note(argv)):
        if note:
            print(note, file=sys.stderr)
    return cfg, args


def check_names(cfg: Config) -> None:
    """Every registry-named field holds a name its registry knows."""
    for dotted, names in REGISTRY_FIELDS.items():
        section, name = dotted.split(".")
        value = getattr(getattr(cfg, section), name)
        if value not in names:
            raise field_error(dotted, value, f"use one of {sorted(names)}")


def check_loss_params(loss: LossConfig) -> None:
    """`loss.params` against the registration of `loss.policy_loss` (grpo/core/losses.py): only its own
    hyper-parameters, each within its rule; and the `loss.agg_mode` the loss needs."""
    spec = POLICY_LOSSES[loss.policy_loss]
    own = [p.name for p in spec.params]
    for name, value in loss.params.items():
        param = spec.param(name)
        if param is None:
            owners = [s.name for s in POLICY_LOSSES.values() if s.param(name) is not None]
            fix = f"loss.policy_loss {loss.policy_loss} takes no parameter {name}" + (
                f" (it is {' and '.join(owners)}'s)" if owners else did_you_mean([name], own, "loss.params"))
            valid = [f"loss.params.{n}" for n in own] + [f"loss.{f}" for f in spec.fields]
            fix += f"; its parameters: {', '.join(valid) or 'none'}"
            raise field_error(f"loss.params.{name}", value, fix)
        if not param.rule.holds(value):
            raise field_error(f"loss.params.{name}", value, f"{loss.policy_loss}'s {name} must be {param.rule.says} "
                              f"(default {param.default!r})")
    if spec.agg_mode is not None and loss.agg_mode != spec.agg_mode:
        raise field_error("loss.agg_mode", loss.agg_mode, f"policy_loss {loss.policy_loss} needs agg_mode "
                          f"{spec.agg_mode}")


def check_kl_section(where: str, section: TaskKLConfig) -> None:
    """A kl.<task> section: a known controller, and arguments that controller accepts (its rules, not a copy)."""
    if section.controller not in KL_CONTROLLERS:
        raise field_error(f"{where}.controller", section.controller, f"use one of {sorted(KL_CONTROLLERS)}")
    kind, kwargs = controller_args(section)
    problem = controller_problem(kind, **kwargs)
    if problem is not None:
        argument, fix = problem
        raise field_error(f"{where}.{CONFIG_FIELDS.get(argument, argument)}", kwargs[argument],
                          f"the {kind} controller's {argument} {fix}")


def check_config(cfg: Config) -> Config:
    """The checks above over the whole config; returns it unchanged, or raises ConfigError naming the field."""
    check_names(cfg)
    check_loss_params(cfg.loss)
    for task, section in cfg.kl.items():
        check_kl_section(f"kl.{task}", section)
    # checked here, not in grpo/config/sections.py: `--preset custom --help` works
    if cfg.data.source == "none" and not cfg.tasks:
        raise field_error("data.source", "none", "none trains only your own tasks: add one, --tasks.<task>.path FILE "
                          "(or use demo / dual)")
    for name, section in cfg.reward_models.items():  # normalize and dtype against grpo/grading/reward_models.py's names
        check_reward_model(section, f"reward_models.{name}")
    check_installed(cfg)
    return cfg


def check_installed(cfg: Config) -> None:
    """What the config asks of this machine that a look can tell, before data or model load: the W&B package when
    train.wandb_project is set, and an API key or an offline mode for it, and a judge.cache_path that a SQLite file can
    take (not a folder)."""
    if cfg.train.wandb_project and not wandb_installed():
        raise field_error("train.wandb_project", cfg.train.wandb_project, WANDB_MISSING)
    if cfg.train.wandb_project and not wandb_can_log():
        raise field_error("train.wandb_project", cfg.train.wandb_project, WANDB_NO_KEY)
    if cfg.judge.cache_path and Path(cfg.judge.cache_path).expanduser().is_dir():
        raise field_error("judge.cache_path", cfg.judge.cache_path,
                          f"it is a folder; name the SQLite file to keep there, e.g. "
                          f"{Path(cfg.judge.cache_path) / JUDGE_CACHE_FILE}, or leave it empty (the run folder's)")
