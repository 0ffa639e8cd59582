"""The pass@K diagnostic before RL: per task, how often a right answer is among K sampled completions of a
held-out prompt (grpo/core/pass_at_k.py). RL can only raise what it samples."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Sequence

from grpo.config import RolloutConfig, TrainConfig
from grpo.core.pass_at_k import guess_pass_at_k, mean_pass_at_k
from grpo.core.step_types import Rollout, Sample, Scored
from grpo.phases.generate import SamplingPlan, generate_rollouts


def pass_at_k_eval(model, tokenizer, samples_by_task: dict[str, Sequence[Sample]], rollout: RolloutConfig,
                   train: TrainConfig, stop_ids: Sequence[int] | None,
                   score: Callable[[list[Rollout]], list[Scored]], *, prompts_per_batch: int = 8) -> dict[str, float]:
    """n = train.pass_at_k_samples sampled completions (rollout's sampling settings) of every held-out prompt, scored;
    a completion is right when its reward ≥ train.pass_threshold (a failed score is wrong); k = train.pass_at_k. Returns
    eval/<task>/pass_at_k (the unbiased pass@k over the prompts) and eval/<task>/pass_at_1 (the share of right samples);
    for a task whose samples all say how many options they offer (meta["choices"]: BBQ 3, HaluEval recognition 2),
    eval/<task>/pass_at_k_guess and eval/<task>/pass_at_1_guess, the same figures for a uniform guess among them. Each
    batch of prompts is sampled from its own seed (train.seed + batch index), so the run's global random stream is left
    as it was."""
    k, n, threshold, seed = train.pass_at_k, train.pass_at_k_samples, train.pass_threshold, train.seed
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k_eval: need 1 <= k <= n, got k={k}, n={n}")
    sampling = replace(rollout, k=n)
    metrics: dict[str, float] = {}
    batch_index = 0
    for task, samples in samples_by_task.items():
        counts: list[tuple[int, int]] = []
        for start in range(0, len(samples), prompts_per_batch):
            chunk = list(samples[start:start + prompts_per_batch])
            rollouts, _ = generate_rollouts(model, tokenizer, chunk, sampling, stop_ids,
                                            plan=SamplingPlan(generator_seed=seed + batch_index))
            batch_index += 1
            scored = score(rollouts)
            for i in range(len(chunk)):
                group = scored[i * n:(i + 1) * n]
                counts.append((n, sum(s.reward is not None and s.reward >= threshold for s in group)))
        metrics[f"eval/{task}/pass_at_k"] = mean_pass_at_k(counts, k)
        metrics[f"eval/{task}/pass_at_1"] = mean_pass_at_k(counts, 1)
        choices = [s.meta.get("choices") for s in samples]
        if choices and all(isinstance(c, int) and c >= 1 for c in choices):  # multiple choice: a guess's figures
            metrics[f"eval/{task}/pass_at_k_guess"] = sum(guess_pass_at_k(c, k) for c in choices) / len(choices)
            metrics[f"eval/{task}/pass_at_1_guess"] = sum(1.0 / c for c in choices) / len(choices)
    return metrics
