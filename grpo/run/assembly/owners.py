"""The run's tracker and the three owners of its RL step, built once from their sections (`build_owners`); the
stop token ids and trackers they are given."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from grpo.data.batching import TaskBalancedSampler
from grpo.grading.judge import Judge
from grpo.machine.host_resources import openmp_spins
from grpo.phases.tools import build_toolbox
from grpo.run.assembly.samples import parse_task_mix
from grpo.run.checkpoint.pareto import RUN_SUBDIR as PARETO_SUBDIR
from grpo.run.checkpoint.pareto import ParetoFrontier
from grpo.run.record import Run
from grpo.run.step_owners import Generation, Rewarder, Updater
from grpo.run.tracking import NullTracker

if TYPE_CHECKING:
    from grpo.run.assembly.inputs import CheckedInputs


def build_trackers(train_cfg, run_dir: Path):
    from grpo.run.tracking import make_trackers

    return make_trackers(run_dir, tensorboard=train_cfg.tensorboard, wandb_project=train_cfg.wandb_project or None)


def stop_token_ids(rollout_cfg, tokenizer) -> tuple[int, ...]:
    """The ids that end a rollout: the tokenizer's end-of-turn / EOS token, then each of rollout.stop_strings
    (each must be one token of the tokenizer), without repeats."""
    from grpo.models.tokens import stop_token_id

    stops = [stop_token_id(tokenizer)]
    for text in rollout_cfg.stop_strings:
        ids = tokenizer.convert_tokens_to_ids(text)
        if ids is None or ids == tokenizer.unk_token_id:
            encoded = tokenizer.encode(text, add_special_tokens=False)
            if len(encoded) != 1:
                raise ValueError(f"rollout.stop_strings entry {text!r} is {len(encoded)} tokens; each stop must be "
                                 "exactly one token of the tokenizer")
            ids = encoded[0]
        stops.append(int(ids))
    return tuple(dict.fromkeys(stops))


def build_owners(run: Run, checked: CheckedInputs) -> None:
    """The run's tracker, the three owners of its RL step and its Pareto frontier."""
    cfg, policy, dist, run_dir = run.cfg, run.policy, run.dist, run.run_dir
    run.tracker = build_trackers(cfg.train, run_dir) if dist.is_main else NullTracker()
    if openmp_spins():  # torch came before grpo_train: the report's openmp_spinning finding reads it
        run.tracker.log({"host/openmp_spinning": 1.0}, 0)
    # rollout.tools; None without
    toolbox = build_toolbox(cfg.rollout, policy.tokenizer, checked.callables, checked.environments)
    sampler = TaskBalancedSampler(run.samples.training, seed=cfg.train.seed, mix=parse_task_mix(cfg.data.task_mix))
    run.generation = Generation(policy, cfg.rollout, dist, sampler, stop_token_ids(cfg.rollout, policy.tokenizer),
                                toolbox, prompts_per_step=cfg.prompts_per_step, train=cfg.train)
    run.rewarder = Rewarder(checked.specs, checked.graders, Judge.from_config(cfg.judge, run_dir), run.tasks, dist,
                            rollout=cfg.rollout, loss=cfg.loss, tool_names=toolbox.names if toolbox else None,
                            total_updates=cfg.total_updates)
    run.updater = Updater(cfg, policy, dist, run.tasks, run.device)
    run.progress.frontier = ParetoFrontier(cfg.multi.pareto_cap, run_dir / PARETO_SUBDIR)
