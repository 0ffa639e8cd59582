"""KL controllers: direction and bounds of each, BandKL's window median, state round trips, NaN handling."""

import json
import math

import pytest

from grpo.core.kl_control import AdaptiveKL, BandKL, FixedKL, make_controller


def test_fixed_never_moves_and_counts_nan():
    c = FixedKL(0.04)
    assert c.update(10.0) == 0.04 and c.update(0.0) == 0.04 and c.update(math.nan) == 0.04
    assert c.num_nan_ignored == 1


def test_adaptive_follows_ziegler_with_clipped_error():
    c = AdaptiveKL(beta=0.1, target=1.0, horizon=10, n_steps=1)
    assert c.update(1.5) == pytest.approx(0.1 * 1.02)  # error 0.5 clipped to 0.2, × n/horizon = 0.1
    assert c.update(0.9) == pytest.approx(0.1 * 1.02 * 0.99)  # error −0.1
    assert c.update(0.0) == pytest.approx(0.1 * 1.02 * 0.99 * 0.98)  # error −1 clipped to −0.2
    before = c.value
    assert c.update(math.nan) == before and c.num_nan_ignored == 1
    assert c.update(1.0) == pytest.approx(before)  # on target: no change


def test_adaptive_n_steps_scales_the_step():
    c = AdaptiveKL(beta=1.0, target=2.0, horizon=100, n_steps=10)
    assert c.update(3.0) == pytest.approx(1.0 + 0.2 * 10 / 100)


def test_band_acts_on_the_window_median_then_resets():
    c = BandKL(beta=0.1, low=0.01, high=0.05, window=3)
    assert c.update(0.1) == 0.1 and c.update(0.0) == 0.1  # window not full: no decision
    assert c.update(0.2) == pytest.approx(0.115)  # median 0.1 > high → × 1.15
    assert c.history == []
    for kl in (0.001, 0.5):
        c.update(kl)
    assert c.update(0.002) == pytest.approx(0.115 * 0.85)  # median 0.002 < low → × 0.85 (the 0.5 spike is ignored)
    for kl in (0.02, 100.0):
        c.update(kl)
    assert c.update(0.03) == pytest.approx(0.115 * 0.85)  # median 0.03 inside the band: unchanged


def test_band_respects_bounds():
    c = BandKL(beta=0.1, low=0.01, high=0.05, window=1, beta_min=0.09, beta_max=0.12)
    assert c.update(1.0) == pytest.approx(0.115)
    assert c.update(1.0) == pytest.approx(0.12)  # 0.13225 clipped to beta_max
    assert c.update(0.0) == pytest.approx(0.102)
    assert c.update(0.0) == pytest.approx(0.09)  # 0.0867 clipped to beta_min


def test_band_ignores_nan_without_filling_the_window():
    c = BandKL(beta=0.1, low=0.01, high=0.05, window=2)
    c.update(1.0)
    assert c.update(math.nan) == 0.1 and c.history == [1.0] and c.num_nan_ignored == 1
    assert c.update(1.0) == pytest.approx(0.115)


@pytest.mark.parametrize("make", [
    lambda: FixedKL(0.05),
    lambda: AdaptiveKL(beta=0.1, target=0.5, horizon=20, n_steps=4),
    lambda: BandKL(beta=0.1, low=0.01, high=0.05, window=4),
])
def test_state_round_trips_mid_window(make):
    kls = [0.2, math.nan, 0.001, 0.3, 0.04, 0.5, 0.02]
    a = make()
    for kl in kls[:3]:
        a.update(kl)
    state = json.loads(json.dumps(a.state_dict()))  # JSON-serialisable for checkpoints
    b = make()
    b.load_state_dict(state)
    assert b.state_dict() == a.state_dict()
    for kl in kls[3:]:
        assert b.update(kl) == a.update(kl)
    assert b.num_nan_ignored == a.num_nan_ignored == 1


def test_make_controller_builds_and_validates():
    assert isinstance(make_controller("band", beta=0.1, low=0.01, high=0.05), BandKL)
    assert make_controller("fixed", beta=0.0).value == 0.0
    with pytest.raises(ValueError, match="unknown KL controller .*use one of"):
        make_controller("pid", beta=0.1)
    with pytest.raises(ValueError, match="accepted arguments"):
        make_controller("adaptive", beta=0.1, target=1.0)  # horizon missing
    with pytest.raises(ValueError, match="accepted arguments"):
        make_controller("fixed", beta=0.1, target=1.0)
    with pytest.raises(ValueError, match="low ≤ high"):
        make_controller("band", beta=0.1, low=0.5, high=0.05)
    with pytest.raises(ValueError, match="outside"):
        make_controller("band", beta=20.0, low=0.01, high=0.05)
    with pytest.raises(ValueError, match="target"):
        make_controller("adaptive", beta=0.1, target=0.0, horizon=10)
