"""Batch-invariant sampling (grpo/decoding/sampling.py): the hash, the exponential race, and generate's output per
row."""

from __future__ import annotations

import math

import pytest
import torch

from grpo.config import RolloutConfig
from grpo.core.step_types import Sample
from grpo.decoding.sampling import (
    SeededSampler,
    keyed_choice,
    race_scores,
    row_keys,
    splitmix64,
    splitmix64_int,
    uniforms,
)
from grpo.models.modeling import build_tiny_model, build_tiny_tokenizer
from grpo.phases.generate import SamplingPlan, generate_rollouts, greedy_complete


def test_splitmix64_matches_the_published_sequence():
    # SplitMix64 with state 0: the state advances by the golden gamma, each output is mix(state). Published first
    # outputs for seed 0 (Vigna's splitmix64.c): e220a8397b1dcdaf, 6e789e6aa1b965f4, 06c45d188009454f.
    expected = [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    states = [(i * 0x9E3779B97F4A7C15) % 2**64 for i in range(3)]
    assert [splitmix64_int(s) % 2**64 for s in states] == expected
    signed = torch.tensor([s - 2**64 if s >= 2**63 else s for s in states], dtype=torch.int64)
    assert [v % 2**64 for v in splitmix64(signed).tolist()] == expected  # the tensor version wraps the same way


def test_uniforms_are_in_the_open_interval_and_depend_only_on_key_step_token():
    keys = torch.tensor(row_keys(0, 1, [0, 1], 2))
    u = uniforms(keys, 3, 5000)
    assert u.shape == (4, 5000) and u.dtype == torch.float32 and 0 < u.min() and u.max() < 1
    assert abs(u.mean().item() - 0.5) < 0.01 and abs(u.var().item() - 1 / 12) < 0.005
    assert torch.equal(uniforms(keys[2:], 3, 5000), u[2:])  # a row does not depend on the rows beside it
    assert not torch.equal(uniforms(keys, 4, 5000), u)  # another step, another draw
    assert torch.equal(uniforms(keys, 3, 1000, start=4000), u[:, 4000:])  # a block of columns is the same columns
    assert torch.equal(uniforms(keys, torch.tensor(3), 5000), u)  # the step as a device tensor (the graph engine)
    assert len(set(row_keys(0, 1, range(50), 4))) == 200  # every completion its own key


def test_small_uniforms_keep_their_precision():
    """U is rounded once from 63 hashed bits to float32, so the smallest values (E = −log(1 − U) ≈ U: the race's
    winners) keep 24 significant bits: among 10^6 draws the ones below 2^-16 are all distinct and spread evenly."""
    u = uniforms(torch.tensor(row_keys(3, 0, range(100), 1)), 0, 10_000).flatten().double()
    small = u[u < 2.0 ** -16]
    assert 5 <= small.numel() <= 40  # 10^6 · 2^-16 ≈ 15 expected
    assert small.unique().numel() == small.numel() and small.min() > 0


def chi_square(picks: torch.Tensor, p: torch.Tensor) -> float:
    """Pearson's statistic of the draws against p over the tokens p allows; a token p forbids must never be drawn."""
    counts = torch.bincount(picks, minlength=p.numel()).double()
    allowed = p > 0
    assert counts[~allowed].sum() == 0, counts
    n = picks.numel()
    return (((counts[allowed] - n * p[allowed]) ** 2) / (n * p[allowed])).sum().item()


LOGITS = torch.tensor([3.0, 2.2, 1.5, 1.0, 0.2, -0.5, -1.3, -2.0])
CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32}
"""The 0.999 quantiles of chi-square by degrees of freedom: a wrong sampler fails, a right one passes 999 runs in
1000."""


def expected(name: str) -> torch.Tensor:
    """The distribution each warper leaves of softmax(LOGITS), worked out from its definition, not from its code."""
    p = torch.softmax(LOGITS.double(), 0)
    if name == "plain":
        return p
    if name == "temperature 0.7":
        return torch.softmax(LOGITS.double() / 0.7, 0)
    if name == "top-k 3":
        keep = torch.zeros(8, dtype=torch.bool)
        keep[:3] = True  # LOGITS are sorted: the three largest
    elif name == "top-p 0.8":
        # the smallest set of the likeliest tokens whose mass reaches 0.8: p = .47, .21, .11, .06, ... → 4 tokens
        keep = torch.cumsum(p, 0) - p < 0.8
    else:  # min-p 0.1: the tokens with p ≥ 0.1 · p_max
        keep = p >= 0.1 * p[0]
    q = torch.where(keep, p, 0.0)
    return q / q.sum()


SAMPLER_SETTINGS = {"plain": {}, "temperature 0.7": {"temperature": 0.7}, "top-k 3": {"top_k": 3},
                    "top-p 0.8": {"top_p": 0.8}, "min-p 0.1": {"min_p": 0.1}}


@pytest.mark.parametrize("name", sorted(SAMPLER_SETTINGS))
def test_the_draw_follows_the_warped_softmax(name):
    """10^5 keyed draws from fixed logits through the seeded sampler (Hugging Face's warper, then the race): a
    chi-square test against the distribution the warper leaves, computed from its definition."""
    n = 100_000
    p = expected(name)
    assert name in ("plain", "temperature 0.7") or (p == 0).any()  # the filters filter something
    sampler = SeededSampler(row_keys(11, 0, range(n), 1), prompt_len=0, **SAMPLER_SETTINGS[name])
    onehot = sampler(torch.zeros(n, 0, dtype=torch.long), LOGITS.expand(n, 8).clone())
    picks = onehot.argmax(dim=-1)
    assert torch.equal((onehot == 0).sum(dim=-1), torch.ones(n, dtype=torch.long))  # one-hot: one 0, the rest −inf
    dof = int((p > 0).sum()) - 1
    assert chi_square(picks, p) < CHI2_999[dof], (name, torch.bincount(picks, minlength=8).tolist(), p.tolist())


def test_the_draw_follows_the_softmax_of_a_wide_vocabulary():
    """A race over 151,936 columns (the CPU draw runs in column blocks): 2,000 draws follow softmax of fixed random
    logits, binned into deciles of probability mass so that every bin holds about 200."""
    torch.manual_seed(0)
    scores = torch.randn(151_936) * 3
    p = torch.softmax(scores.double(), 0)
    picks = keyed_choice(scores.expand(2_000, -1), torch.tensor(row_keys(5, 0, range(2_000), 1)), 0)
    order = torch.argsort(p, descending=True)
    bins = torch.zeros(151_936, dtype=torch.long)
    bins[order] = torch.clamp((torch.cumsum(p[order], 0) * 10).long(), max=9)  # the mass decile each token falls in
    mass = torch.zeros(10, dtype=torch.float64).index_add_(0, bins, p)
    assert chi_square(bins[picks], mass) < 27.88  # chi-square(9) at 0.999


def test_the_cpu_blocks_draw_the_one_pass_race():
    """On the CPU the race runs over column blocks; it picks what one pass over the whole vocabulary picks, ties
    included (the first of equal values wins, as argmax)."""
    keys = torch.tensor(row_keys(2, 4, range(6), 2))
    scores = torch.randn(12, 70_001)
    scores[:, 40_000:40_010] = 50.0  # the same large score across a block boundary: ties broken by the race's U
    for t in range(3):
        assert torch.equal(keyed_choice(scores, keys, t), torch.argmax(race_scores(scores, keys, t), dim=-1))
    tied = torch.full((3, 70_001), float("-inf"))  # every score −inf: argmax's first index
    assert torch.equal(keyed_choice(tied, keys[:3], 0), torch.zeros(3, dtype=torch.long))


def test_minus_infinity_is_never_drawn():
    scores = torch.tensor([[0.0, float("-inf"), 0.0, float("-inf")]]).expand(2000, 4)
    picks = keyed_choice(scores, torch.tensor(row_keys(1, 0, range(2000), 1)), 0)
    assert set(picks.tolist()) == {0, 2}


CORPUS = ["who forgot the keys? unknown", "the answer is in the knowledge", "a much longer prompt to pad"] * 5


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer(CORPUS, vocab_size=300)


@pytest.fixture(scope="module")
def model(tok):
    return build_tiny_model(tok, seed=5, hidden=64, layers=2, heads=4, kv_heads=2)


SAMPLES = [Sample("fairness", str(i), ({"role": "user", "content": text},))
           for i, text in enumerate(["who forgot?", "the answer is a much longer one than this", "pad", "keys"])]


def seeded(model, tok, samples, indices, step=1, **kw):
    rollout = RolloutConfig(k=3, max_new_tokens=10, min_new_tokens=10, **kw)
    rollouts, _ = generate_rollouts(model, tok, samples, rollout,
                                    plan=SamplingPlan(row_keys=row_keys(0, step, indices, 3)))
    return [r.completion_ids for r in rollouts]


def test_a_completion_does_not_depend_on_its_batch_or_the_global_rng(model, tok):
    torch.manual_seed(0)
    together = seeded(model, tok, SAMPLES, [0, 1, 2, 3])
    torch.manual_seed(123)  # the global RNG plays no part
    halves = seeded(model, tok, SAMPLES[:2], [0, 1]) + seeded(model, tok, SAMPLES[2:], [2, 3])
    assert together == halves
    assert seeded(model, tok, SAMPLES[3:], [3]) == together[9:]  # alone, with other padding
    assert seeded(model, tok, SAMPLES, [0, 1, 2, 3], step=2) != together  # a new step draws anew
    assert len({tuple(c) for c in together[:3]}) > 1  # K completions of one prompt differ


def test_seeded_sampling_honours_the_warpers(model, tok):
    """top_k=1 leaves one token: seeded sampling must then equal greedy decoding, whatever the keys."""
    greedy_rollouts, _ = greedy_complete(model, tok, SAMPLES, RolloutConfig(max_new_tokens=10, min_new_tokens=10))
    greedy = [r.completion_ids for r in greedy_rollouts for _ in range(3)]  # what K = 3 greedy draws would give
    assert seeded(model, tok, SAMPLES, [0, 1, 2, 3], top_k=1) == greedy
    # a very low temperature is greedy too; a high one is not
    assert seeded(model, tok, SAMPLES, [0, 1, 2, 3], temperature=1e-4) == greedy
    assert seeded(model, tok, SAMPLES, [0, 1, 2, 3], temperature=5.0) != greedy


def test_seeded_token_frequencies_follow_the_model(model, tok):
    """First-token frequencies over 600 keyed draws against the model's own next-token distribution."""
    from grpo.models.tokens import encode_prompt

    prompt = encode_prompt(tok, SAMPLES[0].messages, None)
    with torch.no_grad():
        p = torch.softmax(model(torch.tensor([prompt])).logits[0, -1].double(), -1)
    n = 600
    rollout = RolloutConfig(k=n, max_new_tokens=1)  # no min_new_tokens: the stop token keeps its probability
    rollouts, _ = generate_rollouts(model, tok, SAMPLES[:1], rollout,
                                    plan=SamplingPlan(row_keys=row_keys(3, 0, [0], n)))
    counts = torch.bincount(torch.tensor([r.completion_ids[0] for r in rollouts]), minlength=p.numel()).double()
    top = torch.argsort(p, descending=True)[:3]  # the three likeliest tokens: observed share within 4.5 sigma
    for v in top.tolist():
        sigma = math.sqrt(p[v].item() * (1 - p[v].item()) / n)
        assert abs(counts[v].item() / n - p[v].item()) < 4.5 * sigma + 1e-9
