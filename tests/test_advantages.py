"""group_advantages against hand-computed groups for every scale, failed rewards, zero-std groups and clipping."""

import math

import pytest
import torch

from grpo.core.advantages import group_advantages, masked_std

NAN = float("nan")
# Group 1: [1, 0, 1, 0]  mean 0.5, unbiased std sqrt(1/3) → ±0.5·sqrt(3) = ±0.8660254.
# Group 2: [2, NaN, 0, 1] valid (2, 0, 1): mean 1, unbiased std 1 → (1, 0, −1), NaN → 0.
# Group 3: [3, 3, 3, 3]  all equal → 0, counted.   Group 4: [5, NaN, NaN, NaN] one valid → 0, counted.
REWARDS = [1.0, 0.0, 1.0, 0.0, 2.0, NAN, 0.0, 1.0, 3.0, 3.0, 3.0, 3.0, 5.0, NAN, NAN, NAN]
H = 0.5 * math.sqrt(3)


def close(actual, expected, atol=1e-5):
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


def test_masked_std_hand_values_along_either_axis():
    """Row [1, 2, 4, (3 masked)]: mean 7/3, squared deviations 16/9 + 1/9 + 25/9 = 42/9, over n − 1 = 2: 7/3, so
    std sqrt(7/3) = 1.5275252; row [5, (9 masked), (9), (9)]: one valid, std 0; row [2, 2, 6, 6]: mean 4, 4·4 / 3,
    std sqrt(16/3) = 2.3094011. The same numbers laid along dim 1 of a (G, K, M) tensor give the same stds."""
    x = torch.tensor([[1.0, 2.0, 4.0, 3.0], [5.0, 9.0, 9.0, 9.0], [2.0, 2.0, 6.0, 6.0]], dtype=torch.float64)
    valid = torch.tensor([[True, True, True, False], [True, False, False, False], [True] * 4])
    mean = torch.tensor([7 / 3, 5.0, 4.0], dtype=torch.float64)
    want = [math.sqrt(7 / 3), 0.0, math.sqrt(16 / 3)]
    close(masked_std(x, valid, mean), want, atol=1e-12)
    close(masked_std(x.T.unsqueeze(0), valid.T.unsqueeze(0), mean.unsqueeze(0), dim=1), [want], atol=1e-12)


def test_group_scale_hand_values_and_metrics():
    adv, m = group_advantages(torch.tensor(REWARDS), group_size=4, scale="group")
    close(adv, [H, -H, H, -H, 1.0, 0.0, -1.0, 0.0] + [0.0] * 8)
    assert float(m["adv/frac_zero_std"]) == 0.5  # groups 3 and 4
    assert float(m["adv/num_failed"]) == 4
    # Over the 12 valid rewards: mean 0, population std sqrt((4·0.75 + 2)/12), abs max 1.
    assert float(m["adv/mean"]) == pytest.approx(0.0, abs=1e-6)
    assert float(m["adv/std"]) == pytest.approx(math.sqrt(5 / 12), abs=1e-5)
    assert float(m["adv/abs_max"]) == pytest.approx(1.0, abs=1e-5)


def test_batch_scale_uses_group_mean_and_batch_std():
    # Valid rewards of the batch: 1,0,1,0,2,0,1 → mean 5/7, unbiased variance (24/7)/6 = 4/7, std 0.7559289.
    adv, _ = group_advantages(torch.tensor(REWARDS[:8]), group_size=4, scale="batch")
    s = math.sqrt(4 / 7)
    close(adv, [0.5 / s, -0.5 / s, 0.5 / s, -0.5 / s, 1 / s, 0.0, -1 / s, 0.0])


def test_none_scale_is_centering_only_and_clip():
    adv, _ = group_advantages(torch.tensor(REWARDS), group_size=4, scale="none")
    close(adv, [0.5, -0.5, 0.5, -0.5, 1.0, 0.0, -1.0, 0.0] + [0.0] * 8)
    adv, m = group_advantages(torch.tensor(REWARDS), group_size=4, scale="none", clip=0.6)
    close(adv, [0.5, -0.5, 0.5, -0.5, 0.6, 0.0, -0.6, 0.0] + [0.0] * 8)
    assert float(m["adv/abs_max"]) == pytest.approx(0.6)


def test_failed_reward_is_excluded_not_zero():
    # If the NaN were read as 0, group [1, NaN, 0, 1] would have mean 0.5 instead of 2/3.
    adv, m = group_advantages([1.0, None, 0.0, 1.0], group_size=4, scale="none")
    close(adv, [1 / 3, 0.0, -2 / 3, 1 / 3])
    assert float(m["adv/num_failed"]) == 1 and float(m["adv/frac_zero_std"]) == 0.0


def test_rounding_ties_count_as_zero_std():
    adv, m = group_advantages([0.1 + 0.2, 0.3, 0.3, 0.3], group_size=4)
    close(adv, [0.0] * 4, atol=0)
    assert float(m["adv/frac_zero_std"]) == 1.0


def test_two_member_group_with_bessel_std():
    # [1, 0]: mean 0.5, unbiased std sqrt(0.5) → ±0.5/0.7071068 = ±0.7071068 (population std would give ±1).
    adv, _ = group_advantages([1.0, 0.0], group_size=2, eps=0.0)
    close(adv, [math.sqrt(0.5), -math.sqrt(0.5)], atol=1e-6)


def test_all_failed_batch_is_finite():
    adv, m = group_advantages([None, None], group_size=2)
    close(adv, [0.0, 0.0], atol=0)
    assert float(m["adv/num_failed"]) == 2 and float(m["adv/abs_max"]) == 0.0


@pytest.mark.parametrize("kwargs, match", [
    ({"group_size": 3}, "group_size=3"),
    ({"group_size": 2, "scale": "global"}, "scale"),
    ({"group_size": 2, "clip": 0.0}, "clip"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        group_advantages([1.0, 0.0, 1.0, 0.0], **kwargs)
