"""grpo-dual trainer: SFT warm-up, then GRPO / GSPO with per-task KL control. Read it top to bottom.

    python grpo_train.py                                   # the embedded offline demo (CPU, a few minutes)
    python grpo_train.py --preset llama3-8b-dual           # Llama-3-8B-Instruct + LoRA on BBQ + HaluEval
    python grpo_train.py --rollout.k 8 --set loss.mu=2     # any config field, dotted
    python grpo_train.py --help | --print-config
    grpo-dual ...                                          # the same, after `pip install .` (from any folder)

In Jupyter, call the same functions cell by cell: `run = setup(cfg)`, `sft_phase(run)`, `rl_step(run, step)`,
`evaluate_phase(run, "after_rl")`, `finish(run)`. Only this file sees the whole Config; modules get plain values.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from grpo.config import settings as C
from grpo.config.command_line import command_typed, parse_trainer_argv, smoke_test_note
from grpo.core.advantages import group_advantages, normalize_then_sum
from grpo.core.answers import step_answer_metrics
from grpo.core.dapo import fill_informative_groups, overlong_penalty
from grpo.core.entropy_control import AdaptiveEntropyCoef
from grpo.core.health import TrainingUnstable, bad_step_reason
from grpo.core.kl_control import controller_from_config
from grpo.core.losses import losses_help
from grpo.core.records import TrainBatch
from grpo.core.tool_calls import tool_metrics
from grpo.data.batching import TaskBalancedSampler, check_prompts_per_step
from grpo.grading.graders import graders_help, preflight, reward_logs, set_trainer_state, term_names
from grpo.grading.judge import Judge
from grpo.grading.scoring import (check_fallback_share, fallback_shares, per_step_counts, reward_metrics,
                                  score_rollouts, term_matrix)
from grpo.models.distributed import make_dist, relaunch_on_cpu, requested_cpu_processes
from grpo.models.modeling import check_4bit_available, has_dropout, rebase_reference, reference, save_pretrained
from grpo.models.pretrained import ModelPackageMissing, check_model_name
from grpo.models.sampling import row_keys
from grpo.phases.batch import batch_logprobs, build_train_batch
from grpo.phases.coverage import pass_at_k_eval
from grpo.phases.evaluate import evaluate, part_means, record_measures, unscored
from grpo.phases.rollout import rollout_metrics
from grpo.phases.sft import run_sft, sft_examples, stratified
from grpo.phases.environments import factory_spec, resolve_environment
from grpo.phases.tools import build_toolbox, resolve_tools, sample_rollouts, tool_specs
from grpo.phases.update import Learner, StepSettings, train_step
from grpo.run import checkpoint_files as ckpt
from grpo.run.api import python_config
from grpo.run.save_resume import check_resume, reference_weights, resume, save_checkpoint
from grpo.run.config_check import check_config
from grpo.run.console import banner, preset_note
from grpo.run.doctor_in_run import consult_doctor, doctor_line, doctor_stops, start_doctor
from grpo.run.pareto import RUN_SUBDIR as PARETO_SUBDIR, ParetoFrontier, require_heldout_rows
from grpo.run.plot import plot_run
from grpo.run.report import build_report, format_report
from grpo.run.fingerprints import input_fingerprints
from grpo.run.run_folder import discarded_if_unstarted, expand_home, prepare_run_dir, release_run_dir
from grpo.run.exits import USER_ERRORS, interrupted, user_error
from grpo.run.setup_parts import (build_trackers, check_sharding, check_task_entries, choose_device, fit_prompts,
                                  fresh_optimizer, load_samples, parse_task_mix, per_completion_sampling,
                                  policy_from_config, reward_specs, seed_everything, shares_prompts, split_by_task,
                                  stop_token_ids, with_epochs)
from grpo.run.signals import Interrupted, StopRequest, signals_raise
from grpo.run.state import Run
from grpo.run.trl_config import read_config_file
from grpo.run.tracking import NullTracker, format_step_line, progress, write_samples, write_scored


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
    run_dir = expand_home(cfg.train.output_dir) / name  # `~/runs` given where no shell expanded it
    rows = load_samples(cfg.data, cfg.train.seed, cfg.tasks, announce=dist.is_main)  # every rank loads, one speaks
    train, heldout = split_by_task(rows.train, rows.heldout, cfg.data, cap=False)  # capped by fit_prompts
    check_prompts_per_step(train, cfg.train.prompts_per_micro_step, cfg.train.grad_accum, dist.world)
    require_heldout_rows(train, heldout, cfg.data.heldout_fraction)  # every task is evaluated: stop now if not
    specs = reward_specs(cfg.data.source, cfg.rewards, sorted(train), custom=cfg.tasks,
                         aggregation=cfg.loss.reward_aggregation)
    check_task_entries(cfg.kl, sorted(train))
    # a tool or an environment that cannot be imported or described stops the run here
    tool_names = [t.name for t in resolve_tools(cfg.rollout.tools, callables)]
    environments = resolve_environment(cfg.rollout.environment_factory, callables, tool_names)  # None without
    # the judge's rubrics are tried without its cache, which lives in the run folder
    set_trainer_state(0, 0)  # a run in the same process (a notebook, a test) left its own: each run starts from none
    graders = preflight(specs, train, judge=Judge.from_config(dataclasses.replace(cfg.judge, cache_path=""), None),
                        callables=callables, reward_models=cfg.reward_models, device=device,
                        timeout_s=cfg.train.reward_timeout_s,
                        environment=environments.preflight if environments is not None else None)
    note = preset_note(cfg)
    if note and dist.is_main:
        print(note)
    made_here = not run_dir.exists() and not cfg.train.run_name  # named after this start's clock: a retry gets another
    if dist.is_main:  # before any expensive work: one run folder, one run (locked until the run ends)
        prepare_run_dir(run_dir, cfg.checkpoint.resume, cfg.train.overwrite)
    dist.barrier()
    with discarded_if_unstarted(run_dir, dist.is_main and made_here):  # a failed build leaves no empty folder
        inputs, resume_from = {}, None
        if dist.is_main:  # what the run starts with: a resume goes on only from the same, or names what changed
            inputs = input_fingerprints(cfg.data, cfg.tasks, rows.every, graders, term_names(specs))
            if cfg.checkpoint.resume:
                resume_from = check_resume(run_dir, cfg, inputs)
        resume_from = dist.broadcast(resume_from)
        # the builtin tokenizer learns from prompts and, separately, from completions exactly as they are generated
        # (right after the assistant marker, no leading space)
        corpus = [s.messages[-1]["content"] for s in rows.every] + [s.target for s in rows.every if s.target]
        policy = policy_from_config(cfg.model, device, corpus, seed=cfg.train.seed, loaded=model)
        train, heldout = fit_prompts(train, heldout, policy, cfg.data, cfg.rollout, dist.is_main)  # max_prompt_tokens
        cfg = with_epochs(cfg, train, dist.world, dist.is_main)  # train.num_epochs: the steps from the rows
        if policy.grad_scaler is not None and cfg.multi.combine != "sum":
            raise C.ConfigError(f"multi.combine={cfg.multi.combine!r} needs bf16 or fp32 weights: the per-task "
                                "gradients are not loss-scaled, so fp16 (this GPU has no bf16) would under- or "
                                "overflow; use multi.combine=sum or model.dtype=float32", field="multi.combine")
        if dist.sharded:  # FSDP2: the parameters become shards in place; the optimizer is built on them below
            check_sharding(cfg, policy, dist)
            dist.shard(policy.model)
            dist.shard(policy.ref_model)
        run = Run(cfg, run_dir, device, dist, policy, train, heldout)
        run.sampler = TaskBalancedSampler(run.train, seed=cfg.train.seed, mix=parse_task_mix(cfg.data.task_mix))
        run.controllers = {t: controller_from_config(cfg.kl_for(t)) for t in run.tasks}
        if cfg.loss.entropy_target is not None:
            run.entropy_control = AdaptiveEntropyCoef(cfg.loss.entropy_coef, cfg.loss.entropy_target,
                                                      cfg.loss.entropy_coef_delta, cfg.loss.entropy_coef_min,
                                                      cfg.loss.entropy_coef_max)
        run.specs, run.graders = specs, graders
        run.inputs, run.resume_from = inputs, resume_from
        run.judge = Judge.from_config(cfg.judge, run_dir)
        run.tracker = build_trackers(cfg.train, run_dir) if dist.is_main else NullTracker()
        run.stop_ids = stop_token_ids(cfg.rollout, policy.tokenizer)
        run.toolbox = build_toolbox(cfg.rollout, policy.tokenizer, callables, environments)  # rollout.tools; None without
        fresh_optimizer(run)
        run.share_prompts = shares_prompts(cfg, run.train_model, dist)
        run.frontier = ParetoFrontier(cfg.multi.pareto_cap, run_dir / PARETO_SUBDIR)
        if dist.is_main:
            (run_dir / "config.json").write_text(C.dumps(cfg))
        if dist.active and not per_completion_sampling(cfg.rollout, dist):
            torch.manual_seed(cfg.train.seed + 1_000_003 * dist.rank)  # ranks must not draw the same samples
        return run


def sft_phase(run: Run) -> list[float]:
    """Completion-only SFT warm-up on the tasks' reference completions (skipped when sft.steps = 0, and with one line
    saying so when no training row has a target: TRL-style prompt-only data)."""
    s = run.cfg.sft
    if s.steps == 0:
        return []
    system = run.toolbox.system_prompt if run.toolbox is not None else None  # the prompts the rollouts see
    examples = sft_examples(run.tokenizer, [x for t in run.tasks for x in run.train[t]], system, s.max_target_tokens)
    if not examples:
        if run.dist.is_main:
            print(f"SFT warm-up skipped: no training row of {', '.join(run.tasks)} has a target (the column "
                  "tasks.<task>.target_field names); sft.steps=0 says so up front")
        run.tracker.log({"sft/skipped": 1.0}, 0)  # the doctor then advises no warm-up
        return []
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


def evaluate_phase(run: Run, tag: str) -> dict[str, float]:
    """Greedy held-out reward per task; recorded under `tag` (before_sft, after_sft, after_rl, step_N).
    Rank 0 evaluates; the other ranks wait for it and return {}. Sharded, every rank generates (each forward is a
    collective) and rank 0 alone scores and records."""
    dist = run.dist
    if not dist.is_main and not dist.sharded:
        dist.barrier()
        return {}
    scorer = (lambda rollouts: score_rollouts(rollouts, run.specs, run.judge, run.graders)[0]) if dist.is_main \
        else unscored
    results, scored = evaluate(run.policy.model, run.tokenizer, run.heldout, run.cfg.rollout, run.stop_ids, scorer,
                               synced_gpus=dist.sharded, tools=run.toolbox)
    dist.reshard(run.policy.model)
    offered = tag.startswith("step_") or tag == "after_rl"  # RL checkpoints compete for the Pareto frontier
    state = dist.full_state(run.policy.model) if dist.sharded and offered else None
    if not dist.is_main:
        dist.barrier()
        return {}
    run.evals[tag] = results
    (run.run_dir / "eval.json").write_text(json.dumps(run.evals, indent=2))
    if measured := record_measures(run.measures, tag, scored):  # BBQ's bias scores, recognition balanced accuracy
        (run.run_dir / "measures.json").write_text(json.dumps(run.measures, indent=2))
    write_scored(run.run_dir / "evals" / f"{tag}.jsonl", scored)  # the greedy completions and every grader's score
    means = part_means((s.rollout.sample.task, s.parts) for s in scored)
    parts = {f"eval_part/{t}/{name}": v for t, by_name in means.items() for name, v in by_name.items()}
    run.tracker.log({**{f"eval/{t}/reward": r for t, r in results.items()}, **parts, **measured}, run.step)
    if offered:
        run.frontier.offer(run.step, results, save_fn=lambda path: save_pretrained(run.policy, path, state))
    dist.barrier()
    return results


def pass_at_k_phase(run: Run) -> dict[str, float]:
    """The pass@K diagnostic on the held-out prompts (train.pass_at_k; grpo/phases/coverage.py), logged at the
    current step and written to pass_at_k.json. One process only."""
    cfg = run.cfg
    if run.dist.active:
        raise RuntimeError("train.pass_at_k runs on one process; turn it off under several processes")
    if run.toolbox is not None:
        raise RuntimeError("train.pass_at_k samples single-turn completions; turn it off with rollout.tools")
    metrics = pass_at_k_eval(run.policy.model, run.tokenizer, run.heldout, cfg.rollout, run.stop_ids,
                             lambda rollouts: score_rollouts(rollouts, run.specs, run.judge, run.graders)[0],
                             k=cfg.train.pass_at_k, n=cfg.train.pass_at_k_samples,
                             threshold=cfg.train.pass_threshold, seed=cfg.train.seed)
    (run.run_dir / "pass_at_k.json").write_text(json.dumps(metrics, indent=2))
    run.tracker.log(metrics, run.step)
    return metrics


def rl_step(run: Run, step: int) -> dict[str, float]:
    """One RL step: rollouts → rewards → group advantages → μ update passes → per-task β update."""
    cfg, dist, t0 = run.cfg, run.dist, time.perf_counter()
    # The step's GLOBAL batch is drawn identically on every rank; this rank generates its contiguous share.
    everyone = run.sampler.next_batch(cfg.prompts_per_step * dist.world)
    mine = dist.share(len(everyone))
    keys = (row_keys(cfg.train.seed, step, range(mine.start, mine.stop), cfg.rollout.k)
            if per_completion_sampling(cfg.rollout, dist) else None)
    # the system prompt (data.system_prompt) is already the first message of every sample
    rollouts, metrics = sample_rollouts(run.policy.model, run.tokenizer, everyone[mine], cfg.rollout, run.stop_ids,
                                        tools=run.toolbox, row_keys=keys, synced_gpus=dist.sharded)
    dist.reshard(run.policy.model)  # after every no-grad pass of a sharded model (see Dist.reshard)
    t1 = time.perf_counter()
    set_trainer_state((step - 1) * cfg.loss.mu, cfg.total_updates)  # what TRL's trainer_state says to rewards
    scored_mine, score_metrics = score_rollouts(rollouts, run.specs, run.judge, run.graders)
    # What the policy replied to the step's prompts: the reward and answer metrics (the doctor's evidence) describe
    # these, also when dynamic sampling trains on a filtered batch (its kept groups have signal by construction, so a
    # task collapsed onto one answer would vanish from them)
    sampled, kl_only_rows = scored_mine, 0
    if cfg.train.dynamic_sampling:  # drop the groups without signal, refill them with more prompts
        scored_mine, more, kl_only_rows = refill_groups(run, step, scored_mine, score_metrics)
        metrics.update(more)
    scored = scored_mine
    if dist.active:  # metrics and group advantages over the global batch (groups never straddle ranks)
        scored = sampled = [s for part in dist.gather(scored_mine) for s in part]  # (dynamic sampling: one process)
        metrics = {**rollout_metrics([s.rollout for s in scored]),
                   "rollout/nonfinite_logit_rows": dist.sum_numbers([metrics["rollout/nonfinite_logit_rows"]])[0]}
        if run.toolbox is not None:
            metrics.update(tool_metrics([s.rollout.tool_use for s in scored], run.toolbox.names))
        score_metrics = dict(zip(score_metrics, dist.sum_numbers(list(score_metrics.values()))))
    metrics.update(per_step_counts(score_metrics, run.counters))
    metrics.update(reward_logs())  # what reward functions passed to TRL's log_metric this step
    rewards_B = torch.tensor([math.nan if s.reward is None else s.reward for s in scored], dtype=torch.float32)
    if cfg.loss.multi_objective_aggregation == "normalize_then_sum":  # GDPO: each term normalised in its group
        rewards_B = normalize_then_sum(*term_matrix(scored, run.specs), cfg.rollout.k)
    if cfg.rollout.overlong_buffer:  # DAPO's soft overlong punishment, on top of the graders' rewards
        penalty_B = overlong_penalty(torch.tensor([s.rollout.model_tokens for s in scored]),
                                     cfg.rollout.max_new_tokens, cfg.rollout.overlong_buffer,
                                     cfg.rollout.overlong_penalty_factor)
        rewards_B = rewards_B + penalty_B
        metrics["reward/overlong_penalty"] = float(penalty_B.mean())
    advantages_B, adv_metrics = group_advantages(rewards_B, cfg.rollout.k, scale=cfg.loss.adv_scale,
                                                 clip=cfg.loss.adv_clip)
    if kl_only_rows:  # train.dynamic_sampling_keep_kl: those groups carry their KL term only (an overlong penalty
        advantages_B[-kl_only_rows:] = 0.0  # could otherwise tell their completions apart)
    metrics.update(adv_metrics)
    metrics.update(reward_metrics(sampled, run.tasks))
    metrics.update(fallback_shares(sampled, run.specs))  # tasks whose judge has a fallback grader
    metrics.update(step_answer_metrics([s.rollout.sample.task for s in sampled], [s.rollout.text for s in sampled],
                                       [s.reward for s in sampled], cfg.rollout.k))  # what the doctor reads
    t2 = time.perf_counter()

    rows = slice(mine.start * cfg.rollout.k, mine.start * cfg.rollout.k + len(scored_mine))  # this rank's groups
    batch = build_train_batch(scored_mine, advantages_B[rows], run.tasks, run.tokenizer.pad_token_id, run.device,
                              group_size=cfg.rollout.k if run.share_prompts else 1,
                              mask_truncated=cfg.loss.mask_truncated)
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
    if run.entropy_control is not None:  # adaptive entropy control: the coefficient this step used, then the update
        metrics["loss/entropy_coef"] = run.entropy_control.value
        run.entropy_control.update(stats.get("entropy/all", math.nan))  # absent: no token trained
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
    check_fallback_share(metrics, cfg.judge.max_fallback_share, step)  # after the step is logged
    if cfg.train.sample_every and step % cfg.train.sample_every == 0 and dist.is_main:
        write_samples(run.run_dir, run.tracker, scored, step)
    return metrics


def refill_groups(run: Run, step: int, scored: list, score_metrics: dict[str, float]) -> tuple[list, dict, int]:
    """Dynamic sampling (train.dynamic_sampling): keep the step's groups whose rewards differ, and generate and score
    groups of fresh prompts (prompts_per_step a round, at most train.dynamic_sampling_max_rounds rounds) until the
    step has prompts_per_step of them (grpo/core/dapo.fill_informative_groups). The extra rounds' scoring counts go
    into `score_metrics`; the rollout/ metrics stay round 0's, and rollout/<task>/dynamic_kept_groups counts each
    task's kept groups: a task whose prompts all get one reward (collapsed onto one answer, or solved) keeps none and
    then gets neither a policy gradient nor a KL term that step — unless train.dynamic_sampling_keep_kl, which appends
    that task's round-0 groups for their KL term. Returns (the groups to train on, metrics, how many rows at the end
    are KL-only: their advantages are set to 0)."""
    cfg = run.cfg
    if run.dist.active:
        raise RuntimeError("train.dynamic_sampling runs on one process: the ranks would need different numbers of "
                           "generation rounds; turn it off under several processes")

    def produce(round_: int) -> list:
        if round_ == 0:
            return scored
        samples = run.sampler.next_batch(cfg.prompts_per_step)
        keys = (row_keys(cfg.train.seed, step, range(round_ * len(samples), (round_ + 1) * len(samples)),
                         cfg.rollout.k) if per_completion_sampling(cfg.rollout, run.dist) else None)
        rollouts, _ = sample_rollouts(run.policy.model, run.tokenizer, samples, cfg.rollout, run.stop_ids,
                                      tools=run.toolbox, row_keys=keys)
        more, counts = score_rollouts(rollouts, run.specs, run.judge, run.graders)
        for key, value in counts.items():  # scoring/* count this batch; the judge/* counters are cumulative
            score_metrics[key] = score_metrics.get(key, 0) + value if key.startswith("scoring/") else value
        return more

    kept, metrics = fill_informative_groups(produce, lambda s: s.reward, cfg.rollout.k, cfg.prompts_per_step,
                                            cfg.train.dynamic_sampling_max_rounds)
    trained = Counter(s.rollout.sample.task for s in kept) if metrics["rollout/dynamic_kept_groups"] else Counter()
    for task in run.tasks:  # 0: the task trains on nothing this step (but see dynamic_sampling_keep_kl)
        metrics[f"rollout/{task}/dynamic_kept_groups"] = float(trained[task] // cfg.rollout.k)
    kl_only = []
    if cfg.train.dynamic_sampling_keep_kl and trained:  # (nothing kept at all: round 0 came back whole anyway)
        starved = {t for t in run.tasks if not trained[t]}
        kl_only = [s for s in scored if s.rollout.sample.task in starved]
    metrics["rollout/dynamic_kl_only_groups"] = float(len(kl_only) // cfg.rollout.k)
    return kept + kl_only, metrics, len(kl_only)


OOM_KNOBS = ("train.prompts_per_micro_step (smaller micro-batches, more grad_accum)", "model.gradient_checkpointing=true",
             "rollout.max_new_tokens", "model.load_in_4bit=true (QLoRA)", "rollout.k")


def train_update(run: Run, batch: TrainBatch, betas_N: torch.Tensor) -> dict[str, float]:
    """The μ update passes of one step (grpo/phases/update.train_step) with the run's settings: the loss section, the
    rollout temperature and length, the train section's gradient-norm limits, the run's micro-batch size."""
    cfg = run.cfg
    learner = Learner(run.train_model or run.policy.model, run.optimizer, run.policy.trainable_parameters(),
                      on_step=lambda: after_optimizer_step(run), grad_combiner=run.surgery,
                      scaler=run.policy.grad_scaler, dist=run.dist)
    settings = StepSettings(micro_batch_seqs=run.micro_batch_seqs, temperature=cfg.rollout.temperature,
                            max_grad_norm=cfg.train.max_grad_norm, skip_grad_norm=cfg.train.skip_grad_norm,
                            agg_constant=float(cfg.rollout.max_new_tokens), fused_head=cfg.model.fused_lm_head,
                            entropy_coef=None if run.entropy_control is None else run.entropy_control.value)
    return train_step(learner, batch, betas_N, cfg.loss, run.tasks, settings)


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


def finish(run: Run) -> dict[str, Any]:
    """Save the final model, print the before/after table, write report.json and plot.png (rank 0); the run folder's
    lock is released."""
    run.tracker.close()
    state = run.dist.full_state(run.policy.model) if run.dist.sharded else None  # a collective when sharded
    if not run.dist.is_main:
        return {}
    save_pretrained(run.policy, run.run_dir / "final", state)
    report = build_report(run.run_dir)  # its pareto_best: the frontier's index, as run.frontier wrote it
    print(format_report(report))
    best = report.get("pareto_best")
    if best is not None:
        print(f"Pareto frontier: {len(run.frontier.points)} point(s); best by mean score: step {best['step']} "
              f"{ {t: round(v, 3) for t, v in best['scores'].items()} } -> {best['path']}")
    try:
        plot_run(run.run_dir)
    except (OSError, ValueError, RuntimeError) as e:  # a plot must never lose a finished run
        print(f"warning: could not draw the plot: {e}")
    print(f"run folder: {run.run_dir}")
    release_run_dir(run.run_dir)
    return report


def main(cfg: C.Config, run: Run | None = None) -> Run:
    """The whole run: `setup` (unless `run` is one already set up, as `train` hands it in), evaluations, SFT, the
    RL loop with its evaluations and checkpoints, `finish`."""
    run = run if run is not None else setup(cfg)
    cfg = run.cfg  # as set up: train.num_epochs counted into train.max_steps
    say = print if run.dist.is_main else (lambda *a, **k: None)  # one voice: rank 0
    say(banner(run))
    if cfg.checkpoint.resume:
        resume(run, str(run.resume_from or cfg.checkpoint.resume))
    else:
        say("evaluating before SFT ...", evaluate_phase(run, "before_sft"))
        if cfg.sft.steps and sft_phase(run):
            say("evaluating after SFT ...", evaluate_phase(run, "after_sft"))
        if cfg.train.pass_at_k:
            say(f"pass@{cfg.train.pass_at_k} before RL ...", pass_at_k_phase(run))
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
                run.stopped_by = stop.signum
                say(f"\ninterrupted: checkpoint {folder} written. Resume with:\n  python grpo_train.py "
                      f"--preset {cfg.preset} --run-name {run.run_dir.name} --output-dir {cfg.train.output_dir} "
                      f"--resume auto [your other overrides]")
                run.tracker.close()
                release_run_dir(run.run_dir)
                return run
            if cfg.checkpoint.every and step % cfg.checkpoint.every == 0:
                save_checkpoint(run)
    if not run.finished:  # else resumed from the final checkpoint: evaluated and saved already
        evaluate_phase(run, "after_rl")
        run.finished = True
        save_checkpoint(run)
    finish(run)
    return run


def train(config: C.Config | str | Sequence[str] | None = None, *,
          tasks: Mapping[str, Any] | None = None, rewards: Mapping[str, Any] | None = None,
          model: Any = None, processing_class: Any = None, peft_config: Any = None, args: Any = None,
          tools: Sequence[Callable[..., Any] | str] | None = None,
          environment_factory: Callable[[], Any] | str | None = None, **sections: Mapping[str, Any]) -> Run:
    """The command line's run from Python (a notebook, a script): returns the finished Run, its `report` filled in.

        run = train(tasks={"qa": "qa.csv"}, rewards={"qa": [my_reward]}, train={"max_steps": 40})
        run = train(tasks={"caps": Dataset.from_list(rows)}, rewards={"caps": [reward_len]},
                    model=model, processing_class=tokenizer, peft_config=LoraConfig(r=16, target_modules=[...]))

    config:   a Config; a preset name ("demo", "custom", ...); or dotted overrides ["rollout.k=8", ...] on the
              preset; None = preset "custom" when `tasks` are given, else "demo".
    tasks:    {task: a path; a TaskSourceConfig or a dict of its fields; or rows in memory: a datasets Dataset, a
              DatasetDict ("train", held-out from "test" / "validation" / "eval"), a pandas DataFrame or a list of
              dicts, in TRL's standard (prompt) or conversational (list of messages) form}.
    rewards:  {task: terms}; terms = "grader:weight,..." as in rewards.<task>, or a list of graders, each a
              function (per-row or TRL-style, no import path needed), a grader name, or a (grader, weight) pair.
    model:    a model name (model.name); an already-loaded model with `processing_class` its tokenizer; or a
              (model, tokenizer) pair. A loaded model is trained in place.
    peft_config: a peft LoraConfig: its r, lora_alpha, lora_dropout and target_modules become model.lora_*.
    args:     a TRL GRPOConfig (or a dict of its fields): the whole configuration, as in TRL, its defaults included
              (learning_rate -> train.lr, num_generations -> rollout.k, ...; docs/TRL.md); a field it cannot honour is
              refused or named; reward_weights weigh each task's list of reward functions.
    tools:    functions the model may call in multi-turn rollouts (TRL's tools=[...]), described by their signature
              and docstring, or "module:function" strings; added to rollout.tools (grpo/phases/tools.py).
    environment_factory: a stateful task's environment (TRL's environment_factory): a class or function making one
              per trajectory, `reset(**row)` at its start, its public methods tools, reward functions get
              `environments` (rollout.environment_factory; grpo/phases/environments.py).
    sections: a section's fields as a dict, e.g. train={"max_steps": 40}, rollout={"k": 8}.

    Errors are the command line's, raised instead of printed: ConfigError (config), DataFileError (data),
    GraderError (the reward preflight, before the model loads), ModelPackageMissing. For the phases one by one,
    call `setup`, `evaluate_phase`, `sft_phase`, `rl_step`, `finish` (notebooks/quickstart.ipynb)."""
    if processing_class is not None:
        if model is None or isinstance(model, (str, tuple)):
            raise C.ConfigError("train(processing_class=...) goes with a loaded model: model=<the model>",
                                field="model.name")
        model = (model, processing_class)
    elif model is not None and not isinstance(model, (str, tuple)):
        raise C.ConfigError(f"train(model=<a loaded {type(model).__name__}>) needs its tokenizer: pass "
                            "processing_class=tokenizer (or model=(model, tokenizer))", field="model.name")
    cfg, callables = python_config(config, tasks, rewards, model, sections, peft_config, trl_args=args)
    if tools:  # rollout.tools names them: "module:function" when importable, else by name with the function handed in
        specs, tool_fns = tool_specs(tools)
        cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, tools=[*cfg.rollout.tools, *specs]))
        callables = {**callables, **tool_fns}
    if environment_factory is not None:  # rollout.environment_factory, named as the tools are
        spec, env_fns = factory_spec(environment_factory)
        cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, environment_factory=spec))
        callables = {**callables, **env_fns}
    loaded = model if isinstance(model, tuple) else None
    if loaded is None:
        check_model_name(cfg.model.name)
        if cfg.model.load_in_4bit:
            check_4bit_available()
    run = setup(cfg, callables=callables, model=loaded)
    try:
        main(cfg, run)
    finally:  # also after a failure: the same train(...) may run again at once, another process too
        release_run_dir(run.run_dir)
    report = run.run_dir / "report.json"
    if report.is_file():
        run.report = json.loads(report.read_text())
    return run


def cli(argv: list[str]) -> int:
    """Parse argv into a Config (grpo/config/command_line.py) and run. Exit status: 0 done; 2 an error of the input
    found while setting up (config, data, graders, judge, run folder, model.name); 1 a run failure; 130 / 143 stopped
    by SIGINT / SIGTERM (grpo/run/exits.py)."""
    try:
        cfg, args = parse_trainer_argv(argv, prog=command_typed(), description=__doc__,
                                       more_help=losses_help() + graders_help(), read_file=read_config_file)
        check_config(cfg)
    except C.ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    if note := smoke_test_note(argv, cfg):  # --max-steps 3 on a preset with a long warm-up: say what still runs
        print(note, file=sys.stderr)
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
    with signals_raise():  # Ctrl-C / SIGTERM before or after the RL loop: a message and 130 / 143
        try:
            run = setup(cfg)  # data, graders, judge, run folder, model: what fails here is the user's input
        except ckpt.CheckpointError as e:  # a resume that cannot go on, named before the model loads
            return user_error(e, 1)  # exits as a checkpoint error found later did
        except USER_ERRORS as e:
            return user_error(e, 2)
        except (Interrupted, KeyboardInterrupt) as e:
            return interrupted(e, "during set-up")
        try:
            main(cfg, run)
        except (*USER_ERRORS, ckpt.CheckpointError, TrainingUnstable) as e:
            return user_error(e, 1)  # known failure modes get their message; the last checkpoint (if any) is intact
        except (Interrupted, KeyboardInterrupt) as e:
            return interrupted(e, f"in {run.run_dir}")
        finally:
            release_run_dir(run.run_dir)  # the run folder's lock (a no-op once `finish` released it)
        run.dist.close()  # every rank got here: they leave together (Dist.close)
    return 128 + run.stopped_by if run.stopped_by else 0


def command() -> int:
    """`python grpo_train.py ...` and the installed `grpo-dual ...` command: the command line of this process."""
    n_processes = requested_cpu_processes()  # reads the launcher's command line once
    if n_processes > 1:  # `accelerate launch --cpu --num_processes N` started only this one
        relaunch_on_cpu(n_processes, sys.argv[0], sys.argv[1:])
    return cli(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(command())
