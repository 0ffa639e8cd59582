"""GRPOConfig's rules: the converter of each TABLE row that does more than copy its value
(grpo/run/trl/config_table.py), with the mappings they read (TRL's loss_type and importance_sampling_level in
grpo-dual's loss terms).

A converter gets (the field's value, every TRL field's value, the grpo-dual config tree being built, the notes) and
sets what the field means, refuses a value it cannot honour by name with why (ConfigError), or applies what
grpo-dual does that is close and names it in a note (grpo/run/trl/rows.py: the machinery every table shares).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

from grpo import config as C
from grpo.core.advantages import ADV_SCALES
from grpo.core.losses import POLICY_LOSSES
from grpo.run.trl.rows import Converter, _name, _set, error, note, on_cpu

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
COUNTS = {"per_device_train_batch_size": "completions in a micro-batch",
          "gradient_accumulation_steps": "micro-batches an optimizer step", "num_generations": "completions a prompt",
          "num_iterations": "optimizer steps a generation"}
"""The TRL counts the batch and step arithmetic divides by or multiplies with: each must be a whole number >= 1."""


def _counts(fields: Mapping[str, Any]) -> None:
    """ConfigError naming the first of COUNTS below 1, before any arithmetic reads it."""
    for name, what in COUNTS.items():
        if int(fields[name]) < 1:
            raise _error(name, fields[name], f"it counts {what}: use a whole number >= 1")


def _batch(value: int, fields: Mapping[str, Any], out: dict, notes: list) -> None:
    _counts(fields)
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
    if n <= 0:
        raise _error(field, n, "it counts optimizer steps between two of them: use a whole number >= 1")
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
        _note(notes, "warmup_steps", fields["warmup_steps"],
              "TRL's constant schedule has no warm-up; neither has this run "
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
    if fields["fp16"] and on_cpu(fields):  # fp16 training needs a CUDA GradScaler (grpo/machine/hardware.py)
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
    if name in ("loss", None) and value:  # transformers' default under load_best_model_at_end (a GRPOConfig holds
        # it set; a file or dict leaves it unset, which transformers reads as the loss)
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
    if "wandb" in names:  # named here, in the user's words: train.wandb_project is not what they wrote
        from grpo.run.tracking import WANDB_NO_KEY, wandb_can_log, wandb_installed

        if not wandb_installed():
            raise _error("report_to", value, "Weights & Biases is not installed here: `pip install wandb`, or leave "
                         "wandb out of report_to")
        if not wandb_can_log():
            raise _error("report_to", value, f"{WANDB_NO_KEY}; or leave wandb out of report_to")
    _set(out, "train.wandb_project", str(fields["project"]) if names & {"wandb"} else "")
    if "all" in names:
        _note(notes, "report_to", value, "TensorBoard only (W&B: report_to=[tensorboard, wandb])")


def _entropy_coef(value: float, fields: Mapping[str, Any], out: dict, notes: list) -> None:
    _set(out, "loss.entropy_coef", float(value))
    mode = LOSS_TYPE_AGG.get(fields["loss_type"])
    if (value or fields["use_adaptive_entropy"]) and mode not in (None, "token-mean"):
        _note(notes, "entropy_coef", value,
              f"applied, the entropy bonus averaged as the loss is (loss.agg_mode={mode}, "
              f"verl's rule); TRL averages it over the completion tokens whatever the loss_type, so under "
              f"loss_type={fields['loss_type']} the bonus differs (a token-mean loss_type, e.g. dapo, averages both "
              "alike)")


def _adaptive_entropy(value: bool, fields: Mapping[str, Any], out: dict, notes: list) -> None:
    # TRL: entropy_target applies only with use_adaptive_entropy; ours: a target turns the control on
    _set(out, "loss.entropy_target", float(fields["entropy_target"]) if value else None)


def _entropy_target(value: float, fields: Mapping[str, Any], out: dict, notes: list) -> None:
    if not fields["use_adaptive_entropy"] and value != 0.2:
        _note(notes, "entropy_target", value, "not applied: TRL reads it only with use_adaptive_entropy=true")
