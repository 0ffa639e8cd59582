"""What the memory estimator (grpo/machine/memory_estimate.py, pure arithmetic) needs to know about a config: the
model's shape and the run's batch, precision and features. Used by grpo/run/assembly/gpu_memory_check.py and by the
trainer's banner on a GPU.

`cfg` is a config.Config or any object with the same fields (benchmarks pass stand-ins).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from grpo.core.kernels import DEFAULT_LOGPROB_CHUNK_ROWS
from grpo.machine.hardware import choose_precision
from grpo.machine.memory_estimate import (
    GIB,
    KNOWN_SHAPES,
    NF4_BYTES_PER_PARAM,
    NF4_BYTES_PER_PARAM_DQ,
    EstimateInputs,
    ModelShape,
    estimate,
    graph_cache_budget,
    graph_slot_bytes,
    lookup_known_shape,
    param_counts,
    shape_from_hf_config,
)
from grpo.models.logprobs import shares_by_size
from grpo.models.modeling import tiny_model_config
from grpo.models.pretrained import adapter_base
from grpo.run.assembly.samples import prompt_token_limit

PACKAGED_SHAPES = {"smollm2-135m-instruct": ("HuggingFaceTB/SmolLM2-135M-Instruct", 8192)}
"""The project's packaged models (grpo/models/pretrained.py): the model each was converted from, its positions."""
EXPERT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
"""config.json's count of experts per layer (Mixtral, Qwen-MoE / OLMoE, DeepSeek, ...): each one's weights resident."""


def resolve_shape(model_cfg: Any) -> ModelShape:
    """The model's shape: a local folder's config.json (every expert of a mixture counted), builtin:tiny, a packaged
    model or KNOWN_SHAPES; a clear error otherwise."""
    name = model_cfg.name
    if name == "builtin:tiny":
        return _tiny_shape(model_cfg)
    folder = Path(name).expanduser()
    if (folder / "adapter_config.json").is_file() and not (folder / "config.json").is_file():
        name = adapter_base(name) or _adapter_base_name(folder)  # a LoRA adapter's output: its base's shape
    d = model_config_json(name)
    if d is not None:
        try:
            return _with_experts(shape_from_hf_config(d, name=name), d)
        except (KeyError, TypeError, AttributeError) as err:  # a field the shape needs is missing or of another type
            raise ValueError(f"{Path(name).expanduser() / 'config.json'} lacks what the estimate needs "
                             f"({type(err).__name__}: {err}): a transformers model's config.json holds hidden_size, "
                             "num_hidden_layers, num_attention_heads, intermediate_size and vocab_size") from None
    known, positions = PACKAGED_SHAPES.get(name, (name, 0))
    shape = lookup_known_shape(known)
    if shape is None:
        known = "\n  ".join(sorted([*KNOWN_SHAPES, *PACKAGED_SHAPES]))
        raise ValueError(f"model.name={name!r}: its shape is not bundled and it is not a local folder. Known names:\n  "
                         f"{known}\nor pass a local path holding config.json (`--set model.name=/path/to/model`).")
    return replace(shape, name=name, positions=positions) if positions else shape


def model_config_json(name: str) -> dict[str, Any] | None:
    """A local model folder's config.json (its text model's, for a multimodal one); None when `name` is no folder."""
    folder = Path(name).expanduser()
    if not folder.is_dir():
        return None
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ValueError(f"model.name={name!r} is a folder without config.json: point it at a Hugging Face "
                         "model folder (the one holding config.json and the weights)")
    try:
        d = json.loads(config_file.read_text())
    except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError is a ValueError
        raise ValueError(f"{config_file} is not JSON ({err}): a model folder's config.json is") from None
    if not isinstance(d, dict):
        raise ValueError(f"{config_file} is not a JSON object: a model folder's config.json is")
    text = d.get("text_config", d)
    return {**text, "quantization_config": d.get("quantization_config", text.get("quantization_config"))}


def _with_experts(shape: ModelShape, d: dict[str, Any]) -> ModelShape:
    """A mixture of experts' shape: a token runs through num_experts_per_tok experts (and the shared ones), but every
    expert's weights are in memory."""
    experts = next((int(d[k]) for k in EXPERT_FIELDS if d.get(k)), 0)
    if experts <= 1:
        return shape
    width = int(d.get("moe_intermediate_size") or shape.intermediate)
    shared = int(d.get("shared_expert_intermediate_size") or (d.get("n_shared_experts") or 0) * width)
    routed = int(d.get("num_experts_per_tok") or 1)
    return replace(shape, intermediate=routed * width + shared, resident_width=experts * width + shared)


def quantized_bytes(name: str) -> float:
    """Bytes per decoder-linear weight of a model folder saved quantized (its config.json's quantization_config):
    GPTQ / AWQ at `bits` with a 16-bit scale and a packed zero point per group, bitsandbytes 4-bit (nf4) or 8-bit;
    0.0 when not quantized. Any other way of saving is refused: counted as unquantized it would be a guess."""
    q = (model_config_json(name) or {}).get("quantization_config")
    if not q:
        return 0.0
    method, bits = str(q.get("quant_method", "")).lower(), q.get("bits")
    if method == "bitsandbytes" and (q.get("load_in_4bit") or q.get("load_in_8bit")):
        double = NF4_BYTES_PER_PARAM_DQ if q.get("bnb_4bit_use_double_quant") else NF4_BYTES_PER_PARAM
        return double if q.get("load_in_4bit") else 1.0
    if method in ("gptq", "awq") and isinstance(bits, int) and bits in (2, 3, 4, 8):
        group = int(q.get("group_size") or 128)
        return bits / 8 + ((2 + bits / 8) / group if group > 0 else 0.0)  # group_size -1: one scale per column
    raise ValueError(f"{Path(name).expanduser() / 'config.json'}: quantization_config quant_method={method or '?'!r}"
                     f"{f', bits={bits!r}' if bits is not None else ''} is a way of saving weights the estimate "
                     "cannot count (it counts GPTQ and AWQ with bits 2, 3, 4 or 8, and bitsandbytes 4- or 8-bit); "
                     "refused rather than counted as unquantized weights")


def estimated_prompt_tokens(shape: ModelShape, prompt_tokens: int, new_tokens: int) -> int:
    """The prompt length the run would use: data.max_prompt_tokens, lowered as the trainer lowers it where the
    model's positions cannot hold it and the completion (grpo/run/assembly/samples.py); a limit beyond the model's
    positions on its own is refused, naming both."""
    if shape.positions and prompt_tokens > shape.positions:
        raise ValueError(f"data.max_prompt_tokens={prompt_tokens} is beyond {shape.name}'s max_position_embeddings="
                         f"{shape.positions}: the model takes at most {shape.positions} tokens, prompt and completion "
                         f"together; give data.max_prompt_tokens at most {shape.positions} (less "
                         f"rollout.max_new_tokens={new_tokens})")
    return prompt_token_limit(prompt_tokens, new_tokens, shape.positions or None)[0]


def _adapter_base_name(folder: Path) -> str:
    """The base an adapter folder names (adapter_config.json's base_model_name_or_path)."""
    try:
        return str(json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{folder / 'adapter_config.json'} names no base model ({err}): a LoRA adapter's "
                         "adapter_config.json holds base_model_name_or_path") from None


def _tiny_shape(model_cfg: Any) -> ModelShape:
    """builtin:tiny's shape, from the config grpo/models/modeling.py builds it with."""
    config = tiny_model_config(model_cfg.tiny_vocab, hidden=model_cfg.tiny_hidden, layers=model_cfg.tiny_layers,
                               heads=model_cfg.tiny_heads)
    return shape_from_hf_config(config.to_dict(), name="builtin:tiny")


def _shares_prompts(cfg: Any, shape: ModelShape) -> bool:
    """What grpo_train.shares_prompts will decide, from the config alone: not under FSDP; `auto` only from
    SHARED_PROMPT_MIN_PARAMS parameters."""
    if getattr(cfg.train, "sharding", "none") == "fsdp":
        return False
    return shares_by_size(getattr(cfg.model, "shared_prompt_forward", "off"), param_counts(shape)["total"])


def inputs_from_config(cfg: Any, compute_capability: tuple[int, int] = (8, 0)) -> EstimateInputs:
    """EstimateInputs for `cfg` (a config.Config or any object with the same fields) on a GPU of that capability."""
    m = cfg.model
    dtype, _scaler, _why = choose_precision(m.dtype, True, tuple(compute_capability) >= (8, 0),
                                            full_finetune=not m.lora)
    k = cfg.rollout.k
    shape = resolve_shape(m)
    # on a GPU rollout.engine=auto decodes with the graph engine (the Llama-family shapes this estimator models)
    graph = (getattr(cfg.rollout, "engine", "auto") in ("auto", "graph")
             and getattr(cfg.rollout, "cache_implementation", "dynamic") == "dynamic"
             and getattr(cfg.train, "sharding", "none") != "fsdp")
    x = EstimateInputs(
        shape=shape,
        micro_batch_seqs=getattr(cfg.train, "micro_batch_size", 0) or cfg.train.prompts_per_micro_step * k,
        gen_batch_seqs=cfg.train.prompts_per_micro_step * cfg.train.grad_accum * k,
        prompt_len=estimated_prompt_tokens(shape, cfg.data.max_prompt_tokens, cfg.rollout.max_new_tokens),
        new_tokens=cfg.rollout.max_new_tokens,
        weight_dtype=dtype, load_in_4bit=m.load_in_4bit, lora=m.lora, lora_r=m.lora_r,
        lora_targets=tuple(m.lora_target_modules), lora_dropout=getattr(m, "lora_dropout", 0.0),
        grad_checkpointing=m.gradient_checkpointing, k=k, mu=cfg.loss.mu, ref_pass=bool(cfg.kl_enabled),
        logits_to_keep=True, logsoftmax_chunk_rows=DEFAULT_LOGPROB_CHUNK_ROWS,
        fused_head=bool(getattr(m, "fused_lm_head", True)), shared_prompt=_shares_prompts(cfg, shape),
        attention="eager" if getattr(m, "attn_implementation", "auto") == "eager" else "sdpa",
        graph_decode=graph, fold_lora=graph and getattr(cfg.rollout, "fold_lora", "off") == "on",
        repetition_penalty=getattr(cfg.rollout, "repetition_penalty", 1.0) != 1.0,
        count_penalties=bool(getattr(cfg.rollout, "presence_penalty", 0.0) or getattr(cfg.rollout, "frequency_penalty",
                                                                                      0.0)),
        stop_ids=1 + len(getattr(cfg.rollout, "stop_strings", ()) or ()),
        quantized_bytes=quantized_bytes(m.name),
    )
    if graph and m.lora and getattr(cfg.rollout, "fold_lora", "off") == "auto" and fold_keeps_peak(x)[0]:
        x = replace(x, fold_lora=True)
    return x


def fold_keeps_peak(x: EstimateInputs) -> tuple[bool, float, float]:
    """(whether folding LoRA for the rollout leaves the step's estimated peak where it is, the peak without and with
    the folded copy in GiB): what rollout.fold_lora=auto decides on a GPU."""
    without, folded = estimate(replace(x, fold_lora=False)), estimate(replace(x, fold_lora=True))
    return folded.peak_bytes <= without.peak_bytes, without.peak_bytes / GIB, folded.peak_bytes / GIB


def lora_fold_choice(cfg: Any, capability: tuple[int, int]) -> tuple[bool, str]:
    """What rollout.fold_lora=auto does for `cfg` on a GPU of that capability: (fold, why), from the estimate."""
    try:
        keeps, without, folded = fold_keeps_peak(inputs_from_config(cfg, capability))
    except ValueError as err:  # a shape the estimator does not know: keep the memory as it is
        return False, f"the memory estimate is not available ({err})"
    if keeps:
        return True, f"the folded copy fits under the step's estimated peak ({without:.1f} GiB)"
    return False, f"the folded copy would raise the step's estimated peak from {without:.1f} to {folded:.1f} GiB"


def graph_cache_choice(cfg: Any, capability: tuple[int, int]) -> tuple[int | None, str]:
    """How many bytes of decoding buffers the graph engine keeps between rollouts on a GPU of that capability
    (None: the engine's own bound, when there is no estimate) and why, from the estimate: what the step's peak phase
    leaves free (`graph_cache_budget`)."""
    try:
        x = inputs_from_config(cfg, capability)
        budget, slot = graph_cache_budget(x), sum(graph_slot_bytes(x).values())
    except ValueError as err:  # a shape the estimator does not know
        return None, f"the memory estimate is not available ({err})"
    if budget < slot:
        return 0, (f"laid out anew for each rollout (keeping its {slot / GIB:.2f} GiB between rollouts would raise the "
                   "step's estimated peak), its step captured again each time")
    return int(budget), (f"kept between rollouts ({slot / GIB:.2f} GiB, under the step's estimated peak): its "
                         "captured step is replayed, not captured again")
