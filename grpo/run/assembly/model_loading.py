"""The run's model: the policy and its reference built from the model section (`policy_from_config`, a failed
load named by `model_load_error`), and the checks and choices that need it: precision with gradient surgery, FSDP2
sharding, the graph engine's memory."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any, Iterable

import torch

from grpo import config as C
from grpo.config import ConfigError
from grpo.machine.distributed import Dist
from grpo.models.modeling import Policy, check_4bit_available
from grpo.models.pretrained import check_model_name


def model_load_error(name: str, error: BaseException) -> ConfigError:
    """The ConfigError for a model.name that does not load (a missing path, a file that is no model folder, a hub id
    with no network, a pickle): the name and the loader's first line, no traceback."""
    from grpo.data.dataset_dicts import offline_message
    from grpo.data.tables import looks_like_hub_id

    first = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
    path = Path(name).expanduser()
    hub_id = looks_like_hub_id(name) and not path.exists() and type(error).__name__ != "HubCacheError"
    offline = offline_message(name, "model.name", "model") if hub_id else None  # (an unusable cache: named below)
    if type(error).__name__ == "NoMatchingPeftModuleError" or first.startswith("Target modules"):  # peft's
        return ConfigError(f"config field `model.lora_target_modules` is invalid: {first} (model {name!r}); name "
                           "modules the model has (TRL's lora_target_modules sets this field)",
                           field="model.lora_target_modules")
    if offline is not None:  # transformers says only that it could not connect
        return ConfigError(f"config field `model.name` = {name!r} cannot be loaded: {offline.split(': ', 1)[1]}",
                           field="model.name")
    why = (f"{path} does not exist" if name.startswith(("/", ".", "~")) and not path.exists()
           else f"{path} is a file, not a model folder (config.json, weights as safetensors)" if path.is_file()
           else f"{type(error).__name__}: {first}")
    return ConfigError(f"config field `model.name` = {name!r} cannot be loaded: {why}; give builtin:tiny, a packaged "
                       "model name, a local model folder or a hub id", field="model.name")


def policy_from_config(model_cfg, device: torch.device, corpus: Iterable[str], seed: int,
                       loaded: tuple[Any, Any] | None = None):
    """Load the policy named by the model section, with precision and attention chosen for this machine; or, with
    `loaded` = (model, tokenizer) handed in from Python, train that model (in place, in its own dtype and attention)
    with the section's LoRA, checkpointing and compile settings."""
    from grpo.machine.hardware import choose_attention, choose_precision, detect_capabilities
    from grpo.models.modeling import load_policy, policy_from_model, ready_for_batches

    on_cuda = device.type == "cuda"
    if loaded is not None:
        model, tokenizer = loaded
        ready_for_batches(model, tokenizer)
        dtype = next(model.parameters()).dtype
        use_scaler = dtype == torch.float16  # as choose_precision decides for fp16 weights: loss scaling
        policy = policy_from_model(model, tokenizer, model_cfg, seed=seed)
    else:
        caps = detect_capabilities()
        dtype, use_scaler, dtype_why = choose_precision(model_cfg.dtype, on_cuda,
                                                        bool(caps.get("bf16_supported")) and on_cuda,
                                                        full_finetune=not model_cfg.lora)
        attn, attn_why = choose_attention(model_cfg.attn_implementation, bool(caps.get("flash_attn_importable")),
                                          caps.get("compute_capability") if on_cuda else None, dtype)
        if os.environ.get("RANK", "0") == "0":  # one line per run, not per data-parallel process
            print(f"precision: {dtype} ({dtype_why}); attention: {attn} ({attn_why})")
        try:
            policy = load_policy(model_cfg, dtype=dtype, attn_implementation=attn, seed=seed, tiny_corpus=list(corpus))
        except (OSError, ValueError, ImportError, pickle.UnpicklingError, EOFError) as e:
            raise model_load_error(model_cfg.name, e) from None
    policy.grad_scaler = torch.amp.GradScaler("cuda") if use_scaler and on_cuda else None
    if model_cfg.compile:
        # In place (parameter names unchanged, so checkpoints stay compatible); dynamic shapes because every
        # step has other prompt and completion lengths. Off by default: not yet measured to pay.
        policy.model.compile(dynamic=True)
        print("model.compile: the model forward is compiled with torch.compile(dynamic=True)")
    if not model_cfg.load_in_4bit:
        policy.model.to(device)
        if policy.ref_model is not None:
            policy.ref_model.to(device)
    return policy


def check_sharding(cfg: C.Config, policy: Policy, dist: Dist) -> None:
    """What FSDP sharding supports: full fine-tuning in bf16 / fp32 with the summed loss."""
    problems = [why for bad, why in [
        (cfg.model.lora or cfg.model.load_in_4bit, "LoRA / QLoRA (model.lora=false: sharding is for full fine-tuning; "
                                                   "an adapter fits every process, use train.sharding=none)"),
        (cfg.multi.combine != "sum", "per-task gradient surgery (multi.combine=sum)"),
        (policy.grad_scaler is not None, "fp16 loss scaling (model.dtype=bfloat16 or float32)"),
        (cfg.sft.steps > 0 and cfg.sft.batch_size % dist.world != 0,
         f"an SFT batch that does not split evenly over {dist.world} processes (sft.batch_size)")] if bad]
    if problems:
        raise C.ConfigError("train.sharding=fsdp does not support " + "; ".join(problems), field="train.sharding")


def choose_graph_memory(cfg: C.Config, policy: Policy, device: torch.device, announce: bool) -> None:
    """What the graph engine may hold on a GPU, decided once from the memory estimate and recorded on the model's
    graph step (grpo/decoding/graph_decode.py): rollout.fold_lora=auto folds LoRA for the rollouts where the copy leaves
    the step's peak where it is (`lora_fold_choice`; on / off need no decision, the CPU folds: host memory, nothing to
    estimate), and the decoding buffers kept between rollouts are what the step's peak phase leaves free
    (`graph_cache_choice`). Printed once."""
    from grpo.decoding.graph_decode import graph_step_for
    from grpo.phases.generate import choose_engine
    from grpo.run.assembly.memory_inputs import graph_cache_choice, lora_fold_choice

    if device.type != "cuda" or choose_engine(policy.model, cfg.rollout.engine, cfg.rollout.cache_implementation,
                                              cfg.train.sharding == "fsdp") != "graph":
        return
    graph = graph_step_for(policy.model)
    capability = torch.cuda.get_device_capability(device)
    graph.keep_bytes, kept = graph_cache_choice(cfg, capability)
    if announce:
        print(f"graph engine: decoding buffers {kept}")
    if policy.is_lora and cfg.rollout.fold_lora == "auto":
        fold, why = lora_fold_choice(cfg, capability)
        graph.fold_auto = fold
        if announce:
            print(f"rollout.fold_lora=auto: {'folded' if fold else 'not folded'} for rollouts ({why})")


def check_precision(multi: C.MultiConfig, policy: Policy) -> None:
    """multi.combine other than sum needs bf16 or fp32 weights: the per-task gradients are not loss-scaled."""
    if policy.grad_scaler is not None and multi.combine != "sum":
        raise C.ConfigError(f"multi.combine={multi.combine!r} needs bf16 or fp32 weights: the per-task gradients are "
                            "not loss-scaled, so fp16 (this GPU has no bf16) would under- or overflow; use "
                            "multi.combine=sum or model.dtype=float32", field="multi.combine")


def check_model_available(model: C.ModelConfig) -> None:
    """Before any work: a packaged model whose package is missing (ModelPackageMissing, with the pip command), 4-bit
    weights without bitsandbytes or a CUDA GPU (a ConfigError naming model.load_in_4bit)."""
    check_model_name(model.name)
    if model.load_in_4bit:
        check_4bit_available()
