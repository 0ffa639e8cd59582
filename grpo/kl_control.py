"""KL coefficient (β) controllers: `.value` is the β to use, `.update(observed_kl)` adapts it once per step.

Formulas (one line each, with the source):
- FixedKL:     β stays constant                                                               (DeepSeekMath GRPO)
- AdaptiveKL:  β ← β · (1 + clip(KL/target − 1, −0.2, 0.2) · n/horizon)                     (Ziegler et al. 2019, arXiv 1909.08593, §2.2)
- BandKL:      every `window` updates, m = median(KL); m > high → β·up; m < low → β·down; β ∈ [β_min, β_max]   (this project)

A NaN observed KL (e.g. a step whose KL term was not computed) is ignored, never averaged in, and counted in
`num_nan_ignored`. Controllers hold plain Python floats, so `state_dict()` is JSON-serialisable.
"""

from __future__ import annotations

import inspect
import math
import statistics
from typing import Any

ADAPTIVE_ERROR_CLIP = 0.2
"""Ziegler et al. clip the proportional error to ±0.2 so one noisy KL estimate moves β by at most 20%·n/horizon."""

BAND_BETA_MIN = 1e-4
"""Default floor for BandKL: a multiplicative controller can never leave 0, so β must stay strictly positive."""
BAND_BETA_MAX = 10.0
"""Default ceiling for BandKL: past ~10 the KL term swamps any reward signal of order 1."""


def _check_positive(where: str, **values: float) -> None:
    for name, v in values.items():
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise ValueError(f"{where}: {name}={v!r} must be a finite number > 0")


class FixedKL:
    """β constant; `update` only records NaNs so all controllers report the same fields."""

    def __init__(self, beta: float) -> None:
        if not (isinstance(beta, (int, float)) and math.isfinite(beta) and beta >= 0):
            raise ValueError(f"FixedKL: beta={beta!r} must be a finite number ≥ 0 (0 disables the KL term)")
        self.value = float(beta)
        self.num_nan_ignored = 0

    def update(self, observed_kl: float) -> float:
        if math.isnan(observed_kl):
            self.num_nan_ignored += 1
        return self.value

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value, "num_nan_ignored": self.num_nan_ignored}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])
        self.num_nan_ignored = int(state["num_nan_ignored"])


class AdaptiveKL:
    """Proportional controller of Ziegler et al. (2019): pushes the observed KL towards `target`.

    n_steps: how many samples (or steps) the observation covers; Ziegler use the batch size with horizon 10k.
    """

    def __init__(self, beta: float, target: float, horizon: float, n_steps: int = 1) -> None:
        _check_positive("AdaptiveKL", beta=beta, target=target, horizon=horizon, n_steps=n_steps)
        self.value = float(beta)
        self.target = float(target)
        self.horizon = float(horizon)
        self.n_steps = int(n_steps)
        self.num_nan_ignored = 0

    def update(self, observed_kl: float) -> float:
        if math.isnan(observed_kl):
            self.num_nan_ignored += 1
            return self.value
        error = min(max(observed_kl / self.target - 1.0, -ADAPTIVE_ERROR_CLIP), ADAPTIVE_ERROR_CLIP)
        self.value *= 1.0 + error * self.n_steps / self.horizon
        return self.value

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value, "target": self.target, "horizon": self.horizon, "n_steps": self.n_steps,
                "num_nan_ignored": self.num_nan_ignored}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])
        self.target = float(state["target"])
        self.horizon = float(state["horizon"])
        self.n_steps = int(state["n_steps"])
        self.num_nan_ignored = int(state["num_nan_ignored"])


class BandKL:
    """Keeps the median KL of each `window` of updates inside [low, high] by multiplying β by `up` or `down`.

    The median (not the mean) makes one spike in the window harmless. After each decision the window resets.
    """

    def __init__(self, beta: float, low: float, high: float, window: int = 20, up: float = 1.15,
                 down: float = 0.85, beta_min: float = BAND_BETA_MIN, beta_max: float = BAND_BETA_MAX) -> None:
        _check_positive("BandKL", beta=beta, high=high, beta_min=beta_min, beta_max=beta_max, window=window)
        if not (isinstance(low, (int, float)) and 0 <= low <= high):
            raise ValueError(f"BandKL: need 0 ≤ low ≤ high, got low={low!r}, high={high!r}")
        if not up > 1.0 or not 0.0 < down < 1.0:
            raise ValueError(f"BandKL: need up > 1 and 0 < down < 1, got up={up!r}, down={down!r}")
        if not beta_min <= beta <= beta_max:
            raise ValueError(f"BandKL: beta={beta!r} lies outside [beta_min, beta_max] = [{beta_min}, {beta_max}]; "
                             "pick a starting beta inside the bounds or widen them")
        if int(window) != window:
            raise ValueError(f"BandKL: window={window!r} must be a whole number of updates")
        self.value = float(beta)
        self.low, self.high = float(low), float(high)
        self.window, self.up, self.down = int(window), float(up), float(down)
        self.beta_min, self.beta_max = float(beta_min), float(beta_max)
        self.history: list[float] = []
        self.num_nan_ignored = 0

    def update(self, observed_kl: float) -> float:
        if math.isnan(observed_kl):
            self.num_nan_ignored += 1
            return self.value
        self.history.append(float(observed_kl))
        if len(self.history) < self.window:
            return self.value
        median = statistics.median(self.history)
        if median > self.high:
            self.value *= self.up
        elif median < self.low:
            self.value *= self.down
        self.value = min(max(self.value, self.beta_min), self.beta_max)
        self.history = []
        return self.value

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value, "low": self.low, "high": self.high, "window": self.window, "up": self.up,
                "down": self.down, "beta_min": self.beta_min, "beta_max": self.beta_max,
                "history": list(self.history), "num_nan_ignored": self.num_nan_ignored}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])
        self.low, self.high = float(state["low"]), float(state["high"])
        self.window, self.up, self.down = int(state["window"]), float(state["up"]), float(state["down"])
        self.beta_min, self.beta_max = float(state["beta_min"]), float(state["beta_max"])
        self.history = [float(x) for x in state["history"]]
        self.num_nan_ignored = int(state["num_nan_ignored"])


KL_CONTROLLERS: dict[str, type] = {"fixed": FixedKL, "adaptive": AdaptiveKL, "band": BandKL}


def make_controller(kind: str, **kwargs: Any) -> FixedKL | AdaptiveKL | BandKL:
    """Build a controller by name ("fixed", "adaptive", "band") from keyword arguments.

    Raises ValueError naming the kind and its accepted arguments for an unknown kind, missing or unknown arguments,
    or bad values.
    """
    if kind not in KL_CONTROLLERS:
        raise ValueError(f"make_controller: unknown KL controller {kind!r}; valid kinds: {sorted(KL_CONTROLLERS)}")
    cls = KL_CONTROLLERS[kind]
    signature = inspect.signature(cls)
    try:
        signature.bind(**kwargs)
    except TypeError as err:
        raise ValueError(f"make_controller({kind!r}): {err}; accepted arguments: {signature}") from err
    return cls(**kwargs)
