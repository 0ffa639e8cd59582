"""Held-out evaluation records: each grader's own mean per task (grpo.phases.evaluation.part_means)."""

from __future__ import annotations

import math

from grpo.core.step_types import Rollout, Sample, Scored
from grpo.phases.evaluation import part_means


def _scored(task: str, reward: float | None, parts: dict) -> Scored:
    rollout = Rollout(Sample(task, "x", ()), (), (), "", True, False)
    return Scored(rollout=rollout, reward=reward, parts=parts)


def test_part_means_are_per_task_and_per_grader_and_skip_failed_parts():
    scored = [_scored("fair", 1.0, {"bbq_rule": 1.0, "format": 0.5}),
              _scored("fair", 0.0, {"bbq_rule": 0.0, "format": 1.0}),
              _scored("fair", None, {"bbq_rule": None, "format": 0.0}),
              _scored("halu", 0.25, {"halueval_rule": 0.25, "format": math.nan})]
    # fair: bbq_rule (1 + 0) / 2 (the None is left out), format (0.5 + 1 + 0) / 3; halu: the NaN format is left out
    assert part_means((s.rollout.sample.task, s.parts) for s in scored) == {"fair": {"bbq_rule": 0.5, "format": 0.5},
                                                                            "halu": {"halueval_rule": 0.25}}


def test_evaluate_batches_prompts_by_length_and_returns_rows_in_sample_order(monkeypatch):
    import grpo.phases.evaluation as E
    from grpo.config import RolloutConfig

    words = [9, 1, 7, 3, 8, 2]  # prompt lengths in words, out of order
    samples = [Sample("t", f"id{i}", ({"role": "user", "content": " ".join(["w"] * n)},)) for i, n in enumerate(words)]
    seen: list[list[int]] = []

    def fake_greedy(model, tokenizer, batch, rollout, stop_ids, **kw):
        seen.append([len(s.messages[0]["content"].split()) for s in batch])
        return [Rollout(s, (), (), s.id, True, False) for s in batch], {}

    monkeypatch.setattr(E, "encode_prompt", lambda tok, messages, system: messages[0]["content"].split())
    monkeypatch.setattr(E, "greedy_complete", fake_greedy)
    score = lambda rollouts: [Scored(r, float(r.sample.id[2:]), {}) for r in rollouts]  # noqa: E731
    results, scored = E.evaluate(None, None, {"t": samples}, RolloutConfig(), None, score, batch_size=2)
    assert seen == [[1, 2], [3, 7], [8, 9]]  # a batch pads to its longest prompt: neighbours in length share one
    assert [s.rollout.sample.id for s in scored] == [f"id{i}" for i in range(6)]
    assert results == {"t": sum(range(6)) / 6}
