"""Reward composition per task: rule graders and the LLM judge, weighted into one reward in [0, 1].

  reward = Σ_i w_i·s_i / Σ_i w_i   over the task's terms (weights > 0, each s_i in [0, 1], so reward in [0, 1])
The "llm_judge" term of every rollout of the batch goes to the Judge as ONE batch (its thread pool). A judge
failure uses the spec's fallback grader in its place (provider "fallback:<name>"); with no fallback the reward is
None — excluded from the group statistics and counted in `scoring/<task>/failed`, never turned into 0. A rule
grader that returns None also makes the reward None.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

from grpo.judge import Judge, JudgeItem, JudgeResult
from grpo.records import Rollout, Scored
from grpo.rewards import Grader, resolve_grader

JUDGE_TERM = "llm_judge"


@dataclass(frozen=True)
class RewardSpec:
    """How one task's reward is made. Maps 1:1 onto a config section."""

    task: str
    terms: tuple[tuple[str, float], ...]
    """(grader, weight) pairs; grader = a GRADERS name, "module:function", or "llm_judge"."""
    fallback: str | None = None
    """Rule grader used in place of a failed judge score; None = the reward becomes None."""

    def __post_init__(self) -> None:
        if not self.terms:
            raise ValueError(f"RewardSpec({self.task!r}).terms is empty: give at least one (grader, weight)")
        for name, weight in self.terms:
            if not (isinstance(weight, (int, float)) and math.isfinite(weight) and weight > 0):
                raise ValueError(f"RewardSpec({self.task!r}): weight of {name!r} is {weight!r}; use a number > 0")
        if self.fallback == JUDGE_TERM:
            raise ValueError(f"RewardSpec({self.task!r}).fallback cannot be {JUDGE_TERM!r}; name a rule grader")

    @property
    def uses_judge(self) -> bool:
        return any(name == JUDGE_TERM for name, _ in self.terms)


def _checked(value: float | None, grader: str) -> float | None:
    if value is None:
        return None
    value = float(value)
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise ValueError(f"grader {grader!r} returned {value!r}; graders must return a value in [0, 1] or None")
    return value


def _resolve_all(specs: dict[str, RewardSpec]) -> dict[str, Grader]:
    names = {n for s in specs.values() for n, _ in s.terms if n != JUDGE_TERM}
    names |= {s.fallback for s in specs.values() if s.fallback}
    return {name: resolve_grader(name) for name in sorted(names)}


def _judge_all(rollouts: list[Rollout], specs: dict[str, RewardSpec], judge: Judge | None) -> dict[int, JudgeResult]:
    wanted = [i for i, r in enumerate(rollouts) if specs[r.sample.task].uses_judge]
    if not wanted:
        return {}
    if judge is None:
        tasks = sorted({rollouts[i].sample.task for i in wanted})
        raise ValueError(f"tasks {tasks} have an {JUDGE_TERM!r} reward term but no Judge was given; configure one")
    items = [JudgeItem(task=rollouts[i].sample.task, prompt=_prompt_text(rollouts[i]), response=rollouts[i].text,
                       gold=rollouts[i].sample.gold) for i in wanted]
    return dict(zip(wanted, judge.score_batch(items), strict=True))


def _prompt_text(rollout: Rollout) -> str:
    """The prompt as the judge sees it: the messages' contents, system message first."""
    return "\n\n".join(m["content"] for m in rollout.sample.messages)


def _score_one(rollout: Rollout, spec: RewardSpec, graders: dict[str, Grader], verdict: JudgeResult | None) -> Scored:
    text, gold = rollout.text, rollout.sample.gold
    parts: dict[str, float | None] = {}
    provider = "rule"
    total, weights = 0.0, 0.0
    failed = False
    for name, weight in spec.terms:
        if name == JUDGE_TERM:
            assert verdict is not None  # _judge_all scored every rollout whose spec uses the judge
            value, provider = verdict.score, verdict.provider
            parts[JUDGE_TERM] = value
            if value is None and spec.fallback:
                value = _checked(graders[spec.fallback](text, gold), spec.fallback)
                parts[f"fallback:{spec.fallback}"] = value
                provider = f"fallback:{spec.fallback}"
        else:
            value = _checked(graders[name](text, gold), name)
            parts[name] = value
        if value is None:
            failed = True
        else:
            total, weights = total + weight * value, weights + weight
    return Scored(rollout=rollout, reward=None if failed else total / weights, parts=parts, provider=provider)


def score_rollouts(
    rollouts: list[Rollout], specs: dict[str, RewardSpec], judge: Judge | None = None
) -> tuple[list[Scored], dict[str, float]]:
    """One Scored per rollout (input order) and the metrics `scoring/<task>/failed`, `scoring/<task>/fallback`
    (counts in this batch) plus the judge's cumulative `judge/*` counters when a judge was used."""
    missing = sorted({r.sample.task for r in rollouts} - set(specs))
    if missing:
        raise KeyError(f"no RewardSpec for tasks {missing}; specs exist for {sorted(specs)}")
    graders = _resolve_all(specs)
    verdicts = _judge_all(rollouts, specs, judge)
    scored = [_score_one(r, specs[r.sample.task], graders, verdicts.get(i)) for i, r in enumerate(rollouts)]
    failed: Counter[str] = Counter()
    fallback: Counter[str] = Counter()
    for s in scored:
        failed[s.rollout.sample.task] += s.reward is None
        fallback[s.rollout.sample.task] += s.provider.startswith("fallback:")
    metrics: dict[str, Any] = {}
    for task in sorted({r.sample.task for r in rollouts}):
        metrics[f"scoring/{task}/failed"] = float(failed[task])
        metrics[f"scoring/{task}/fallback"] = float(fallback[task])
    if verdicts and judge is not None:
        metrics.update(judge.metrics())
    return scored, metrics
