"""Reward composition per task: graders of every kind and the LLM judge, weighted into one reward.

  sum  (loss.reward_aggregation, the default, TRL's):  reward = Σ_i w_i·s_i over the terms whose value is not None
  mean (the built-in presets'):                         reward = Σ_i w_i·s_i / Σ_i w_i, any None voiding it
Each term is a grader (grpo/grading/graders.py: a built-in rule grader in [0, 1], a per-row or TRL-style batched
function returning any finite float or None, a reward model) or "llm_judge" (in [0, 1]). Under `sum` a function's
None means "not applicable to this completion", as in TRL: that term is left out, the others count; a completion
every term left out has reward None. Under `mean` a task whose terms all lie in [0, 1] has a reward in [0, 1].
Every grader is called ONCE per task per batch, on all of the task's rollouts; the "llm_judge" term of every rollout
of the batch goes to the Judge as ONE batch (its thread pool). A judge failure uses the spec's fallback grader in
its place (provider "fallback:<name>"); with no fallback the reward is None — excluded from the group statistics and
counted in `scoring/<task>/failed`, never turned into 0, under either aggregation.
Metric names: a term's values are logged and written (Scored.parts, rewards/<name>/..., eval_part/, samples, evals)
under `metric_names`' name for it, TRL 1.16's (GRPOTrainer.reward_func_names): a function imported by a
"module:function" or "path/to/file.py:function" term is its own name (`callable_name`: a functools.partial
unwrapped, a callable instance its class's name), never the path; a reward model is the last part of its config's
model id; a built-in grader, "llm_judge" or a function handed to `train` is its term. Clashes: one function used by
several tasks is one name (TRL's rewards/<fn>/mean over every completion it scored; a run of several tasks adds
rewards/<task>/<fn>/mean); two DIFFERENT terms with one name are told apart, the later one (tasks sorted, terms in
order) named <fn>_2, <fn>_3, ... (TRL would merge them into one key, averaging two functions' values).
A grader that raises, returns a wrong value, or (a user function) outlives train.reward_timeout_s or exits, stops the
step with a GraderError naming the task and the grader; so does a weighted reward beyond MAX_ABS_REWARD (weights
too large for the advantages' float32), naming the task's weights.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, Mapping

import torch

from grpo.core.registry import Registry
from grpo.core.step_types import Rollout, Scored
from grpo.grading.graders import JUDGE_TERM, MAX_ABS_REWARD, USER_KINDS, Grader, GraderError, resolve_graders
from grpo.grading.judge import Judge, JudgeItem, JudgeResult

__all__ = ["JUDGE_TERM", "RewardSpec", "score_rollouts", "term_matrix"]


REWARD_AGGREGATIONS: Registry[None] = Registry("loss.reward_aggregation", "reward aggregation")
"""How a task's weighted reward terms make its reward, by name (loss.reward_aggregation; `score_rollouts` applies
it)."""
REWARD_AGGREGATIONS.register("sum", "the weighted sum of the terms (TRL's)", None)
REWARD_AGGREGATIONS.register("mean", "the weighted mean: the sum over the sum of the weights", None)


@dataclass(frozen=True)
class RewardSpec:
    """How one task's reward is made. Maps 1:1 onto a config section."""

    task: str
    terms: tuple[tuple[str, float], ...]
    """(grader, weight) pairs; grader = any name grpo.grading.graders.resolve_grader takes, or "llm_judge"."""
    fallback: str | None = None
    """Grader used in place of a failed judge score; None = the reward becomes None."""
    aggregation: str = "mean"
    """How the terms make the reward: one of REWARD_AGGREGATIONS (loss.reward_aggregation)."""

    def __post_init__(self) -> None:
        if not self.terms:
            raise ValueError(f"RewardSpec({self.task!r}).terms is empty: give at least one (grader, weight)")
        for name, weight in self.terms:
            if not (isinstance(weight, (int, float)) and math.isfinite(weight) and weight > 0):
                raise ValueError(f"RewardSpec({self.task!r}): weight of {name!r} is {weight!r}; use a number > 0")
        if self.aggregation not in REWARD_AGGREGATIONS:
            raise ValueError(f"RewardSpec({self.task!r}).aggregation={self.aggregation!r}: use one of "
                             f"{list(REWARD_AGGREGATIONS)}")
        if self.fallback == JUDGE_TERM:
            raise ValueError(f"RewardSpec({self.task!r}).fallback cannot be {JUDGE_TERM!r}; name a rule grader")

    @property
    def uses_judge(self) -> bool:
        return any(name == JUDGE_TERM for name, _ in self.terms)


def callable_name(fn: Any) -> str:
    """TRL's name of a reward function (trl/trainer/utils.py get_callable_name): a functools.partial unwrapped, a
    callable instance its class's name."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__name__", type(fn).__name__)


def _own_name(term: str, grader: Grader | None) -> str:
    """A term's name before clashes are told apart (the module docstring's rule): never a file path."""
    if grader is not None and grader.kind == "reward_model":  # TRL: the last part of the config's model id
        model = getattr(getattr(grader.fn, "__self__", None), "model", None)
        model_id = str(getattr(getattr(model, "config", None), "_name_or_path", "") or term)
        return model_id.rstrip("/").split("/")[-1] or "reward_model"
    if grader is not None and grader.kind in USER_KINDS and ":" in term:  # imported by "module:fn" / "file.py:fn"
        return callable_name(grader.fn)
    return term


def metric_names(graders: Mapping[str, Grader], specs: Mapping[str, RewardSpec]) -> dict[str, str]:
    """term -> the name its values are logged and written under (the module docstring's rule): every term and
    fallback grader of `specs` (tasks sorted, terms in order); a term without a grader in `graders` ("llm_judge")
    keeps its own name. Two different terms of one name: the later ones get _2, _3, ... (a name no term owns)."""
    terms = list(dict.fromkeys(name for task in sorted(specs) for name in
                               [*(n for n, _ in specs[task].terms), *([specs[task].fallback] if specs[task].fallback
                                                                     else [])]))
    own = {term: _own_name(term, graders.get(term)) for term in terms}
    owned, used, names = set(own.values()), set(), {}
    for term in terms:
        name, n = own[term], 1
        while name in used or (n > 1 and name in owned):
            n += 1
            name = f"{own[term]}_{n}"
        used.add(name)
        names[term] = name
    return names


def _judge_all(rollouts: list[Rollout], specs: dict[str, RewardSpec], judge: Judge | None) -> dict[int, JudgeResult]:
    wanted = [i for i, r in enumerate(rollouts) if specs[r.sample.task].uses_judge]
    if not wanted:
        return {}
    if judge is None:
        tasks = sorted({rollouts[i].sample.task for i in wanted})
        raise ValueError(f"tasks {tasks} have an {JUDGE_TERM!r} reward term but no Judge was given; configure one")
    items = [JudgeItem(task=rollouts[i].sample.task, prompt=_prompt_text(rollouts[i]), response=rollouts[i].text,
                       gold=rollouts[i].sample.gold) for i in wanted]
    return dict(zip(wanted, judge.score_batch(items), strict=True))


def _prompt_text(rollout: Rollout) -> str:
    """The prompt as the judge sees it: the messages' contents, system message first."""
    return "\n\n".join(m["content"] for m in rollout.sample.messages)


def _grade(grader: Grader, task: str, rollouts: list[Rollout], extra: list[dict[str, Any]]) -> list[float | None]:
    try:
        return grader.grade(rollouts, extra)
    except GraderError as err:
        raise GraderError(f"task {task!r}, grader {grader.name!r}: {err}") from err
    except Exception as err:  # a user's grader failing mid-run: stop the step, naming who failed and how
        raise GraderError(f"task {task!r}, grader {grader.name!r} raised {type(err).__name__}: {err}") from err


def _term_values(rollouts: list[Rollout], specs: Mapping[str, RewardSpec], graders: Mapping[str, Grader],
                 verdicts: dict[int, JudgeResult], extra: list[dict[str, Any]]) -> list[dict[str, float | None]]:
    """Per rollout, the raw value of every term ("llm_judge" and, where the judge failed, "fallback:<name>"); what
    TRL-style functions pass to `log_extra` goes into `extra` (one dict per rollout)."""
    values: list[dict[str, float | None]] = [{} for _ in rollouts]
    by_task: dict[str, list[int]] = {}
    for i, r in enumerate(rollouts):
        by_task.setdefault(r.sample.task, []).append(i)
    for task, index in by_task.items():
        spec = specs[task]
        for name in dict.fromkeys(n for n, _ in spec.terms if n != JUDGE_TERM):
            for i, value in zip(index, _grade(graders[name], task, [rollouts[i] for i in index],
                                              [extra[i] for i in index]), strict=True):
                values[i][name] = value
        if spec.uses_judge:
            for i in index:
                values[i][JUDGE_TERM] = verdicts[i].score
            failed = [i for i in index if verdicts[i].score is None]
            if spec.fallback and failed:
                for i, value in zip(failed, _grade(graders[spec.fallback], task, [rollouts[i] for i in failed],
                                                   [extra[i] for i in failed]), strict=True):
                    values[i][f"fallback:{spec.fallback}"] = value
    return values


def _combine(rollout: Rollout, spec: RewardSpec, parts: dict[str, float | None], verdict: JudgeResult | None,
             names: Mapping[str, str]) -> Scored:
    """The rollout's reward from its terms' values (`parts`, by term); the Scored's parts and provider carry the
    terms' metric names (`names`)."""
    provider = "rule"
    total, weights = 0.0, 0.0
    failed = False
    for name, weight in spec.terms:
        value = parts[name]
        if name == JUDGE_TERM:
            assert verdict is not None  # _judge_all scored every rollout whose spec uses the judge
            provider = verdict.provider
            if value is None and spec.fallback:
                value, provider = parts[f"fallback:{spec.fallback}"], f"fallback:{names[spec.fallback]}"
        if value is None:
            # under `sum` a function's None is "not applicable" (TRL); a failed judge call voids the reward anyway
            failed = failed or spec.aggregation == "mean" or name == JUDGE_TERM
        else:
            total, weights = total + weight * value, weights + weight
    named = {(f"fallback:{names[k.removeprefix('fallback:')]}" if k.startswith("fallback:") else names.get(k, k)): v
             for k, v in parts.items()}
    if failed or weights == 0:  # weights == 0: every term left out
        return Scored(rollout=rollout, reward=None, parts=named, provider=provider)
    reward = total if spec.aggregation == "sum" else total / weights
    if not abs(reward) <= MAX_ABS_REWARD:  # each value is within it; large weights can still carry the sum past it
        raise GraderError(f"task {spec.task!r}: the weighted reward {reward:g} of its terms {dict(spec.terms)} "
                          f"(values {parts}) is beyond the largest reward magnitude {MAX_ABS_REWARD:g} "
                          f"(MAX_ABS_REWARD: larger ones overflow the float32 advantages); lower the weights in "
                          f"rewards.{spec.task}")
    return Scored(rollout=rollout, reward=reward, parts=named, provider=provider)


def term_matrix(scored: list[Scored], specs: Mapping[str, RewardSpec],
                names: Mapping[str, str]) -> tuple[torch.Tensor, torch.Tensor]:
    """(values_BM, weights_BM) of the rollouts' reward terms for grpo/core/advantages.normalize_then_sum (GDPO): one
    column per term name over every task's spec, in first-seen order; a value is the term's raw score (the judge's,
    or its fallback grader's where the judge failed, as in the weighted mean), NaN when it failed or is not a term
    of the row's task; a weight is the term's weight in the row's task, else 0. `names`: `metric_names`, the keys
    of the Scored's parts."""
    columns = list(dict.fromkeys(name for spec in specs.values() for name, _ in spec.terms))
    values = torch.full((len(scored), len(columns)), float("nan"), dtype=torch.float64)
    weights = torch.zeros(len(scored), len(columns), dtype=torch.float64)
    for i, s in enumerate(scored):
        spec = specs[s.rollout.sample.task]
        for name, weight in spec.terms:
            value = s.parts.get(names.get(name, name))
            if name == JUDGE_TERM and value is None and spec.fallback:
                value = s.parts.get(f"fallback:{names[spec.fallback]}")
            j = columns.index(name)
            weights[i, j] = weights[i, j] + weight
            values[i, j] = math.nan if value is None else float(value)
    return values, weights


def score_rollouts(
    rollouts: list[Rollout], specs: Mapping[str, RewardSpec], judge: Judge | None = None,
    graders: Mapping[str, Grader] | None = None,
) -> tuple[list[Scored], dict[str, float]]:
    """One Scored per rollout (input order; its parts by `metric_names`; its `extra`: the columns TRL-style functions
    gave `log_extra`) and the metrics `scoring/<task>/failed`, `scoring/<task>/fallback` (counts in this batch) plus the
    judge's cumulative `judge/*` counters when a judge was used.

    graders: the resolved graders by name, from `grpo.grading.graders.preflight` (built once per run: a reward model is
    loaded there); None = resolve the specs' names here (no reward-model names then: each call would load it)."""
    missing = sorted({r.sample.task for r in rollouts} - set(specs))
    if missing:
        raise KeyError(f"no RewardSpec for tasks {missing}; specs exist for {sorted(specs)}")
    if graders is None:
        graders = resolve_graders(specs)
    verdicts = _judge_all(rollouts, specs, judge)
    extra: list[dict[str, Any]] = [{} for _ in rollouts]
    values = _term_values(rollouts, specs, graders, verdicts, extra)
    names = metric_names(graders, specs)
    scored = [replace(_combine(r, specs[r.sample.task], values[i], verdicts.get(i), names), extra=extra[i])
              for i, r in enumerate(rollouts)]
    failed: Counter[str] = Counter()
    fallback: Counter[str] = Counter()
    for s in scored:
        failed[s.rollout.sample.task] += s.reward is None
        fallback[s.rollout.sample.task] += s.provider.startswith("fallback:")
    metrics: dict[str, Any] = {}
    for task in sorted({r.sample.task for r in rollouts}):
        metrics[f"scoring/{task}/failed"] = float(failed[task])
        metrics[f"scoring/{task}/fallback"] = float(fallback[task])
    if verdicts and judge is not None:
        metrics.update(judge.metrics())
    return scored, metrics


JUDGE_COUNTERS = ("judge/calls", "judge/failures", "judge/cache_hits", "judge/retries", "judge/items")


def per_step_counts(metrics: dict[str, float], totals: dict[str, float]) -> dict[str, float]:
    """The judge keeps running totals; the step metrics report this step's share (health checks rate them).
    `totals`: the totals at the last step, updated in place (a run's counters)."""
    out = dict(metrics)
    for key in JUDGE_COUNTERS:
        if key in metrics:
            total = float(metrics[key])
            out[key] = total - totals.get(key, 0.0)
            out[key + "_total"] = total
            totals[key] = total
    return out


def _finite(values: list[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(v)]


def _mean_std(values: list[float | None]) -> tuple[float, float, int]:
    """(mean, population std, count) of the finite values (NaN, NaN, 0 when there are none). Plain Python over the
    step's reward floats: a tensor here would read the device once a value (tests/test_host_syncs.py)."""
    valid = _finite(values)
    if not valid:
        return math.nan, math.nan, 0
    mean = math.fsum(valid) / len(valid)
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in valid) / len(valid)), len(valid)


def trl_mean_std(values: list[float | None]) -> tuple[float, float]:
    """TRL's (torch.nanmean, nanstd) of values where None (and NaN) is left out: the mean, and the std with Bessel's
    correction (NaN with fewer than 2 values), as GRPOTrainer logs rewards/<fn>/mean|std and reward / reward_std."""
    valid = _finite(values)
    mean = math.fsum(valid) / len(valid) if valid else math.nan
    if len(valid) < 2:
        return mean, math.nan
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in valid) / (len(valid) - 1))


def reward_metrics(scored: list[Scored], tasks: list[str]) -> dict[str, float]:
    """reward/<task>/mean and /std over the valid rewards of a step, /failed the count of failed ones (None, NaN);
    TRL's rewards/<fn>/mean and /std for each reward term by its metric name (`metric_names`: never a path), over
    every completion it scored, None left out (`trl_mean_std`); a run of several `tasks` adds the same per task,
    rewards/<task>/<fn>/mean and /std."""
    out: dict[str, float] = {}
    for t in tasks:
        mine = [s for s in scored if s.rollout.sample.task == t]
        if not mine:
            continue
        out[f"reward/{t}/mean"], out[f"reward/{t}/std"], n = _mean_std([s.reward for s in mine])
        out[f"reward/{t}/failed"] = float(len(mine) - n)
        if len(tasks) > 1:
            for name in dict.fromkeys(k for s in mine for k in s.parts if not k.startswith("fallback:")):
                out[f"rewards/{t}/{name}/mean"], out[f"rewards/{t}/{name}/std"] = trl_mean_std(
                    [s.parts.get(name) for s in mine])
    for name in dict.fromkeys(k for s in scored for k in s.parts if not k.startswith("fallback:")):
        out[f"rewards/{name}/mean"], out[f"rewards/{name}/std"] = trl_mean_std([s.parts.get(name) for s in scored])
    return out


class FallbackShareExceeded(ValueError):
    """More of a step's rewards of one task came from the fallback grader than judge.max_fallback_share allows."""


def fallback_shares(scored: list[Scored], specs: Mapping[str, RewardSpec]) -> dict[str, float]:
    """reward/<task>/fallback_share: the share of the step's rewards of each task WITH a fallback grader that came
    from it (provider "fallback:<name>": the judge failed on those). Tasks without a fallback get no entry."""
    out: dict[str, float] = {}
    for task in sorted({s.rollout.sample.task for s in scored}):
        if specs[task].fallback:
            providers = [s.provider for s in scored if s.rollout.sample.task == task]
            out[f"reward/{task}/fallback_share"] = sum(p.startswith("fallback:") for p in providers) / len(providers)
    return out


def check_fallback_share(metrics: Mapping[str, Any], max_share: float, step: int) -> None:
    """Raise FallbackShareExceeded naming the task and judge.max_fallback_share when a step's fallback share of a
    task is above `max_share` (the judge has stopped answering; training on the fallback alone is not this run)."""
    for key, share in metrics.items():
        if key.endswith("/fallback_share") and share > max_share:
            task = key.split("/")[1]
            raise FallbackShareExceeded(
                f"step {step}: {share:.0%} of task {task!r}'s rewards came from its fallback grader, above "
                f"judge.max_fallback_share={max_share:g}: the judge is failing (judge/failures in metrics.jsonl); "
                "fix the judge and run again (--resume auto continues from the last checkpoint, if any), or raise "
                "judge.max_fallback_share (1 = never stop)")
