"""A lean decoding loop: Hugging Face `generate`'s sampling without its per-step bookkeeping, and with stopped rows
dropped from the model's batch.

    prefill    logits_U = model(prompt_UP, mask_UP, pos_UP = cumsum(mask) − 1 (0 on padding), logits_to_keep=1) over
               the U distinct prompt rows (an RL batch repeats each prompt K times: U = B / K); the KV cache and
               logits are then gathered back to the B rows (row b takes distinct row src_B[b])
    step t     next_B = next_token(logits_BV, step t)     (grpo/decoding/next_token.py, the one sampler: penalties,
                                                          sanitiser, warps, then the draw: keyed per row, from the
                                                          torch RNG as generate draws, or argmax when greedy)
               next_B = pad_id on rows that already stopped;  a row stops when next ∈ stop_ids
               done when every row stopped, or after max_new_tokens tokens
    compaction when the rows still running fall to ≤ COMPACT_FRACTION of the rows the model computes, the KV cache
               keeps only the running rows. The sampler still sees all B rows (a stopped row's
               logits are zeros), so every row draws what it would draw without compaction: the sampler takes its
               random numbers per row whatever the row holds, and the stopped row's draw is replaced by pad_id.

The one-token forwards are grpo/decoding/token_forward.py's: for the Llama family (Llama, Mistral, Qwen2, Qwen3) the
layers are called one by one over KV buffers written in place (`LayerForward`); any other model runs its whole
forward per token (`WholeForward`). Both give the forward's logits bit for bit.

The shared prefill: the prompt forward is most of a rollout's compute when completions are short (SmolLM2-135M,
4 prompts × K 8: `python -m benchmarks.real_model_parts` times it). A row's logits and keys / values do not depend
on the other rows of the batch, so computing each distinct prompt once gives the same cache and logits up to float
rounding (a matmul over fewer rows may round differently: ~1e-7 in tests/test_steppers.py; the sampled tokens equal
`generate`'s in tests/test_decode.py).

On the CPU the output equals `model.generate`'s, token for token under the same seed, compaction included
(tests/test_decode.py: every group of settings, sdpa and eager attention, both kinds of step), which is what lets
`rollout.engine=auto` use it. What it saves: `generate`'s per-step Python (model-input preparation, processor
signature inspection, stopping criteria, a 4D attention mask rebuilt on every forward), the forward's own
bookkeeping and cache concatenation (LayerForward), and the compute of rows that already stopped, which RL rollouts
have many of (K samples of one prompt end at very different lengths). A GPU run of it has not been measured yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from grpo.config import RolloutConfig
from grpo.decoding.next_token import StepSampling, next_token, penalty_history, remember
from grpo.decoding.token_forward import token_forward
from grpo.models.model_calls import accepts_logits_to_keep, cache_kwarg, position_ids_from_mask, returned_cache
from grpo.models.modeling import base_model, generation_mode
from grpo.models.tokens import left_pad

COMPACT_FRACTION = 0.75
"""Drop the stopped rows from the KV cache once the running rows are at most this fraction of the rows the model
computes. A copy of the cache per compaction, so a geometric threshold bounds the copies by log_{4/3}(B) (15 at B=64)
while the model never computes more than 4/3 of the running rows."""

GENERATION_FIELDS_NOT_REPLAYED = (
    "min_length", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "encoder_repetition_penalty",
    "bad_words_ids", "suppress_tokens", "begin_suppress_tokens", "forced_bos_token_id", "forced_eos_token_id",
    "sequence_bias", "guidance_scale", "typical_p", "epsilon_cutoff", "eta_cutoff", "top_h",
    "exponential_decay_length_penalty", "renormalize_logits", "remove_invalid_values", "watermarking_config",
)
"""GenerationConfig fields that `generate` would take from a model's generation_config.json and that this loop does
not apply. A model that sets one of them decodes with `generate` under `rollout.engine=auto`
(see `fields_generate_would_add`)."""

def fields_generate_would_add(model: torch.nn.Module) -> list[str]:
    """Names of GENERATION_FIELDS_NOT_REPLAYED that the model's own generation config sets to a non-default value
    (`generate` merges those into every call; this loop would not)."""
    from transformers import GenerationConfig

    own = getattr(model, "generation_config", None)
    if own is None:
        return []
    default = GenerationConfig()
    return [name for name in GENERATION_FIELDS_NOT_REPLAYED
            if getattr(own, name, None) is not None and getattr(own, name, None) != getattr(default, name, None)]


def lean_blocker(model: torch.nn.Module, cache_implementation: str, synced_gpus: bool) -> str | None:
    """Why `decode` cannot stand in for `generate` here (None = it can)."""
    if cache_implementation != "dynamic":
        return (f"rollout.cache_implementation={cache_implementation} (the lean loop keeps a dynamic cache; the static "
                "cache is for generate's compiled decoding)")
    if synced_gpus:
        return "FSDP sharding (every forward is a collective, and generate keeps the processes in step)"
    from transformers import GenerationMixin

    base = base_model(model)
    if getattr(base.config, "is_encoder_decoder", False):
        return "an encoder-decoder model"
    if type(base).prepare_inputs_for_generation is not GenerationMixin.prepare_inputs_for_generation:
        return (f"{type(base).__name__} prepares its own generation inputs (prepare_inputs_for_generation), which "
                "the lean loop would skip")
    fields = fields_generate_would_add(model)
    if fields:
        return f"the model's generation_config sets {fields}, which generate applies and the lean loop does not"
    return None


def distinct_rows(ids_BP: torch.Tensor, mask_BP: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(first_U, src_B) for a batch whose rows repeat: first_U[u] is the first row of the u-th distinct row (same
    ids and same mask), src_B[b] the distinct row that row b repeats, so ids_BP == ids_BP[first_U][src_B]. None when
    every row is distinct (nothing to share). One host read of the prompt ids."""
    seen: dict[tuple[int, ...], int] = {}
    first: list[int] = []
    src: list[int] = []
    for b, row in enumerate(torch.cat([ids_BP, mask_BP.to(ids_BP.dtype)], dim=1).tolist()):
        u = seen.setdefault(tuple(row), len(first))
        if u == len(first):
            first.append(b)
        src.append(u)
    if len(first) == len(src):
        return None
    device = ids_BP.device
    return torch.tensor(first, device=device), torch.tensor(src, device=device)


def _sync_every(device: torch.device) -> int:
    """Decoding steps between host reads of "how many rows still run". On the CPU a read is free; on an accelerator
    it stalls the launch queue, so it is read every 8 steps (at most 7 extra steps after the last row stopped, which
    only append padding)."""
    return 1 if device.type == "cpu" else 8


@dataclass(frozen=True)
class LoopSwitches:
    """The lean loop's optimisations, each on by default; off only to measure or test it against the plain loop."""

    compact: bool = True
    """Drop stopped rows from the model's batch (COMPACT_FRACTION)."""
    layer_forward: bool = True
    """One-token forwards that replay the model's layers (grpo/decoding/token_forward.py: LayerForward) where they
    apply."""
    share_prefill: bool = True
    """Prefill each distinct prompt once and repeat its cache for its K rows (`distinct_rows`)."""


def check_keys(row_keys: Sequence[int], rows: Sequence[Sequence[int]]) -> None:
    """One sampler key per row, or a ValueError naming both counts."""
    if len(row_keys) != len(rows):
        raise ValueError(f"rollouts: {len(row_keys)} row keys for {len(rows)} completions")


def _prefill(model: torch.nn.Module, ids_BP: torch.Tensor, mask_BP: torch.Tensor, max_new_tokens: int,
             switches: LoopSwitches) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """The prompt forward (each distinct row once with switches.share_prefill): the one-token forward over its cache,
    the last logits of each row and the position of each row's next token."""
    from transformers import DynamicCache

    # `generate` drops an all-ones mask (the attention then takes its causal fast path); so does this loop, so the
    # logits are bit-identical to its own
    prefill_mask = None if bool(mask_BP.all()) else mask_BP.long()
    pos_BP = position_ids_from_mask(mask_BP)
    kept = {"logits_to_keep": 1} if accepts_logits_to_keep(model) else {}
    shared = distinct_rows(ids_BP, mask_BP) if switches.share_prefill else None
    first_U, src_B = shared if shared is not None else (None, None)
    out = model(input_ids=ids_BP if first_U is None else ids_BP[first_U],
                attention_mask=prefill_mask if prefill_mask is None or first_U is None else prefill_mask[first_U],
                position_ids=pos_BP if first_U is None else pos_BP[first_U],
                **{cache_kwarg(model) or "past_key_values": DynamicCache(config=model.config)}, use_cache=True, **kept)
    # LayerForward copies the prefill's cache (row b from row src_B[b]) into its own buffers; `out` is dropped when this
    # returns, and the copy with it
    forward_one = token_forward(model, returned_cache(out), mask_BP, out.logits.dtype, max_new_tokens - 1,
                                layer_by_layer=switches.layer_forward, rows_B=src_B)
    logits_RV = out.logits[:, -1] if src_B is None else out.logits[src_B, -1]
    return forward_one, logits_RV, pos_BP[:, -1:] + 1


def decode(model: torch.nn.Module, rows: Sequence[Sequence[int]], rollout: RolloutConfig, stop_ids: Sequence[int],
           pad_id: int, *, greedy: bool = False, row_keys: Sequence[int] | None = None,
           switches: LoopSwitches = LoopSwitches()) -> tuple[list[list[int]], torch.Tensor | int]:
    """The lean engine: the new ids of each of `rows` (token ids, unpadded; at most rollout.max_new_tokens each, rows
    that stopped padded with `pad_id` after their stop token, as `generate` pads them) and the sanitiser's count of
    fixed logit rows. Sampled with `rollout`'s settings (`greedy`: argmax), each row from the torch RNG (seed it
    around the call) or, given `row_keys`, from its own stream (grpo/decoding/sampling.py).

    On the CPU the result is `generate`'s, token for token. On an accelerator the loop may run up to 7 steps past the
    last stop (see `_sync_every`), which adds padding columns and draws more random numbers, nothing else."""
    max_new_tokens = rollout.max_new_tokens
    if max_new_tokens < 1:
        raise ValueError(f"decode: max_new_tokens={max_new_tokens}; use at least 1")
    sampling = StepSampling(rollout, do_sample=not greedy, stop_ids=tuple(int(i) for i in stop_ids), pad_id=int(pad_id))
    device = next(model.parameters()).device
    ids_BP, mask_BP = (x.to(device) for x in left_pad(rows, pad_id))
    prompt_len, B = int(ids_BP.shape[1]), ids_BP.shape[0]
    keys_B = None
    if row_keys is not None and sampling.do_sample:
        check_keys(row_keys, rows)
        keys_B = torch.tensor(list(row_keys), dtype=torch.int64, device=device)
    stops_S = torch.tensor(sampling.stop_ids, dtype=torch.long, device=device)
    fixed = torch.zeros((), dtype=torch.long, device=device)
    with generation_mode(model), torch.no_grad():
        forward_one, logits_RV, next_pos_R1 = _prefill(model, ids_BP, mask_BP, max_new_tokens, switches)
        seen_BV, counts_BV = penalty_history(ids_BP, mask_BP, logits_RV.shape[-1], rollout)
        sync_every = _sync_every(device)
        rows_R: torch.Tensor | None = None  # the batch rows the model computes; None = all B
        running_B = torch.ones(B, dtype=torch.bool, device=device)
        seq_BL = ids_BP
        for t in range(max_new_tokens):
            logits_RV = logits_RV.to(dtype=torch.float32, copy=True)
            if rows_R is None:
                logits_BV = logits_RV
            else:
                logits_BV = logits_RV.new_zeros(B, logits_RV.shape[-1])
                logits_BV[rows_R] = logits_RV
            next_B = next_token(logits_BV, sampling, t, stops_S=stops_S, keys_B=keys_B, seen_BV=seen_BV,
                                counts_BV=counts_BV, fixed=fixed, may_read_host=device.type == "cpu")
            next_B = torch.where(running_B, next_B, sampling.pad_id)
            remember(next_B, seen_BV, counts_BV)
            seq_BL = torch.cat([seq_BL, next_B[:, None]], dim=-1)
            running_B = running_B & ~torch.isin(next_B, stops_S)
            if t == max_new_tokens - 1:
                break
            if (t + 1) % sync_every == 0:
                n_running = int(running_B.sum())  # a host sync
                if n_running == 0:
                    break
                computed = B if rows_R is None else int(rows_R.numel())
                if switches.compact and n_running <= COMPACT_FRACTION * computed:
                    keep_R = (running_B if rows_R is None else running_B[rows_R]).nonzero().squeeze(1)
                    forward_one.select(keep_R)
                    next_pos_R1 = next_pos_R1[keep_R]
                    rows_R = running_B.nonzero().squeeze(1)
            logits_RV = forward_one((next_B if rows_R is None else next_B[rows_R])[:, None], next_pos_R1)
            next_pos_R1 = next_pos_R1 + 1
    return seq_BL[:, prompt_len:].tolist(), fixed
