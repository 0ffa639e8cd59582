"""DAPO's soft overlong punishment and dynamic sampling (grpo/core/dapo.py) against the paper's formulas worked by
hand (arXiv 2503.14476, eq. 13 and §3.2)."""

import pytest
import torch

from grpo.core.advantages import group_advantages
from grpo.core.dapo import fill_informative_groups, informative_groups, kl_only_advantages, overlong_penalty


def test_overlong_penalty_hand_values():
    # L_max = 20, L_cache = 4: free up to 16; 17 → (16 − 17)/4 = −0.25; 18 → −0.5; 20 → −1; beyond → −1.
    lengths = torch.tensor([0, 10, 16, 17, 18, 20, 25])
    expected = torch.tensor([0.0, 0.0, 0.0, -0.25, -0.5, -1.0, -1.0])
    torch.testing.assert_close(overlong_penalty(lengths, 20, 4), expected)
    torch.testing.assert_close(overlong_penalty(lengths, 20, 4, factor=0.5), expected * 0.5)
    # L_cache = L_max: the punishment starts at the first token: |y| = 5 of 20 → −5/20.
    assert float(overlong_penalty(torch.tensor([5]), 20, 20)) == pytest.approx(-0.25)
    with pytest.raises(ValueError, match="cache_len"):
        overlong_penalty(lengths, 20, 0)
    with pytest.raises(ValueError, match="cache_len"):
        overlong_penalty(lengths, 20, 21)


def test_informative_groups_are_the_groups_with_a_nonzero_advantage():
    rewards = torch.tensor([1.0, 1.0, 1.0,  # all equal: no signal
                            0.0, 1.0, 0.0,  # signal
                            0.5, float("nan"), 0.5,  # equal among the valid ones
                            0.3, float("nan"), float("nan"),  # one valid reward
                            0.1 + 0.2, 0.3, 0.3])  # equal up to rounding
    keep = informative_groups(rewards, 3)
    assert keep.tolist() == [False, True, False, False, False]
    adv, _ = group_advantages(rewards, 3)
    assert (adv.view(-1, 3).abs().sum(-1) > 0).tolist() == keep.tolist()


def _rounds(per_round):
    """produce(round) returning the given reward lists as (round, index, reward) items; records the calls."""
    calls = []

    def produce(r):
        calls.append(r)
        return [(r, i, x) for i, x in enumerate(per_round[r])]

    return produce, calls


K = 2
SIGNAL, FLAT = [0.0, 1.0], [1.0, 1.0]


def test_dynamic_sampling_never_trains_on_a_zero_variance_group_and_keeps_the_batch_size():
    per_round = [FLAT + SIGNAL + FLAT, SIGNAL + FLAT + FLAT, FLAT + SIGNAL + SIGNAL, SIGNAL * 3]
    produce, calls = _rounds(per_round)
    kept, m = fill_informative_groups(produce, lambda x: x[2], K, target_groups=3, max_rounds=5)
    assert calls == [0, 1, 2]  # stops as soon as 3 groups with signal are in
    assert len(kept) == 3 * K
    assert [(r, i) for r, i, _ in kept] == [(0, 2), (0, 3), (1, 0), (1, 1), (2, 2), (2, 3)]  # first found, in order
    assert informative_groups(torch.tensor([x[2] for x in kept]), K).all()
    assert m == {"rollout/dynamic_rounds": 2.0, "rollout/dynamic_kept_groups": 3.0,
                 "rollout/dynamic_dropped_groups": 5.0, "rollout/dynamic_short": 0.0}


def test_dynamic_sampling_stops_refilling_at_its_cap():
    per_round = [FLAT + SIGNAL + FLAT] + [FLAT * 3] * 10
    produce, calls = _rounds(per_round)
    kept, m = fill_informative_groups(produce, lambda x: x[2], K, target_groups=3, max_rounds=2)
    assert calls == [0, 1, 2]  # round 0 and 2 extra rounds, no more
    assert [(r, i) for r, i, _ in kept] == [(0, 2), (0, 3)]  # the one group with signal: a smaller batch
    assert m["rollout/dynamic_short"] == 1.0 and m["rollout/dynamic_rounds"] == 2.0
    # max_rounds = 0: round 0 filtered, nothing generated
    produce, calls = _rounds(per_round)
    kept, _ = fill_informative_groups(produce, lambda x: x[2], K, target_groups=3, max_rounds=0)
    assert calls == [0] and len(kept) == K


def test_dynamic_sampling_with_no_signal_anywhere_returns_round_zero_whose_advantages_are_zero():
    per_round = [FLAT * 2, FLAT * 2]
    produce, calls = _rounds(per_round)
    kept, m = fill_informative_groups(produce, lambda x: x[2], K, target_groups=2, max_rounds=1)
    assert calls == [0, 1] and [(r, i) for r, i, _ in kept] == [(0, 0), (0, 1), (0, 2), (0, 3)]
    adv, _ = group_advantages(torch.tensor([x[2] for x in kept]), K)
    assert torch.equal(adv, torch.zeros(4)) and m["rollout/dynamic_kept_groups"] == 0.0


def test_failed_rewards_count_as_missing():
    per_round = [[None, 1.0, 0.0, None, 0.0, 1.0]]
    produce, _ = _rounds(per_round)
    kept, _ = fill_informative_groups(produce, lambda x: x[2], K, target_groups=1, max_rounds=0)
    assert [i for _, i, _ in kept] == [4, 5]


def test_kl_only_rows_get_advantage_zero_and_the_rest_are_kept():
    """Advantages [0.5, −0.5, 0.25, −0.25] with the last 2 rows KL-only: [0.5, −0.5, 0, 0]; none KL-only: unchanged;
    more KL-only rows than rows is an error, not a silent clip."""
    adv = torch.tensor([0.5, -0.5, 0.25, -0.25])
    assert kl_only_advantages(adv, 2).tolist() == [0.5, -0.5, 0.0, 0.0]
    assert adv.tolist() == [0.5, -0.5, 0.25, -0.25]  # the input is left as it was
    assert kl_only_advantages(adv, 0).tolist() == [0.5, -0.5, 0.25, -0.25]
    assert kl_only_advantages(adv, 4).tolist() == [0.0] * 4
    with pytest.raises(ValueError, match="kl_only_rows=5"):
        kl_only_advantages(adv, 5)
