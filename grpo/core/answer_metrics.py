"""What a step's completions say, per task: the most common answer class and its share, and the groups without signal.

The run doctor (grpo/run/doctor/) reads these step metrics to tell "the policy collapsed onto one answer" from "the
policy learned the rule", and "this task has no learning signal" from "the whole batch has none":
  * `rollout/<task>/top_answer` (str), `rollout/<task>/top_share`, `rollout/<task>/answers` (distinct classes);
  * `adv/<task>/frac_zero_std`: the task's groups whose valid rewards are all equal (the rule of
    grpo/core/advantages.py, per task instead of over the whole batch).

Answer class of a completion (`answer_class`), in order:
  1. the text after the last "Answer:" label (case-insensitive) when there is one, else the whole completion;
  2. its first non-empty line, case-folded, whitespace collapsed to single spaces;
  3. punctuation and symbols stripped from both ends ("Answer: (B)." -> "b", "Answer: unknown" -> "unknown");
  4. an option letter followed by its text ("b) the grandfather", "(c) can't be determined") is the letter alone: on
     multiple-choice rows whose options are shuffled, the text differs from row to row while the letter is the answer;
  5. cut to ANSWER_CLASS_CHARS characters; an empty result is EMPTY_ANSWER.
So the demo's "Answer: X" replies fall into their X, and free-form completions into their opening words: identical
openings in most of a step's samples are the mode collapse the doctor looks for. Pure: strings and floats only.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from grpo.core.advantages import REWARD_TIE_ATOL

ANSWER_CLASS_CHARS = 40
"""Characters of a normalised answer kept as its class: long enough for a short answer or a sentence opening, short
enough that free-form completions which start alike (the collapse) fall into one class although their tails differ."""
EMPTY_ANSWER = "<empty>"
"""The class of a completion with no text (or only punctuation): an empty reply is an answer class of its own."""

_ANSWER_LABEL = re.compile(r"answer\s*:", re.IGNORECASE)
_EDGE_PUNCT = re.compile(r"^[\W_]+|[\W_]+$")
_OPTION_LETTER = re.compile(r"^\(?([a-z])\)\s")


def answer_class(completion: str) -> str:
    """The normalised answer of one completion (module docstring: label, first line, case, punctuation, length)."""
    labels = list(_ANSWER_LABEL.finditer(completion))
    text = completion[labels[-1].end():] if labels else completion
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    line = " ".join(line.casefold().split())
    option = _OPTION_LETTER.match(line)
    norm = option.group(1) if option else _EDGE_PUNCT.sub("", line)
    return norm[:ANSWER_CLASS_CHARS] or EMPTY_ANSWER


@dataclass(frozen=True)
class AnswerShares:
    """The answer classes of one task's completions in one step."""

    top_answer: str
    """The most common class (ties: the one seen first)."""
    top_share: float
    """Its fraction of the completions, in (0, 1]."""
    distinct: int
    """How many classes there were."""


def answer_shares(completions: Sequence[str]) -> AnswerShares:
    """Most common answer class of `completions`, its share and the number of distinct classes.

    e.g. ["Answer: unknown", "Answer: unknown", "Answer: yes", "answer: Unknown."] -> ("unknown", 0.75, 2).
    Raises ValueError on an empty list (a task with no completion this step has no shares; leave it out).
    """
    if not completions:
        raise ValueError("answer_shares: no completions; call it only for tasks sampled in this step")
    counts = Counter(answer_class(c) for c in completions)
    top, n = counts.most_common(1)[0]  # Counter keeps first-seen order among equal counts
    return AnswerShares(top_answer=top, top_share=n / len(completions), distinct=len(counts))


def zero_std_fraction(rewards: Sequence[float | None], group_size: int) -> float:
    """Fraction of the groups (consecutive runs of `group_size`) with < 2 valid rewards or all valid rewards within
    REWARD_TIE_ATOL: the groups grpo/core/advantages.py gives advantage 0. None / NaN rewards are failed, left out."""
    if group_size < 1 or not rewards or len(rewards) % group_size:
        raise ValueError(f"zero_std_fraction: {len(rewards)} rewards do not split into groups of "
                         f"group_size={group_size}; pass the K rollouts of every prompt, contiguously")
    dead = 0
    for start in range(0, len(rewards), group_size):
        valid = [r for r in rewards[start:start + group_size] if r is not None and not math.isnan(r)]
        dead += len(valid) < 2 or max(valid) - min(valid) <= REWARD_TIE_ATOL
    return dead / (len(rewards) // group_size)


def step_answer_metrics(tasks: Sequence[str], completions: Sequence[str], rewards: Sequence[float | None],
                        group_size: int) -> dict[str, float | str]:
    """The doctor's per-task step metrics from a step's rollouts, parallel lists in rollout order (the K completions
    of a prompt contiguous, as grpo/phases/generate.py returns them): rollout/<task>/top_answer,
    rollout/<task>/top_share, rollout/<task>/answers and adv/<task>/frac_zero_std for every task present."""
    if not len(tasks) == len(completions) == len(rewards):
        raise ValueError(f"step_answer_metrics: {len(tasks)} tasks, {len(completions)} completions and "
                         f"{len(rewards)} rewards; pass one of each per rollout")
    out: dict[str, float | str] = {}
    for task in dict.fromkeys(tasks):
        rows = [i for i, t in enumerate(tasks) if t == task]
        shares = answer_shares([completions[i] for i in rows])
        out[f"rollout/{task}/top_answer"] = shares.top_answer
        out[f"rollout/{task}/top_share"] = shares.top_share
        out[f"rollout/{task}/answers"] = float(shares.distinct)
        out[f"adv/{task}/frac_zero_std"] = zero_std_fraction([rewards[i] for i in rows], group_size)
    return out
