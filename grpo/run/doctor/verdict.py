"""The run doctor: the checks of grpo/run/doctor/window_checks.py over a moving window of the step metrics, online
(`Doctor.update` every RL step) and at the end of a run (`check_history`: the same Doctor replayed over metrics.jsonl,
plus the whole-run counts and the held-out gains of grpo/run/doctor/end_checks.py), and a verdict.

Verdict (`verdict`), one word everywhere (report.json, `train()`'s run.report, and upper-cased on the console): red
when any red finding is active at the end; else "too short to judge" when the run has fewer than `min_steps` RL
steps; else yellow for any warning; else green, which needs every task's held-out reward to have
risen (or to sit at the solved level) and no alarm. Each `Finding` names its evidence (steps, shares, values) and
one next step: a config field and a value to try. A finding is active while its condition holds; `Doctor.update`
returns the ones that became active at that step, and `Doctor.cleared` lists the ones that stopped holding.

Pure: metric rows in, findings out; no I/O, no torch (the report reads a jsonl file with it and should not pay the
torch import).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping, Sequence

from grpo.run.doctor.end_checks import heldout_gains, whole_run
from grpo.run.doctor.thresholds import (
    GRAPH_CODES,
    ONLINE_CODES,
    PROMPT_CODES,
    TOOL_CODES,
    DoctorThresholds,
    Finding,
    Level,
    is_rl_row,
    mean,
    number,
    series,
    tasks_in,
)
from grpo.run.doctor.window_checks import WINDOW_CHECKS, dead_step
from grpo.run.trl.vocabulary import in_user_terms

__all__ = ["Alarm", "Doctor", "Finding", "DoctorThresholds", "ONLINE_CODES", "TOO_SHORT", "check_history",
           "heldout_series",
           "replayed", "rl_steps", "series", "tasks_in", "verdict"]

TOO_SHORT = "too short to judge"
"""The verdict of a run too short for the checks that compare its start with its end: the same words in report.json,
the Python API and the console (which upper-cases every verdict)."""
LEVEL_ORDER = {"green": 0, "yellow": 1, TOO_SHORT: 2, "red": 3}


@dataclass(frozen=True)
class Alarm:
    """A window finding that fired during the run and cleared before its end: (code, task, level, first and last step
    active, the message of its last step)."""

    code: str
    task: str
    level: Level
    first_step: int
    last_step: int
    message: str


# ---------------------------------------------------------------------------------------------------------------
# The online doctor
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class _Streak:
    """Consecutive steps a condition held: length, first step, and a tag (e.g. which side of a band)."""

    length: int = 0
    start: int = -1
    tag: str = ""

    def push(self, on: bool, step: int, tag: str = "") -> None:
        if on and self.length and tag == self.tag:
            self.length += 1
        elif on:
            self.length, self.start, self.tag = 1, step, tag
        else:
            self.length, self.tag = 0, ""


@dataclass
class _Best:
    value: float
    first_step: int
    last_step: int


class Doctor:
    """The window checks, one RL step at a time.

        doctor = Doctor(DoctorThresholds(), kl_bands={"fairness": (0.0, 0.5)}, config=config_dict)
        for step ...:
            fired = doctor.update(metrics, evals)      # findings that became active at this step
            metrics |= doctor.metrics()                 # doctor/<code> = 1.0 while active, else 0.0

    `metrics` is one step's row as the trainer logs it; rows that are not RL steps (eval rows: eval/<task>/reward)
    only feed the held-out series. `evals` is eval.json's dict ({"before_sft"|"after_sft"|"step_N"|"after_rl": {task:
    reward}}) and replaces that series when given. `config` (config.json's dict) fills in the values of the
    suggestions, and its train.trl_names the words they are given in (`spoken`). A finding stays active while its
    condition holds; `cleared` lists the ones that stopped holding.
    """

    def __init__(self, thresholds: DoctorThresholds | None = None,
                 kl_bands: Mapping[str, tuple[float, float]] | None = None,
                 config: Mapping[str, Any] | None = None) -> None:
        self.th = thresholds or DoctorThresholds()
        if self.th.recent_window < 1 or self.th.no_signal_steps < 1 or self.th.kl_band_patience < 1:
            raise ValueError(f"DoctorThresholds: recent_window={self.th.recent_window}, no_signal_steps="
                             f"{self.th.no_signal_steps} and kl_band_patience={self.th.kl_band_patience} must be >= 1")
        self.kl_bands = dict(kl_bands or {})
        self.config = dict(config or {})
        self.window: deque[dict[str, Any]] = deque(maxlen=self.th.recent_window)
        self.steps = 0
        self.first_rl_step: int | None = None
        self.start: dict[str, float] = {}
        self.best: dict[str, _Best] = {}
        self.heldout: dict[str, list[tuple[int, float]]] = {}
        self.dead = _Streak()
        self.kl_out: dict[str, _Streak] = {}
        self.kl_high: dict[str, _Streak] = {}
        self.active: dict[tuple[str, str, str], tuple[int, Finding]] = {}
        self.cleared: list[Alarm] = []
        self.last_step = 0
        self._prev_step = 0
        self.sft_loss_last: float | None = None
        self.sft_skipped = False
        self.raw_prompts: dict[str, float] = {}
        self.prompt_codes = False
        """A prompt-format finding fired or plain-string prompts were logged: their doctor/<code> metrics are too."""

    # ----- feeding -----
    def update(self, metrics: Mapping[str, Any],
               evals: Mapping[str, Mapping[str, float]] | None = None) -> list[Finding]:
        """Feed one logged row; return the findings that fired at this step (active now, not at the previous step)."""
        step = int(metrics.get("step", self.last_step + 1))
        if number(metrics.get("sft/loss_last")) is not None:
            self.sft_loss_last = float(metrics["sft/loss_last"])
        self.sft_skipped = self.sft_skipped or bool(number(metrics.get("sft/skipped")))
        for key, value in metrics.items():
            if key.startswith("data/") and key.endswith("/raw_prompts") and number(value):
                self.raw_prompts[key[len("data/"):-len("/raw_prompts")]] = float(value)
        for key, value in metrics.items():
            if key.startswith("eval/") and key.endswith("/reward") and number(value) is not None:
                self.heldout.setdefault(key[len("eval/"):-len("/reward")], []).append((step, float(value)))
        if evals is not None:
            self.heldout = heldout_series(evals, step)
        if not is_rl_row(metrics):  # an eval row: the held-out series changed, the window did not
            return self._transition(self._conditions(), self.last_step) if self.window else []
        self.steps += 1
        self.last_step = step
        if self.first_rl_step is None:
            self.first_rl_step = step
        self.window.append(dict(metrics))
        self._track(metrics, step)
        return self._transition(self._conditions(), step)

    def replay(self, rows: Iterable[Mapping[str, Any]]) -> list[tuple[int, Finding]]:
        """Feed logged rows in order (e.g. metrics.jsonl after a resume); returns (step, finding) for each firing."""
        fired = []
        for row in rows:
            fired += [(self.last_step, f) for f in self.update(row)]
        return fired

    def _track(self, row: Mapping[str, Any], step: int) -> None:
        th = self.th
        self.dead.push(dead_step(row, th), step)
        for key in row:
            if key.startswith("kl/"):
                value = number(row[key])
                if value is None or not math.isfinite(value):
                    continue
                task = key[3:]
                low, high = self.kl_bands.get(task, (-math.inf, math.inf))
                side = "above" if value > high else "below" if value < low else ""
                self.kl_out.setdefault(task, _Streak()).push(bool(side), step, side)
                limit = th.kl_runaway_factor * high if task in self.kl_bands else th.kl_runaway_nats
                self.kl_high.setdefault(task, _Streak()).push(value > limit, step)
        if len(self.window) < th.recent_window:
            return
        first, last = int(self.window[0].get("step", step)), step
        for key in self._window_keys():
            window_mean = self.wmean(key)
            if not math.isfinite(window_mean):
                continue
            self.start.setdefault(key, window_mean)  # the first full window
            if key.startswith("reward/") and (key not in self.best or window_mean > self.best[key].value):
                self.best[key] = _Best(window_mean, first, last)

    def _window_keys(self) -> list[str]:
        keys = {k for row in self.window for k in row}
        return sorted(k for k in keys if (k.startswith("reward/") and k.endswith("/mean")) or k.startswith("entropy/")
                      or (k.startswith("rollout/") and k.endswith("/top_share")))

    # ----- reading the window -----
    def wmean(self, key: str) -> float:
        """Mean of the finite numeric values of `key` over the window rows (NaN when there are none)."""
        return mean(v for row in self.window if (v := number(row.get(key))) is not None)

    def span(self) -> str:
        first, last = self.window[0].get("step", "?"), self.window[-1].get("step", "?")
        return f"step {last}" if first == last else f"steps {first}-{last}"

    def tasks(self) -> list[str]:
        return tasks_in(self.window, "reward/", "/mean")

    def heldout_after_start(self, task: str) -> tuple[float | None, float | None, list[tuple[int, float]]]:
        """(held-out before RL, best held-out, points after RL started) for `task`."""
        points = self.heldout.get(task, [])
        rl_from = self.first_rl_step if self.first_rl_step is not None else math.inf
        before = [v for s, v in points if s < rl_from]
        after = [(s, v) for s, v in points if s >= rl_from]
        best = max((v for _, v in points), default=None)
        return (before[-1] if before else None), best, after

    # ----- findings -----
    def _conditions(self) -> list[Finding]:
        out: list[Finding] = []
        for check_ in WINDOW_CHECKS:
            out += check_(self, out)
        return out

    def _transition(self, now: list[Finding], step: int) -> list[Finding]:
        keyed = {(f.code, f.task, f.level): f for f in now}  # a yellow that turns red fires again
        for key, (first, finding) in list(self.active.items()):
            if key not in keyed:
                self.cleared.append(Alarm(finding.code, finding.task, finding.level, first, self._prev_step,
                                          in_user_terms(finding.message, self.config)))
                del self.active[key]
        fired = [self.spoken(f) for key, f in keyed.items() if key not in self.active]
        for key, f in keyed.items():
            self.active[key] = (self.active[key][0] if key in self.active else step, f)
        self._prev_step = step
        return fired

    def findings(self) -> list[Finding]:
        """The findings active now, in check order, each with the step it fired at (`since`), in the user's words."""
        return [self.spoken(replace(f, since=first)) for first, f in self.active.values()]

    def spoken(self, f: Finding) -> Finding:
        """A finding in the words the run was configured with: the TRL field or flag for each grpo-dual field a TRL
        config set (train.trl_names; grpo/run/trl/vocabulary.py), ours in brackets."""
        return replace(f, message=in_user_terms(f.message, self.config),
                       suggestion=in_user_terms(f.suggestion, self.config))

    def metrics(self) -> dict[str, float]:
        """doctor/<code> = 1.0 while a finding with that code is active (any task), else 0.0, for every code; and
        doctor/red = how many red findings are active. Scalars, so TensorBoard draws them."""
        codes = {code for code, _, _ in self.active}
        self.prompt_codes = self.prompt_codes or bool(self.raw_prompts) or bool(codes & set(PROMPT_CODES))
        rollout = self.config.get("rollout") or {}
        tools = bool(rollout.get("tools") or rollout.get("environment_factory"))  # a run with tools logs their codes
        graph = any("rollout/graph_compiles" in row for row in self.window)  # so does a run the graph engine decodes
        out = {f"doctor/{code}": float(code in codes)
               for code in ONLINE_CODES + (TOOL_CODES if tools else ()) + (GRAPH_CODES if graph else ())
               + (PROMPT_CODES if self.prompt_codes else ())}
        out["doctor/red"] = float(sum(f.level == "red" for _, f in self.active.values()))
        return out


def heldout_series(evals: Mapping[str, Mapping[str, float]], step_now: int) -> dict[str, list[tuple[int, float]]]:
    """Held-out reward per task as (step, reward) from eval.json's phases: before_sft / after_sft at step 0, step_N at
    N, after_rl at `step_now`; in step order (phases at the same step keep eval.json's order)."""
    points: dict[str, list[tuple[int, float]]] = {}
    for phase, results in evals.items():
        if phase in ("before_sft", "after_sft"):
            step = 0
        elif phase.startswith("step_") and phase[5:].isdigit():
            step = int(phase[5:])
        else:
            step = step_now
        for task, value in results.items():
            if number(value) is not None:
                points.setdefault(task, []).append((step, float(value)))
    return {t: sorted(p, key=lambda sv: sv[0]) for t, p in points.items()}


def check_history(history: Sequence[Mapping[str, Any]], thresholds: DoctorThresholds | None = None,
          kl_bands: Mapping[str, tuple[float, float]] | None = None,
          evals: Mapping[str, Mapping[str, float]] | None = None,
          config: Mapping[str, Any] | None = None) -> list[Finding]:
    """All findings for a metric history (rows as logged to metrics.jsonl, in step order): the window checks active at
    its end (a `Doctor` replayed over it), whole-run counts, and the held-out gains.

    `kl_bands` maps task -> (low, high); tasks without a band get only the absolute runaway check. `evals` is
    eval.json; without it the eval rows of the history are used. `config` (config.json) fills in the suggestions'
    values. Pure: returns findings, decides nothing.
    """
    doctor = replayed(history, thresholds, kl_bands, evals, config)
    found = doctor.findings()
    more = whole_run(history, doctor.th, doctor.config, {f.code for f in found})
    more += heldout_gains(history, doctor.th, evals, doctor.config, doctor)
    return found + [doctor.spoken(f) for f in more]


def replayed(history: Sequence[Mapping[str, Any]], thresholds: DoctorThresholds | None = None,
             kl_bands: Mapping[str, tuple[float, float]] | None = None,
             evals: Mapping[str, Mapping[str, float]] | None = None,
             config: Mapping[str, Any] | None = None) -> Doctor:
    """A Doctor fed every row of `history` (then eval.json's held-out series, when given)."""
    doctor = Doctor(thresholds, kl_bands, config)
    last_rl = max((i for i, r in enumerate(history) if is_rl_row(r)), default=-1)
    for i, row in enumerate(history):
        doctor.update(row, evals if (evals and i == last_rl) else None)
    return doctor


def rl_steps(history: Iterable[Mapping[str, Any]]) -> int:
    """How many RL steps a history holds."""
    return sum(is_rl_row(r) for r in history)


LEARNING_CODES = frozenset({"reward_stuck", "reward_regressed"})
"""Findings that compare rewards over time: a run shorter than min_steps (a smoke test) is too short for them to
decide the verdict (a held-out score a few steps after the start moves by noise). The others make it red at once:
non-finite values, skipped steps, judge failures, KL runaway, and no learning signal (steps in a row in which every
group's rewards were equal: nothing could be learned, however short the run)."""


def verdict(findings: Sequence[Finding], steps: int | None = None,
            thresholds: DoctorThresholds | None = None, training_only: Sequence[str] = ()) -> tuple[str, list[str]]:
    """("green"|"yellow"|TOO_SHORT|"red", reasons). Red when any finding is red, except a LEARNING_CODES finding
    in a run shorter than thresholds.min_steps (`steps`: RL steps of the run, None = not known), which is then
    TOO_SHORT as a run without a red finding is; else the worst level present; green needs no finding at all.
    Reasons list red findings first. `training_only`: the tasks judged from their training rewards (no held-out
    rows: end_checks.judged_from_training), which the green reason names."""
    th = thresholds or DoctorThresholds()
    ordered = sorted(findings, key=lambda f: -LEVEL_ORDER[f.level])
    reasons = [f"[{f.level}] {f.code}: {f.message}" for f in ordered]
    short = steps is not None and steps < th.min_steps
    if any(f.level == "red" and not (short and f.code in LEARNING_CODES) for f in ordered):
        return "red", reasons
    if short:
        return TOO_SHORT, [f"{TOO_SHORT}: {steps} RL step(s), at least {th.min_steps} are needed to compare "
                             "the start of training with its end (no red alarm of a broken run)"] + reasons
    if ordered:
        return ordered[0].level, reasons
    if training_only:
        return "green", [f"every task's reward rose (or is solved): held-out, or the training reward for "
                         f"{', '.join(training_only)}, which had no held-out rows; no health check fired"]
    return "green", ["every task's held-out reward rose (or is solved) and no health check fired"]
