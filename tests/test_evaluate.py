"""Held-out evaluation records: each grader's own mean per task (grpo.phases.evaluate.part_means)."""

from __future__ import annotations

import math

from grpo.phases.evaluate import part_means
from grpo.core.records import Rollout, Sample, Scored


def _scored(task: str, reward: float | None, parts: dict) -> Scored:
    rollout = Rollout(Sample(task, "x", ()), (), (), "", True, False)
    return Scored(rollout=rollout, reward=reward, parts=parts)


def test_part_means_are_per_task_and_per_grader_and_skip_failed_parts():
    scored = [_scored("fair", 1.0, {"bbq_rule": 1.0, "format": 0.5}),
              _scored("fair", 0.0, {"bbq_rule": 0.0, "format": 1.0}),
              _scored("fair", None, {"bbq_rule": None, "format": 0.0}),
              _scored("halu", 0.25, {"halueval_rule": 0.25, "format": math.nan})]
    # fair: bbq_rule (1 + 0) / 2 (the None is left out), format (0.5 + 1 + 0) / 3; halu: the NaN format is left out
    assert part_means((s.rollout.sample.task, s.parts) for s in scored) == {"fair": {"bbq_rule": 0.5, "format": 0.5}, "halu": {"halueval_rule": 0.25}}
