"""Held-out evaluation: greedy completions of each task's held-out prompts, scored by the task's graders."""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Mapping, Sequence

from grpo.config import RolloutConfig
from grpo.core.bbq_measures import bbq_answer, bbq_measures, flat_measures
from grpo.core.recognition_measures import recognition_measures
from grpo.core.rule_graders import recognition_verdict
from grpo.core.step_types import Rollout, Sample, Scored
from grpo.models.tokens import encode_prompt
from grpo.phases.generate import GREEDY, greedy_complete
from grpo.phases.tools import ToolBox, tool_rollouts


def evaluate(model, tokenizer, samples_by_task: dict[str, Sequence[Sample]], rollout: RolloutConfig,
             stop_ids: Sequence[int] | None, score: Callable[[list[Rollout]], list[Scored]], *,
             system_prompt: str | None = None, batch_size: int = 32, synced_gpus: bool = False,
             tools: ToolBox | None = None) -> tuple[dict[str, float], list[Scored]]:
    """Mean reward per task on greedy (top-1) completions (`greedy_complete`: rollout's length limits and penalties,
    no sampling); failed scores are left out of the mean. Prompts are batched in order of their token length (a batch
    is padded to its longest prompt: HaluEval's run from 100 to 500 tokens), and the scored rows come back in the
    samples' order.
    `synced_gpus`: sharded model, every process runs this same evaluation (see grpo/machine/distributed.py).
    `tools`: the run's tools: each completion is a greedy multi-turn trajectory (grpo/phases/tools.py)."""
    results: dict[str, float] = {}
    all_scored: list[Scored] = []
    for task, samples in samples_by_task.items():
        lengths = [len(encode_prompt(tokenizer, s.messages, system_prompt)) for s in samples]
        order = sorted(range(len(samples)), key=lambda i: lengths[i])
        by_index: dict[int, Scored] = {}
        for start in range(0, len(order), batch_size):
            batch = order[start:start + batch_size]
            if tools is None:
                rollouts, _ = greedy_complete(model, tokenizer, [samples[i] for i in batch], rollout,
                                              stop_ids, system_prompt=system_prompt, synced_gpus=synced_gpus)
            else:
                rollouts, _ = tool_rollouts(model, tokenizer, [samples[i] for i in batch], rollout, stop_ids,
                                            tools=tools, system_prompt=system_prompt, plan=GREEDY,
                                            synced_gpus=synced_gpus)
            by_index.update(zip(batch, score(rollouts), strict=True))
        scored = [by_index[i] for i in range(len(samples))]
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


def is_bbq_row(sample: Sample) -> bool:
    """A BBQ row (grpo/data/bbq.py): its gold names the unknown option, the context condition and the polarity."""
    return all(k in sample.gold for k in ("unknown_letter", "label_letter", "context_condition", "question_polarity"))


def is_recognition_row(sample: Sample) -> bool:
    """A HaluEval recognition row (grpo/data/halueval.py, subset "<subset>_recognition") with a yes / no label."""
    return str(sample.gold.get("subset", "")).endswith("_recognition") and sample.gold.get("hallucination") in (
        "yes", "no")


def measures_by_task(scored: Sequence[Scored]) -> dict[str, dict[str, Any]]:
    """The gold-label measures of one evaluation, by family and task: "bbq" (grpo/core/bbq_measures.bbq_measures of
    each task whose completions answer BBQ rows) and "recognition" ({"overall", "by_subset"} of
    grpo/core/recognition_measures.recognition_measures over HaluEval recognition rows); families without rows are
    left out."""
    bbq: dict[str, list] = {}
    recognition: dict[str, list[tuple[str, str, str | None]]] = {}
    for s in scored:
        sample = s.rollout.sample
        if is_bbq_row(sample):
            category = str(sample.meta.get("category", "all"))
            bbq.setdefault(sample.task, []).append(bbq_answer(s.rollout.text, sample.gold, category))
        elif is_recognition_row(sample):
            recognition.setdefault(sample.task, []).append(
                (sample.gold["subset"], sample.gold["hallucination"], recognition_verdict(s.rollout.text)))
    out: dict[str, dict[str, Any]] = {}
    if bbq:
        out["bbq"] = {task: bbq_measures(answers) for task, answers in bbq.items()}
    if recognition:
        out["recognition"] = {
            task: {"overall": recognition_measures((g, v) for _, g, v in rows),
                   "by_subset": {sub: recognition_measures((g, v) for s_, g, v in rows if s_ == sub)
                                 for sub in sorted({r[0] for r in rows})}}
            for task, rows in recognition.items()}
    return out


RECOGNITION_METRICS = ("balanced_accuracy", "recall_yes", "recall_no", "yes_rate")


def record_measures(store: dict[str, Any], tag: str, scored: Sequence[Scored]) -> dict[str, float]:
    """Put the gold-label measures of one evaluation (`measures_by_task`) into `store` (the run's measures.json:
    {tag: {family: {task: ...}}}) when there are some, and return them as metrics: eval/<task>/bbq/[<category>/]<key>
    and eval/<task>/recognition/[<subset>/]<key> (undefined values left out)."""
    measures = measures_by_task(scored)
    if not measures:
        return {}
    store[tag] = measures
    metrics: dict[str, float] = {}
    for task, m in measures.get("bbq", {}).items():
        metrics.update(flat_measures(m, f"eval/{task}/bbq"))
    for task, m in measures.get("recognition", {}).items():
        groups = [("", m["overall"])] + [(f"{sub}/", g) for sub, g in m["by_subset"].items()]
        for name, group in groups:
            metrics.update({f"eval/{task}/recognition/{name}{k}": float(group[k])
                            for k in RECOGNITION_METRICS if group[k] is not None})
    return metrics
