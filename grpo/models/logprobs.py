"""Per-token log-probs of the sampled completion tokens: the one place that runs the model for training.

Layout (see grpo/core/step_types.py): `input_ids_BL = [left-padded prompt (P columns) | right-padded completion (T
columns)]`. The logits at column P − 1 + t predict completion token t.

Formulas (one line each, with the source):
- log p(y_t) = z_t[y_t]/τ − logsumexp(z_t/τ)                    (softmax with temperature τ, as sampled by `generate`)
- position_ids = cumsum(attention_mask) − 1, 0 on padding          (transformers `_prepare_position_ids_for_generation`)

Memory: a (B, T, V) fp32 log-softmax is never built. The chunked kernels of grpo/core/kernels.py gather the target logit
and compute logsumexp in fp32 chunks of rows (recomputing the softmax per chunk in backward), so the largest fp32
temporary is chunk_size × V, and bf16 logits lose no precision. With the fused head (`head_logprobs`, Llama-like
models) the logits themselves exist one chunk at a time: the LM head is applied to the final hidden states inside
the log-prob computation and recomputed in backward.

Why position_ids are passed: transformers 5.x `LlamaModel.forward` uses `arange(L)` when position_ids is None (it does
not look at the attention mask), while `generate` derives them from the mask. Passing the mask-derived ids makes the
training pass see exactly the positions generation used; for absolute-position models (GPT-2) it is what makes a
left-padded row equal the same row alone. For RoPE models the shift cancels in q·k up to rounding.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from grpo.core.kernels import DEFAULT_LOGPROB_CHUNK_ROWS, entropy_from_logits, head_logprobs, token_logprobs
from grpo.models.model_calls import accepts_logits_to_keep, cache_kwarg, position_ids_from_mask
from grpo.models.modeling import base_model, has_sliding_window

FUSABLE_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "phi3", "olmo2"})
"""Model types whose logits are exactly final_hidden · lm_headᵀ (no soft-capping, logit scale or bias), so the
fused head path computes what the model would. Others take the logits path."""


def no_logits(like: torch.Tensor) -> torch.Tensor:
    """`logits_to_keep` that keeps no position, for forwards whose logits the fused head computes itself from the
    hooked hidden states. transformers slices `hidden_states[:, logits_to_keep, :]`, and a 1-D index tensor is taken
    as the positions to keep (an int 0 would keep them all), so an empty one gives (B, 0, V) logits for free. One
    kept position costs a head product per row (B matrix-vector products through a strided slice): 2 % of a
    32-row × 72-token SmolLM2 forward on one CPU thread, within noise (`python benchmarks/real_model_parts.py`)."""
    return torch.empty(0, dtype=torch.long, device=like.device)


def fused_head_parts(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Linear] | None:
    """(decoder, lm_head) when the fused head path applies to `model` (DDP / PEFT wrappers looked through), else
    None: an unknown model type, a head with a bias or a LoRA layer, or sharded (FSDP) head weights."""
    base = base_model(model)
    if getattr(getattr(base, "config", None), "model_type", None) not in FUSABLE_MODEL_TYPES:
        return None
    head = base.get_output_embeddings()
    decoder = base.get_decoder() if hasattr(base, "get_decoder") else None
    if (type(head) is not torch.nn.Linear or head.bias is not None or hasattr(head.weight, "to_local")
            or decoder is None):
        return None
    return decoder, head


SHARED_PROMPT_MIN_PARAMS = 1_000_000
"""model.shared_prompt_forward=auto encodes shared prompts once only for models of at least this many parameters.
Below it the second forward's fixed cost exceeds the prompt tokens saved: on 2 CPU cores, 8 rows of 41-token
prompts per micro-batch, the 123k-parameter benchmark model's training pass took 6 % longer and its reference pass
31 % longer; the 3.1M-parameter one's took 16 % and 15 % less (benchmarks/NOTES.md)."""


def shares_by_size(mode: str, n_params: int) -> bool:
    """model.shared_prompt_forward where nothing blocks it: "on", or "auto" from SHARED_PROMPT_MIN_PARAMS."""
    return mode == "on" or (mode == "auto" and n_params >= SHARED_PROMPT_MIN_PARAMS)


def shared_prompt_blocker(model: torch.nn.Module, training: bool) -> str | None:
    """Why `completion_logprobs(..., group_size=K)` may not encode each group's prompt once (None = it may).
    Static properties of the model: the entry point asks once, for the training passes (`training`: with their
    graph) or for no-grad passes only. Activation checkpointing is no obstacle: see `_prompt_cache`."""
    base = base_model(model)  # DDP: see `_shared_prompt_logprobs`
    config = getattr(base, "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False):
        return "not a decoder-only transformers model"
    if cache_kwarg(base) is None:
        return f"{type(base).__name__}.forward takes no KV cache (neither `cache` nor `past_key_values`)"
    if has_sliding_window(config):
        return "sliding-window attention layers"
    if any(hasattr(p, "to_local") for p in base.parameters()):
        return "sharded (FSDP) weights"
    modules = list(base.modules())
    if training and any(getattr(m, "gradient_checkpointing", False) for m in modules) and not any(
            hasattr(type(m), "_can_checkpoint_with_cache") for m in modules):
        return ("activation checkpointing in layers that drop the KV cache (a transformers version without "
                "`_can_checkpoint_with_cache`)")
    return None


def groups_share_prompts(input_ids_BL: torch.Tensor, attention_mask_BL: torch.Tensor, prompt_len: int,
                         group_size: int) -> bool:
    """Whether rows g·K … g·K + K − 1 hold the same prompt columns, for every group g (one host read)."""
    B = input_ids_BL.shape[0]
    if group_size < 2 or B % group_size:
        return False
    G, P = B // group_size, prompt_len
    ids_GKP = input_ids_BL[:, :P].reshape(G, group_size, P)
    mask_GKP = attention_mask_BL[:, :P].reshape(G, group_size, P)
    return bool(((ids_GKP == ids_GKP[:, :1]) & (mask_GKP == mask_GKP[:, :1])).all())


def _prompt_cache(config: Any, group_size: int):
    """A KV cache for `_shared_prompt_logprobs` whose every write is idempotent, so that a checkpointed layer's
    recompute in backward sees exactly what its first forward saw (transformers otherwise drops the cache inside
    checkpointed layers: a second append would corrupt it). Per layer: the prompt forward (G rows) SETS the prompt's
    keys / values; the completion forward (G·K rows) reads them, repeated K times, in front of its own, and stores
    nothing."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    class PromptLayer(DynamicLayer):
        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
            if self.is_initialized and key_states.shape[0] == group_size * self.keys.shape[0]:
                return (torch.cat([self.keys.repeat_interleave(group_size, dim=0), key_states], dim=-2),
                        torch.cat([self.values.repeat_interleave(group_size, dim=0), value_states], dim=-2))
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            self.keys, self.values = key_states, value_states
            return key_states, value_states

    cache = DynamicCache(config=config)
    cache.layers = [PromptLayer() for _ in cache.layers]
    return cache


@contextlib.contextmanager
def _cache_through_checkpointing(model: torch.nn.Module):
    """Let transformers' checkpointed layers pass the KV cache on (`_can_checkpoint_with_cache`, meant for layers
    that only read it; `_prompt_cache` makes every write a repeatable set). The recompute in backward keeps the
    cache it was first called with."""
    layers = [m for m in model.modules() if hasattr(type(m), "_can_checkpoint_with_cache")]
    for m in layers:
        m._can_checkpoint_with_cache = True
    try:
        yield
    finally:
        for m in layers:
            del m._can_checkpoint_with_cache


def _shared_prompt_logprobs(model: torch.nn.Module, input_ids_BL: torch.Tensor, attention_mask_BL: torch.Tensor,
                            prompt_len: int, group_size: int, temperature: float, with_entropy: bool,
                            chunk_size: int, fused_head: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`completion_logprobs` with each group's prompt encoded once (see there); rows must be grouped."""
    L = input_ids_BL.shape[1]
    K, P, T = group_size, prompt_len, L - prompt_len
    prompt_GP, prompt_mask_GP = input_ids_BL[::K, :P], attention_mask_BL[::K, :P]
    targets_BT = input_ids_BL[:, P:]
    # Under DDP the prompt forward runs on the wrapped module, the completion forward through the wrapper, so the
    # wrapper's per-forward work (buffer broadcast, readying the reducer) happens once for the one backward; its
    # gradient hooks fire once per parameter with both forwards' contributions added (tests/test_distributed.py)
    inner, base = getattr(model, "module", model), base_model(model)
    cache = _prompt_cache(base.config, K)
    cache_arg = {cache_kwarg(base): cache}
    keep = accepts_logits_to_keep(model)
    parts = fused_head_parts(model) if fused_head and keep else None
    caught: list[torch.Tensor] = []
    hook = None if parts is None else parts[0].register_forward_hook(
        lambda module, args, out: caught.append(out[0] if isinstance(out, tuple) else out.last_hidden_state))
    try:  # use_cache=False: the cache passed in is used anyway; True only adds a warning under checkpointing
        with _cache_through_checkpointing(base):
            # 1. the G prompts: their KV cache, and the hidden state / logits of the last prompt column (→ token 0)
            first = inner(input_ids=prompt_GP, attention_mask=prompt_mask_GP,
                          position_ids=position_ids_from_mask(prompt_mask_GP), **cache_arg, use_cache=False,
                          **({"logits_to_keep": 1 if parts is None else no_logits(prompt_GP)} if keep else {}))
            rest = None
            if T > 1:
                # 2. the completions (all but their last column, which predicts nothing we score) attend to
                #    their group's cached prompt, repeated K times (the K copies' gradients add up in the prompt's)
                mask_BL1 = attention_mask_BL[:, :L - 1]
                rest = model(input_ids=input_ids_BL[:, P:L - 1], attention_mask=mask_BL1,
                             position_ids=position_ids_from_mask(mask_BL1)[:, P:], **cache_arg,
                             use_cache=False,
                             **({"logits_to_keep": T - 1 if parts is None else no_logits(prompt_GP)} if keep else {}))
    finally:
        if hook is not None:
            hook.remove()
    if parts is not None:
        pieces = [caught[0][:, -1:].repeat_interleave(K, dim=0)] + ([caught[1]] if rest is not None else [])
        return head_logprobs(torch.cat(pieces, dim=1), parts[1].weight, targets_BT, temperature, with_entropy,
                             chunk_size)
    pieces = [first.logits[:, -1:].repeat_interleave(K, dim=0)]
    if rest is not None:
        pieces.append(rest.logits[:, -(T - 1):])
    logits_BTV = torch.cat(pieces, dim=1)
    logps_BT = token_logprobs(logits_BTV, targets_BT, temperature, chunk_size)
    entropy_BT = entropy_from_logits(logits_BTV, chunk_size, temperature) if with_entropy else None
    return logps_BT, entropy_BT


def completion_logprobs(model: torch.nn.Module, input_ids_BL: torch.Tensor, attention_mask_BL: torch.Tensor,
                        prompt_len: int, temperature: float = 1.0, with_entropy: bool = False,
                        chunk_size: int = DEFAULT_LOGPROB_CHUNK_ROWS,
                        fused_head: bool = True, group_size: int = 1) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (B, T) of the completion tokens `input_ids_BL[:, prompt_len:]`, and their entropies when asked.

    Runs one forward pass with mask-derived position_ids and `use_cache=False`, asking only for the last T + 1
    logits when the model supports `logits_to_keep`. Gradients flow when grad is enabled; the caller owns
    train()/eval() mode and no_grad. Entropy (fp32, nats, at `temperature`) is differentiable too.

    `fused_head` (when `fused_head_parts` allows it): the model computes no logits (`no_logits`); the
    decoder's final hidden states are caught by a forward hook and `head_logprobs` applies the LM head chunk by
    chunk, so neither the (B, T, V) logits nor their gradient is ever held (1.2 GiB each at 32 × 128 × 152k bf16).

    `group_size` K > 1 (the caller checked `shared_prompt_blocker`): rows g·K … g·K + K − 1 are the K completions
    of one prompt. When their prompt columns are indeed identical (`groups_share_prompts`), each prompt is encoded
    once: a forward over the G = B / K prompts fills a KV cache, which is repeated K times, and a second forward
    runs the completions against it. Same log-probs up to rounding (the per-row path computes the same prompt K
    times), and G·P + B·(T − 1) tokens instead of B·L: the long-prompt, short-answer tasks save most. In train mode
    with dropout the K rows share their prompt's dropout masks: each row's gradient keeps its expectation, the K
    rows' noise is correlated.
    """
    if input_ids_BL.shape != attention_mask_BL.shape or input_ids_BL.dim() != 2:
        raise ValueError(f"completion_logprobs: input_ids {tuple(input_ids_BL.shape)} and attention_mask "
                         f"{tuple(attention_mask_BL.shape)} must both be (B, L)")
    L = input_ids_BL.shape[1]
    if not 1 <= prompt_len < L:
        raise ValueError(f"completion_logprobs: prompt_len={prompt_len} must lie in [1, L−1] with L={L}: "
                         "every row needs at least one prompt column and one completion column")
    T = L - prompt_len
    if group_size > 1 and groups_share_prompts(input_ids_BL, attention_mask_BL, prompt_len, group_size):
        return _shared_prompt_logprobs(model, input_ids_BL, attention_mask_BL, prompt_len, group_size, temperature,
                                       with_entropy, chunk_size, fused_head)
    kwargs = {"input_ids": input_ids_BL, "attention_mask": attention_mask_BL,
              "position_ids": position_ids_from_mask(attention_mask_BL), "use_cache": False}
    targets_BT = input_ids_BL[:, prompt_len:]
    parts = fused_head_parts(model) if fused_head and accepts_logits_to_keep(model) else None
    if parts is not None:
        decoder, head = parts
        caught: list[torch.Tensor] = []
        hook = decoder.register_forward_hook(
            lambda module, args, out: caught.append(out[0] if isinstance(out, tuple) else out.last_hidden_state))
        try:
            model(**kwargs, logits_to_keep=no_logits(input_ids_BL))  # through every wrapper (DDP, PEFT adapters)
        finally:
            hook.remove()
        return head_logprobs(caught[-1][:, -(T + 1):-1], head.weight, targets_BT, temperature, with_entropy,
                             chunk_size)
    if accepts_logits_to_keep(model):
        kwargs["logits_to_keep"] = T + 1
    logits = model(**kwargs).logits
    # Columns P−1 … L−1 are kept (T + 1 of them); the last predicts a token after the completion, so drop it.
    logits_BTV = logits[:, -(T + 1):-1]
    logps_BT = token_logprobs(logits_BTV, targets_BT, temperature, chunk_size)
    entropy_BT = entropy_from_logits(logits_BTV, chunk_size, temperature) if with_entropy else None
    return logps_BT, entropy_BT
