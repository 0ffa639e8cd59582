"""What a run will write, estimated before its model loads from the parameter count (no weights read), and checked
against the free space of each file system it writes to: a run that cannot fit is refused with the numbers and
the fix, not found out after hours of training when its final save fails; a thin margin is a warning.

    bytes_per_weight     = 4 (float32), 2 (bfloat16 / float16; auto: 2 on a GPU, 4 on the CPU)
    model save           = weights x bytes_per_weight + tokenizer (the full model), or the LoRA adapter in float32
    checkpoint           = trainable weights + AdamW's two moments, x bytes_per_weight of the trainable weights
    reference            = the whole model (after an SFT warm-up that has rows with targets: checkpoints/reference)
    checkpoints on disk  = checkpoint.keep_last (0: every one: max_steps // checkpoint.every, + the final one),
                           + 1 while the next is written and before the oldest is deleted
    Pareto points        = a model save per evaluation offered (every train.eval_every, and after RL), at most
                           multi.pareto_cap + 1 at once (a new point is saved before a crowded one is dropped)
    final model          = a model save in <run folder>/final, and one more in checkpoint.final_model_dir
    best model           = a model save in <run folder>/best under checkpoint.keep_best
    metrics              = METRICS_BYTES_PER_STEP a step, EVAL_BYTES_PER_ROW a held-out row an evaluation, a plot

A resumed run counts what its run folder holds already as written. The parameter count comes from the model's
shape (grpo/run/assembly/memory_inputs.resolve_shape: builtin:tiny, a local folder's config.json, the bundled Hub
shapes); a model whose shape is not known here gets no estimate (and the banner no disk line).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from grpo import config as C

MB = 1e6
METRICS_BYTES_PER_STEP = 16 * 1024
"""metrics.jsonl, metrics.csv, TensorBoard's events and the sampled completions of an RL step, on average: the demo
writes ~12 KB a step (benchmarks aside; scripts/demo_fingerprint.py's run folder)."""
EVAL_BYTES_PER_ROW = 1024
"""evals/<tag>.jsonl a held-out row an evaluation (the greedy completion and its grades): the demo's ~0.6 KB."""
PLOT_BYTES = 1 << 20
"""plot.png and report.json."""
TOKENIZER_BYTES_PER_TOKEN = 80
"""tokenizer.json and its companions a vocabulary entry (Llama-3's 128k tokens: ~9 MB)."""
THIN_MARGIN = 0.25
"""A run whose writes leave less than this share of them free on a file system gets a warning (others write too)."""
THIN_MARGIN_MIN = 256 * 2**20
"""... or less than this many bytes."""


class DiskSpaceError(OSError):
    """A run's planned writes do not fit in the free space of a file system it writes to; the message has the
    numbers and the fix."""


@dataclass
class DiskPlan:
    """What the run writes where: parts (name -> bytes) for the message, and bytes per folder it writes into."""

    parts: dict[str, float] = field(default_factory=dict)
    folders: dict[Path, float] = field(default_factory=dict)
    flat: set[Path] = field(default_factory=set)
    """Folders written at their top only (checkpoint.final_model_dir, which may hold the run folder itself)."""

    def total(self) -> float:
        return sum(self.folders.values())

    def describe(self) -> str:
        return ", ".join(f"{name} {size / MB:.1f} MB" for name, size in self.parts.items() if size)


def _weight_bytes(dtype: str, device_type: str) -> int:
    if dtype in ("bfloat16", "float16"):
        return 2
    return 2 if dtype == "auto" and device_type == "cuda" else 4


def _counts(model: C.ModelConfig) -> tuple[int, int, int]:
    """(all weights, trainable weights, vocabulary) from the model's shape; ValueError when it is not known here."""
    from grpo.machine.memory_estimate import lora_param_count, param_counts
    from grpo.run.assembly.memory_inputs import resolve_shape

    shape = resolve_shape(model)
    total = param_counts(shape)["total"]
    if not model.lora:
        return total, total, shape.vocab
    return total, lora_param_count(shape, model.lora_r, model.lora_target_modules), shape.vocab


def _saves(every: int, steps: int) -> int:
    """How many checkpoints a run of `steps` RL steps writes: every `every` steps (0: none) and the final one."""
    return (steps // every if every else 0) + 1


def plan_writes(cfg: C.Config, train_rows: Mapping[str, list], run_dir: Path, device_type: str) -> DiskPlan:
    """The bytes `cfg`'s run writes (module docstring) into `run_dir` and checkpoint.final_model_dir; ValueError when
    the model's shape is not known here. `cfg` has its steps counted from the rows (samples.with_epochs)."""
    total, trainable, vocab = _counts(cfg.model)
    per = _weight_bytes(cfg.model.dtype, device_type)
    tokenizer = vocab * TOKENIZER_BYTES_PER_TOKEN
    model_save = (trainable * 4 if cfg.model.lora else total * per) + tokenizer
    checkpoint = 3 * trainable * (4 if cfg.model.lora else per)
    steps, keep = cfg.train.max_steps, cfg.checkpoint.keep_last
    saves = _saves(cfg.checkpoint.every, steps)
    kept = saves if not keep or saves <= keep else keep + 1
    offers = (steps // cfg.train.eval_every if cfg.train.eval_every else 0) + 1
    heldout_rows = cfg.data.eval_size * max(1, len(train_rows))
    evaluations = offers + 2  # before and after the warm-up too
    has_targets = any(getattr(s, "target", None) for rows in train_rows.values() for s in rows)
    plan = DiskPlan(parts={
        "final model": model_save,
        "reference": total * per if cfg.sft.steps and has_targets else 0,
        f"checkpoints ({kept} at once)": kept * checkpoint,
        f"Pareto points ({min(offers, cfg.multi.pareto_cap + 1)} at most)": min(offers, cfg.multi.pareto_cap + 1)
        * model_save,
        f"metrics and evaluations of {steps} RL steps (train.max_steps)": (steps * METRICS_BYTES_PER_STEP
                                                                           + evaluations * heldout_rows
                                                                           * EVAL_BYTES_PER_ROW + PLOT_BYTES)})
    if cfg.checkpoint.keep_best:  # the best evaluation's weights, kept until the final model is written
        plan.parts["best model (best/)"] = model_save
    plan.folders[run_dir] = sum(plan.parts.values())
    if cfg.checkpoint.final_model_dir:
        from grpo.run.checkpoint.folder import expand_home

        folder = expand_home(cfg.checkpoint.final_model_dir)
        plan.parts["final model in checkpoint.final_model_dir"] = model_save
        # TRL's checkpoint-N (grpo/run/checkpoint/trl_folders.py)
        trl = kept * model_save if cfg.checkpoint.every else 0
        if trl:
            plan.parts[f"checkpoint-N folders in checkpoint.final_model_dir ({kept} at once)"] = trl
        plan.folders[folder] = plan.folders.get(folder, 0) + model_save + trl
        plan.flat.add(folder)
    return plan


def _existing(path: Path) -> Path:
    """`path`, or its nearest parent that exists (where a folder not yet made will be)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _written(folder: Path, flat: bool) -> float:
    """Bytes a run folder holds already (a resumed run's checkpoints, reference, Pareto points); `flat`: the files
    at its top only."""
    if not folder.is_dir():
        return 0.0
    files = folder.iterdir() if flat else folder.rglob("*")
    return float(sum(p.stat().st_size for p in files if p.is_file() and not p.is_symlink()))


def check_disk(plan: DiskPlan, resume: bool) -> str:
    """DiskSpaceError when a folder it writes to is read-only, or the planned writes into the folders of one file
    system exceed its free space; else the plan's line for the banner (with a warning when the margin is thin)."""
    by_device: dict[int, tuple[Path, float]] = {}
    for folder, size in plan.folders.items():
        if resume:  # what the run folder holds already is counted as written
            size = max(size - _written(folder, folder in plan.flat), 0.0)
        where = _existing(folder)
        if not os.access(where, os.W_OK):  # a read-only file system or folder: no amount of free space helps
            raise DiskSpaceError(f"{where} is read-only for this process (the run would write {folder} there): "
                                 "choose another train.output_dir (or checkpoint.final_model_dir) on a file system "
                                 "it can write to")
        device = os.stat(where).st_dev
        shown, before = by_device.get(device, (folder, 0.0))
        by_device[device] = (shown, before + size)
    lines = []
    for shown, need in by_device.values():
        free = shutil.disk_usage(_existing(shown)).free
        if need > free:
            raise DiskSpaceError(f"not enough disk space: this run will write about {need / MB:.1f} MB under "
                                 f"{shown} ({plan.describe()}), and that file system has {free / MB:.1f} MB free. "
                                 "Free space there, choose another train.output_dir, or write less: fewer "
                                 "train.max_steps, a smaller checkpoint.keep_last or checkpoint.every 0 (only the "
                                 "final checkpoint), a smaller multi.pareto_cap, train.eval_every 0, model.lora=true")
        thin = free - need < max(THIN_MARGIN * need, THIN_MARGIN_MIN)
        lines.append(f"{need / MB:.1f} MB under {shown} ({free / MB:.1f} MB free"
                     + (": warning, a thin margin: the run may run out of space if anything else writes there)"
                        if thin else ")"))
    return f"disk: this run writes about {plan.total() / MB:.1f} MB ({plan.describe()}): " + "; ".join(lines)


def disk_line(cfg: C.Config, train_rows: Mapping[str, list], run_dir: Path, device_type: str, world: int) -> str:
    """The disk check of grpo_train.setup, before the model loads: the plan's line (for the banner), a
    DiskSpaceError when it cannot fit, or "" when there is no estimate (a model whose shape is not known here before
    it loads: the banner has nothing to say of it)."""
    from grpo.run.assembly.samples import with_epochs

    try:
        counted = with_epochs(cfg, train_rows, world, announce=False)  # steps from the rows, as the run counts them
        plan = plan_writes(counted, train_rows, run_dir, device_type)
    except (ValueError, OSError):  # a shape not known here (a Hub id not bundled): nothing to estimate from
        return ""
    try:
        return check_disk(plan, bool(cfg.checkpoint.resume))
    except DiskSpaceError as err:  # its advice in the fields the user wrote (TRL's where a TRL config set them)
        from grpo.run.trl.vocabulary import in_user_terms

        raise DiskSpaceError(in_user_terms(str(err), C.to_dict(cfg))) from None

