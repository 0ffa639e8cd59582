"""The three owners of an RL step, each built once by `grpo_train.setup` and holding its own state.

    Generation  the policy, stop ids, sampling settings, the toolbox, the prompt sampler and this process's share of
                each step's prompts, the per-completion sampling keys, dynamic sampling's refill rounds
    Rewarder    the reward specs, graders and judge; reward aggregation (normalize_then_sum), DAPO's overlong shaping,
                group advantages, the reward / answer / fallback metrics, the gather across processes
    Updater     optimizer, scheduler, weight guard, gradient surgery, the β controllers and the entropy controller,
                the micro-batch size and the out-of-memory retry, the old-log-prob and reference passes

`grpo_train.rl_step` passes records between them (Rollout -> Scored -> Rewarded -> TrainBatch -> metrics) and times
each phase with a `StepTimer` (grpo/run/tracking.py). The owners' state is what a checkpoint saves
(grpo/run/checkpoint/save_resume.py), under the same keys.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import torch

from grpo import config as C
from grpo.core.advantages import MULTI_OBJECTIVE_AGGREGATIONS, group_advantages
from grpo.core.answer_metrics import step_answer_metrics
from grpo.core.dapo import fill_informative_groups, kl_only_advantages, overlong_penalty
from grpo.core.entropy_control import AdaptiveEntropyCoef
from grpo.core.gradient_surgery import ConflictMonitor
from grpo.core.kl_control import Controller, controller_from_config
from grpo.core.step_types import Rollout, Sample, Scored, TrainBatch
from grpo.core.tool_calls import tool_metrics
from grpo.core.weight_guard import WeightGuard, bad_step_reason
from grpo.data.batching import TaskBalancedSampler
from grpo.decoding.graph_decode import GRAPH_COUNTS, graph_counts, release_graph_slots
from grpo.decoding.sampling import row_keys
from grpo.grading.graders import Grader, reward_logs, set_trainer_state
from grpo.grading.judge import Judge
from grpo.grading.scoring import (
    RewardSpec,
    check_fallback_share,
    fallback_shares,
    metric_names,
    per_step_counts,
    reward_metrics,
    score_rollouts,
    term_matrix,
)
from grpo.machine.distributed import Dist
from grpo.models.logprobs import shared_prompt_blocker, shares_by_size
from grpo.models.modeling import Policy, has_dropout, rebase_reference, reference
from grpo.phases.batch import batch_logprobs, build_train_batch
from grpo.phases.generate import SamplingPlan, generate_rollouts, rollout_metrics
from grpo.phases.tools import ToolBox, tool_rollouts
from grpo.phases.update import Learner, StepSettings, TaskGradientSurgery, adamw, update_passes


def completion_share(n_prompts: int, k: int, world: int, rank: int) -> range:
    """`rank`'s contiguous share of the n_prompts x k completions of a step, prompt-major (prompt i's sample j is row
    i·k + j): the rows TRL's RepeatSampler (each prompt repeated k times in a row) hands that process."""
    total = n_prompts * k
    if total % world:
        raise ValueError(f"{n_prompts} prompts x K {k} = {total} completions cannot be split evenly over {world} "
                         "processes")
    per = total // world
    return range(rank * per, (rank + 1) * per)


def prompt_copies(cfg: C.Config, world: int) -> int:
    """How many times a step draws prompts_per_step prompts: once per process, or once for all of them when
    train.split_groups shares out the completions (which must then split evenly; a shared prompt forward needs whole
    groups). Checked at set-up, before the model loads."""
    if not cfg.train.split_groups or world == 1:
        return world
    if cfg.seqs_per_step % world:
        raise C.ConfigError(f"train.split_groups: the step's {cfg.prompts_per_step} prompts x K {cfg.rollout.k} = "
                            f"{cfg.seqs_per_step} completions cannot be split evenly over {world} processes; make "
                            f"train.prompts_per_micro_step x train.grad_accum x rollout.k a multiple of {world}",
                            field="train.split_groups")
    if cfg.model.shared_prompt_forward == "on":
        raise C.ConfigError("model.shared_prompt_forward=on encodes a prompt once for its whole group, and with "
                            "train.split_groups a group may span processes: use auto (off then) or off",
                            field="model.shared_prompt_forward")
    return 1


class Generation:
    """The generation side: which prompts this process rolls out at a step, and their K completions each."""

    def __init__(self, policy: Policy, rollout: C.RolloutConfig, dist: Dist, sampler: TaskBalancedSampler,
                 stop_ids: tuple[int, ...], toolbox: ToolBox | None, *, prompts_per_step: int, train: C.TrainConfig):
        self.policy, self.rollout, self.dist, self.sampler = policy, rollout, dist, sampler
        self.stop_ids = stop_ids
        """Token ids that end a completion: the end-of-turn / EOS token and rollout.stop_strings, resolved once."""
        self.toolbox = toolbox
        """The tools of multi-turn rollouts (rollout.tools; grpo/phases/tools.py), or None: single-turn."""
        self.prompts_per_step, self.train = prompts_per_step, train
        self.per_completion = per_completion_sampling(rollout, dist)
        """Each completion draws from its own stream, keyed by (seed, step, prompt, sample): what it samples does
        not depend on which process generates it, nor on its batch (rollout.sampling_rng)."""
        self.graph_seen: dict[str, int] = {}
        """The graph engine's running counts (compiles, captures, fallbacks) when the last step reported them."""

    def keys(self, step: int, prompts: range) -> list[int] | None:
        """The per-completion sampling keys of `prompts` (indices into the step's global batch), or None."""
        return row_keys(self.train.seed, step, prompts, self.rollout.k) if self.per_completion else None

    @property
    def split(self) -> bool:
        """The step's completions, not its prompts, are shared out: a group may span processes (train.split_groups)."""
        return self.train.split_groups and self.dist.active

    def prompts(self, step: int, round_: int = 0) -> tuple[list[Sample], SamplingPlan]:
        """The samples this process rolls out and how. Round 0: the step's GLOBAL batch is drawn identically on every
        process, and this one takes its contiguous share of its prompts or (train.split_groups) of its completions,
        prompt-major: prompt i's sample j is row i·K + j. A later round (dynamic sampling, one process) draws
        prompts_per_step fresh prompts, with the keys of the prompts after the earlier rounds'."""
        if round_:
            samples = self.sampler.next_batch(self.prompts_per_step)
            n = len(samples)
            return samples, SamplingPlan(row_keys=self.keys(step, range(round_ * n, (round_ + 1) * n)))
        if not self.split:
            everyone = self.sampler.next_batch(self.prompts_per_step * self.dist.world)
            mine = self.dist.share(len(everyone))
            return everyone[mine], SamplingPlan(row_keys=self.keys(step, range(mine.start, mine.stop)))
        everyone, k = self.sampler.next_batch(self.prompts_per_step), self.rollout.k
        rows = completion_share(len(everyone), k, self.dist.world, self.dist.rank)
        keys = self.keys(step, range(len(everyone)))
        return ([everyone[row // k] for row in rows],
                SamplingPlan(per_sample=1, row_keys=None if keys is None else keys[rows.start:rows.stop]))

    def generate(self, step: int, round_: int = 0) -> tuple[list[Rollout], dict[str, float]]:
        """This process's rollouts of the step (`prompts`) and their rollout/ metrics: single-turn by
        grpo/phases/generate.generate_rollouts, with tools by grpo/phases/tools.tool_rollouts. The system prompt
        (data.system_prompt) is already the first message of every sample."""
        samples, plan = self.prompts(step, round_)
        model, tokenizer = self.policy.model, self.policy.tokenizer
        if self.toolbox is None:
            out = generate_rollouts(model, tokenizer, samples, self.rollout, self.stop_ids, plan=plan,
                                    synced_gpus=self.dist.sharded)
        else:
            out = tool_rollouts(model, tokenizer, samples, self.rollout, self.stop_ids, tools=self.toolbox, plan=plan,
                                synced_gpus=self.dist.sharded)
        self.dist.reshard(model)  # after every no-grad pass of a sharded model (see Dist.reshard)
        if round_ == 0:
            out[1].update(self.graph_metrics())
        return out

    def graph_metrics(self) -> dict[str, float]:
        """rollout/graph_compiles, _captures, _recaptures, _fallbacks: what the graph engine did since the last step
        reported it (this step's rollouts, and the evaluations and extra rounds before them); none when it never
        decoded."""
        counts = graph_counts(self.policy.model)
        if not counts:
            return {}
        seen, self.graph_seen = self.graph_seen, counts
        return {f"rollout/graph_{what}": float(counts[what] - seen.get(what, 0)) for what in GRAPH_COUNTS}

    def refill(self, step: int, scored: list[Scored], counts: dict[str, float],
               score: Callable[[list[Rollout]], tuple[list[Scored], dict[str, float]]],
               ) -> tuple[list[Scored], dict[str, float], int]:
        """Dynamic sampling (train.dynamic_sampling): keep the step's groups whose rewards differ, and generate and
        score groups of fresh prompts (prompts_per_step a round, at most train.dynamic_sampling_max_rounds rounds)
        until the step has prompts_per_step of them (grpo/core/dapo.fill_informative_groups). The extra rounds'
        scoring counts go into `counts`; the rollout/ metrics stay round 0's, and rollout/<task>/dynamic_kept_groups
        counts each task's kept groups: a task whose prompts all get one reward keeps none and then gets neither a
        policy gradient nor a KL term that step — unless train.dynamic_sampling_keep_kl, which appends that task's
        round-0 groups for their KL term. Returns (the groups to train on, metrics, how many rows at the end are
        KL-only: their advantages are set to 0)."""
        if self.dist.active:
            raise RuntimeError("train.dynamic_sampling runs on one process: the ranks would need different numbers "
                               "of generation rounds; turn it off under several processes")
        k, target = self.rollout.k, self.prompts_per_step

        def produce(round_: int) -> list[Scored]:
            if round_ == 0:
                return scored
            rollouts, _ = self.generate(step, round_)
            more, extra = score(rollouts)
            for key, value in extra.items():  # scoring/* count this batch; the judge/* counters are cumulative
                counts[key] = counts.get(key, 0) + value if key.startswith("scoring/") else value
            return more

        kept, metrics = fill_informative_groups(produce, lambda s: s.reward, k, target,
                                                self.train.dynamic_sampling_max_rounds)
        trained = Counter(s.rollout.sample.task for s in kept) if metrics["rollout/dynamic_kept_groups"] else Counter()
        tasks = sorted(self.sampler.tasks)
        for task in tasks:  # 0: the task trains on nothing this step (but see dynamic_sampling_keep_kl)
            metrics[f"rollout/{task}/dynamic_kept_groups"] = float(trained[task] // k)
        kl_only = []
        if self.train.dynamic_sampling_keep_kl and trained:  # (nothing kept at all: round 0 came back whole anyway)
            starved = {t for t in tasks if not trained[t]}
            kl_only = [s for s in scored if s.rollout.sample.task in starved]
        metrics["rollout/dynamic_kl_only_groups"] = float(len(kl_only) // k)
        return kept + kl_only, metrics, len(kl_only)


@dataclass
class Rewarded:
    """A step's scored rollouts with their advantages, as the update needs them and the log reports them."""

    rows: list[Scored]
    """This process's rows to train on, in order."""
    advantages_B: torch.Tensor
    """Their advantages (computed over the global batch's groups)."""
    everyone: list[Scored]
    """Every process's rows to train on (the samples written to samples/)."""
    metrics: dict[str, Any]
    """rollout/ (over the global batch), scoring / judge counts, reward/, adv/, answer metrics."""


class Rewarder:
    """The reward side: rewards of the step's completions, their aggregation and shaping, group advantages."""

    def __init__(self, specs: dict[str, RewardSpec], graders: dict[str, Grader], judge: Judge | None,
                 tasks: list[str], dist: Dist, *, rollout: C.RolloutConfig, loss: C.LossConfig,
                 tool_names: list[str] | None, total_updates: int):
        self.specs = specs
        """The reward terms of each task (rewards.<task>, else the source's defaults)."""
        self.graders = graders
        """Every reward term's grader by name, resolved and tried on a real row by `preflight` before the model
        loaded (a reward model is loaded there, once)."""
        self.judge = judge
        """The LLM judge (judge.base_url), or None for rule graders only."""
        self.tasks, self.dist, self.rollout, self.loss, self.tool_names = tasks, dist, rollout, loss, tool_names
        self.total_updates = total_updates
        self.counters: dict[str, float] = {}
        """Running totals the step metrics are differences of (the judge's counters); checkpointed."""

    @staticmethod
    def stop_if_judge_silent(metrics: dict[str, Any], max_share: float, step: int) -> None:
        """judge.max_fallback_share: a task whose judge answered too few of the step's completions (its fallback
        grader scored them) stops the run, after the step is logged."""
        check_fallback_share(metrics, max_share, step)

    def score(self, rollouts: list[Rollout], step: int | None = None) -> tuple[list[Scored], dict[str, float]]:
        """Each rollout's reward (None: failed) and this batch's scoring counts. `step`: the first scoring of an RL
        step, which tells reward functions TRL's trainer_state (and drops what log_metric got before)."""
        if step is not None:
            set_trainer_state((step - 1) * self.loss.mu, self.total_updates)
        return score_rollouts(rollouts, self.specs, self.judge, self.graders)

    def advantages(self, kept: list[Scored], sampled: list[Scored], kl_only_rows: int, metrics: dict[str, Any],
                   counts: dict[str, float]) -> Rewarded:
        """Rewards -> advantages over the global batch. `kept`: this process's rows to train on; `sampled`: what
        the policy replied to the step's prompts (the reward and answer metrics, the doctor's evidence, describe
        these, also when dynamic sampling trains on a filtered batch: a task collapsed onto one answer would vanish
        from its kept groups); the last `kl_only_rows` rows of `kept` get advantage 0; `metrics`, `counts`: the
        rollouts' metrics and the scoring counts of this process."""
        everyone, offset = kept, 0
        if self.dist.active:  # metrics, advantages over the global batch (train.split_groups: a group may span)
            everyone, offset = self._gather(kept)  # (dynamic sampling: one process)
            sampled = everyone
            metrics = self._global_rollout_metrics(everyone, metrics)
            counts = dict(zip(counts, self.dist.sum_numbers(list(counts.values())), strict=True))
        metrics = {**metrics, **self._counter_metrics(counts, sampled)}
        metrics.update(reward_logs())  # what reward functions passed to TRL's log_metric this step
        advantages_B = kl_only_advantages(self._group_advantages(everyone, metrics), kl_only_rows)
        metrics.update(self._reply_metrics(sampled))
        return Rewarded(kept, advantages_B[offset:offset + len(kept)], everyone, metrics)

    def _gather(self, kept: list[Scored]) -> tuple[list[Scored], int]:
        """Every process's rows to train on, in rank order, and where this process's rows start among them."""
        parts = self.dist.gather(kept)
        return [s for part in parts for s in part], sum(len(part) for part in parts[:self.dist.rank])

    def _global_rollout_metrics(self, everyone: list[Scored], metrics: dict[str, Any]) -> dict[str, Any]:
        """rollout/ metrics (and the tools' with rollout.tools) over every process's rollouts; the rows with
        non-finite logits are this process's count in `metrics`, summed."""
        out = {**rollout_metrics([s.rollout for s in everyone]),
               "rollout/nonfinite_logit_rows": self.dist.sum_numbers([metrics["rollout/nonfinite_logit_rows"]])[0]}
        if self.tool_names is not None:
            out.update(tool_metrics([s.rollout.tool_use for s in everyone], self.tool_names))
        return out

    def _counter_metrics(self, counts: dict[str, float], sampled: list[Scored]) -> dict[str, float]:
        """The scoring counts with this step's share of the judge's running counters, and rollout/tokens_seen
        (TRL's num_tokens: the prompt and model-written completion tokens of every step so far); both totals are
        the run's counters, checkpointed."""
        out = per_step_counts(counts, self.counters)
        self.counters["tokens_seen"] = self.counters.get("tokens_seen", 0.0) + float(
            sum(len(s.rollout.prompt_ids) + s.rollout.model_tokens for s in sampled))
        out["rollout/tokens_seen"] = self.counters["tokens_seen"]
        return out

    def _reply_metrics(self, sampled: list[Scored]) -> dict[str, float]:
        """What the policy replied, per task: reward/ metrics, the judge's fallback shares (tasks whose judge has a
        fallback grader) and the answer metrics of each group of K."""
        out = reward_metrics(sampled, self.tasks)
        out.update(fallback_shares(sampled, self.specs))
        out.update(step_answer_metrics([s.rollout.sample.task for s in sampled], [s.rollout.text for s in sampled],
                                       [s.reward for s in sampled], self.rollout.k))
        return out

    def _group_advantages(self, scored: list[Scored], metrics: dict[str, Any]) -> torch.Tensor:
        """Group advantages of the rewards (failed: NaN, left out of their group), aggregated per
        loss.multi_objective_aggregation and shaped by DAPO's overlong penalty; adv/ metrics into `metrics`."""
        rewards_B = torch.tensor([math.nan if s.reward is None else s.reward for s in scored], dtype=torch.float32)
        combine_terms = MULTI_OBJECTIVE_AGGREGATIONS.get(self.loss.multi_objective_aggregation)
        if combine_terms is not None:  # GDPO (normalize_then_sum): each term normalised in its group, then summed
            rewards_B = combine_terms(*term_matrix(scored, self.specs, metric_names(self.graders, self.specs)),
                                      self.rollout.k)
        if self.rollout.overlong_buffer:  # DAPO's soft overlong punishment, on top of the graders' rewards
            penalty_B = overlong_penalty(torch.tensor([s.rollout.model_tokens for s in scored]),
                                         self.rollout.max_new_tokens, self.rollout.overlong_buffer,
                                         self.rollout.overlong_penalty_factor)
            rewards_B = rewards_B + penalty_B
            metrics["reward/overlong_penalty"] = float(penalty_B.mean())
        advantages_B, adv_metrics = group_advantages(rewards_B, self.rollout.k, scale=self.loss.adv_scale,
                                                     clip=self.loss.adv_clip)
        metrics.update(adv_metrics)
        return advantages_B


OOM_KNOBS = ("train.prompts_per_micro_step (smaller micro-batches, more grad_accum)",
             "model.gradient_checkpointing=true",
             "rollout.max_new_tokens", "model.load_in_4bit=true (QLoRA)", "rollout.k")


class Updater:
    """The update side: the μ update passes of a step and everything they change or steer.

    Built once; `restart()` rebuilds the optimizer and its companions for the policy's current trainable
    parameters (after SFT rebased the reference in place, or a resume loaded it: under LoRA they are new objects)."""

    def __init__(self, cfg: C.Config, policy: Policy, dist: Dist, tasks: list[str], device: torch.device):
        self.cfg, self.policy, self.dist, self.tasks, self.device = cfg, policy, dist, tasks, device
        self.loss = cfg.loss
        self.controllers: dict[str, Controller] = {t: controller_from_config(cfg.kl_for(t)) for t in tasks}
        """The β controller of each task (kl.<task>, else kl.default)."""
        self.entropy_control: AdaptiveEntropyCoef | None = None
        """The adaptive entropy coefficient (loss.entropy_target), or None for the fixed loss.entropy_coef."""
        if cfg.loss.entropy_target is not None:
            self.entropy_control = AdaptiveEntropyCoef(cfg.loss.entropy_coef, cfg.loss.entropy_target,
                                                       cfg.loss.entropy_coef_delta, cfg.loss.entropy_coef_min,
                                                       cfg.loss.entropy_coef_max)
        self.settings = StepSettings(micro_batch_seqs=cfg.micro_batch_seqs, temperature=cfg.rollout.temperature,
                                     max_grad_norm=cfg.train.max_grad_norm, skip_grad_norm=cfg.train.skip_grad_norm,
                                     agg_constant=float(cfg.rollout.max_new_tokens), fused_head=cfg.model.fused_lm_head)
        """The update's plain values of other sections; micro_batch_seqs halves after a CUDA out-of-memory retry."""
        self._restored = False  # set by the guard after an optimizer step that left non-finite weights
        self.restart()
        split = cfg.train.split_groups and dist.active  # a process may hold part of a group: no prompt to share
        self.share_prompts = not split and shares_prompts(cfg, self.train_model, dist)
        """Forward passes encode each prompt once for its K completions (see `shares_prompts`)."""

    def after_sft(self, seed: int) -> None:
        """After SFT: RL is regularised towards the SFT model, not the pre-SFT one. The reference is rebased in place
        (every owner holds this policy), then the optimizer restarts (under LoRA the trainable parameters are new
        objects)."""
        rebased = rebase_reference(self.policy, seed=seed)
        self.policy.model, self.policy.ref_model = rebased.model, rebased.ref_model
        self.restart()

    def restart(self) -> None:
        """Optimizer, scheduler, weight guard and gradient surgery for the policy's current trainable parameters,
        prepared for the run's processes, and the Learner that steps them."""
        params = self.policy.trainable_parameters()
        optimizer, self.scheduler = build_optimizer(self.cfg.train, params, self.cfg.total_updates)
        self.guard = WeightGuard(self.dist.local(params), max_consecutive=self.cfg.train.max_consecutive_bad)
        """Skipped / restored steps; replaces non-finite weights by the last good copy."""
        self.surgery: TaskGradientSurgery | None = build_surgery(self.cfg, params, self.tasks)
        """Per-task gradient combination (PCGrad / CAGrad), or None for the plain summed loss."""
        self.train_model, self.optimizer = self.dist.prepare(self.policy.model, optimizer)
        """The model the update runs through: the policy's model, or accelerate's DDP / FSDP wrapper of it."""
        self.learner = Learner(self.train_model or self.policy.model, self.optimizer, params,
                               on_step=self._after_optimizer_step, surgery=self.surgery,
                               scaler=self.policy.grad_scaler, dist=self.dist)

    @property
    def micro_batch_seqs(self) -> int:
        """Sequences per forward of every pass (old log-probs, reference, training): cfg.micro_batch_seqs, halved
        after a CUDA out-of-memory retry (`after_oom`)."""
        return self.settings.micro_batch_seqs

    @property
    def lr(self) -> float:
        return self.scheduler.get_last_lr()[0]

    def batch(self, scored: list[Scored], advantages_B: torch.Tensor) -> TrainBatch:
        """The rows to train on, collated with their advantages, and their old log-probs where a pass needs them."""
        batch = build_train_batch(scored, advantages_B, self.tasks, self.policy.tokenizer.pad_token_id, self.device,
                                  group_size=self.cfg.rollout.k if self.share_prompts else 1,
                                  mask_truncated=self.loss.mask_truncated)
        if self.loss.mu > 1 and has_dropout(self.policy.model):
            # off-policy passes need the rollout policy's log-probs (eval mode: no dropout). At μ = 1 they equal the
            # current ones; without dropout the first pass computes them (update_passes keeps them for the later passes)
            batch.old_logps_BT = batch_logprobs(self.policy.model, batch, self.micro_batch_seqs,
                                                self.settings.temperature)
            self.dist.reshard(self.policy.model)
        return batch

    def reference_logps(self, batch: TrainBatch) -> None:
        """The reference's log-probs of the batch (no graph), when a task has a KL term."""
        if self.cfg.kl_enabled:
            with reference(self.policy) as ref_model:
                batch.ref_logps_BT = batch_logprobs(ref_model, batch, self.micro_batch_seqs, self.settings.temperature)
                self.dist.reshard(ref_model)

    def update(self, batch: TrainBatch) -> dict[str, float]:
        """The μ update passes with each task's current β (grpo/phases/update.update_passes; on a CUDA out-of-memory
        error once more with half the micro-batch: `after_oom`), then the controllers' and the guard's bookkeeping:
        loss/, kl/, entropy/, health/ (health/restored: the guard restored the weights), beta/ metrics."""
        betas_N = torch.tensor([self.controllers[t].value for t in self.tasks], dtype=torch.float32)
        self._restored = False
        try:
            stats = {**update_passes(self.learner, batch, betas_N, self.loss, self.tasks, self.step_settings()),
                     "health/oom_retries": 0.0}
        except torch.OutOfMemoryError as err:
            self.after_oom(err)
            stats = {**update_passes(self.learner, batch, betas_N, self.loss, self.tasks, self.step_settings()),
                     "health/oom_retries": 1.0}
        metrics = dict(stats)
        if self.entropy_control is not None:  # adaptive entropy control: the coefficient this step used, then update
            metrics["loss/entropy_coef"] = self.entropy_control.value
            self.entropy_control.update(stats.get("entropy/all", math.nan))  # absent: no token trained
        for t in self.tasks:
            metrics[f"beta/{t}"] = self.controllers[t].value  # the β this step trained with
            if f"kl/{t}" in stats:
                self.controllers[t].update(stats[f"kl/{t}"])
        skipped, restored = bool(stats["health/skipped"]), self._restored
        metrics.update(self.guard.record(skipped=skipped, restored=restored, reason=bad_step_reason(
            skipped, restored, stats["health/grad_norm_max"], self.cfg.train.skip_grad_norm)))
        return metrics

    def step_settings(self) -> StepSettings:
        """The update's plain values of other sections, with the entropy controller's coefficient of now."""
        if self.entropy_control is None:
            return self.settings
        return dataclasses.replace(self.settings, entropy_coef=self.entropy_control.value)

    def after_oom(self, err: torch.OutOfMemoryError) -> None:
        """After a CUDA out-of-memory error in the update: report it, halve the micro-batch size (the run's size for
        every later pass: old log-probs, reference and training), free what the graph engine keeps and the cached
        blocks, so that the step can run once more; re-raise when the micro-batch is one sequence already."""
        self.optimizer.zero_grad(set_to_none=True)
        peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else float("nan")
        size = self.micro_batch_seqs
        half = max(1, size // 2)
        print(f"CUDA out of memory in the update (peak allocated {peak:.1f} GiB): {str(err).splitlines()[0]}\n"
              f"  retrying this step once with micro-batch {half} sequences (was {size}).\n"
              f"  knobs that reduce memory: {'; '.join(OOM_KNOBS)}; see docs/MEMORY.md and "
              "`grpo-check-gpu-memory --estimate` (in a checkout: `python check_gpu_memory.py --estimate`)",
              file=sys.stderr, flush=True)
        if half == size:
            raise err
        freed = release_graph_slots(self.policy.model)  # and none kept from now on
        if freed:
            print(f"  the graph engine's kept decoding buffers ({freed / 2**30:.2f} GiB) are freed and no longer "
                  "kept between rollouts", file=sys.stderr, flush=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # once, after an OOM, to give the retry the freed blocks
        self.settings = dataclasses.replace(self.settings, micro_batch_seqs=half)

    def _after_optimizer_step(self) -> None:
        """Scheduler step, then the weight guard: NaN/Inf weights are replaced by the last good copy. Sharded, each
        rank guards its shard and a bad shard anywhere restores every shard (the model stays one step)."""
        self.scheduler.step()
        if self.dist.sharded:
            bad = self.dist.any(not self.guard.all_finite())
            self.guard.restore() if bad else self.guard.snapshot()
        else:
            bad = self.guard.restore_if_bad()
        self._restored = self._restored or bad


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


def per_completion_sampling(rollout: C.RolloutConfig, dist: Dist) -> bool:
    """Whether rollouts draw from per-completion streams (rollout.sampling_rng; auto = when several processes)."""
    mode = rollout.sampling_rng
    return mode == "per_completion" or (mode == "auto" and dist.active)


def build_surgery(cfg: C.Config, params: list[torch.nn.Parameter], tasks: list[str]):
    """PCGrad / CAGrad over per-task gradients when multi.combine asks for it (and there are several tasks)."""
    if cfg.multi.combine == "sum" or len(tasks) < 2:
        return None
    monitor = ConflictMonitor(mode=cfg.multi.switch, threshold=cfg.multi.threshold, patience=cfg.multi.patience,
                              release=cfg.multi.release)
    return TaskGradientSurgery(params, tasks, cfg.multi.combine, cfg.multi.cagrad_c, monitor,
                               policy_only=cfg.multi.policy_only, seed=cfg.train.seed)


def build_optimizer(train: C.TrainConfig, params: list[torch.nn.Parameter], total_updates: int):
    """AdamW over the trainable parameters, with train.lr_scheduler over the RL phase's `total_updates` optimizer
    steps after its warm-up (warmup_steps, or warmup_ratio of the steps)."""
    optimizer = adamw(params, lr=train.lr, weight_decay=train.weight_decay)
    warmup = train.warmup_steps or math.ceil(total_updates * train.warmup_ratio)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda n: lr_factor(n, train.lr_scheduler, warmup, total_updates))
    return optimizer, scheduler


def lr_factor(n: int, schedule: str, warmup: int, total: int) -> float:
    """The learning rate of optimizer step n (0-based) as a share of train.lr: transformers' get_scheduler formulas
    (get_constant_schedule_with_warmup, get_linear_schedule_with_warmup, get_cosine_schedule_with_warmup with half a
    cycle), so TRL's, under any of C.LR_SCHEDULERS."""
    if n < warmup:
        return n / max(1, warmup)
    if schedule == "constant":
        return 1.0
    if schedule == "linear":
        return max(0.0, (total - n) / max(1, total - warmup))
    progress = (n - warmup) / max(1, total - warmup)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
