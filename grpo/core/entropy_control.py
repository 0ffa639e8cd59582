"""Adaptive entropy control (Skywork-OR1, arXiv 2505.22312 §3.2.3; TRL's `use_adaptive_entropy`).

After every optimizer step the coefficient moves by δ toward keeping the policy's mean token entropy at a target:

    c ← min(c + δ, c_max)  if H ≤ H_target      c ← max(c − δ, c_min)  otherwise

and the bonus −c·H is applied on the next step only while the last measured entropy is at or below the target
(TRL: `apply_coef = entropy_coef if last_entropy <= entropy_target else 0`). Before any measurement the entropy counts
as +∞, so the first step applies no bonus. A controller with `.value` / `.update()` like the KL controllers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class AdaptiveEntropyCoef:
    coef: float
    """The coefficient c (loss.entropy_coef is its start)."""
    target: float
    """H_target: mean entropy per completion token, nats (loss.entropy_target)."""
    delta: float = 0.005
    coef_min: float = 0.0
    coef_max: float = 1.0
    last_entropy: float = math.inf
    """The entropy measured at the last update (+∞ before the first)."""

    @property
    def value(self) -> float:
        """The coefficient the next step applies: c while the last entropy is at or below the target, else 0."""
        return self.coef if self.last_entropy <= self.target else 0.0

    def update(self, entropy: float) -> None:
        """One optimizer step's mean token entropy (nats). A non-finite measurement changes nothing."""
        if not math.isfinite(entropy):
            return
        if entropy <= self.target:
            self.coef = min(self.coef + self.delta, self.coef_max)
        else:
            self.coef = max(self.coef - self.delta, self.coef_min)
        self.last_entropy = entropy

    def state_dict(self) -> dict[str, float]:
        return {"coef": self.coef, "last_entropy": self.last_entropy}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.coef, self.last_entropy = float(state["coef"]), float(state["last_entropy"])
