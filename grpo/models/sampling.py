"""Batch-invariant sampling: every completion draws from its own counter-based random stream.

With Hugging Face's sampler one RNG stream serves the whole batch, so a completion depends on which other prompts
were generated with it. Data-parallel training shards the prompts of a step over processes, and then a 2-process run
could never sample what a 1-process run samples. Here row b's token at decoding step t is drawn by inverse CDF

    p_bt = softmax(warped_logit_bt)      token_bt = min{ v : Σ_{u ≤ v} p_btu ≥ U_bt · Σ_u p_btu },
    U_bt = uniform(hash(key_b, t)) ∈ (0, 1)

an exact draw from p_bt (a token of probability 0, e.g. a −inf logit, is never chosen) whose randomness depends only
on (key_b, t): not on the batch, the device count, the padding or the global torch RNG. `row_keys` gives each
completion its key from (seed, step, global prompt index, k). The hash is SplitMix64 (Steele et al., 2014; its
finaliser is MurmurHash3's fmix64), evaluated with int64 tensor arithmetic, so CPU and CUDA draw the same U.
One uniform per row and step: the cost is the softmax and cumulative sum the sampler needs anyway.

The warpers (temperature, top-k, top-p, min-p) are Hugging Face's own classes, applied in generate's order.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

_M64 = 1 << 64


def _s64(c: int) -> int:
    """An unsigned 64-bit constant as the int64 with the same bits."""
    return c - _M64 if c >= 1 << 63 else c


_GOLDEN = _s64(0x9E3779B97F4A7C15)
_MIX1 = _s64(0xBF58476D1CE4E5B9)
_MIX2 = _s64(0x94D049BB133111EB)


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's >> is arithmetic: it copies the sign bit)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def splitmix64(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64 of int64 tensor x (wrapping 64-bit arithmetic): a bijection with full avalanche."""
    z = x + _GOLDEN
    z = (z ^ _shr(z, 30)) * _MIX1
    z = (z ^ _shr(z, 27)) * _MIX2
    return z ^ _shr(z, 31)


def splitmix64_int(x: int) -> int:
    """The same function on a Python int (reference implementation; used to derive keys)."""
    z = (x + 0x9E3779B97F4A7C15) % _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % _M64
    return _s64(z ^ (z >> 31))


def row_keys(seed: int, step: int, prompt_indices: Sequence[int], k: int) -> list[int]:
    """One key per completion, rows ordered prompt-major (prompt i's K completions are rows i·K … i·K+K−1).

    `prompt_indices` are the prompts' positions in the step's GLOBAL batch, so a prompt keeps its keys whichever
    process generates it.
    """
    keys = []
    for i in prompt_indices:
        base = splitmix64_int(splitmix64_int(splitmix64_int(seed) ^ step) ^ int(i))
        keys += [splitmix64_int(base ^ j) for j in range(k)]
    return keys


def uniforms(keys_B: torch.Tensor, t: int, vocab: int) -> torch.Tensor:
    """U (B, V) float64 in the open interval (0, 1), a function of (key_b, t, v) only."""
    base_B = splitmix64(keys_B + t)
    bits_BV = splitmix64(base_B[:, None] + torch.arange(vocab, device=keys_B.device, dtype=torch.int64)[None, :])
    return (_shr(bits_BV, 11).double() + 0.5) * 2.0 ** -53


def warpers(temperature: float, top_k: int, top_p: float, min_p: float) -> list[Any]:
    """Hugging Face's sampling warpers for these settings, in `generate`'s order (neutral values add none)."""
    from transformers import MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    out: list[Any] = []
    if temperature != 1.0:
        out.append(TemperatureLogitsWarper(temperature))
    if top_k:
        out.append(TopKLogitsWarper(top_k=top_k))
    if top_p < 1.0:
        out.append(TopPLogitsWarper(top_p=top_p))
    if min_p > 0:
        out.append(MinPLogitsWarper(min_p=min_p))
    return out


def inverse_cdf_choice(scores_BV: torch.Tensor, keys_B: torch.Tensor, t: int) -> torch.Tensor:
    """The sampled token per row: inverse CDF of softmax(scores) (float64) at U(key, t)."""
    cdf_BV = torch.softmax(scores_BV.double(), dim=-1).cumsum(dim=-1)
    target_B1 = uniforms(keys_B, t, 1) * cdf_BV[:, -1:]
    return torch.searchsorted(cdf_BV, target_B1).squeeze(1).clamp(max=scores_BV.shape[-1] - 1)


def draw(scores_BV: torch.Tensor, keys_B: torch.Tensor | None, t: int) -> torch.Tensor:
    """The sampled token of each row at decoding step t, from softmax(scores): from the torch RNG as `generate`
    samples (keys_B None), or from each row's own stream (`inverse_cdf_choice`)."""
    if keys_B is None:
        return torch.multinomial(torch.softmax(scores_BV, dim=-1), num_samples=1).squeeze(1)
    return inverse_cdf_choice(scores_BV, keys_B, t)


class SeededSampler:
    """A logits processor that samples each row from its own stream and returns one-hot scores (0 at the chosen
    token, −inf elsewhere), so that `generate` in greedy mode emits exactly the sampled token.

    Use it LAST, with generate's own sampling off (do_sample=False): Hugging Face's non-sampling processors
    (repetition penalty, min_new_tokens) and the caller's processors run before it, as they would before sampling.
    """

    def __init__(self, keys: Sequence[int], prompt_len: int, temperature: float = 1.0, top_k: int = 0,
                 top_p: float = 1.0, min_p: float = 0.0) -> None:
        self.keys_B = torch.tensor(list(keys), dtype=torch.int64)
        self.prompt_len = prompt_len
        self.warpers = warpers(temperature, top_k, top_p, min_p)

    def __call__(self, input_ids: torch.LongTensor, scores_BV: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[0] != self.keys_B.numel():
            raise ValueError(f"SeededSampler: {input_ids.shape[0]} rows but {self.keys_B.numel()} keys")
        for warp in self.warpers:
            scores_BV = warp(input_ids, scores_BV)
        if self.keys_B.device != scores_BV.device:  # once: no host-to-device copy on every decoding step
            self.keys_B = self.keys_B.to(scores_BV.device)
        t = int(input_ids.shape[1]) - self.prompt_len  # decoding step: 0 for the first new token
        choice_B = inverse_cdf_choice(scores_BV, self.keys_B, t)
        onehot_BV = torch.full_like(scores_BV, float("-inf"))
        return onehot_BV.scatter_(1, choice_B[:, None], 0.0)
