"""The graph engine's buffers (grpo/decoding/graph_decode.py): every tensor its decoding step reads or writes, laid out
before the loop (a CUDA graph replays fixed addresses) by `build_state`, which prefills the prompts into them, or
writes a new rollout into the buffers of an earlier one of the same shape (`into`).

    K_i, V_i   (B, KVH, L, D) per layer, L = P̂ + N: the prompt padded on the left to P̂ columns (a multiple of the
               engine's prompt bucket) and N = max_new_tokens columns for the completion; zeros where not written
    logits_BV  the next token's logits (the model's dtype)
    out_BN     the tokens drawn (pad on rows that stopped); t, n (0-d): the decoding step and the buffer column
    seen_BV / counts_BV   the repetition penalty's seen tokens / the presence and frequency penalties' counts
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Sequence

import torch

from grpo.decoding.next_token import StepSampling, penalty_history
from grpo.models.model_calls import accepts_logits_to_keep, cache_kwarg, position_ids_from_mask, returned_cache


@dataclass
class DecodeState:
    """Every tensor the step reads or writes, allocated before the loop (a CUDA graph replays fixed addresses)."""

    K: list[torch.Tensor]
    V: list[torch.Tensor]
    attend_BL: torch.Tensor      # bool: the prompt's real columns and every completion column
    cols_L: torch.Tensor         # arange(L)
    logits_BV: torch.Tensor      # the next token's logits (the model's dtype)
    next_B: torch.Tensor         # the token the step feeds to the model
    pos_B1: torch.Tensor         # its position
    t: torch.Tensor              # 0-d: the decoding step
    n: torch.Tensor              # 0-d: the buffer column the step writes (P̂ + t)
    running_B: torch.Tensor
    keys_B: torch.Tensor
    out_BN: torch.Tensor
    fixed: torch.Tensor          # 0-d: sampler steps × rows whose logits the sanitiser fixed
    stops: torch.Tensor
    seen_BV: torch.Tensor | None = None    # repetition penalty: tokens in the prompt or the completion
    counts_BV: torch.Tensor | None = None  # presence / frequency penalties: completion token counts
    folded: list[torch.Tensor] = field(default_factory=list)  # the folded weights, in `GraphStep.plan` order


def build_state(model: torch.nn.Module, ids_BP: torch.Tensor, mask_BP: torch.Tensor, keys_B: torch.Tensor,
                sampling: StepSampling, max_new_tokens: int, folded: list[torch.Tensor],
                distinct: tuple[list[int], list[int]] | None, into: DecodeState | None = None) -> DecodeState:
    """Prefill the prompts (each distinct one once) and lay out every buffer of the loop, or, given `into` (a state
    of the same shape and settings), write the new rollout into its buffers in place: a captured step replays fixed
    addresses."""
    from transformers import DynamicCache

    device = ids_BP.device
    B, P = ids_BP.shape
    L = P + max_new_tokens
    pos_BP = position_ids_from_mask(mask_BP)
    # the mask is passed even when nothing is padded (no host read to find out): transformers then drops it itself
    prefill_mask = mask_BP.long()
    first = None if distinct is None else torch.tensor(distinct[0], device=device)
    src_B = None if distinct is None else torch.tensor(distinct[1], device=device)
    pick = (lambda x: x) if first is None else (lambda x: x[first])
    extra = {"logits_to_keep": 1} if accepts_logits_to_keep(model) else {}
    cache_arg = {cache_kwarg(model) or "past_key_values": DynamicCache(config=model.config)}
    out = model(input_ids=pick(ids_BP), attention_mask=pick(prefill_mask), position_ids=pick(pos_BP), **cache_arg,
                use_cache=True, **extra)
    cache = returned_cache(out)
    logits_BV = (out.logits[:, -1] if src_B is None else out.logits[src_B, -1]).clone()
    del out
    K, V = [], []
    for i, layer in enumerate(cache.layers):
        keys, values = layer.keys, layer.values  # (U or B, KVH, P, D)
        if into is None:
            # zeros, not empty: the attention multiplies the masked columns' values by a weight of 0, and 0 · NaN of
            # uninitialised memory would be NaN
            Kb = keys.new_zeros(B, keys.shape[1], L, keys.shape[-1])
            Vb = values.new_zeros(B, values.shape[1], L, values.shape[-1])
        else:  # the columns after the prompt are zeroed again: a value the last rollout left there could be NaN
            Kb, Vb = into.K[i], into.V[i]
            Kb[:, :, P:].zero_()
            Vb[:, :, P:].zero_()
        Kb[:, :, :P], Vb[:, :, :P] = (keys, values) if src_B is None else (keys[src_B], values[src_B])
        K.append(Kb)
        V.append(Vb)
        layer.keys = layer.values = None  # one layer's prompt cache at a time on top of the buffers
        del keys, values
    return _with_buffers(into, K, V, logits_BV, ids_BP, mask_BP, pos_BP, keys_B, sampling, max_new_tokens, folded)


def _with_buffers(into: DecodeState | None, K: list[torch.Tensor], V: list[torch.Tensor], logits_BV: torch.Tensor,
                  ids_BP: torch.Tensor, mask_BP: torch.Tensor, pos_BP: torch.Tensor, keys_B: torch.Tensor,
                  sampling: StepSampling, max_new_tokens: int, folded: list[torch.Tensor]) -> DecodeState:
    """The loop's other buffers for the prefilled K, V and logits: new, or copied into `into`'s (REFILLED_FIELDS)."""
    device = ids_BP.device
    B, P = ids_BP.shape
    attend_BL = torch.cat([mask_BP.bool(), torch.ones(B, max_new_tokens, dtype=torch.bool, device=device)], dim=1)
    seen_BV, counts_BV = penalty_history(ids_BP, mask_BP, logits_BV.shape[-1], sampling.rollout)
    fresh = DecodeState(K=K, V=V, attend_BL=attend_BL, cols_L=torch.arange(P + max_new_tokens, device=device),
                        logits_BV=logits_BV, next_B=torch.full((B,), sampling.pad_id, dtype=torch.long, device=device),
                        pos_B1=pos_BP[:, -1:] + 1, t=torch.zeros((), dtype=torch.long, device=device),
                        n=torch.full((), P, dtype=torch.long, device=device),
                        running_B=torch.ones(B, dtype=torch.bool, device=device), keys_B=keys_B.to(device),
                        out_BN=torch.full((B, max_new_tokens), sampling.pad_id, dtype=torch.long, device=device),
                        fixed=torch.zeros((), dtype=torch.long, device=device),
                        stops=torch.tensor(list(sampling.stop_ids), dtype=torch.long, device=device),
                        seen_BV=seen_BV, counts_BV=counts_BV, folded=folded)
    if into is None:
        return fresh
    for name in REFILLED_FIELDS:
        target = getattr(into, name)
        if target is not None:
            target.copy_(getattr(fresh, name))
    into.folded = folded
    return into


REFILLED_FIELDS = ("attend_BL", "logits_BV", "next_B", "pos_B1", "t", "n", "running_B", "keys_B", "out_BN", "fixed",
                   "seen_BV", "counts_BV")
"""The DecodeState fields a rollout writes into a kept state besides the KV buffers (cols_L and stops depend only on
the shape and the settings, which are the slot's key; the folded weights are the rollout's own)."""


def state_bytes(state: DecodeState) -> int:
    """Bytes of every buffer the state holds, the folded weights excepted (made for each rollout)."""
    tensors = [*state.K, *state.V] + [getattr(state, f.name) for f in dataclasses.fields(DecodeState)
                                      if f.name not in ("K", "V", "folded")]
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


MUTABLE_FIELDS = ("K", "V", "logits_BV", "next_B", "pos_B1", "t", "n", "running_B", "out_BN", "fixed", "seen_BV",
                  "counts_BV")
"""The DecodeState fields a step writes."""


TRACER_ROWS = 7
"""Rows of the stand-in state the step is compiled on (`tracer_state`): not 0 or 1 (torch specialises those sizes)
and unlike any other size of the state (torch takes equal sizes for one symbol)."""
TRACER_PROMPT_COLUMNS = 192
"""Its prompt columns (three 64-column buckets): the column count then differs from every row count."""


def tracer_state(state: DecodeState) -> DecodeState:
    """A small stand-in for `state`: the same tensors, dtypes and devices with TRACER_ROWS rows and
    TRACER_PROMPT_COLUMNS + N columns, its row and column sizes marked dynamic, the folded weights shared. Compiling the
    step on it gives one graph for every number of rows and prompt bucket, and what torch keeps of the inputs it
    compiled on (its shape environment holds them: pytorch/pytorch#190093) is this, not a rollout's buffers, which
    would then outlive their slot."""
    B, N = TRACER_ROWS, state.out_BN.shape[1]
    L, V = TRACER_PROMPT_COLUMNS + N, state.logits_BV.shape[1]

    def like(t: torch.Tensor, *shape: int, fill: float | bool = 0) -> torch.Tensor:
        return torch.full(shape, fill, dtype=t.dtype, device=t.device)

    tracer = DecodeState(
        K=[like(k, B, k.shape[1], L, k.shape[3]) for k in state.K], V=[like(v, B, v.shape[1], L, v.shape[3])
                                                                       for v in state.V],
        attend_BL=like(state.attend_BL, B, L, fill=True), cols_L=torch.arange(L, device=state.cols_L.device),
        logits_BV=like(state.logits_BV, B, V), next_B=like(state.next_B, B), pos_B1=like(state.pos_B1, B, 1,
                                                                                       fill=TRACER_PROMPT_COLUMNS),
        t=torch.zeros_like(state.t), n=torch.full_like(state.n, TRACER_PROMPT_COLUMNS),
        running_B=like(state.running_B, B, fill=True), keys_B=like(state.keys_B, B), out_BN=like(state.out_BN, B, N),
        fixed=torch.zeros_like(state.fixed), stops=state.stops, folded=state.folded,
        seen_BV=None if state.seen_BV is None else like(state.seen_BV, B, V),
        counts_BV=None if state.counts_BV is None else like(state.counts_BV, B, V))
    for t in [*tracer.K, *tracer.V]:
        torch._dynamo.mark_dynamic(t, 0)
        torch._dynamo.mark_dynamic(t, 2)
    torch._dynamo.mark_dynamic(tracer.attend_BL, 1)
    torch._dynamo.mark_dynamic(tracer.cols_L, 0)
    for t in (tracer.attend_BL, tracer.logits_BV, tracer.next_B, tracer.pos_B1, tracer.running_B, tracer.keys_B,
              tracer.out_BN, tracer.seen_BV, tracer.counts_BV):
        if t is not None:
            torch._dynamo.mark_dynamic(t, 0)
    return tracer


def distinct_lists(rows: Sequence[Sequence[int]]) -> tuple[list[int], list[int]] | None:
    """(first_U, src_B) for rows that repeat (an RL batch holds each prompt K times): first_U[u] is the first row of
    the u-th distinct row, src_B[b] the distinct row that row b repeats; None when every row is distinct. Read from
    the host's lists, before anything is on the device."""
    seen: dict[tuple[int, ...], int] = {}
    first: list[int] = []
    src: list[int] = []
    for b, row in enumerate(rows):
        u = seen.setdefault(tuple(row), len(first))
        if u == len(first):
            first.append(b)
        src.append(u)
    return None if len(first) == len(src) else (first, src)
