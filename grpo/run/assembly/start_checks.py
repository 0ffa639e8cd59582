"""What a run checks before its model loads, besides the config, the data and the graders: settings that cannot act
in this run (named in a note, not refused: the run is still what was asked, less a no-op), and LoRA target modules
the model does not have.

    check_start(cfg, run_dir, ...)   all of them, the output folder and the disk space, in grpo_train.setup
    inert_settings(cfg, device)          the notes, one line each, naming the setting and why it does nothing here
    check_lora_targets(model)            model.lora_target_modules against the architecture's module names, where known
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any, Mapping

from grpo import config as C
from grpo.run.assembly.disk_plan import disk_line
from grpo.run.checkpoint.folder import check_final_model_dir
from grpo.run.trl.record_tables import ALL_LINEAR, model_architecture
from grpo.run.trl.vocabulary import in_user_terms

OTHER_TARGETS = ("embed_tokens", "lm_head")
"""Modules besides the decoder's linear layers that peft may adapt in the architectures of ALL_LINEAR."""


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
                   f"(rollout.engine={rollout.engine}"
                   f"{'' if rollout.engine == engine else ': the static cache or FSDP'})")
            notes.append(f"rollout.fold_lora={rollout.fold_lora} does nothing in this run: only the graph engine "
                         f"folds LoRA, and {why}")
    omp = os.environ.get("OMP_NUM_THREADS")
    if omp is not None and not (omp.strip().isdigit() and int(omp) >= 1):
        notes.append(f"OMP_NUM_THREADS={omp!r} is not a whole number >= 1: OpenMP ignores it and the thread count "
                     "falls back to its default; set a number (e.g. OMP_NUM_THREADS=2) or unset it (train.threads "
                     "sets this run's torch threads)")
    if rollout.sampling_rng == "global" and engine == "graph":
        notes.append("rollout.sampling_rng=global under rollout.engine=graph: the graph engine always samples with "
                     "its per-row sampler (grpo/decoding/sampling.py), each row's key drawn from torch's RNG; "
                     "transformers' sampler, which global means on the lean and hf engines, is not used")
    return notes


def warmup_beyond_run(cfg: C.Config, train_rows: Mapping[str, list], world: int) -> str:
    """A note when train.warmup_steps reaches the RL phase's last optimizer step (max_steps x loss.mu, the steps
    counted from the rows as the run counts them): the learning rate would climb all run and never reach train.lr,
    a run at a fraction of the rate asked for. "" otherwise."""
    if not cfg.train.warmup_steps:
        return ""
    from grpo.run.assembly.samples import with_epochs

    try:
        counted = with_epochs(cfg, train_rows, world, announce=False)
    except (ValueError, OSError):  # the rows' own errors are named where they are loaded
        return ""
    updates = counted.train.max_steps * cfg.loss.mu
    if cfg.train.warmup_steps < updates:
        return ""
    return (f"train.warmup_steps={cfg.train.warmup_steps} is not below this run's {updates} optimizer steps: the "
            f"learning rate climbs all run and ends at {updates / cfg.train.warmup_steps:.2g} x train.lr; use fewer "
            f"warm-up steps (e.g. {max(1, updates // 10)}) or 0")


def check_lora_targets(model: C.ModelConfig) -> None:
    """A plain module name in model.lora_target_modules that the model's architecture does not have (where it is
    known here: builtin:tiny, the packaged models, a local folder's config.json of an architecture of ALL_LINEAR) is a
    ConfigError naming the field and the modules it has, before the model loads; peft's own error would come after
    the weights loaded and blame model.name. Suffixes ("self_attn.q_proj") and patterns are left to peft."""
    if not model.lora:
        return
    try:
        kind = model_architecture(model.name)
    except (OSError, ValueError):  # a config.json that cannot be read: the model's load names it
        return
    if kind not in ALL_LINEAR:
        return
    known = [*ALL_LINEAR[kind], *OTHER_TARGETS]
    plain = [t for t in model.lora_target_modules if re.fullmatch(r"\w+", t) and t != "all-linear"]
    unknown = [t for t in plain if t not in known]
    if unknown:
        raise C.field_error("model.lora_target_modules", model.lora_target_modules,
                            f"{model.name} ({kind}) has no module named {unknown}{C.did_you_mean(unknown, known)}: "
                            f"its linear layers are {ALL_LINEAR[kind]} (TRL's lora_target_modules sets this field)")


def check_start(cfg: C.Config, run_dir: Path, device: Any, announce: bool, train_rows: Mapping[str, list],
                world: int) -> str:
    """What grpo_train.setup checks before the run folder is made and the model loads, beside the data and the
    graders: each setting that cannot act printed as a note (`announce`: this process speaks for the run), LoRA
    targets the model lacks refused, checkpoint.final_model_dir (TRL's output_dir) refused when it holds what no run
    wrote (grpo/run/checkpoint/folder.py: `check_final_model_dir`), and what the run will write against the free disk
    space (grpo/run/assembly/disk_plan.py; `train_rows` and `world`, the draws a step, count its steps). Returns the
    banner's disk line ("" where this process does not speak)."""
    for line in inert_settings(cfg, device) if announce else []:
        print(f"note: {line}", file=sys.stderr)
    check_lora_targets(cfg.model)  # before the weights load: peft's own error would come after them
    if cfg.checkpoint.final_model_dir:  # never written over a model, a dataset or another run's files
        check_final_model_dir(cfg.checkpoint.final_model_dir, run_dir, cfg.model.name)
    if not announce:
        return ""
    warmup = warmup_beyond_run(cfg, train_rows, world)
    if warmup:
        print(f"note: {in_user_terms(warmup, C.to_dict(cfg))}", file=sys.stderr)
    disk = disk_line(cfg, train_rows, run_dir, getattr(device, "type", str(device)), world)
    if "warning" in disk:
        print(disk, file=sys.stderr)
    return disk
