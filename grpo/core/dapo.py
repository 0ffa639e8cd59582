"""DAPO's reward-side methods (Yu et al. 2025, arXiv 2503.14476), as pure functions of rewards and lengths.

- Soft overlong punishment (§3.4, eq. 13), with L_max the generation cap and L_cache the buffer before it:
      R_length(y) = 0                                  if |y| ≤ L_max − L_cache
                  = ((L_max − L_cache) − |y|) / L_cache  if L_max − L_cache < |y| ≤ L_max
                  = −1                                 if L_max < |y|
  added to the task reward (scaled by a factor, verl's `overlong_buffer.penalty_factor`).
- Dynamic sampling (§3.2): a group whose K rewards are all equal has advantage 0 on every member, so it carries no
  policy gradient; DAPO drops such groups and samples more prompts until the batch is full of groups with signal.
  `informative_groups` says which groups have signal; `fill_informative_groups` runs the refill loop over a callable
  that produces one more round of scored groups, with a cap on the rounds.
"""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

import torch

from grpo.core.advantages import REWARD_TIE_ATOL

T = TypeVar("T")


def overlong_penalty(lengths_B: torch.Tensor, max_len: int, cache_len: int, factor: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment per completion (≤ 0), times `factor`. lengths_B: completion lengths in tokens
    (the stop token included); max_len: L_max (rollout.max_new_tokens); cache_len: L_cache, 0 < L_cache ≤ L_max."""
    if not 0 < cache_len <= max_len:
        raise ValueError(f"overlong_penalty: cache_len={cache_len} must lie in (0, max_len={max_len}]")
    lengths = lengths_B.to(torch.float64)
    soft = ((max_len - cache_len) - lengths) / cache_len
    penalty = torch.where(lengths <= max_len - cache_len, torch.zeros_like(lengths),
                          torch.where(lengths <= max_len, soft, -torch.ones_like(lengths)))
    return (factor * penalty).to(torch.float32)


def informative_groups(rewards_B: torch.Tensor, group_size: int) -> torch.Tensor:
    """(G,) bool: the groups (consecutive runs of `group_size` rewards) with at least two finite rewards that are not
    all equal (within REWARD_TIE_ATOL): exactly the groups to which group_advantages gives a non-zero advantage."""
    if group_size < 2 or rewards_B.numel() % group_size:
        raise ValueError(f"informative_groups: {rewards_B.numel()} rewards do not split into groups of "
                         f"group_size={group_size} >= 2")
    r_GK = rewards_B.detach().to(torch.float64).view(-1, group_size)
    valid_GK = ~torch.isnan(r_GK)
    hi_G = torch.where(valid_GK, r_GK, torch.full_like(r_GK, float("-inf"))).amax(-1)
    lo_G = torch.where(valid_GK, r_GK, torch.full_like(r_GK, float("inf"))).amin(-1)
    return (valid_GK.sum(-1) >= 2) & (hi_G - lo_G > REWARD_TIE_ATOL)


def fill_informative_groups(produce: Callable[[int], Sequence[T]], reward: Callable[[T], float | None],
                            group_size: int, target_groups: int, max_rounds: int,
                            ) -> tuple[list[T], dict[str, float]]:
    """Dynamic sampling: call `produce(round)` (round 0, 1, ...; each returns whole groups of `group_size` items,
    contiguous) and keep only the informative groups, until `target_groups` are kept or `max_rounds` extra rounds
    (after round 0) have run. Returns exactly `target_groups` groups (the first ones found, in order) when reached.

    At the cap with fewer: the groups found so far (a smaller batch). When no round found any, round 0's groups come
    back unfiltered (their advantages are all 0: the step's policy term is 0 and only the KL / entropy terms act,
    as without dynamic sampling), so a step always has a batch. Metrics: rollout/dynamic_rounds (extra rounds run),
    rollout/dynamic_kept_groups, rollout/dynamic_dropped_groups, rollout/dynamic_short (1 when the cap left the batch
    short)."""
    if target_groups < 1 or max_rounds < 0:
        raise ValueError(f"fill_informative_groups: target_groups={target_groups} must be >= 1 and "
                         f"max_rounds={max_rounds} >= 0")
    kept: list[T] = []
    first: list[T] = []
    dropped = 0
    rounds = 0
    for round_ in range(max_rounds + 1):
        items = list(produce(round_))
        if round_ == 0:
            first = items
        rounds = round_
        rewards = torch.tensor([float("nan") if reward(x) is None else float(reward(x)) for x in items],
                               dtype=torch.float64)
        for g, ok in enumerate(informative_groups(rewards, group_size).tolist()):
            if ok and len(kept) < target_groups * group_size:
                kept.extend(items[g * group_size:(g + 1) * group_size])
            elif not ok:
                dropped += 1
        if len(kept) >= target_groups * group_size:
            break
    short = len(kept) < target_groups * group_size
    metrics = {"rollout/dynamic_rounds": float(rounds), "rollout/dynamic_kept_groups": float(len(kept) // group_size),
               "rollout/dynamic_dropped_groups": float(dropped), "rollout/dynamic_short": float(short)}
    return (kept if kept else first), metrics


def kl_only_advantages(advantages_B: torch.Tensor, kl_only_rows: int) -> torch.Tensor:
    """The advantages with the last `kl_only_rows` set to 0: groups kept for their KL term only
    (train.dynamic_sampling_keep_kl), appended after the informative ones. Their group advantages are 0 already
    unless a shaping term (DAPO's overlong penalty) tells their completions apart; 0 keeps them out of the policy
    gradient. A new tensor; `advantages_B` is left as it is."""
    if not 0 <= kl_only_rows <= advantages_B.numel():
        raise ValueError(f"kl_only_advantages: kl_only_rows={kl_only_rows} must lie in [0, {advantages_B.numel()}]")
    if not kl_only_rows:
        return advantages_B
    return torch.cat([advantages_B[:-kl_only_rows], advantages_B.new_zeros(kl_only_rows)])
