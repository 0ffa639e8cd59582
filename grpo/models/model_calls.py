"""How this code calls a causal LM's forward, shared by the training forward (grpo/models/logprobs.py) and the decoding
loop (grpo/decoding/decode.py): position ids derived from the attention mask, and `logits_to_keep` where the model takes
it.

    position_ids = cumsum(attention_mask) − 1, 0 on padding    (transformers `_prepare_position_ids_for_generation`)
"""

from __future__ import annotations

import inspect
from typing import Any

import torch


def position_ids_from_mask(attention_mask_BL: torch.Tensor) -> torch.Tensor:
    """Positions counted over attended tokens only (0 on padding), exactly as `generate` computes them."""
    mask = attention_mask_BL.long()
    return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)


def accepts_logits_to_keep(model: torch.nn.Module) -> bool:
    """Whether model.forward (or, under PEFT, the base model's forward) takes `logits_to_keep`. A DDP / FSDP
    wrapper's forward takes (*args, **kwargs): the wrapped module (`.module`) is inspected instead."""
    return any("logits_to_keep" in params for params in _forward_parameters(model))


def _forward_parameters(model: torch.nn.Module) -> list[Any]:
    """The parameter names of the base model's forward (under PEFT, `get_base_model()`) and of the model's own, the
    DDP / FSDP wrapper (`.module`) looked through: wrappers take (*args, **kwargs) and name nothing."""
    model = getattr(model, "module", model)
    candidates = (getattr(model, "get_base_model", lambda: None)(), model)
    return [inspect.signature(c.forward).parameters for c in candidates if c is not None]


def cache_kwarg(model: torch.nn.Module) -> str | None:
    """The keyword under which model.forward (the base model's, under DDP / PEFT wrappers) takes a KV cache:
    `cache` from transformers 5.24, `past_key_values` before it (5.24 still accepts that name, with a deprecation
    warning, until 5.40); None when it takes neither."""
    return next((name for params in _forward_parameters(model) for name in ("cache", "past_key_values")
                 if name in params), None)


def returned_cache(out: Any) -> Any:
    """The KV cache a forward returned: `out.cache` from transformers 5.24, `out.past_key_values` before it."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values
