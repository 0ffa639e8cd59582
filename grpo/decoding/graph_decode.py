"""The graph engine (rollout.engine=graph): one decoding step of fixed shapes, with the sampler inside, compiled once
and, on CUDA, captured as a CUDA graph once per shape of the rollout and replayed for every token.

    buffers    K_i, V_i (B, KVH, L, D) zeros, L = P̂ + N: the prompt padded on the left to P̂ (a multiple of
               PROMPT_BUCKET, so shapes repeat from step to step) and N = max_new_tokens columns for the completion;
               out_BN = pad; the step's column n = P̂ + t and t live in device tensors, not in Python
               (grpo/decoding/graph_state.py)
    prefill    the model's own forward over the distinct prompt rows (an RL batch repeats each prompt K times), copied
               into the buffers (row b from distinct row src_B[b]); its last logits start the loop
    step t     next_B = next_token(logits_BV in fp32, t)   (grpo/decoding/next_token.py, the one sampler every engine
                        calls: the penalties over seen_BV / counts_BV, the sanitiser counting its rows on the device,
                        the warps, the exponential race over each row's key, or argmax when greedy)
               next_B = pad on rows that stopped;  out[:, t] = next_B;  running_B &= next_B ∉ stop_ids
               logits_BV = the model on next_B at column n: per layer q, k, v from the layer's projections, rotary
                           at each row's position, K_i[:, :, n] = k and V_i[:, :, n] = v written in place, attention
                           over all L columns with the columns not yet written (and the prompt's padding) masked
    stop       every row stopped (read from the device every SYNC_EVERY steps on an accelerator, every step on the
               CPU, where a read costs nothing), or t = N − 1

Nothing in the step reads a value back to the host, allocates a shape that depends on the data, or branches in Python
on a tensor: it compiles as one graph (`torch.compile(fullgraph=True)`, tests/test_graph_decode.py checks with
`torch._dynamo.explain`) and, on CUDA, is captured (`torch.cuda.CUDAGraph`, grpo/decoding/graph_capture.py) and
replayed N times, so a decoding step costs one graph launch instead of a Python-dispatched kernel launch per op.
Stopped rows keep running (masked), so the shapes never change within a rollout.

Once per shape, not per rollout: a sampled rollout's buffers and captured step form a slot (`Slot`), kept per
(settings, rows, prompt bucket) by the model's `GraphStep`; the next rollout of that shape writes its prompts and keys
into the slot's buffers and replays. Compiles are per settings, on a small stand-in whose rows and columns are dynamic
(one graph for every shape; torch keeps the stand-in, not a rollout's buffers), captures per slot; both are counted
(`GraphStep.counts`, the run's rollout/graph_* metrics). The slots kept between rollouts are bounded
(`GraphStep.keep_bytes`: on a GPU what the step's peak phase leaves free, from the memory estimate; a CUDA
out-of-memory error in the update frees them); greedy calls (evaluation batches, many shapes) keep none.

Sampling always goes through the batch-invariant sampler (counter-based uniforms per row, step and token): with
rollout.sampling_rng=per_completion the rows' keys are the run's; otherwise each row's key is drawn from the torch RNG
at the start of the call, so a seeded call is reproducible. The tokens are exact draws from the same distributions as
`generate`'s, and, for the same keys, the same tokens as `generate` through the one sampler and as the lean loop
(tests).

LoRA folded (rollout.fold_lora): a LoRA layer's update is added into a copy of its base weight for the rollout
(W + scale · B A, in fp32 then rounded once to the weight's dtype), so a projection is one matmul per token instead of
three; the copy is freed when the rollout ends (the update gets the memory back), so a kept slot that reads it is
captured again at its next rollout (no warm-up, no compile). The log-probs the loss uses still come from the training
forward (grpo/models/logprobs.py), which runs the adapter as it is. What the fold changes in the sampled tokens'
log-probs is rounding: `python -m benchmarks.gpu_check` reports the largest difference (its figures:
benchmarks/RESULTS.md).

Applies where the lean loop's layer-by-layer forward applies (the Llama family with sdpa or eager attention:
`graph_blocker`).
"""

from __future__ import annotations

import itertools
import time
import warnings
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from grpo.config import RolloutConfig
from grpo.decoding.decode import check_keys
from grpo.decoding.graph_capture import Captured, counting_backend
from grpo.decoding.graph_state import (
    MUTABLE_FIELDS,
    DecodeState,
    build_state,
    distinct_lists,
    state_bytes,
    tracer_state,
)
from grpo.decoding.next_token import StepSampling, next_token, remember
from grpo.decoding.token_forward import layer_forward_blocker
from grpo.models.modeling import base_model, generation_mode
from grpo.models.tokens import left_pad

PROMPT_BUCKET = 64
"""Prompts are left-padded to a multiple of this many columns, so the buffers (and the compiled step) take one of a
few shapes over a run instead of a new one whenever the longest prompt changes. Padding is masked and positions come
from the mask: the tokens are the same."""

SYNC_EVERY = 16
"""On an accelerator, decoding steps between host reads of "does any row still run" (each read waits for the queue to
drain). At most SYNC_EVERY − 1 steps run after the last row stopped; they only write padding."""

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The linear layers of a Llama-family decoder layer that the step calls (and folds, when they carry LoRA)."""

_ANNOUNCED: set[tuple] = set()


def sync_every(device: torch.device) -> int:
    """Decoding steps between host reads of "does any row still run": every step on the CPU (a read costs nothing
    there, and stopping at once saves steps), SYNC_EVERY on an accelerator."""
    return 1 if device.type == "cpu" else SYNC_EVERY


def graph_blocker(model: torch.nn.Module) -> str | None:
    """Why the graph engine cannot decode for `model` (None = it can)."""
    blocker = layer_forward_blocker(model)
    if blocker is not None:
        return blocker
    layer = base_model(model).model.layers[0]
    if not all(hasattr(layer.self_attn, p) for p in PROJECTIONS[:4]) or not all(
            hasattr(layer.mlp, p) for p in PROJECTIONS[4:]) or not hasattr(layer.mlp, "act_fn"):
        return "its decoder layers are not the gated-MLP Llama block the graph step replays"
    return None


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


GRAPH_CACHE_SLOTS = 2
"""Without a bound from the run (`GraphStep.keep_bytes`), the kept slots hold at most this many times the largest
slot's bytes: two prompt buckets that alternate keep both, a run whose prompts spread over many buckets captures
again (its compiles stay cached) instead of holding a slot per bucket."""


@dataclass
class Slot:
    """One shape's decoding buffers and its readied step (compiled and, on CUDA, captured), kept across rollouts."""

    key: tuple
    """(step_key, rows, prompt columns, new tokens)."""
    weights: tuple[int, ...]
    """`GraphStep.weight_addresses()` when the slot was made."""
    state: DecodeState | None = None
    step: Callable[[DecodeState], None] | None = None


class GraphStep:
    """The decoding step of one model, as a function of (DecodeState) only, built once per model and reused by every
    rollout: its compiled forms (one per settings), its kept slots (one per shape) and what it did (`counts`)."""

    def __init__(self, model: torch.nn.Module):
        import sys

        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

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
        self.backend = "inductor"
        """The torch.compile backend (tests count compiles with "eager", which compiles nothing)."""
        self.counts: Counter = Counter()
        """compiles (graphs torch compiled), captures (a new slot's CUDA graph), recaptures (a kept slot's, again:
        the folded weights it reads were made anew), fallbacks (a compile or capture that failed): running totals
        over the run (`graph_counts`; the rollout/graph_* metrics are their steps' differences)."""
        self.slots: OrderedDict[tuple, Slot] = OrderedDict()
        """The kept slots, least recently used first, within `keep_bytes` (`trim`)."""
        self.keep_bytes: int | None = None
        """How many bytes of slots stay between rollouts, decided once by the run on a GPU
        (grpo/run/assembly/model_loading.py: `choose_graph_memory`, from the memory estimate: what the step's peak
        phase leaves free); None = at most GRAPH_CACHE_SLOTS times the largest slot."""
        self._pool: Any = None
        self.uncompilable: set[tuple] = set()
        """The keys (`step_key`) whose compile or captured compiled step failed once: later rollouts take the eager
        step at once (a failed compile is tried again at every call of the compiled function, and fails again,
        tens of seconds a rollout on an H200 with torch 2.11)."""
        self.fold_auto: bool | None = None
        """What rollout.fold_lora=auto does for this model, decided once by the run (grpo/run/assembly/model_loading.py:
        `choose_graph_memory`, from the memory estimate); None = not decided: fold where the copies fit."""

    def modules(self) -> list[tuple[int, str, torch.nn.Module]]:
        """(layer, projection, module) of every projection the step calls, in `plan` order."""
        return [(i, name, getattr(layer.self_attn if name in PROJECTIONS[:4] else layer.mlp, name))
                for i, layer in enumerate(self.decoder.layers) for name in PROJECTIONS]

    def fold(self, enabled: bool) -> list[torch.Tensor]:
        """The folded weights (and biases) this rollout's step reads, made from the current adapters; `self.plan`
        says which projection reads which. Empty when folding is off, nothing carries LoRA, or (on CUDA) the copies
        would not fit in the free memory with FOLD_HEADROOM to spare: the step then runs the adapters as they are (a
        warning says so, once). The copies live for the rollout only (the update phase gets their memory back), so
        a kept slot whose step reads them is captured again at the next rollout (`decode_graph`)."""
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

    def weight_addresses(self) -> tuple[int, ...]:
        """Where every parameter and buffer of the model lies: a captured step reads them there, so a slot captured
        before any of them moved (the model was cast, moved or reloaded) is laid out and captured again."""
        return tuple(t.data_ptr() for t in itertools.chain(self.model.parameters(), self.model.buffers()))

    def slot(self, sampling: StepSampling, rows: int, prompt_cols: int, new_tokens: int, device_type: str,
             keep: bool) -> Slot:
        """The slot for a call of this shape and these settings: the kept one (`keep`) if it exists and the model's
        tensors have not moved, else a new, empty one (kept when `keep`, evicting the least recently used slots past
        GRAPH_CACHE_SLOTS times the largest one's bytes once it is filled: `trim`)."""
        key = (step_key(self, sampling, device_type), rows, prompt_cols, new_tokens)
        addresses = self.weight_addresses()
        found = self.slots.get(key) if keep else None
        if found is not None and found.weights == addresses:
            self.slots.move_to_end(key)
            return found
        made = Slot(key=key, weights=addresses)
        if keep:
            self.slots[key] = made
        return made

    def trim(self, reserve: Slot | None = None) -> None:
        """Drop least recently used slots while the kept ones hold more than the bound: `keep_bytes` when the run
        set one, else GRAPH_CACHE_SLOTS times the largest slot. `reserve`: the slot of the rollout about to run, kept
        whatever its size (the others make room for it); without one, a slot larger than the bound goes too."""
        sizes = {key: state_bytes(slot.state) for key, slot in self.slots.items() if slot.state is not None}
        bound = self.keep_bytes if self.keep_bytes is not None else GRAPH_CACHE_SLOTS * max(sizes.values(), default=0)
        if reserve is not None:
            bound = max(bound, sizes.get(reserve.key, 0))
        for key in list(self.slots):
            if sum(sizes.values()) <= bound:
                break
            if reserve is None or key != reserve.key:
                del self.slots[key]
                sizes.pop(key, None)

    def release(self) -> int:
        """Drop every kept slot (their buffers and captured steps); the bytes of buffers freed."""
        freed = sum(state_bytes(slot.state) for slot in self.slots.values() if slot.state is not None)
        self.slots.clear()
        return freed

    def pool(self) -> Any:
        """The memory pool every CUDA graph of this engine is captured into (grpo/decoding/graph_capture.py)."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        return self._pool

    def _linear(self, layer_index: int, name: str, module: torch.nn.Module, x: torch.Tensor,
                folded: list[torch.Tensor]) -> torch.Tensor:
        slot = self.plan[layer_index * len(PROJECTIONS) + PROJECTIONS.index(name)][2] if self.plan else None
        if slot is None:
            return module(x)
        bias = module.base_layer.bias
        return F.linear(x, folded[slot], None if bias is None else folded[slot + 1])

    # -- the step, as pure tensor code over the state ------------------------------------------------------------

    def sample(self, s: DecodeState, sampling: StepSampling) -> None:
        """Draw step t's token from s.logits_BV with the one sampler (grpo/decoding/next_token.py `next_token`) into
        s.out_BN[:, t] and s.next_B; update the running rows and the penalties' history."""
        next_B = next_token(s.logits_BV.float(), sampling, s.t, stops_S=s.stops, keys_B=s.keys_B, seen_BV=s.seen_BV,
                            counts_BV=s.counts_BV, fixed=s.fixed)
        next_B = torch.where(s.running_B, next_B, sampling.pad_id)
        s.out_BN.index_copy_(1, s.t.view(1), next_B[:, None])
        s.running_B.logical_and_(~torch.isin(next_B, s.stops))
        s.next_B.copy_(next_B)
        remember(next_B, s.seen_BV, s.counts_BV)

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


def _announce(key: tuple, message: str) -> None:
    if key not in _ANNOUNCED:
        _ANNOUNCED.add(key)
        print(message, flush=True)


def step_key(graph: GraphStep, sampling: StepSampling, device_type: str) -> tuple:
    """What a compiled step depends on besides shapes: the sampling settings, the device, which projections read a
    folded weight."""
    return sampling.key, device_type, tuple(slot is not None for _, _, slot in graph.plan)


def _compiled_step(graph: GraphStep, sampling: StepSampling, state: DecodeState,
                   compile_step: bool) -> Callable[[DecodeState], None]:
    """The step for these settings: `torch.compile(fullgraph=True)` of GraphStep.step when `compile_step`, else the
    eager function. One compiled function per settings (`step_key`), compiled when it is made, on a small stand-in for
    `state` whose rows and columns are dynamic (`tracer_state`): one graph serves every shape, and torch keeps the
    stand-in, not a rollout's buffers. A compile error is raised here. Each compile is counted
    (`GraphStep.counts["compiles"]`)."""
    if not compile_step:
        return lambda s: graph.step(s, sampling)
    key = step_key(graph, sampling, state.out_BN.device.type)
    fn = graph.compiled.get(key)
    if fn is None:
        fn = torch.compile(lambda s: graph.step(s, sampling), fullgraph=True,
                           backend=counting_backend(graph.backend, graph.counts))
        fn(tracer_state(state))
        graph.compiled[key] = fn
    return fn


def _warn_once(key: tuple, message: str) -> None:
    if key not in _ANNOUNCED:
        _ANNOUNCED.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def ready_step(graph: GraphStep, sampling: StepSampling, state: DecodeState, compile_step: bool,
               capture: bool, recapture: bool = False) -> Callable[[DecodeState], None]:
    """The step to replay: compiled and captured (CUDA), compiled, or eager. What fails falls back to the next
    (compiled → eager, captured → uncaptured), with a warning naming the error once and a count
    (`GraphStep.counts["fallbacks"]`): the same tokens either way (the compiled step equals the eager one to
    rounding), only slower. `recapture`: this state's step was captured before (no warm-up; counted apart)."""
    eager = _compiled_step(graph, sampling, state, False)
    fn = eager
    key = step_key(graph, sampling, state.out_BN.device.type)
    if compile_step and key not in graph.uncompilable:
        try:
            fn = _compiled_step(graph, sampling, state, True)
        except Exception as err:  # noqa: BLE001 - no compiler, an unsupported op...: the eager step
            _warn_once(("compile", type(err).__name__), f"rollout.engine=graph: compiling the decoding step "
                       f"failed ({type(err).__name__}: {str(err)[:300]}); decoding with the eager step")
            graph.uncompilable.add(key)
            graph.counts["fallbacks"] += 1
    if not capture:
        return fn
    for candidate in ([fn, eager] if fn is not eager else [eager]):
        try:
            captured = Captured(candidate, state, [getattr(state, f) for f in MUTABLE_FIELDS[2:]], graph.pool(),
                                warmup=0 if recapture else 2)
            graph.counts["recaptures" if recapture else "captures"] += 1
            return captured
        except Exception as err:  # noqa: BLE001 - a capture failure: the next candidate, then no graph
            what = "compiled" if candidate is not eager else "eager"
            if candidate is not eager:
                graph.uncompilable.add(key)
            graph.counts["fallbacks"] += 1
            _warn_once(("capture", what, type(err).__name__),
                       f"rollout.engine=graph: capturing the {what} decoding step as a CUDA graph failed "
                       f"({type(err).__name__}: {str(err)[:300]}); trying without")
    return eager


def ready_slot(graph: GraphStep, slot: Slot, sampling: StepSampling, compile_step: bool, capture: bool) -> bool:
    """Ready the slot's step if it has none (a new slot: compiled, captured on CUDA), or capture it again when the
    captured step reads folded weights (they are made anew for every rollout); whether it was readied from scratch."""
    if slot.step is None:
        slot.step = ready_step(graph, sampling, slot.state, compile_step, capture)
        return True
    if slot.state.folded and isinstance(slot.step, Captured):
        slot.step = None  # the old graph reads the last rollout's copies: never replayed again
        slot.step = ready_step(graph, sampling, slot.state, compile_step, capture, recapture=True)
    return False


def decode_graph(model: torch.nn.Module, rows: Sequence[Sequence[int]], rollout: RolloutConfig,
                 stop_ids: Sequence[int], pad_id: int, *, greedy: bool = False, row_keys: Sequence[int] | None = None,
                 compile_step: bool | None = None, capture: bool | None = None,
                 graph: GraphStep | None = None) -> tuple[list[list[int]], torch.Tensor]:
    """The graph engine: the new ids of each of `rows` (token ids, unpadded; at most rollout.max_new_tokens each,
    rows that stopped padded after their stop token) and the sanitiser's count of fixed logit rows (a device tensor).
    Prompts are padded to PROMPT_BUCKET and each distinct one prefilled once; the rows' sampler keys are `row_keys`
    or drawn from the torch RNG (`greedy`: argmax). `compile_step` / `capture` default to on for CUDA (compiled,
    then captured) and off on the CPU (the eager step; the same function); capture=True needs CUDA graphs. A sampled
    call's buffers and readied step are kept per shape (`GraphStep.slot`), and the next rollout of that shape writes
    its prompts and keys into them and replays; a greedy call's (evaluation batches come in many shapes) live for the
    call. rollout.fold_lora: see `GraphStep.fold`."""
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
    capture = cuda if capture is None else capture
    graph = graph or graph_step_for(model)
    with generation_mode(model), torch.no_grad():
        folded = graph.fold(rollout.fold_lora == "on" or (rollout.fold_lora == "auto" and graph.fold_auto is not False))
        B, P = ids_BP.shape
        slot = graph.slot(sampling, B, P, max_new_tokens, device.type, keep=not greedy)
        slot.state = build_state(model, ids_BP.to(device), mask_BP.to(device), keys_B, sampling, max_new_tokens,
                                 folded, distinct_lists(rows), into=slot.state)
        graph.trim(reserve=slot)
        started = time.perf_counter()
        readied = ready_slot(graph, slot, sampling, compile_step, capture)
        steps_run = _loop(graph, slot.step, slot.state, sampling, max_new_tokens, sync_every(device))
        if readied and (compile_step or capture) and not greedy:
            compiled = compile_step and step_key(graph, sampling, device.type) not in graph.uncompilable
            _announce((B, P + max_new_tokens, device.type, compiled, isinstance(slot.step, Captured)),
                      f"graph engine: decoding step for {B} rows x {P + max_new_tokens} columns ready in "
                      f"{time.perf_counter() - started:.1f} s with its first rollout (compiled: {compiled}, CUDA "
                      f"graph: {isinstance(slot.step, Captured)}); later rollouts of this shape reuse it")
        new_ids, fixed = slot.state.out_BN[:, :steps_run].tolist(), slot.state.fixed.clone()  # a rollout refills both
        slot.state.folded = []  # the folded copies live for this rollout only
        graph.trim()
    return new_ids, fixed


def _loop(graph: GraphStep, step: Callable[[DecodeState], None], state: DecodeState, sampling: StepSampling,
          max_new_tokens: int, every: int) -> int:
    """Run the step until every row stopped (read from the device every `every` steps) or max_new_tokens tokens are
    drawn; the number of decoding steps run."""
    for t in range(max_new_tokens - 1):
        step(state)  # the token of step t is drawn in here (GraphStep.sample), the next logits computed
        if (t + 1) % every == 0 and not bool(state.running_B.any()):  # a host read: see SYNC_EVERY
            return t + 1
    graph.sample(state, sampling)  # the last token: nothing is run on it
    return max_new_tokens


_GRAPHS: "dict[int, GraphStep]" = {}


def graph_step_for(model: torch.nn.Module) -> GraphStep:
    """The GraphStep of `model` (one per model object, so its compiled steps and kept slots serve every rollout)."""
    import weakref

    key = id(model)
    graph = _GRAPHS.get(key)
    if graph is None or graph.model is not model:
        graph = GraphStep(model)
        _GRAPHS[key] = graph
        weakref.finalize(model, _GRAPHS.pop, key, None)
    return graph


GRAPH_COUNTS = ("compiles", "captures", "recaptures", "fallbacks")
"""What `GraphStep.counts` counts (see there)."""


def graph_counts(model: torch.nn.Module) -> dict[str, int]:
    """The graph engine's running GRAPH_COUNTS for `model`; empty when it never decoded for it."""
    graph = _GRAPHS.get(id(model))
    return {what: graph.counts[what] for what in GRAPH_COUNTS} if graph is not None and graph.model is model else {}


def release_graph_slots(model: torch.nn.Module) -> int:
    """Free the kept slots of `model`'s graph engine and keep none from now on (after a CUDA out-of-memory error:
    each rollout then lays its buffers out again); the bytes freed."""
    graph = _GRAPHS.get(id(model))
    if graph is None or graph.model is not model:
        return 0
    graph.keep_bytes = 0
    return graph.release()


def row_keys_from_rng(B: int) -> torch.Tensor:
    """One sampler key per row drawn from the torch RNG (seed it around the call): what the graph engine samples
    with when the run gives no per-completion keys."""
    return torch.randint(0, 2 ** 62, (B,), dtype=torch.int64)
