"""Policy losses, loss aggregation and KL estimators: pure functions of tensors and masks (the chunked log-prob and
entropy kernels are grpo/core/kernels.py's).

Shapes: B = sequences, T = completion tokens, V = vocabulary. Every `mask_BT` is 1.0 on trained tokens, 0.0 on padding.

Formulas (one line each, with the source):
- ratio, GRPO:        r_i,t = exp(logp_i,t − old_i,t)   (DeepSeekMath arXiv 2402.03300, eq. 3)
- ratio, GSPO:        s_i = exp( Σ_t m_i,t (logp_i,t − old_i,t) / Σ_t m_i,t ), broadcast over t
                      (GSPO arXiv 2507.18071, eq. 7)
- ratio, GSPO-token:  s_i,t = sg[s_i] · exp(logp_i,t − sg[logp_i,t])
                      (same value as s_i, per-token gradient path; GSPO eq. 13)
- clipped loss:       ℓ = max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high))
                      (PPO arXiv 1707.06347; clip-higher: DAPO arXiv 2503.14476)
- dual clip (A < 0):  ℓ = min(ℓ, −c·A), c > 1   (Dual-clip PPO arXiv 1912.09729; verl `clip_ratio_c`)
- CISPO:  ℓ = −sg[min(r, ε_max)]·A·logp: a clipped, detached ratio weight   (MiniMax-M1 arXiv 2506.13585; TRL `cispo`)
- SAPO:   ℓ = −(4/τ)·σ(τ·(r − 1))·A, τ = τ_pos if A > 0 else τ_neg: a soft gate, no clip
                      (arXiv 2511.20347; TRL `sapo`)
- LUSPO:  GSPO's clipped loss aggregated by `seq-mean-token-sum` (each sequence weighted by its length)   (TRL `luspo`)
- VESPO:  ℓ = −sg[φ(w)]·A·logp, log w = Σ_t m·(logp − old), φ(w) = e^λ·w^k·e^(−λw), (k, λ) by sign(A)   (TRL `vespo`)
- token-mean:                Σ_i,t m·ℓ / N_tokens(step)                                   (DAPO; verl `agg_loss`)
- seq-mean-token-mean:       Σ_i [Σ_t m·ℓ / Σ_t m] / N_seqs(step)   (GRPO as in DeepSeekMath eq. 3)
- seq-mean-token-sum:        Σ_i [Σ_t m·ℓ] / N_seqs(step)                                 (verl `agg_loss`)
- seq-mean-token-sum-norm:   Σ_i [Σ_t m·ℓ / C] / N_seqs(step), C = max completion length   (Dr.GRPO arXiv 2503.20783)
- KL k1 = logp − ref;  k2 = ½(logp − ref)²;  k3 = exp(ref − logp) − (ref − logp) − 1
                      (Schulman, "Approximating KL divergence", 2020)
- KL k3+ = k2 + sg[k3 − k2]  (value of k3, gradient of k2)   (verl `low_var_kl+` / straight-through)

Each policy loss is registered once, beside its function, by `register_policy_loss` (verl's decorator): its name, ratio,
hyper-parameters with their defaults, rules and docs, the loss-section fields it takes and its metrics. The config
check (grpo/run/assembly/config_check.py), --help (`losses_help`), the update and TRL's loss_type read POLICY_LOSSES.

Metric values are 0-dim detached tensors (no host sync here); the loop converts them with `float()`.
"""

from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch

from grpo.core.clip_rules import CLIP_HIGH, CLIP_LOW, DUAL_CLIP, clip_problems
from grpo.core.registry import Registry

LOG_RATIO_CLAMP = 20.0
"""Log-ratios are clamped to ±20 before exp(): exp() overflows fp32 past ~88 and bf16/fp16 much earlier, and a
ratio of e^20 ≈ 5e8 is already far outside any clip range, so the clamp changes no clipped loss."""



# ----------------------------------------------------------------------------------------------------------- helpers
def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `x` where `mask` is nonzero, over `dim` (all elements when None). Empty → 0, never NaN."""
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1.0)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1.0)


def _check_shapes(where: str, ref_BT: torch.Tensor, **named: torch.Tensor) -> None:
    for name, t in named.items():
        if t.shape != ref_BT.shape:
            raise ValueError(f"{where}: {name} has shape {tuple(t.shape)} but logps_BT has {tuple(ref_BT.shape)}; "
                             "pass tensors of one (B, T) shape (completion columns only)")


def _masked_extrema(x_BT: torch.Tensor, valid_BT: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(min, max) of x over valid entries; (1, 1) when nothing is valid (a ratio of 1 means "no change")."""
    one = torch.ones((), dtype=x_BT.dtype, device=x_BT.device)
    lo = torch.where(valid_BT, x_BT, torch.full_like(x_BT, float("inf"))).amin() if x_BT.numel() else one
    hi = torch.where(valid_BT, x_BT, torch.full_like(x_BT, float("-inf"))).amax() if x_BT.numel() else one
    any_valid = valid_BT.any()
    return torch.where(any_valid, lo, one), torch.where(any_valid, hi, one)


def _advantages_BT(advantages_B: torch.Tensor, logps_BT: torch.Tensor) -> torch.Tensor:
    """One advantage per sequence (B,) broadcast over its tokens (B, T), in the log-probs' dtype; (B, T) kept."""
    adv_BT = advantages_B.unsqueeze(-1) if advantages_B.dim() == 1 else advantages_B
    return adv_BT.to(logps_BT.dtype).expand_as(logps_BT)


def _ratio_metrics(ratio_BT: torch.Tensor, logps_BT: torch.Tensor, old_logps_BT: torch.Tensor,
                   mask_BT: torch.Tensor) -> dict[str, torch.Tensor]:
    """The ratio metrics every loss reports (the clipped losses add their clip fractions)."""
    with torch.no_grad():
        r = ratio_BT.detach()
        r_min, r_max = _masked_extrema(r, mask_BT > 0)
        return {"loss/ratio_mean": masked_mean(r, mask_BT), "loss/ratio_min": r_min, "loss/ratio_max": r_max,
                "loss/approx_kl_old": masked_mean(kl_penalty(logps_BT.detach(), old_logps_BT, "k3"), mask_BT)}


# ------------------------------------------------------------------------------------------------ importance ratios
def importance_ratio(log_ratio_BT: torch.Tensor) -> torch.Tensor:
    """exp(log-ratio) with the log-ratio clamped to ±LOG_RATIO_CLAMP: the importance ratio every loss (and the KL
    term's importance weight, loss.kl_importance_weight) uses. Any shape; outside the clamp the gradient is 0."""
    return torch.exp(log_ratio_BT.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def _token_log_ratio(logps_BT: torch.Tensor, old_logps_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """GRPO: one log-ratio per token (0 on padding, so padding has ratio 1)."""
    return torch.where(mask_BT > 0, logps_BT - old_logps_BT, torch.zeros_like(logps_BT))


def _sequence_log_ratio(logps_BT: torch.Tensor, old_logps_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """GSPO: log s_i = masked mean over tokens of (logp − old), broadcast to every token of the row."""
    log_s_B = masked_mean(_token_log_ratio(logps_BT, old_logps_BT, mask_BT), mask_BT, dim=-1)
    return log_s_B.unsqueeze(-1).expand_as(logps_BT)


def _sequence_token_log_ratio(logps_BT: torch.Tensor, old_logps_BT: torch.Tensor,
                              mask_BT: torch.Tensor) -> torch.Tensor:
    """GSPO-token: log s_i,t = sg[log s_i] + logp_i,t − sg[logp_i,t]: the value of GSPO, a per-token gradient path."""
    log_s_BT = _sequence_log_ratio(logps_BT, old_logps_BT, mask_BT).detach()
    return log_s_BT + logps_BT - logps_BT.detach()


LOG_RATIOS: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "token": _token_log_ratio,  # GRPO
    "sequence": _sequence_log_ratio,  # GSPO
    "sequence_token": _sequence_token_log_ratio,  # GSPO-token
}
"""The only thing that differs between the clipped losses: how the importance log-ratio is formed (TRL's
importance_sampling_level names)."""


# ------------------------------------------------------------------------------------------------- the loss registry
class Rule(NamedTuple):
    """A rule on one loss hyper-parameter: `holds(value)`, and what it says (`"> 0"`), for --help and the error."""
    holds: Callable[[float], bool]
    says: str


def above(bound: float) -> Rule:
    return Rule(lambda v: v > bound, f"> {bound:g}")


def at_least(bound: float) -> Rule:
    return Rule(lambda v: v >= bound, f">= {bound:g}")


@dataclass(frozen=True)
class LossParam:
    """A loss's own hyper-parameter, set as `loss.params.<name>`: default and type from the loss function's
    signature, doc and rule from its registration (grpo/run/assembly/config_check.py applies the rule, naming the
    field)."""
    name: str
    default: float
    doc: str
    rule: Rule


@dataclass(frozen=True)
class LossSpec:
    """One registered policy loss: everything the config check, --help and the update read about it."""
    name: str
    fn: Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]
    """(logps_BT, old_logps_BT, advantages_B, mask_BT, **arguments) -> (loss_BT, metrics); see `policy_loss`."""
    ratio: str
    """The importance ratio it is built on, a key of LOG_RATIOS."""
    doc: str
    """One line for --help."""
    params: tuple[LossParam, ...]
    """Its own hyper-parameters (`loss.params.<name>`)."""
    fields: tuple[str, ...]
    """The loss section's own fields it takes (the clipped losses: CLIP_FIELDS, `loss.clip_low` ...)."""
    agg_mode: str | None
    """The aggregation (`loss.agg_mode`) it needs, None = any."""
    metrics: tuple[str, ...]
    """Its own metric keys beyond the ratio ones: off-policy, so averaged over the μ passes like them."""

    @property
    def arguments(self) -> tuple[str, ...]:
        """Every keyword argument `fn` takes after the four tensors."""
        return self.fields + tuple(p.name for p in self.params)

    def param(self, name: str) -> LossParam | None:
        return next((p for p in self.params if p.name == name), None)

    def bind(self, params: dict[str, float], **fields: float | None) -> Callable[..., tuple[torch.Tensor,
                                                                                        dict[str, torch.Tensor]]]:
        """`fn` with its hyper-parameters bound once for an update: `params` (loss.params, its own) and, of `fields`
        (the loss section's clip_low, clip_high, dual_clip), those it takes. What is left are the four tensors: the
        update calls the loss itself, one frame below it. A parameter it does not take is an error naming it."""
        unknown = sorted(set(params) - {p.name for p in self.params})
        if unknown:
            raise ValueError(f"policy loss {self.name!r} takes no {unknown}; its parameters: {self.arguments}")
        return functools.partial(self.fn, **{name: fields[name] for name in self.fields if name in fields}, **params)


POLICY_LOSSES: Registry[LossSpec] = Registry("loss.policy_loss", "policy loss")
"""Policy losses by name (`loss.policy_loss`), each registered once by `register_policy_loss` beside its function."""

CLIP_FIELDS = ("clip_low", "clip_high", "dual_clip")
"""The clipped losses' arguments: fields of the loss section itself (`loss.clip_low`, ...), shared by every clipped
loss; their defaults and rules are grpo/core/clip_rules.py's (the loss section's too), so they are not `loss.params`."""

TENSOR_ARGUMENTS = ("logps_BT", "old_logps_BT", "advantages_B", "mask_BT")
"""What every loss function takes first, in this order; its keyword arguments after them are its hyper-parameters."""


def register_policy_loss(name: str, *, ratio: str, doc: str, params: dict[str, tuple[str, Rule]] | None = None,
                         fields: tuple[str, ...] = (), agg_mode: str | None = None,
                         metrics: tuple[str, ...] = ()) -> Callable[[Callable], Callable]:
    """Decorator: register `fn(logps_BT, old_logps_BT, advantages_B, mask_BT, **hyper-parameters)` as the policy loss
    `name` (verl's `register_policy_loss`). That is all a new loss needs: the config check
    (grpo/run/assembly/config_check.py), --help (`losses_help`), the update (grpo/phases/update.py) and TRL's
    `loss_type` read it from here.

    params: doc and Rule of each hyper-parameter of `fn` that is its own (`loss.params.<name>`); its default and type
    are the signature's. fields: the loss section's fields it takes instead (CLIP_FIELDS). agg_mode: the `loss.agg_mode`
    it needs. metrics: its own metric keys. A parameter left undescribed, or described but not taken, is an error here.
    """
    params = params or {}

    def register(fn: Callable) -> Callable:
        where = f"register_policy_loss({name!r})"
        if name in POLICY_LOSSES:
            raise ValueError(f"{where}: a loss of that name is registered already ({POLICY_LOSSES[name].fn.__name__})")
        if ratio not in LOG_RATIOS:
            raise ValueError(f"{where}: ratio {ratio!r} is not one of {sorted(LOG_RATIOS)}")
        signature = list(inspect.signature(fn).parameters.values())
        if tuple(p.name for p in signature[:len(TENSOR_ARGUMENTS)]) != TENSOR_ARGUMENTS:
            raise ValueError(f"{where}: {fn.__name__} must take {TENSOR_ARGUMENTS} first")
        own = signature[len(TENSOR_ARGUMENTS):]
        taken = {p.name for p in own}
        undescribed = sorted(taken - set(fields) - set(params))
        stray = sorted((set(params) | set(fields)) - taken)
        no_default = sorted(p.name for p in own if p.name not in fields and type(p.default) is not float)
        if undescribed or stray or no_default:
            raise ValueError(f"{where}: {fn.__name__}'s hyper-parameters {sorted(taken)} need a doc and rule each in "
                             f"params (or be loss fields) and a float default (loss.params holds numbers as floats); "
                             f"undescribed {undescribed}, not taken {stray}, without a float default {no_default}")
        POLICY_LOSSES.register(name, doc, LossSpec(
            name=name, fn=fn, ratio=ratio, doc=" ".join(doc.split()),
            params=tuple(LossParam(p.name, p.default, *params[p.name]) for p in own if p.name not in fields),
            fields=tuple(fields), agg_mode=agg_mode, metrics=tuple(metrics)))
        return fn

    return register


def _clipped_policy_loss(ratio: str, logps_BT: torch.Tensor, old_logps_BT: torch.Tensor, advantages_B: torch.Tensor,
                         mask_BT: torch.Tensor, clip_low: float, clip_high: float,
                         dual_clip: float | None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The PPO clipped surrogate on the LOG_RATIOS[ratio] importance ratio, the one clip every clipped loss below
    calls. Returns the per-token loss (0 on padding) and metrics. The clip's rules are grpo/core/clip_rules.py's,
    which the loss section applies too: a call here and a config refuse the same values."""
    for field_name, value, fix in clip_problems(clip_low, clip_high, dual_clip):
        raise ValueError(f"{field_name}={value!r}: {fix}")
    old_logps_BT = old_logps_BT.detach()
    log_ratio_BT = LOG_RATIOS[ratio](logps_BT, old_logps_BT, mask_BT)
    adv_BT = _advantages_BT(advantages_B, logps_BT)
    ratio_BT = importance_ratio(log_ratio_BT)
    unclipped_BT = -adv_BT * ratio_BT
    clipped_BT = -adv_BT * ratio_BT.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss_BT = torch.maximum(unclipped_BT, clipped_BT)
    metrics: dict[str, torch.Tensor] = {}
    if dual_clip is not None:
        capped_BT = torch.minimum(loss_BT, -dual_clip * adv_BT)
        dual_BT = (adv_BT < 0) & (capped_BT < loss_BT)
        loss_BT = torch.where(adv_BT < 0, capped_BT, loss_BT)
        metrics["loss/dual_clip_frac"] = masked_mean(dual_BT.to(logps_BT.dtype), mask_BT).detach()
    loss_BT = torch.where(mask_BT > 0, loss_BT, torch.zeros_like(loss_BT))
    with torch.no_grad():
        r = ratio_BT.detach()
        low_BT = ((r < 1.0 - clip_low) & (adv_BT < 0)).to(r.dtype)  # clipping binds from below (TRL's definition)
        high_BT = ((r > 1.0 + clip_high) & (adv_BT > 0)).to(r.dtype)
        metrics["loss/clip_frac_low"] = masked_mean(low_BT, mask_BT)
        metrics["loss/clip_frac_high"] = masked_mean(high_BT, mask_BT)
    metrics.update(_ratio_metrics(ratio_BT, logps_BT, old_logps_BT, mask_BT))
    return loss_BT, metrics


@register_policy_loss("grpo", ratio="token", fields=CLIP_FIELDS, doc="""PPO's clipped surrogate on the token ratio
    (DeepSeekMath).""")
def grpo_loss(logps_BT: torch.Tensor, old_logps_BT: torch.Tensor, advantages_B: torch.Tensor, mask_BT: torch.Tensor,
              clip_low: float = CLIP_LOW, clip_high: float = CLIP_HIGH,
              dual_clip: float | None = DUAL_CLIP) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GRPO: the clipped surrogate on the per-token ratio; see `policy_loss`."""
    return _clipped_policy_loss("token", logps_BT, old_logps_BT, advantages_B, mask_BT, clip_low, clip_high,
                                dual_clip)


@register_policy_loss("gspo", ratio="sequence", fields=CLIP_FIELDS, doc="""the clipped surrogate on the sequence ratio
    (GSPO; its paper clips at ~3e-4 / 4e-4).""")
def gspo_loss(logps_BT: torch.Tensor, old_logps_BT: torch.Tensor, advantages_B: torch.Tensor, mask_BT: torch.Tensor,
              clip_low: float = CLIP_LOW, clip_high: float = CLIP_HIGH,
              dual_clip: float | None = DUAL_CLIP) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO: the clipped surrogate on the length-normalised sequence ratio; see `policy_loss`."""
    return _clipped_policy_loss("sequence", logps_BT, old_logps_BT, advantages_B, mask_BT, clip_low, clip_high,
                                dual_clip)


@register_policy_loss("gspo_token", ratio="sequence_token", fields=CLIP_FIELDS, doc="""GSPO's value with a per-token
    gradient path (GSPO-token).""")
def gspo_token_loss(logps_BT: torch.Tensor, old_logps_BT: torch.Tensor, advantages_B: torch.Tensor,
                    mask_BT: torch.Tensor, clip_low: float = CLIP_LOW, clip_high: float = CLIP_HIGH,
                    dual_clip: float | None = DUAL_CLIP) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO-token: the sequence ratio's value with each token's own gradient path; see `policy_loss`."""
    return _clipped_policy_loss("sequence_token", logps_BT, old_logps_BT, advantages_B, mask_BT, clip_low,
                                clip_high, dual_clip)


@register_policy_loss("luspo", ratio="sequence", fields=CLIP_FIELDS, agg_mode="seq-mean-token-sum", doc="""GSPO's
    clipped loss, each sequence weighted by its length (TRL's luspo).""")
def luspo_loss(logps_BT: torch.Tensor, old_logps_BT: torch.Tensor, advantages_B: torch.Tensor, mask_BT: torch.Tensor,
               clip_low: float = CLIP_LOW, clip_high: float = CLIP_HIGH,
               dual_clip: float | None = DUAL_CLIP) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """LUSPO: GSPO's clipped loss; the length weighting is its aggregation (seq-mean-token-sum); see `policy_loss`."""
    return _clipped_policy_loss("sequence", logps_BT, old_logps_BT, advantages_B, mask_BT, clip_low, clip_high,
                                dual_clip)


@register_policy_loss("cispo", ratio="token", metrics=("loss/cispo_clip_frac",), doc="""a clipped, detached ratio
    weight instead of the clip: no token loses its gradient (MiniMax-M1; TRL's cispo).""", params={
    "cispo_max_ratio": ("the importance weight is min(ratio, cispo_max_ratio), detached (ScaleRL's eps_max; TRL's "
                        "epsilon_high under loss_type cispo)", above(0))})
def cispo_loss(logps_BT: torch.Tensor, old_logps_BT: torch.Tensor, advantages_B: torch.Tensor, mask_BT: torch.Tensor,
               cispo_max_ratio: float = 5.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO: ℓ = −sg[min(r, ε_max)]·A·logp with the token ratio r. The ratio is a detached weight, so no token
    loses its gradient (PPO's clip drops the gradient of clipped tokens). Metric loss/cispo_clip_frac: share of
    tokens with r > ε_max and A > 0 (TRL's `cispo_clip_ratio`)."""
    if cispo_max_ratio <= 0:
        raise ValueError(f"policy_loss: cispo_max_ratio={cispo_max_ratio} must be > 0 (ScaleRL and TRL use 5.0)")
    old_logps_BT = old_logps_BT.detach()
    adv_BT = _advantages_BT(advantages_B, logps_BT)
    ratio_BT = importance_ratio(_token_log_ratio(logps_BT, old_logps_BT, mask_BT))
    weight_BT = ratio_BT.clamp(max=cispo_max_ratio).detach()
    loss_BT = torch.where(mask_BT > 0, -weight_BT * adv_BT * logps_BT, torch.zeros_like(logps_BT))
    metrics = _ratio_metrics(ratio_BT, logps_BT, old_logps_BT, mask_BT)
    metrics["loss/cispo_clip_frac"] = masked_mean(((ratio_BT > cispo_max_ratio) & (adv_BT > 0)).to(
        logps_BT.dtype), mask_BT).detach()
    return loss_BT, metrics


@register_policy_loss("sapo", ratio="token", doc="""a soft sigmoid gate of the token ratio instead of the clip
    (SAPO; TRL's sapo).""", params={
    "sapo_temperature_pos": ("gate temperature of tokens with a positive advantage (SAPO paper / TRL default 1.0)",
                             above(0)),
    "sapo_temperature_neg": ("gate temperature of tokens with a non-positive advantage (SAPO paper / TRL default "
                             "1.05)", above(0))})
def sapo_loss(logps_BT: torch.Tensor, old_logps_BT: torch.Tensor, advantages_B: torch.Tensor, mask_BT: torch.Tensor,
              sapo_temperature_pos: float = 1.0, sapo_temperature_neg: float = 1.05,
              ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """SAPO: ℓ = −(4/τ)·σ(τ·(r − 1))·A with the token ratio r, τ = τ_pos where A > 0 else τ_neg. The gate's slope
    is 1 at r = 1 (σ'(0) = 1/4), so on-policy SAPO has GRPO's gradient; far from r = 1 the gradient fades smoothly
    instead of being cut off."""
    if sapo_temperature_pos <= 0 or sapo_temperature_neg <= 0:
        raise ValueError(f"policy_loss: SAPO temperatures ({sapo_temperature_pos}, {sapo_temperature_neg}) must be "
                         "> 0 (the paper uses 1.0 for A > 0 and 1.05 otherwise)")
    old_logps_BT = old_logps_BT.detach()
    adv_BT = _advantages_BT(advantages_B, logps_BT)
    ratio_BT = importance_ratio(_token_log_ratio(logps_BT, old_logps_BT, mask_BT))
    tau_BT = torch.where(adv_BT > 0, torch.full_like(adv_BT, sapo_temperature_pos),
                         torch.full_like(adv_BT, sapo_temperature_neg))
    gate_BT = torch.sigmoid(tau_BT * (ratio_BT - 1.0)) * 4.0 / tau_BT
    loss_BT = torch.where(mask_BT > 0, -gate_BT * adv_BT, torch.zeros_like(logps_BT))
    return loss_BT, _ratio_metrics(ratio_BT, logps_BT, old_logps_BT, mask_BT)


VESPO_LOG_W_MIN = math.log(1e-8)
"""VESPO's sequence log-weight is clamped to [log 1e-8, LOG_RATIO_CLAMP], as TRL's reference code does."""
VESPO_LAMBDA_MIN = 1e-4
"""λ is floored at 1e-4 (TRL's clamp) so φ stays a decaying weight."""


def vespo_weights(log_ratio_BT: torch.Tensor, advantages_B: torch.Tensor, mask_BT: torch.Tensor, k_pos: float,
                  lambda_pos: float, k_neg: float, lambda_neg: float) -> torch.Tensor:
    """φ(w_i) per sequence, shape (B, 1), detached: log φ = λ + k·log w − λ·w with log w = Σ_t m·clamp(log-ratio)
    (a SUM over tokens, not GSPO's mean); (k, λ) = (k_pos, λ_pos) where A ≥ 0, else the negative pair. φ(1) = 1."""
    with torch.no_grad():
        log_w_B1 = (log_ratio_BT.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP) * mask_BT).sum(-1, keepdim=True)
        log_w_B1 = log_w_B1.clamp(VESPO_LOG_W_MIN, LOG_RATIO_CLAMP)
        adv_B1 = advantages_B.reshape(advantages_B.shape[0], -1)[:, :1].to(log_w_B1.dtype)
        nonneg = adv_B1 >= 0
        k_B1 = torch.where(nonneg, torch.full_like(adv_B1, k_pos), torch.full_like(adv_B1, k_neg))
        lam_B1 = torch.where(nonneg, torch.full_like(adv_B1, lambda_pos),
                             torch.full_like(adv_B1, lambda_neg)).clamp(min=VESPO_LAMBDA_MIN)
        log_phi_B1 = lam_B1 + k_B1 * log_w_B1 - lam_B1 * torch.exp(log_w_B1)
        return torch.exp(log_phi_B1).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


@register_policy_loss("vespo", ratio="token", metrics=("loss/vespo_phi_mean",), doc="""a detached gamma weight
    phi(w) of the sequence's summed token log-ratio (TRL's vespo).""", params={
    "vespo_k_pos": ("power k of the gamma weight phi(w) = e^lambda w^k e^(-lambda w) where the advantage is >= 0",
                    at_least(0)),
    "vespo_lambda_pos": ("decay lambda of the gamma weight where the advantage is >= 0", at_least(0)),
    "vespo_k_neg": ("power k of the gamma weight where the advantage is < 0", at_least(0)),
    "vespo_lambda_neg": ("decay lambda of the gamma weight where the advantage is < 0", at_least(0))})
def vespo_loss(logps_BT: torch.Tensor, old_logps_BT: torch.Tensor, advantages_B: torch.Tensor, mask_BT: torch.Tensor,
               vespo_k_pos: float = 2.0, vespo_lambda_pos: float = 3.0, vespo_k_neg: float = 3.0,
               vespo_lambda_neg: float = 2.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """VESPO: ℓ = −sg[φ(w_i)]·A·logp, φ the gamma weight of the sequence ratio (`vespo_weights`). Metric
    loss/vespo_phi_mean: the mean of φ over sequences (TRL's `vespo/phi_seq_mean`, over tokens there)."""
    old_logps_BT = old_logps_BT.detach()
    adv_BT = _advantages_BT(advantages_B, logps_BT)
    log_ratio_BT = _token_log_ratio(logps_BT, old_logps_BT, mask_BT)
    phi_B1 = vespo_weights(log_ratio_BT, advantages_B, mask_BT, vespo_k_pos, vespo_lambda_pos, vespo_k_neg,
                           vespo_lambda_neg).to(logps_BT.dtype)
    loss_BT = torch.where(mask_BT > 0, -phi_B1 * adv_BT * logps_BT, torch.zeros_like(logps_BT))
    ratio_BT = importance_ratio(log_ratio_BT)
    metrics = _ratio_metrics(ratio_BT, logps_BT, old_logps_BT, mask_BT)
    metrics["loss/vespo_phi_mean"] = masked_mean(phi_B1.expand_as(logps_BT), mask_BT).detach()
    return loss_BT, metrics


def policy_loss(name: str, logps_BT: torch.Tensor, old_logps_BT: torch.Tensor, advantages_B: torch.Tensor,
                mask_BT: torch.Tensor, **params: float | None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token policy loss `loss_BT` (0 where mask is 0) and `loss/*` metrics.

    name: a key of POLICY_LOSSES: "grpo" (token ratio), "gspo" (sequence ratio, whole sequence clipped),
    "gspo_token", "luspo", "cispo", "sapo", "vespo", or any loss registered by `register_policy_loss`.
    old_logps_BT: log-probs under the rollout policy (always detached here); on-policy, pass `logps_BT.detach()`.
    advantages_B: one advantage per sequence, shape (B,) (a (B, T) per-token tensor is accepted too).
    params: the loss's hyper-parameters (POLICY_LOSSES[name].arguments); left out, each takes its default. For the
    clipped losses: clip_low / clip_high, the ratio bounds [1 − clip_low, 1 + clip_high] (GSPO wants ~3e-4 / 4e-4),
    and dual_clip (c > 1 caps the loss of negative-advantage tokens at −c·A; None disables it).
    Metrics: loss/ratio_mean, loss/ratio_min, loss/ratio_max, loss/approx_kl_old (k3, masked mean); the clipped
    losses add loss/clip_frac_low, loss/clip_frac_high (and loss/dual_clip_frac when dual_clip is set); 0-dim
    detached tensors.
    """
    spec = POLICY_LOSSES.get(name)
    unknown = sorted(set(params) - set(spec.arguments))
    if unknown:
        raise ValueError(f"policy_loss: loss {name!r} takes no {unknown}; its parameters: {spec.arguments}")
    _check_shapes("policy_loss", logps_BT, old_logps_BT=old_logps_BT, mask_BT=mask_BT)
    if advantages_B.shape not in (logps_BT.shape[:1], logps_BT.shape):
        raise ValueError(f"policy_loss: advantages_B has shape {tuple(advantages_B.shape)}; expected "
                         f"({logps_BT.shape[0]},) (one per sequence) or {tuple(logps_BT.shape)}")
    return spec.fn(logps_BT, old_logps_BT, advantages_B, mask_BT, **params)


def losses_help() -> str:
    """The registered policy losses for --help: each with its ratio, what it is and its hyper-parameters."""
    lines = ["", "", "Policy losses for loss.policy_loss (grpo/core/losses.py POLICY_LOSSES; a loss's own "
             "hyper-parameters are set as --loss.params.<name> VALUE):"]
    for spec in POLICY_LOSSES.values():
        needs = f"; needs loss.agg_mode {spec.agg_mode}" if spec.agg_mode else ""
        takes = f"; takes {', '.join(f'loss.{f}' for f in spec.fields)}" if spec.fields else ""
        lines.append(f"  {spec.name} ({spec.ratio} ratio): {spec.doc.rstrip('.')}{takes}{needs}")
        lines += [f"    --loss.params.{p.name} ({type(p.default).__name__}, default {p.default!r}, {p.rule.says}): "
                  f"{p.doc}" for p in spec.params]
    return "\n".join(lines)


def top_entropy_mask(entropy_BT: torch.Tensor, mask_BT: torch.Tensor, quantile: float,
                     pool: torch.Tensor | None = None) -> torch.Tensor:
    """1.0 on the valid tokens whose entropy is ≥ the (1 − quantile) quantile of the valid entropies, else 0.0
    (TRL's `get_high_entropy_mask`, torch.quantile's linear interpolation). `pool`: the 1-D valid entropies the
    threshold is taken over, when wider than this batch (every rank's); default the valid entries of `entropy_BT`.
    quantile = 1 keeps every valid token; no valid token → all zeros."""
    if not 0.0 < quantile <= 1.0:
        raise ValueError(f"top_entropy_mask: quantile={quantile} must lie in (0, 1]")
    valid_BT = mask_BT > 0
    values = entropy_BT[valid_BT].float() if pool is None else pool.float()
    if values.numel() == 0:
        return torch.zeros_like(mask_BT)
    threshold = torch.quantile(values, 1.0 - quantile)
    return ((entropy_BT.float() >= threshold) & valid_BT).to(mask_BT.dtype)


# ------------------------------------------------------------------------------------------------------ aggregation
def _num(value: int | float | torch.Tensor | None, default: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    if value is None:
        value = default
    return torch.as_tensor(value, dtype=ref.dtype, device=ref.device).clamp(min=1.0)


def _token_mean(loss_BT, mask_BT, num_tokens, num_seqs, constant):
    return (loss_BT * mask_BT).sum() / _num(num_tokens, mask_BT.sum(), loss_BT)


def _seq_mean_token_mean(loss_BT, mask_BT, num_tokens, num_seqs, constant):
    per_seq_B = (loss_BT * mask_BT).sum(-1) / mask_BT.sum(-1).clamp(min=1.0)
    return per_seq_B.sum() / _num(num_seqs, torch.tensor(loss_BT.shape[0]), loss_BT)


def _seq_mean_token_sum(loss_BT, mask_BT, num_tokens, num_seqs, constant):
    per_seq_B = (loss_BT * mask_BT).sum(-1)
    return per_seq_B.sum() / _num(num_seqs, torch.tensor(loss_BT.shape[0]), loss_BT)


def _seq_mean_token_sum_norm(loss_BT, mask_BT, num_tokens, num_seqs, constant):
    if constant is None or constant <= 0:
        raise ValueError(f"aggregate: mode 'seq-mean-token-sum-norm' needs constant > 0 (got {constant!r}); "
                         "pass the maximum completion length (max_new_tokens), as Dr.GRPO does")
    per_seq_B = (loss_BT * mask_BT).sum(-1) / constant
    return per_seq_B.sum() / _num(num_seqs, torch.tensor(loss_BT.shape[0]), loss_BT)


AGG_MODES: Registry[Callable[..., torch.Tensor]] = Registry("loss.agg_mode", "loss aggregation")
"""How a per-token loss becomes the step's scalar, by name (loss.agg_mode)."""
AGG_MODES.register("token-mean", "Σ m·ℓ / tokens of the step (DAPO)", _token_mean)
AGG_MODES.register("seq-mean-token-mean", "each sequence's token mean, averaged over the step's sequences (GRPO)",
                   _seq_mean_token_mean)
AGG_MODES.register("seq-mean-token-sum", "each sequence's token sum, averaged over the step's sequences",
                   _seq_mean_token_sum)
AGG_MODES.register("seq-mean-token-sum-norm", "each sequence's token sum over max_new_tokens, averaged (Dr. GRPO)",
                   _seq_mean_token_sum_norm)


def aggregate(loss_BT: torch.Tensor, mask_BT: torch.Tensor, mode: str, num_tokens: int | torch.Tensor | None = None,
              num_seqs: int | torch.Tensor | None = None, constant: float | None = None) -> torch.Tensor:
    """Reduce a per-token loss to a scalar.

    num_tokens / num_seqs: the token / sequence count of the WHOLE optimizer step. Passing them makes the sum of
    micro-batch losses equal the full-batch loss exactly, so gradient accumulation changes nothing. When None, this
    batch's own counts are used (correct only when the batch is the whole step).
    constant: the Dr.GRPO normaliser for `seq-mean-token-sum-norm` (the maximum completion length).
    """
    mode_fn = AGG_MODES.get(mode)
    if loss_BT.shape != mask_BT.shape:
        raise ValueError(f"aggregate: loss_BT {tuple(loss_BT.shape)} and mask_BT {tuple(mask_BT.shape)} differ")
    return mode_fn(loss_BT, mask_BT.to(loss_BT.dtype), num_tokens, num_seqs, constant)


# ----------------------------------------------------------------------------------------------------- KL estimators
def _k1(logps_BT: torch.Tensor, ref_logps_BT: torch.Tensor) -> torch.Tensor:
    return logps_BT - ref_logps_BT


def _k2(logps_BT: torch.Tensor, ref_logps_BT: torch.Tensor) -> torch.Tensor:
    return 0.5 * (logps_BT - ref_logps_BT).square()


def _k3(logps_BT: torch.Tensor, ref_logps_BT: torch.Tensor) -> torch.Tensor:
    # expm1(x) − x is ≥ 0 for every float x (expm1 is accurate near 0, where exp(x) − 1 − x cancels to noise).
    log_ratio_BT = (ref_logps_BT - logps_BT).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.expm1(log_ratio_BT) - log_ratio_BT


def _k3_plus(logps_BT: torch.Tensor, ref_logps_BT: torch.Tensor) -> torch.Tensor:
    k2_BT = _k2(logps_BT, ref_logps_BT)
    return k2_BT + (_k3(logps_BT, ref_logps_BT) - k2_BT).detach()


KL_ESTIMATORS: Registry[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = Registry("loss.kl_estimator",
                                                                                          "KL estimator")
"""Per-token KL(π‖π_ref) estimators by name (loss.kl_estimator), with verl's names beside Schulman's."""
KL_ESTIMATORS.register("k1", "log π − log π_ref (unbiased, can be negative)", _k1)
KL_ESTIMATORS.register("k2", "½ (log π − log π_ref)²", _k2)
KL_ESTIMATORS.register("k3", "exp(ref − logp) − (ref − logp) − 1 (unbiased, ≥ 0)", _k3)
KL_ESTIMATORS.register("low_var_kl", "verl's name for k3", _k3)
KL_ESTIMATORS.register("k3+", "k3's value with k2's gradient", _k3_plus)
KL_ESTIMATORS.register("low_var_kl+", "verl's name for k3+", _k3_plus)


def kl_penalty(logps_BT: torch.Tensor, ref_logps_BT: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token KL(π‖π_ref) estimate from samples of π. Not masked: multiply by the mask (or aggregate) yourself.

    The reference log-probs are detached. k3 is ≥ 0 and finite for any finite inputs (log-ratio clamped to
    ±LOG_RATIO_CLAMP; beyond the clamp the gradient is 0).
    """
    estimator_fn = KL_ESTIMATORS.get(estimator)
    if logps_BT.shape != ref_logps_BT.shape:
        raise ValueError(f"kl_penalty: logps_BT {tuple(logps_BT.shape)} and ref_logps_BT "
                         f"{tuple(ref_logps_BT.shape)} differ")
    return estimator_fn(logps_BT, ref_logps_BT.detach())
