"""CISPO, SAPO, LUSPO and VESPO (grpo/core/losses.py) against numbers worked by hand and against TRL 1.16's own
computation on the same tensors.

TRL computes these losses inline in `GRPOTrainer._compute_loss` (trl/trainer/grpo_trainer.py:3109-3135 for the
per-token loss, 3153-3183 for the aggregation), so `_trl_loss` below repeats those lines; VESPO's weight is TRL's
static method `GRPOTrainer.get_gamma_weights` (grpo_trainer.py:2970-3015), called directly.
"""

import math

import pytest
import torch

from grpo.core.losses import CLIP_FIELDS, POLICY_LOSSES, aggregate, policy_loss, vespo_weights

F64 = torch.float64


def t(x, grad=False):
    return torch.tensor(x, dtype=F64, requires_grad=grad)


def _one_token(name, ratio, adv, **params):
    """Loss and d loss / d logp of a single token with importance ratio `ratio` (old log-prob −1)."""
    logps = t([[-1.0 + math.log(ratio)]], grad=True)
    loss, m = policy_loss(name, logps, t([[-1.0]]), t([adv]), t([[1.0]]), **params)
    loss.sum().backward()
    return float(loss.detach()), float(logps.grad), m


# ------------------------------------------------------------------------------------------------------ hand values
def test_cispo_hand_values():
    # ratio 1.5 ≤ ε_max = 5: weight 1.5 (detached): loss = −1.5·A·logp, logp = −1 + ln 1.5 = −0.594535.
    loss, grad, m = _one_token("cispo", 1.5, 1.0)
    assert loss == pytest.approx(-1.5 * (-1.0 + math.log(1.5))) and grad == pytest.approx(-1.5)
    assert float(m["loss/cispo_clip_frac"]) == 0.0 and float(m["loss/ratio_mean"]) == pytest.approx(1.5)
    # ratio 6 > 5 with A > 0: the weight is capped at 5 but the token KEEPS its gradient (PPO's clip would drop it).
    loss, grad, m = _one_token("cispo", 6.0, 1.0)
    assert grad == pytest.approx(-5.0) and float(m["loss/cispo_clip_frac"]) == 1.0
    # A < 0: the same cap; TRL counts only A > 0 tokens as clipped.
    loss, grad, m = _one_token("cispo", 6.0, -2.0)
    assert grad == pytest.approx(10.0) and float(m["loss/cispo_clip_frac"]) == 0.0
    _, grad, _ = _one_token("cispo", 6.0, 1.0, cispo_max_ratio=2.0)
    assert grad == pytest.approx(-2.0)


def test_sapo_hand_values():
    # r = 1, A = 1, τ = 1: loss = −4·σ(0) = −2; gradient −(4/τ)·σ'(0)·τ·r = −1, GRPO's on-policy gradient.
    loss, grad, _ = _one_token("sapo", 1.0, 1.0)
    assert loss == pytest.approx(-2.0) and grad == pytest.approx(-1.0)
    # r = 1.5, A = 1: loss = −4·σ(0.5) = −2.4898373; gradient −4·σ(0.5)(1 − σ(0.5))·1.5 = −1.4100223.
    s = 1.0 / (1.0 + math.exp(-0.5))
    loss, grad, _ = _one_token("sapo", 1.5, 1.0)
    assert loss == pytest.approx(-2.4898373, abs=1e-7) and grad == pytest.approx(-4 * s * (1 - s) * 1.5)
    assert grad == pytest.approx(-1.4100223, abs=1e-7)
    # A = −1 uses τ_neg = 1.05: r = 1 → loss = (4/1.05)·0.5 = 1.9047619, gradient 1.
    loss, grad, _ = _one_token("sapo", 1.0, -1.0)
    assert loss == pytest.approx(1.9047619, abs=1e-7) and grad == pytest.approx(1.0)
    # far off-policy the gradient fades instead of being cut: r = 10, A = 1 → −4·σ(9)(1−σ(9))·10 ≈ −4.9e-3 ≠ 0.
    _, grad, _ = _one_token("sapo", 10.0, 1.0)
    assert grad == pytest.approx(-4 * 10 * math.exp(-9) / (1 + math.exp(-9)) ** 2) and grad != 0.0


def test_vespo_hand_values():
    # log-ratios 0.1, 0.2 (padding ignored) → log w = 0.3 (a SUM); A = 1: k = 2, λ = 3:
    # log φ = 3 + 2·0.3 − 3·e^0.3 = 3.6 − 4.0495764 = −0.4495764, φ = 0.637898 (weight, detached).
    logps = t([[-1.0, -2.0, 0.0]], grad=True)
    old = t([[-1.1, -2.2, -5.0]])
    mask = t([[1.0, 1.0, 0.0]])
    phi = math.exp(3.6 - 3 * math.exp(0.3))
    assert phi == pytest.approx(0.637898, abs=1e-6)
    loss, m = policy_loss("vespo", logps, old, t([1.0]), mask)
    loss.sum().backward()
    torch.testing.assert_close(loss.detach(), t([[phi * 1.0, phi * 2.0, 0.0]]))
    torch.testing.assert_close(logps.grad, t([[-phi, -phi, 0.0]]))
    assert float(m["loss/vespo_phi_mean"]) == pytest.approx(phi)
    # A < 0: k = 3, λ = 2: log φ = 2 + 0.9 − 2·e^0.3.
    w = vespo_weights(logps.detach() - old, t([-1.0]), mask, 2.0, 3.0, 3.0, 2.0)
    assert float(w) == pytest.approx(math.exp(2.9 - 2 * math.exp(0.3)))
    # on-policy φ(1) = e^λ·1·e^−λ = 1: VESPO is REINFORCE, gradient −A on every token.
    w = vespo_weights(torch.zeros(2, 3, dtype=F64), t([1.0, -1.0]), torch.ones(2, 3, dtype=F64), 2.0, 3.0, 3.0, 2.0)
    torch.testing.assert_close(w, t([[1.0], [1.0]]))


def test_luspo_is_gspo_per_token_weighted_by_length():
    logps = t([[-1.0, -1.2, -0.8], [-0.5, 0.0, 0.0]])
    old = t([[-1.05, -1.25, -0.85], [-0.6, 0.0, 0.0]])
    mask = t([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    adv = t([1.0, -1.0])
    lu, _ = policy_loss("luspo", logps, old, adv, mask)
    gs, _ = policy_loss("gspo", logps, old, adv, mask)
    torch.testing.assert_close(lu, gs)
    # row 1: s = e^0.05 = 1.051271 (inside the clip): 3 tokens · −1.051271; row 2: s = e^0.1, A = −1: +1.105171.
    value = aggregate(lu, mask, "seq-mean-token-sum")
    assert float(value) == pytest.approx((-3 * math.exp(0.05) + math.exp(0.1)) / 2)


def test_each_loss_refuses_parameters_it_does_not_take():
    with pytest.raises(ValueError, match="cispo_max_ratio"):
        policy_loss("cispo", t([[0.0]]), t([[0.0]]), t([1.0]), t([[1.0]]), clip_low=0.2)
    with pytest.raises(ValueError, match="clip_low"):
        policy_loss("grpo", t([[0.0]]), t([[0.0]]), t([1.0]), t([[1.0]]), sapo_temperature_pos=1.0)
    assert POLICY_LOSSES["sapo"].arguments == ("sapo_temperature_pos", "sapo_temperature_neg")
    assert POLICY_LOSSES["grpo"].arguments == CLIP_FIELDS


# ------------------------------------------------------------------------------------------------------ TRL parity
trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer")


def _batch(seed=0, B=4, T=6):
    g = torch.Generator().manual_seed(seed)
    logps = (-torch.rand(B, T, generator=g, dtype=F64) * 3).requires_grad_(True)
    old = logps.detach() + 0.3 * torch.randn(B, T, generator=g, dtype=F64)
    mask = (torch.arange(T)[None] < torch.tensor([6, 3, 5, 1])[:, None]).to(F64)
    adv = torch.tensor([1.0, -0.5, 2.0, -1.5], dtype=F64)
    return logps, old, adv, mask


def _trl_loss(loss_type, per_token_logps, old_per_token_logps, advantages, mask, *, epsilon_low=0.2,
              epsilon_high=0.28, sapo_pos=1.0, sapo_neg=1.05, vespo=(2.0, 3.0, 3.0, 2.0)):
    """TRL 1.16's _compute_loss for one batch, no KL, no accumulation (grpo_trainer.py:3094-3183, copied)."""
    advantages = advantages.unsqueeze(1)
    log_ratio = per_token_logps - old_per_token_logps
    if loss_type == "luspo":  # importance_sampling_level="sequence", which TRL requires for luspo (:916)
        log_importance_weights = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    else:
        log_importance_weights = log_ratio
    coef_1 = torch.exp(log_importance_weights)
    if loss_type == "cispo":
        clamped_ratios = torch.clamp(coef_1, max=epsilon_high).detach()
        per_token_loss = -clamped_ratios * advantages * per_token_logps
    elif loss_type == "luspo":
        coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
        per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
    elif loss_type == "sapo":
        temperatures = torch.where(advantages > 0, sapo_pos, sapo_neg)
        soft_coef_1 = torch.sigmoid(temperatures * (coef_1 - 1)) * 4 / temperatures
        per_token_loss = -soft_coef_1 * advantages
    elif loss_type == "vespo":
        phi_seq = trl_grpo.GRPOTrainer.get_gamma_weights(advantages=advantages, log_ratio_per_token=log_ratio,
                                                        mask=mask, importance_sampling_ratio=None,
                                                        k_pos=vespo[0], lambda_pos=vespo[1], k_neg=vespo[2],
                                                        lambda_neg=vespo[3])
        per_token_loss = -phi_seq * advantages * per_token_logps
    if loss_type == "sapo":
        return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean(), per_token_loss
    if loss_type == "luspo":
        return (per_token_loss * mask).sum(-1).mean(), per_token_loss
    return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0), per_token_loss  # cispo, vespo: num_items


CASES = [  # (our name, our aggregation, our parameters, TRL's keyword arguments)
    ("cispo", "token-mean", {"cispo_max_ratio": 1.2}, {"epsilon_high": 1.2}),
    ("cispo", "token-mean", {}, {"epsilon_high": 5.0}),
    ("sapo", "seq-mean-token-mean", {"sapo_temperature_pos": 2.0, "sapo_temperature_neg": 0.5},
     {"sapo_pos": 2.0, "sapo_neg": 0.5}),
    ("luspo", "seq-mean-token-sum", {"clip_low": 0.1, "clip_high": 0.05}, {"epsilon_low": 0.1, "epsilon_high": 0.05}),
    ("vespo", "token-mean", {"vespo_k_pos": 1.5, "vespo_lambda_pos": 2.5, "vespo_k_neg": 2.0, "vespo_lambda_neg": 1.0},
     {"vespo": (1.5, 2.5, 2.0, 1.0)}),
]


@pytest.mark.parametrize("name,agg,params,trl_kwargs", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_trl_value_and_gradient(name, agg, params, trl_kwargs, seed):
    logps, old, adv, mask = _batch(seed)
    ours_BT, _ = policy_loss(name, logps, old, adv, mask, **params)
    ours = aggregate(ours_BT, mask, agg)
    (g_ours,) = torch.autograd.grad(ours, logps)
    trl_value, trl_BT = _trl_loss(name, logps, old, adv, mask, **trl_kwargs)
    (g_trl,) = torch.autograd.grad(trl_value, logps)
    torch.testing.assert_close(ours_BT, (trl_BT * mask).expand_as(ours_BT), atol=1e-12, rtol=0)
    torch.testing.assert_close(ours, trl_value, atol=1e-12, rtol=0)
    torch.testing.assert_close(g_ours, g_trl, atol=1e-12, rtol=0)
    assert g_ours.abs().sum() > 0
