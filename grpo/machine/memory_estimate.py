"""Pure GPU-memory estimator for one GRPO step: bytes per part and phase, and the cheapest changes that fit a card.

No torch, no I/O. Bytes throughout; tables print GiB (2^30 B: an "80 GB" A100 has 81,920 MiB). h hidden, L layers,
I intermediate, V vocab, kvo = kv_heads·head_dim, a = activation bytes (2 bf16/fp16, 4 fp32), B sequences per
micro-batch, P prompt and T new tokens, S = P + T. Checked against an H100 run (docs/MEMORY.md, "Measured").

Formulas (one line each, with the source):
- params = L·(Σ_linears in·out + 2h [+ qkv bias]) + V·h·(1 if tied else 2) + h           (Llama/Qwen2 modeling code)
- weights: 2 B/param bf16/fp16, 4 fp32; nf4 0.5 B + (8/64 + 32/(64·256))/8 B state    (QLoRA arXiv 2305.14314 §3)
- 4-bit: embeddings, norms, lm_head, so the residual stream, are fp32   (peft `prepare_model_for_kbit_training`)
- LoRA params = L·Σ_targets (in·r + r·out), fp32 (peft `autocast_adapter_dtype=True`)     (LoRA arXiv 2106.09685)
- AdamW: 2 states shaped and typed like each trainable param                      (torch.optim.AdamW `zeros_like`)
- saved/token/layer = 8h (RMSNorm fp32 in) + a·(2h_q + 2kvo) (SDPA q,k,v,out) + 3a·I (SwiGLU) + LoRA Σ_targets
  (4·in fp32 input + 1·in dropout mask + 4r) | full FT a·(4h + h_q + I)   (Korthikanti arXiv 2205.05198 §4.1 re-derived
  for Llama: its 5·heads·S² term vanishes under SDPA/flash; eager adds (4 + a)·heads·S)
- checkpointing keeps L·B·S·a·h (layer inputs) + one layer recomputed                   (Chen et al. arXiv 1604.06174)
- no_grad layer peak/token = 2a·h + 2a·I + (8·I adapter on | a·I off); backward adds 2a·h + 3a·I (+4·I LoRA)
- logits = B·(T+1)·V·a with `logits_to_keep` (else B·S·V·a), ×2 in training; fp32 chunk = 2·rows·V·4
- fused head (`model.fused_lm_head`): no logits; per chunk rows·V·(3·4 + a) (fp32 z, p, dz + the chunk's logits) and
  the final hidden states B·T·h·a kept for backward                                      (grpo/models/logprobs.py)
- shared prompts (`model.shared_prompt_forward`): B/K·P + B·T tokens instead of B·S; the prompt's KV repeated K
  times, B·P·2·kvo·a per layer, kept by every layer for backward (with checkpointing: the B/K·P·L·2·kvo·a cache
  plus one layer's repeat)                                                              (grpo/models/logprobs.py)
- KV cache = seqs·S·L·2·kvo·a                                                                     (HF DynamicCache)

Phase model: the peak is the max over phases, never the sum of all parts. Persistent parts (context, weights, the frozen
copy under full FT, trainable params, grads — `zero_grad` runs after generation, so last step's grads are alive —
and AdamW states) live in every phase. Generation adds the KV cache of all prompts×K of the step plus one layer's
prefill temporaries; the ref/old pass (β > 0 or μ > 1) and training each take the larger of two moments that never
overlap: the logits moment and the one-layer moment. A slack fraction stands for allocator fragmentation.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any, Callable

GIB = 2**30
LLAMA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
NF4_BYTES_PER_PARAM_DQ = 0.5 + (8 / 64 + 32 / (64 * 256)) / 8
"""4-bit weight + 8-bit absmax per 64-block + fp32 absmax per 256 blocks (QLoRA double quant): 4.127 bits."""
NF4_BYTES_PER_PARAM = 0.5 + (32 / 64) / 8
"""4-bit weight + one fp32 absmax per 64-weight block (bitsandbytes default), no double quant: 4.5 bits."""
ADAPTER_BYTES = 4
"""peft upcasts LoRA A/B of an fp16/bf16 base to fp32 (get_peft_model's default `autocast_adapter_dtype=True`)."""
NORM_INPUT_BYTES = 4
"""HF LlamaRMSNorm computes in fp32: `pow(2)` keeps an fp32 copy of its input for backward, whatever the model dtype."""
SOFTMAX_TEMPS = 2
"""fp32 temporaries alive at once per chunk in grpo/core/kernels.py (the upcast and the /τ or exp() result)."""
TRAIN_LOGITS_COPIES = 2
"""Training holds the saved logits plus one full-size grad at a time in backward (measured: docs/MEMORY.md)."""
DEFAULT_CUDA_OVERHEAD_GB = 0.75
"""CUDA context + cuBLAS workspace of a torch process (NVML's process use minus torch's reserved): the largest
reading on an H100 (docs/RESULTS.md, "Figures behind constants")."""
DEFAULT_ALLOCATOR_SLACK = 0.05
"""Caching-allocator fragmentation over peak allocated, with a margin (docs/RESULTS.md, "Figures behind constants")."""
MIN_K = 2
"""GRPO needs at least two completions per prompt for a group standard deviation."""


@dataclass(frozen=True)
class ModelShape:
    """The dimensions of a decoder-only Llama-style model that decide its memory."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tie_embeddings: bool
    head_dim: int = 0
    """0 → hidden // heads."""
    attn_bias: bool = False
    """q/k/v projections carry a bias (Qwen2)."""
    resident_width: int = 0
    """Experts: every expert's MLP width together, all resident (`intermediate`: a token's); 0 = a dense MLP."""
    positions: int = 0  # max_position_embeddings, 0 = not known

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        if min(self.hidden, self.layers, self.heads, self.kv_heads, self.intermediate, self.vocab) < 1:
            raise ValueError(f"ModelShape {self.name!r}: every dimension must be >= 1, got {self}")


def shape_from_hf_config(d: dict[str, Any], name: str = "") -> ModelShape:
    """ModelShape from a Hugging Face config.json dict (Llama, Mistral, Qwen2 field names)."""
    missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
               if k not in d]
    if missing:
        raise ValueError(f"config.json of {name or d.get('_name_or_path', '?')!r} lacks {missing}: "
                         "only decoder-only Llama-style configs are supported")
    return ModelShape(name=name or str(d.get("_name_or_path", "")), hidden=d["hidden_size"],
                      layers=d["num_hidden_layers"],
                      heads=d["num_attention_heads"], kv_heads=d.get("num_key_value_heads") or d["num_attention_heads"],
                      intermediate=d["intermediate_size"], vocab=d["vocab_size"],
                      tie_embeddings=bool(d.get("tie_word_embeddings", False)), head_dim=d.get("head_dim") or 0,
                      attn_bias=bool(d.get("attention_bias", d.get("model_type") == "qwen2")),
                      positions=int(d.get("max_position_embeddings") or 0))


def _known() -> dict[str, ModelShape]:
    # (hidden, layers, heads, kv_heads, intermediate, vocab, tied, qkv bias) from each model's config.json on the Hub.
    rows = {
        "meta-llama/Meta-Llama-3-8B": (4096, 32, 32, 8, 14336, 128256, False, False),
        "meta-llama/Llama-3.1-8B": (4096, 32, 32, 8, 14336, 128256, False, False),
        "meta-llama/Llama-3.2-1B": (2048, 16, 32, 8, 8192, 128256, True, False),
        "meta-llama/Llama-3.2-3B": (3072, 28, 24, 8, 8192, 128256, True, False),
        "Qwen/Qwen2.5-0.5B": (896, 24, 14, 2, 4864, 151936, True, True),
        "Qwen/Qwen2.5-1.5B": (1536, 28, 12, 2, 8960, 151936, True, True),
        "Qwen/Qwen2.5-3B": (2048, 36, 16, 2, 11008, 151936, True, True),
        "Qwen/Qwen2.5-7B": (3584, 28, 28, 4, 18944, 152064, False, True),
        "mistralai/Mistral-7B-v0.1": (4096, 32, 32, 8, 14336, 32000, False, False),
        "HuggingFaceTB/SmolLM2-135M": (576, 30, 9, 3, 1536, 49152, True, False),
    }
    out = {}
    for name, (h, n_layers, heads, kv, inter, vocab, tied, bias) in rows.items():
        variants = [name] if name.startswith("mistralai") else [name, name + "-Instruct"]
        for v in variants:
            out[v] = ModelShape(v, h, n_layers, heads, kv, inter, vocab, tied, attn_bias=bias)
    return out


KNOWN_SHAPES: dict[str, ModelShape] = _known()


def lookup_known_shape(name: str) -> ModelShape | None:
    """Exact, then case-insensitive match in KNOWN_SHAPES; None when unknown."""
    if name in KNOWN_SHAPES:
        return KNOWN_SHAPES[name]
    lowered = {k.lower(): v for k, v in KNOWN_SHAPES.items()}
    return lowered.get(name.lower())


def linear_dims(shape: ModelShape) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of every linear of one decoder layer, by module name."""
    h, inter = shape.hidden, shape.intermediate
    q_out, kvo = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    return {"q_proj": (h, q_out), "k_proj": (h, kvo), "v_proj": (h, kvo), "o_proj": (q_out, h),
            "gate_proj": (h, inter), "up_proj": (h, inter), "down_proj": (inter, h)}


def param_counts(shape: ModelShape) -> dict[str, int]:
    """{"linear": decoder linears, "other": norms, biases, embeddings, head; "total"}."""
    dims = linear_dims(shape)
    linear = shape.layers * sum(i * o for i, o in dims.values())
    if shape.resident_width:  # every expert's gate, up and down projections are in memory, not only the routed ones
        linear += shape.layers * 3 * shape.hidden * (shape.resident_width - shape.intermediate)
    bias = (dims["q_proj"][1] + 2 * dims["k_proj"][1]) if shape.attn_bias else 0
    embed = shape.vocab * shape.hidden * (1 if shape.tie_embeddings else 2)
    other = shape.layers * (2 * shape.hidden + bias) + embed + shape.hidden
    return {"linear": linear, "other": other, "total": linear + other}


def resolve_targets(shape: ModelShape, targets: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Target names as linear module names; "all-linear" → all seven; unknown names raise with the valid list."""
    names = tuple(LLAMA_TARGETS) if list(targets) == ["all-linear"] else tuple(targets)
    unknown = [t for t in names if t not in linear_dims(shape)]
    if unknown:
        raise ValueError(f"lora_targets {unknown} are not linears of a Llama-style layer: use {LLAMA_TARGETS}")
    return names


def lora_param_count(shape: ModelShape, r: int, targets: tuple[str, ...] | list[str]) -> int:
    """Σ_layers Σ_targets (in·r + r·out)."""
    dims = linear_dims(shape)
    return shape.layers * sum(dims[t][0] * r + r * dims[t][1] for t in resolve_targets(shape, targets))


@dataclass(frozen=True)
class EstimateInputs:
    """Plain values that decide memory; `grpo/run/assembly/memory_inputs.py: inputs_from_config` builds one."""

    shape: ModelShape
    micro_batch_seqs: int
    """Sequences per training micro-batch (prompts_per_micro_step × K)."""
    gen_batch_seqs: int
    """Sequences generated at once (prompts per step × K: all prompts of a step generate together)."""
    prompt_len: int
    new_tokens: int
    weight_dtype: str = "bfloat16"
    load_in_4bit: bool = False
    double_quant: bool = True
    lora: bool = True
    """False = full fine-tuning."""
    lora_r: int = 8
    lora_targets: tuple[str, ...] = LLAMA_TARGETS
    lora_dropout: float = 0.0
    grad_checkpointing: bool = False
    k: int = 4
    """Completions per prompt; only used to price the "smaller K" fix."""
    mu: int = 1
    ref_pass: bool = True
    """β > 0 for some task: a no_grad reference pass runs (LoRA: adapter disabled; full FT: the frozen copy)."""
    optimizer: str = "adamw"
    fp32_master: bool = False
    """Full FT in low precision with an fp32 master copy (this trainer does not keep one)."""
    logits_to_keep: bool = True
    fused_head: bool = False
    """The LM head applied chunk by chunk inside the log-prob computation (`model.fused_lm_head`, the trainer's
    default): no (B, T, V) logits or logits gradient. False = the logits path, which the H100 measurements used."""
    shared_prompt: bool = False
    """Each group's prompt encoded once for its K completions (`model.shared_prompt_forward`)."""
    logsoftmax_chunk_rows: int | None = 512
    """Rows (tokens) per fp32 log-softmax chunk; None = one unchunked fp32 (B, T, V) pass."""
    attention: str = "sdpa"
    """sdpa | flash_attention_2 | eager (only eager keeps S² attention probabilities)."""
    kbit_fp32_upcast: bool = True
    """Under load_in_4bit, peft `prepare_model_for_kbit_training` (called by grpo/models/modeling.py) upcasts every
    non-quantised param (embeddings, norms, lm_head) to fp32, and bnb Linear4bit returns its input's dtype, so the
    residual stream, KV cache and logits become fp32 too."""
    graph_decode: bool = False
    """Rollouts by the graph engine (rollout.engine=graph, or auto on CUDA for the Llama family): the KV buffers are
    laid out once at the bucketed prompt + new tokens, the prefill's cache is copied into them, and the sampler keeps
    (rows, vocab) buffers; False = the lean loop's growing cache."""
    fold_lora: bool = False
    """With graph_decode and LoRA (not 4-bit): each adapted weight folded into a copy for the rollout
    (rollout.fold_lora)."""
    repetition_penalty: bool = False
    """rollout.repetition_penalty ≠ 1: the graph engine keeps a (rows, vocab) bool of the tokens seen."""
    count_penalties: bool = False
    """rollout.presence_penalty or frequency_penalty: the graph engine keeps (rows, vocab) fp32 token counts."""
    stop_ids: int = 1
    """Token ids that end a completion (the end-of-turn token and rollout.stop_strings)."""
    graph_kept_bytes: float | None = None
    """Bytes of decoding buffers the graph engine keeps between rollouts (its slots: grpo/decoding/graph_decode.py
    `GraphStep.keep_bytes`); None = what the run decides, `graph_cache_budget`."""
    quantized_bytes: float = 0.0
    """Bytes per decoder-linear weight of a checkpoint quantized when saved (GPTQ, AWQ, bitsandbytes); 0 = none."""
    cuda_overhead_gb: float = DEFAULT_CUDA_OVERHEAD_GB
    allocator_slack: float = DEFAULT_ALLOCATOR_SLACK

    def __post_init__(self) -> None:
        if self.weight_dtype not in DTYPE_BYTES:
            raise ValueError(f"weight_dtype={self.weight_dtype!r}: use one of {sorted(DTYPE_BYTES)}")
        if self.load_in_4bit and not self.lora:
            raise ValueError("load_in_4bit=True needs lora=True: 4-bit weights cannot be trained directly (QLoRA)")
        if self.optimizer != "adamw":
            raise ValueError(f"optimizer={self.optimizer!r}: the estimator models torch AdamW only ('adamw')")
        if self.attention not in ("sdpa", "flash_attention_2", "eager"):
            raise ValueError(f"attention={self.attention!r}: use sdpa, flash_attention_2 or eager")
        if min(self.micro_batch_seqs, self.gen_batch_seqs, self.prompt_len, self.new_tokens, self.mu, self.lora_r) < 1:
            raise ValueError(f"batch sizes, lengths, mu and lora_r must be >= 1: {self}")


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per part: `persistent` parts live in every phase, `phases[name]` parts only in that phase."""

    persistent: dict[str, int]
    phases: dict[str, dict[str, int]]
    params: dict[str, int] = field(default_factory=dict)

    def total(self, phase: str) -> int:
        return sum(self.persistent.values()) + sum(self.phases[phase].values())

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.total)

    @property
    def peak_bytes(self) -> int:
        return self.total(self.peak_phase)


def act_bytes(x: EstimateInputs) -> int:
    """Bytes per activation element: the model dtype; fp32 under 4-bit with peft's fp32 upcast, else bf16 compute."""
    if x.load_in_4bit:
        return 4 if x.kbit_fp32_upcast else 2
    return DTYPE_BYTES[x.weight_dtype]


def _layer_activation_bytes(x: EstimateInputs, seq_len: int) -> float:
    """Bytes one decoder layer keeps for backward, per token, in the training forward (see module docstring)."""
    s, a = x.shape, act_bytes(x)
    h, q_out, kvo, inter = s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim, s.intermediate
    common = 2 * NORM_INPUT_BYTES * h + a * (2 * q_out + 2 * kvo) + 4 * s.heads + 3 * a * inter
    if x.attention == "eager":
        common += (4 + a) * s.heads * seq_len
    if not x.lora:
        return common + a * (2 * h + q_out + inter) + 2 * a * h
    cast = 4 if (a != ADAPTER_BYTES or x.lora_dropout > 0) else 0
    mask = 1 if x.lora_dropout > 0 else 0
    dims = linear_dims(s)
    targets = resolve_targets(s, x.lora_targets)
    return common + sum((cast + mask) * dims[t][0] + ADAPTER_BYTES * x.lora_r for t in targets)


def _layer_temporaries(x: EstimateInputs, tokens: int, seq_len: int, adapter_on: bool) -> float:
    """One layer's no_grad peak (the MLP): hidden + residual 2a·h, silu(gate) and up a·I each, then either the product
    a·I or, with the adapter on, the fp32 lora_B output and the fp32 sum peft makes before casting back (8·I)."""
    s, a = x.shape, act_bytes(x)
    per_token = 2 * a * s.hidden + 2 * a * s.intermediate + (8 if adapter_on else a) * s.intermediate
    eager = (4 + a) * s.heads * seq_len if x.attention == "eager" else 0
    return tokens * (per_token + eager)


def _backward_temporaries(x: EstimateInputs, tokens: int) -> float:
    """Grads alive while one layer back-propagates: 2a·h (residual, MLP out) + 3a·I (SwiGLU) [+ 4·I LoRA path]."""
    s, a = x.shape, act_bytes(x)
    lora = ADAPTER_BYTES * s.intermediate if (x.lora and a != ADAPTER_BYTES) else 0
    return tokens * (2 * a * s.hidden + 3 * a * s.intermediate + lora)


def _weights(x: EstimateInputs, counts: dict[str, int]) -> float:
    if x.load_in_4bit:
        nf4 = NF4_BYTES_PER_PARAM_DQ if x.double_quant else NF4_BYTES_PER_PARAM
        # bitsandbytes quantises the decoder linears only; embeddings, norms and lm_head stay unquantised
        return counts["linear"] * nf4 + counts["other"] * (4 if x.kbit_fp32_upcast else 2)
    if x.quantized_bytes:
        return counts["linear"] * x.quantized_bytes + counts["other"] * DTYPE_BYTES[x.weight_dtype]
    return counts["total"] * DTYPE_BYTES[x.weight_dtype]


def _persistent(x: EstimateInputs, counts: dict[str, int], n_train: int) -> dict[str, float]:
    p = DTYPE_BYTES[x.weight_dtype]
    weights = _weights(x, counts)
    out = {"CUDA context": x.cuda_overhead_gb * GIB, "base weights": weights}
    if x.lora:
        out["LoRA params (fp32)"] = n_train * ADAPTER_BYTES
        out["LoRA grads (fp32)"] = n_train * ADAPTER_BYTES
        out["AdamW states (2× fp32)"] = 2 * n_train * ADAPTER_BYTES
    else:
        out["reference copy (frozen)"] = weights  # modeling.load_policy deep-copies it under full FT, β or not
        out["grads"] = n_train * p
        out[f"AdamW states (2× {x.weight_dtype})"] = 2 * n_train * p
        out["fp32 master weights"] = n_train * 4 if (x.fp32_master and p < 4) else 0
    return out


def logit_bytes(x: EstimateInputs, seqs: int, copies: int) -> tuple[float, float]:
    """(bf16/fp32 logits × copies, fp32 log-softmax chunk temporaries) for `seqs` sequences."""
    a = act_bytes(x)
    kept = x.new_tokens + 1 if x.logits_to_keep else x.prompt_len + x.new_tokens
    rows = seqs * x.new_tokens
    chunk = rows if x.logsoftmax_chunk_rows is None else min(rows, x.logsoftmax_chunk_rows)
    return copies * seqs * kept * x.shape.vocab * a, SOFTMAX_TEMPS * chunk * x.shape.vocab * 4


def fused_head_bytes(x: EstimateInputs, seqs: int) -> tuple[float, float]:
    """(final hidden states kept for backward, one chunk's temporaries) of the fused head for `seqs` sequences."""
    rows = seqs * x.new_tokens
    chunk = rows if x.logsoftmax_chunk_rows is None else min(rows, x.logsoftmax_chunk_rows)
    return rows * x.shape.hidden * act_bytes(x), chunk * x.shape.vocab * (3 * 4 + act_bytes(x))


def pass_tokens(x: EstimateInputs, seqs: int) -> int:
    """Tokens one forward of `seqs` sequences computes: B·S, or B/K·P + B·T with shared prompts."""
    if x.shared_prompt and x.k > 1:
        return -(-seqs // x.k) * x.prompt_len + seqs * x.new_tokens
    return seqs * (x.prompt_len + x.new_tokens)


def _larger(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    """Parts alive at the larger of two moments of a phase (they do not overlap in time)."""
    return a if sum(a.values()) >= sum(b.values()) else b


GRAPH_PROMPT_BUCKET = 64
"""The graph engine pads prompts to a multiple of this many columns (grpo/decoding/graph_decode.py PROMPT_BUCKET)."""
SAMPLER_FP32_TEMPS = 4
"""(rows, vocab) fp32 tensors alive at once in the graph step's sampler: the scores, a warped copy, top-p's sorted
copy and the race's values; with the hash's int64 bits beside them when the step runs uncompiled."""


def graph_slot_bytes(x: EstimateInputs) -> dict[str, float]:
    """The buffers one slot of the graph engine keeps between rollouts, for rows = gen_batch_seqs, the prompt rounded
    up to GRAPH_PROMPT_BUCKET and new_tokens columns: exactly what grpo/decoding/graph_decode.py `build_state`
    allocates (its `state_bytes`; tests/test_memory.py checks the two agree)."""
    s, a = x.shape, act_bytes(x)
    B, N = x.gen_batch_seqs, x.new_tokens
    L = -(-x.prompt_len // GRAPH_PROMPT_BUCKET) * GRAPH_PROMPT_BUCKET + N
    return {
        "KV buffers": 2 * s.layers * B * s.kv_heads * L * s.head_dim * a,
        "next-token logits": B * s.vocab * a,
        "penalty buffers": B * s.vocab * ((1 if x.repetition_penalty else 0) + (4 if x.count_penalties else 0)),
        # int64: the tokens out (B, N), next token, its position, the keys, the column index (L), t / n / the
        # sanitiser's count, the stop ids; bool: the attended columns (B, L) and the running rows
        "per-row buffers": 8 * (B * N + 3 * B + L + 3 + x.stop_ids) + B * L + B,
    }


def graph_generation(x: EstimateInputs, kept: float) -> dict[str, float]:
    """The graph engine's generation phase: the rollout's slot (`graph_slot_bytes`) and the other shapes' slots kept
    beside it (`kept` in all, the rollout's included), the prefill's cache of the distinct prompts (copied into the
    slot layer by layer), one layer's prefill temporaries, the step's temporaries in the graph pool (the sampler's
    (rows, vocab) tensors), and the folded LoRA weights (every adapted linear, in the weights' dtype: made for the
    rollout, freed after it)."""
    s = x.shape
    kv_token = s.layers * 2 * s.kv_heads * s.head_dim * act_bytes(x)
    distinct = -(-x.gen_batch_seqs // x.k)
    slot = sum(graph_slot_bytes(x).values())
    parts = {
        "rollout buffers (bucketed KV, logits)": slot,
        **({"kept buffers of other shapes": kept - slot} if kept > slot else {}),
        "prefill cache (distinct prompts)": distinct * x.prompt_len * kv_token,
        "prefill temporaries (1 layer)": _layer_temporaries(x, distinct * x.prompt_len, x.prompt_len, x.lora),
        "graph pool (sampler temporaries)": x.gen_batch_seqs * s.vocab * (SAMPLER_FP32_TEMPS * 4 + 8),
    }
    if x.fold_lora and x.lora and not x.load_in_4bit:
        dims = linear_dims(s)
        parts["folded LoRA weights (rollout copy)"] = s.layers * sum(
            dims[t][0] * dims[t][1] for t in resolve_targets(s, x.lora_targets)) * DTYPE_BYTES[x.weight_dtype]
    return parts


def lean_generation(x: EstimateInputs) -> dict[str, float]:
    """The generation phase of the lean loop and `generate`: a KV cache grown per step (one layer's copy while it
    grows), one layer's prefill temporaries and the sampler's logits."""
    s, a = x.shape, act_bytes(x)
    kv = x.gen_batch_seqs * (x.prompt_len + x.new_tokens) * s.layers * 2 * s.kv_heads * s.head_dim * a
    return {
        "KV cache": kv,
        "KV cache growth (torch.cat of 1 layer)": kv / s.layers,
        "prefill temporaries (1 layer)": _layer_temporaries(x, x.gen_batch_seqs * x.prompt_len, x.prompt_len, x.lora),
        "sampling logits (last position)": x.gen_batch_seqs * s.vocab * (a + 2 * 4),
    }


def graph_cache_budget(x: EstimateInputs) -> float:
    """Bytes of decoding buffers the graph engine may keep between rollouts without raising the step's estimated
    peak: the rollout's own slot when the other phases, which would hold it too, stay at or below the peak with it;
    else 0 (each rollout then lays its buffers out anew). Never a second slot: the generation phase, holding the
    rollout's slot anyway, would go past the peak with it whenever it is the peak, and when another phase is the
    peak that phase has no room for one."""
    est = estimate(replace(x, graph_kept_bytes=0.0))
    others = max((est.total(p) for p in est.phases if p != "generation"), default=0)
    slot = sum(graph_slot_bytes(x).values())
    return slot if others + (1 + x.allocator_slack) * slot <= est.peak_bytes else 0.0


def estimate(x: EstimateInputs) -> MemoryEstimate:
    """Bytes per part and phase for one RL step of `x` (see the module docstring for every formula)."""
    s, a = x.shape, act_bytes(x)
    counts = param_counts(s)
    n_train = lora_param_count(s, x.lora_r, x.lora_targets) if x.lora else counts["total"]
    persistent = _persistent(x, counts, n_train)
    kept = 0.0
    if x.graph_decode:
        kept = x.graph_kept_bytes if x.graph_kept_bytes is not None else graph_cache_budget(x)
    seq = x.prompt_len + x.new_tokens
    phases: dict[str, dict[str, float]] = {"generation": graph_generation(x, kept) if x.graph_decode
                                           else lean_generation(x)}
    tokens = pass_tokens(x, x.micro_batch_seqs)
    shared = x.shared_prompt and x.k > 1
    kv_token = 2 * s.kv_heads * s.head_dim * a
    stored = {"prompt KV cache (one copy per group)": -(-x.micro_batch_seqs // x.k) * x.prompt_len * s.layers
              * kv_token} if shared else {}
    repeated = x.micro_batch_seqs * x.prompt_len * kv_token  # one layer's, repeated K times for the completions
    repeated_one = {"prompt KV repeated K times (1 layer)": repeated} if shared else {}
    if x.fused_head:
        hidden, fused_chunk = fused_head_bytes(x, x.micro_batch_seqs)
        head_moment = {"final hidden states": hidden, "fused head chunk": fused_chunk}
    if x.ref_pass or x.mu > 1:
        logits, chunk = logit_bytes(x, x.micro_batch_seqs, copies=1)
        adapter_on = x.lora and x.mu > 1  # the old-policy pass runs the adapter; the reference pass disables it
        layer = _layer_temporaries(x, tokens, seq, adapter_on)
        head = head_moment if x.fused_head else {"logits (no_grad)": logits, "log-softmax chunk (fp32)": chunk}
        phases["ref/old pass"] = _larger({**stored, **head},
                                         {**stored, **repeated_one, "layer temporaries (1 layer)": layer})
    per_layer = _layer_activation_bytes(x, seq)
    if x.grad_checkpointing:
        saved = {"checkpointed layer inputs": s.layers * tokens * a * s.hidden}
        layer_moment = {**saved, "one layer recomputed": tokens * per_layer}
    else:
        saved = {"saved activations (all layers)": s.layers * tokens * per_layer}
        layer_moment = dict(saved)
    layer_moment["layer backward temporaries"] = _backward_temporaries(x, tokens)
    if shared and x.grad_checkpointing:  # the cache of every layer stays; one layer's repeat is rebuilt at a time
        saved.update(stored)
        layer_moment.update({**stored, **repeated_one})
    elif shared:  # each layer's attention keeps its keys / values, the prompt's repeated K times, for backward
        saved["prompt KV repeated K times (all layers)"] = s.layers * repeated
        layer_moment["prompt KV repeated K times (all layers)"] = s.layers * repeated
    logits, chunk = logit_bytes(x, x.micro_batch_seqs, copies=TRAIN_LOGITS_COPIES)
    final_norm = NORM_INPUT_BYTES * s.hidden + (0 if x.lora else 2 * a * s.hidden)
    head = head_moment if x.fused_head else {"logits + grad": logits, "log-softmax chunk (fp32)": chunk}
    logits_moment = {**saved, "final norm": tokens * final_norm, **head}
    phases["training"] = _larger(logits_moment, layer_moment)
    for phase in ("ref/old pass", "training"):
        if kept and phase in phases:
            phases[phase]["kept decoding buffers (graph engine)"] = kept
    non_context = sum(persistent.values()) - persistent["CUDA context"]
    for parts in phases.values():
        parts[f"allocator slack ({x.allocator_slack:.0%})"] = x.allocator_slack * (non_context + sum(parts.values()))
    as_int = lambda d: {k: int(round(v)) for k, v in d.items()}  # noqa: E731
    return MemoryEstimate(as_int(persistent), {p: as_int(d) for p, d in phases.items()},
                    {"base": counts["total"], "trainable": n_train})


def fits(est: MemoryEstimate, gpu_gb: float) -> bool:
    """The peak phase fits in `gpu_gb` GiB."""
    return est.peak_bytes <= gpu_gb * GIB


# ------------------------------------------------------------------------------------------------------ fixes
@dataclass(frozen=True)
class _Fix:
    group: str
    """Fixes of one group exclude each other (micro-batch ÷2 and ÷4)."""
    cost: int
    """Rank by cost to quality first, then to speed: 1 = free, higher = worse."""
    label: str
    apply: Callable[[EstimateInputs], EstimateInputs]
    applies: Callable[[EstimateInputs], bool]


def _candidate_fixes(x: EstimateInputs) -> list[_Fix]:
    fixes = [
        _Fix("logits", 1, "logits_to_keep on (only completion logits)", lambda y: replace(y, logits_to_keep=True),
             lambda y: not y.logits_to_keep),
        _Fix("chunk", 1, "chunked log-softmax (512 rows)", lambda y: replace(y, logsoftmax_chunk_rows=512),
             lambda y: y.logsoftmax_chunk_rows is None or y.logsoftmax_chunk_rows > 512),
        _Fix("attn", 1, "attention sdpa instead of eager", lambda y: replace(y, attention="sdpa"),
             lambda y: y.attention == "eager"),
        _Fix("fold", 1, "rollout.fold_lora=off (LoRA run unfolded in rollouts: slower decoding, no weight copy)",
             lambda y: replace(y, fold_lora=False), lambda y: y.fold_lora and y.lora and not y.load_in_4bit),
        _Fix("ckpt", 2, "gradient checkpointing on (a slower backward: each layer's forward runs again)",
             lambda y: replace(y, grad_checkpointing=True), lambda y: not y.grad_checkpointing),
    ]
    for i, div in enumerate((2, 4, 8)):
        fixes.append(_Fix("micro", 3 + i, f"micro-batch {x.micro_batch_seqs} → {max(1, x.micro_batch_seqs // div)} "
                          f"sequences (grad_accum ×{div}; same effective batch, slower)",
                          lambda y, d=div: replace(y, micro_batch_seqs=max(1, y.micro_batch_seqs // d)),
                          lambda y, d=div: y.micro_batch_seqs // d >= 1 and y.micro_batch_seqs > 1))
    fixes.append(_Fix("qlora", 6, "QLoRA: base in 4-bit nf4 (small quality cost, slower matmuls)",
                      lambda y: replace(y, load_in_4bit=True), lambda y: y.lora and not y.load_in_4bit))
    for i, frac in enumerate((0.75, 0.5)):
        fixes.append(_Fix("tokens", 7 + i, f"max_new_tokens {x.new_tokens} → {max(1, int(x.new_tokens * frac))} "
                          "(more truncated answers)",
                          lambda y, f=frac: replace(y, new_tokens=max(1, int(y.new_tokens * f))),
                          lambda y: y.new_tokens > 1))
    half_k = max(MIN_K, x.k // 2)

    def smaller_k(y: EstimateInputs) -> EstimateInputs:
        return replace(y, k=half_k, micro_batch_seqs=max(1, y.micro_batch_seqs * half_k // y.k),
                       gen_batch_seqs=max(1, y.gen_batch_seqs * half_k // y.k))
    # group "micro": halving K is the costliest way to shrink the micro-batch (it also shrinks generation)
    fixes.append(_Fix("micro", 9, f"K {x.k} → {half_k} completions per prompt (noisier advantages)", smaller_k,
                      lambda y: y.k > half_k))
    return [f for f in fixes if f.applies(x)]


def _dominated(combo: tuple[_Fix, ...], prev: tuple[_Fix, ...]) -> bool:
    """`combo` does at least what `prev` does (same groups, each as costly or more): `prev` already fits, skip it."""
    return all(any(g.group == f.group and g.cost >= f.cost for g in combo) for f in prev)


def cheapest_fixes(x: EstimateInputs, gpu_gb: float, n: int = 3, max_combo: int = 3) -> list[str]:
    """Up to n cheapest changes (single knobs or combinations of ≤ max_combo) that make `x` fit `gpu_gb` GiB.

    Each line names the change and its new peak. Empty when `x` already fits or nothing tried fits. Combinations are
    ranked by the sum of their costs; one that does at least what a chosen one does is skipped.
    """
    if fits(estimate(x), gpu_gb):
        return []
    fixes = _candidate_fixes(x)
    combos = [c for r in range(1, max_combo + 1) for c in itertools.combinations(fixes, r)
              if len({f.group for f in c}) == r]
    combos.sort(key=lambda c: (sum(f.cost for f in c), len(c)))
    chosen: list[tuple[_Fix, ...]] = []
    lines = []
    for combo in combos:
        if len(chosen) >= n:
            break
        if any(_dominated(combo, prev) for prev in chosen):
            continue
        y = x
        for f in combo:
            y = f.apply(y)
        est = estimate(y)
        if fits(est, gpu_gb):
            chosen.append(combo)
            lines.append(" + ".join(f.label for f in combo) + f"  → peak {est.peak_bytes / GIB:.1f} GiB "
                         f"({est.peak_phase})")
    return lines


def format_table(est: MemoryEstimate, gpu_gb: float | None = None) -> str:
    """A plain-text table: persistent parts, then each phase's own parts and total, the peak, and the verdict."""
    gib = lambda b: f"{b / GIB:9.2f}"  # noqa: E731
    width = max(len(k) for d in [est.persistent, *est.phases.values()] for k in d) + 4
    lines = [f"{'part':<{width}}{'GiB':>9}", "-" * (width + 9), "persistent (every phase):"]
    lines += [f"  {k:<{width - 2}}{gib(v)}" for k, v in est.persistent.items() if v]
    lines.append(f"  {'= persistent':<{width - 2}}{gib(sum(est.persistent.values()))}")
    for phase, parts in est.phases.items():
        lines.append(f"phase '{phase}' adds:")
        lines += [f"  {k:<{width - 2}}{gib(v)}" for k, v in parts.items()]
        lines.append(f"  {'= total in this phase':<{width - 2}}{gib(est.total(phase))}")
    lines.append("-" * (width + 9))
    lines.append(f"{'PEAK (' + est.peak_phase + ')':<{width}}{gib(est.peak_bytes)}")
    lines.append(f"params: base {est.params.get('base', 0):,}, trainable {est.params.get('trainable', 0):,}")
    if gpu_gb is not None:
        verdict = "FITS" if fits(est, gpu_gb) else "DOES NOT FIT"
        lines.append(f"{verdict} on a {gpu_gb:.1f} GiB GPU (headroom {gpu_gb - est.peak_bytes / GIB:+.1f} GiB)")
    return "\n".join(lines)
