"""pass@k (grpo/core/pass_at_k.py) against Chen et al. 2021's definition worked by hand, and the diagnostic before RL
(grpo/phases/coverage.py, grpo_train.pass_at_k_phase) on the tiny model."""

import json
import math
from dataclasses import replace

import pytest
import torch

import grpo_train as G
from grpo.core.pass_at_k import guess_pass_at_k, mean_pass_at_k, pass_at_k
from grpo.core.step_types import Scored
from grpo.phases.coverage import pass_at_k_eval
from tests.trainer_helpers import fast_config

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: a tiny model gains nothing from threads


def test_pass_at_k_hand_values():
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)  # pass@1 = c / n
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 − C(3,2)/C(5,2)
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)  # 1 − C(7,5)/C(10,5)
    assert pass_at_k(4, 0, 2) == 0.0  # never right
    assert pass_at_k(4, 3, 2) == 1.0  # n − c = 1 < k: every k-subset holds a right one
    assert pass_at_k(3, 1, 3) == 1.0  # k = n: "at least one right"
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)
    assert mean_pass_at_k([(5, 2), (5, 0)], 2) == pytest.approx(0.35)
    assert math.isnan(mean_pass_at_k([], 2))
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(3, 1, 4)


def test_a_uniform_guess_pass_at_k_by_hand():
    assert guess_pass_at_k(3, 4) == pytest.approx(1 - 16 / 81)  # 0.802: BBQ's three options, pass@4
    assert guess_pass_at_k(2, 4) == pytest.approx(15 / 16)  # 0.9375: recognition's yes / no
    assert guess_pass_at_k(3, 1) == pytest.approx(1 / 3) and guess_pass_at_k(1, 5) == 1.0
    for m in range(1, 6):  # k = 2: both tries wrong with probability ((m - 1) / m)^2
        assert guess_pass_at_k(m, 2) == pytest.approx(1 - (m - 1) ** 2 / m ** 2)
    with pytest.raises(ValueError, match="choices >= 1"):
        guess_pass_at_k(0, 2)


def test_pass_at_k_eval_gives_a_guess_for_tasks_whose_samples_count_their_options(tmp_path):
    run = G.setup(fast_config(tmp_path))
    first, second = sorted(run.samples.heldout)
    heldout = {first: [replace(s, meta={**s.meta, "choices": c})
                       for s, c in zip(list(run.samples.heldout[first])[:2], (3, 2), strict=True)],
               second: list(run.samples.heldout[second])[:2]}  # no "choices": free answers, no guess to compare with
    train = replace(run.cfg.train, pass_at_k=2, pass_at_k_samples=3, pass_threshold=1.0, seed=0)
    m = pass_at_k_eval(run.policy.model, run.tokenizer, heldout, run.cfg.rollout, train, run.generation.stop_ids,
                       lambda rs: [Scored(r, reward=0.0) for r in rs])
    assert m[f"eval/{first}/pass_at_k_guess"] == pytest.approx(((1 - 4 / 9) + (1 - 1 / 4)) / 2)
    assert m[f"eval/{first}/pass_at_1_guess"] == pytest.approx((1 / 3 + 1 / 2) / 2)
    assert f"eval/{second}/pass_at_k_guess" not in m and m[f"eval/{second}/pass_at_k"] == 0.0


def test_pass_at_k_eval_counts_right_samples_per_prompt(tmp_path):
    run = G.setup(fast_config(tmp_path))
    seen = []

    def score(rollouts):
        scored = [Scored(r, reward=float(len(r.completion_ids) % 2 == 0)) for r in rollouts]  # crafted rule
        seen.extend(scored)
        return scored

    heldout = {t: list(s)[:3] for t, s in run.samples.heldout.items()}
    state = torch.get_rng_state()
    train = replace(run.cfg.train, pass_at_k=2, pass_at_k_samples=5, pass_threshold=1.0, seed=0)
    m = pass_at_k_eval(run.policy.model, run.tokenizer, heldout, run.cfg.rollout, train, run.generation.stop_ids, score,
                       prompts_per_batch=2)
    assert torch.equal(state, torch.get_rng_state())  # the run's random stream is untouched
    offset = 0
    for task, samples in heldout.items():
        rights = []
        for i, sample in enumerate(samples):
            group = seen[offset + i * 5: offset + (i + 1) * 5]
            assert all(s.rollout.sample is sample for s in group)
            rights.append(sum(s.reward >= 1.0 for s in group))
        offset += 5 * len(samples)
        assert m[f"eval/{task}/pass_at_k"] == pytest.approx(sum(pass_at_k(5, c, 2) for c in rights) / len(rights))
        assert m[f"eval/{task}/pass_at_1"] == pytest.approx(sum(rights) / (5 * len(rights)))
        assert m[f"eval/{task}/pass_at_1"] <= m[f"eval/{task}/pass_at_k"]


def test_pass_at_k_phase_writes_and_logs(tmp_path):
    run = G.setup(fast_config(tmp_path, "train.pass_at_k=2", "train.pass_at_k_samples=3", "train.pass_threshold=0.5"))
    metrics = G.pass_at_k_phase(run)
    assert set(metrics) == {f"eval/{t}/pass_at_{x}" for t in run.tasks for x in ("k", "1")}
    assert json.loads((run.run_dir / "pass_at_k.json").read_text()) == pytest.approx(metrics)
    assert all(0.0 <= v <= 1.0 for v in metrics.values())
