"""What the run doctor looks for: the thresholds, the findings, and the checks over a window of step metrics.

`grpo/run/doctor.py` holds the window (a `Doctor`) and calls every check in WINDOW_CHECKS at each RL step; a check reads
the window through the Doctor (its rows, window means, first and best windows, streaks, held-out series) and returns
`Finding`s. The end-of-run checks (`whole_run`, `heldout_gains`) read the whole history. Pure: metric rows in,
findings out; no I/O, no torch.

Window checks (rows = the last `recent_window` RL steps; "start" = the first window; "best" = the best window so far):
  red     no_learning_signal  `no_signal_steps` steps in a row with every group zero-std (adv/frac_zero_std = 1), or
                              loss and grad norm both 0, while some task is below `solved_reward` (yellow before
                              that, while no step of the run had a signal)
  red     reward_stuck        a task's mean reward never rose more than `stuck_tolerance` above its start and is
                              still there, with more than `zero_std_max` of its groups zero-std
  red     answer_collapse     one answer class (rollout/<task>/top_answer, grpo/core/answer_metrics.py) is the top answer in most
                              window steps and holds ≥ `collapse_share` of the task's samples on average, at least
                              `collapse_rise` more than the top share of the first window, while the task's reward is
                              more than `collapse_reward_gap` below its best window or below `solved_reward` (one
                              answer that is not right for every prompt; rewards in [0, 1] only: on another scale
                              the fall from the best window alone)
  red     entropy_collapse    entropy below `entropy_floor` (or fallen by more than `entropy_drop_max` from the start)
                              while the latest held-out reward is more than `heldout_drop` below its best, or has
                              stalled below `solved_reward` over the last STALL_EVALS evaluations
  yellow  entropy_drop        the same entropy fall with no held-out reward after RL started, and the training reward
                              more than `collapse_reward_gap` below its best window
  red     kl_runaway          KL above `kl_runaway_factor` × the band's top (or `kl_runaway_nats` without a band) for
                              `kl_band_patience` steps in a row
  yellow  kl_out_of_band      KL outside its band for `kl_band_patience` steps in a row
  red     judge_failures      more than `judge_failure_red` of the window's judge calls failed (yellow above
                              `judge_failure_max`)
  yellow  truncation          more than `truncation_max` of a task's completions hit max_new_tokens
  yellow  zero_std_groups     z − r > `zero_std_max` for a task (z its zero-std fraction, r its mean reward: at most r
                              of the groups can be all-right), and no red finding on the same evidence (under dynamic
                              sampling it says how many of the task's groups a step were kept and trained on)
  red     non_finite          a NaN / inf metric
  yellow  tool_unused         (runs with tools) fewer than `tool_min_calls` tool calls per rollout
  red     tool_failures       more than `tool_failure_red` of the window's tool calls failed (yellow above
                              `tool_failure_max`)
  yellow  tool_loops          more than `tool_loop_max` of the trajectories ended on rollout.max_tool_turns or the
                              token budget
  yellow  memory_growth       host memory (memory/host_rss_gb) rose in at least `memory_rise_steps` of the window's
                              steps, by more than `memory_growth_share` of its first step's and `memory_growth_min_gb`
  red     empty_completions   more than `empty_red` of a task's completions empty over the window so far (yellow
                              above `empty_share`), the cause named when its prompts are plain strings for a chat
                              model (data/<task>/raw_prompts); yellow template_less_prompts: such prompts, replies not
                              (yet) mostly empty
  yellow  graph_recompiling   (runs the graph engine decodes) it compiled its decoding step at `recompile_steps`
                              or more steps of a window after the first
From the per-prompt held-out rewards (`heldout_fell`, read by grpo/run/report.py from evals/): yellow heldout_fell when
a task's held-out reward after RL is below its best evaluation during RL by more than FELL_Z standard errors of the
per-prompt difference.
End of run (grpo/run/doctor.check only): red skipped_steps / yellow restored_weights (the weight guard's counts), red
reward_regressed / yellow reward_flat (held-out after RL vs before RL; for a task without held-out rows under
data.heldout_fraction=0, TRL's split, the training reward's last window vs its first), yellow no_heldout (a trained
task never evaluated). From the held-out greedy completions (`heldout_collapse`, read by grpo/run/report.py from evals/):
red heldout_collapse when one answer class holds ≥ `collapse_share` of a task's after-RL evaluation, at least
`collapse_rise` more than before RL, while its held-out reward is below `solved_reward` (yellow when it held that
share before RL already). From the pass@K diagnostic before RL (pass_at_k.json, `sampled_at_chance`): yellow when a multiple-choice
task's pass@k is no higher than a uniform guess's among its options.

Formulas (one line each): window mean = mean of the finite values of a key over the window rows; judge failure rate
= Σ judge/failures / Σ judge/calls (per-step counts; DESIGN.md rule 8); entropy drop = 1 − mean(last window) /
mean(first window) (entropy collapse, DAPO §3.1); held-out gain = eval after RL − eval before RL (after SFT when
present, else before SFT).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Literal, Mapping, Protocol, Sequence

from grpo.core.answer_metrics import EMPTY_ANSWER, answer_shares

Level = Literal["yellow", "red"]

ZERO_SIGNAL = 1e-10
"""|loss| and grad norm at or below this are "no update": an all-zero-advantage step with the policy still equal to
its reference gives exactly 0 in fp32; any real gradient is many orders above it."""
ALL_GROUPS = 1.0 - 1e-9
"""adv/frac_zero_std at or above this means every group is zero-std (it is a ratio of small integers)."""
SFT_UNTAUGHT_LOSS = 1.0
"""SFT loss (nats per target token) at the end of the warm-up above which it did not teach the reply format: below
it each target token gets probability above e^-1 ≈ 0.37 on average. Measured on the demo: full fine-tuning ends at
0.38-0.42, LoRA on the randomly initialised tiny model at 3.96 (and then no sample ever scores)."""
STALL_EVALS = 3
"""Held-out evaluations since RL started that, all within `heldout_drop` of each other and below `solved_reward`,
make a stalled run (60 steps at the demo's eval_every 20)."""
COLLAPSE_DOMINANCE = 0.5
"""The collapsed answer must be the step's top answer in at least this fraction of the window steps: a high average
top share made of different answers is a policy that is sure of itself per batch, not one stuck on one answer."""


@dataclass(frozen=True)
class HealthThresholds:
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
    """Fraction of a task's groups that are zero-std (advantage 0 everywhere) above which they are "most" (reward_stuck);
    and the fraction of zero-std groups not explained by solved prompts (z − r, see `_zero_std`) that is a warning."""
    solved_reward: float = 0.9
    """Mean reward at or above which equal rewards in a group mean "solved", not "no signal" (rule graders score 0..1)."""
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
    """KL above this multiple of its band's top for `kl_band_patience` steps is a runaway (red): β is not catching up."""
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
    grpo/models/host_resources.py's TRIM_FROM_BYTES) moves up and down around a level."""
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
    """What a window check reads of the run doctor (grpo.run.doctor.Doctor is one). Declared here, where the checks
    are, so that they need not import the doctor that calls them: the two modules import one way."""

    th: HealthThresholds
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
    return cast(value * factor) if isinstance(value, (int, float)) and not isinstance(value, bool) else f"<{factor:g}× now>"


def dead_step(row: Mapping[str, Any], th: HealthThresholds) -> bool:
    """No learning signal in this step: every group zero-std, or loss and grad norm both 0; unless every task is
    solved (equal rewards because all are right)."""
    rewards = [v for k, v in row.items() if k.startswith("reward/") and k.endswith("/mean") and number(v) is not None]
    if rewards and all(math.isfinite(r) and r >= th.solved_reward for r in rewards):
        return False
    zero_std = number(row.get("adv/frac_zero_std"))
    loss, norm = number(row.get("loss/total")), number(row.get("health/grad_norm"))
    return ((zero_std is not None and zero_std >= ALL_GROUPS)
            or (loss is not None and norm is not None and abs(loss) <= ZERO_SIGNAL and abs(norm) <= ZERO_SIGNAL))


def _no_learning_signal(d: Window, _found: list[Finding]) -> list[Finding]:
    """Red after `no_signal_steps` dead steps in a row; yellow before that while every step of the run was dead (a
    run that starts without signal says so at once, e.g. a notebook's few steps)."""
    early = 0 < d.dead.length == d.steps
    if d.dead.length < d.th.no_signal_steps and not early:
        return []
    row = d.window[-1]
    how = ("every group had zero reward std" if (number(row.get("adv/frac_zero_std")) or 0) >= ALL_GROUPS
           else "loss and grad norm were 0")
    means = {t: d.wmean(f"reward/{t}/mean") for t in d.tasks()}
    rewards = ", ".join(f"{t} {r:.3f}" for t, r in means.items())
    never = bool(means) and all(r <= d.th.stuck_tolerance for r in means.values())
    empty = [f for f in _found if f.code == "empty_completions"]  # the replies are empty: that is what to fix
    fix = (empty[0].suggestion if empty else _format_fix(d) if never else
           _try("rollout.k", _scaled(d.config, "rollout.k", 2, int), "twice the samples per prompt give groups whose "
                "rewards differ"))
    if d.dead.length < d.th.no_signal_steps:
        return [Finding("yellow", "no_learning_signal",
                        f"no learning signal in any of the {d.steps} step(s) so far: {how}; mean reward "
                        f"{rewards or 'not logged'} (red at {d.th.no_signal_steps} steps in a row)", fix)]
    return [Finding("red", "no_learning_signal",
                    f"no learning signal for {d.dead.length} steps in a row (steps {d.dead.start}-{d.last_step}): "
                    f"{how}; mean reward {rewards or 'not logged'}", fix)]


def _format_fix(d: Window) -> str:
    """The next step for a policy whose samples (nearly) never score: the SFT warm-up that should teach the format;
    when the warm-up was asked for and never ran (no row has a target), more samples per prompt and a look at the
    reward function instead: a warm-up cannot be advised that the data cannot support."""
    loss, steps = d.sft_loss_last, _setting(d.config, "sft.steps")
    if d.sft_skipped:
        return _try("rollout.k", _scaled(d.config, "rollout.k", 2, int), "the SFT warm-up was skipped (no row has a "
                    "target), so the format is the base model's: more samples per prompt give groups whose rewards "
                    "differ; read samples/ and check the reward function on them")
    if loss is not None and loss > SFT_UNTAUGHT_LOSS and _setting(d.config, "model.lora"):
        return _try("model.lora", "false", f"the warm-up ended at loss {loss:.2f} nats per token (above "
                    f"{SFT_UNTAUGHT_LOSS:g}): the adapter could not fit the demonstrations, the whole model can (on the "
                    "demo's randomly initialised model, full fine-tuning ends the same warm-up at 0.38; a 10× SFT "
                    "learning rate left LoRA at 3.85)")
    if loss is not None and loss > SFT_UNTAUGHT_LOSS:
        return _try("sft.steps", 2 * steps if steps else 20, f"the warm-up ended at loss {loss:.2f} nats per token "
                    f"(above {SFT_UNTAUGHT_LOSS:g}): it did not teach the reply format")
    return _try("sft.steps", 2 * steps if steps else 20, "a longer warm-up teaches the reply format, so some samples "
                "of a group score; read samples/ to see what the policy says and check the reward on them")


def _task_zero_std(d: Window, task: str) -> float:
    own = d.wmean(f"adv/{task}/frac_zero_std")
    return own if math.isfinite(own) else d.wmean("adv/frac_zero_std")


def _unit_scale(d: Window, task: str) -> bool:
    """Whether the task's rewards read as rule-grader scores in [0, 1] (every step's mean reward in the window and
    the first window there): only then do "solved" (solved_reward) and "explained by solved groups" mean anything."""
    values = [v for row in d.window if (v := number(row.get(f"reward/{task}/mean"))) is not None]
    start = d.start.get(f"reward/{task}/mean")
    return bool(values) and all(0.0 <= v <= 1.0 for v in values) and (start is None or 0.0 <= start <= 1.0)


def reward_spread(d: Window, task: str) -> float:
    """The reward scale the stuck tolerance is a share of: 1 for rewards in [0, 1]; otherwise twice the window's mean
    within-step reward std (a 0 / 1 reward at p = 0.5 has std 0.5: twice that is the unit scale's 1)."""
    if _unit_scale(d, task):
        return 1.0
    spread = 2 * d.wmean(f"reward/{task}/std")
    return spread if math.isfinite(spread) and spread > 0 else 1.0


def _reward_stuck(d: Window, _found: list[Finding]) -> list[Finding]:
    th, out = d.th, []
    if d.steps < th.min_steps or len(d.window) < th.recent_window:
        return out
    for task in d.tasks():
        key = f"reward/{task}/mean"
        now, start, best = d.wmean(key), d.start.get(key), d.best.get(key)
        zero = _task_zero_std(d, task)
        if start is None or best is None or not math.isfinite(now) or not math.isfinite(zero):
            continue
        tolerance, unit = th.stuck_tolerance * reward_spread(d, task), _unit_scale(d, task)
        if (best.value - start <= tolerance and now - start <= tolerance
                and not (unit and now >= th.solved_reward) and zero > th.zero_std_max):
            out.append(Finding(
                "red", "reward_stuck",
                f"{task}: reward never left its start in {d.steps} steps: {now:.3f} in {d.span()}, {start:.3f} in the "
                f"first window, best window {best.value:.3f}; {100 * zero:.0f}% of its groups have zero reward std",
                _format_fix(d) if unit and now <= th.stuck_tolerance else
                _try("rollout.k", _scaled(d.config, "rollout.k", 2, int), "more samples per prompt make groups whose "
                     "rewards differ"),
                task))
    return out


RAW_CAUSE = ("its prompts are plain strings and the model has a chat template: they are tokenized without it, as "
             "TRL does for standard-format data, and an instruct model given raw text often ends its reply at once")
"""Why a chat model's replies to plain-string prompts are empty or off-format (the issue it fixes: SmolLM2-135M-Instruct
answered 75-88% of such rollouts and every greedy evaluation with nothing)."""
RAW_FIX = ("give the prompts as conversations ([{\"role\": \"user\", \"content\": text}], TRL's conversational "
           "format, which goes through the chat template) or apply the template to every prompt "
           "(data.prompt_format=chat); a stronger KL pull or more samples cannot help")
"""The fix of template-less prompts."""


def empty_fix(raw: bool) -> str:
    """The next step for replies that are mostly empty: the prompt format when the prompts were plain strings for a
    chat model (`raw`), else what else ends a reply at once."""
    return RAW_FIX if raw else ("read samples/: the replies hold no word; check the stop tokens "
                                "(rollout.stop_strings, the tokenizer's EOS) and the prompt's template, or warm up on "
                                "demonstrations of a reply (sft.steps)")


def empty_share(rows: Sequence[Mapping[str, Any]], task: str) -> float:
    """Mean share of a task's completions that held no word (EMPTY_ANSWER: no text, or only punctuation) over
    `rows`: a step's top answer class and its share (grpo/core/answer_metrics.py) say it exactly when most were (that class
    is then the top one); a step whose top class is another counts 0 (at most half of it was). NaN without a row of
    the task."""
    shares = [(number(r.get(f"rollout/{task}/top_share")) or 0.0) if r.get(f"rollout/{task}/top_answer") == EMPTY_ANSWER
              else 0.0 for r in rows if f"rollout/{task}/top_answer" in r]
    return mean(shares)


def _empty_completions(d: Window, _found: list[Finding]) -> list[Finding]:
    """Most of a task's completions empty over the window so far (from its first step: a broken format shows at once):
    yellow above `empty_share`, red above `empty_red`, the cause named (plain-string prompts for a chat model) and
    its fix, not a KL or sampling knob. Without empty replies, plain-string prompts for a chat model are yellow
    template_less_prompts."""
    out = []
    for task in d.tasks():
        share, raw = empty_share(d.window, task), d.raw_prompts.get(task, 0.0) > 0
        cause = f"; {RAW_CAUSE}" if raw else ""
        if math.isfinite(share) and share > d.th.empty_share:
            out.append(Finding("red" if share > d.th.empty_red else "yellow", "empty_completions",
                               f"{task}: {100 * share:.0f}% of its completions in {d.span()} held no word (empty, "
                               f"or only punctuation: the reply ended at once or wrote nothing readable){cause}",
                               empty_fix(raw), task))
        elif raw:
            out.append(Finding("yellow", "template_less_prompts",
                               f"{task}: {100 * d.raw_prompts[task]:.0f}% of its training prompts are plain strings "
                               "and the model has a chat template: they are tokenized without it, as TRL does for "
                               "standard-format data, and an instruct model given raw text often replies nothing or "
                               "off-format", RAW_FIX, task))
    return out


def _answer_collapse(d: Window, _found: list[Finding]) -> list[Finding]:
    th, out = d.th, []
    if len(d.window) < th.recent_window:
        return out
    for task in d.tasks():
        rows = [r for r in d.window if isinstance(r.get(f"rollout/{task}/top_answer"), str)]
        if len(rows) < th.recent_window * COLLAPSE_DOMINANCE:
            continue
        answer, count = Counter(r[f"rollout/{task}/top_answer"] for r in rows).most_common(1)[0]
        share = mean(number(r.get(f"rollout/{task}/top_share")) or math.nan for r in rows)
        now, best = d.wmean(f"reward/{task}/mean"), d.best.get(f"reward/{task}/mean")
        first = d.start.get(f"rollout/{task}/top_share")
        if best is None or first is None or not (math.isfinite(share) and math.isfinite(now)):
            continue
        fallen = now < best.value - th.collapse_reward_gap
        risen = share >= first + th.collapse_rise  # not the task's own format, shared from the start
        unsolved = _unit_scale(d, task) and now < th.solved_reward  # on another scale "solved" is not known
        if (share >= th.collapse_share and risen and count >= COLLAPSE_DOMINANCE * len(rows)
                and (fallen or unsolved)):
            beta = number(d.window[-1].get(f"beta/{task}"))
            why = (f"against its best {best.value:.3f} (steps {best.first_step}-{best.last_step})" if fallen else
                   f"below the solved level {th.solved_reward:g}: one answer is not right for every prompt")
            out.append(Finding(
                "red", "answer_collapse",
                f"{task}: collapse onto `{answer}`: it is the top answer in {count} of {len(rows)} steps and "
                f"{100 * share:.0f}% of the task's samples in {d.span()} ({100 * first:.0f}% in the first window); "
                f"reward {now:.3f} {why}",
                empty_fix(d.raw_prompts.get(task, 0.0) > 0) if answer == EMPTY_ANSWER else
                _try(f"kl.{task}.beta", round(2 * beta, 6) if beta else "<2× now>",
                     "a stronger pull to the SFT reference keeps its mix of answers"),
                task))
    return out


def _entropy(d: Window, _found: list[Finding]) -> list[Finding]:
    th, out = d.th, []
    if len(d.window) < th.recent_window:
        return out
    for task in tasks_in(d.window, "entropy/"):
        now, first = d.wmean(f"entropy/{task}"), d.start.get(f"entropy/{task}")
        if not math.isfinite(now) or first is None:
            continue
        drop = 1.0 - now / first if first > 0 else 0.0
        if not (now < th.entropy_floor or drop > th.entropy_drop_max):
            continue
        what = f"entropy/{task} {first:.3g} -> {now:.3g} nats ({100 * drop:.0f}% down) in {d.span()}"
        coef = _setting(d.config, "loss.entropy_coef")
        fix = _try("loss.entropy_coef", 2 * coef if coef else 0.01, "an entropy bonus keeps sampling varied")
        _, best_heldout, after = d.heldout_after_start(task)
        recent = [v for _, v in after[-STALL_EVALS:]]
        stalled = (len(recent) == STALL_EVALS and max(recent) - min(recent) <= th.heldout_drop
                   and recent[-1] < th.solved_reward)
        if after and best_heldout is not None and after[-1][1] < best_heldout - th.heldout_drop:
            out.append(Finding("red", "entropy_collapse",
                               f"{task}: {what}, while its held-out reward fell to {after[-1][1]:.3f} (step "
                               f"{after[-1][0]}) from its best {best_heldout:.3f}", fix, task))
        elif stalled:
            out.append(Finding("red", "entropy_collapse",
                               f"{task}: {what}, while its held-out reward stays at {recent[-1]:.3f}, below the solved "
                               f"level {th.solved_reward:g}, over its last {STALL_EVALS} evaluations (steps "
                               f"{after[-STALL_EVALS][0]}-{after[-1][0]}): it stopped exploring before it learned",
                               fix, task))
        elif not after:
            best = d.best.get(f"reward/{task}/mean")
            reward = d.wmean(f"reward/{task}/mean")
            if best is not None and math.isfinite(reward) and reward < best.value - th.collapse_reward_gap:
                out.append(Finding("yellow", "entropy_drop",
                                   f"{task}: {what}; no held-out reward since RL started, and the training reward "
                                   f"{reward:.3f} is below its best {best.value:.3f}", fix, task))
    return out


def _kl(d: Window, _found: list[Finding]) -> list[Finding]:
    th, out = d.th, []
    for task, streak in d.kl_high.items():
        band = d.kl_bands.get(task)
        if streak.length >= th.kl_band_patience:
            limit = f"{th.kl_runaway_factor:g}× its band's top {band[1]:g}" if band else f"{th.kl_runaway_nats:g} nats"
            out.append(Finding("red", "kl_runaway",
                               f"kl/{task} above {limit} for {streak.length} steps (steps {streak.start}-{d.last_step}), "
                               f"{d.wmean(f'kl/{task}'):.3g} on average in {d.span()}",
                               _try("train.lr", _scaled(d.config, "train.lr", 0.5),
                                    "half the step size lets β hold the policy near the reference"), task))
            continue
        out_streak = d.kl_out.get(task)
        if band and out_streak and out_streak.length >= th.kl_band_patience:
            beta = number(d.window[-1].get(f"beta/{task}"))
            factor = 2.0 if out_streak.tag == "above" else 0.5
            why = ("β is not pulling KL back into the band" if out_streak.tag == "above"
                   else "the policy barely moves from the reference")
            out.append(Finding("yellow", "kl_out_of_band",
                               f"kl/{task} stayed {out_streak.tag} its band [{band[0]:g}, {band[1]:g}] for "
                               f"{out_streak.length} steps from step {out_streak.start}",
                               _try(f"kl.{task}.beta", round(factor * beta, 6) if beta else f"<{factor:g}× now>", why),
                               task))
    return out


def _full(d: Window) -> bool:
    """Rates are judged over a whole window: one step's batch is too small a sample to call a trend."""
    return len(d.window) >= d.th.recent_window


def _judge(d: Window, _found: list[Finding]) -> list[Finding]:
    if not _full(d):
        return []
    calls = sum(v for r in d.window if (v := number(r.get("judge/calls"))) is not None and math.isfinite(v))
    fails = sum(v for r in d.window if (v := number(r.get("judge/failures"))) is not None and math.isfinite(v))
    if calls <= 0 or fails / calls <= d.th.judge_failure_max:
        return []
    level: Level = "red" if fails / calls > d.th.judge_failure_red else "yellow"
    return [Finding(level, "judge_failures",
                    f"{100 * fails / calls:.1f}% of the judge calls in {d.span()} failed ({int(fails)} of {int(calls)}; "
                    f"yellow above {100 * d.th.judge_failure_max:.0f}%, red above {100 * d.th.judge_failure_red:.0f}%)",
                    _try("judge.timeout_s", _scaled(d.config, "judge.timeout_s", 2),
                         "failed calls are left out of their groups; check the endpoint and its rate limit too"))]


def _truncation(d: Window, _found: list[Finding]) -> list[Finding]:
    out: list[Finding] = []
    if not _full(d):
        return out
    for task in tasks_in(d.window, "rollout/", "/truncated"):
        rate = d.wmean(f"rollout/{task}/truncated")
        if rate > d.th.truncation_max:
            out.append(Finding("yellow", "truncation",
                               f"{100 * rate:.0f}% of {task} completions hit max_new_tokens in {d.span()} "
                               f"(max {100 * d.th.truncation_max:.0f}%)",
                               _try("rollout.max_new_tokens", _scaled(d.config, "rollout.max_new_tokens", 2, int),
                                    "truncated answers are graded unfinished"), task))
    return out


def _zero_std(d: Window, found: list[Finding]) -> list[Finding]:
    """Zero-std groups that success does not explain: with rewards in [0, 1] at most a fraction r (the mean reward) of
    the groups can be all-right, so at least z − r of them (z = zero-std fraction) are all-wrong or stuck. On any
    other scale (a length penalty, a reward model) the mean says nothing about solved groups: z itself is read."""
    out: list[Finding] = []
    if not _full(d):
        return out
    red = {f.task for f in found if f.code == "reward_stuck"} | ({t for t in d.tasks()} if any(
        f.code == "no_learning_signal" for f in found) else set())  # the same evidence already has a red finding
    for task in d.tasks():
        zero, reward = _task_zero_std(d, task), d.wmean(f"reward/{task}/mean")
        if task in red or not (math.isfinite(zero) and math.isfinite(reward)):
            continue
        solved = reward if _unit_scale(d, task) else 0.0
        if zero - solved <= d.th.zero_std_max:
            continue
        why = (f"at least {100 * (zero - solved):.0f}% of the groups gave no signal without being solved" if solved
               else "they gave no signal")
        kept = d.wmean(f"rollout/{task}/dynamic_kept_groups")
        if math.isfinite(kept):  # train.dynamic_sampling dropped those groups: nothing of them was trained on
            keep_kl = _setting(d.config, "train.dynamic_sampling_keep_kl") is True
            why += (f"; dynamic sampling dropped them and trained on {kept:.1f} {task} groups a step, so the task got "
                    "little policy gradient" + (" (its KL term kept: train.dynamic_sampling_keep_kl)" if keep_kl else
                                                " and no KL term on what was dropped (train.dynamic_sampling_keep_kl "
                                                "keeps it)"))
        out.append(Finding("yellow", "zero_std_groups",
                           f"{task}: {100 * zero:.0f}% of its groups had zero reward std in {d.span()} with a mean "
                           f"reward of {reward:.3f}: {why} (max {100 * d.th.zero_std_max:.0f}%)",
                           _try("rollout.k", _scaled(d.config, "rollout.k", 2, int),
                                "more samples per prompt make groups whose rewards differ"), task))
    return out


def _non_finite(d: Window, _found: list[Finding]) -> list[Finding]:
    row = d.window[-1]
    bad = [k for k, v in row.items() if isinstance(v, float) and not math.isfinite(v)]
    if not bad:
        return []
    return [_non_finite_finding(", ".join(f"{k} (step {d.last_step})" for k in bad[:5]), d.config, bad)]


def _non_finite_finding(where: str, config: Mapping[str, Any], keys: Sequence[str] = ()) -> Finding:
    """Non-finite metrics. When a reward is among them (every reward of a task None, or a grader returning inf /
    NaN), the cause is the grader, not the step size: the advice names the task's reward spec, not train.lr."""
    rewards = [k for k in keys if k.startswith(("reward/", "eval/"))]
    if rewards:
        task = rewards[0].split("/")[1]
        fix = (f"fix the rewards of task {task!r} (rewards.{task}): its graders gave no finite reward (every reward "
               "None: the judge or a grader failed, see judge/failures and reward/<task>/failed; or a grader "
               "returned inf / NaN); a smaller train.lr cannot help")
        return Finding("red", "non_finite", f"non-finite metric values: {where}", fix, task)
    return Finding("red", "non_finite", f"non-finite metric values: {where}",
                   _try("train.lr", _scaled(config, "train.lr", 0.5),
                        "look at the first step listed; check the rewards for NaN too"))


def _tools(d: Window, _found: list[Finding]) -> list[Finding]:
    """Multi-turn rollouts with tools (tools/ metrics, grpo/core/tool_calls.py): a model that never calls its tool,
    tool errors that dominate, rollouts that loop to the turn limit. Over a full window; silent without tools."""
    if not _full(d) or not any("tools/calls_per_rollout" in r for r in d.window):
        return []
    out: list[Finding] = []
    calls = d.wmean("tools/calls_per_rollout")
    if calls < d.th.tool_min_calls:
        out.append(Finding("yellow", "tool_unused",
                           f"{calls:.3f} tool calls per rollout in {d.span()} (below {d.th.tool_min_calls:g}): the "
                           "model does not call its tool, so RL has no trajectory with a tool result to reinforce",
                           _try("sft.steps", _scaled(d.config, "sft.steps", 2, int) if _setting(d.config, "sft.steps")
                                else 40, "a warm-up on demonstrations of the call format (rows whose target is "
                                         "a <tool_call>) teaches the format RL can then reward")))
    weights = [(v, c) for r in d.window if (v := number(r.get("tools/failure_rate"))) is not None
               and (c := number(r.get("tools/calls_per_rollout"))) is not None and math.isfinite(v * c)]
    total = sum(c for _, c in weights)
    failed = sum(v * c for v, c in weights) / total if total > 0 else 0.0
    if total > 0 and failed > d.th.tool_failure_max:
        level: Level = "red" if failed > d.th.tool_failure_red else "yellow"
        out.append(Finding(level, "tool_failures",
                           f"{100 * failed:.0f}% of the tool calls in {d.span()} failed (yellow above "
                           f"{100 * d.th.tool_failure_max:.0f}%, red above {100 * d.th.tool_failure_red:.0f}%); "
                           "tools/<name>/failure_rate names the tool",
                           _try("rollout.tool_timeout_s", _scaled(d.config, "rollout.tool_timeout_s", 2),
                                "if the calls time out; malformed calls and unknown tools want a warm-up on the "
                                "call format (sft.steps), a raising tool a look at its arguments")))
    loops = d.wmean("tools/cut_by_limit")
    if math.isfinite(loops) and loops > d.th.tool_loop_max:
        out.append(Finding("yellow", "tool_loops",
                           f"{100 * loops:.0f}% of the trajectories in {d.span()} ended on the turn limit or the "
                           f"token budget (max {100 * d.th.tool_loop_max:.0f}%): the model keeps calling instead "
                           "of answering",
                           _try("rollout.max_tool_turns", _scaled(d.config, "rollout.max_tool_turns", 2, int),
                                "if the task needs more calls; otherwise a reward that pays an answer, not a call")))
    return out


def _memory_growth(d: Window, _found: list[Finding]) -> list[Finding]:
    """Host memory that grows step over step (a reward function, tool or environment that keeps what it is given; a
    cache without a bound): over a full window, risen at most steps and by more than a share of its start. Yellow:
    the run is right so far, and will stop when the machine runs out."""
    values = [v for r in d.window if (v := number(r.get("memory/host_rss_gb"))) is not None and math.isfinite(v)]
    if not _full(d) or len(values) < d.th.recent_window:
        return []
    rises = sum(b > a for a, b in zip(values, values[1:]))
    grown = values[-1] - values[0]
    if (rises < d.th.memory_rise_steps * (len(values) - 1)
            or grown <= max(d.th.memory_growth_min_gb, d.th.memory_growth_share * values[0])):
        return []
    per_step = grown / (len(values) - 1)
    steps = _setting(d.config, "train.max_steps")
    ahead = (f"; at this rate {values[-1] + per_step * (steps - d.last_step):.1f} GB by step {steps}"
             if isinstance(steps, int) and steps > d.last_step else "")
    return [Finding("yellow", "memory_growth",
                    f"host memory rose in {rises} of the {len(values) - 1} steps of {d.span()}: {values[0]:.2f} -> "
                    f"{values[-1]:.2f} GB ({1024 * per_step:+.0f} MB a step, memory/host_rss_gb){ahead}",
                    "find what keeps something every step: a reward function, tool or environment that stores what "
                    "it is given, or a cache without a bound (tracemalloc's snapshot difference between two steps "
                    "names the line)")]


def _recompiling(d: Window, _found: list[Finding]) -> list[Finding]:
    """The graph engine compiling its decoding step at `recompile_steps` or more steps of a window after the first
    (rollout/graph_compiles: each step's count): its shapes never settle. Captures are not counted: a run whose
    buffers the update needs captures at every rollout by design (tens of milliseconds), a compile costs tens of
    seconds. Yellow: the run is right, only slower."""
    if d.steps <= d.th.recent_window:
        return []
    counts = [number(r.get("rollout/graph_compiles")) or 0.0 for r in d.window]
    busy = sum(c > 0 for c in counts)
    if busy < d.th.recompile_steps:
        return []
    return [Finding("yellow", "graph_recompiling",
                    f"the graph engine compiled its decoding step {int(sum(counts))} times at {busy} of the steps of "
                    f"{d.span()} (rollout/graph_compiles): the rollouts' shapes keep changing, and every compile "
                    "costs tens of seconds on a GPU",
                    "keep the rollout's shapes few: its rows (prompts a step x rollout.k; dynamic sampling's extra "
                    "rounds add others), its prompt bucket (the longest prompt, in steps of 64 tokens: "
                    "data.max_prompt_tokens caps it) and its sampling settings; or rollout.engine=lean, which compiles "
                    "nothing")]


WINDOW_CHECKS = (_empty_completions, _no_learning_signal, _reward_stuck, _answer_collapse, _entropy, _kl, _judge,
                 _truncation, _zero_std, _non_finite, _tools, _memory_growth, _recompiling)
"""In this order: a check sees the findings of the ones before it (zero_std_groups stays quiet under a red on the same
evidence; no_learning_signal names the fix of empty replies)."""


# ---------------------------------------------------------------------------------------------------------------
# End of run: the window checks replayed, plus whole-run counts and the held-out gains
# ---------------------------------------------------------------------------------------------------------------


def whole_run(history: Sequence[Mapping[str, Any]], th: HealthThresholds, config: Mapping[str, Any],
               active: set[str]) -> list[Finding]:
    out = []
    if "non_finite" not in active:
        bad: dict[str, int] = {}
        for i, row in enumerate(history):
            for key, value in row.items():
                if isinstance(value, float) and not math.isfinite(value):
                    bad.setdefault(key, int(row.get("step", i)))
        if bad:
            out.append(_non_finite_finding(", ".join(f"{k} (step {s})" for k, s in list(bad.items())[:5]), config,
                                           list(bad)))
    steps = len(series(history, "health/skipped")) or sum(is_rl_row(r) for r in history)
    skipped = sum(v for _, v in series(history, "health/skipped") if v > 0)
    restored = sum(v for _, v in series(history, "health/restored") if v > 0)
    lower_lr = _try("train.lr", _scaled(config, "train.lr", 0.5), "smaller steps keep the gradient and weights finite")
    if steps and (skipped + restored) / steps > th.skipped_max:
        out.append(Finding("red", "skipped_steps", f"{int(skipped)} skipped + {int(restored)} restored of {steps} "
                           f"steps (max {100 * th.skipped_max:.0f}%)", lower_lr))
    elif restored > 0:
        out.append(Finding("yellow", "restored_weights", f"weights were restored {int(restored)} time(s)", lower_lr))
    return out


def unit_scale_rewards(history: Sequence[Mapping[str, Any]], evals: Mapping[str, Mapping[str, Any]] | None,
                       task: str) -> bool:
    """Whether every reward the run logged for `task` (each step's reward/<task>/mean and each held-out evaluation in
    eval.json) lies in [0, 1], as the rule graders' do: only then does a held-out reward at `solved_reward` mean
    solved (a judge scoring 0-10 at 0.95 has not solved its task)."""
    values = [v for _, v in series(history, f"reward/{task}/mean")]
    values += [v for phase in (evals or {}).values() if (v := number(phase.get(task))) is not None]
    return bool(values) and all(0.0 <= v <= 1.0 for v in values)


def heldout_gains(history: Sequence[Mapping[str, Any]], th: HealthThresholds, evals, config,
                  doctor: Window | None = None) -> list[Finding]:
    """Held-out reward after RL against before RL, per trained task (eval.json when given, else the eval rows). A task
    held at `solved_reward` or above with no change is not flat, on the unit scale only (`unit_scale_rewards`). A
    trained task never evaluated is `no_heldout`, or, when nothing was held out on purpose (`judged_from_training`),
    judged from its training rewards through `doctor` (the Doctor replayed over the history: `training_gains`)."""
    points: dict[str, tuple[float, float]] = {}
    if evals and "after_rl" in evals:
        before = evals.get("after_sft") or evals.get("before_sft") or {}
        points = {t: (before[t], r) for t, r in evals["after_rl"].items() if t in before}
    else:
        for task in tasks_in(history, "eval/", "/reward"):
            s = series(history, f"eval/{task}/reward")
            if len(s) >= 2:
                points[task] = (s[0][1], s[-1][1])
    out = []
    for task, (before, after) in points.items():
        gain = after - before
        if gain < -th.reward_regression_red:
            out.append(Finding("red", "reward_regressed", f"held-out {task} reward fell during RL: {before:.3f} -> "
                               f"{after:.3f} ({gain:+.3f})",
                               _try("train.lr", _scaled(config, "train.lr", 0.5),
                                    "then read samples/ for reward hacking"), task))
        elif gain <= 0 and not (after >= th.solved_reward and gain == 0  # a solved task cannot rise
                                and unit_scale_rewards(history, evals, task)):
            out.append(Finding("yellow", "reward_flat", f"held-out {task} reward did not rise during RL: {before:.3f} "
                               f"-> {after:.3f} ({gain:+.3f})",
                               _longer(config, "train longer, once the window checks show a learning signal"),
                               task))
    out += training_gains(doctor, unevaluated(history, evals)) if doctor is not None and \
        judged_from_training(config) else []
    for task in [] if judged_from_training(config) else unevaluated(history, evals):
        out.append(Finding("yellow", "no_heldout", f"{task} was trained but never evaluated on held-out prompts: "
                           "whether it learned is unknown",
                           _try("train.eval_every", 20, "held-out rewards during the run show learning"), task))
    return out


def unevaluated(history: Sequence[Mapping[str, Any]], evals: Mapping[str, Mapping[str, Any]] | None) -> list[str]:
    """The trained tasks no held-out evaluation scored (eval.json or the history's eval rows)."""
    seen = {t for phase in (evals or {}).values() for t in phase} | set(tasks_in(history, "eval/", "/reward"))
    return [task for task in tasks_in(history, "reward/", "/mean") if task not in seen]


def judged_from_training(config: Mapping[str, Any]) -> bool:
    """Whether a task without held-out rows was meant to be so (data.heldout_fraction=0: every row trains, TRL's
    split): it is then judged from its training rewards, not flagged as never evaluated."""
    return _setting(config, "data.heldout_fraction") == 0


HOW_HELDOUT = ("for a held-out verdict, give an eval split (TRL's dataset_test_split or eval_dataset, a "
               "DatasetDict's test split, tasks.<task>.heldout) or hold out a share of the rows (data.heldout_fraction, "
               "e.g. 0.2)")
"""How a run judged from its training rewards gets a held-out verdict (the report says it with the verdict)."""


def training_gains(d: Window, tasks: Sequence[str]) -> list[Finding]:
    """Tasks without held-out rows (data.heldout_fraction=0, no eval split), judged from their training rewards: the
    last window's mean reward against the first full window's (the doctor's `start`), as reward_stuck compares them
    (stuck_tolerance of the reward's spread). A fall beyond reward_regression_red (of the spread) is red
    reward_regressed, no rise beyond the tolerance yellow reward_flat; a run shorter than a window has no start."""
    out = []
    for task in tasks:
        key = f"reward/{task}/mean"
        start, now = d.start.get(key), d.wmean(key)
        if start is None or not math.isfinite(now):
            continue
        spread, gain = reward_spread(d, task), now - start
        what = (f"training {task} reward {start:.3f} in the first window -> {now:.3f} in the last ({d.span()}, "
                f"{gain:+.3f}); no held-out rows, so judged from the training rewards")
        if gain < -d.th.reward_regression_red * spread:
            out.append(Finding("red", "reward_regressed", f"{what}: it fell",
                               _try("train.lr", _scaled(d.config, "train.lr", 0.5),
                                    f"then read samples/ for reward hacking; {HOW_HELDOUT}"), task))
        elif gain <= d.th.stuck_tolerance * spread and not (_unit_scale(d, task) and now >= d.th.solved_reward):
            out.append(Finding("yellow", "reward_flat", f"{what}: it did not rise",
                               _longer(d.config, f"train longer, once the window checks show a learning signal; "
                                                 f"{HOW_HELDOUT}"), task))
    return out



def heldout_collapse(answers: Mapping[str, Mapping[str, Sequence[str]]], evals: Mapping[str, Mapping[str, Any]],
                     th: HealthThresholds, history: Sequence[Mapping[str, Any]] = (),
                     config: Mapping[str, Any] | None = None) -> list[Finding]:
    """One answer taking most of a task's held-out evaluation after RL. `answers`: {phase: {task: the greedy
    completions}} (evals/<phase>.jsonl); `evals`: eval.json; `history`: metrics.jsonl's rows; `config`: config.json.
    Sampled answers can stay mixed while the greedy ones collapse: the window's answer_collapse does not see this. A
    held-out reward at `solved_reward` or above excuses one answer only on the unit scale (`unit_scale_rewards`).
    The next step for a collapse onto a letter is shuffled options, unless the run had them already
    (data.shuffle_options in `config`): then, as for any other answer, a stronger pull to the reference."""
    out = []
    before_phase = next((p for p in ("after_sft", "before_sft") if p in answers), None)
    for task, completions in answers.get("after_rl", {}).items():
        reward = number(evals.get("after_rl", {}).get(task))
        if not completions or reward is None:
            continue
        if reward >= th.solved_reward and unit_scale_rewards(history, evals, task):
            continue
        now = answer_shares(completions)
        earlier = (answers.get(before_phase) or {}).get(task) if before_phase else None
        first = answer_shares(earlier).top_share if earlier else 0.0
        if now.top_share < th.collapse_share:
            continue
        risen = now.top_share >= first + th.collapse_rise
        letter_prior = len(now.top_answer) == 1 and not _setting(config or {}, "data.shuffle_options")
        raw = any(number(row.get(f"data/{task}/raw_prompts")) for row in history)
        out.append(Finding(
            "red" if risen else "yellow", "heldout_collapse",
            f"{task}: `{now.top_answer}` is {100 * now.top_share:.0f}% of the held-out greedy answers after RL "
            f"({100 * first:.0f}% before RL{'' if before_phase else ': not evaluated'}); held-out reward {reward:.3f}"
            + (f" below the solved level {th.solved_reward:g}" if reward < th.solved_reward else
               " (not on the 0-1 scale, so not read as solved)"),
            empty_fix(raw) if now.top_answer == EMPTY_ANSWER else
            _try("data.shuffle_options", "true", "options in a seeded order per row and epoch: one letter earns "
                 "nothing") if letter_prior else
            _try(f"kl.{task}.beta", "<2× now>", "a stronger pull to the SFT reference keeps its mix of answers"),
            task))
    return out


FELL_Z = 2.0
"""How many standard errors of the per-prompt difference a held-out fall from its best must exceed to be a finding
(more than its sampling error): a fall that large comes by chance about one time in 44 (one-sided, normal)."""


def heldout_fell(rewards: Mapping[str, Mapping[str, Mapping[str, float]]], evals: Mapping[str, Mapping[str, Any]],
                 config: Mapping[str, Any]) -> list[Finding]:
    """A task whose held-out reward after RL is below its best evaluation during RL (eval.json's step_N) by more than
    FELL_Z standard errors of the per-prompt difference: the same held-out prompts scored by both evaluations
    (`rewards`: {phase: {task: {row id: reward}}}, evals/<phase>.jsonl), mean difference over its standard error.
    Yellow: the run got there and lost it; the next step keeps it (a smaller step, a stronger KL pull, or the best
    evaluation as the final model, checkpoint.keep_best). Silent without the per-prompt rewards of both."""
    out = []
    for task, now in (evals.get("after_rl") or {}).items():
        points = [(int(tag[5:]), v) for tag, results in evals.items() if tag.startswith("step_") and tag[5:].isdigit()
                  and (v := number(results.get(task))) is not None and math.isfinite(v)]
        if number(now) is None or not points:
            continue
        best_step, best = max(points, key=lambda p: (p[1], -p[0]))  # the first of the best
        at_best, at_end = (rewards.get(phase, {}).get(task) or {} for phase in (f"step_{best_step}", "after_rl"))
        diffs = [at_best[i] - at_end[i] for i in at_best if i in at_end and all(
            (x := number(r[i])) is not None and math.isfinite(x) for r in (at_best, at_end))]
        if len(diffs) < 2 or mean(diffs) <= 0:
            continue
        spread = math.sqrt(math.fsum((d - mean(diffs)) ** 2 for d in diffs) / (len(diffs) - 1))
        error = spread / math.sqrt(len(diffs))
        if mean(diffs) <= FELL_Z * error:
            continue
        errors = f"{mean(diffs) / error:.1f} standard errors" if error else "every prompt alike"
        out.append(Finding(
            "yellow", "heldout_fell",
            f"held-out {task} reward fell from its best {best:.3f} (step {best_step}) to {float(now):.3f} after RL: "
            f"{-mean(diffs):+.3f} over {len(diffs)} prompts, {errors} of the per-prompt difference (more than "
            f"{FELL_Z:g})",
            _try("train.lr", _scaled(config, "train.lr", 0.5), f"smaller steps keep what RL reached at step "
                 f"{best_step}; or a stronger pull to the reference (kl.{task}.beta twice, or a lower band), or the "
                 "best evaluation as the final model: checkpoint.keep_best=true"), task))
    return out


def sampled_at_chance(pass_metrics: Mapping[str, Any], config: Mapping[str, Any]) -> list[Finding]:
    """Before RL, a multiple-choice task whose pass@k (pass_at_k.json: eval/<task>/pass_at_k) is no higher than a
    uniform guess's among its options (eval/<task>/pass_at_k_guess, grpo/core/pass_at_k.guess_pass_at_k): the policy
    samples the right option no more often than chance, so RL has no skill to raise, only an answer prior. Yellow."""
    out = []
    for key in sorted(pass_metrics):
        if not (key.startswith("eval/") and key.endswith("/pass_at_k_guess")):
            continue
        task = key[len("eval/"):-len("/pass_at_k_guess")]
        guess, got = number(pass_metrics[key]), number(pass_metrics.get(f"eval/{task}/pass_at_k"))
        if guess is None or got is None or got > guess:
            continue
        one, one_guess = number(pass_metrics.get(f"eval/{task}/pass_at_1")), number(
            pass_metrics.get(f"eval/{task}/pass_at_1_guess"))
        k = _setting(config, "train.pass_at_k")
        at_1 = (f"; pass@1 {one:.3f} vs {one_guess:.3f}" if one is not None and one_guess is not None else "")
        out.append(Finding(
            "yellow", "sampled_at_chance",
            f"{task}: before RL the right option is among {k if k is not None else 'k'} sampled replies of a held-out "
            f"prompt {got:.3f} of the time, no more than a uniform guess among its options ({guess:.3f}){at_1}: RL "
            "can only raise answers it samples, so it can move an answer prior here, not the skill",
            _try("sft.max_examples", _scaled(config, "sft.max_examples", 2, int),
                 "more demonstrations, or a larger model, so the warm-up teaches the task and not only the reply "
                 "format"), task))
    return out
