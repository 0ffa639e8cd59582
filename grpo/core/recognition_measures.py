"""Hallucination recognition measured per evaluation (HaluEval, Li et al. 2023): the model is shown a reply and
answers whether it holds a hallucination; its verdicts are graded by `halueval_recognition` (grpo/core/rule_graders.py).

  balanced accuracy    = (recall on "yes" rows + recall on "no" rows) / 2, an unparseable verdict counting as wrong;
                         over the classes present (one class only: its recall); None without rows. A constant
                         verdict scores 0.5 whatever the class balance (the general subset has 815 "yes" of 4,507)
"""

from __future__ import annotations

from typing import Any, Iterable


def recognition_measures(pairs: Iterable[tuple[str, str | None]]) -> dict[str, Any]:
    """Balanced accuracy and its parts over (gold label, verdict) pairs: balanced_accuracy, recall_yes, recall_no,
    accuracy, yes_rate (share of verdicts "yes"), invalid (share unparseable), n_yes, n_no. None = undefined."""
    pairs = list(pairs)
    bad = [g for g, _ in pairs if g not in ("yes", "no")]
    if bad:
        raise ValueError(f"recognition gold labels must be 'yes' or 'no', got {bad[0]!r}")
    recall = {}
    for label in ("yes", "no"):
        rows = [v for g, v in pairs if g == label]
        recall[label] = sum(v == label for v in rows) / len(rows) if rows else None
    present = [r for r in recall.values() if r is not None]
    n = len(pairs)
    return {
        "balanced_accuracy": sum(present) / len(present) if present else None,
        "recall_yes": recall["yes"],
        "recall_no": recall["no"],
        "accuracy": sum(g == v for g, v in pairs) / n if n else None,
        "yes_rate": sum(v == "yes" for _, v in pairs) / n if n else None,
        "invalid": sum(v is None for _, v in pairs) / n if n else None,
        "n_yes": sum(g == "yes" for g, _ in pairs),
        "n_no": sum(g == "no" for g, _ in pairs),
    }
