"""GDPO's normalise-then-sum of several reward terms per task (grpo/core/advantages.normalize_then_sum) against
numbers worked by hand and against TRL 1.16's `multi_objective_aggregation="normalize_then_sum"` branch of
`GRPOTrainer._generate_and_score_completions` (trl/trainer/grpo_trainer.py:2790-2797, repeated below on the same
tensors with TRL's own `nanstd`), and term_matrix (grpo/grading/scoring.py) on scored rollouts."""

import math

import pytest
import torch

from grpo.core.advantages import group_advantages, normalize_then_sum
from grpo.core.step_types import Rollout, Sample, Scored
from grpo.grading.scoring import JUDGE_TERM, RewardSpec, term_matrix

F64 = torch.float64


def test_hand_values():
    # one group of K = 3, two terms: a = (1, 0, 0) (mean 1/3, unbiased std 0.57735), b = (10, 30, 20) (mean 20,
    # std 10). z_a = (1.15470, −0.57735, −0.57735), z_b = (−1, 1, 0) (eps = 0 here); weights (1, 2):
    # r = (1.15470 − 2, −0.57735 + 2, −0.57735) = (−0.84530, 1.42265, −0.57735).
    values = torch.tensor([[1.0, 10.0], [0.0, 30.0], [0.0, 20.0]], dtype=F64)
    weights = torch.tensor([[1.0, 2.0]] * 3, dtype=F64)
    r = normalize_then_sum(values, weights, 3, eps=0.0)
    torch.testing.assert_close(r, torch.tensor([-0.8452995, 1.4226497, -0.5773503]), atol=1e-6, rtol=0)
    # a term that is constant in the group contributes 0; fewer than two valid values: 0
    flat = normalize_then_sum(torch.tensor([[5.0], [5.0], [5.0]]), torch.ones(3, 1), 3)
    assert torch.equal(flat, torch.zeros(3))


def test_failed_terms_and_other_tasks_terms():
    nan = float("nan")
    # rows 0-1: task x (term 0 only, weight 1); rows 2-3: task y (term 1 only, weight 1); row 3's term failed
    values = torch.tensor([[1.0, nan], [0.0, nan], [nan, 0.2], [nan, nan]], dtype=F64)
    weights = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]], dtype=F64)
    r = normalize_then_sum(values, weights, 2, eps=0.0)
    s = math.sqrt(0.5)  # unbiased std of (1, 0)
    assert r[0].item() == pytest.approx(0.5 / s) and r[1].item() == pytest.approx(-0.5 / s)
    assert r[2].item() == 0.0  # one valid value in its group: normalised to 0
    assert math.isnan(r[3].item())  # its own term failed: the reward fails, never a partial sum


trl_utils = pytest.importorskip("trl.trainer.utils")


def _trl_normalize_then_sum(rewards_per_func, reward_weights, num_generations):
    """grpo_trainer.py:2790-2797 of TRL 1.16, verbatim but for `self.` and the device."""
    grouped = rewards_per_func.view(-1, num_generations, rewards_per_func.shape[1])
    mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
    std_k = trl_utils.nanstd(grouped, dim=1, keepdim=True) if num_generations > 1 else torch.zeros_like(mean_k)
    reward_k = (grouped - mean_k) / (std_k + 1e-4)
    reward_k = reward_k.view(-1, rewards_per_func.shape[1])
    rewards = (reward_k * reward_weights.unsqueeze(0)).nansum(dim=1)
    std_rewards = trl_utils.nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
    advantages = (rewards - torch.nanmean(rewards)) / (std_rewards + 1e-4)
    return rewards, advantages


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_trl_rewards_and_batch_scaled_advantages(seed):
    g = torch.Generator().manual_seed(seed)
    K, G, M = 4, 5, 3
    values = torch.rand(G * K, M, generator=g, dtype=F64) * torch.tensor([1.0, 10.0, 0.1], dtype=F64)
    values[:K, 2] = 0.05  # a term constant in a group
    weights = torch.tensor([1.0, 0.5, 2.0], dtype=F64)
    ours = normalize_then_sum(values, weights.expand(G * K, M), K).to(F64)
    theirs, trl_adv = _trl_normalize_then_sum(values, weights, K)
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-6)
    # TRL then divides by the batch std; the sum is already group-centred, so loss.adv_scale=batch gives the same
    adv, _ = group_advantages(ours, K, scale="batch", eps=1e-4)
    torch.testing.assert_close(adv.to(F64), trl_adv, atol=1e-5, rtol=1e-5)


def _scored(task, parts, reward):
    return Scored(Rollout(Sample(task, "0", ()), (1,), (2,), "", True, False), reward=reward, parts=parts)


def test_term_matrix_reads_the_terms_of_each_rows_task_with_the_judge_fallback():
    specs = {"x": RewardSpec("x", (("fmt", 1.0), (JUDGE_TERM, 3.0)), fallback="rule"),
             "y": RewardSpec("y", (("fmt", 2.0), ("other", 1.0)))}
    scored = [_scored("x", {"fmt": 1.0, JUDGE_TERM: 0.5}, 0.625),
              _scored("x", {"fmt": 0.0, JUDGE_TERM: None, "fallback:rule": 1.0}, 0.75),
              _scored("y", {"fmt": 0.5, "other": None}, None)]
    names = {"fmt": "fmt", JUDGE_TERM: JUDGE_TERM, "rule": "rule", "other": "other"}  # the parts' keys
    values, weights = term_matrix(scored, specs, names)
    nan = float("nan")
    torch.testing.assert_close(values, torch.tensor([[1.0, 0.5, nan], [0.0, 1.0, nan], [0.5, nan, nan]],
                                                    dtype=F64), equal_nan=True)
    torch.testing.assert_close(weights, torch.tensor([[1.0, 3.0, 0.0], [1.0, 3.0, 0.0], [2.0, 0.0, 1.0]],
                                                     dtype=F64))
    # the weighted mean of each row's own terms is the scorer's reward (sum-then-normalise's input)
    means = (torch.nan_to_num(values) * weights).sum(-1) / weights.sum(-1)
    assert means[:2].tolist() == pytest.approx([0.625, 0.75])
