"""The learning-efficiency options (DAPO's, Dr.GRPO's, the entropy controls) inside a real RL step of the tiny model:
each one switched on trains (finite loss, parameters moved) and reports its metrics; dynamic sampling trains on groups
with signal only."""

from __future__ import annotations

import math

import pytest
import torch

import grpo_train as G
from tests.trainer_helpers import fast_config

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: a tiny model gains nothing from threads


def _moved(run, before):
    return any(not torch.equal(p.detach(), before[n]) for n, p in run.policy.model.named_parameters())


@pytest.mark.parametrize("extra,key", [
    (["loss.policy_loss=cispo"], "loss/cispo_clip_frac"),
    (["loss.policy_loss=sapo"], "loss/ratio_mean"),
    (["loss.policy_loss=vespo", "loss.mu=2"], "loss/vespo_phi_mean"),
    (["loss.policy_loss=luspo", "loss.agg_mode=seq-mean-token-sum"], "loss/clip_frac_high"),
    (["loss.top_entropy_quantile=0.3"], "loss/entropy_token_frac"),
    (["loss.mask_truncated=true", "rollout.max_new_tokens=12"], "loss/total"),
    (["rollout.overlong_buffer=3"], "reward/overlong_penalty"),
    (["loss.multi_objective_aggregation=normalize_then_sum", "loss.adv_scale=batch"], "adv/mean"),
])
def test_each_option_trains_in_a_real_step(tmp_path, extra, key):
    run = G.setup(fast_config(tmp_path, *extra))
    before = {n: p.detach().clone() for n, p in run.policy.model.named_parameters()}
    metrics = G.rl_step(run, 1)
    assert key in metrics and math.isfinite(metrics[key]) and math.isfinite(metrics["loss/total"])
    if "loss/no_tokens" not in metrics:
        assert _moved(run, before)


def trained_batches(monkeypatch, run) -> list[tuple[list[str], torch.Tensor]]:
    """Each optimizer step's batch as (its rows' task names, its advantages), appended as G.rl_step trains."""
    import grpo.run.step_owners as owners

    seen = []
    real = owners.update_passes

    def spy(learner, batch, *args):
        seen.append(([run.tasks[i] for i in batch.task_ids_B.tolist()], batch.advantages_B.clone()))
        return real(learner, batch, *args)

    monkeypatch.setattr(owners, "update_passes", spy)
    return seen


def test_dynamic_sampling_trains_only_groups_with_signal(tmp_path, monkeypatch):
    run = G.setup(fast_config(tmp_path, "train.dynamic_sampling=true", "train.dynamic_sampling_max_rounds=4",
                              "rewards.fairness=tests.test_learning_methods_run:coarse_reward:1.0",
                              "rewards.hallucination=tests.test_learning_methods_run:coarse_reward:1.0"))
    seen = trained_batches(monkeypatch, run)
    for step in (1, 2):
        metrics = G.rl_step(run, step)
        assert {"rollout/dynamic_rounds", "rollout/dynamic_kept_groups"} <= set(metrics)
        adv = seen[-1][1]
        if metrics["rollout/dynamic_kept_groups"] > 0:  # else the documented all-zero fallback
            assert (adv.view(-1, run.cfg.rollout.k).abs().sum(-1) > 0).all()
        if not metrics["rollout/dynamic_short"]:
            assert adv.numel() == run.cfg.prompts_per_step * run.cfg.rollout.k


def test_dynamic_sampling_reports_what_was_sampled_and_each_tasks_kept_groups(tmp_path, monkeypatch):
    """A task whose every group gets one reward (collapsed onto one answer) keeps no group under dynamic sampling; its
    reward and answer metrics (what the doctor watches) must still describe the step's sampled replies, and
    rollout/<task>/dynamic_kept_groups says it trained on nothing. Before: the metrics were computed on the kept
    groups only, so the collapsed task vanished from them."""
    run = G.setup(fast_config(tmp_path, "train.dynamic_sampling=true", "train.dynamic_sampling_max_rounds=2",
                              "rewards.fairness=tests.test_learning_methods_run:coarse_reward:1.0",
                              "rewards.hallucination=tests.test_learning_methods_run:constant_reward:1.0"))
    seen = trained_batches(monkeypatch, run)
    metrics = G.rl_step(run, 1)
    assert metrics["reward/hallucination/mean"] == 0.25 and metrics["adv/hallucination/frac_zero_std"] == 1.0
    assert isinstance(metrics["rollout/hallucination/top_answer"], str)
    assert "hallucination" not in seen[-1][0]
    assert metrics["rollout/hallucination/dynamic_kept_groups"] == 0.0
    assert metrics["rollout/fairness/dynamic_kept_groups"] == metrics["rollout/dynamic_kept_groups"] > 0


def test_dynamic_sampling_keep_kl_trains_a_starved_task_on_its_kl_term_only(tmp_path, monkeypatch):
    """train.dynamic_sampling_keep_kl: the task that kept no group trains on its first-round groups with advantage 0,
    so its KL term (and kl/<task>, and its controller) still acts; the other task's groups are those with signal."""
    run = G.setup(fast_config(tmp_path, "train.dynamic_sampling=true", "train.dynamic_sampling_max_rounds=2",
                              "train.dynamic_sampling_keep_kl=true", "rollout.overlong_buffer=3",
                              "rewards.fairness=tests.test_learning_methods_run:coarse_reward:1.0",
                              "rewards.hallucination=tests.test_learning_methods_run:constant_reward:1.0"))
    seen = trained_batches(monkeypatch, run)
    k = run.cfg.rollout.k
    for step in (1, 2):  # step 2: the policy has moved, so the KL term is not 0
        metrics = G.rl_step(run, step)
        tasks, adv = seen[-1]
        halu = [i for i, t in enumerate(tasks) if t == "hallucination"]
        assert metrics["rollout/hallucination/dynamic_kept_groups"] == 0.0
        assert len(halu) == k * metrics["rollout/dynamic_kl_only_groups"] > 0  # its round-0 groups, at the end
        assert halu == list(range(len(tasks) - len(halu), len(tasks)))
        assert (adv[halu] == 0).all()  # KL only, even where the overlong penalty would tell replies apart
        fair = adv[:len(tasks) - len(halu)].view(-1, k)
        assert (fair.abs().sum(-1) > 0).all()  # the fairness groups kept have signal
        assert "kl/hallucination" in metrics
    assert metrics["kl/hallucination"] > 0


def test_keep_kl_without_dynamic_sampling_is_refused_naming_the_field():
    with pytest.raises(G.C.ConfigError, match="train.dynamic_sampling_keep_kl"):
        G.C.load_config("demo", ["train.dynamic_sampling_keep_kl=true"])


def constant_reward(completion: str, gold: dict) -> float:
    """The same reward for every completion: every group zero-variance."""
    return 0.25


def coarse_reward(completion: str, gold: dict) -> float:
    """1 for a completion with an even number of characters: many groups all-equal, many with signal."""
    return float(len(completion) % 2 == 0)
