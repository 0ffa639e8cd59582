"""How this code calls a causal LM's forward, shared by the training forward (grpo/logprobs.py) and the decoding loop
(grpo/decode.py): position ids derived from the attention mask, and `logits_to_keep` where the model takes it.

    position_ids = cumsum(attention_mask) − 1, 0 on padding          (transformers `_prepare_position_ids_for_generation`)
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
    model = getattr(model, "module", model)
    for candidate in (model, getattr(model, "get_base_model", lambda: None)()):
        if candidate is not None and "logits_to_keep" in inspect.signature(candidate.forward).parameters:
            return True
    return False


def cache_kwarg(model: torch.nn.Module) -> str | None:
    """The keyword under which model.forward (the base model's, under DDP / PEFT wrappers) takes a KV cache:
    `cache` from transformers 5.24, `past_key_values` before it (5.24 still accepts that name, with a deprecation
    warning, until 5.40); None when it takes neither."""
    model = getattr(model, "module", model)
    for candidate in (getattr(model, "get_base_model", lambda: None)(), model):
        if candidate is not None:
            params = inspect.signature(candidate.forward).parameters
            for name in ("cache", "past_key_values"):
                if name in params:
                    return name
    return None


def returned_cache(out: Any) -> Any:
    """The KV cache a forward returned: `out.cache` from transformers 5.24, `out.past_key_values` before it."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values
