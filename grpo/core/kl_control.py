"""KL coefficient (β) controllers: `.value` is the β to use, `.update(observed_kl)` adapts it once per step.

Formulas (one line each, with the source):
- FixedKL:     β stays constant                                          (DeepSeekMath GRPO)
- AdaptiveKL:  β ← β · (1 + clip(KL/target − 1, −0.2, 0.2) · n/horizon)  (Ziegler et al. 2019, arXiv 1909.08593, §2.2)
- BandKL:      every `window` updates, m = median(KL); m > high → β·up; m < low → β·down; β ∈ [β_min, β_max]
               (this project)

A NaN observed KL (e.g. a step whose KL term was not computed) is ignored, never averaged in, and counted in
`num_nan_ignored`. Controllers hold plain Python floats, so `state_dict()` is JSON-serialisable.
"""

from __future__ import annotations

import inspect
import math
import statistics
from typing import Any, Callable

from grpo.core.registry import Registry

ADAPTIVE_ERROR_CLIP = 0.2
"""Ziegler et al. clip the proportional error to ±0.2 so one noisy KL estimate moves β by at most 20%·n/horizon."""

BAND_BETA_MIN = 1e-4
"""Default floor for BandKL: a multiplicative controller can never leave 0, so β must stay strictly positive."""
BAND_BETA_MAX = 10.0
"""Default ceiling for BandKL: past ~10 the KL term swamps any reward signal of order 1."""


ArgumentRule = tuple[str, Callable[[dict[str, Any]], bool], str]
"""(argument, predicate over all the arguments, what a valid value looks like)."""


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def _positive(name: str) -> ArgumentRule:
    return name, lambda a: _finite(a[name]) and a[name] > 0, "must be a finite number > 0"


RULES: dict[str, tuple[ArgumentRule, ...]] = {
    "fixed": (("beta", lambda a: _finite(a["beta"]) and a["beta"] >= 0,
               "must be a finite number ≥ 0 (0 disables the KL term)"),),
    "adaptive": (_positive("beta"), _positive("target"), _positive("horizon"), _positive("n_steps")),
    "band": (_positive("beta"), _positive("high"), _positive("beta_min"), _positive("beta_max"), _positive("window"),
             ("low", lambda a: _finite(a["low"]) and 0 <= a["low"] <= a["high"],
              "needs 0 ≤ low ≤ high (the band's lower edge)"),
             ("up", lambda a: _finite(a["up"]) and a["up"] > 1, "must be > 1 (β grows when the KL is above the band)"),
             ("down", lambda a: _finite(a["down"]) and 0 < a["down"] < 1,
              "must lie in (0, 1) (β shrinks when the KL is below the band)"),
             ("beta_min", lambda a: a["beta_min"] <= a["beta_max"], "must be ≤ beta_max"),
             ("beta", lambda a: a["beta_min"] <= a["beta"] <= a["beta_max"],
              "lies outside [beta_min, beta_max]: pick a starting beta inside the bounds or widen them"),
             ("window", lambda a: int(a["window"]) == a["window"], "must be a whole number of updates")),
}
"""Every rule on each controller's arguments, checked in order; the one home of these rules: the constructors
raise on the first broken one, and the config check (grpo/run/assembly/config_check.py) reports it under the config
field."""


def controller_problem(kind: str, **kwargs: Any) -> tuple[str, str] | None:
    """(argument, what is wrong) for the first rule of controller `kind` that `kwargs` break (defaults filled in),
    or None when all hold. `kind` must be one of KL_CONTROLLERS and `kwargs` its arguments."""
    bound = inspect.signature(KL_CONTROLLERS[kind]).bind(**kwargs)
    bound.apply_defaults()
    args = dict(bound.arguments)
    for argument, holds, fix in RULES[kind]:
        if not holds(args):
            return argument, fix
    return None


def _check(cls: type, **kwargs: Any) -> None:
    problem = controller_problem(CONTROLLER_KINDS[cls], **kwargs)
    if problem is not None:
        argument, fix = problem
        raise ValueError(f"{cls.__name__}: {argument}={kwargs[argument]!r} {fix}")


class FixedKL:
    """β constant; `update` only records NaNs so all controllers report the same fields."""

    def __init__(self, beta: float) -> None:
        _check(FixedKL, beta=beta)
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
        _check(AdaptiveKL, beta=beta, target=target, horizon=horizon, n_steps=n_steps)
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
        _check(BandKL, beta=beta, low=low, high=high, window=window, up=up, down=down, beta_min=beta_min,
               beta_max=beta_max)
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


KL_CONTROLLERS: Registry[type] = Registry("kl.<task>.controller", "KL controller")
"""The controllers by name: the one list of the names kl.<task>.controller accepts."""
KL_CONTROLLERS.register("fixed", "β stays at kl.<task>.beta", FixedKL)
KL_CONTROLLERS.register("adaptive", "β steered towards kl.<task>.target (Ziegler et al.'s proportional controller)",
                        AdaptiveKL)
KL_CONTROLLERS.register("band", "β times up / down when the window's median KL leaves [band_low, band_high]", BandKL)
CONTROLLER_KINDS = {cls: kind for kind, cls in KL_CONTROLLERS.items()}
Controller = FixedKL | AdaptiveKL | BandKL

CONFIG_FIELDS = {"low": "band_low", "high": "band_high"}
"""Controller argument -> kl.<task> field (grpo/config TaskKLConfig), where the names differ."""
NOT_CONFIGURED = frozenset({"n_steps"})
"""Controller arguments no config field sets: AdaptiveKL.n_steps stays 1 (one observation per RL step)."""


def controller_args(section: Any) -> tuple[str, dict[str, Any]]:
    """(kind, keyword arguments) of the controller a kl.<task> section (grpo/config TaskKLConfig, read by its field
    names) describes: only the fields its kind uses."""
    kind = section.controller
    names = [p for p in inspect.signature(KL_CONTROLLERS[kind]).parameters if p not in NOT_CONFIGURED]
    return kind, {name: getattr(section, CONFIG_FIELDS.get(name, name)) for name in names}


def controller_from_config(section: Any) -> Controller:
    """The β controller of one task's kl section."""
    kind, kwargs = controller_args(section)
    return make_controller(kind, **kwargs)


def make_controller(kind: str, **kwargs: Any) -> Controller:
    """Build a controller by name ("fixed", "adaptive", "band") from keyword arguments.

    Raises ValueError naming the kind and its accepted arguments for an unknown kind, missing or unknown arguments,
    or bad values.
    """
    cls = KL_CONTROLLERS.get(kind)
    signature = inspect.signature(cls)
    try:
        signature.bind(**kwargs)
    except TypeError as err:
        raise ValueError(f"make_controller({kind!r}): {err}; accepted arguments: {signature}") from err
    return cls(**kwargs)
