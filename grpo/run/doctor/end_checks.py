"""The run doctor's checks at the end of a run, over the whole history and the held-out evaluations.

End of run (grpo/run/doctor/verdict.check_history only): red skipped_steps / yellow restored_weights (the weight guard's
counts), red reward_regressed / yellow reward_flat (held-out after RL vs before RL; for a task without held-out rows
under data.heldout_fraction=0, TRL's split, the training reward's last window vs its first), yellow no_heldout (a
trained task never evaluated); yellow openmp_spinning (host/openmp_spinning: torch was imported before grpo_train, so
OpenMP's threads spin while they wait, grpo/machine/host_resources.py), with its fix.
From the per-prompt held-out rewards (`heldout_fell`, read by grpo/run/doctor/report.py from evals/): yellow
heldout_fell when a task's held-out reward after RL is below its best evaluation during RL by more than FELL_Z
standard errors of the per-prompt difference.
From the held-out greedy completions (`heldout_collapse`, read by grpo/run/doctor/report.py from evals/): red
heldout_collapse when one answer class holds ≥ `collapse_share` of a task's after-RL evaluation, at least
`collapse_rise` more than before RL, while its held-out reward is below `solved_reward` (yellow when it held that
share before RL already).
From the pass@K diagnostic before RL (pass_at_k.json, `sampled_at_chance`): yellow when a multiple-choice task's
pass@k is no higher than a uniform guess's among its options.

Pure: metric rows in, findings out; no I/O, no torch.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from grpo.core.answer_metrics import EMPTY_ANSWER, answer_shares
from grpo.run.doctor.thresholds import (
    DoctorThresholds,
    Finding,
    Window,
    _longer,
    _scaled,
    _setting,
    _try,
    is_rl_row,
    mean,
    number,
    series,
    tasks_in,
)
from grpo.run.doctor.window_checks import _non_finite_finding, _unit_scale, empty_fix, reward_spread


def whole_run(history: Sequence[Mapping[str, Any]], th: DoctorThresholds, config: Mapping[str, Any],
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
    if any(row.get("host/openmp_spinning") for row in history):
        out.append(Finding("yellow", "openmp_spinning", "OpenMP's threads spun while they waited: torch was imported "
                           "before grpo_train (a TRL script's `from trl import ...` first), too late to ask them to "
                           "sleep; beside busy processes that took about twice as long (benchmarks/RESULTS.md)",
                           "import grpo_train before trl / torch, or `export OMP_WAIT_POLICY=PASSIVE` before "
                           "starting python"))
    return out


def unit_scale_rewards(history: Sequence[Mapping[str, Any]], evals: Mapping[str, Mapping[str, Any]] | None,
                       task: str) -> bool:
    """Whether every reward the run logged for `task` (each step's reward/<task>/mean and each held-out evaluation in
    eval.json) lies in [0, 1], as the rule graders' do: only then does a held-out reward at `solved_reward` mean
    solved (a judge scoring 0-10 at 0.95 has not solved its task)."""
    values = [v for _, v in series(history, f"reward/{task}/mean")]
    values += [v for phase in (evals or {}).values() if (v := number(phase.get(task))) is not None]
    return bool(values) and all(0.0 <= v <= 1.0 for v in values)


def heldout_gains(history: Sequence[Mapping[str, Any]], th: DoctorThresholds, evals, config,
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
    out += (training_gains(doctor, unevaluated(history, evals)) if doctor is not None and
            judged_from_training(config) else [])
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
               "DatasetDict's test split, tasks.<task>.heldout) or hold out a share of the rows "
               "(data.heldout_fraction, "
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
                     th: DoctorThresholds, history: Sequence[Mapping[str, Any]] = (),
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
