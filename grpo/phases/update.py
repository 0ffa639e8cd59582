"""The policy update of one RL step: μ passes over a collated rollout batch, each one optimizer step.

    for pass in range(μ):                      # each pass builds its own graphs
        zero_grad()                            # once, before the accumulation
        for micro_batch in batch:              # gradients ADD across micro-batches
            loss = policy_loss + β_task · KL − c_ent · entropy, aggregated with the step's token count
            loss.backward()
        clip_grad_norm_(); skip if non-finite or huge; step()     # once, after the accumulation

Everything in the TrainBatch (old / ref log-probs, advantages) was computed before this loop without a graph,
so no pass can backpropagate through another pass's graph. With μ = 1 the update is exactly on-policy and the
old log-probs are the current ones, detached (no extra forward). `token-mean` divides by the completion-token count
of the whole batch, counted once up front, so micro-batching does not change the gradient.
"""

from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from grpo.config import LossConfig
from grpo.core.losses import LOG_RATIOS, POLICY_LOSSES, aggregate, importance_ratio, kl_penalty, top_entropy_mask
from grpo.core.step_types import TrainBatch
from grpo.machine.distributed import Dist, as_float
from grpo.models.logprobs import completion_logprobs
from grpo.phases.batch import batch_entropies

KL_METRIC_ESTIMATOR = "k3"  # reported KL: k3 is unbiased for KL(π‖π_ref) and never negative
KL_TAIL_ESTIMATOR = "k1"
"""Logged beside `kl/<task>` as `kl_k1/<task>`: k1 (the mean log-ratio) is unbiased too, and a rare sampled token
with π ≪ π_ref moves it by log(π/π_ref), not by π_ref/π as it moves k3: a k3 spike with a quiet k1 is one tail token,
both rising together is drift."""
PER_PASS_PREFIXES = ("loss/clip_frac", "loss/ratio", "loss/approx_kl_old", "loss/dual_clip_frac")
"""Off-policy metrics: at μ > 1 they are aggregated over ALL passes (the first pass is on-policy, ratio = 1); so are
the policy loss's own (`LossSpec.metrics`)."""


FUSED_ADAMW_DEVICES = ("cpu", "cuda", "mps", "xpu")
"""Devices where torch.optim.AdamW(fused=True) has a kernel."""


def adamw(params: list[torch.nn.Parameter], lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW for the SFT warm-up and the RL phase: the fused kernel (one pass over every parameter per step, as
    transformers' default `adamw_torch_fused`, so TRL's, uses) wherever it applies, else torch's default. On the CPU
    torch's default is the per-tensor loop, several times slower on a 135M-parameter model (`python -m
    benchmarks.real_model_parts`; its timings in benchmarks/RESULTS.md). The update is the same up to float rounding
    (tests/test_update_optimizer.py). Sharded parameters (FSDP2's DTensors) keep torch's default."""
    plain = all(type(p.data) is torch.Tensor and p.device.type in FUSED_ADAMW_DEVICES and p.is_floating_point()
                for p in params)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True if plain and params else None)


def micro_batch_terms(model: torch.nn.Module, mb: TrainBatch, betas_N: torch.Tensor, objective: LossConfig,
                      temperature: float, fused_head: bool, entropy_coef: float | None = None,
                      loss_fn: Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]] | None = None,
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token loss terms of one micro-batch: (policy_BT, regulariser_BT = β_task·KL − c·entropy, mask_BT, parts).

    `objective`: the loss section. betas_N: the KL coefficient per task index; each sequence uses its own task's β.
    `temperature`: the sampling
    temperature (rollout.temperature), so the log-probs are those of the distribution the rollouts came from.
    `fused_head` (model.fused_lm_head): apply the LM head inside the log-prob computation (grpo/core/kernels.py).
    `entropy_coef`: the adaptive entropy controller's coefficient for this step; None = loss.entropy_coef.
    `loss_fn`: loss.policy_loss with its hyper-parameters bound (`bound_policy_loss`); None = bound here.
    """
    betas_B = betas_N.to(mb.advantages_B.device)[mb.task_ids_B]
    logps_BT, entropy_BT = completion_logprobs(model, mb.input_ids_BL, mb.attention_mask_BL, mb.prompt_len,
                                               temperature=temperature, with_entropy=True, fused_head=fused_head,
                                               group_size=mb.group_size)
    mask_BT = mb.completion_mask_BT.to(logps_BT.dtype)
    old_BT = logps_BT.detach() if mb.old_logps_BT is None else mb.old_logps_BT
    loss_fn = loss_fn or bound_policy_loss(objective)
    pg_BT, pg_metrics = loss_fn(logps_BT, old_BT, mb.advantages_B, mask_BT)
    if mb.entropy_mask_BT is not None:  # top-entropy tokens only (loss.top_entropy_quantile); denominators unchanged
        pg_BT = pg_BT * mb.entropy_mask_BT.to(pg_BT.dtype)
    reg_BT = torch.zeros_like(pg_BT)
    kl_value_BT = torch.zeros_like(logps_BT)
    kl_k1_BT = torch.zeros_like(logps_BT)
    if mb.ref_logps_BT is not None:
        kl_BT = kl_penalty(logps_BT, mb.ref_logps_BT, objective.kl_estimator)
        if objective.kl_importance_weight:  # TRL's use_bias_correction_kl: times the loss's ratio, not detached
            log_ratio_BT = LOG_RATIOS[POLICY_LOSSES[objective.policy_loss].ratio](logps_BT, old_BT.detach(), mask_BT)
            kl_BT = kl_BT * importance_ratio(log_ratio_BT)
        reg_BT = reg_BT + betas_B.to(kl_BT.dtype)[:, None] * kl_BT
        kl_value_BT = kl_penalty(logps_BT.detach(), mb.ref_logps_BT, KL_METRIC_ESTIMATOR)
        kl_k1_BT = kl_penalty(logps_BT.detach(), mb.ref_logps_BT, KL_TAIL_ESTIMATOR)
    coef = objective.entropy_coef if entropy_coef is None else entropy_coef
    if coef > 0:
        reg_BT = reg_BT - coef * entropy_BT
    parts = {"pg_BT": pg_BT.detach(), "kl_BT": kl_value_BT, "kl_k1_BT": kl_k1_BT, "entropy_BT": entropy_BT.detach(),
             "logps_BT": logps_BT.detach(),
             "mask_BT": mask_BT.detach(), **{k: torch.as_tensor(v).detach() for k, v in pg_metrics.items()}}
    return pg_BT, reg_BT, mask_BT, parts


def bound_policy_loss(objective: LossConfig) -> Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]:
    """loss.policy_loss with its hyper-parameters bound, once per update: the clip's (loss.clip_low, loss.clip_high,
    loss.dual_clip) where it is a clipped loss, and its loss.params; `objective` is the loss section. It then takes
    (logps_BT, old_logps_BT, advantages_B, mask_BT) and gives (loss_BT, metrics)."""
    return POLICY_LOSSES[objective.policy_loss].bind(objective.params, clip_low=objective.clip_low,
                                                     clip_high=objective.clip_high, dual_clip=objective.dual_clip)


Terms = Callable[[TrainBatch], tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]]
"""One micro-batch -> (policy_BT, regulariser_BT, mask_BT, parts): `micro_batch_terms` with the step's settings."""
BoundAggregate = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""(loss_BT, mask_BT) -> the scalar share of the optimizer step's loss (`aggregate` with the step's counts)."""


class _StepStats:
    """Accumulates detached per-task sums on the device; converted to floats once, at the end (one host sync)."""

    def __init__(self, n_tasks: int, device: torch.device):
        self.kl = torch.zeros(n_tasks, device=device)
        self.kl_k1 = torch.zeros(n_tasks, device=device)
        self.entropy = torch.zeros(n_tasks, device=device)
        self.tokens = torch.zeros(n_tasks, device=device)
        self.pg = torch.zeros((), device=device)
        self.loss = torch.zeros((), device=device)
        self.scalars: dict[str, list[torch.Tensor]] = {}
        self.logps: list[torch.Tensor] = []
        """Each micro-batch's detached log-probs, in micro-batch order (the old log-probs of later μ passes, put back
        in batch order by `TrainBatch.from_micro_batches`)."""

    def add(self, loss: torch.Tensor, parts: dict[str, torch.Tensor], task_ids_B: torch.Tensor) -> None:
        mask = parts["mask_BT"]
        # (no one_hot: it reads the ids' range back to the host to check it)
        onehot_BN = (task_ids_B[:, None] == torch.arange(self.kl.numel(), device=task_ids_B.device)).to(mask.dtype)
        self.kl += onehot_BN.T @ (parts["kl_BT"] * mask).sum(1)
        self.kl_k1 += onehot_BN.T @ (parts["kl_k1_BT"] * mask).sum(1)
        self.entropy += onehot_BN.T @ (parts["entropy_BT"] * mask).sum(1)
        self.tokens += onehot_BN.T @ mask.sum(1)
        self.pg += (parts["pg_BT"] * mask).sum()
        self.loss += loss.detach()
        self.logps.append(parts["logps_BT"])
        for k, v in parts.items():
            if not k.endswith("_BT"):
                self.scalars.setdefault(k, []).append(v.float())

    def finish(self, tasks: Sequence[str], dist: Any = None) -> dict[str, float]:
        """Per-task means over the step, and kl/all, entropy/all: the token-weighted means over every task (TRL's
        kl and entropy; what adaptive entropy control measures); with `dist` the sums (and max / min) are taken over
        every rank first."""
        if dist is not None and dist.active:
            sums = dist.sum(torch.cat([self.kl, self.entropy, self.tokens, self.kl_k1, self.pg[None],
                                       self.loss[None]]))
            n = self.kl.numel()
            self.kl, self.entropy, self.tokens = sums[:n], sums[n:2 * n], sums[2 * n:3 * n]
            self.kl_k1, self.pg, self.loss = sums[3 * n:4 * n], sums[4 * n], sums[4 * n + 1]
            for k, vs in self.scalars.items():
                op = "max" if k.endswith("_max") else "min" if k.endswith("_min") else "sum"
                value = (torch.stack(vs).max() if op == "max" else torch.stack(vs).min() if op == "min"
                         else torch.stack(vs).mean() / dist.world)
                self.scalars[k] = [dist.reduce(value.reshape(1).clone(), op)[0]]
        tok = self.tokens.clamp(min=1)
        names = list(self.scalars)
        reduced = [(stacked.max() if k.endswith("_max") else stacked.min() if k.endswith("_min") else stacked.mean())
                   for k, stacked in ((k, torch.stack(self.scalars[k])) for k in names)]
        n = len(tasks)
        head = [self.loss, self.pg / tok.sum(), self.entropy.sum() / tok.sum(), self.kl.sum() / tok.sum()]
        values = torch.cat([torch.stack([self.kl, self.kl_k1, self.entropy]).div(tok).flatten(), self.tokens,
                            torch.stack(head + reduced).float()]).tolist()  # the pass's one host sync
        kl, kl_k1, ent, tokens = values[:n], values[n:2 * n], values[2 * n:3 * n], values[3 * n:4 * n]
        rest = values[4 * n:]
        out = {"loss/total": rest[0], "loss/policy_token_mean": rest[1]}
        if sum(tokens) > 0:
            out["entropy/all"], out["kl/all"] = rest[2], rest[3]
        for i, t in enumerate(tasks):
            if tokens[i] > 0:
                out[f"kl/{t}"] = kl[i]
                out[f"kl_k1/{t}"] = kl_k1[i]
                out[f"entropy/{t}"] = ent[i]
        out.update(zip(names, rest[len(head):], strict=True))
        return out


@dataclass
class Learner:
    """What an update changes and how its optimizer steps."""

    model: torch.nn.Module
    """The model the passes run through: the policy's model, or accelerate's DDP / FSDP wrapper of it."""
    optimizer: torch.optim.Optimizer
    params: Sequence[torch.nn.Parameter]
    """The trainable parameters: their gradient norm is clipped (and checked) together."""
    on_step: Callable[[], None] | None = None
    """Runs after each optimizer step that was taken (the LR scheduler, the weight guard)."""
    surgery: Callable[..., dict[str, float]] | None = None
    """Replaces the plain accumulation (per-task gradient surgery, `TaskGradientSurgery`); None = summed loss."""
    scaler: "torch.amp.GradScaler | None" = None
    """A GradScaler for fp16 weights (loss scaling; gradients are unscaled before clipping)."""
    dist: Any = None
    """grpo/models/distributed.Dist for data parallelism, or None for one process."""


@dataclass(frozen=True)
class StepSettings:
    """The plain values of other config sections one update reads, gathered at the call, never stored: the run's
    current micro-batch size (halved after a CUDA out-of-memory retry), rollout.temperature, train.max_grad_norm /
    train.skip_grad_norm (clip the norm; skip the step when it is non-finite or above), the Dr.GRPO normaliser of
    seq-mean-token-sum-norm (rollout.max_new_tokens) and model.fused_lm_head."""

    micro_batch_seqs: int
    temperature: float
    max_grad_norm: float
    skip_grad_norm: float
    agg_constant: float | None = None
    fused_head: bool = True
    entropy_coef: float | None = None
    """The adaptive entropy controller's current coefficient (run state, not config); None = loss.entropy_coef."""


def update_passes(learner: Learner, batch: TrainBatch, betas_N: torch.Tensor, objective: LossConfig,
                  tasks: Sequence[str], settings: StepSettings) -> dict[str, float]:
    """loss.mu optimizer steps of `learner` over `batch` (`objective`, the loss section: policy loss, clipping,
    aggregation, KL estimator, entropy bonus, μ). betas_N: β per task index. Returns metrics + health.

    Loss, per-task KL and entropy are the first pass's (measured on the rollout policy, which is what the KL
    controllers steer); the ratio / clip metrics (PER_PASS_PREFIXES) cover all μ passes: mean of the means, max of
    the maxima, min of the minima. `health/grad_norm` is the first pass's, `health/grad_norm_max` the largest.

    The surgery is called as surgery(micro_batches, terms, agg, stats, dist=dist) (see `Terms`,
    `BoundAggregate`). With μ > 1 and `batch.old_logps_BT` None, the first pass's own log-probs (detached) become the
    old log-probs of the later passes: the caller skips the separate old-log-prob forward when train mode has no
    dropout, because the first pass then computes exactly those values.
    With `learner.dist`, `batch` is this rank's share; token and sequence counts are summed over ranks, and gradients
    are summed once per optimizer step (DDP on the last micro-batch, `no_sync` on the others; the loss is multiplied
    by the world size because DDP averages).
    """
    model, dist = learner.model, learner.dist
    num_tokens, num_seqs, world = _global_counts(batch, dist)  # counted ONCE for the whole optimizer step
    if num_tokens == 0:
        if objective.mask_truncated:  # every completion was truncated and masked: nothing to learn from this batch
            return {"loss/total": 0.0, "loss/no_tokens": 1.0, "health/grad_norm": 0.0, "health/grad_norm_max": 0.0,
                    "health/skipped": 0.0, "health/skipped_passes": 0.0}
        raise ValueError("the rollout batch has no completion tokens to train on (every completion is empty)")
    metrics: dict[str, float] = {}
    if objective.top_entropy_quantile < 1.0:
        metrics.update(select_top_entropy(model, batch, objective.top_entropy_quantile, settings, dist))

    # one micro-batch's terms and its share of the step's loss, with everything else bound once for the step
    terms: Terms = functools.partial(micro_batch_terms, model, betas_N=betas_N, objective=objective,
                                     temperature=settings.temperature, fused_head=settings.fused_head,
                                     entropy_coef=settings.entropy_coef, loss_fn=bound_policy_loss(objective))
    agg: BoundAggregate = functools.partial(aggregate, mode=objective.agg_mode, num_tokens=num_tokens,
                                            num_seqs=num_seqs, constant=settings.agg_constant)

    model.train()
    passes: list[dict[str, float]] = []
    norms: list[float] = []
    for pass_index in range(objective.mu):
        learner.optimizer.zero_grad(set_to_none=True)
        stats = _StepStats(len(tasks), batch.advantages_B.device)
        micro = list(batch.micro_batches(settings.micro_batch_seqs))
        if learner.surgery is not None:
            with dist.no_sync(model) if dist is not None else contextlib.nullcontext():  # it sums per-task grads
                metrics.update(learner.surgery(micro, terms, agg, stats, dist=dist))
        else:
            _backward(learner, micro, terms, agg, stats, world)
        norms.append(_optimizer_step(learner, settings))
        if pass_index == 0 and objective.mu > 1 and batch.old_logps_BT is None:
            logps_BT = batch.from_micro_batches([lp.float() for lp in stats.logps], settings.micro_batch_seqs)
            batch.old_logps_BT = logps_BT * batch.completion_mask_BT
        passes.append(stats.finish(tasks, dist))
    return {**metrics, **_across_passes(passes, norms, objective, settings.skip_grad_norm)}


def _global_counts(batch: TrainBatch, dist: Dist | None) -> tuple[int, int, int]:
    """(completion tokens, sequences, processes) of the optimizer step: this batch's, summed over the processes."""
    if dist is None or not dist.active:
        return batch.num_tokens, batch.size, 1
    num_tokens, num_seqs = (int(v) for v in dist.sum_numbers([batch.num_tokens, batch.size]))
    return num_tokens, num_seqs, dist.world


def _backward(learner: Learner, micro: list[TrainBatch], terms: Callable, agg: Callable, stats: "_StepStats",
              world: int) -> None:
    """One backward per micro-batch: gradients ADD across them (no zero_grad, no step in here). Each micro-batch's
    loss is scaled so that they sum to the step's loss, times the world size because DDP averages; DDP all-reduces
    on the last backward only."""
    model, dist, scaler = learner.model, learner.dist, learner.scaler
    for i, mb in enumerate(micro):
        last = i == len(micro) - 1
        with dist.no_sync(model) if dist is not None and not last else contextlib.nullcontext():
            pg_BT, reg_BT, mask_BT, parts = terms(mb)
            mb_loss = agg(pg_BT + reg_BT, mask_BT)
            scaled = (scaler.scale(mb_loss) if scaler is not None else mb_loss) * world
            scaled.backward()
        stats.add(mb_loss, parts, mb.task_ids_B)


def _optimizer_step(learner: Learner, settings: StepSettings) -> float:
    """Clip the gradients and step, or skip the step when their pre-clip norm is NaN, Inf or above
    settings.skip_grad_norm; the gradients are freed either way. Returns that norm."""
    optimizer, scaler = learner.optimizer, learner.scaler
    if scaler is not None:
        scaler.unscale_(optimizer)
    grad_norm = as_float(torch.nn.utils.clip_grad_norm_(learner.params, settings.max_grad_norm))  # DTensor if sharded
    if not (grad_norm == grad_norm and grad_norm <= settings.skip_grad_norm):  # NaN, Inf or exploding
        optimizer.zero_grad(set_to_none=True)
        if scaler is not None:
            scaler.update()  # an fp16 overflow lowers the loss scale
        return grad_norm
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)  # free the gradients now: they would sit through generation
    if learner.on_step is not None:
        learner.on_step()
    return grad_norm


def _across_passes(passes: list[dict[str, float]], norms: list[float], objective: LossConfig,
                   skip_grad_norm: float) -> dict[str, float]:
    """The step's metrics from its μ passes: the first pass's, with the PER_PASS_PREFIXES ones and the loss's own
    metrics over all passes (mean of the means, max of the maxima, min of the minima), and health/."""
    metrics = dict(passes[0])
    for key in [k for k in passes[0] if k.startswith(PER_PASS_PREFIXES + POLICY_LOSSES[objective.policy_loss].metrics)]:
        values = [p[key] for p in passes if key in p]
        metrics[key] = (max(values) if key.endswith("_max") else min(values) if key.endswith("_min")
                        else sum(values) / len(values))
    skipped = sum(not (n == n and n <= skip_grad_norm) for n in norms)
    metrics["health/grad_norm"] = norms[0]
    metrics["health/grad_norm_max"] = max(norms, key=lambda n: n if n == n else math.inf)  # NaN counts as largest
    metrics["health/skipped"] = float(skipped > 0)
    metrics["health/skipped_passes"] = float(skipped)
    return metrics


def select_top_entropy(model: torch.nn.Module, batch: TrainBatch, quantile: float, settings: StepSettings,
                       dist: Any = None) -> dict[str, float]:
    """Set `batch.entropy_mask_BT` to the top-`quantile` share of the step's completion tokens by entropy (one no-grad
    pass of the current = rollout policy; the threshold pools every rank's tokens), once for all μ passes and
    micro-batches, so the split cannot change which tokens train. Returns loss/entropy_token_frac (the share kept)."""
    entropy_BT = batch_entropies(model, batch, settings.micro_batch_seqs, settings.temperature)
    if dist is not None:
        dist.reshard(model)  # FSDP2 after a no-grad forward: else the root's parameters get no gradient
    valid_BT = batch.completion_mask_BT > 0
    pool = entropy_BT[valid_BT]
    if dist is not None and dist.active:
        pool = torch.cat([p.to(pool.device) for p in dist.gather(pool.cpu())])
    batch.entropy_mask_BT = top_entropy_mask(entropy_BT, batch.completion_mask_BT, quantile, pool=pool)
    kept = float(batch.entropy_mask_BT.sum().item()) / max(1.0, float(valid_BT.sum().item()))
    return {"loss/entropy_token_frac": kept}


class TaskGradientSurgery:
    """Per-task gradients, accumulated over the micro-batches of one optimizer step, combined once
    (grpo/core/gradient_surgery.py).

    Per micro-batch: one forward, then one backward per task present (its policy loss, normalised by the whole
    step's token count) and one for the KL/entropy terms, which are added after the surgery when `policy_only`.
    Memory: one flat fp32 vector per task of the trainable-parameter count (small under LoRA; 2 x 32 GB for full
    fine-tuning of an 8B model). The surgery runs when the monitor says so; otherwise the tasks' sum is used.
    """

    def __init__(self, params: Sequence[torch.nn.Parameter], tasks: Sequence[str], method: str, c: float,
                 monitor, policy_only: bool, seed: int):
        from grpo.core.gradient_surgery import TaskGradAccumulator

        self.params, self.tasks, self.method, self.c = list(params), list(tasks), method, c
        self.monitor, self.policy_only = monitor, policy_only
        self.acc = TaskGradAccumulator(self.params, len(self.tasks))
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, micro_batches: Sequence[TrainBatch], terms: Terms, agg: BoundAggregate, stats: "_StepStats",
                 dist: Any = None) -> dict[str, float]:
        from grpo.core.gradient_surgery import apply_surgery, assign_flat_grad, flat_grad, gradient_stats

        extra = None
        for mb in micro_batches:
            pg_BT, reg_BT, mask_BT, parts = terms(mb)
            reg_separate = self.policy_only and reg_BT.requires_grad
            present = sorted(set(mb.task_ids_B.tolist()))
            total = torch.zeros((), device=pg_BT.device)
            for n, t in enumerate(present):
                rows_B1 = (mb.task_ids_B == t).to(pg_BT.dtype)[:, None]
                term_BT = pg_BT if self.policy_only else pg_BT + reg_BT
                loss_t = agg(term_BT * rows_B1, mask_BT)
                loss_t.backward(retain_graph=reg_separate or n < len(present) - 1)
                self.acc.capture(t)
                total += loss_t.detach()
            if reg_separate:
                loss_r = agg(reg_BT, mask_BT)
                loss_r.backward()
                g = flat_grad(self.params)
                extra = g if extra is None else extra + g
                for p in self.params:
                    p.grad = None
                total += loss_r.detach()
            stats.add(total, parts, mb.task_ids_B)
        grads_ND = self.acc.stack()
        if dist is not None and dist.active:  # every rank combines the same global per-task gradients
            grads_ND = dist.sum(grads_ND.contiguous())
            if extra is not None:  # present on every rank or on none: it depends on the config only
                extra = dist.sum(extra)
        metrics = gradient_stats(grads_ND, self.tasks)
        active = self.monitor.update(metrics.get("multi/cos_min", float("nan")))
        combined_D, m = apply_surgery(grads_ND, self.method if active else "sum", c=self.c, generator=self.generator,
                                names=self.tasks, extra=extra)
        assign_flat_grad(self.params, combined_D)
        self.acc.reset()
        return {**{k: float(v) for k, v in {**metrics, **m, **self.monitor.metrics()}.items()}}

    def state_dict(self) -> dict:
        return {"monitor": self.monitor.state_dict(), "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.monitor.load_state_dict(state["monitor"])
        self.generator.set_state(state["generator"])
