"""TRL's per-step log keys, from the metrics a step already computes: what GRPOTrainer's `state.log_history` rows
hold, so metrics.jsonl, TensorBoard, the trainer's log_history and the callbacks' `logs` carry TRL's names beside
grpo-dual's own (one call, where the step's metrics are logged: grpo_train.log_step).

    TRL 1.16's key                       from
    loss                                 loss/total
    grad_norm                            health/grad_norm
    learning_rate                        lr
    reward, reward_std                   the step's completions' rewards (None left out): torch.nanmean, TRL's nanstd
    frac_reward_zero_std                 adv/frac_zero_std (the groups whose rewards are all equal)
    kl, entropy                          kl/all, entropy/all (token-weighted over every task's completion tokens)
    completions/mean|min|max_length      each completion's model-written tokens (Rollout.model_tokens, as TRL's
                                         tool mask counts them)
    completions/clipped_ratio            the share truncated (max_new_tokens reached without a stop token)
    completions/mean|min|max_terminated_length   over the other completions (0 when there are none, as TRL)
    num_tokens                           rollout/tokens_seen (prompt and completion tokens of every step so far)
    clip_ratio/low_mean, high_mean       loss/clip_frac_low, loss/clip_frac_high (the clipped losses only)
    clip_ratio/region_mean               their sum (a token clipped from below has A < 0, from above A > 0)
    step_time                            time/step
    tools/call_frequency                 the calls that ran over completions: tools/calls_per_rollout less
                                         tools/unrun_per_rollout (TRL counts no call its iteration limit kept
                                         from running)
    tools/failure_frequency              failed calls over the calls that ran (0 without any); a malformed call,
                                         plain text to TRL, is a failed call here
    epoch                                TRL's count: the step over the RL steps of an epoch (train prompts //
                                         prompts a step over every process)
A key whose source the step does not have (a loss without clipping, a skipped update) is left out. The
completions and rewards are the ones the step trained on (`rl_step`'s `everyone`: every completion, unless dynamic
sampling dropped groups). TRL's rewards/<fn>/mean|std are the reward side's (grpo/grading/scoring.reward_metrics).
TRL's clip_ratio/low_min and high_max are the extremes of the clipped shares over processes: over one process they
are the shares themselves, TRL's value exactly; over several, grpo-dual's shares are already the step's over every
process, and these keys hold them (no per-process extreme is kept).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from grpo.core.step_types import Scored
from grpo.grading.scoring import trl_mean_std

RENAMED = {"loss": "loss/total", "grad_norm": "health/grad_norm", "learning_rate": "lr",
           "frac_reward_zero_std": "adv/frac_zero_std", "kl": "kl/all", "entropy": "entropy/all",
           "num_tokens": "rollout/tokens_seen", "clip_ratio/low_mean": "loss/clip_frac_low",
           "clip_ratio/high_mean": "loss/clip_frac_high", "clip_ratio/low_min": "loss/clip_frac_low",
           "clip_ratio/high_max": "loss/clip_frac_high", "step_time": "time/step"}
"""TRL's key -> the step metric that holds its value."""


def completion_lengths(lengths: Sequence[int], truncated: Sequence[bool]) -> dict[str, float]:
    """TRL's completions/ keys of one step: lengths (model-written tokens) and which were truncated."""
    if not lengths:
        return {}
    ended = [n for n, cut in zip(lengths, truncated, strict=True) if not cut] or [0]
    return {"completions/mean_length": sum(lengths) / len(lengths), "completions/min_length": float(min(lengths)),
            "completions/max_length": float(max(lengths)),
            "completions/clipped_ratio": sum(map(bool, truncated)) / len(lengths),
            "completions/mean_terminated_length": sum(ended) / len(ended),
            "completions/min_terminated_length": float(min(ended)),
            "completions/max_terminated_length": float(max(ended))}


def tool_frequencies(metrics: Mapping[str, Any]) -> dict[str, float]:
    """TRL's tools/ keys from a step's tools/ metrics (grpo.core.tool_calls.tool_metrics); none in a run without
    tools. A call the turn limit kept from running is never failed, so the failures all ran."""
    if "tools/calls_per_rollout" not in metrics:
        return {}
    calls = float(metrics["tools/calls_per_rollout"])
    ran = calls - float(metrics.get("tools/unrun_per_rollout", 0.0))
    failed = float(metrics["tools/failure_rate"]) * calls
    return {"tools/call_frequency": ran, "tools/failure_frequency": failed / ran if ran > 0 else 0.0}


def trl_log_keys(metrics: Mapping[str, Any], scored: Sequence[Scored], step: int, train_prompts: int,
                 prompts_per_step: int) -> dict[str, float]:
    """TRL's top-level keys of one RL step (the module docstring's table): `metrics` the step's metrics, `scored`
    its completions, `step` the RL step, `train_prompts` the training prompts of every task, `prompts_per_step` the
    prompts a step over every process."""
    out = {trl: float(metrics[ours]) for trl, ours in RENAMED.items() if ours in metrics}
    if "loss/clip_frac_low" in metrics and "loss/clip_frac_high" in metrics:
        out["clip_ratio/region_mean"] = float(metrics["loss/clip_frac_low"]) + float(metrics["loss/clip_frac_high"])
    if scored:
        out["reward"], out["reward_std"] = trl_mean_std([s.reward for s in scored])
    out.update(tool_frequencies(metrics))
    out.update(completion_lengths([s.rollout.model_tokens for s in scored], [s.rollout.truncated for s in scored]))
    per_epoch = train_prompts // prompts_per_step if prompts_per_step > 0 else 0
    if per_epoch > 0:  # TRL's epoch: global steps over the steps of an epoch (the last incomplete batch dropped)
        out["epoch"] = step / per_epoch
    elif train_prompts > 0:
        out["epoch"] = step * prompts_per_step / train_prompts
    return out
