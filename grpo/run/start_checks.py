"""What a run checks before its model loads, besides the config, the data and the graders: settings that cannot act
in this run (named in a note, not refused: the run is still what was asked, less a no-op).

    inert_settings(cfg, device)     the notes, one line each, naming the setting and why it does nothing here
"""

from __future__ import annotations

from typing import Any

from grpo import config as C


def _engine(rollout: C.RolloutConfig, sharding: str, device_type: str) -> str | None:
    """The decoding engine this run will use where the config alone tells it (grpo/phases/generate.choose_engine),
    else None (auto on a GPU: the model decides between graph, lean and hf)."""
    if rollout.engine in ("hf", "lean", "graph"):
        return rollout.engine
    if rollout.cache_implementation != "dynamic" or sharding == "fsdp":
        return "hf"
    return "lean" if device_type != "cuda" else None


def inert_settings(cfg: C.Config, device: Any) -> list[str]:
    """One note per setting that cannot act in this run: the graph engine's settings under another engine or without
    what they act on (rollout.fold_lora without LoRA, or with the lean / hf engine), rollout.sampling_rng=global
    under the graph engine (it samples with its own per-row sampler whatever it says)."""
    rollout, notes = cfg.rollout, []
    engine = _engine(rollout, cfg.train.sharding, getattr(device, "type", str(device)))
    if rollout.fold_lora != "auto":
        if not cfg.model.lora:
            notes.append(f"rollout.fold_lora={rollout.fold_lora} does nothing in this run: it folds LoRA adapters for "
                         "the graph engine's rollouts, and this run trains without LoRA (model.lora=false)")
        elif engine in ("lean", "hf"):
            why = ("rollout.engine=auto picks it on a CUDA GPU only, and this run is on the CPU"
                   if rollout.engine == "auto" and engine == "lean" else f"this run decodes with the {engine} engine "
                   f"(rollout.engine={rollout.engine}{'' if rollout.engine == engine else ': the static cache or FSDP'})")
            notes.append(f"rollout.fold_lora={rollout.fold_lora} does nothing in this run: only the graph engine "
                         f"folds LoRA, and {why}")
    if rollout.sampling_rng == "global" and engine == "graph":
        notes.append("rollout.sampling_rng=global under rollout.engine=graph: the graph engine always samples with "
                     "its per-row sampler (grpo/models/sampling.py), each row's key drawn from torch's RNG; "
                     "transformers' sampler, which global means on the lean and hf engines, is not used")
    return notes
