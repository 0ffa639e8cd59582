"""What a run checks before its folder or model: the data loaded, every grader of every task tried on a real
row, the tools and the environment described (`check_inputs`, `CheckedInputs`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from grpo import config as C
from grpo.data.batching import check_prompts_per_step
from grpo.grading.graders import preflight, set_trainer_state, term_names
from grpo.grading.judge import Judge
from grpo.machine.distributed import Dist
from grpo.phases.environments import environment_rewards, resolve_environment
from grpo.phases.tools import resolve_tools
from grpo.run.assembly.reward_setup import check_task_entries, reward_specs
from grpo.run.assembly.samples import group_by_task, load_samples
from grpo.run.checkpoint.fingerprints import input_fingerprints
from grpo.run.checkpoint.pareto import check_evaluations, require_heldout_rows
from grpo.run.step_owners import prompt_copies


@dataclasses.dataclass
class CheckedInputs:
    """What `check_inputs` read and tried before the run folder or the model: the data and the reward side."""

    rows: Any
    """The loaded rows (grpo/run/assembly/samples.load_samples): .train, .heldout, .every."""
    train_rows: dict[str, list]
    heldout: dict[str, list]
    specs: dict[str, Any]
    """Each task's reward terms (rewards.<task>, else the source's defaults)."""
    graders: dict[str, Any]
    """Every reward term's grader, resolved and tried on a real row."""
    environments: Any
    """The environment factory's description (rollout.environment_factory), or None."""
    callables: Mapping[str, Callable[..., Any]] | None
    """The run's functions by name, with the environment's get_reward when it has one."""
    draws: int
    """How many times a step draws prompts_per_step prompts (`prompt_copies`)."""

    def fingerprints(self, cfg: C.Config) -> dict[str, Any]:
        """What the run starts with besides its config (grpo/run/checkpoint/fingerprints.py): a resume goes on only from
        the same, or names what changed."""
        return input_fingerprints(cfg.data, cfg.tasks, self.rows.every, self.graders, term_names(self.specs))


def check_inputs(cfg: C.Config, callables: Mapping[str, Callable[..., Any]] | None, dist: Dist) -> CheckedInputs:
    """Load the data and resolve and try every grader of every task on a real row, the tools and the environment: a
    bad source, grader or tool stops the run here (DataFileError / GraderError / ToolError), before the run folder
    is touched or the model loads."""
    rows = load_samples(cfg.data, cfg.train.seed, cfg.tasks, announce=dist.is_main)  # every rank loads, one speaks
    train_rows, heldout = group_by_task(rows.train, rows.heldout, cfg.data, cap=False)  # capped by fit_prompts
    draws = prompt_copies(cfg, dist.world)  # prompts_per_step drawn for each process, or once for all (split_groups)
    check_prompts_per_step(train_rows, cfg.train.prompts_per_micro_step, cfg.train.grad_accum, draws)
    require_heldout_rows(train_rows, heldout, cfg.data.heldout_fraction)  # every task is evaluated: stop now if not
    check_evaluations(cfg.train, heldout, cfg.checkpoint.keep_best)  # evaluations asked for where nothing is held out
    specs = reward_specs(cfg.data.source, cfg.rewards, sorted(train_rows), custom=cfg.tasks,
                         aggregation=cfg.loss.reward_aggregation)
    check_task_entries(cfg.kl, sorted(train_rows))
    # a tool or an environment that cannot be imported or described stops the run here
    tool_names = [t.name for t in resolve_tools(cfg.rollout.tools, callables)]
    environments = resolve_environment(cfg.rollout.environment_factory, callables, tool_names)  # None without
    specs, callables = environment_rewards(specs, callables, environments)  # its get_reward: a term of each task
    # the judge's rubrics are tried without its cache, which lives in the run folder
    set_trainer_state(0, 0)  # a run in the same process (a notebook, a test) left its own: each run starts from none
    graders = preflight(specs, train_rows, judge=Judge.from_config(dataclasses.replace(cfg.judge, cache_path=""), None),
                        callables=callables, reward_models=cfg.reward_models, device=dist.device,
                        timeout_s=cfg.train.reward_timeout_s,
                        environment=environments.preflight if environments is not None else None)
    return CheckedInputs(rows, train_rows, heldout, specs, graders, environments, callables, draws)
