"""Group-relative advantages: one scalar per sequence, from the rewards of the K completions of its prompt.

Groups are consecutive runs of `group_size` rewards (rollouts of one prompt are contiguous). Formulas:
- scale="group":  A_i = (r_i − mean_g) / (std_g + eps)       (GRPO, DeepSeekMath arXiv 2402.03300, §4.1.2)
- scale="batch":  A_i = (r_i − mean_g) / (std_batch + eps)   (Lite-PPO, arXiv 2508.08221: group mean, batch std)
- scale="none":   A_i = r_i − mean_g                         (Dr.GRPO, arXiv 2503.20783, §3.1)
- clip:           A_i ← clamp(A_i, −clip, clip)

Which std: the unbiased (Bessel, n − 1) sample std, the `torch.std` default used by DeepSeekMath's formula as
implemented in TRL and verl. Matching them keeps advantage magnitudes (and so the tuned learning rates and clip
ranges) comparable with published runs; the factor sqrt(K/(K−1)) it adds is a constant per group size anyway.

Failed rewards (NaN, or None in a list) are left out of their group's mean and std, get advantage 0 and are counted.
A group with fewer than two valid rewards, or whose valid rewards are all equal, carries no signal: every member
gets 0 and the group is counted in `adv/frac_zero_std`.

Metric values are 0-dim detached tensors; the loop converts them with `float()`.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from grpo.core.registry import Registry

ADV_SCALES: Registry[Callable[..., torch.Tensor]] = Registry("loss.adv_scale", "advantage scale")
"""How the centred rewards are scaled into advantages, by name (loss.adv_scale): each takes (centered_GK, r_GK,
valid_GK, mean_G, eps) and gives adv_GK."""

REWARD_TIE_ATOL = 1e-8
"""Rewards within 1e-8 of each other are ties: float rewards that differ only by rounding (0.1 + 0.2 vs 0.3) must not
be blown up into ±1 advantages by dividing noise by a noise-sized std."""


def _as_rewards(rewards_B: torch.Tensor | Sequence[float | None]) -> torch.Tensor:
    if isinstance(rewards_B, torch.Tensor):
        return rewards_B.detach().to(torch.float32 if not rewards_B.is_floating_point() else rewards_B.dtype)
    return torch.tensor([float("nan") if r is None else float(r) for r in rewards_B], dtype=torch.float32)


def masked_std(x: torch.Tensor, valid: torch.Tensor, mean: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The Bessel-corrected (n − 1) std of the valid entries of `x` along `dim`, about `mean` (x's shape without
    `dim`: the valid entries' mean, computed by the caller); 0 where fewer than two entries are valid."""
    count = valid.sum(dim)
    dev = torch.where(valid, x - mean.unsqueeze(dim), torch.zeros_like(x))
    var = dev.square().sum(dim) / (count - 1).clamp(min=1)
    return torch.where(count >= 2, var.sqrt(), torch.zeros_like(var))


@ADV_SCALES.register("group", "divided by the group's std (GRPO)")
def _group_scale(centered_GK: torch.Tensor, r_GK: torch.Tensor, valid_GK: torch.Tensor, mean_G: torch.Tensor,
                 eps: float) -> torch.Tensor:
    """Divided by the group's std (GRPO)."""
    return centered_GK / (masked_std(r_GK, valid_GK, mean_G).unsqueeze(-1) + eps)


@ADV_SCALES.register("batch", "divided by the std of the whole batch's rewards (TRL's scale_rewards=batch)")
def _batch_scale(centered_GK: torch.Tensor, r_GK: torch.Tensor, valid_GK: torch.Tensor, mean_G: torch.Tensor,
                 eps: float) -> torch.Tensor:
    """Divided by the std of the whole batch's rewards (REINFORCE++-style; TRL's scale_rewards="batch")."""
    flat_valid = valid_GK.reshape(1, -1)
    flat = r_GK.reshape(1, -1)
    batch_mean = torch.where(flat_valid, flat, torch.zeros_like(flat)).sum(-1) / flat_valid.sum().clamp(min=1)
    return centered_GK / (masked_std(flat, flat_valid, batch_mean).squeeze() + eps)


@ADV_SCALES.register("none", "not scaled: the centred rewards (Dr. GRPO)")
def _no_scale(centered_GK: torch.Tensor, r_GK: torch.Tensor, valid_GK: torch.Tensor, mean_G: torch.Tensor,
              eps: float) -> torch.Tensor:
    """Not scaled: the centred rewards (Dr. GRPO)."""
    return centered_GK


def group_advantages(rewards_B: torch.Tensor | Sequence[float | None], group_size: int, scale: str = "group",
                     eps: float = 1e-6, clip: float | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Advantages (B,) and `adv/*` metrics for rewards (B,) laid out as B/group_size groups of group_size.

    Metrics: adv/frac_zero_std (groups with < 2 valid or all-equal rewards), adv/num_failed (NaN rewards),
    adv/mean, adv/std, adv/abs_max (over the advantages of valid rewards).
    """
    scale_fn = ADV_SCALES.get(scale)
    if clip is not None and not clip > 0:
        raise ValueError(f"group_advantages: clip={clip!r} must be > 0, or None for no clipping")
    rewards = _as_rewards(rewards_B)
    if rewards.dim() != 1:
        raise ValueError(f"group_advantages: rewards_B must be 1-D, got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"group_advantages: {rewards.numel()} rewards do not split into groups of "
                         f"group_size={group_size}; pass the K rollouts of every prompt, contiguously")
    r_GK = rewards.view(-1, group_size)
    valid_GK = ~torch.isnan(r_GK)
    zeros_GK = torch.zeros_like(r_GK)
    count_G = valid_GK.sum(-1)
    mean_G = torch.where(valid_GK, r_GK, zeros_GK).sum(-1) / count_G.clamp(min=1)
    r_max_G = torch.where(valid_GK, r_GK, torch.full_like(r_GK, float("-inf"))).amax(-1)
    r_min_G = torch.where(valid_GK, r_GK, torch.full_like(r_GK, float("inf"))).amin(-1)
    degenerate_G = (count_G < 2) | (r_max_G - r_min_G <= REWARD_TIE_ATOL)

    centered_GK = torch.where(valid_GK, r_GK - mean_G.unsqueeze(-1), zeros_GK)
    adv_GK = scale_fn(centered_GK, r_GK, valid_GK, mean_G, eps)
    adv_GK = torch.where(degenerate_G.unsqueeze(-1) | ~valid_GK, zeros_GK, adv_GK)
    if clip is not None:
        adv_GK = adv_GK.clamp(-clip, clip)
    advantages_B = adv_GK.reshape(-1)

    valid_B = valid_GK.reshape(-1)
    valid_adv = advantages_B[valid_B]
    empty = valid_adv.numel() == 0
    zero = torch.zeros((), dtype=advantages_B.dtype)
    metrics = {
        "adv/frac_zero_std": degenerate_G.to(torch.float32).mean(),
        "adv/num_failed": (~valid_B).sum().to(torch.float32),
        "adv/mean": zero if empty else valid_adv.mean(),
        "adv/std": zero if empty else valid_adv.std(unbiased=False),
        "adv/abs_max": zero if empty else valid_adv.abs().max(),
    }
    return advantages_B, metrics


MULTI_OBJECTIVE_AGGREGATIONS: Registry[Callable[..., torch.Tensor] | None] = Registry(
    "loss.multi_objective_aggregation", "multi-objective aggregation")
"""How a task's reward terms reach the advantages, by name (loss.multi_objective_aggregation; TRL's
multi_objective_aggregation): the function that turns the term matrix into rewards, or None for the task's reward
itself (grpo/run/step_owners.py Rewarder._group_advantages)."""
MULTI_OBJECTIVE_AGGREGATIONS.register("sum_then_normalize", "the task's reward (loss.reward_aggregation), then group "
                                      "advantages", None)

GDPO_EPS = 1e-4
"""The std floor of GDPO's per-term normalisation (TRL's 1e-4)."""


@MULTI_OBJECTIVE_AGGREGATIONS.register("normalize_then_sum", "GDPO: each reward term normalised in its group, then "
                                      "the weighted sum")
def normalize_then_sum(values_BM: torch.Tensor, weights_BM: torch.Tensor, group_size: int,
                       eps: float = GDPO_EPS) -> torch.Tensor:
    """GDPO (TRL `multi_objective_aggregation="normalize_then_sum"`): every reward term is normalised within its
    group, (x − mean_g) / (std_g + eps) over the group's finite values (unbiased std; 0 with fewer than two), and the
    normalised terms are summed with their weights: r_i = Σ_m w_i,m · ẑ_i,m. Returns rewards (B,).

    values_BM: the raw value of term m for rollout i (NaN = failed); weights_BM: its weight for that rollout's task,
    0 where the term is not one of the task's (several tasks' terms share the columns). A rollout with a failed term
    of its own gets NaN (left out of the advantages, as a failed reward is), never a partial sum. Terms on different
    scales then weigh by their weights only, not by their spread (the reason GDPO normalises first).
    """
    if values_BM.shape != weights_BM.shape or values_BM.dim() != 2:
        raise ValueError(f"normalize_then_sum: values_BM {tuple(values_BM.shape)} and weights_BM "
                         f"{tuple(weights_BM.shape)} must be one (B, M) shape")
    B, M = values_BM.shape
    if group_size < 1 or B % group_size:
        raise ValueError(f"normalize_then_sum: {B} rows do not split into groups of group_size={group_size}")
    x_GKM = values_BM.to(torch.float64).view(-1, group_size, M)
    valid_GKM = ~torch.isnan(x_GKM)
    zeros = torch.zeros_like(x_GKM)
    count_GM = valid_GKM.sum(1)
    mean_GM = torch.where(valid_GKM, x_GKM, zeros).sum(1) / count_GM.clamp(min=1)
    dev_GKM = torch.where(valid_GKM, x_GKM - mean_GM.unsqueeze(1), zeros)
    std_GM = masked_std(x_GKM, valid_GKM, mean_GM, dim=1)
    scale_G1M = (std_GM + eps).unsqueeze(1)
    z_BM = torch.where(valid_GKM & (scale_G1M > 0), dev_GKM / scale_G1M.clamp(min=1e-300), zeros).reshape(B, M)
    weights = weights_BM.to(torch.float64)
    own_failed_B = (torch.isnan(values_BM) & (weights_BM != 0)).any(-1)
    rewards_B = (weights * z_BM).sum(-1)
    return torch.where(own_failed_B, torch.full_like(rewards_B, float("nan")), rewards_B).to(torch.float32)
