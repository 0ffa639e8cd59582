"""Batch-invariant sampling (grpo/models/sampling.py): the hash, the inverse-CDF draw, and generate's output per row."""

from __future__ import annotations

import math

import pytest
import torch

from grpo.config import RolloutConfig
from grpo.models.modeling import build_tiny_model, build_tiny_tokenizer
from grpo.core.records import Sample
from grpo.phases.generate import Draw, generate_rollouts, greedy_complete
from grpo.models.sampling import inverse_cdf_choice, row_keys, splitmix64, splitmix64_int, uniforms


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
    assert u.shape == (4, 5000) and 0 < u.min() and u.max() < 1
    assert abs(u.mean().item() - 0.5) < 0.01 and abs(u.var().item() - 1 / 12) < 0.005
    assert torch.equal(uniforms(keys[2:], 3, 5000), u[2:])  # a row does not depend on the rows beside it
    assert not torch.equal(uniforms(keys, 4, 5000), u)  # another step, another draw
    assert len(set(row_keys(0, 1, range(50), 4))) == 200  # every completion its own key


def test_inverse_cdf_draws_from_the_softmax():
    """Frequencies of 40,000 draws against softmax(scores): a chi-square test with 3 degrees of freedom."""
    scores = torch.tensor([2.0, 1.0, 0.0, -1.0])
    p = torch.softmax(scores, 0)
    n = 40_000
    keys = torch.tensor(row_keys(7, 0, range(n), 1))
    picks = inverse_cdf_choice(scores.expand(n, 4), keys, 0)
    counts = torch.bincount(picks, minlength=4).double()
    chi2 = (((counts - n * p) ** 2) / (n * p)).sum().item()
    assert chi2 < 16.27  # the 0.999 quantile of chi-square(3): a wrong sampler fails, a right one passes


def test_minus_infinity_is_never_drawn():
    scores = torch.tensor([[0.0, float("-inf"), 0.0, float("-inf")]]).expand(2000, 4)
    picks = inverse_cdf_choice(scores, torch.tensor(row_keys(1, 0, range(2000), 1)), 0)
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
    rollouts, _ = generate_rollouts(model, tok, samples, rollout, draw=Draw(row_keys=row_keys(0, step, indices, 3)))
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
    rollouts, _ = generate_rollouts(model, tok, SAMPLES[:1], rollout, draw=Draw(row_keys=row_keys(3, 0, [0], n)))
    counts = torch.bincount(torch.tensor([r.completion_ids[0] for r in rollouts]), minlength=p.numel()).double()
    top = torch.argsort(p, descending=True)[:3]  # the three likeliest tokens: observed share within 4.5 sigma
    for v in top.tolist():
        sigma = math.sqrt(p[v].item() * (1 - p[v].item()) / n)
        assert abs(counts[v].item() / n - p[v].item()) < 4.5 * sigma + 1e-9
