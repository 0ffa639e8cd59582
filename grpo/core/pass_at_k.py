"""pass@k: how often the right answer is sampled at all among k tries (Chen et al. 2021, arXiv 2107.03374, eq. 1).

With n ≥ k samples of a prompt, c of them right, the unbiased estimate of P(at least one of k samples is right) is

    pass@k = 1 − C(n − c, k) / C(n, k) = 1 − Π_{i = n−c+1}^{n} (1 − k / i)

(the product form is the paper's numerically stable one; it is 1 when n − c < k). RL on group-relative advantages
can only raise the probability of answers it samples: a task whose pass@K is near 0 gives no group a signal.

The yardstick for a multiple-choice prompt with m options is a uniform guess: each try right with probability 1/m,

    guess pass@k = 1 − (1 − 1/m)^k          (m = 3, k = 4: 1 − 16/81 = 0.802; m = 2, k = 4: 0.9375)

A policy whose pass@k is no higher samples the right option no more often than a guess: what RL can then raise is
an answer prior, not the skill.
"""

from __future__ import annotations

import math
from typing import Iterable


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one prompt from n samples of which c are right (0 ≤ c ≤ n, 1 ≤ k ≤ n)."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass_at_k: need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_pass_at_k(counts: Iterable[tuple[int, int]], k: int) -> float:
    """Mean pass@k over prompts given as (n, c) pairs; NaN when there are none."""
    values = [pass_at_k(n, c, k) for n, c in counts]
    return sum(values) / len(values) if values else float("nan")


def guess_pass_at_k(choices: int, k: int) -> float:
    """pass@k of a uniform guess among `choices` options (choices ≥ 1, k ≥ 1): 1 − (1 − 1/choices)^k."""
    if choices < 1 or k < 1:
        raise ValueError(f"guess_pass_at_k: need choices >= 1 and k >= 1, got choices={choices}, k={k}")
    return 1.0 - (1.0 - 1.0 / choices) ** k
