"""What the run doctor measures with: the thresholds (`DoctorThresholds`), the `Finding` every check returns, the
finding codes logged as doctor/<code>, what a window check reads of the doctor (`Window`), the readers of metric
rows, and the wording of a finding's one next step (a config field and a value to try).

The checks are grpo/run/doctor/window_checks.py's (over the moving window of RL steps) and
grpo/run/doctor/end_checks.py's (at the end of a run, over the held-out evaluations); grpo/run/doctor/verdict.py holds
the window (a `Doctor`) that runs them, and the verdict. Pure: metric rows in, findings out; no I/O, no torch.

Formulas (one line each): window mean = mean of the finite values of a key over the window rows; judge failure rate
= Σ judge/failures / Σ judge/calls (per-step counts; DESIGN.md rule 8); entropy drop = 1 − mean(last window) /
mean(first window) (entropy collapse, DAPO §3.1); held-out gain = eval after RL − eval before RL (after SFT when
present, else before SFT).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Literal, Mapping, Protocol, Sequence

Level = Literal["yellow", "red"]


@dataclass(frozen=True)
class DoctorThresholds:
    """When a metric series is unhealthy. Rates are fractions in [0, 1]; windows and patience count RL steps."""

    recent_window: int = 10
    """RL steps in the moving window. Ten steps average out one step's batch noise (8 prompts per task in the demo)
    and still react within a tenth of a 100-step run."""
    min_steps: int = 20
    """RL steps below which a run without a red alarm is "too short to judge": the checks compare the last window with
    the first, so two whole windows are needed."""
    no_signal_steps: int = 5
    """Steps in a row without learning signal that are red. A group is zero-std by chance with probability q < 1; all
    of 16 groups for 5 steps running at q = 0.5 is 2^-80: no chance, the run is dead."""
    stuck_tolerance: float = 0.05
    """A task's window-mean reward within this of its start (and never above start + this) is "flat": one right answer
    in 20 samples, below what a learning policy adds in a window."""
    zero_std_max: float = 0.5
    """Fraction of a task's groups that are zero-std (advantage 0 everywhere) above which they are "most"
    (reward_stuck); and the fraction of zero-std groups not explained by solved prompts (z − r, see `_zero_std`) that is
    a warning."""
    solved_reward: float = 0.9
    """Mean reward at or above which equal rewards in a group mean "solved", not "no signal" (rule graders score
    0..1)."""
    collapse_share: float = 0.6
    """Window-mean share of the top answer class that is flagged. The demo's tasks have three balanced answers, 8
    prompts of a task per step: measured over 10-step windows, a policy that answers right stays at or below 0.50
    (seeds 0 and 1), and seed 1's plateau of mixed "no" / "unknown" answers (held-out 0.69) peaked at 0.60."""
    collapse_rise: float = 0.1
    """How much the window's top-answer share must have risen above the first window's for a dominant answer to be a
    collapse: a reply opening most samples share from the start is the task's format (free-form replies that all begin
    "Based on the context"), not a collapse RL caused. Measured with the Doctor on the demo fixtures: the collapses
    fired at 0.40 -> 0.62 (seed 1 as reported) and 0.30 -> 0.61 (seed 1 at lr 1e-3); 0.1 is half the smaller rise and
    about five times the noise of a 10-step mean over the demo's 48 samples per task and step. An entropy fall would
    not tell them apart: healthy seeds 0 and 1 lose 75-85% of their first window's entropy, more than the reported
    collapse had lost (38%) when it fired, and free-form replies lose entropy during RL too."""
    collapse_reward_gap: float = 0.05
    """How far below its best window a task's reward must be for a dominant answer to count as collapse (and for an
    entropy fall to be a warning): a collapse onto the right answer of an easy task is not a failure."""
    entropy_floor: float = 0.05
    """Mean token entropy (nats) below which the policy samples nearly the same completion K times."""
    entropy_drop_max: float = 0.8
    """Relative fall of mean entropy from the first window to the last that counts as an entropy collapse."""
    heldout_drop: float = 0.05
    """A held-out reward more than this below its best is "falling" (about 3 of the demo's 64 held-out prompts)."""
    kl_band_patience: int = 20
    """Consecutive steps `kl/<task>` may sit outside its band before it is flagged. A band controller needs a few
    tens of steps to pull KL back, so a short excursion is normal."""
    kl_runaway_factor: float = 3.0
    """KL above this multiple of its band's top for `kl_band_patience` steps is a runaway (red): β is not catching
    up."""
    kl_runaway_nats: float = 1.0
    """Per-token KL (nats) that is a runaway for a task without a band: the policy's tokens are e times less likely
    under the reference on average."""
    truncation_max: float = 0.2
    """Fraction of completions hitting max_new_tokens that is flagged: truncated answers are graded unfinished."""
    judge_failure_max: float = 0.05
    """Fraction of failed judge calls that is flagged; failures are excluded from groups, so they shrink batches."""
    judge_failure_red: float = 0.25
    """Fraction of failed judge calls that is red: a quarter of the reward signal is missing."""
    skipped_max: float = 0.1
    """Fraction of optimizer steps skipped or restored that is flagged red; any restore at all is yellow."""
    reward_regression_red: float = 0.05
    """A held-out reward drop (after RL vs before RL) larger than this is red; a gain ≤ 0 is yellow."""
    tool_min_calls: float = 0.05
    """Tool calls per rollout (window mean) below which a run with tools "never calls its tool": one call in 20
    rollouts leaves RL almost no trajectory that used the tool to reinforce."""
    tool_failure_max: float = 0.25
    """Share of a window's tool calls that failed (malformed, unknown tool, raised, timed out) above which tool errors
    are flagged; red above `tool_failure_red`. The model is told every error, but a failed call is a wasted turn."""
    tool_failure_red: float = 0.5
    """Share of failed tool calls that is red: most calls teach the model nothing but the error message."""
    tool_loop_max: float = 0.3
    """Share of trajectories ended by a limit (rollout.max_tool_turns or the token budget) above which the rollouts
    "loop to the limit": the model keeps calling instead of answering."""
    memory_rise_steps: float = 0.8
    """Share of a window's steps at which host memory (memory/host_rss_gb) must have risen for it to be "growing step
    over step": a leak adds at every step, while a run's working set (and what its allocator keeps free, up to
    grpo/machine/host_resources.py's TRIM_FROM_BYTES) moves up and down around a level."""
    memory_growth_share: float = 0.1
    """How much host memory must have grown over that window, as a share of its first step's: 10 % in 10 steps is a
    run that doubles its memory every ~100 steps."""
    memory_growth_min_gb: float = 0.05
    """...and at least this many GiB (5 MB a step over the default window): below it a small run's Python objects
    (the doctor's own window, a metrics row) move the share."""
    empty_share: float = 0.5
    """Share of a task's completions over the window that hold no word (EMPTY_ANSWER, the answer class of a completion
    with no text or only punctuation: the reply ended at once) above which they are "most": a yellow finding, the
    prompts' format first suspected. A right reply is never empty, so such a task is mostly not answered."""
    empty_red: float = 0.8
    """...and red above this: a group of 8 then holds 1.6 non-empty replies on average, so most groups are all
    empty, of one reward, and give no learning signal."""
    recompile_steps: int = 3
    """Steps of a window, after the first window, at which the graph engine compiled its decoding step that make a
    run "keep recompiling": the step is compiled once per sampling settings for every shape (sampled rollouts, greedy
    evaluation), so a run meets its compiles in its first steps (tens of seconds each on a GPU); a shape torch cannot
    serve from that graph (a batch of one row) adds one; a step in three is a step that never settles."""


@dataclass(frozen=True)
class Finding:
    """One health problem: how bad, a stable code to test and grep for, what was seen, and what to try."""

    level: Level
    code: str
    message: str
    suggestion: str
    task: str = ""
    """The task it is about, "" for the whole run."""
    since: int | None = None
    """For a window finding: the step it fired at and has held since (set by Doctor.findings)."""


ONLINE_CODES = ("no_learning_signal", "reward_stuck", "answer_collapse", "entropy_collapse", "entropy_drop",
                "kl_runaway", "kl_out_of_band", "judge_failures", "truncation", "zero_std_groups", "non_finite",
                "memory_growth")
"""Codes the window checks can raise; `Doctor.metrics` logs each as doctor/<code> (1 when active) every step."""
TOOL_CODES = ("tool_unused", "tool_failures", "tool_loops")
"""Codes of the tool checks (`_tools`), logged as doctor/<code> only by runs with tools (rollout.tools)."""
PROMPT_CODES = ("empty_completions", "template_less_prompts")
"""Codes of the prompt-format checks (`_empty_completions`), logged as doctor/<code> only by runs with plain-string
prompts for a chat model (data/<task>/raw_prompts) or once one has fired."""
GRAPH_CODES = ("graph_recompiling",)
"""Codes of the graph engine's check (`_recompiling`), logged as doctor/<code> only by runs whose rollouts it decodes
(their rows carry rollout/graph_compiles)."""


# ---------------------------------------------------------------------------------------------------------------
# Reading metric rows
# ---------------------------------------------------------------------------------------------------------------


class Window(Protocol):
    """What a window check reads of the run doctor (grpo.run.doctor.verdict.Doctor is one). Declared here, where the
    checks are, so that they need not import the doctor that calls them: the two modules import one way."""

    th: DoctorThresholds
    config: dict[str, Any]
    kl_bands: dict[str, tuple[float, float]]
    window: Sequence[dict[str, Any]]
    """The last th.recent_window RL step rows."""
    steps: int
    start: dict[str, float]
    """Each windowed key's mean over the first full window."""
    best: dict[str, Any]
    """reward/<task>/mean -> its best window (.value, .first_step, .last_step)."""
    dead: Any
    """The streak of dead steps (.length, .start)."""
    kl_out: dict[str, Any]
    kl_high: dict[str, Any]
    last_step: int
    sft_loss_last: float | None
    sft_skipped: bool
    """The SFT warm-up was asked for and skipped: no training row has a target (metric sft/skipped)."""
    raw_prompts: dict[str, float]
    """task -> share of its training rows whose prompt is a plain string given to a model with a chat template,
    tokenized without it (data.prompt_format=trl; metric data/<task>/raw_prompts, logged at the start)."""

    def wmean(self, key: str) -> float: ...

    def span(self) -> str: ...

    def tasks(self) -> list[str]: ...

    def heldout_after_start(self, task: str) -> tuple[float | None, float | None, list[tuple[int, float]]]: ...


def tasks_in(history: Iterable[Mapping[str, Any]], prefix: str, suffix: str = "") -> list[str]:
    """Task names `t` for which some row has key `prefix + t + suffix`, in order of first appearance."""
    seen: dict[str, None] = {}
    for row in history:
        for key in row:
            if key.startswith(prefix) and key.endswith(suffix):
                task = key[len(prefix) : len(key) - len(suffix)]
                if task and "/" not in task:
                    seen.setdefault(task, None)
    return list(seen)


def number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def series(history: Sequence[Mapping[str, Any]], key: str) -> list[tuple[int, float]]:
    """(step, value) for every row holding a numeric `key`; non-finite values are kept (the caller decides)."""
    out = []
    for i, row in enumerate(history):
        value = number(row.get(key))
        if value is not None:
            out.append((int(row.get("step", i)), value))
    return out


def mean(values: Iterable[float]) -> float:
    vals = [v for v in values if math.isfinite(v)]
    return math.fsum(vals) / len(vals) if vals else math.nan  # fsum: ten steps at 0.6 average to 0.6, not 0.6 - 1ulp


def is_rl_row(row: Mapping[str, Any]) -> bool:
    """A row logged by an RL step (rewards, advantages or a loss), not an eval or SFT row."""
    return "adv/frac_zero_std" in row or "loss/total" in row or any(
        k.startswith("reward/") and k.endswith("/mean") for k in row)


def _setting(config: Mapping[str, Any], dotted: str) -> Any:
    """config["section"]["field"] of a config.json dict, or None."""
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _try(field_: str, value: Any, why: str) -> str:
    """The one next step of a finding: `field=value` (or the field and a direction when the value is unknown)."""
    shown = f"{value:g}" if isinstance(value, float) else value
    return f"try `{field_}={shown}`: {why}"


def _longer(config: Mapping[str, Any], why: str) -> str:
    """A run twice as long: twice train.num_epochs when the epochs decide the steps (TRL's num_train_epochs: then
    train.max_steps is counted from them and setting it changes nothing), else twice train.max_steps."""
    epochs = _setting(config, "train.num_epochs")
    if isinstance(epochs, (int, float)) and epochs > 0:
        return _try("train.num_epochs", float(2 * epochs), why)
    return _try("train.max_steps", _scaled(config, "train.max_steps", 2, int), why)


def _scaled(config: Mapping[str, Any], dotted: str, factor: float, cast=float) -> Any:
    value = _setting(config, dotted)
    return cast(value * factor) if isinstance(value, (int, float)) and not isinstance(value,
                                                                                      bool) else f"<{factor:g}× now>"
