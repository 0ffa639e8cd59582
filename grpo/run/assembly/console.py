"""What a run says on the console before it starts: the banner (model, batch arithmetic, loss, tasks, the GPU memory
estimate) and, for a run of your own tasks, which preset's settings they train with."""

from __future__ import annotations

from typing import Mapping, Sequence

import torch

from grpo import config as C
from grpo.config.presets import CUSTOM_PRESET
from grpo.core.step_types import Sample
from grpo.machine.memory_estimate import estimate
from grpo.models.tokens import raw_prompt
from grpo.run.assembly.memory_inputs import inputs_from_config
from grpo.run.record import Run
from grpo.run.trl.vocabulary import in_user_terms


def warm_up(sft_steps: int, training: Mapping[str, Sequence[Sample]]) -> str:
    """What the SFT warm-up will do in this run: its steps, or why there is none (sft.steps=0, or no training row
    with a target: the warm-up then skips, grpo_train.sft_phase)."""
    if not sft_steps:
        return "no SFT warm-up"
    if not any(s.target for rows in training.values() for s in rows):
        return "no SFT warm-up (no training row has a target)"
    return f"SFT {sft_steps} steps"


def preset_note(cfg: C.Config, training: Mapping[str, Sequence[Sample]]) -> str | None:
    """For a run with tasks.<task> sources: which preset's settings they train with, what will run (`training`: the
    training rows by task, which decide the warm-up), and how to change them (else a custom task silently inherits
    settings chosen for another preset's tasks, e.g. the demo's 4-token answers)."""
    if not cfg.tasks:
        return None
    change = (f"override any of them, e.g. rollout.max_new_tokens={2 * cfg.rollout.max_new_tokens}"
              if cfg.preset == CUSTOM_PRESET else f"--preset {CUSTOM_PRESET} starts from settings made for your own "
                                                  "tasks")
    steps = (f"train.num_epochs={cfg.train.num_epochs:g}" if cfg.train.num_epochs else
             f"train.max_steps={cfg.train.max_steps}")
    source = ("the TRL config (docs/TRL.md) and, for the rest, preset " if cfg.data.prompt_format == "trl"
              else "preset ")  # prompt_format trl: set by a GRPOConfig
    return in_user_terms(f"tasks {', '.join(sorted(cfg.tasks))}: the settings of {source}{cfg.preset!r} apply: "
                         f"rollout.k={cfg.rollout.k}, rollout.max_new_tokens={cfg.rollout.max_new_tokens}, "
                         f"train.lr={cfg.train.lr:g}, {steps}, {warm_up(cfg.sft.steps, training)}; {change} "
                         "(docs/CUSTOM_TASKS.md)", C.to_dict(cfg))


def template_less(run: Run) -> dict[str, float]:
    """data/<task>/raw_prompts: the share of each task's training rows whose prompt is a plain string tokenized
    without the chat template the model has (data.prompt_format=trl, TRL's standard format), for the tasks that have
    such rows; {} for a tokenizer without a template. The doctor reads it (grpo/run/doctor/window_checks.py,
    empty_completions and template_less_prompts)."""
    if getattr(run.tokenizer, "chat_template", None) is None:
        return {}
    shares = {task: sum(map(raw_prompt, rows)) / len(rows) for task, rows in run.samples.training.items() if rows}
    return {f"data/{task}/raw_prompts": share for task, share in shares.items() if share}


def template_note(shares: Mapping[str, float], model: str) -> str:
    """The start's one line on `template_less`'s shares: what it does to the run and the fix."""
    tasks = ", ".join(key.split("/")[1] for key in shares)
    return (f"note: the prompts of {tasks} are plain strings and {model} has a chat template: they are tokenized "
            "without it, as TRL does for standard-format data, and an instruct model often replies nothing to raw "
            'text; give them as conversations ([{"role": "user", "content": text}]) or set data.prompt_format=chat')


def banner(run: Run) -> str:
    cfg, p = run.cfg, run.policy
    n_train = sum(x.numel() for x in p.trainable_parameters())
    n_all = sum(x.numel() for x in p.model.parameters())
    lines = [f"grpo-dual | preset {cfg.preset} | run folder {run.run_dir}",
             f"model {cfg.model.name} on {run.device} ({next(p.model.parameters()).dtype}), "
             f"{'LoRA r=%d' % cfg.model.lora_r if cfg.model.lora else 'full fine-tuning'}, "
             f"trainable {n_train:,} of {n_all:,} parameters",
             f"batch: {cfg.train.prompts_per_micro_step} prompts x K {cfg.rollout.k} x GA {cfg.train.grad_accum} "
             + (f"x {run.dist.world} processes{' (FSDP full shard)' if run.dist.sharded else ''} "
                if run.dist.active and not run.generation.split else "")
             + f"= {cfg.seqs_per_step * (1 if run.generation.split else run.dist.world)} completions per step"
             + (f", split over {run.dist.world} processes (train.split_groups)" if run.generation.split else "")
             + (f" in micro-batches of {cfg.micro_batch_seqs}" if cfg.train.micro_batch_size else "")
             + f", {cfg.rollout.max_new_tokens} new tokens max",
             f"loss {cfg.loss.policy_loss}, agg {cfg.loss.agg_mode}, KL {cfg.loss.kl_estimator}, mu {cfg.loss.mu}, "
             f"clip [{1 - cfg.loss.clip_low:g}, {1 + cfg.loss.clip_high:g}]",
             "tasks: " + ", ".join(f"{t} ({len(run.samples.training[t])} train / {len(run.samples.heldout.get(t, []))} "
                                   f"held out, "
                                   f"beta {cfg.kl_for(t).beta:g}, {cfg.kl_for(t).controller} controller"
                                   + (f" [{cfg.kl_for(t).band_low:g}, {cfg.kl_for(t).band_high:g}]"
                                      if cfg.kl_for(t).controller == "band" else "") + ")" for t in run.tasks)]
    plan = warm_up(cfg.sft.steps, run.samples.training)
    if cfg.sft.steps and not plan.startswith("SFT"):  # asked for, and it will not run: said before it skips
        lines.append(plan)
    lines += [line for line in (run.start.host, run.start.disk) if line]
    if run.device.type == "cuda":  # what the estimator predicts for this config, next to what the card has
        try:
            peak = estimate(inputs_from_config(cfg)).peak_bytes / 2**30
            total = torch.cuda.get_device_properties(run.device).total_memory / 2**30
            lines.append(f"GPU {torch.cuda.get_device_name(run.device)}: {total:.0f} GiB; estimated peak {peak:.1f} "
                         f"GiB "
                         "(grpo-check-gpu-memory --estimate, or python check_gpu_memory.py --estimate in a checkout, "
                         "for the breakdown)")
        except (ValueError, KeyError) as e:  # a model the estimator has no shape for
            lines.append(f"GPU memory estimate unavailable: {e}")
    return "\n".join(lines)
