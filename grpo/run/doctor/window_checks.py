"""The run doctor's checks over the moving window of RL step metrics, run in WINDOW_CHECKS's order at each RL step.

`grpo/run/doctor/verdict.py` holds the window (a `Doctor`) and calls every check in WINDOW_CHECKS at each RL step; a
check reads the window through the Doctor (its rows, window means, first and best windows, streaks, held-out series:
the `Window` of grpo/run/doctor/thresholds.py) and returns `Finding`s. Pure: metric rows in, findings out; no I/O,
no torch.

Window checks (rows = the last `recent_window` RL steps; "start" = the first window; "best" = the best window so far):
  red     no_learning_signal  `no_signal_steps` steps in a row with every group zero-std (adv/frac_zero_std = 1), or
                              loss and grad norm both 0, while some task is below `solved_reward` (yellow before
                              that, while no step of the run had a signal)
  red     reward_stuck        a task's mean reward never rose more than `stuck_tolerance` above its start and is
                              still there, with more than `zero_std_max` of its groups zero-std
  red     answer_collapse     one answer class (rollout/<task>/top_answer, grpo/core/answer_metrics.py) is the top
  answer in most
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
"""

from __future__ import annotations

import math
from collections import Counter
from itertools import pairwise
from typing import Any, Mapping, Sequence

from grpo.core.answer_metrics import EMPTY_ANSWER
from grpo.run.doctor.thresholds import (
    DoctorThresholds,
    Finding,
    Level,
    Window,
    _scaled,
    _setting,
    _try,
    mean,
    number,
    tasks_in,
)

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


def dead_step(row: Mapping[str, Any], th: DoctorThresholds) -> bool:
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
                    f"{SFT_UNTAUGHT_LOSS:g}): the adapter could not fit the demonstrations, the whole model can (on "
                    f"the "
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


def _full(d: Window) -> bool:
    """Rates are judged over a whole window: one step's batch is too small a sample to call a trend."""
    return len(d.window) >= d.th.recent_window


def _full_window_tasks(d: Window, prefix: str = "reward/", suffix: str = "/mean") -> list[str]:
    """The tasks a per-task check reads (those with a `prefix<task>suffix` key in the window rows: by default the
    tasks with a mean reward), none before the window is full (`_full`)."""
    return tasks_in(d.window, prefix, suffix) if _full(d) else []


def _reward_stuck(d: Window, _found: list[Finding]) -> list[Finding]:
    th, out = d.th, []
    if d.steps < th.min_steps:
        return out
    for task in _full_window_tasks(d):
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


def empty_reply_share(rows: Sequence[Mapping[str, Any]], task: str) -> float:
    """Mean share of a task's completions that held no word (EMPTY_ANSWER: no text, or only punctuation) over
    `rows`: a step's top answer class and its share (grpo/core/answer_metrics.py) say it exactly when most were (that
    class is then the top one); a step whose top class is another counts 0 (at most half of it was). NaN without a row
    of the task."""
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
        share, raw = empty_reply_share(d.window, task), d.raw_prompts.get(task, 0.0) > 0
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
    for task in _full_window_tasks(d):
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
    for task in _full_window_tasks(d, "entropy/", ""):
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
                               f"kl/{task} above {limit} for {streak.length} steps (steps "
                               f"{streak.start}-{d.last_step}), "
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


def _judge(d: Window, _found: list[Finding]) -> list[Finding]:
    if not _full(d):
        return []
    calls = sum(v for r in d.window if (v := number(r.get("judge/calls"))) is not None and math.isfinite(v))
    fails = sum(v for r in d.window if (v := number(r.get("judge/failures"))) is not None and math.isfinite(v))
    if calls <= 0 or fails / calls <= d.th.judge_failure_max:
        return []
    level: Level = "red" if fails / calls > d.th.judge_failure_red else "yellow"
    return [Finding(level, "judge_failures",
                    f"{100 * fails / calls:.1f}% of the judge calls in {d.span()} failed ({int(fails)} of "
                    f"{int(calls)}; "
                    f"yellow above {100 * d.th.judge_failure_max:.0f}%, red above {100 * d.th.judge_failure_red:.0f}%)",
                    _try("judge.timeout_s", _scaled(d.config, "judge.timeout_s", 2),
                         "failed calls are left out of their groups; check the endpoint and its rate limit too"))]


def _truncation(d: Window, _found: list[Finding]) -> list[Finding]:
    out: list[Finding] = []
    for task in _full_window_tasks(d, "rollout/", "/truncated"):
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
    red = {f.task for f in found if f.code == "reward_stuck"} | ({t for t in d.tasks()} if any(
        f.code == "no_learning_signal" for f in found) else set())  # the same evidence already has a red finding
    for task in _full_window_tasks(d):
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
    rises = sum(b > a for a, b in pairwise(values))
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
