"""The clipped policy losses' ratio bounds: their defaults and their rules, in one place that the loss section of the
config (grpo/config/algorithm_sections.py LossConfig) and the losses themselves (grpo/core/losses.py) both read, so a
config and a direct call refuse the same values. Standard library only: the config layer stays free of torch.

A bound of 0 puts that side of the clip at ratio 1: every token whose ratio moved the way its advantage pushes it is
clipped, so after the first pass it gets no gradient (and 1 − clip_low must stay > 0 to bound a ratio at all). A dual
clip c ≤ 1 caps the loss of a negative-advantage token at or below its on-policy value (ratio 1), not only where the
ratio is large.
"""

from __future__ import annotations

CLIP_LOW = 0.2
"""PPO's lower clip: ratio ≥ 1 − 0.2 (the loss section's default, loss.clip_low)."""
CLIP_HIGH = 0.28
"""DAPO's clip-higher: ratio ≤ 1 + 0.28 (loss.clip_high)."""
DUAL_CLIP: float | None = None
"""No dual clip (loss.dual_clip; verl uses 3)."""


def clip_problems(clip_low: float, clip_high: float, dual_clip: float | None) -> list[tuple[str, object, str]]:
    """(field, value, fix) of each clip rule the values break; empty when they hold."""
    checks = [(0 < clip_low < 1, "loss.clip_low", clip_low, "use a value in (0, 1), e.g. 0.2"),
              (clip_high > 0, "loss.clip_high", clip_high, "use a value > 0, e.g. 0.28"),
              (dual_clip is None or dual_clip > 1, "loss.dual_clip", dual_clip,
               "use None or a value > 1 (verl uses 3)")]
    return [(field, value, fix) for holds, field, value, fix in checks if not holds]
