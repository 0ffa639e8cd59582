"""Each task's reward terms (`rewards.<task>` parsed, else its source's defaults: `reward_specs`) and the check that
every `kl.<task>` / `rewards.<task>` entry names a task of the run."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from grpo.config import ConfigError


def parse_reward_spec(task: str, text: str) -> tuple[list[tuple[str, float]], str | None]:
    """"grader:w,module:fn:w|fallback" -> ([(grader, w), ...], fallback). A term without :w has weight 1."""
    body, _, fallback = text.partition("|")
    terms = []
    for part in (p.strip() for p in body.split(",") if p.strip()):
        name, _, weight = part.rpartition(":")
        try:
            terms.append((name, float(weight)) if name else (part, 1.0))
        except ValueError:
            terms.append((part, 1.0))
    if not terms:
        raise ConfigError(f"config field `rewards.{task}` = {text!r} is invalid: give grader:weight terms, e.g. "
                          "bbq_rule:1.0,format:0.2", field=f"rewards.{task}")
    return terms, (fallback.strip() or None)


BUILTIN_TASKS = ("fairness", "hallucination")
"""The built-in sources' task names (demo, dual), whose kl.<task> / rewards.<task> entries presets carry: they may
stay in a run that trains only your own tasks."""


def check_task_entries(kl_tasks: Iterable[str], tasks: list[str]) -> None:
    """A kl.<task> entry naming no task of the run (besides kl.default and the built-in tasks) is a ConfigError
    naming it: a misspelt task (kl.fairnes) would leave the real task on kl.default, silently."""
    unknown = sorted(set(kl_tasks) - {"default", *BUILTIN_TASKS} - set(tasks))
    if unknown:
        raise ConfigError(f"config field `kl.{unknown[0]}` names no task of this run (its tasks: {', '.join(tasks)}): "
                          "fix the task's name or drop the entry", field=f"kl.{unknown[0]}")


def reward_specs(source: str, rewards: Mapping[str, str], tasks: list[str],
                 custom: Iterable[str] = (), aggregation: str = "mean") -> dict[str, Any]:
    """A RewardSpec per task: its rewards.<task> entry, else the built-in source's default terms (the demo's
    graders; BBQ's and HaluEval's for tasks named fairness / hallucination). `custom`: the tasks.<task> names,
    which have no default: a custom task without rewards.<task> is a ConfigError naming that field.
    `aggregation`: loss.reward_aggregation, how each task's terms make its reward."""
    from grpo.data.demo_tasks import DEMO_REWARDS
    from grpo.grading.scoring import RewardSpec

    defaults = DEMO_REWARDS if source == "demo" else {"fairness": "bbq_rule:1.0,format:0.2",
                                                      "hallucination": "halueval_rule:1.0,format:0.2"}
    custom = set(custom)
    # a misspelt task name would otherwise leave that task on its defaults, silently; the built-in tasks' entries
    # that presets carry (fairness, hallucination) may stay when the run trains only your own tasks
    unknown = sorted(set(rewards) - set(tasks) - set(DEMO_REWARDS) - set(BUILTIN_TASKS))
    if unknown:
        raise ConfigError(f"config field `rewards.{unknown[0]}` names no task of this run (its tasks: "
                          f"{', '.join(tasks)}): fix the task's name or drop the entry", field=f"rewards.{unknown[0]}")
    specs = {}
    for task in tasks:
        text = rewards.get(task) or (None if task in custom else defaults.get(task))
        if text is None:
            raise ConfigError(f"task {task!r} has no reward terms: add rewards.{task}=grader:weight, e.g. "
                              f"--set rewards.{task}=path/to/rewards.py:my_reward:1.0 (docs/CUSTOM_TASKS.md "
                              f"lists the built-in graders)", field=f"rewards.{task}")
        terms, fallback = parse_reward_spec(task, text)
        try:
            specs[task] = RewardSpec(task=task, terms=tuple(terms), fallback=fallback, aggregation=aggregation)
        except ValueError as err:  # a weight <= 0, the judge as its own fallback
            raise ConfigError(f"config field `rewards.{task}` = {text!r} is invalid: {err}",
                              field=f"rewards.{task}") from None
    return specs
