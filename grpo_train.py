"""grpo-dual trainer: SFT warm-up, then GRPO / GSPO with per-task KL control. Read it top to bottom.

    python grpo_train.py                                   # the embedded offline demo (CPU, a few minutes)
    python grpo_train.py --preset llama3-8b-dual           # Llama-3-8B-Instruct + LoRA on BBQ + HaluEval
    python grpo_train.py --rollout.k 8 --set loss.mu=2     # any config field, dotted
    python grpo_train.py --help | --print-config

In Jupyter, call the same functions cell by cell: `run = setup(cfg)`, `sft_phase(run)`, `rl_step(run, step)`,
`evaluate_phase(run, "after_rl")`, `finish(run)`. Only this file sees the whole Config; modules get plain values.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from grpo.config import settings as C
from grpo.config.command_line import parse_trainer_argv
from grpo.run import checkpoint as ckpt
from grpo.core.advantages import group_advantages
from grpo.core.answers import answer_class, step_answer_metrics
from grpo.phases.batch import batch_logprobs, build_train_batch
from grpo.data.batching import TaskBalancedSampler
from grpo.run.config_check import check_config
from grpo.models.distributed import Dist, make_dist, rank_rng_state, relaunch_on_cpu, requested_cpu_processes
from grpo.core.doctor import Doctor, Finding
from grpo.phases.evaluate import evaluate, part_means
from grpo.grading.graders import Grader, GraderError, preflight
from grpo.core.health import TrainingUnstable, WeightGuard, bad_step_reason
from grpo.grading.judge import Judge
from grpo.core.kl_control import Controller, controller_from_config
from grpo.models.logprobs import shared_prompt_blocker, shares_by_size
from grpo.core.memory import estimate
from grpo.run.memory_inputs import inputs_from_config
from grpo.models.modeling import Policy, check_4bit_available, has_dropout, rebase_reference, reference, save_pretrained
from grpo.core.multi import ConflictMonitor
from grpo.run.pareto import ParetoFrontier, require_heldout_rows
from grpo.models.pretrained import ModelPackageMissing, check_model_name
from grpo.run.plot import plot_run
from grpo.core.records import Rollout, Sample, Scored, TrainBatch
from grpo.run.report import build_report, format_report, kl_bands
from grpo.run.run_folder import prepare_run_dir
from grpo.phases.rollout import generate_rollouts, rollout_metrics
from grpo.models.sampling import row_keys
from grpo.grading.scoring import RewardSpec, score_rollouts
from grpo.run.setup_parts import (build_trackers, check_task_entries, choose_device, load_samples, policy_from_config,
                              reward_specs, stop_token_ids)
from grpo.phases.sft import run_sft, sft_examples
from grpo.run.signals import StopRequest
from grpo.data.jsonio import DataFileError
from grpo.run.tracking import METRICS_FILE, NullTracker, Tracker, format_step_line, progress, read_metrics
from grpo.phases.update import TaskGradientSurgery, adamw, train_step


@dataclass
class Run:
    """Everything a training run holds. Built by `setup` (the fields after `heldout` are filled in there, from the
    config and the policy), advanced by `sft_phase` and `rl_step`."""

    cfg: C.Config
    run_dir: Path
    """output_dir/run_name: metrics, samples, evaluations, checkpoints, the final model."""
    device: torch.device
    dist: Dist
    """The processes of the run (grpo/models/distributed.py); one process unless started by `accelerate launch`."""
    policy: Policy
    train: dict[str, list[Sample]]
    """Training samples per task."""
    heldout: dict[str, list[Sample]]
    """Held-out samples per task (at most data.eval_size each)."""
    sampler: TaskBalancedSampler = field(init=False)
    controllers: dict[str, Controller] = field(init=False)
    """The β controller of each task (kl.<task>, else kl.default)."""
    specs: dict[str, RewardSpec] = field(init=False)
    """The reward terms of each task (rewards.<task>, else the source's defaults)."""
    graders: dict[str, Grader] = field(init=False)
    """Every reward term's grader by name, resolved and tried on a real row by `grpo.grading.graders.preflight` before the
    model loaded (a reward model is loaded there, once)."""
    judge: Judge | None = field(init=False)
    """The LLM judge (judge.base_url), or None for rule graders only."""
    tracker: Tracker = field(init=False)
    """Where metrics go: metrics.jsonl / csv, TensorBoard, W&B on rank 0; nowhere on the other ranks."""
    stop_ids: tuple[int, ...] = field(init=False)
    """Token ids that end a completion: the end-of-turn / EOS token and rollout.stop_strings, resolved once."""
    micro_batch_seqs: int = field(init=False)
    """Sequences per forward of every pass (old log-probs, reference, training): cfg.micro_batch_seqs, halved
    after a CUDA out-of-memory retry (`update_with_oom_retry`)."""
    optimizer: torch.optim.Optimizer = field(init=False)
    scheduler: torch.optim.lr_scheduler.LambdaLR = field(init=False)
    guard: WeightGuard = field(init=False)
    """Skipped / restored steps; replaces non-finite weights by the last good copy."""
    surgery: TaskGradientSurgery | None = field(init=False)
    """Per-task gradient combination (PCGrad / CAGrad), or None for the plain summed loss."""
    train_model: torch.nn.Module = field(init=False)
    """The model the update runs through: the policy's model, or accelerate's DDP / FSDP wrapper of it."""
    frontier: ParetoFrontier = field(init=False)
    """Pareto frontier of per-task held-out scores, with a saved adapter/model per point."""
    share_prompts: bool = False
    """Forward passes encode each prompt once for its K completions (see `shares_prompts`)."""
    step: int = 0
    """The last finished RL step."""
    finished: bool = False
    """The final evaluation (after_rl) of this run's last step is done; the final checkpoint records it."""
    evals: dict[str, dict[str, float]] = field(default_factory=dict)
    """Held-out reward per task under each evaluation tag (before_sft, after_sft, step_N, after_rl)."""
    counters: dict[str, float] = field(default_factory=dict)
    """Running totals the step metrics are differences of (judge counters), and the guard's restore flag."""
    doctor: Doctor | None = None
    """The run doctor on rank 0 (grpo/core/doctor.py): the health checks over a moving window of the RL step metrics,
    started by `start_doctor` (by the first `rl_step` when `main` did not, e.g. in a notebook); None on other ranks."""
    alarms: list[Finding] = field(default_factory=list)
    """The doctor's findings that fired at the last RL step (rank 0); `main` prints them."""
    report: dict[str, Any] = field(default_factory=dict)
    """The before/after report (report.json) once `finish` ran; `train(...)` fills it in."""

    def __post_init__(self) -> None:
        self.micro_batch_seqs = self.cfg.micro_batch_seqs

    @property
    def tasks(self) -> list[str]:
        """Task names, sorted: the order of task indices in batches, β vectors and metrics."""
        return sorted(self.train)

    @property
    def tokenizer(self):
        return self.policy.tokenizer


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def setup(cfg: C.Config, *, callables: Mapping[str, Callable[..., Any]] | None = None,
          model: tuple[Any, Any] | None = None) -> Run:
    """Build the model, data, optimizer, controllers and trackers of a run; write its resolved config.

    Order: the config is checked against the registries (grpo/run/config_check.py); the data are loaded and every
    grader of every task is resolved and tried on a real row (grpo.grading.graders.preflight): a bad source or grader
    stops the run with DataFileError / GraderError before the run folder is touched or the model loads. Then the
    run folder, the policy, the rest. `callables`: reward functions by the names rewards.<task> gives them (the
    Python entry point, `train`); `model`: an already-loaded (model, tokenizer) to train instead of model.name.

    Under `accelerate launch` (several processes) every rank builds the same run (same seed, same weights, same
    prompt order); rank 0 alone logs, evaluates and saves.
    """
    check_config(cfg)
    seed_everything(cfg.train.seed)
    # transformers is imported when the first model is built, not when this module is (--help stays fast)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one progress display per phase is ours; HF's save bars are noise
    dist, dist_device = make_dist(cfg.train.device, cfg.train.sharding)
    device = dist_device or choose_device(cfg.train.device)
    name = dist.broadcast(cfg.train.run_name or f"{cfg.preset}-{time.strftime('%Y%m%d-%H%M%S')}")
    run_dir = Path(cfg.train.output_dir) / name
    rows = load_samples(cfg.data, cfg.train.seed, cfg.tasks)
    train, heldout = split_by_task(rows.train, rows.heldout, cfg.data)
    require_heldout_rows(train, heldout, cfg.data.heldout_fraction)  # every task is evaluated: stop now if not
    specs = reward_specs(cfg.data.source, cfg.rewards, sorted(train), custom=cfg.tasks)
    check_task_entries(cfg.kl, sorted(train))
    # the judge's rubrics are tried without its cache, which lives in the run folder
    graders = preflight(specs, train, judge=Judge.from_config(dataclasses.replace(cfg.judge, cache_path=""), None),
                        callables=callables, reward_models=cfg.reward_models, device=device)
    note = preset_note(cfg)
    if note and dist.is_main:
        print(note)
    if dist.is_main:  # before any expensive work: one run folder, one run
        prepare_run_dir(run_dir, cfg.checkpoint.resume, cfg.train.overwrite)
    dist.barrier()
    # the builtin tokenizer learns from prompts and, separately, from completions exactly as they are generated
    # (right after the assistant marker, no leading space)
    corpus = [s.messages[-1]["content"] for s in rows.every] + [s.target for s in rows.every if s.target]
    policy = policy_from_config(cfg.model, device, corpus, seed=cfg.train.seed, loaded=model)
    if policy.grad_scaler is not None and cfg.multi.combine != "sum":
        raise C.ConfigError(f"multi.combine={cfg.multi.combine!r} needs bf16 or fp32 weights: the per-task gradients "
                            "are not loss-scaled, so fp16 (this GPU has no bf16) would under- or overflow; use "
                            "multi.combine=sum or model.dtype=float32", field="multi.combine")
    if dist.sharded:  # FSDP2: the parameters become shards in place; the optimizer is built on them below
        check_sharding(cfg, policy, dist)
        dist.shard(policy.model)
        dist.shard(policy.ref_model)
    run = Run(cfg, run_dir, device, dist, policy, train, heldout)
    run.sampler = TaskBalancedSampler(run.train, seed=cfg.train.seed, mix=parse_task_mix(cfg.data.task_mix))
    run.controllers = {t: controller_from_config(cfg.kl_for(t)) for t in run.tasks}
    run.specs, run.graders = specs, graders
    run.judge = Judge.from_config(cfg.judge, run_dir)
    run.tracker = build_trackers(cfg.train, run_dir) if dist.is_main else NullTracker()
    run.stop_ids = stop_token_ids(cfg.rollout, policy.tokenizer)
    fresh_optimizer(run)
    run.share_prompts = shares_prompts(cfg, run.train_model, dist)
    run.frontier = ParetoFrontier(cfg.multi.pareto_cap, run_dir / "pareto")
    if dist.is_main:
        (run_dir / "config.json").write_text(C.dumps(cfg))
    if dist.active and not per_completion_sampling(cfg.rollout, dist):
        torch.manual_seed(cfg.train.seed + 1_000_003 * dist.rank)  # ranks must not draw the same samples
    return run


CUSTOM_PRESET = "custom"
"""The preset made for tasks.<task> sources (grpo/config/presets.py); `train(tasks=...)` starts from it."""


def preset_note(cfg: C.Config) -> str | None:
    """For a run with tasks.<task> sources: which preset's settings they train with, and how to change them (else a
    custom task silently inherits settings chosen for another preset's tasks, e.g. the demo's 4-token answers)."""
    if not cfg.tasks:
        return None
    change = ("override any of them, e.g. --rollout.max_new_tokens 64" if cfg.preset == CUSTOM_PRESET else
              f"--preset {CUSTOM_PRESET} starts from settings made for your own tasks")
    return (f"tasks {', '.join(sorted(cfg.tasks))}: the settings of preset {cfg.preset!r} apply: K {cfg.rollout.k}, "
            f"max_new_tokens {cfg.rollout.max_new_tokens}, lr {cfg.train.lr:g}, {cfg.train.max_steps} RL steps, SFT "
            f"{cfg.sft.steps} steps; {change} (docs/CUSTOM_TASKS.md)")


def shares_prompts(cfg: C.Config, train_model: torch.nn.Module, dist: Dist) -> bool:
    """Whether the forward passes encode each prompt once for its K completions (model.shared_prompt_forward),
    decided once: what blocks it (grpo/models/logprobs.shared_prompt_blocker) does not change during a run."""
    mode = cfg.model.shared_prompt_forward
    if mode == "off":
        return False
    why = shared_prompt_blocker(train_model, training=True)
    if why is not None:
        if mode == "on":
            raise C.ConfigError(f"model.shared_prompt_forward=on cannot apply here: {why}. Use auto (it turns "
                                "itself off) or off", field="model.shared_prompt_forward")
        if dist.is_main:
            print(f"model.shared_prompt_forward=auto: off for this run ({why}); every row encodes its own prompt")
        return False
    return shares_by_size(mode, sum(p.numel() for p in train_model.parameters()))


def check_sharding(cfg: C.Config, policy: Policy, dist: Dist) -> None:
    """What FSDP sharding supports today: full fine-tuning in bf16 / fp32 with the summed loss."""
    problems = [why for bad, why in [
        (cfg.model.lora or cfg.model.load_in_4bit, "LoRA / QLoRA (model.lora=false: sharding is for full fine-tuning; "
                                                   "an adapter fits every process, use train.sharding=none)"),
        (cfg.multi.combine != "sum", "per-task gradient surgery (multi.combine=sum)"),
        (policy.grad_scaler is not None, "fp16 loss scaling (model.dtype=bfloat16 or float32)"),
        (cfg.sft.steps > 0 and cfg.sft.batch_size % dist.world != 0,
         f"an SFT batch that does not split evenly over {dist.world} processes (sft.batch_size)")] if bad]
    if problems:
        raise C.ConfigError("train.sharding=fsdp does not support " + "; ".join(problems), field="train.sharding")


def per_completion_sampling(rollout: C.RolloutConfig, dist: Dist) -> bool:
    """Whether rollouts draw from per-completion streams (rollout.sampling_rng; auto = when several processes)."""
    mode = rollout.sampling_rng
    return mode == "per_completion" or (mode == "auto" and dist.active)


def fresh_optimizer(run: Run) -> None:
    """Optimizer, scheduler, weight guard and gradient surgery for the policy's current trainable parameters
    (after SFT or a reference restore they are new objects under LoRA), prepared for the run's processes."""
    params = run.policy.trainable_parameters()
    optimizer, run.scheduler = build_optimizer(run.cfg.train, params)
    run.guard = WeightGuard(run.dist.local(params), max_consecutive=run.cfg.train.max_consecutive_bad)
    run.surgery = build_surgery(run.cfg, params, run.tasks)
    run.train_model, run.optimizer = run.dist.prepare(run.policy.model, optimizer)


def build_surgery(cfg: C.Config, params: list[torch.nn.Parameter], tasks: list[str]):
    """PCGrad / CAGrad over per-task gradients when multi.combine asks for it (and there are several tasks)."""
    if cfg.multi.combine == "sum" or len(tasks) < 2:
        return None
    monitor = ConflictMonitor(mode=cfg.multi.switch, threshold=cfg.multi.threshold, patience=cfg.multi.patience,
                              release=cfg.multi.release)
    return TaskGradientSurgery(params, tasks, cfg.multi.combine, cfg.multi.cagrad_c, monitor,
                               policy_only=cfg.multi.policy_only, seed=cfg.train.seed)


def parse_task_mix(text: str) -> dict[str, float] | None:
    """"a:1,b:2" -> {"a": 1.0, "b": 2.0}; empty -> None (equal shares)."""
    if not text:
        return None
    pairs = (p.split(":") for p in text.split(","))
    try:
        return {task.strip(): float(w) for task, w in pairs}
    except ValueError:
        raise C.ConfigError(f"config field `data.task_mix` = {text!r} is invalid: weights must be numbers") from None


def build_optimizer(train: C.TrainConfig, params: list[torch.nn.Parameter]):
    """AdamW over the trainable parameters, with a linear warm-up."""
    optimizer = adamw(params, lr=train.lr, weight_decay=train.weight_decay)
    warmup = train.warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda n: min(1.0, (n + 1) / warmup) if warmup else 1.0)
    return optimizer, scheduler


def split_by_task(train_list: list[Sample], held_list: list[Sample], data: C.DataConfig) -> tuple[dict, dict]:
    """Train and held-out samples by task (grpo/run/setup_parts.load_samples split them); held-out capped at
    data.eval_size per task."""
    train: dict[str, list[Sample]] = {}
    heldout: dict[str, list[Sample]] = {}
    for s in train_list:
        train.setdefault(s.task, []).append(s)
    for s in held_list:
        if len(heldout.setdefault(s.task, [])) < data.eval_size:
            heldout[s.task].append(s)
    return train, heldout


def score(run: Run, rollouts: list[Rollout]) -> list[Scored]:
    scored, _ = score_rollouts(rollouts, run.specs, run.judge, run.graders)
    return scored


def sft_phase(run: Run) -> list[float]:
    """Completion-only SFT warm-up on the tasks' reference completions (skipped when sft.steps = 0)."""
    s = run.cfg.sft
    if s.steps == 0:
        return []
    examples = sft_examples(run.tokenizer, [x for t in run.tasks for x in run.train[t]], None, s.max_target_tokens)
    if s.max_examples:
        examples = stratified([x for t in run.tasks for x in run.train[t] if x.target], examples, s.max_examples)
    losses = run_sft(run.policy.model, examples, steps=s.steps, lr=s.lr, batch_size=s.batch_size,
                     params=run.policy.trainable_parameters(), pad_id=run.tokenizer.pad_token_id,
                     device=run.device, seed=run.cfg.train.seed,
                     progress=lambda it: progress(it, "SFT", enabled=run.dist.is_main), dist=run.dist)
    # RL is regularised towards the SFT model, not the pre-SFT one: rebase the reference, then rebuild the
    # optimizer (under LoRA the trainable parameters are new objects) and the guard.
    run.policy = rebase_reference(run.policy, seed=run.cfg.train.seed)
    fresh_optimizer(run)
    weights = reference_weights(run.policy, run.dist)  # a collective when sharded
    if run.dist.is_main:
        ckpt.save_reference(run.run_dir, weights)
    run.dist.barrier()
    run.tracker.log({"sft/loss_first": losses[0], "sft/loss_last": losses[-1]}, 0)
    return losses


FREE_FORM_CLASSES = 16
"""A task whose SFT targets fall into more answer classes than this answers in free form (HaluEval general's ChatGPT
replies, each its own class): `stratified` counts all its targets as one class."""


def stratified(samples: list[Sample], examples: list, n: int) -> list:
    """`n` of `examples` (parallel to `samples`), round-robin over (task, answer class) so that every answer of every
    task is demonstrated before any is repeated; the class is grpo.core.answers.answer_class of the target. A free-form
    task (more than FREE_FORM_CLASSES classes) is one class: else its answers, every one its own class, took every
    demonstration from the tasks with a few answers."""
    classes_per_task = Counter(task for task, _ in {(s.task, answer_class(s.target or "")) for s in samples})
    free_form = {task for task, n in classes_per_task.items() if n > FREE_FORM_CLASSES}
    groups: dict[tuple[str, str], list] = {}
    for sample, example in zip(samples, examples):
        key = (sample.task, "" if sample.task in free_form else answer_class(sample.target or ""))
        groups.setdefault(key, []).append(example)
    keys, picked, i = sorted(groups), [], 0
    while len(picked) < min(n, len(examples)):
        for key in keys:
            if i < len(groups[key]) and len(picked) < n:
                picked.append(groups[key][i])
        i += 1
    return picked


def reference_weights(policy: Policy, dist: Dist) -> dict[str, torch.Tensor]:
    """The weights that define the KL reference: the frozen copy (full FT) or the whole merged model (LoRA)."""
    return dist.full_state(policy.model if policy.is_lora else policy.ref_model)


def evaluate_phase(run: Run, tag: str) -> dict[str, float]:
    """Greedy held-out reward per task; recorded under `tag` (before_sft, after_sft, after_rl, step_N).
    Rank 0 evaluates; the other ranks wait for it and return {}. Sharded, every rank generates (each forward is a
    collective) and rank 0 alone scores and records."""
    dist = run.dist
    if not dist.is_main and not dist.sharded:
        dist.barrier()
        return {}
    scorer = (lambda rollouts: score(run, rollouts)) if dist.is_main else unscored
    results, scored = evaluate(run.policy.model, run.tokenizer, run.heldout, run.cfg.rollout, run.stop_ids, scorer,
                               synced_gpus=dist.sharded)
    dist.reshard(run.policy.model)
    offered = tag.startswith("step_") or tag == "after_rl"  # RL checkpoints compete for the Pareto frontier
    state = dist.full_state(run.policy.model) if dist.sharded and offered else None
    if not dist.is_main:
        dist.barrier()
        return {}
    run.evals[tag] = results
    (run.run_dir / "eval.json").write_text(json.dumps(run.evals, indent=2))
    write_scored(run.run_dir / "evals" / f"{tag}.jsonl", scored)  # the greedy completions and every grader's score
    means = part_means((s.rollout.sample.task, s.parts) for s in scored)
    parts = {f"eval_part/{t}/{name}": v for t, by_name in means.items() for name, v in by_name.items()}
    run.tracker.log({**{f"eval/{t}/reward": r for t, r in results.items()}, **parts}, run.step)
    if offered:
        run.frontier.offer(run.step, results, save_fn=lambda path: save_pretrained(run.policy, path, state))
    dist.barrier()
    return results


def unscored(rollouts: list[Rollout]) -> list[Scored]:
    """The scorer of the ranks that only help generate (sharded evaluation): no reward, no judge call."""
    return [Scored(rollout=r, reward=None) for r in rollouts]


def rl_step(run: Run, step: int) -> dict[str, float]:
    """One RL step: rollouts → rewards → group advantages → μ update passes → per-task β update."""
    cfg, dist, t0 = run.cfg, run.dist, time.perf_counter()
    # The step's GLOBAL batch is drawn identically on every rank; this rank generates its contiguous share.
    everyone = run.sampler.next_batch(cfg.prompts_per_step * dist.world)
    mine = dist.share(len(everyone))
    keys = (row_keys(cfg.train.seed, step, range(mine.start, mine.stop), cfg.rollout.k)
            if per_completion_sampling(cfg.rollout, dist) else None)
    # the system prompt (data.system_prompt) is already the first message of every sample
    rollouts, metrics = generate_rollouts(run.policy.model, run.tokenizer, everyone[mine], cfg.rollout, run.stop_ids,
                                          row_keys=keys, synced_gpus=dist.sharded)
    dist.reshard(run.policy.model)  # after every no-grad pass of a sharded model (see Dist.reshard)
    t1 = time.perf_counter()
    scored_mine, score_metrics = score_rollouts(rollouts, run.specs, run.judge, run.graders)
    scored = scored_mine
    if dist.active:  # metrics and group advantages over the global batch (groups never straddle ranks)
        scored = [s for part in dist.gather(scored_mine) for s in part]
        metrics = {**rollout_metrics([s.rollout for s in scored]),
                   "rollout/nonfinite_logit_rows": dist.sum_numbers([metrics["rollout/nonfinite_logit_rows"]])[0]}
        score_metrics = dict(zip(score_metrics, dist.sum_numbers(list(score_metrics.values()))))
    metrics.update(per_step_counts(run, score_metrics))
    rewards_B = torch.tensor([math.nan if s.reward is None else s.reward for s in scored], dtype=torch.float32)
    advantages_B, adv_metrics = group_advantages(rewards_B, cfg.rollout.k, scale=cfg.loss.adv_scale,
                                                 clip=cfg.loss.adv_clip)
    metrics.update(adv_metrics)
    metrics.update(reward_metrics(scored, run.tasks))
    metrics.update(step_answer_metrics([s.rollout.sample.task for s in scored], [s.rollout.text for s in scored],
                                       [s.reward for s in scored], cfg.rollout.k))  # what the doctor reads
    t2 = time.perf_counter()

    rows = slice(mine.start * cfg.rollout.k, mine.stop * cfg.rollout.k)
    batch = build_train_batch(scored_mine, advantages_B[rows], run.tasks, run.tokenizer.pad_token_id, run.device,
                              group_size=cfg.rollout.k if run.share_prompts else 1)
    if cfg.loss.mu > 1 and has_dropout(run.policy.model):
        # off-policy passes need the rollout policy's log-probs (eval mode: no dropout). At μ = 1 they equal the
        # current ones; without dropout the first pass computes them (train_step keeps them for the later passes)
        batch.old_logps_BT = batch_logprobs(run.policy.model, batch, run.micro_batch_seqs, cfg.rollout.temperature)
        dist.reshard(run.policy.model)
    t3 = time.perf_counter()
    if cfg.kl_enabled:
        with reference(run.policy) as ref_model:
            batch.ref_logps_BT = batch_logprobs(ref_model, batch, run.micro_batch_seqs, cfg.rollout.temperature)
            dist.reshard(ref_model)
    t4 = time.perf_counter()

    betas_N = torch.tensor([run.controllers[t].value for t in run.tasks], dtype=torch.float32)
    stats = update_with_oom_retry(run, batch, betas_N)
    metrics.update(stats)
    for t in run.tasks:
        metrics[f"beta/{t}"] = run.controllers[t].value  # the β this step trained with
        if f"kl/{t}" in stats:
            run.controllers[t].update(stats[f"kl/{t}"])
    skipped, restored = bool(stats["health/skipped"]), run.counters.pop("restored_now", 0) > 0
    metrics.update(run.guard.record(skipped=skipped, restored=restored, reason=bad_step_reason(
        skipped, restored, stats["health/grad_norm_max"], cfg.train.skip_grad_norm)))
    t5 = time.perf_counter()
    metrics.update({"step": step, "time/generate": t1 - t0, "time/reward": t2 - t1, "time/old_logps": t3 - t2,
                    "time/ref_logps": t4 - t3, "time/train": t5 - t4, "time/step": t5 - t0,
                    "lr": run.scheduler.get_last_lr()[0]})
    run.step = step
    metrics = {k: v if isinstance(v, (str, int)) else float(v) for k, v in metrics.items()}
    metrics.update(consult_doctor(run, metrics))
    run.tracker.log(metrics, step)
    if cfg.train.sample_every and step % cfg.train.sample_every == 0 and dist.is_main:
        write_samples(run, scored, step)
    return metrics


OOM_KNOBS = ("train.prompts_per_micro_step (smaller micro-batches, more grad_accum)", "model.gradient_checkpointing=true",
             "rollout.max_new_tokens", "model.load_in_4bit=true (QLoRA)", "rollout.k")


def train_update(run: Run, batch: TrainBatch, betas_N: torch.Tensor) -> dict[str, float]:
    """The μ update passes of one step (grpo/phases/update.train_step) with the run's settings: the loss section, the
    rollout temperature and length, the train section's gradient-norm limits, the run's micro-batch size."""
    cfg = run.cfg
    return train_step(run.train_model or run.policy.model, run.optimizer, batch, betas_N, cfg.loss, run.tasks,
                      run.policy.trainable_parameters(), micro_batch_seqs=run.micro_batch_seqs,
                      temperature=cfg.rollout.temperature, max_grad_norm=cfg.train.max_grad_norm,
                      skip_grad_norm=cfg.train.skip_grad_norm, agg_constant=float(cfg.rollout.max_new_tokens),
                      fused_head=cfg.model.fused_lm_head, on_step=lambda: after_optimizer_step(run),
                      grad_combiner=run.surgery, scaler=run.policy.grad_scaler, dist=run.dist)


def update_with_oom_retry(run: Run, batch: TrainBatch, betas_N: torch.Tensor) -> dict[str, float]:
    """The μ update passes; on CUDA out-of-memory, report and retry once with half the micro-batch size, which then
    stays the run's size (`run.micro_batch_seqs`) for every later pass: old log-probs, reference and training."""
    try:
        return {**train_update(run, batch, betas_N), "health/oom_retries": 0.0}
    except torch.OutOfMemoryError as e:
        run.optimizer.zero_grad(set_to_none=True)
        peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else float("nan")
        half = max(1, run.micro_batch_seqs // 2)
        print(f"CUDA out of memory in the update (peak allocated {peak:.1f} GiB): {str(e).splitlines()[0]}\n"
              f"  retrying this step once with micro-batch {half} sequences (was {run.micro_batch_seqs}).\n"
              f"  knobs that reduce memory: {'; '.join(OOM_KNOBS)}; see MEMORY_OPTIMIZATION.md and "
              "`python check_gpu_memory.py --estimate`", file=sys.stderr, flush=True)
        if half == run.micro_batch_seqs:
            raise
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # once, after an OOM, to give the retry the freed blocks
        run.micro_batch_seqs = half
        return {**train_update(run, batch, betas_N), "health/oom_retries": 1.0}


JUDGE_COUNTERS = ("judge/calls", "judge/failures", "judge/cache_hits", "judge/retries", "judge/items")


def per_step_counts(run: Run, metrics: dict[str, float]) -> dict[str, float]:
    """The judge keeps running totals; the step metrics report this step's share (health checks rate them)."""
    out = dict(metrics)
    for key in JUDGE_COUNTERS:
        if key in metrics:
            total = float(metrics[key])
            out[key] = total - run.counters.get(key, 0.0)
            out[key + "_total"] = total
            run.counters[key] = total
    return out


def after_optimizer_step(run: Run) -> None:
    """Scheduler step, then the weight guard: NaN/Inf weights are replaced by the last good copy. Sharded, each
    rank guards its shard and a bad shard anywhere restores every shard (the model stays one step)."""
    run.scheduler.step()
    if run.dist.sharded:
        bad = run.dist.any(not run.guard.all_finite())
        run.guard.restore() if bad else run.guard.snapshot()
    else:
        bad = run.guard.restore_if_bad()
    if bad:
        run.counters["restored_now"] = 1


def reward_metrics(scored: list[Scored], tasks: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for t in tasks:
        rs = [s.reward for s in scored if s.rollout.sample.task == t]
        valid = torch.tensor([r for r in rs if r is not None and not math.isnan(r)], dtype=torch.float64)
        if rs:
            out[f"reward/{t}/mean"] = valid.mean().item() if len(valid) else math.nan
            out[f"reward/{t}/std"] = valid.std(unbiased=False).item() if len(valid) else math.nan
            out[f"reward/{t}/failed"] = float(len(rs) - len(valid))
    return out


def write_scored(path: Path, scored: list[Scored]) -> None:
    """One JSON line per completion: task, id, prompt, completion, reward, its parts (per grader), provider."""
    path.parent.mkdir(exist_ok=True)
    with open(path, "w") as f:
        for s in scored:
            f.write(json.dumps({"task": s.rollout.sample.task, "id": s.rollout.sample.id,
                                "prompt": s.rollout.sample.messages[-1]["content"], "completion": s.rollout.text,
                                "reward": s.reward, "parts": s.parts, "provider": s.provider,
                                "truncated": s.rollout.truncated}) + "\n")


def write_samples(run: Run, scored: list[Scored], step: int) -> None:
    write_scored(run.run_dir / "samples" / f"step_{step:06d}.jsonl", scored)
    run.tracker.log_text("samples", "\n\n".join(f"[{s.rollout.sample.task}] {s.rollout.text!r} -> {s.reward}"
                                                 for s in scored[:8]), step)


def finish(run: Run) -> dict[str, Any]:
    """Save the final model, print the before/after table, write report.json and plot.png (rank 0)."""
    run.tracker.close()
    state = run.dist.full_state(run.policy.model) if run.dist.sharded else None  # a collective when sharded
    if not run.dist.is_main:
        return {}
    save_pretrained(run.policy, run.run_dir / "final", state)
    report = build_report(run.run_dir)
    best = run.frontier.best()
    if best is not None:  # the Pareto point with the best mean held-out score, and where its weights are
        report["pareto_best"] = {"step": best.step, "scores": best.scores, "path": str(best.path)}
        (run.run_dir / "report.json").write_text(json.dumps(report, indent=2, default=str))
    print(format_report(report))
    if best is not None:
        print(f"Pareto frontier: {len(run.frontier.points)} point(s); best by mean score: step {best.step} "
              f"{ {t: round(v, 3) for t, v in best.scores.items()} } -> {best.path}")
    try:
        plot_run(run.run_dir)
    except (OSError, ValueError, RuntimeError) as e:  # a plot must never lose a finished run
        print(f"warning: could not draw the plot: {e}")
    print(f"run folder: {run.run_dir}")
    return report


def main(cfg: C.Config, run: Run | None = None) -> Run:
    """The whole run: `setup` (unless `run` is one already set up, as `train` hands it in), evaluations, SFT, the
    RL loop with its evaluations and checkpoints, `finish`."""
    run = run if run is not None else setup(cfg)
    say = print if run.dist.is_main else (lambda *a, **k: None)  # one voice: rank 0
    say(banner(run))
    if cfg.checkpoint.resume:
        resume(run, cfg.checkpoint.resume)
    else:
        say("evaluating before SFT ...", evaluate_phase(run, "before_sft"))
        if cfg.sft.steps:
            sft_phase(run)
            say("evaluating after SFT ...", evaluate_phase(run, "after_sft"))
    start_doctor(run)
    for f in run.doctor.findings() if run.doctor is not None else []:  # after a resume: active at the checkpoint
        say(doctor_line(f, f"active since step {f.since}, before the resume"), flush=True)
    stop = StopRequest()
    with stop.installed():
        bar = progress(range(run.step + 1, cfg.train.max_steps + 1), "RL", enabled=run.dist.is_main)
        for step in bar:
            metrics = rl_step(run, step)
            if hasattr(bar, "set_postfix_str"):  # a tqdm bar on a terminal: per-task reward / KL / β in the postfix
                bar.set_postfix_str(" | ".join(
                    f"{t[:5]} r={metrics.get(f'reward/{t}/mean', math.nan):.2f} kl={metrics.get(f'kl/{t}', 0.0):.3f}"
                    f" β={metrics[f'beta/{t}']:.3f}" for t in run.tasks), refresh=False)
            elif step % cfg.train.log_every == 0:  # logs: one plain line per step
                say(format_step_line(metrics, run.tasks), flush=True)
            if cfg.train.eval_every and step % cfg.train.eval_every == 0 and step < cfg.train.max_steps:
                evaluate_phase(run, f"step_{step}")
            for f in run.alarms:
                say(doctor_line(f, f"step {step}"), flush=True)
            if doctor_stops(run):  # train.doctor=stop | restore and a red finding is active: on to the end of the run
                break
            if run.dist.any(stop.requested):  # every rank stops after the same step
                folder = save_checkpoint(run)
                say(f"\ninterrupted: checkpoint {folder} written. Resume with:\n  python grpo_train.py "
                      f"--preset {cfg.preset} --run-name {run.run_dir.name} --output-dir {cfg.train.output_dir} "
                      f"--resume auto [your other overrides]")
                run.tracker.close()
                return run
            if cfg.checkpoint.every and step % cfg.checkpoint.every == 0:
                save_checkpoint(run)
    if not run.finished:  # else resumed from the final checkpoint: evaluated and saved already
        evaluate_phase(run, "after_rl")
        run.finished = True
        save_checkpoint(run)
    finish(run)
    return run


def start_doctor(run: Run) -> None:
    """Start the run doctor on rank 0 and feed it what metrics.jsonl holds so far: the evaluations and the SFT loss
    before RL and, after a resume, the RL steps already run, so its windows and streaks go on where they were."""
    if not run.dist.is_main:
        return
    settings = C.to_dict(run.cfg)
    run.doctor = Doctor(kl_bands=kl_bands(settings, run.tasks), config=settings)
    if (run.run_dir / METRICS_FILE).is_file():
        run.doctor.replay(read_metrics(run.run_dir))


def consult_doctor(run: Run, metrics: dict[str, Any]) -> dict[str, float]:
    """Feed one RL step's metrics (and the held-out evaluations so far) to the doctor on rank 0; the findings that
    fired go to `run.alarms`. Returns doctor/<code> (1.0 while active) and doctor/red for the step's row; {} elsewhere."""
    if not run.dist.is_main:
        return {}
    if run.doctor is None:
        start_doctor(run)
    run.alarms = run.doctor.update(metrics, run.evals)
    return run.doctor.metrics()


def doctor_line(f: Finding, when: str) -> str:
    """A finding as the console shows it: level, code, when, what was seen, then the one next step."""
    return f"doctor: [{f.level}] {f.code} ({when}): {f.message}\n  -> {f.suggestion}"


def doctor_stops(run: Run) -> bool:
    """Whether RL ends after this step: train.doctor is stop or restore and a red finding is active. Rank 0 decides
    (it alone holds the doctor), every rank gets the same answer; under restore every rank first loads the best
    Pareto point's weights (`restore_best`)."""
    action = run.cfg.train.doctor
    if action == "warn":
        return False
    red = [f for f in run.doctor.findings() if f.level == "red"] if run.doctor is not None else []
    if not run.dist.any(bool(red)):
        return False
    say = print if run.dist.is_main else (lambda *a, **k: None)
    say(f"doctor: RL stopped after step {run.step} (train.doctor={action}): "
        + ", ".join(sorted({f.code for f in red})), flush=True)
    if action == "restore":
        folder = restore_best(run)
        say(f"doctor: weights restored from the best Pareto point {folder}" if folder is not None else
            "doctor: no Pareto point yet (no evaluation since RL started): the weights stay as they are", flush=True)
    return True


def restore_best(run: Run) -> Path | None:
    """Load the weights of the best Pareto point (best mean held-out score) into the policy in place, on every rank;
    returns its folder, or None when the frontier is empty (the weights stay). Rank 0 holds the frontier and names the
    folder; every rank reads it (the same file, as on resume). The weight guard's last good copy becomes these."""
    best = run.frontier.best() if run.dist.is_main else None
    where = run.dist.broadcast(None if best is None else str(best.path))
    if where is None:
        return None
    folder = Path(where)
    model = run.policy.model
    if run.policy.is_lora:  # the point is the adapter (save_pretrained of a PEFT model)
        from peft import set_peft_model_state_dict

        state = saved_weights(folder, "adapter_model")
        result = set_peft_model_state_dict(model, state)
        trainable = sum(p.requires_grad for p in model.parameters())
        if result.unexpected_keys or len(state) != trainable:
            raise ckpt.CheckpointError(f"Pareto point {folder} does not fit this adapter: {len(state)} tensors for "
                                       f"{trainable} trainable ones, unexpected {list(result.unexpected_keys)[:5]}")
    else:
        state = saved_weights(folder, "model")
        names = set(model.state_dict())
        missing, unexpected = names - set(state) - tied_names(model), set(state) - names
        if missing or unexpected:  # a tied output embedding is saved once, under the input embedding's name
            raise ckpt.CheckpointError(f"Pareto point {folder} does not fit this model: missing {sorted(missing)[:5]}, "
                                       f"unexpected {sorted(unexpected)[:5]}")
        run.dist.load_full_state(model, state, strict=False)
    run.guard.snapshot()
    return folder


def saved_weights(folder: Path, stem: str) -> dict[str, torch.Tensor]:
    """The tensors save_pretrained wrote into `folder` as STEM.safetensors, or as its shards (STEM.safetensors.index.json)."""
    from safetensors.torch import load_file

    index = folder / f"{stem}.safetensors.index.json"
    files = (sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file()
             else [f"{stem}.safetensors"])
    if not all((folder / name).is_file() for name in files):
        raise ckpt.CheckpointError(f"Pareto point {folder} has no {stem}.safetensors (or its shards): was it "
                                   "written by save_pretrained of this run?")
    return {k: v for name in files for k, v in load_file(str(folder / name)).items()}


def tied_names(model: torch.nn.Module) -> set[str]:
    """Parameter names that share their tensor with another name (tied input / output embeddings): every member of
    such a group, since save_pretrained keeps one of them."""
    groups: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    return {name for names in groups.values() if len(names) > 1 for name in names}


def checkpoint_state(run: Run, rng_ranks: list[dict[str, Any]] | None = None,
                     gathered: tuple[dict, dict] | None = None) -> dict[str, Any]:
    """Everything needed to continue the run bit-for-bit. `rng_ranks`: every rank's RNG state (rank order);
    `gathered`: (weights, optimizer state) gathered from the shards when sharded."""
    rng_ranks = rng_ranks or [ckpt.rng_state()]
    weights, optimizer = gathered or (ckpt.trainable_state(run.policy.model), run.optimizer.state_dict())
    return {"step": run.step, "weights": weights, "optimizer": optimizer, "scheduler": run.scheduler.state_dict(),
            "controllers": {t: c.state_dict() for t, c in run.controllers.items()},
            "sampler": run.sampler.state_dict(), "guard": run.guard.state_dict(), "evals": run.evals,
            "surgery": run.surgery.state_dict() if run.surgery is not None else None,
            "frontier": run.frontier.state_dict(), "counters": dict(run.counters), "rng": rng_ranks[0],
            "rng_ranks": rng_ranks, "metrics_rows": run.tracker.rows_logged, "finished": run.finished}


def save_checkpoint(run: Run) -> Path:
    """Rank 0 writes the checkpoint (weights are the same on every rank) with every rank's RNG state."""
    rng_ranks = run.dist.gather(ckpt.rng_state())
    gathered = None
    if run.dist.sharded:  # collectives: every rank takes part, rank 0 receives the whole state
        gathered = (run.dist.full_state(run.policy.model), run.dist.optimizer_state(run.policy.model, run.optimizer))
    folder = None
    if run.dist.is_main:
        folder = ckpt.save(run.run_dir, run.step, checkpoint_state(run, rng_ranks, gathered), C.to_dict(run.cfg),
                           run.cfg.checkpoint.keep_last)
    return run.dist.broadcast(folder)  # also a barrier: no rank goes on before the checkpoint is complete


def resume(run: Run, where: str) -> None:
    """Load the checkpoint `where` ("auto" = newest complete one of the run folder) into `run`."""
    folder = ckpt.resolve_resume(run.run_dir, where)
    trust = run.cfg.checkpoint.trust_pickle
    state, saved_cfg = ckpt.load(folder, trust_pickle=trust)
    diffs = ckpt.config_differences(saved_cfg, C.to_dict(run.cfg), config_defaults(run.cfg))
    if diffs:
        raise ckpt.CheckpointError(f"checkpoint {folder} was written with a different config:\n  "
                                   + "\n  ".join(diffs) + "\nresume with the same settings, or start a new run")
    ref = ckpt.load_reference(folder.parent.parent, trust_pickle=trust)  # the run the checkpoint belongs to
    if ref is not None:  # the run had an SFT warm-up: restore its reference (and, under LoRA, the merged base)
        run.dist.load_full_state(run.policy.model if run.policy.is_lora else run.policy.ref_model, ref)
        fresh_optimizer(run)
    if run.dist.sharded:
        run.dist.load_full_state(run.policy.model, state["weights"])
        run.dist.load_optimizer_state(run.policy.model, run.optimizer, state["optimizer"])
    else:
        ckpt.load_trainable_state(run.policy.model, state["weights"], folder)
        run.optimizer.load_state_dict(state["optimizer"])
    run.scheduler.load_state_dict(state["scheduler"])
    for t, c in run.controllers.items():
        c.load_state_dict(state["controllers"][t])
    run.sampler.load_state_dict(state["sampler"])
    run.guard.load_state_dict(state["guard"])
    if run.surgery is not None and state.get("surgery") is not None:
        run.surgery.load_state_dict(state["surgery"])
    run.frontier.load_state_dict(state["frontier"])
    if run.dist.is_main:
        run.frontier.remove_orphans()  # points saved after this checkpoint belong to the lost part of the run
    run.counters = dict(state.get("counters", {}))
    run.guard.snapshot()
    run.evals = state["evals"]
    run.step = state["step"]
    run.finished = bool(state.get("finished")) and run.step >= run.cfg.train.max_steps  # not when extended
    ckpt.set_rng_state(rank_rng_state(state, run.dist))
    if run.dist.is_main:
        run.tracker.resume_at(run.step, state.get("metrics_rows"))  # metrics.jsonl, csv, samples, TensorBoard
        print(f"resumed from {folder} at step {run.step}")
    run.dist.barrier()


def config_defaults(cfg: C.Config) -> dict[str, Any]:
    """Flat "section.field" -> dataclass default, for fields a checkpoint may predate (per-task KL included)."""
    flat: dict[str, Any] = {}
    for name, section in C.to_dict(C.Config()).items():
        if isinstance(section, dict) and name != "kl":
            flat.update({f"{name}.{k}": v for k, v in section.items()})
    for task in cfg.kl:
        flat.update({f"kl.{task}.{k}": v for k, v in dataclasses.asdict(C.TaskKLConfig()).items()})
    return flat


def banner(run: Run) -> str:
    cfg, p = run.cfg, run.policy
    n_train = sum(x.numel() for x in p.trainable_parameters())
    n_all = sum(x.numel() for x in p.model.parameters())
    lines = [f"grpo-dual | preset {cfg.preset} | run folder {run.run_dir}",
             f"model {cfg.model.name} on {run.device} ({next(p.model.parameters()).dtype}), "
             f"{'LoRA r=%d' % cfg.model.lora_r if cfg.model.lora else 'full fine-tuning'}, "
             f"trainable {n_train:,} of {n_all:,} parameters",
             f"batch: {cfg.train.prompts_per_micro_step} prompts x K {cfg.rollout.k} x GA {cfg.train.grad_accum} "
             + (f"x {run.dist.world} processes{' (FSDP full shard)' if run.dist.sharded else ''} "
                if run.dist.active else "")
             + f"= {cfg.seqs_per_step * run.dist.world} completions per step, {cfg.rollout.max_new_tokens} new "
             "tokens max",
             f"loss {cfg.loss.policy_loss}, agg {cfg.loss.agg_mode}, KL {cfg.loss.kl_estimator}, mu {cfg.loss.mu}, "
             f"clip [{1 - cfg.loss.clip_low:g}, {1 + cfg.loss.clip_high:g}]",
             "tasks: " + ", ".join(f"{t} ({len(run.train[t])} train / {len(run.heldout.get(t, []))} held out, "
                                   f"beta {cfg.kl_for(t).beta:g}, {cfg.kl_for(t).controller} controller"
                                   + (f" [{cfg.kl_for(t).band_low:g}, {cfg.kl_for(t).band_high:g}]"
                                      if cfg.kl_for(t).controller == "band" else "") + ")" for t in run.tasks)]
    if run.device.type == "cuda":  # what the estimator predicts for this config, next to what the card has
        try:
            peak = estimate(inputs_from_config(cfg)).peak_bytes / 2**30
            total = torch.cuda.get_device_properties(run.device).total_memory / 2**30
            lines.append(f"GPU {torch.cuda.get_device_name(run.device)}: {total:.0f} GiB; estimated peak {peak:.1f} GiB "
                         "(python check_gpu_memory.py --estimate for the breakdown)")
        except (ValueError, KeyError) as e:  # a model the estimator has no shape for
            lines.append(f"GPU memory estimate unavailable: {e}")
    return "\n".join(lines)


def train(config: C.Config | str | Sequence[str] | None = None, *,
          tasks: Mapping[str, C.TaskSourceConfig | Mapping[str, Any] | str | Path] | None = None,
          rewards: Mapping[str, Any] | None = None, model: str | tuple[Any, Any] | None = None,
          **sections: Mapping[str, Any]) -> Run:
    """The command line's run from Python (a notebook, a script): returns the finished Run, its `report` filled in.

        run = train(tasks={"qa": "qa.csv"}, rewards={"qa": [my_reward]}, train={"max_steps": 40})

    config:   a Config; a preset name ("demo", "custom", ...); or dotted overrides ["rollout.k=8", ...] on the
              preset; None = preset "custom" when `tasks` are given, else "demo".
    tasks:    {task: a tasks.<task> section as a TaskSourceConfig, a dict of its fields, or a path}.
    rewards:  {task: terms}; terms = "grader:weight,..." as in rewards.<task>, or a list of graders, each a
              function (per-row or TRL-style, no import path needed), a grader name, or a (grader, weight) pair.
    model:    a model name (model.name) or an already-loaded (model, tokenizer), trained in place.
    sections: a section's fields as a dict, e.g. train={"max_steps": 40}, rollout={"k": 8}.

    Errors are the command line's, raised instead of printed: ConfigError (config), DataFileError (data),
    GraderError (the reward preflight, before the model loads), ModelPackageMissing. For the phases one by one,
    call `setup`, `evaluate_phase`, `sft_phase`, `rl_step`, `finish` (notebooks/quickstart.ipynb)."""
    cfg, callables = python_config(config, tasks, rewards, model, sections)
    loaded = model if isinstance(model, tuple) else None
    if loaded is None:
        check_model_name(cfg.model.name)
        if cfg.model.load_in_4bit:
            check_4bit_available()
    run = main(cfg, setup(cfg, callables=callables, model=loaded))
    report = run.run_dir / "report.json"
    if report.is_file():
        run.report = json.loads(report.read_text())
    return run


def python_config(config: C.Config | str | Sequence[str] | None, tasks: Mapping[str, Any] | None,
                  rewards: Mapping[str, Any] | None, model: str | tuple[Any, Any] | None,
                  sections: Mapping[str, Mapping[str, Any]]) -> tuple[C.Config, dict[str, Callable[..., Any]]]:
    """`train`'s arguments as one checked Config and the reward functions by the names its rewards.<task> give
    them."""
    if isinstance(config, C.Config):
        tree = C.to_dict(config)
    else:
        preset = config if isinstance(config, str) else (CUSTOM_PRESET if tasks else "demo")
        overrides = list(config) if config is not None and not isinstance(config, str) else []
        tree = C.config_tree(preset, overrides)
    for name, fields in sections.items():
        if not isinstance(fields, Mapping):
            raise C.ConfigError(f"train(..., {name}=...) must be a dict of the section's fields, e.g. "
                                f"train(rollout={{'k': 8}}); got {fields!r}", field=name)
        tree[name] = {**tree.get(name, {}), **fields} if isinstance(tree.get(name), dict) else fields
    for task, source in (tasks or {}).items():
        tree["tasks"][task] = ({"path": str(source)} if isinstance(source, (str, Path)) else
                               dataclasses.asdict(source) if dataclasses.is_dataclass(source) else dict(source))
    callables: dict[str, Callable[..., Any]] = {}
    for task, terms in (rewards or {}).items():
        tree["rewards"][task] = reward_terms(task, terms, callables, set(tree.get("reward_models", {})))
    if isinstance(model, str):
        tree["model"]["name"] = model
    elif model is not None and not (isinstance(model, tuple) and len(model) == 2):
        raise C.ConfigError(f"train(model=...) takes a model name or a (model, tokenizer) pair; got "
                            f"{type(model).__name__}", field="model.name")
    elif model is not None:
        tree["model"]["name"] = getattr(model[0], "name_or_path", "") or f"python:{type(model[0]).__name__}"
    return check_config(C.from_dict(tree)), callables


def reward_terms(task: str, terms: Any, callables: dict[str, Callable[..., Any]], taken: set[str]) -> str:
    """A rewards.<task> entry from `train`'s rewards[task]: a spec string as it is, or a list of functions, grader
    names and (grader, weight) pairs; each function is entered in `callables` under a name of its own (its
    __name__, made unique, never a built-in grader's or a reward model's)."""
    from grpo.grading.graders import JUDGE_TERM
    from grpo.core.rewards import GRADERS

    if isinstance(terms, str):
        return terms
    out = []
    for item in [terms] if callable(terms) or isinstance(terms, tuple) else list(terms):
        grader, weight = item if isinstance(item, tuple) else (item, None)
        if callable(grader):
            base = re.sub(r"[^\w.-]", "_", getattr(grader, "__name__", type(grader).__name__)) or "reward"
            name, n = base, 1
            while (name in GRADERS or name == JUDGE_TERM or name in taken
                   or (name in callables and callables[name] is not grader)):
                n += 1
                name = f"{base}_{n}"
            callables[name] = grader
        elif isinstance(grader, str):
            name = grader
        else:
            raise C.ConfigError(f"train(rewards={{{task!r}: ...}}): {grader!r} is neither a function nor a grader "
                                "name", field=f"rewards.{task}")
        out.append(name if weight is None else f"{name}:{float(weight)!r}")
    if not out:
        raise C.ConfigError(f"train(rewards={{{task!r}: []}}): give at least one grader", field=f"rewards.{task}")
    return ",".join(out)


def graders_help() -> str:
    """The end of --help: the built-in graders a rewards.<task> term may name (grpo/grading/graders.py owns the list)."""
    from grpo.grading.graders import builtin_graders

    return ("\n\nBuilt-in graders for rewards.<task> (besides llm_judge, a reward_models name, package.module:function "
            "and path/to/file.py:function; docs/CUSTOM_TASKS.md):\n"
            + "\n".join(f"  {name}: {doc}" for name, doc in builtin_graders().items()))


def cli(argv: list[str]) -> int:
    """Parse argv into a Config (grpo/config/command_line.py) and run. Exit status: 0 done; 2 a config, data or grader error
    (found before the model loads); 1 a run failure."""
    try:
        cfg, args = parse_trainer_argv(argv, prog="grpo_train.py", description=__doc__, more_help=graders_help())
        check_config(cfg)
    except C.ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    if args.print_config:
        print(C.dumps(cfg))
        return 0
    try:
        check_model_name(cfg.model.name)  # a packaged model whose package is missing: one line, before any work
        if cfg.model.load_in_4bit:
            check_4bit_available()  # no bitsandbytes or no CUDA GPU: before the data, the run folder, the model
    except (ModelPackageMissing, C.ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        main(cfg)
    except (C.ConfigError, GraderError, DataFileError) as e:  # config, data, graders: found before the model loads
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (ckpt.CheckpointError, TrainingUnstable, FileNotFoundError, ValueError, KeyError) as e:
        # known failure modes get their message, not a traceback; the last checkpoint (if any) is intact
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    n_processes = requested_cpu_processes()  # reads the launcher's command line once
    if n_processes > 1:  # `accelerate launch --cpu --num_processes N` started only this one
        relaunch_on_cpu(n_processes, sys.argv[0], sys.argv[1:])
    sys.exit(cli(sys.argv[1:]))
