"""Batch-invariant sampling: every completion draws from its own counter-based random stream.

With Hugging Face's sampler one RNG stream serves the whole batch, so a completion depends on which other prompts
were generated with it. Data-parallel training shards the prompts of a step over processes, and then a 2-process run
could never sample what a 1-process run samples. Here row b's token at decoding step t is the winner of an
exponential race over the vocabulary (the Gumbel-max trick in log space):

    token_bt = argmax_v ( s_btv − log E_btv ),     E_btv = −log(1 − U_btv) ~ Exp(1),
    U_btv = uniform(hash(key_b, t), v) ∈ (0, 1)

where s_bt are the warped scores. P(token = v) = softmax(s_bt)_v exactly (the v with the smallest E_v / p_v wins,
and E_v / p_v ~ Exp(p_v) independently), a token of probability 0 (a −inf score) never wins, and the randomness
depends only on (key_b, t, v): not on the batch, the device count, the padding or the global torch RNG. `row_keys`
gives each completion its key from (seed, step, global prompt index, k). The hash is SplitMix64 (Steele et al., 2014;
its finaliser is MurmurHash3's fmix64), evaluated with int64 tensor arithmetic, so CPU and CUDA draw the same U.

Why a race and not the inverse CDF of one uniform per row: the race is elementwise work and one argmax, in float32,
which a compiler fuses into one pass over the vocabulary; the inverse CDF needs a float64 softmax, a cumulative sum
and a search over 151,936 columns, which inductor's CUDA code generator refused (an H200, torch 2.11). Precision: U
comes from 63 hashed bits rounded once to float32, which keeps 24 significant bits however small U is, so E near 0
(where the winners are) is as fine-grained as float32 allows; U is held below 1 − 2⁻²⁴, so E ≤ 16.6 stays finite.

The scores come warped from grpo/decoding/next_token.py `next_token`, the one sampler every engine calls; this module
is its keyed draw.
"""

from __future__ import annotations

from typing import Sequence

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


CPU_CHUNK_ELEMENTS = 1 << 17
"""On the CPU (outside a compile) the race runs over column blocks of about this many rows × columns, so that each
block's temporaries stay in the processor's cache instead of streaming a (rows, vocab) int64 tensor through memory a
dozen times. The tokens are the same (the largest value of the row wins; between blocks a later block wins only by
being strictly larger, as argmax takes the first of equal values)."""
U_MAX = 1.0 - 2.0 ** -24
"""The largest float32 below 1: U is held below it so that E = −log(1 − U) stays finite."""


def uniforms(keys_B: torch.Tensor, t: int | torch.Tensor, vocab: int, start: int = 0) -> torch.Tensor:
    """U (B, vocab) float32 in the open interval (0, 1) for columns start … start + vocab − 1, a function of
    (key_b, t, v) only. `t` may be a 0-d device tensor (the graph engine's step counter)."""
    base_B1 = splitmix64(keys_B + t)[:, None]
    bits_BV = splitmix64(base_B1 + torch.arange(start, start + vocab, device=keys_B.device, dtype=torch.int64))
    return ((_shr(bits_BV, 1).float() + 0.5) * 2.0 ** -63).clamp(max=U_MAX)


def race_scores(scores_BV: torch.Tensor, keys_B: torch.Tensor, t: int | torch.Tensor, start: int = 0) -> torch.Tensor:
    """s − log E (B, V) float32 for the columns start … start + V − 1 of the vocabulary: the row's token is the
    argmax over the whole vocabulary (see the module docstring)."""
    exp_BV = -torch.log1p(-uniforms(keys_B, t, scores_BV.shape[-1], start))
    return scores_BV.float() - torch.log(exp_BV)


def keyed_choice(scores_BV: torch.Tensor, keys_B: torch.Tensor, t: int | torch.Tensor) -> torch.Tensor:
    """The sampled token per row: the winner of the exponential race of softmax(scores) with row b's stream at step t.
    One fused pass where it is compiled or on an accelerator; column blocks on the CPU (CPU_CHUNK_ELEMENTS)."""
    B, V = scores_BV.shape
    if scores_BV.device.type != "cpu" or torch.compiler.is_compiling():
        return torch.argmax(race_scores(scores_BV, keys_B, t), dim=-1)
    block = max(256, CPU_CHUNK_ELEMENTS // max(B, 1))
    best_B, choice_B = torch.max(race_scores(scores_BV[:, :block], keys_B, t), dim=-1)
    for start in range(block, V, block):
        value_B, index_B = torch.max(race_scores(scores_BV[:, start:start + block], keys_B, t, start), dim=-1)
        better_B = value_B > best_B
        best_B = torch.where(better_B, value_B, best_B)
        choice_B = torch.where(better_B, index_B + start, choice_B)
    return choice_B

