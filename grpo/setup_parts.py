"""Building a run's parts from config sections: device, data, policy, rewards, judge, trackers, stop tokens.

The entry point hands each function one config section (or plain values); nothing here reads a global.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Iterable

import torch

from grpo.records import Sample


def choose_device(requested: str) -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"train.device={requested!r} but no CUDA GPU is visible: use train.device=cpu or auto")
    return torch.device(requested)


def load_samples(data, seed: int) -> list[Sample]:
    """All samples of the configured source (`data` is the DataConfig section)."""
    from grpo.data import DataSpec, load_task

    if data.source == "demo":
        from grpo.demo_tasks import make_demo_samples

        return _with_system(make_demo_samples(data.demo_size, seed=seed), data.system_prompt)
    specs: list[DataSpec] = []
    system = data.system_prompt or None
    if data.source == "dual":
        root = Path(data.data_dir)
        if not (root / "bbq").is_dir() and not (root / "halueval").is_dir():
            raise FileNotFoundError(f"data.data_dir={str(root)!r} holds neither bbq/ nor halueval/: point it at the "
                                    "folder with bbq/<Category>.jsonl and halueval/<subset>_data.json")
        specs.append(DataSpec(kind="bbq", path=str(root / "bbq"), categories=tuple(data.bbq_categories),
                              n_per_category=data.bbq_per_category, seed=seed, system_prompt=system))
        for subset in data.halueval_subsets:
            path = root / "halueval" / f"{subset}_data.json"
            if not path.exists():
                print(f"note: HaluEval subset {subset!r} skipped: {path} does not exist", file=sys.stderr)
                continue
            specs.append(DataSpec(kind="halueval", path=str(path), subset=subset, limit=data.halueval_per_subset,
                                  max_doc_chars=data.max_document_chars, system_prompt=system))
    else:
        path = Path(data.source)
        if not path.exists():
            raise FileNotFoundError(f"data.source={data.source!r} is neither 'demo', 'dual' nor an existing file")
        specs.append(DataSpec(kind="jsonl", path=str(path), system_prompt=system))
    samples: list[Sample] = []
    for spec in specs:
        loaded, counts = load_task(spec)
        samples += loaded
    if not samples:
        raise ValueError(f"data.source={data.source!r} produced no samples")
    return samples


def _with_system(samples: list[Sample], system_prompt: str) -> list[Sample]:
    if not system_prompt:
        return samples
    from dataclasses import replace

    return [replace(s, messages=({"role": "system", "content": system_prompt},) + tuple(s.messages))
            for s in samples]


def policy_from_config(model_cfg, device: torch.device, corpus: Iterable[str], seed: int):
    """Load the policy named by the model section, with precision and attention chosen for this machine."""
    from grpo.hardware import choose_attention, choose_precision, detect_capabilities
    from grpo.modeling import load_policy

    caps = detect_capabilities()
    on_cuda = device.type == "cuda"
    dtype, use_scaler, dtype_why = choose_precision(model_cfg.dtype, on_cuda, bool(caps.get("bf16_supported")) and on_cuda,
                                                 full_finetune=not model_cfg.lora)
    attn, attn_why = choose_attention(model_cfg.attn_implementation, bool(caps.get("flash_attn_importable")),
                                      caps.get("compute_capability") if on_cuda else None, dtype)
    if os.environ.get("RANK", "0") == "0":  # one line per run, not per data-parallel process
        print(f"precision: {dtype} ({dtype_why}); attention: {attn} ({attn_why})")
    tiny = {"hidden": model_cfg.tiny_hidden, "layers": model_cfg.tiny_layers, "heads": model_cfg.tiny_heads,
            "kv_heads": max(1, model_cfg.tiny_heads // 2), "vocab_size": model_cfg.tiny_vocab}
    policy = load_policy(model_cfg.name, dtype=dtype, attn_implementation=attn, lora=model_cfg.lora,
                         lora_r=model_cfg.lora_r, lora_alpha=model_cfg.lora_alpha,
                         lora_dropout=model_cfg.lora_dropout, lora_target_modules=model_cfg.lora_target_modules,
                         load_in_4bit=model_cfg.load_in_4bit, gradient_checkpointing=model_cfg.gradient_checkpointing,
                         trust_remote_code=model_cfg.trust_remote_code, seed=seed, tiny_corpus=list(corpus),
                         tiny_sizes=tiny)
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


def parse_reward_spec(task: str, text: str) -> tuple[list[tuple[str, float]], str | None]:
    """"grader:w,module:fn:w|fallback" -> ([(grader, w), ...], fallback). A term without :w has weight 1."""
    body, _, fallback = text.partition("|")
    terms = []
    for part in (p.strip() for p in body.split(",") if p.strip()):
        name, _, weight = part.rpartition(":")
        try:
            terms.append((name, float(weight)) if name else (part, 1.0))
        except ValueError:
            terms.append((part, 1.0))
    if not terms:
        raise ValueError(f"rewards.{task}={text!r}: give grader:weight terms, e.g. bbq_rule:1.0,format:0.2")
    return terms, (fallback.strip() or None)


def reward_specs(source: str, rewards: dict[str, str], tasks: list[str]) -> dict[str, Any]:
    """A RewardSpec per task: config entries first, then the source's defaults."""
    from grpo.demo_tasks import DEMO_REWARDS
    from grpo.scoring import RewardSpec

    defaults = DEMO_REWARDS if source == "demo" else {"fairness": "bbq_rule:1.0,format:0.2",
                                                      "hallucination": "halueval_rule:1.0,format:0.2"}
    specs = {}
    for task in tasks:
        text = rewards.get(task) or defaults.get(task)
        if text is None:
            raise ValueError(f"task {task!r} has no reward terms: add rewards.{task}=grader:weight "
                             f"(e.g. --set rewards.{task}=my_module:my_grader:1.0)")
        terms, fallback = parse_reward_spec(task, text)
        specs[task] = RewardSpec(task=task, terms=terms, fallback=fallback)
    return specs


def build_trackers(train_cfg, run_dir: Path):
    from grpo.tracking import make_trackers

    return make_trackers(run_dir, tensorboard=train_cfg.tensorboard, wandb_project=train_cfg.wandb_project or None)


def stop_token_ids(rollout_cfg, tokenizer) -> tuple[int, ...]:
    """The ids that end a rollout: the tokenizer's end-of-turn / EOS token, then each of rollout.stop_strings
    (each must be one token of the tokenizer), without repeats."""
    from grpo.tokens import stop_token_id

    stops = [stop_token_id(tokenizer)]
    for text in rollout_cfg.stop_strings:
        ids = tokenizer.convert_tokens_to_ids(text)
        if ids is None or ids == tokenizer.unk_token_id:
            encoded = tokenizer.encode(text, add_special_tokens=False)
            if len(encoded) != 1:
                raise ValueError(f"rollout.stop_strings entry {text!r} is {len(encoded)} tokens; each stop must be "
                                 "exactly one token of the tokenizer")
            ids = encoded[0]
        stops.append(int(ids))
    return tuple(dict.fromkeys(stops))
