"""Adaptive entropy control (grpo/core/entropy_control.py) against a sequence worked by hand and against TRL 1.16's
controller (trl/trainer/grpo_trainer.py:3206-3239, repeated below), and its wiring: the coefficient reaches the loss,
moves in a real RL step and survives a checkpoint."""

import copy
import math

import pytest
import torch

import grpo_train as G
from grpo.config import LossConfig
from grpo.core.entropy_control import AdaptiveEntropyCoef
from grpo.phases.update import Learner, StepSettings, update_passes
from grpo.run.checkpoint.save_resume import checkpoint_state
from tests.trainer_helpers import fast_config, rollout_batch

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: a tiny model gains nothing from threads


def test_hand_sequence():
    c = AdaptiveEntropyCoef(coef=0.01, target=0.5, delta=0.01, coef_min=0.0, coef_max=0.025)
    assert c.value == 0.0  # nothing measured yet: +inf > target, no bonus
    applied = []
    for h in (0.3, 0.4, 0.2, 0.9, 0.7, 0.5, float("nan")):
        c.update(h)
        applied.append(round(c.value, 10))
    # 0.3 ≤ 0.5: 0.02 (applied); 0.4: 0.03 → capped 0.025; 0.2: 0.025; 0.9 > 0.5: 0.015 but not applied (H > target);
    # 0.7: 0.005, not applied; 0.5 ≤ 0.5: 0.015, applied; NaN: unchanged
    assert applied == [0.02, 0.025, 0.025, 0.0, 0.0, 0.015, 0.015]
    assert c.coef == pytest.approx(0.015) and c.last_entropy == 0.5
    c2 = AdaptiveEntropyCoef(coef=0.0, target=0.5)
    c2.load_state_dict(c.state_dict())
    assert c2.value == c.value


def _trl_controller(entropies, coef, target, delta, lo, hi):
    """TRL's coefficient applied at each step (grpo_trainer.py:3206-3209) and its update (3231-3239)."""
    last, applied = float("inf"), []
    for world_entropy in entropies:
        applied.append(coef if last <= target else 0.0)
        if world_entropy <= target:
            coef = min(coef + delta, hi)
        else:
            coef = max(coef - delta, lo)
        last = world_entropy
    return applied


@pytest.mark.parametrize("seed", [0, 1])
def test_matches_trl(seed):
    g = torch.Generator().manual_seed(seed)
    entropies = (torch.rand(40, generator=g) * 0.6).tolist()
    ours, applied = AdaptiveEntropyCoef(0.02, 0.3, 0.005, 0.0, 0.05), []
    for h in entropies:
        applied.append(ours.value)
        ours.update(h)
    assert applied == pytest.approx(_trl_controller(entropies, 0.02, 0.3, 0.005, 0.0, 0.05), abs=1e-12)


def test_step_coefficient_replaces_the_configured_one(tmp_path):
    run = G.setup(fast_config(tmp_path))
    batch = rollout_batch(run, 2, 4)
    params = {}
    for name, loss, coef in (("config", LossConfig(entropy_coef=0.5), None), ("step", LossConfig(), 0.5),
                             ("none", LossConfig(), None)):
        m = copy.deepcopy(run.policy.model)
        p = [x for x in m.parameters() if x.requires_grad]
        metrics = update_passes(Learner(m, torch.optim.SGD(p, lr=1.0), p), copy.copy(batch), torch.tensor([0.0, 0.0]),
                             loss, run.tasks, StepSettings(micro_batch_seqs=4, temperature=1.0, max_grad_norm=1e9,
                                                           skip_grad_norm=1e9, entropy_coef=coef))
        params[name] = p
        assert "entropy/all" in metrics and "kl/all" in metrics  # TRL's entropy and kl, whatever the coefficient
    for a, b in zip(params["config"], params["step"], strict=True):
        torch.testing.assert_close(a, b)
    assert any(not torch.equal(a, b) for a, b in zip(params["config"], params["none"], strict=True))


def test_adaptive_control_in_real_steps_and_checkpoint(tmp_path):
    run = G.setup(fast_config(tmp_path, "loss.entropy_target=100.0", "loss.entropy_coef=0.01",
                              "loss.entropy_coef_delta=0.02"))
    first = G.rl_step(run, 1)
    assert first["loss/entropy_coef"] == 0.0  # nothing measured before step 1
    second = G.rl_step(run, 2)
    # step 1's entropy (a few nats) ≤ 100: the coefficient rose to 0.03 and applies at step 2
    assert second["loss/entropy_coef"] == pytest.approx(0.03)
    assert math.isfinite(run.updater.entropy_control.last_entropy)
    assert checkpoint_state(run)["entropy_control"] == run.updater.entropy_control.state_dict()
