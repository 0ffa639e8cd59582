"""The lean loop's one-token forwards (grpo/decoding/decode.py): what runs the model once per sampled token, from that
token to the next one's logits.

    WholeForward  model(next_R1, step mask, positions, DynamicCache): transformers' whole forward, for any model
    LayerForward  the same layers called one by one, for the Llama family (LAYER_FORWARD_ARCHITECTURES):
                 h = embed(next_R1);  cos, sin = rotary(h, pos_R1)
                 per layer:  x = input_norm(h)
                             q, k, v = q_proj(x), k_proj(x), v_proj(x)  (Qwen3: q_norm / k_norm per head)
                             q, k = rope(q, k, cos, sin);  K[:, :, n] = k;  V[:, :, n] = v     (buffers, in place)
                             h = h + o_proj(attention(q, K[:, :, :n+1], V[:, :, :n+1], mask[..., :n+1]))
                             h = h + mlp(post_attention_norm(h))
                 logits = lm_head(norm(h))

LayerForward calls the model's own modules (so LoRA layers, quantised linears and patched norms / MLPs run as they
would) and transformers' own attention function and rotary embedding; what it leaves out is the forward's
bookkeeping around them: the 4D mask built per forward, the output-capturing hooks, the config-default merging, the
Cache object, and the KV cache grown by concatenation (a copy of the whole cache per layer per step). Its KV cache is
two buffers per layer of the final length, written in place. On the CPU its logits equal the whole forward's bit for
bit (tests/test_steppers.py: Llama, Mistral, Qwen2, Qwen3, with LoRA, sdpa and eager, with and without padding).
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from grpo.models.model_calls import cache_kwarg, returned_cache
from grpo.models.modeling import base_model, has_sliding_window

LAYER_FORWARD_ARCHITECTURES = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                                         "Qwen3ForCausalLM"})
"""Causal LMs whose decoder layer is exactly the pre-norm block LayerForward replays (read from transformers' modeling
files: same attention, rotary, residuals and final norm; Qwen3 adds per-head q/k norms, which LayerForward applies).
Any other model decodes with WholeForward."""

LAYER_FORWARD_ATTENTION = ("sdpa", "eager")
"""Attention kernels whose masks LayerForward builds itself (boolean for sdpa, additive for eager, as transformers'
`sdpa_mask` / `eager_mask` build them). Flash and flex take other mask forms: WholeForward."""


def layer_forward_blocker(model: torch.nn.Module) -> str | None:
    """Why LayerForward cannot decode for `model` (None = it can, with the same logits as the model's forward)."""
    base = base_model(model)
    name = type(base).__name__
    if name not in LAYER_FORWARD_ARCHITECTURES or not type(base).__module__.startswith("transformers.models."):
        return (f"{name} is not one of the architectures the layer-by-layer forward replays "
                f"({sorted(LAYER_FORWARD_ARCHITECTURES)})")
    attn = getattr(base.config, "_attn_implementation", None)
    if attn not in LAYER_FORWARD_ATTENTION:
        return f"attention implementation {attn!r} (the layer-by-layer forward builds sdpa / eager masks only)"
    if has_sliding_window(base.config):
        return "sliding-window attention layers"
    if getattr(base, "use_kernels", False):
        return "hub kernels replace some of the model's functions (use_kernels=True)"
    if getattr(base.config, "num_hidden_layers", None) != len(base.model.layers):
        return "the model runs fewer layers than it holds"
    if any(hasattr(m, "_hf_hook") for m in base.modules()):
        return "accelerate hooks (device_map / offloading) that move tensors around the model's own forward calls"
    return None


class WholeForward:
    """One token a call through the model's whole forward with its DynamicCache (any decoder-only model).

    transformers rebuilds a 4D mask from the 2D padding mask on every forward (`create_causal_mask`; its cost on the
    CPU: benchmarks/NOTES.md, the lean decoding loop's row); a one-token query may attend to every cached column that
    is not padding, so the 4D mask is just the padding mask with a column appended per step. It is built here once
    and handed over as 4D, which transformers passes through as is: boolean (True = attend) for sdpa, additive
    (0 / dtype min) for eager. Other attention kernels (flash, flex), and models with sliding-window layers (whose
    masks and caches stop at the window), get the 2D mask as `generate` gives it, and transformers builds theirs. No
    mask at all when nothing is padding (`generate` then drops it too)."""

    def __init__(self, model: torch.nn.Module, cache: Any, mask_BP: torch.Tensor, dtype: torch.dtype,
                 rows_B: torch.Tensor | None = None):
        if rows_B is not None:  # a prefill of distinct rows: row b of the batch is the cache's row rows_B[b]
            for layer in cache.layers:
                layer.batch_select_indices(rows_B)
        self.model, self.cache, self.cache_arg = model, cache, cache_kwarg(model) or "past_key_values"
        attn_implementation = getattr(model.config, "_attn_implementation", None)
        plain = attn_implementation in LAYER_FORWARD_ATTENTION and not has_sliding_window(model.config)
        self.kind = attn_implementation if plain else "2d"
        self.mask: torch.Tensor | None = None
        if not bool(mask_BP.all()):
            keep = mask_BP.bool()
            if self.kind == "sdpa":
                self.mask = keep[:, None, None, :]
            elif self.kind == "eager":
                zeros = torch.zeros((), dtype=dtype, device=keep.device)
                self.mask = torch.where(keep, zeros, torch.finfo(dtype).min)[:, None, None, :]
            else:
                self.mask = mask_BP.long()

    def __call__(self, next_R1: torch.Tensor, pos_R1: torch.Tensor) -> torch.Tensor:
        """Logits (R, V) of the token after `next_R1`, which sits at positions `pos_R1`."""
        if self.mask is not None:
            attend = True if self.kind == "sdpa" else 0.0 if self.kind == "eager" else 1
            self.mask = torch.cat([self.mask, self.mask.new_full((*self.mask.shape[:-1], 1), attend)], dim=-1)
        out = self.model(input_ids=next_R1, attention_mask=self.mask, position_ids=pos_R1,
                         **{self.cache_arg: self.cache}, use_cache=True)
        self.cache = returned_cache(out)
        return out.logits[:, -1]

    def select(self, keep_R: torch.Tensor) -> None:
        """Keep rows `keep_R` only (the KV cache in place)."""
        for layer in self.cache.layers:
            layer.batch_select_indices(keep_R)
        if self.mask is not None:
            self.mask = self.mask[keep_R]


class LayerForward:
    """One token a call through the Llama family's layers, one by one, over in-place KV buffers (see the module
    docstring).

    Built from the prefill's DynamicCache, which it empties: its keys / values are moved into buffers of
    P + `new_columns`
    columns, layer by layer (row b from the cache's row `rows_B[b]` when given), and every later step writes its
    column in place."""

    def __init__(self, model: torch.nn.Module, cache: Any, mask_BP: torch.Tensor, dtype: torch.dtype, new_columns: int,
                 rows_B: torch.Tensor | None = None):
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        base = base_model(model)
        self.decoder, self.head = base.model, base.lm_head
        first = self.decoder.layers[0].self_attn
        modeling = sys.modules[type(first).__module__]
        self.rope = modeling.apply_rotary_pos_emb  # the function the model's own attention calls
        self.attention = ALL_ATTENTION_FUNCTIONS.get_interface(base.config._attn_implementation,
                                                               modeling.eager_attention_forward)
        B, P = mask_BP.shape
        self.n = P  # the column the next step writes
        self.K, self.V = [], []
        for layer in cache.layers:
            keys, values = layer.keys, layer.values  # (B, KVH, P, D)
            K = keys.new_empty(B, keys.shape[1], P + new_columns, keys.shape[-1])
            V = values.new_empty(B, values.shape[1], P + new_columns, values.shape[-1])
            K[:, :, :P], V[:, :, :P] = (keys, values) if rows_B is None else (keys[rows_B], values[rows_B])
            self.K.append(K)
            self.V.append(V)
            # the prefill cache is emptied as it is copied, so the copy holds one layer's prompt keys and values at
            # a time on top of the buffers, not the whole prompt cache
            layer.keys = layer.values = None
            del keys, values
        self.mask: torch.Tensor | None = None  # (B, 1, 1, P + new_columns), sliced to the columns written
        if not bool(mask_BP.all()):
            keep = torch.cat([mask_BP.bool(), mask_BP.new_ones(B, new_columns, dtype=torch.bool)], dim=-1)
            if base.config._attn_implementation == "sdpa":
                self.mask = keep[:, None, None, :]
            else:
                zeros = torch.zeros((), dtype=dtype, device=keep.device)
                self.mask = torch.where(keep, zeros, torch.finfo(dtype).min)[:, None, None, :]

    def __call__(self, next_R1: torch.Tensor, pos_R1: torch.Tensor) -> torch.Tensor:
        """Logits (R, V) of the token after `next_R1`, which sits at positions `pos_R1`."""
        n = self.n
        R = next_R1.shape[0]
        h = self.decoder.embed_tokens(next_R1)  # (R, 1, H)
        cos, sin = self.decoder.rotary_emb(h, position_ids=pos_R1)
        mask = None if self.mask is None else self.mask[..., :n + 1]
        for i, layer in enumerate(self.decoder.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = attn.q_proj(x).view(R, 1, -1, attn.head_dim)
            k = attn.k_proj(x).view(R, 1, -1, attn.head_dim)
            v = attn.v_proj(x).view(R, 1, -1, attn.head_dim).transpose(1, 2)
            if hasattr(attn, "q_norm"):  # Qwen3: RMSNorm over each head's dimensions, before the rotation
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = self.rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
            self.K[i][:, :, n:n + 1] = k
            self.V[i][:, :, n:n + 1] = v
            out, _ = self.attention(attn, q, self.K[i][:, :, :n + 1], self.V[i][:, :, :n + 1], mask, dropout=0.0,
                                    scaling=attn.scaling)
            h = h + attn.o_proj(out.reshape(R, 1, -1).contiguous())
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        self.n = n + 1
        return self.head(self.decoder.norm(h))[:, -1]

    def select(self, keep_R: torch.Tensor) -> None:
        """Keep rows `keep_R` only."""
        self.K = [K[keep_R] for K in self.K]
        self.V = [V[keep_R] for V in self.V]
        if self.mask is not None:
            self.mask = self.mask[keep_R]


def token_forward(model: torch.nn.Module, cache: Any, mask_BP: torch.Tensor, dtype: torch.dtype, new_columns: int,
                  layer_by_layer: bool = True, rows_B: torch.Tensor | None = None) -> WholeForward | LayerForward:
    """LayerForward where `layer_forward_blocker` allows it and `layer_by_layer` is on, else WholeForward. `cache` is
    the prefill's DynamicCache, `new_columns` the most one-token forwards that will follow; `rows_B`: the cache holds
    distinct rows only, batch row b is its row rows_B[b] (grpo/decoding/decode.py `distinct_rows`)."""
    if layer_by_layer and layer_forward_blocker(model) is None:
        return LayerForward(model, cache, mask_BP, dtype, new_columns, rows_B)
    return WholeForward(model, cache, mask_BP, dtype, rows_B)
