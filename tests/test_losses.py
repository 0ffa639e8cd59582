"""Policy losses, aggregation, KL estimators and entropy against hand-computed values and equivalences."""

import inspect
import math
from itertools import pairwise

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo.core.kernels import entropy_from_logits
from grpo.core.losses import (
    AGG_MODES,
    CLIP_FIELDS,
    KL_ESTIMATORS,
    LOG_RATIO_CLAMP,
    POLICY_LOSSES,
    aggregate,
    importance_ratio,
    kl_penalty,
    masked_mean,
    policy_loss,
)

F64 = torch.float64


def t(x, dtype=F64, grad=False):
    return torch.tensor(x, dtype=dtype, requires_grad=grad)


# ------------------------------------------------------------------------------------------------ GSPO worked example
GSPO_LOGPS = [[-2.0, -1.8, -1.5, -1.2, 0.0], [-1.9, -1.6, -1.3, 0.0, 0.0]]
GSPO_OLD = [[-2.2, -2.0, -1.6, -1.3, 0.0], [-2.1, -1.8, -1.5, 0.0, 0.0]]
GSPO_MASK = [[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]]


def test_gspo_worked_example_single_row():
    # Token log-ratios 0.2, 0.2, 0.1, 0.1 → mean 0.15 → s = e^0.15 = 1.161834; A = 1, inside [0.8, 1.28].
    loss, m = policy_loss("gspo", t(GSPO_LOGPS[:1]), t(GSPO_OLD[:1]), t([1.0]), t(GSPO_MASK[:1]))
    expected = [-1.1618342427, -1.1618342427, -1.1618342427, -1.1618342427, 0.0]
    torch.testing.assert_close(loss, t([expected]), atol=1e-9, rtol=0)
    assert float(m["loss/ratio_mean"]) == pytest.approx(1.1618342427, abs=1e-9)


def test_gspo_worked_example_two_rows():
    # Row 2: log-ratios 0.2, 0.2, 0.2 → 0.2 → s = e^0.2 = 1.221403; loss = −A·s, A = (1, 2).
    loss, m = policy_loss("gspo", t(GSPO_LOGPS), t(GSPO_OLD), t([1.0, 2.0]), t(GSPO_MASK))
    s1, s2 = 1.1618342427, 1.2214027582
    expected = [[-s1] * 4 + [0.0], [-2 * s2] * 3 + [0.0, 0.0]]
    torch.testing.assert_close(loss, t(expected), atol=1e-9, rtol=0)
    assert float(m["loss/ratio_min"]) == pytest.approx(s1, abs=1e-9)
    assert float(m["loss/ratio_max"]) == pytest.approx(s2, abs=1e-9)
    assert float(m["loss/ratio_mean"]) == pytest.approx((4 * s1 + 3 * s2) / 7, abs=1e-9)
    # approx_kl_old is token-level k3 = exp(−d) + d − 1 for each token log-ratio d.
    k3 = lambda d: math.exp(-d) + d - 1  # noqa: E731
    kl = (2 * k3(0.2) + 2 * k3(0.1) + 3 * k3(0.2)) / 7
    assert float(m["loss/approx_kl_old"]) == pytest.approx(kl, abs=1e-9)


# -------------------------------------------------------------------------------------------------- gradients match
def _grad(name, logps, old, adv, mask, mode="seq-mean-token-mean", **kw):
    x = logps.clone().requires_grad_(True)
    loss_BT, _ = policy_loss(name, x, old if old is not None else x.detach(), adv, mask, **kw)
    value = aggregate(loss_BT, mask, mode)
    value.backward()
    return value.detach(), x.grad


def _random_batch(seed=0, B=4, T=6):
    g = torch.Generator().manual_seed(seed)
    logps = -torch.rand(B, T, generator=g, dtype=F64) * 3
    old = logps + 0.05 * torch.randn(B, T, generator=g, dtype=F64)
    lengths = torch.tensor([6, 3, 5, 1])[:B]
    mask = (torch.arange(T)[None] < lengths[:, None]).to(F64)
    adv = torch.tensor([1.0, -0.5, 2.0, -1.5], dtype=F64)[:B]
    return logps, old, adv, mask


@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "token-mean"])
def test_gspo_and_gspo_token_same_value_and_gradient(mode):
    logps, old, adv, mask = _random_batch()
    v1, g1 = _grad("gspo", logps, old, adv, mask, mode, clip_low=0.2, clip_high=0.28)
    v2, g2 = _grad("gspo_token", logps, old, adv, mask, mode, clip_low=0.2, clip_high=0.28)
    torch.testing.assert_close(v1, v2, atol=1e-12, rtol=0)
    torch.testing.assert_close(g1, g2, atol=1e-12, rtol=0)
    assert g1.abs().sum() > 0


def test_on_policy_grpo_seq_mean_token_mean_equals_gspo_gradient():
    # At ratio 1: d/dlogp_t of −A·r_t averaged over |o_i| tokens is −A/|o_i|, and of −A·s_i it is also −A/|o_i|.
    logps, _, adv, mask = _random_batch()
    _, g_grpo = _grad("grpo", logps, None, adv, mask)
    _, g_gspo = _grad("gspo", logps, None, adv, mask)
    torch.testing.assert_close(g_grpo, g_gspo, atol=1e-12, rtol=0)
    lengths = mask.sum(-1, keepdim=True)
    expected = -(adv[:, None] / lengths) * mask / adv.numel()
    torch.testing.assert_close(g_grpo, expected, atol=1e-12, rtol=0)
    # Under token-mean (the presets' loss.agg_mode) too: GSPO's s_i repeated on each of its |o_i| tokens gives each
    # token −A·s_i/|o_i|·|o_i| / N = −A/N, GRPO's. The SmolLM2 screen with loss.policy_loss=gspo at μ = 1 repeats the
    # GRPO run's gradient norms to every digit (benchmarks/RESULTS.md).
    _, g_grpo = _grad("grpo", logps, None, adv, mask, "token-mean")
    _, g_gspo = _grad("gspo", logps, None, adv, mask, "token-mean")
    torch.testing.assert_close(g_gspo, g_grpo, atol=1e-12, rtol=0)
    torch.testing.assert_close(g_grpo, -adv[:, None] * mask / mask.sum(), atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", ["cispo", "sapo", "vespo"])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_on_policy_the_token_losses_have_grpos_gradient(name, mode):
    """At ratio 1 (loss.mu = 1) each token's weight is 1: CISPO's min(1, ε_max), SAPO's (4/τ)·σ'(0)·τ = 1 for either
    temperature, VESPO's φ(1) = e^λ·1^k·e^−λ = 1; so the gradient is GRPO's −A·∇logp. (benchmarks/RESULTS.md: the
    SmolLM2 screen with loss.policy_loss=cispo at μ = 1 repeats the GRPO run's gradient norms to every digit.)"""
    logps, _, adv, mask = _random_batch()
    _, g_grpo = _grad("grpo", logps, None, adv, mask, mode)
    _, g_other = _grad(name, logps, None, adv, mask, mode)
    torch.testing.assert_close(g_other, g_grpo, atol=1e-12, rtol=0)


# --------------------------------------------------------------------------------------------------------- clipping
def _token_grad(name, log_ratio, adv, **kw):
    logps = t([[-1.0 + log_ratio]], grad=True)
    loss, m = policy_loss(name, logps, t([[-1.0]]), t([adv]), t([[1.0]]), **kw)
    loss.sum().backward()
    return float(loss.detach()), float(logps.grad), m


@pytest.mark.parametrize("name", ["grpo", "gspo", "gspo_token"])
def test_clip_zeroes_gradient_only_in_the_direction_of_the_advantage(name):
    up, down = math.log(1.5), math.log(0.5)
    # ratio 1.5 > 1.28 and A > 0: the clipped branch binds, loss = −1.28, no gradient.
    loss, grad, m = _token_grad(name, up, 1.0)
    assert loss == pytest.approx(-1.28) and grad == 0.0 and float(m["loss/clip_frac_high"]) == 1.0
    # ratio 1.5 and A < 0: moving further is penalised without bound, gradient = −A·r = 1.5.
    loss, grad, m = _token_grad(name, up, -1.0)
    assert loss == pytest.approx(1.5) and grad == pytest.approx(1.5) and float(m["loss/clip_frac_high"]) == 0.0
    # ratio 0.5 < 0.8 and A < 0: loss = −A·0.8, no gradient.
    loss, grad, m = _token_grad(name, down, -1.0)
    assert loss == pytest.approx(0.8) and grad == 0.0 and float(m["loss/clip_frac_low"]) == 1.0
    # ratio 0.5 and A > 0: gradient −A·r = −0.5 pushes the ratio back up.
    loss, grad, _ = _token_grad(name, down, 1.0)
    assert loss == pytest.approx(-0.5) and grad == pytest.approx(-0.5)


def test_gspo_clips_the_whole_sequence():
    # Sequence log-ratio = mean(0.6, 0.0) = 0.3 → s = 1.35 > 1.28: every token of the row loses its gradient,
    # although the second token's own ratio is 1.
    logps = t([[-1.0, -1.0]], grad=True)
    loss, _ = policy_loss("gspo", logps, t([[-1.6, -1.0]]), t([1.0]), t([[1.0, 1.0]]))
    loss.sum().backward()
    assert torch.equal(logps.grad, torch.zeros_like(logps))
    torch.testing.assert_close(loss.detach(), t([[-1.28, -1.28]]))


def test_clip_higher_bounds_are_asymmetric():
    r = math.log(1.25)
    loss, grad, m = _token_grad("grpo", r, 1.0, clip_high=0.28)
    assert loss == pytest.approx(-1.25) and grad == pytest.approx(-1.25) and float(m["loss/clip_frac_high"]) == 0
    loss, grad, m = _token_grad("grpo", r, 1.0, clip_high=0.2)
    assert loss == pytest.approx(-1.2) and grad == 0.0 and float(m["loss/clip_frac_high"]) == 1
    # The lower side uses clip_low: ratio 0.75 with A < 0 is clipped at 0.8 (clip_low=0.2), not at 0.72.
    loss, grad, _ = _token_grad("grpo", math.log(0.75), -1.0, clip_low=0.2, clip_high=0.28)
    assert loss == pytest.approx(0.8) and grad == 0.0


def test_dual_clip_caps_negative_advantages_only():
    # A = −1, ratio 5: plain PPO loss = 5; dual clip c = 3 caps it at 3 with no gradient.
    loss, grad, _ = _token_grad("grpo", math.log(5.0), -1.0)
    assert loss == pytest.approx(5.0) and grad == pytest.approx(5.0)
    loss, grad, m = _token_grad("grpo", math.log(5.0), -1.0, dual_clip=3.0)
    assert loss == pytest.approx(3.0) and grad == 0.0 and float(m["loss/dual_clip_frac"]) == 1.0
    # A = −2, ratio 2: loss 4 < c·|A| = 6, unchanged with its gradient.
    loss, grad, _ = _token_grad("grpo", math.log(2.0), -2.0, dual_clip=3.0)
    assert loss == pytest.approx(4.0) and grad == pytest.approx(4.0)
    # A > 0, ratio 5: dual clip does not apply; the usual clip gives −1.28.
    loss, grad, _ = _token_grad("grpo", math.log(5.0), 1.0, dual_clip=3.0)
    assert loss == pytest.approx(-1.28) and grad == 0.0
    with pytest.raises(ValueError, match="dual_clip"):
        _token_grad("grpo", 0.0, 1.0, dual_clip=1.0)


CLIPPED = [name for name, spec in POLICY_LOSSES.items() if spec.fields == CLIP_FIELDS]


@pytest.mark.parametrize("name", CLIPPED)
def test_the_clipped_losses_and_the_loss_section_share_the_clip_defaults_and_rules(name):
    """A clip the loss section refuses, a clipped loss called directly refuses too (a bound of 0 pins that side of
    the ratio at 1), and both accept the same values; the loss's defaults are the section's."""
    from grpo.config.algorithm_sections import LossConfig

    signature = inspect.signature(POLICY_LOSSES[name].fn).parameters
    assert {f: signature[f].default for f in CLIP_FIELDS} == {f: getattr(LossConfig(), f) for f in CLIP_FIELDS}
    call = dict(logps_BT=t([[-1.0]]), old_logps_BT=t([[-1.0]]), advantages_B=t([1.0]), mask_BT=t([[1.0]]))
    for bad in ({"clip_low": 0.0}, {"clip_low": 1.0}, {"clip_high": 0.0}, {"clip_high": -0.1}, {"dual_clip": 1.0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            LossConfig(**bad)
        with pytest.raises(ValueError, match=next(iter(bad))):
            policy_loss(name, **call, **bad)
    for good in ({"clip_low": 3e-4, "clip_high": 4e-4}, {"clip_low": 0.999}, {"dual_clip": 1.01}):
        LossConfig(**good)
        loss, _ = policy_loss(name, **call, **good)
        assert float(loss) == -1.0  # on-policy, A = 1: −A·r


def test_padding_gets_zero_loss_and_huge_log_ratios_stay_finite():
    logps = t([[-1.0, 50.0]], grad=True)  # padding holds garbage
    loss, m = policy_loss("grpo", logps, t([[-1.0, -80.0]]), t([-1.0]), t([[1.0, 0.0]]))
    loss.sum().backward()
    assert loss[0, 1] == 0 and torch.isfinite(loss).all() and torch.isfinite(logps.grad).all()
    assert float(m["loss/ratio_max"]) == 1.0
    # A real token at log-ratio 100 is clamped to LOG_RATIO_CLAMP before exp: finite loss, e^20.
    loss, _ = policy_loss("grpo", t([[100.0]]), t([[0.0]]), t([-1.0]), t([[1.0]]))
    assert float(loss) == pytest.approx(math.exp(LOG_RATIO_CLAMP))


def test_every_loss_takes_its_ratio_from_importance_ratio_clamped_on_both_sides():
    """One formula for the importance ratio: exp of the log-ratio clamped to ±LOG_RATIO_CLAMP, for every registered
    loss (the ratio metrics show it) and for the KL term's importance weight in the update."""
    assert float(importance_ratio(t(-30.0))) == pytest.approx(math.exp(-LOG_RATIO_CLAMP), rel=1e-12)
    assert float(importance_ratio(t(30.0))) == pytest.approx(math.exp(LOG_RATIO_CLAMP), rel=1e-12)
    assert float(importance_ratio(t(0.5))) == pytest.approx(math.exp(0.5), rel=1e-12)
    for name in POLICY_LOSSES:
        for log_ratio in (-30.0, 30.0):
            _, m = policy_loss(name, t([[log_ratio]]), t([[0.0]]), t([1.0]), t([[1.0]]))
            expected = math.exp(math.copysign(LOG_RATIO_CLAMP, log_ratio))
            assert float(m["loss/ratio_min"]) == pytest.approx(expected, rel=1e-12), (name, log_ratio)


def test_the_kl_importance_weight_is_the_losss_clamped_ratio(monkeypatch):
    """loss.kl_importance_weight multiplies each token's KL by the loss's ratio, clamped as the loss clamps it: at a
    log-ratio of −30 the weight is e^−20, the ratio the policy loss itself uses there, not e^−30."""
    from grpo.config.algorithm_sections import LossConfig
    from grpo.core.step_types import TrainBatch
    from grpo.phases import update

    logps_BT = torch.tensor([[-31.0, -1.0]])
    old_BT, ref_BT = torch.tensor([[-1.0, -1.2]]), torch.tensor([[-30.5, -1.1]])
    mask_BT = torch.ones(1, 2)
    monkeypatch.setattr(update, "completion_logprobs", lambda *a, **k: (logps_BT, torch.zeros(1, 2)))
    batch = TrainBatch(input_ids_BL=torch.ones(1, 3, dtype=torch.long), attention_mask_BL=torch.ones(1, 3,
                       dtype=torch.long), completion_mask_BT=mask_BT, prompt_len=1,
                       task_ids_B=torch.zeros(1, dtype=torch.long), advantages_B=torch.tensor([1.0]),
                       old_logps_BT=old_BT, ref_logps_BT=ref_BT)
    beta = 0.5
    _, reg_BT, _, _ = update.micro_batch_terms(None, batch, torch.tensor([beta]), LossConfig(kl_importance_weight=True),
                                               1.0, fused_head=False)
    kl_BT = kl_penalty(logps_BT, ref_BT, "k3")
    expected = beta * kl_BT * torch.exp(torch.tensor([[-LOG_RATIO_CLAMP, -1.0 + 1.2]]))
    torch.testing.assert_close(reg_BT, expected, rtol=1e-6, atol=0)


def test_unknown_names_list_the_valid_ones():
    with pytest.raises(ValueError) as err:
        policy_loss("ppo", t([[0.0]]), t([[0.0]]), t([1.0]), t([[1.0]]))
    assert all(repr(name) in str(err.value) for name in POLICY_LOSSES)
    with pytest.raises(ValueError, match="seq-mean-token-sum-norm"):
        aggregate(t([[0.0]]), t([[1.0]]), "sum")
    with pytest.raises(ValueError, match="k3"):
        kl_penalty(t([0.0]), t([0.0]), "k4")
    assert {"grpo", "gspo", "gspo_token", "luspo", "cispo", "sapo", "vespo"} <= set(POLICY_LOSSES)  # the built-in ones


# ------------------------------------------------------------------------------------------------------ aggregation
AGG_LOSS = [[1.0, 2.0, 3.0], [4.0, 5.0, 100.0]]  # 100 sits on padding and must be ignored
AGG_MASK = [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]


@pytest.mark.parametrize("mode, kwargs, expected", [
    ("token-mean", {}, 15 / 5),
    ("token-mean", {"num_tokens": 10}, 15 / 10),
    ("seq-mean-token-mean", {}, (6 / 3 + 9 / 2) / 2),
    ("seq-mean-token-mean", {"num_seqs": 4}, (6 / 3 + 9 / 2) / 4),
    ("seq-mean-token-sum", {}, (6 + 9) / 2),
    ("seq-mean-token-sum-norm", {"constant": 4}, (6 / 4 + 9 / 4) / 2),
])
def test_aggregate_hand_values(mode, kwargs, expected):
    assert float(aggregate(t(AGG_LOSS), t(AGG_MASK), mode, **kwargs)) == pytest.approx(expected, abs=1e-12)


def test_seq_mean_token_sum_norm_needs_a_constant():
    with pytest.raises(ValueError, match="max_new_tokens"):
        aggregate(t(AGG_LOSS), t(AGG_MASK), "seq-mean-token-sum-norm")


def _accumulation_matches(splits, lengths, seed):
    B, T = len(lengths), max(lengths)
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(B, T, generator=g, dtype=F64)
    x = torch.randn(B, T, generator=g, dtype=F64)
    mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).to(F64)
    for mode in AGG_MODES:
        kw = {"num_tokens": mask.sum(), "num_seqs": B, "constant": T}
        full = w.clone().requires_grad_(True)
        aggregate((full * x) ** 2, mask, mode, **kw).backward()
        acc = w.clone().requires_grad_(True)
        start = 0
        for size in splits:
            rows = slice(start, start + size)
            aggregate((acc[rows] * x[rows]) ** 2, mask[rows], mode, **kw).backward()
            start += size
        torch.testing.assert_close(acc.grad, full.grad, atol=1e-6, rtol=0, msg=mode)


def test_micro_batch_accumulation_equals_full_batch_for_every_mode():
    _accumulation_matches(splits=[2, 1, 3], lengths=[5, 1, 3, 5, 2, 4], seed=0)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 7), min_size=2, max_size=8), st.data())
def test_accumulation_equivalence_over_random_splits(lengths, data):
    B = len(lengths)
    cuts = sorted(data.draw(st.sets(st.integers(1, B - 1), max_size=B - 1)))
    bounds = [0, *cuts, B]
    _accumulation_matches([b - a for a, b in pairwise(bounds)], lengths, seed=B)


def test_masked_mean():
    x, m = t([[1.0, 2.0], [3.0, 4.0]]), t([[1.0, 0.0], [1.0, 1.0]])
    assert float(masked_mean(x, m)) == pytest.approx(8 / 3)
    torch.testing.assert_close(masked_mean(x, m, dim=-1), t([1.0, 3.5]))
    assert float(masked_mean(x, torch.zeros_like(m))) == 0.0


# ------------------------------------------------------------------------------------------------------------- KL
def test_kl_estimators_hand_values():
    logp, ref = t([-1.0, -2.0]), t([-1.5, -1.0])
    torch.testing.assert_close(kl_penalty(logp, ref, "k1"), t([0.5, -1.0]))
    torch.testing.assert_close(kl_penalty(logp, ref, "k2"), t([0.125, 0.5]))
    # k3 with ref − logp = (−0.5, 1.0): e^−0.5 + 0.5 − 1 = 0.10653066, e − 2 = 0.71828183.
    # The first value is > 0 although ref < logp: a `clamp(ref − logp, min=0)` (a known bug) would give 0.
    torch.testing.assert_close(kl_penalty(logp, ref, "k3"), t([0.1065306597, 0.7182818285]))
    torch.testing.assert_close(kl_penalty(logp, ref, "low_var_kl"), kl_penalty(logp, ref, "k3"))


def test_k3_nonnegative_finite_with_finite_gradients_over_wide_range():
    for dtype in (torch.float32, F64):
        log_ratio = torch.cat([torch.linspace(-100, 100, 2001, dtype=dtype), t([-50, 50, 1e-7, -1e-7], dtype)])
        logp = torch.zeros_like(log_ratio, requires_grad=True)
        kl = kl_penalty(logp, log_ratio, "k3")  # ref − logp = log_ratio
        kl.sum().backward()
        assert torch.isfinite(kl).all() and (kl >= 0).all()
        assert torch.isfinite(logp.grad).all()


@settings(max_examples=200, deadline=None)
@given(st.floats(-1e4, 1e4, allow_nan=False), st.floats(-1e4, 1e4, allow_nan=False))
def test_k3_nonnegative_property(logp, ref):
    for dtype in (torch.float32, F64):
        kl = kl_penalty(torch.tensor([logp], dtype=dtype), torch.tensor([ref], dtype=dtype), "k3")
        assert torch.isfinite(kl).all() and float(kl) >= 0.0


def test_k3_plus_has_k3_value_and_k2_gradient():
    ref = t([-1.5, -1.0, 0.3])
    x_plus = t([-1.0, -2.0, -0.2], grad=True)
    x_k2 = t([-1.0, -2.0, -0.2], grad=True)
    v_plus = kl_penalty(x_plus, ref, "k3+")
    torch.testing.assert_close(v_plus.detach(), kl_penalty(x_plus.detach(), ref, "k3"))
    v_plus.sum().backward()
    kl_penalty(x_k2, ref, "k2").sum().backward()
    torch.testing.assert_close(x_plus.grad, x_k2.grad)
    torch.testing.assert_close(x_plus.grad, t([0.5, -1.0, -0.5]))  # d k2 / d logp = logp − ref
    assert {"k1", "k2", "k3", "k3+"} <= set(KL_ESTIMATORS)


# -------------------------------------------------------------------------------------------------------- entropy
def test_entropy_of_uniform_is_log_v():
    assert float(entropy_from_logits(torch.zeros(1, 1, 8))) == pytest.approx(math.log(8), abs=1e-6)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_entropy_matches_naive_in_float64_value_and_gradient(temperature):
    g = torch.Generator().manual_seed(1)
    logits = (3 * torch.randn(2, 5, 11, generator=g, dtype=F64)).requires_grad_(True)
    ent = entropy_from_logits(logits, chunk_size=3, temperature=temperature)
    naive_logits = logits.detach().clone().requires_grad_(True)
    logp = torch.log_softmax(naive_logits / temperature, -1)
    naive = -(logp.exp() * logp).sum(-1)
    torch.testing.assert_close(ent.double(), naive.detach(), atol=1e-6, rtol=0)
    weights = torch.randn(2, 5, generator=g, dtype=F64)
    (ent.double() * weights).sum().backward()
    (naive * weights).sum().backward()
    torch.testing.assert_close(logits.grad, naive_logits.grad, atol=1e-6, rtol=0)


def test_entropy_bf16_is_accumulated_in_fp32():
    logits = torch.randn(3, 4, 1000, dtype=torch.bfloat16)
    ent = entropy_from_logits(logits, chunk_size=5)
    ref = -(torch.log_softmax(logits.double(), -1).exp() * torch.log_softmax(logits.double(), -1)).sum(-1)
    assert ent.dtype == torch.float32
    torch.testing.assert_close(ent.double(), ref, atol=1e-5, rtol=0)
