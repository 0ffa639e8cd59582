"""The graph engine (rollout.engine=graph): one decoding step of fixed shapes, with the sampler inside, compiled once
and, on CUDA, captured as a CUDA graph per rollout and replayed for every token.

    buffers    K_i, V_i (B, KVH, L, D) zeros, L = P̂ + N: the prompt padded on the left to P̂ (a multiple of
               PROMPT_BUCKET, so shapes repeat from step to step) and N = max_new_tokens columns for the completion;
               out_BN = pad; the step's column n = P̂ + t and t live in device tensors, not in Python
    prefill    the model's own forward over the distinct prompt rows (an RL batch repeats each prompt K times), copied
               into the buffers (row b from distinct row src_B[b]); its last logits start the loop
    step t     scores_BV = logits_BV in fp32, then, in generate's order: repetition penalty (seen_BV: prompt and
               completion tokens), min_new_tokens (stop ids at -inf while t < min_new_tokens), presence / frequency
               penalties (counts_BV: completion tokens), the sanitiser (NaN / ±Inf rows made finite, counted on the
               device), then with sampling the warpers temperature, top-k, top-p, min-p (transformers' own classes)
               next_B = inverse_cdf(softmax(scores_BV), U(key_b, t))     (grpo/models/sampling.py, per row)
                        argmax(scores_BV) when greedy
               next_B = pad on rows that stopped;  out[:, t] = next_B;  running_B &= next_B ∉ stop_ids
               logits_BV = the model on next_B at column n: per layer q, k, v from the layer's projections, rotary
                           at each row's position, K_i[:, :, n] = k and V_i[:, :, n] = v written in place, attention
                           over all L columns with the columns not yet written (and the prompt's padding) masked
    stop       every row stopped (read from the device every SYNC_EVERY steps on an accelerator, every step on the
               CPU, where a read costs nothing), or t = N − 1

Nothing in the step reads a value back to the host, allocates a shape that depends on the data, or branches in Python
on a tensor: it compiles as one graph (`torch.compile(fullgraph=True)`, tests/test_graph_decode.py checks with
`torch._dynamo.explain`) and, on CUDA, is captured once per rollout (`torch.cuda.CUDAGraph`) and replayed N times,
so a decoding step costs one graph launch instead of a Python-dispatched kernel launch per op. Stopped rows keep
running (masked), so the shapes never change within a rollout.

Sampling always goes through the batch-invariant sampler (one uniform per row and step from a counter-based hash):
with rollout.sampling_rng=per_completion the rows' keys are the run's; otherwise each row's key is drawn from the
torch RNG at the start of the call, so a seeded call is reproducible. The tokens are exact draws from the same
distributions as `generate`'s, and, for the same keys, the same tokens as `generate` with the seeded sampler (tests).

LoRA folded (rollout.fold_lora): a LoRA layer's update is added into a copy of its base weight for the rollout
(W + scale · B A, in fp32 then rounded once to the weight's dtype), so a projection is one matmul per token instead of
three; the copy is freed when the rollout ends. The log-probs the loss uses still come from the training forward
(grpo/models/logprobs.py), which runs the adapter as it is. What the fold changes in the sampled tokens' log-probs is
rounding: `python benchmarks/gpu_check.py` reports the largest difference (its figures: benchmarks/RESULTS.md).

Applies where the lean loop's fast steps apply (the Llama family with sdpa or eager attention: `graph_blocker`).
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from grpo.config import RolloutConfig
from grpo.models.model_calls import accepts_logits_to_keep, cache_kwarg, position_ids_from_mask, returned_cache
from grpo.models.decode import NAN_LOGIT, NEGINF_LOGIT, POSINF_LOGIT, check_keys
from grpo.models.modeling import base_model, generation_mode
from grpo.models.sampling import inverse_cdf_choice, warpers
from grpo.models.steppers import fast_steps_blocker
from grpo.models.tokens import left_pad

PROMPT_BUCKET = 64
"""Prompts are left-padded to a multiple of this many columns, so the buffers (and the compiled step) take one of a
few shapes over a run instead of a new one whenever the longest prompt changes. Padding is masked and positions come
from the mask: the tokens are the same."""

SYNC_EVERY = 16
"""On an accelerator, decoding steps between host reads of "does any row still run" (each read waits for the queue to
drain). At most SYNC_EVERY − 1 steps run after the last row stopped; they only write padding."""

NEGINF = float("-inf")

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The linear layers of a Llama-family decoder layer that the step calls (and folds, when they carry LoRA)."""

_ANNOUNCED: set[tuple] = set()


def sync_every(device: torch.device) -> int:
    """Decoding steps between host reads of "does any row still run": every step on the CPU (a read costs nothing
    there, and stopping at once saves steps), SYNC_EVERY on an accelerator."""
    return 1 if device.type == "cpu" else SYNC_EVERY


def graph_blocker(model: torch.nn.Module) -> str | None:
    """Why the graph engine cannot decode for `model` (None = it can)."""
    blocker = fast_steps_blocker(model)
    if blocker is not None:
        return blocker
    layer = base_model(model).model.layers[0]
    if not all(hasattr(layer.self_attn, p) for p in PROJECTIONS[:4]) or not all(
            hasattr(layer.mlp, p) for p in PROJECTIONS[4:]) or not hasattr(layer.mlp, "act_fn"):
        return "its decoder layers are not the gated-MLP Llama block the graph step replays"
    return None


SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                   "frequency_penalty", "min_new_tokens")
"""The rollout section's fields the step applies (each neutral value adds nothing, as in `generate`)."""


@dataclass(frozen=True, eq=False)
class StepSampling:
    """One call's sampling: the rollout section (its SAMPLING_FIELDS) and the call's own values."""

    rollout: RolloutConfig
    do_sample: bool
    """False = greedy (evaluation): the warpers do not apply."""
    stop_ids: tuple[int, ...]
    pad_id: int

    @property
    def key(self) -> tuple:
        """What the compiled step depends on (its cache key)."""
        return (self.do_sample, self.stop_ids, self.pad_id) + tuple(getattr(self.rollout, f) for f in SAMPLING_FIELDS)

    warps: list[Any] = field(init=False, repr=False)
    """Hugging Face's sampling warpers for these settings (none when greedy), built here, once: building them imports
    transformers, and an import inside the compiled step is a graph break (torch 2.11's dynamo refuses one of a lazy
    module, so the step was neither compiled whole nor captured)."""

    def __post_init__(self) -> None:
        r = self.rollout
        object.__setattr__(self, "warps", warpers(r.temperature, r.top_k, r.top_p, r.min_p) if self.do_sample else [])


def lora_fold(module: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(W + Σ_adapters scale · B A, bias) for a PEFT LoRA linear layer whose active adapters can be folded into its
    weight (plain LoRA on a plain nn.Linear, not merged, adapters enabled), computed in fp32 and rounded once to the
    weight's dtype; None for anything else (the step then calls the module itself)."""
    base = getattr(module, "base_layer", None)
    if base is None or type(base) is not torch.nn.Linear or not hasattr(module, "get_delta_weight"):
        return None
    if getattr(module, "merged", False) or getattr(module, "disable_adapters", False):
        return None
    active = [a for a in getattr(module, "active_adapters", ()) if a in getattr(module, "lora_A", {})]
    if not active or any(getattr(module, "use_dora", {}).get(a, False) for a in active) or any(
            getattr(module, "lora_bias", {}).get(a, False) for a in active):
        return None
    weight = base.weight.detach()
    folded = weight.float()
    for adapter in active:
        folded = folded + module.get_delta_weight(adapter).detach().float()
    return folded.to(weight.dtype), (None if base.bias is None else base.bias.detach())


FOLD_HEADROOM = 0.2
"""Share of the device's memory that must stay free after the folded copies are made (the KV buffers and the step's
workspace come after them)."""


def fold_fits(modules: Sequence[tuple[int, str, torch.nn.Module]]) -> bool:
    """Whether the folded copies of the LoRA layers among `modules` fit in the free device memory with FOLD_HEADROOM
    of the device left (always on the CPU). A no warns once, naming what it would take."""
    weights = [m.base_layer.weight for _, _, m in modules if getattr(m, "base_layer", None) is not None
               and hasattr(m, "lora_A")]
    if not weights or weights[0].device.type != "cuda":
        return True
    need = sum(w.numel() * w.element_size() for w in weights)
    free, total = torch.cuda.mem_get_info(weights[0].device)
    free += torch.cuda.memory_reserved(weights[0].device) - torch.cuda.memory_allocated(weights[0].device)  # cached
    if need <= free - FOLD_HEADROOM * total:
        return True
    key = ("fold", weights[0].device.index, need)
    if key not in _ANNOUNCED:
        _ANNOUNCED.add(key)
        warnings.warn(f"rollout.fold_lora: folding the LoRA layers for the rollout needs {need / 2**30:.1f} GiB, and "
                      f"{free / 2**30:.1f} GiB of {total / 2**30:.1f} are free; decoding with the adapters unfolded "
                      "(the same tokens up to rounding, slower). rollout.fold_lora=off silences this",
                      RuntimeWarning, stacklevel=3)
    return False


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


class GraphStep:
    """The decoding step of one model, as a function of (DecodeState) only: built once per model and reused by every
    rollout (its compiled form is cached by torch for the shapes it has seen)."""

    def __init__(self, model: torch.nn.Module):
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
        import sys

        base = base_model(model)
        self.model = model
        self.decoder, self.head = base.model, base.lm_head
        first = self.decoder.layers[0].self_attn
        modeling = sys.modules[type(first).__module__]
        self.rope = modeling.apply_rotary_pos_emb
        self.attention = ALL_ATTENTION_FUNCTIONS.get_interface(base.config._attn_implementation,
                                                               modeling.eager_attention_forward)
        self.sdpa = base.config._attn_implementation == "sdpa"
        self.plan: list[tuple[int, str, int | None]] = []  # (layer, projection, index into DecodeState.folded or None)
        self.compiled: dict[tuple, Callable] = {}
        self.uncompilable: set[tuple] = set()
        """The keys (`step_key`) whose compile or captured compiled step failed once: later rollouts take the eager
        step at once (a failed compile is tried again at every call of the compiled function, and fails again,
        tens of seconds a rollout on an H200 with torch 2.11)."""
        self.fold_auto: bool | None = None
        """What rollout.fold_lora=auto does for this model, decided once by the run (grpo/run/setup_parts.py:
        `lora_fold_choice`, from the memory estimate); None = not decided: fold where the copies fit."""

    def modules(self) -> list[tuple[int, str, torch.nn.Module]]:
        """(layer, projection, module) of every projection the step calls, in `plan` order."""
        return [(i, name, getattr(layer.self_attn if name in PROJECTIONS[:4] else layer.mlp, name))
                for i, layer in enumerate(self.decoder.layers) for name in PROJECTIONS]

    def fold(self, enabled: bool) -> list[torch.Tensor]:
        """The folded weights (and biases) this rollout's step reads; `self.plan` says which projection reads which.
        Empty when folding is off, nothing carries LoRA, or (on CUDA) the copies would not fit in the free memory
        with FOLD_HEADROOM to spare: the step then runs the adapters as they are (a warning says so, once)."""
        modules = self.modules()
        if enabled and not fold_fits(modules):
            enabled = False
        self.plan, tensors = [], []
        for i, name, module in modules:
            folded = lora_fold(module) if enabled else None
            if folded is None:
                self.plan.append((i, name, None))
            else:
                self.plan.append((i, name, len(tensors)))
                tensors.extend([folded[0]] + ([] if folded[1] is None else [folded[1]]))
        return tensors

    def _linear(self, layer_index: int, name: str, module: torch.nn.Module, x: torch.Tensor,
                folded: list[torch.Tensor]) -> torch.Tensor:
        slot = self.plan[layer_index * len(PROJECTIONS) + PROJECTIONS.index(name)][2] if self.plan else None
        if slot is None:
            return module(x)
        bias = module.base_layer.bias
        return F.linear(x, folded[slot], None if bias is None else folded[slot + 1])

    # -- the step, as pure tensor code over the state ------------------------------------------------------------

    def sample(self, s: DecodeState, sampling: StepSampling) -> None:
        """Draw step t's token from s.logits_BV into s.out_BN[:, t] and s.next_B; update the running rows and the
        penalty counts."""
        scores_BV = s.logits_BV.float()
        if s.seen_BV is not None:
            penalty = sampling.rollout.repetition_penalty
            penalised_BV = torch.where(scores_BV < 0, scores_BV * penalty, scores_BV / penalty)
            scores_BV = torch.where(s.seen_BV, penalised_BV, scores_BV)
        if sampling.rollout.min_new_tokens > 0:
            is_stop_V = torch.isin(torch.arange(scores_BV.shape[-1], device=scores_BV.device), s.stops)
            scores_BV = torch.where(is_stop_V & (s.t < sampling.rollout.min_new_tokens), NEGINF, scores_BV)
        if s.counts_BV is not None:
            scores_BV = (scores_BV - sampling.rollout.frequency_penalty * s.counts_BV
                         - sampling.rollout.presence_penalty * (s.counts_BV > 0).to(scores_BV.dtype))
        sum_B = scores_BV.sum(dim=-1)
        bad_B = torch.isnan(sum_B) | (sum_B == float("inf"))
        s.fixed.add_(bad_B.sum())
        fixed_BV = torch.nan_to_num(scores_BV, nan=NAN_LOGIT, posinf=POSINF_LOGIT, neginf=NEGINF_LOGIT)
        scores_BV = torch.where(bad_B[:, None], fixed_BV, scores_BV)
        if sampling.do_sample:
            for warp in sampling.warps:
                scores_BV = warp(None, scores_BV)
            next_B = inverse_cdf_choice(scores_BV, s.keys_B, s.t)
        else:
            next_B = torch.argmax(scores_BV, dim=-1)
        next_B = torch.where(s.running_B, next_B, sampling.pad_id)
        s.out_BN.index_copy_(1, s.t.view(1), next_B[:, None])
        s.running_B.logical_and_(~torch.isin(next_B, s.stops))
        s.next_B.copy_(next_B)
        if s.seen_BV is not None:
            s.seen_BV.scatter_(1, next_B[:, None], True)
        if s.counts_BV is not None:
            s.counts_BV.scatter_add_(1, next_B[:, None], torch.ones_like(s.counts_BV[:, :1]))

    def forward(self, s: DecodeState) -> None:
        """The model on s.next_B at column s.n: its keys / values written in place, s.logits_BV the next logits."""
        B = s.next_B.shape[0]
        h = self.decoder.embed_tokens(s.next_B[:, None])  # (B, 1, H)
        cos, sin = self.decoder.rotary_emb(h, position_ids=s.pos_B1)
        attend_B11L = (s.attend_BL & (s.cols_L <= s.n))[:, None, None, :]
        if self.sdpa:
            mask = attend_B11L
        else:
            mask = torch.where(attend_B11L, 0.0, torch.finfo(h.dtype).min).to(h.dtype)
        column = s.n.view(1)
        for i, layer in enumerate(self.decoder.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = self._linear(i, "q_proj", attn.q_proj, x, s.folded).view(B, 1, -1, attn.head_dim)
            k = self._linear(i, "k_proj", attn.k_proj, x, s.folded).view(B, 1, -1, attn.head_dim)
            v = self._linear(i, "v_proj", attn.v_proj, x, s.folded).view(B, 1, -1, attn.head_dim).transpose(1, 2)
            if hasattr(attn, "q_norm"):  # Qwen3: RMSNorm over each head's dimensions, before the rotation
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = self.rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
            s.K[i].index_copy_(2, column, k)
            s.V[i].index_copy_(2, column, v)
            out = self._attend(attn, q, s.K[i], s.V[i], mask)
            h = h + self._linear(i, "o_proj", attn.o_proj, out, s.folded)
            x = layer.post_attention_layernorm(h)
            mlp = layer.mlp
            gated = mlp.act_fn(self._linear(i, "gate_proj", mlp.gate_proj, x, s.folded)) * self._linear(
                i, "up_proj", mlp.up_proj, x, s.folded)
            h = h + self._linear(i, "down_proj", mlp.down_proj, gated, s.folded)
        s.logits_BV.copy_(self.head(self.decoder.norm(h))[:, -1])
        s.pos_B1.add_(1)
        s.n.add_(1)

    def _attend(self, attn: torch.nn.Module, q: torch.Tensor, K: torch.Tensor, V: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        """(B, 1, H·D) attention output of the one-token queries q (B, H, 1, D) over the buffers K, V (B, KVH, L, D).

        sdpa: the query heads of each key / value head are packed as its G = H / KVH query rows (transformers'
        `pack_gqa`, what its sdpa path does for one token outside a compile), so the buffers are read as they are;
        transformers' compiled path would copy them G times (`repeat_kv`: the whole KV cache per layer and step).
        eager: transformers' own function."""
        B, H, _, D = q.shape
        if not self.sdpa:
            out, _ = self.attention(attn, q, K, V, mask, dropout=0.0, scaling=attn.scaling)
            return out.reshape(B, 1, -1).contiguous()
        out = F.scaled_dot_product_attention(q.reshape(B, K.shape[1], H // K.shape[1], D), K, V, attn_mask=mask,
                                             dropout_p=0.0, scale=attn.scaling)  # (B, KVH, G, D): head kvh·G + g
        return out.reshape(B, 1, H * D)

    def step(self, s: DecodeState, sampling: StepSampling) -> None:
        """Sample token t, run the model on it, advance t: one replay of the graph."""
        self.sample(s, sampling)
        self.forward(s)
        s.t.add_(1)


def build_state(model: torch.nn.Module, ids_BP: torch.Tensor, mask_BP: torch.Tensor, keys_B: torch.Tensor,
                sampling: StepSampling, max_new_tokens: int, folded: list[torch.Tensor],
                distinct: tuple[list[int], list[int]] | None) -> DecodeState:
    """Prefill the prompts (each distinct one once) and lay out every buffer of the loop."""
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
    out = model(input_ids=pick(ids_BP), attention_mask=pick(prefill_mask),
                position_ids=pick(pos_BP), **{cache_kwarg(model) or "past_key_values": DynamicCache(config=model.config)},
                use_cache=True, **extra)
    cache = returned_cache(out)
    logits_BV = (out.logits[:, -1] if src_B is None else out.logits[src_B, -1]).clone()
    del out
    K, V = [], []
    for layer in cache.layers:
        keys, values = layer.keys, layer.values  # (U or B, KVH, P, D)
        # zeros, not empty: the attention multiplies the masked columns' values by a weight of 0, and 0 · NaN of
        # uninitialised memory would be NaN
        Kb = keys.new_zeros(B, keys.shape[1], L, keys.shape[-1])
        Vb = values.new_zeros(B, values.shape[1], L, values.shape[-1])
        Kb[:, :, :P], Vb[:, :, :P] = (keys, values) if src_B is None else (keys[src_B], values[src_B])
        K.append(Kb)
        V.append(Vb)
        layer.keys = layer.values = None  # one layer's prompt cache at a time on top of the buffers
        del keys, values
    V_size = logits_BV.shape[-1]
    attend_BL = torch.cat([mask_BP.bool(), torch.ones(B, max_new_tokens, dtype=torch.bool, device=device)], dim=1)
    seen_BV = None
    if sampling.rollout.repetition_penalty != 1.0:  # the prompt's real tokens count as seen (left padding does not)
        seen_BV = torch.zeros(B, V_size + 1, dtype=torch.bool, device=device)
        seen_BV.scatter_(1, torch.where(mask_BP.bool(), ids_BP.clamp(max=V_size), V_size), True)
        seen_BV = seen_BV[:, :V_size].contiguous()
    counts_BV = None
    if sampling.rollout.presence_penalty or sampling.rollout.frequency_penalty:
        counts_BV = torch.zeros(B, V_size, dtype=torch.float32, device=device)
    return DecodeState(K=K, V=V, attend_BL=attend_BL, cols_L=torch.arange(L, device=device), logits_BV=logits_BV,
                 next_B=torch.full((B,), sampling.pad_id, dtype=torch.long, device=device),
                 pos_B1=pos_BP[:, -1:] + 1, t=torch.zeros((), dtype=torch.long, device=device),
                 n=torch.full((), P, dtype=torch.long, device=device),
                 running_B=torch.ones(B, dtype=torch.bool, device=device), keys_B=keys_B.to(device),
                 out_BN=torch.full((B, max_new_tokens), sampling.pad_id, dtype=torch.long, device=device),
                 fixed=torch.zeros((), dtype=torch.long, device=device),
                 stops=torch.tensor(list(sampling.stop_ids), dtype=torch.long, device=device),
                 seen_BV=seen_BV, counts_BV=counts_BV, folded=folded)


def _announce(key: tuple, message: str) -> None:
    if key not in _ANNOUNCED:
        _ANNOUNCED.add(key)
        print(message, flush=True)


def step_key(graph: GraphStep, sampling: StepSampling, state: DecodeState) -> tuple:
    """What a compiled step depends on besides shapes: the sampling settings, the device, which projections read a
    folded weight."""
    return sampling.key, state.out_BN.device.type, tuple(slot is not None for _, _, slot in graph.plan)


def _compiled_step(graph: GraphStep, sampling: StepSampling, state: DecodeState, compile_step: bool) -> Callable[[DecodeState], None]:
    """The step for these settings: `torch.compile(fullgraph=True)` of GraphStep.step when `compile_step`, else the
    eager function."""
    if not compile_step:
        return lambda s: graph.step(s, sampling)
    key = step_key(graph, sampling, state)
    fn = graph.compiled.get(key)
    if fn is None:
        fn = torch.compile(lambda s: graph.step(s, sampling), fullgraph=True, dynamic=None)
        graph.compiled[key] = fn
    return fn


class Captured:
    """A CUDA graph of one step over `state`, captured after warm-up replays on a side stream (the compiled code
    allocates its workspace there). The state is as it was before, whether the capture succeeds or raises."""

    def __init__(self, fn: Callable[[DecodeState], None], state: DecodeState, warmup: int = 2):
        self.graph = torch.cuda.CUDAGraph()
        # what the warm-up steps change and the first real step reads; the KV buffers need no copy (a step writes its
        # column before it attends to it, and the columns after it are masked)
        mutable = [x for x in (state.logits_BV, state.next_B, state.pos_B1, state.t, state.n, state.running_B,
                               state.out_BN, state.fixed, state.seen_BV, state.counts_BV) if x is not None]
        snapshot = [x.clone() for x in mutable]
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(warmup):
                    fn(state)
            torch.cuda.current_stream().wait_stream(stream)
            with torch.cuda.graph(self.graph):
                fn(state)
        finally:
            for x, saved in zip(mutable, snapshot):  # the warm-up steps ran (a capture runs nothing): undo them
                x.copy_(saved)

    def __call__(self, state: DecodeState) -> None:
        self.graph.replay()


def _warn_once(key: tuple, message: str) -> None:
    if key not in _ANNOUNCED:
        _ANNOUNCED.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def ready_step(graph: GraphStep, sampling: StepSampling, state: DecodeState, compile_step: bool,
               capture: bool) -> Callable[[DecodeState], None]:
    """The step to replay: compiled and captured (CUDA), compiled, or eager. What fails falls back to the next
    (compiled → eager, captured → uncaptured), with a warning naming the error once: the same tokens either way (the
    compiled step equals the eager one to rounding), only slower."""
    eager = _compiled_step(graph, sampling, state, False)
    fn = eager
    key = step_key(graph, sampling, state)
    if compile_step and key not in graph.uncompilable:
        fn = _compiled_step(graph, sampling, state, True)
        if not capture:  # a compile error shows at the first call: try it on a copy of the state
            try:
                fn(dataclasses.replace(state, **{f: _clone(getattr(state, f)) for f in MUTABLE_FIELDS}))
            except Exception as err:  # noqa: BLE001 - no compiler, an unsupported op...: the eager step
                _warn_once(("compile", type(err).__name__), f"rollout.engine=graph: compiling the decoding step "
                           f"failed ({type(err).__name__}: {str(err)[:300]}); decoding with the eager step")
                graph.uncompilable.add(key)
                fn = eager
    if not capture:
        return fn
    for candidate in ([fn, eager] if fn is not eager else [eager]):
        try:
            return Captured(candidate, state)
        except Exception as err:  # noqa: BLE001 - a capture failure: the next candidate, then no graph
            what = "compiled" if candidate is not eager else "eager"
            if candidate is not eager:
                graph.uncompilable.add(key)
            _warn_once(("capture", what, type(err).__name__),
                       f"rollout.engine=graph: capturing the {what} decoding step as a CUDA graph failed "
                       f"({type(err).__name__}: {str(err)[:300]}); trying without")
    return eager


MUTABLE_FIELDS = ("K", "V", "logits_BV", "next_B", "pos_B1", "t", "n", "running_B", "out_BN", "fixed", "seen_BV",
                  "counts_BV")
"""The DecodeState fields a step writes."""


def _clone(x: Any) -> Any:
    if x is None:
        return None
    return [t.clone() for t in x] if isinstance(x, list) else x.clone()


def decode_graph(model: torch.nn.Module, rows: Sequence[Sequence[int]], rollout: RolloutConfig,
                 stop_ids: Sequence[int], pad_id: int, *, greedy: bool = False, row_keys: Sequence[int] | None = None,
                 compile_step: bool | None = None, capture: bool | None = None,
                 graph: GraphStep | None = None) -> tuple[list[list[int]], torch.Tensor]:
    """The graph engine: the new ids of each of `rows` (token ids, unpadded; at most rollout.max_new_tokens each,
    rows that stopped padded after their stop token) and the sanitiser's count of fixed logit rows (a device tensor).
    Prompts are padded to PROMPT_BUCKET and each distinct one prefilled once; the rows' sampler keys are `row_keys`
    or drawn from the torch RNG (`greedy`: argmax). `compile_step` / `capture` default to on for CUDA (compiled,
    then captured) and off on the CPU (the eager step; the same function). rollout.fold_lora: see `GraphStep.fold`."""
    max_new_tokens = rollout.max_new_tokens
    if max_new_tokens < 1:
        raise ValueError(f"decode_graph: max_new_tokens={max_new_tokens}; use at least 1")
    ids_BP, mask_BP = left_pad(rows, pad_id, multiple_of=PROMPT_BUCKET)
    sampling = StepSampling(rollout, do_sample=not greedy, stop_ids=tuple(int(i) for i in stop_ids), pad_id=int(pad_id))
    if greedy:
        keys_B = torch.zeros(len(rows), dtype=torch.int64)
    elif row_keys is not None:
        check_keys(row_keys, rows)
        keys_B = torch.tensor(list(row_keys), dtype=torch.int64)
    else:
        keys_B = row_keys_from_rng(len(rows))
    device = next(model.parameters()).device
    cuda = device.type == "cuda"
    compile_step = cuda if compile_step is None else compile_step
    capture = cuda if capture is None else capture and cuda
    graph = graph or graph_step_for(model)
    with generation_mode(model), torch.no_grad():
        folded = graph.fold(rollout.fold_lora == "on" or (rollout.fold_lora == "auto" and graph.fold_auto is not False))
        state = build_state(model, ids_BP.to(device), mask_BP.to(device), keys_B, sampling, max_new_tokens, folded,
                            distinct_lists(rows))
        B, L = state.attend_BL.shape
        started = time.perf_counter()
        step = ready_step(graph, sampling, state, compile_step, capture)
        compiled = compile_step and step_key(graph, sampling, state) not in graph.uncompilable  # what it fell back to
        captured = isinstance(step, Captured)
        every = sync_every(device)
        steps_run = max_new_tokens
        for t in range(max_new_tokens - 1):
            step(state)  # the token of step t is drawn in here (GraphStep.sample), the next logits computed
            if t == 0 and (compile_step or capture):
                if cuda:
                    torch.cuda.synchronize(device)
                _announce((B, L, device.type, compiled, captured),
                          f"graph engine: decoding step for {B} rows x {L} columns ready in "
                          f"{time.perf_counter() - started:.1f} s (compiled: {compiled}, CUDA graph: {captured}); "
                          "later rollouts of this shape reuse it")
            if (t + 1) % every == 0 and not bool(state.running_B.any()):  # a host read: see SYNC_EVERY
                steps_run = t + 1
                break
        else:
            graph.sample(state, sampling)  # the last token: nothing is run on it
    return state.out_BN[:, :steps_run].tolist(), state.fixed


_GRAPHS: "dict[int, GraphStep]" = {}


def graph_step_for(model: torch.nn.Module) -> GraphStep:
    """The GraphStep of `model` (one per model object, so its compiled steps are reused across rollouts)."""
    import weakref

    key = id(model)
    graph = _GRAPHS.get(key)
    if graph is None or graph.model is not model:
        graph = GraphStep(model)
        _GRAPHS[key] = graph
        weakref.finalize(model, _GRAPHS.pop, key, None)
    return graph


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


def row_keys_from_rng(B: int) -> torch.Tensor:
    """One sampler key per row drawn from the torch RNG (seed it around the call): what the graph engine samples
    with when the run gives no per-completion keys."""
    return torch.randint(0, 2 ** 62, (B,), dtype=torch.int64)
