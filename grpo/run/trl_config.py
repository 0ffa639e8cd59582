"""TRL's GRPOConfig in grpo-dual's terms, and config files (`--config FILE`, YAML or JSON).

A config file holds either grpo-dual's own sections (`{"rollout": {"k": 8}, "train": {"lr": 1e-5}}`, optionally
`"preset": NAME`) or TRL's flat GRPOConfig fields (`learning_rate: 1e-6`, `num_generations: 8`, ...), recognised by
its keys. A GRPOConfig object (`train(..., args=GRPOConfig(...))`) or its dict goes through the same translation:

- every field that was set (in a file or dict: every key; in an object: every field whose value differs from the
  dataclass default) is translated to its grpo-dual field where one exists (TRL_FIELDS, CONVERTERS), else named in
  a ConfigError: nothing is ignored;
- fields left at TRL's defaults translate to nothing: grpo-dual's preset values apply to them (TRL's defaults are
  not grpo-dual's, e.g. learning_rate 1e-6, beta 0.0).

`reward_weights` weigh the reward functions given to `train(rewards=...)` as lists, in order, as in TRL.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping

from grpo.config import settings as C
from grpo.core.advantages import ADV_SCALES
from grpo.core.losses import POLICY_LOSSES

TRL_FIELDS: dict[str, str] = {
    "learning_rate": "train.lr", "num_generations": "rollout.k", "max_completion_length": "rollout.max_new_tokens",
    "temperature": "rollout.temperature", "top_p": "rollout.top_p", "repetition_penalty": "rollout.repetition_penalty",
    "cache_implementation": "rollout.cache_implementation", "num_iterations": "loss.mu",
    "entropy_coef": "loss.entropy_coef", "seed": "train.seed", "weight_decay": "train.weight_decay",
    "warmup_steps": "train.warmup_steps", "max_grad_norm": "train.max_grad_norm",
    "gradient_accumulation_steps": "train.grad_accum", "logging_steps": "train.log_every",
    "eval_steps": "train.eval_every", "save_steps": "checkpoint.every", "save_total_limit": "checkpoint.keep_last",
    "output_dir": "train.output_dir", "run_name": "train.run_name",
    "gradient_checkpointing": "model.gradient_checkpointing", "trust_remote_code": "model.trust_remote_code",
    "multi_objective_aggregation": "loss.multi_objective_aggregation", "mask_truncated_completions": "loss.mask_truncated",
    "top_entropy_quantile": "loss.top_entropy_quantile", "sapo_temperature_pos": "loss.sapo_temperature_pos",
    "sapo_temperature_neg": "loss.sapo_temperature_neg", "vespo_k_pos": "loss.vespo_k_pos",
    "vespo_lambda_pos": "loss.vespo_lambda_pos", "vespo_k_neg": "loss.vespo_k_neg",
    "vespo_lambda_neg": "loss.vespo_lambda_neg", "entropy_coef_delta": "loss.entropy_coef_delta",
    "entropy_coef_min": "loss.entropy_coef_min", "entropy_coef_max": "loss.entropy_coef_max",
}
"""TRL field -> the grpo-dual field that means the same, value unchanged."""

LOSS_TYPE_AGG = {"grpo": "seq-mean-token-mean", "bnpo": "token-mean", "dapo": "token-mean",
                 "dr_grpo": "seq-mean-token-sum-norm"}
"""TRL's loss_type -> loss.agg_mode for the losses that differ from GRPO only in how token losses are averaged
(bnpo's per-process token count and dapo's global one are both our token-mean: the step's token count, counted once)."""

IS_LEVELS = {"token": "grpo", "sequence": "gspo", "sequence_token": "gspo_token"}
"""TRL's importance_sampling_level -> loss.policy_loss."""


def _set(out: dict[str, Any], dotted: str, value: Any) -> None:
    *sections, name = dotted.split(".")
    node = out
    for part in sections:
        node = node.setdefault(part, {})
    node[name] = value


def _loss_type(value: str, out: dict, fields: Mapping[str, Any]) -> None:
    if value in LOSS_TYPE_AGG:
        _set(out, "loss.agg_mode", LOSS_TYPE_AGG[value])
    elif value in POLICY_LOSSES:  # a loss of its own (cispo, sapo, ...): its ratio and its aggregation
        _set(out, "loss.policy_loss", value)
    else:
        raise C.ConfigError(f"GRPOConfig.loss_type={value!r} has no equivalent here (loss.agg_mode takes "
                            f"{sorted(LOSS_TYPE_AGG)}, loss.policy_loss {sorted(POLICY_LOSSES)})", field="loss_type")


def _is_level(value: str, out: dict, fields: Mapping[str, Any]) -> None:
    if value not in IS_LEVELS:
        raise C.ConfigError(f"GRPOConfig.importance_sampling_level={value!r}: use one of {sorted(IS_LEVELS)}",
                            field="importance_sampling_level")
    if out.get("loss", {}).get("policy_loss", "grpo") not in ("grpo", IS_LEVELS[value]):
        raise C.ConfigError(f"GRPOConfig.importance_sampling_level={value!r} with loss_type="
                            f"{fields.get('loss_type')!r}: grpo-dual's {out['loss']['policy_loss']} loss has its own "
                            "ratio", field="importance_sampling_level")
    _set(out, "loss.policy_loss", IS_LEVELS[value])


def _beta(value: float, out: dict, fields: Mapping[str, Any]) -> None:
    _set(out, "kl", {"default": {"controller": "fixed", "beta": float(value)}})  # TRL's β is one fixed number


def _epsilon_high(value: float | None, out: dict, fields: Mapping[str, Any]) -> None:
    if value is not None:
        _set(out, "loss.clip_high", float(value))


def _epsilon(value: float, out: dict, fields: Mapping[str, Any]) -> None:
    _set(out, "loss.clip_low", float(value))
    if fields.get("epsilon_high") is None:  # TRL: epsilon_high defaults to epsilon
        _set(out, "loss.clip_high", float(value))


def _scale_rewards(value: Any, out: dict, fields: Mapping[str, Any]) -> None:
    scale = {True: "group", False: "none"}.get(value, value) if isinstance(value, bool) else str(value)
    if scale not in ADV_SCALES:
        raise C.ConfigError(f"GRPOConfig.scale_rewards={value!r}: use one of {sorted(ADV_SCALES)} (or true / false)",
                            field="scale_rewards")
    _set(out, "loss.adv_scale", scale)


def _batch_size(value: int, out: dict, fields: Mapping[str, Any]) -> None:
    k = int(fields.get("num_generations", 8))  # TRL counts completions per device; we count prompts
    if value % k:
        raise C.ConfigError(f"GRPOConfig.per_device_train_batch_size={value} is not a multiple of num_generations={k}:"
                            " grpo-dual trains whole groups (train.prompts_per_micro_step prompts x rollout.k)",
                            field="per_device_train_batch_size")
    _set(out, "train.prompts_per_micro_step", value // k)


def _max_steps(value: int, out: dict, fields: Mapping[str, Any]) -> None:
    if int(value) <= 0:
        raise C.ConfigError(f"GRPOConfig.max_steps={value}: grpo-dual counts RL steps, not epochs; give max_steps > 0 "
                            "(train.max_steps)", field="max_steps")
    _set(out, "train.max_steps", int(value))


def _zero_is_off(dotted: str) -> Callable[[Any, dict, Mapping[str, Any]], None]:
    def convert(value: Any, out: dict, fields: Mapping[str, Any]) -> None:
        _set(out, dotted, 0 if value is None else value)
    return convert


def _precision(dtype: str) -> Callable[[Any, dict, Mapping[str, Any]], None]:
    def convert(value: Any, out: dict, fields: Mapping[str, Any]) -> None:
        if value:
            _set(out, "model.dtype", dtype)
    return convert


def _report_to(value: Any, out: dict, fields: Mapping[str, Any]) -> None:
    names = {value} if isinstance(value, str) else set(value or [])
    unknown = names - {"tensorboard", "none", "all"}
    if unknown:
        raise C.ConfigError(f"GRPOConfig.report_to={value!r}: {sorted(unknown)} have no equivalent here (TensorBoard "
                            "is train.tensorboard, W&B is train.wandb_project)", field="report_to")
    _set(out, "train.tensorboard", bool(names & {"tensorboard", "all"}))


def _adaptive_entropy(value: bool, out: dict, fields: Mapping[str, Any]) -> None:
    if value:  # TRL: entropy_target (default 0.2) applies only with use_adaptive_entropy; ours: a target turns it on
        _set(out, "loss.entropy_target", float(fields.get("entropy_target", 0.2)))


def _entropy_target(value: float, out: dict, fields: Mapping[str, Any]) -> None:
    if not fields.get("use_adaptive_entropy"):
        raise C.ConfigError(f"GRPOConfig.entropy_target={value} without use_adaptive_entropy=true does nothing in TRL; "
                            "set both, or neither", field="entropy_target")


CONVERTERS: dict[str, Callable[[Any, dict, Mapping[str, Any]], None]] = {
    "loss_type": _loss_type, "importance_sampling_level": _is_level, "beta": _beta, "epsilon": _epsilon,
    "epsilon_high": _epsilon_high, "scale_rewards": _scale_rewards, "per_device_train_batch_size": _batch_size,
    "max_steps": _max_steps, "top_k": _zero_is_off("rollout.top_k"), "min_p": _zero_is_off("rollout.min_p"),
    "bf16": _precision("bfloat16"), "fp16": _precision("float16"), "report_to": _report_to,
    "use_cpu": lambda value, out, fields: _set(out, "train.device", "cpu") if value else None,
    "use_adaptive_entropy": _adaptive_entropy, "entropy_target": _entropy_target,
}
"""TRL fields whose value needs more than a copy (a different name for the same choice, a unit, a default)."""

HANDLED_ELSEWHERE = {"reward_weights"}
"""Translated by the caller: the weights go with the reward functions (`train(rewards=...)`)."""


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _rebuilt(args: Any, names: set[str]) -> Any:
    """A GRPOConfig of args' class from args' values of `names` alone (None when it cannot be built here)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return type(args)(**{name: getattr(args, name) for name in names})
    except Exception:  # e.g. a precision this machine cannot check: compare with the dataclass defaults instead
        return None


def set_fields(args: Any) -> dict[str, Any]:
    """The fields of a GRPOConfig (object or dict) that were set: a dict's every key. An object's field is set when
    it differs from what TRL builds without it: a translatable field from a GRPOConfig of the same precision flags
    (so that report_to "none" -> [] and the like do not count), any other field from a GRPOConfig built from the
    translatable fields (so that what TRL derives from them, generation_batch_size from the batch size, ..., does
    not count either)."""
    if isinstance(args, Mapping):
        return dict(args)
    if not dataclasses.is_dataclass(args):
        raise C.ConfigError(f"a TRL config is a GRPOConfig or a dict of its fields; got {type(args).__name__}",
                            field="args")
    fields = [f for f in dataclasses.fields(args) if f.init]
    known = {f.name for f in fields} & {*TRL_FIELDS, *CONVERTERS, *HANDLED_ELSEWHERE}
    plain = _rebuilt(args, {"bf16", "fp16"} & known)
    derived = _rebuilt(args, known)
    out = {}
    for f in fields:
        reference = plain if f.name in known else derived
        base = getattr(reference, f.name) if reference is not None else _default(f)
        if getattr(args, f.name) != base:
            out[f.name] = getattr(args, f.name)
    return out


def from_trl(args: Any) -> tuple[dict[str, Any], list[float] | None]:
    """(grpo-dual config tree of what `args` sets, reward_weights or None). Raises ConfigError naming every set field
    without an equivalent."""
    fields = set_fields(args)
    untranslatable = sorted(name for name in fields if name not in TRL_FIELDS and name not in CONVERTERS
                            and name not in HANDLED_ELSEWHERE)
    if untranslatable:
        raise C.ConfigError(f"TRL fields without an equivalent in grpo-dual: {untranslatable} (translated: "
                            f"{sorted({*TRL_FIELDS, *CONVERTERS, *HANDLED_ELSEWHERE})}); leave them at TRL's "
                            "defaults or drop them", field=untranslatable[0])
    out: dict[str, Any] = {}
    for name in sorted(fields, key=lambda n: (n != "loss_type", n)):  # the loss type first: the IS level checks it
        if name in TRL_FIELDS:
            _set(out, TRL_FIELDS[name], fields[name])
        elif name in CONVERTERS:
            CONVERTERS[name](fields[name], out, fields)
    weights = fields.get("reward_weights")
    return out, (None if weights is None else [float(w) for w in weights])


def looks_like_trl(tree: Mapping[str, Any]) -> bool:
    """A flat table of TRL field names rather than grpo-dual sections (its keys are not our section names)."""
    sections = {f.name for f in dataclasses.fields(C.Config)}
    return bool(tree) and not set(tree) & sections


def read_config_file(path: str) -> dict[str, Any]:
    """A config file (YAML or JSON) as a grpo-dual config tree: our sections as they are, TRL's GRPOConfig fields
    translated (their reward_weights refused: a file names no reward functions to weigh)."""
    file = Path(path)
    if not file.is_file():
        raise C.ConfigError(f"--config {path}: no such file", field="config")
    text = file.read_text()
    try:
        if file.suffix == ".json":
            tree = json.loads(text)
        else:
            import yaml

            tree = yaml.safe_load(text)
    except Exception as err:  # json.JSONDecodeError, yaml.YAMLError: the parser's message names the line
        raise C.ConfigError(f"--config {path} is not valid {'JSON' if file.suffix == '.json' else 'YAML'}: "
                            f"{err}", field="config") from None
    if not isinstance(tree, dict):
        raise C.ConfigError(f"--config {path} must hold a table of fields, not a {type(tree).__name__}",
                            field="config")
    if not looks_like_trl(tree):
        return tree
    out, weights = from_trl(tree)
    if weights is not None:
        raise C.ConfigError(f"--config {path}: reward_weights need the reward functions they weigh; give them with "
                            "rewards.<task>=name:weight,... instead", field="reward_weights")
    return out
