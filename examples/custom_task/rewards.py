"""Reward functions of the example tasks in docs/CUSTOM_TASKS.md: one in TRL's batched style, one per row.

Referenced by file path (`examples/custom_task/rewards.py:answer_matches`): this folder need not be on the Python
path, and nothing here is imported by the trainer unless a reward term names it.
"""

import re

ANSWER = re.compile(r"answer\s*:\s*([A-Za-z]+)", re.IGNORECASE)


def answer_matches(completions, answer, **kwargs):
    """TRL style: 1.0 when the word after "Answer:" is the row's `answer` column, else 0.0 (one per completion)."""
    rewards = []
    for completion, gold in zip(completions, answer, strict=True):
        found = ANSWER.search(completion)
        rewards.append(1.0 if found and found.group(1).lower() == gold.lower() else 0.0)
    return rewards


def brevity(completion, gold):
    """Per row: 0 for a reply of up to 3 words, then -0.1 per extra word (a penalty: rewards may be negative)."""
    return -0.1 * max(0, len(completion.split()) - 3)
