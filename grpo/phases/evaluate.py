"""Held-out evaluation: greedy completions of each task's held-out prompts, scored by the task's graders."""

from __future__ import annotations

import math
from typing import Callable, Iterable, Mapping, Sequence

from grpo.config.settings import RolloutConfig
from grpo.core.records import Rollout, Sample, Scored
from grpo.phases.rollout import greedy_complete


def evaluate(model, tokenizer, samples_by_task: dict[str, Sequence[Sample]], rollout: RolloutConfig,
             stop_ids: Sequence[int] | None, score: Callable[[list[Rollout]], list[Scored]], *,
             system_prompt: str | None = None, batch_size: int = 32,
             synced_gpus: bool = False) -> tuple[dict[str, float], list[Scored]]:
    """Mean reward per task on greedy (top-1) completions (`greedy_complete`: rollout's length limits and penalties,
    no sampling); failed scores are left out of the mean.
    `synced_gpus`: sharded model, every process runs this same evaluation (see grpo/models/distributed.py)."""
    results: dict[str, float] = {}
    all_scored: list[Scored] = []
    for task, samples in samples_by_task.items():
        scored: list[Scored] = []
        for start in range(0, len(samples), batch_size):
            rollouts, _ = greedy_complete(model, tokenizer, list(samples[start:start + batch_size]), rollout,
                                          stop_ids, system_prompt=system_prompt, synced_gpus=synced_gpus)
            scored += score(rollouts)
        valid = [s.reward for s in scored if s.reward is not None and not math.isnan(s.reward)]
        results[task] = sum(valid) / len(valid) if valid else float("nan")
        all_scored += scored
    return results, all_scored


def part_means(rows: Iterable[tuple[str, Mapping[str, float | None]]]) -> dict[str, dict[str, float]]:
    """Mean of each grader's own score per task over (task, parts) pairs (Scored.parts: raw scores before weights, or
    the "parts" of an evals/<phase>.jsonl line); a None or NaN part is left out. Tells a reward that rose through its
    format term from one that rose through its answer term."""
    sums: dict[str, dict[str, list[float]]] = {}
    for task, parts in rows:
        for name, value in parts.items():
            if value is not None and not math.isnan(value):
                sums.setdefault(task, {}).setdefault(name, []).append(value)
    return {task: {name: sum(v) / len(v) for name, v in by_name.items()} for task, by_name in sums.items()}


def unscored(rollouts: list[Rollout]) -> list[Scored]:
    """The scorer of the ranks that only help generate (sharded evaluation): no reward, no judge call."""
    return [Scored(rollout=r, reward=None) for r in rollouts]
