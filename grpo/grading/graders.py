"""Graders of every kind: resolved once by name, called on a batch of rollouts, checked before the model loads.

A reward term names its grader (`rewards.<task> = "name:weight,..."`); `resolve_grader` tries, in order:
  a callable handed in by name      (the Python entry point: rewards={task: [fn, ...]})
  a built-in name of GRADERS        rule graders fn(completion, gold) -> [0, 1] | None   (grpo/core/rule_graders.py)
  a reward_models.<name> entry      a sequence-classifier reward model (grpo/grading/reward_models.py)
  an existing folder                a reward model folder with the default RewardModelSpec settings
  "package.module:function"         imported as a module
  "path/to/file.py:function"        the file imported under a private module name; sys.path is not touched
"llm_judge" is no Grader: scoring sends it to the Judge. A function's kind comes from its signature:
  per row   fn(completion: str, gold: dict) -> float | None
  batched   fn(prompts, completions, completion_ids, **columns) -> list[float | None], TRL's reward functions: any
            function naming prompts / completions / completion_ids, or taking only **kwargs. It gets what TRL's
            GRPOTrainer passes: prompts and completions as strings, or, for rows given as messages (TRL's
            conversational format), as message lists; the completion token ids; the row's columns (its gold
            fields, and `task`: each completion's task name, which TRL does not pass, unless the rows have a `task`
            column of their own) as keyword lists; TRL's `trainer_state`, `log_extra`, `log_metric`; and, as TRL,
            `environments` only in a run with an environment factory (rollout.environment_factory). `async def`
            functions are awaited. A function without **kwargs gets only the arguments it names.
Values (the range contract): None = "cannot grade this completion" (the reward becomes None: left out of its group,
counted, never 0); otherwise a finite real number. Built-in graders and bounded reward-model normalisations must
lie in their range [0, 1] (checked: a value outside is a bug); custom graders may return any finite number, e.g.
TRL's negative length penalties, up to `MAX_ABS_REWARD` in magnitude. NaN, inf, a value beyond that bound, a wrong
type or a wrong number of values is an error naming the task and the grader. The task reward is the weighted mean of
its terms (grpo/grading/scoring.py).

User functions (kinds "row" and "batched") are callbacks the run cannot vouch for, so each call is given a time
limit (`Grader.timeout_s`; the run sets train.reward_timeout_s): it runs on a daemon worker thread while the calling
thread waits at most that long. The worker is started once per function and reused for its later calls (a thread
started per call cost more than the demo's graders themselves: 80 starts a step); one that timed out is abandoned and
the next call gets a new one. Why a thread: a Python call cannot be interrupted from outside (a signal
reaches only the main thread, and not inside C code); a thread can at least be abandoned. A thread cannot be killed
either, so a call that outlives its limit raises GraderTimeout naming the function, and the run stops: the hung
thread is left behind, and as a daemon it does not hold the process at exit. Calls are made one at a time, in
order, so a function sees exactly the calls it saw on the calling thread (same order, same global random state);
the worker takes on the caller's torch grad mode and current CUDA device (each rank of a multi-GPU run has its own,
and a new thread would start on cuda:0); other thread-local state (signal handlers, an inference_mode or autocast
block of the caller) stays behind. A function that
raises SystemExit (sys.exit) or KeyboardInterrupt has failed, not finished: GraderError naming it, never an exit 0.
Built-in rule graders and reward models are the trainer's own code and are called directly.

`preflight` resolves every grader of every task and calls it on a real row of the task (the row's target and a
fixed text as completions) before the policy is loaded; every problem found is reported in one GraderError.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from numbers import Real
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from grpo.core.plumbing import UserCodeError, did_you_mean, import_callable
from grpo.core.rule_graders import GRADERS
from grpo.core.step_types import Rollout, Sample

JUDGE_TERM = "llm_judge"
RULE_BOUNDS = (0.0, 1.0)
TRL_ARGS = ("prompts", "completions", "completion_ids")
TOOL_ARGS = ("trajectory", "tool_calls", "tool_failures")
"""What a TRL-style reward function also gets from multi-turn rollouts with tools: the whole conversation (prompt
messages, then the assistant replies and tool messages), the calls made and the calls that failed, per completion."""
TRL_ONLY_ARGS = {  # what a function may ask for that is never passed here, and why
    "environments": "passed, as by TRL, only to runs with an environment factory (each completion's environment: "
                    "train(environment_factory=...) or rollout.environment_factory); this run has none, so give the "
                    "parameter a default (environments=None)",
    "completions_ids": "nothing: TRL passes `completion_ids` (its docs' Example 1 spells it `completions_ids`, "
                       "which TRL itself never passes); rename the parameter",
}
PREFLIGHT_TEXT = "I am not sure."  # an arbitrary reply: a grader must cope with whatever the policy writes
TRAINER_STATE: dict[str, Any] = {"global_step": 0, "max_steps": 0}
"""What a reward function's `trainer_state` says (TRL passes its TrainerState): the optimizer steps taken before this
step's completions were scored, and the run's; the trainer sets it before it scores each step (`set_trainer_state`)."""
USER_KINDS = ("row", "batched")
"""The grader kinds that are user functions: called under the time limit (module docstring)."""
MAX_ABS_REWARD = 1e15
"""The largest magnitude a grader's value (and a task's weighted reward, grpo/grading/scoring.py) may have. The
advantages are computed in float32 (largest finite 3.4e38) and their std squares deviations of up to 2|r|, summed
over a group or the whole batch: at 1e15, (2e15)**2 x 2**20 completions = 4.2e36 stays finite with room to spare,
while at 1e20 a single group's std overflows and its advantages collapse to 0 without a word, and past 3.4e38 the
reward itself is inf and every step is skipped as non-finite, no grader named. Real rewards are many orders of
magnitude smaller."""


class GraderError(ValueError):
    """A grader cannot be resolved, or returned something unusable. The message names the grader (and the task
    when known) and what went wrong."""


class GraderTimeout(GraderError):
    """A user function did not return within its time limit; its call is abandoned on a worker thread."""


def grader_kind(fn: Callable[..., Any]) -> str:
    """"batched" (TRL-style) or "row" (fn(completion, gold)), from the signature; GraderError when it fits neither."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have no signature: only the per-row call can be tried
        return "row"
    params = list(sig.parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if {p.name for p in params} & set(TRL_ARGS):
        return "batched"
    two = len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in params)
    if two and len(required) <= 2:
        return "row"
    if any(p.kind is p.VAR_KEYWORD for p in params):  # fn(**kwargs), fn(ground_truth, **kwargs): TRL-style
        return "batched"
    raise GraderError(f"its signature {sig} fits neither a per-row grader fn(completion, gold) nor a TRL-style "
                      "reward function fn(prompts, completions, completion_ids, **kwargs)")


def trl_inputs(rollouts: Sequence[Rollout], conversational: bool, with_tools: bool = False) -> dict[str, list[Any]]:
    """The keyword arguments TRL's GRPOTrainer gives a reward function for these rollouts: prompts, completions,
    completion_ids, and one list per column (the rows' gold fields and `task`; None where a row lacks a field).
    Multi-turn rollouts (or `with_tools`: a function that names them) add TOOL_ARGS; a conversational completion is
    then its messages, replies and tool results."""
    samples = [r.sample for r in rollouts]
    if conversational:
        prompts: list[Any] = [[dict(m) for m in s.messages] for s in samples]
        completions: list[Any] = [[dict(m) for m in r.messages] if r.messages is not None
                                  else [{"role": "assistant", "content": r.text}] for r in rollouts]
    else:
        prompts = [s.messages[-1]["content"] for s in samples]
        completions = [r.text for r in rollouts]
    columns = list(dict.fromkeys(k for s in samples for k in s.gold if k not in TRL_ARGS))
    kwargs: dict[str, list[Any]] = {"prompts": prompts, "completions": completions,
                                    "completion_ids": [list(r.completion_ids) for r in rollouts]}
    if with_tools or any(r.tool_use is not None for r in rollouts):  # multi-turn rollouts: the whole trajectory
        kwargs.update({c: [] for c in TOOL_ARGS})
        for r in rollouts:
            reply = list(r.messages) if r.messages is not None else [{"role": "assistant", "content": r.text}]
            kwargs["trajectory"].append([dict(m) for m in r.sample.messages] + [dict(m) for m in reply])
            kwargs["tool_calls"].append(r.tool_use.n_calls if r.tool_use is not None else 0)
            kwargs["tool_failures"].append(r.tool_use.n_failures if r.tool_use is not None else 0)
    if any(r.environment is not None for r in rollouts):  # rollout.environment_factory: TRL's `environments`
        kwargs["environments"] = [r.environment for r in rollouts]
    kwargs.update({c: [s.gold.get(c) for s in samples] for c in columns if c not in TOOL_ARGS})
    kwargs.setdefault("task", [s.task for s in samples])
    return kwargs


REWARD_LOGS: dict[str, list[float]] = {}
"""What reward functions passed to `log_metric` since the trainer last read it (`reward_logs`)."""


def log_metric(name: str, value: float) -> None:
    """TRL's `log_metric` argument: a reward function's own scalar, logged as reward_log/<name> (the step's mean)."""
    REWARD_LOGS.setdefault(str(name), []).append(float(value))


def reward_logs() -> dict[str, float]:
    """The means of what `log_metric` received since the last call, as reward_log/<name> metrics; emptied."""
    out = {f"reward_log/{name}": sum(values) / len(values) for name, values in REWARD_LOGS.items() if values}
    REWARD_LOGS.clear()
    return out


def set_trainer_state(global_step: int, max_steps: int) -> None:
    """Before a step's completions are scored: the optimizer steps taken so far and the run's total; what
    `log_metric` got before (the preflight's calls, an evaluation's) is dropped, so the step logs its own."""
    TRAINER_STATE.update(global_step=int(global_step), max_steps=int(max_steps))
    REWARD_LOGS.clear()


def extra_logger(extra: Sequence[dict[str, Any]] | None, who: str) -> Callable[[str, Sequence[Any]], None]:
    """TRL's `log_extra(column, values)` argument for one call on len(extra) completions: values (one per completion,
    in the order the call got them) go into `extra[i][column]`, and from there into the completions' rows of samples/
    and evals/ (grpo/run/tracking.write_scored), as TRL adds them as columns to its completions table. extra=None (the
    preflight's calls): checked, then dropped."""
    def log_extra(column: str, values: Sequence[Any]) -> None:
        values = list(values)
        if extra is None:  # the preflight's calls: nowhere to put them
            return
        if len(values) != len(extra):
            raise GraderError(f"log_extra({column!r}, ...) got {len(values)} values for {len(extra)} completions "
                              f"(reward function {who!r}): give one value per completion, in order")
        for row, value in zip(extra, values, strict=True):
            row[str(column)] = _plain(value)
    return log_extra


def _plain(value: Any) -> Any:
    """A logged value as JSON can hold it (numpy / torch values as numbers or lists; anything else as text)."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return str(value)
    return value


def trainer_state() -> Any:
    """TRL's `trainer_state` argument: a transformers TrainerState holding TRAINER_STATE (global_step, max_steps)."""
    try:
        from transformers import TrainerState
    except ImportError:  # pragma: no cover - transformers comes with every model
        from types import SimpleNamespace as TrainerState
    return TrainerState(**TRAINER_STATE)


def _run(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    if inspect.iscoroutinefunction(fn):
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no loop runs on this thread (a worker thread, a script): one of its own, here
            return asyncio.run(fn(**kwargs))
        # inside a running loop (Jupyter), where asyncio.run fails: a thread of its own with its own loop
        with ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(asyncio.run, fn(**kwargs)).result()
    return fn(**kwargs)


def _exit_problem(err: BaseException) -> str:
    """What a reward function that raised SystemExit / KeyboardInterrupt did, for its GraderError."""
    if isinstance(err, SystemExit):
        return (f"it raised SystemExit({err.code!r}) (sys.exit / exit()): a reward function returns its values, or "
                "raises an exception saying what went wrong; it cannot end the run, and an exit is no success")
    return ("it raised KeyboardInterrupt itself (not a Ctrl-C of the run): a reward function returns its values, "
            "or raises an exception saying what went wrong")


class _Worker:
    """One daemon thread that runs the calls handed to it, one at a time (`call_limited`)."""

    def __init__(self, who: str) -> None:
        import queue

        self.jobs: "queue.SimpleQueue[tuple[Callable[[], None], threading.Event]]" = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name=f"reward function {who}", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            job, done = self.jobs.get()
            job()
            done.set()

    def run(self, job: Callable[[], None], timeout_s: float) -> bool:
        """job() on the worker; False when it has not returned within timeout_s (the worker is then abandoned)."""
        done = threading.Event()
        self.jobs.put((job, done))
        return done.wait(timeout_s)


_WORKERS: dict[str, _Worker] = {}
_WORKERS_LOCK = threading.Lock()


def call_limited(call: Callable[[], Any], timeout_s: float, who: str) -> Any:
    """call() on the daemon worker thread of `who` (started once, reused), waited for at most `timeout_s` (the module
    docstring says why). Returns its value or re-raises its exception; GraderTimeout when it has not returned in time
    (the worker is abandoned with it), a GraderError for SystemExit / KeyboardInterrupt. The wait is a timed wait, so
    a Ctrl-C / SIGTERM of the run still reaches the calling (main) thread."""
    box: dict[str, Any] = {}
    grad = torch.is_grad_enabled()  # thread-local in torch: the worker takes the caller's on
    device = torch.cuda.current_device() if torch.cuda.is_initialized() else None

    def target() -> None:
        try:
            torch.set_grad_enabled(grad)
            if device is not None:
                torch.cuda.set_device(device)
            box["value"] = call()
        except BaseException as err:  # everything the function raises is handed to the caller, exits included
            box["error"] = err

    with _WORKERS_LOCK:
        worker = _WORKERS.get(who)
        if worker is None or not worker.thread.is_alive():
            worker = _WORKERS[who] = _Worker(who)
    if not worker.run(target, timeout_s):
        with _WORKERS_LOCK:
            if _WORKERS.get(who) is worker:
                del _WORKERS[who]  # it is busy with the call that hung: the next call gets a new worker
        raise GraderTimeout(f"it did not return within train.reward_timeout_s={timeout_s:g} s: the call is abandoned "
                            "on a background thread (a thread cannot be stopped) and the run stops here; look for a "
                            "call that waits without a timeout (network, lock, input) or a loop that never ends, or "
                            "raise train.reward_timeout_s")
    if "error" in box:
        err = box.pop("error")
        if isinstance(err, (SystemExit, KeyboardInterrupt)):
            raise GraderError(_exit_problem(err)) from err
        raise err
    return box["value"]


def _call_batched(fn: Callable[..., Any], rollouts: Sequence[Rollout], invoke: Callable[[Callable[[], Any]], Any],
                  extra: Sequence[dict[str, Any]] | None = None, who: str = "") -> list[Any]:
    sig = inspect.signature(fn)
    takes_all = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    out: list[Any] = [None] * len(rollouts)
    for conversational in (False, True):  # TRL's format is per dataset; here per row, so call each format apart
        index = [i for i, r in enumerate(rollouts) if r.sample.conversational == conversational]
        if not index:
            continue
        kwargs = trl_inputs([rollouts[i] for i in index], conversational,
                            with_tools=any(name in TOOL_ARGS for name in sig.parameters))
        kwargs["trainer_state"] = trainer_state()  # as TRL: one object, not a list per completion
        kwargs["log_extra"] = extra_logger(None if extra is None else [extra[i] for i in index], who)
        kwargs["log_metric"] = log_metric
        missing = [p.name for p in sig.parameters.values() if p.default is p.empty and p.name not in kwargs
                   and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        if missing:
            why = "; ".join(f"{m}: {TRL_ONLY_ARGS[m]}" for m in missing if m in TRL_ONLY_ARGS)
            raise GraderError(f"it needs argument(s) {missing} that are not passed ({why or 'not a column'}); it "
                              f"gets {sorted(kwargs)}")
        if not takes_all:
            kwargs = {k: v for k, v in kwargs.items() if k in sig.parameters}
        values = invoke(lambda kwargs=kwargs: _run(fn, kwargs))
        if not isinstance(values, (list, tuple)) or len(values) != len(index):
            got = f"{len(values)} values" if isinstance(values, (list, tuple)) else f"a {type(values).__name__}"
            raise GraderError(f"it returned {got} for {len(index)} completions; a TRL-style reward function returns "
                              "a list with one float (or None) per completion")
        for i, value in zip(index, values, strict=True):
            out[i] = value
    return out


def checked(value: Any, bounds: tuple[float, float] | None) -> float | None:
    """A grader's value as float or None; GraderError for a wrong type, a non-finite value or one out of bounds."""
    if value is None:
        return None
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:  # numpy / torch scalars
        value = value.item()
    if not isinstance(value, Real):
        raise GraderError(f"it returned {value!r} ({type(value).__name__}); return a float, or None when it "
                          "cannot grade")
    number = float(value)
    if not math.isfinite(number):
        raise GraderError(f"it returned {number!r}; return a finite float, or None when it cannot grade")
    if abs(number) > MAX_ABS_REWARD:
        raise GraderError(f"it returned {number!r}, beyond the largest reward magnitude {MAX_ABS_REWARD:g} "
                          "(MAX_ABS_REWARD: larger ones overflow the float32 advantages and every step would be "
                          "skipped); scale its values down")
    if bounds is not None and not bounds[0] <= number <= bounds[1]:
        raise GraderError(f"it returned {number!r}, outside its range [{bounds[0]}, {bounds[1]}]")
    return number


@dataclass(frozen=True)
class Grader:
    """One resolved grader. `grade(rollouts)` returns one checked value per rollout."""

    name: str
    """The name the reward term gives."""
    kind: str
    """rule | row | batched | reward_model."""
    fn: Callable[..., Any] = field(repr=False)
    """rule / row: fn(completion, gold); batched: the TRL-style function; reward_model: RewardModel.scores."""
    bounds: tuple[float, float] | None = None
    """The range every value must lie in; None = any finite number up to MAX_ABS_REWARD in magnitude."""
    timeout_s: float | None = None
    """Per-call time limit of a user function (kinds row / batched), on a worker thread (`call_limited`); None =
    called on the calling thread without a limit (library use; a run always sets train.reward_timeout_s)."""

    def grade(self, rollouts: Sequence[Rollout], extra: Sequence[dict[str, Any]] | None = None) -> list[float | None]:
        """One checked value per rollout. `extra` (one dict per rollout): where a TRL-style function's `log_extra`
        columns go (None: dropped)."""
        if not rollouts:
            return []
        if self.kind in ("rule", "row"):
            raw = [self._invoke(lambda r=r: self.fn(r.text, r.sample.gold)) for r in rollouts]
        elif self.kind == "batched":
            raw = _call_batched(self.fn, rollouts, self._invoke, extra, self.name)
        else:
            raw = self.fn(rollouts)
        return [checked(v, self.bounds) for v in raw]

    def _invoke(self, call: Callable[[], Any]) -> Any:
        """call() of this grader's function: a user function under its time limit, an exit it raises its failure."""
        if self.kind not in USER_KINDS:
            return call()
        if self.timeout_s is not None:
            return call_limited(call, self.timeout_s, self.name)
        try:
            return call()
        except SystemExit as err:  # (a KeyboardInterrupt here cannot be told from a Ctrl-C of the run)
            raise GraderError(_exit_problem(err)) from err


def wrap(name: str, fn: Callable[..., Any]) -> Grader:
    """A user function as a Grader, its kind read from its signature."""
    return Grader(name=name, kind=grader_kind(fn), fn=fn)


def resolve_grader(name: str, callables: Mapping[str, Callable[..., Any]] | None = None,
                   reward_models: Mapping[str, Any] | None = None, device: Any = "cpu") -> Grader:
    """The grader a reward term names (see the module docstring for the order). `reward_models` maps names to
    RewardModelSpec; a reward model is loaded here, on `device`. GraderError names the grader."""
    try:
        if callables and name in callables:
            return wrap(name, callables[name])
        if name in GRADERS:
            return Grader(name=name, kind="rule", fn=GRADERS[name], bounds=RULE_BOUNDS)
        if (reward_models and name in reward_models) or Path(name).expanduser().is_dir():
            from grpo.grading.reward_models import BOUNDED, RewardModelSpec, load_reward_model

            spec = reward_models[name] if reward_models and name in reward_models else RewardModelSpec(path=name)
            where = f"reward_models.{name}" if reward_models and name in reward_models else "reward model"
            model = load_reward_model(spec, device, where)
            return Grader(name=name, kind="reward_model", fn=model.scores, bounds=BOUNDED.get(spec.normalize))
        if ":" not in name:
            known = sorted(GRADERS) + sorted(reward_models or {}) + sorted(callables or {})
            raise GraderError(f"not a known grader{did_you_mean([name], [*known, JUDGE_TERM])}: use a built-in "
                              f"({', '.join(known)}), {JUDGE_TERM!r}, a reward model folder, 'package.module:function' "
                              "or 'path/to/file.py:function'")
        try:
            return wrap(name, import_callable(name))
        except (GraderError, UserCodeError):
            misread = _misread_weight(name, callables, reward_models)
            if misread is None:
                raise
            grader, weight = misread
            raise GraderError(f"{weight!r} is not a number: a reward term is grader:weight, e.g. '{grader}:1.0' "
                              "(the weight is optional)") from None
    except (GraderError, UserCodeError) as err:
        raise GraderError(f"grader {name!r}: {err}") from err.__cause__
    except ValueError as err:  # a reward model that does not load
        raise GraderError(f"grader {name!r}: {err}") from err


def _misread_weight(name: str, callables: Mapping[str, Callable[..., Any]] | None,
                    reward_models: Mapping[str, Any] | None) -> tuple[str, str] | None:
    """(grader, weight) when `name` is a term whose weight is no number ('format:high', 'rewards.py:fn:x'): the
    spec parser keeps such a term whole, and it would read as a module or file that does not exist. Asked only
    once the import has failed, so a real 'module:function' (or a Windows drive letter) is never misread."""
    grader, sep, weight = name.rpartition(":")
    if not sep or not grader:
        return None
    known = set(GRADERS) | {JUDGE_TERM} | set(reward_models or {}) | set(callables or {})
    head, sep, function = grader.rpartition(":")  # 'file.py:fn' or 'package.module:fn' before the weight
    if grader in known or (sep and head and function.isidentifier()):
        return grader, weight
    return None


def term_names(specs: Mapping[str, Any]) -> dict[str, list[str]]:
    """Every grader name the specs use (judge excluded; fallbacks included) -> the tasks that use it."""
    users: dict[str, list[str]] = {}
    for task, spec in specs.items():
        for name in [n for n, _ in spec.terms] + ([spec.fallback] if spec.fallback else []):
            if name != JUDGE_TERM and task not in users.setdefault(name, []):
                users[name].append(task)
    return users


def resolve_graders(specs: Mapping[str, Any], callables: Mapping[str, Callable[..., Any]] | None = None,
                    reward_models: Mapping[str, Any] | None = None, device: Any = "cpu") -> dict[str, Grader]:
    """Every grader the specs name, resolved once (a reward model is loaded once however many tasks use it)."""
    return {name: resolve_grader(name, callables, reward_models, device) for name in sorted(term_names(specs))}


def _preflight_rollouts(sample: Sample, encode: Callable[[str], Sequence[int]]) -> list[Rollout]:
    texts = [sample.target, PREFLIGHT_TEXT] if sample.target else [PREFLIGHT_TEXT]
    return [Rollout(sample=sample, prompt_ids=(), completion_ids=tuple(encode(t)), text=t, stopped=True,
                    truncated=False) for t in texts]


def _utf8(text: str) -> list[int]:
    return list(text.encode("utf-8"))


PREFLIGHT_ROWS_IF_NONE = 8
"""Rows a user's reward function is tried on when it returns None for every completion of the task's first row (None
is TRL's "does not apply to this row"; a function that applies to none of them would train nothing)."""


def _applies_nowhere(task: str, grader: Grader, rows: Sequence[Sample],
                     encode: Callable[[str], Sequence[int]]) -> list[str]:
    """[] when `grader` (a user function) scores some completion of the task's first PREFLIGHT_ROWS_IF_NONE rows, or
    is not a user function; else the problem."""
    if grader.kind not in ("row", "batched"):
        return []
    tried = list(rows[:PREFLIGHT_ROWS_IF_NONE])
    rollouts = [r for row in tried[1:] for r in _preflight_rollouts(row, encode)]
    if rollouts and any(v is not None for v in grader.grade(rollouts)):
        return []
    return [f"task {task!r}, grader {grader.name!r}: returned None for every completion of the first {len(tried)} "
            "row(s); None means 'does not apply to this row' (as in TRL), so a reward that applies to no row trains "
            "nothing: return a number"]


def preflight(specs: Mapping[str, Any], samples_by_task: Mapping[str, Sequence[Sample]], *, judge: Any = None,
              callables: Mapping[str, Callable[..., Any]] | None = None, reward_models: Mapping[str, Any] | None = None,
              device: Any = "cpu", encode: Callable[[str], Sequence[int]] | None = None,
              timeout_s: float | None = None, environment: Callable[[Sample], Any] | None = None,
              ) -> dict[str, Grader]:
    """Resolve every grader of every task and call it once on the task's first row; return the graders by name
    (keep them: a reward model is loaded here, once), each user function with `timeout_s` as its per-call time limit
    (train.reward_timeout_s; None = none), which the trial calls already obey: a function that hangs is reported
    with the other problems and not tried again. Completions tried: the row's target and `PREFLIGHT_TEXT`;
    their ids come from `encode` (the policy tokenizer's, when it is loaded; UTF-8 bytes otherwise). A task using
    "llm_judge" needs `judge`, whose rubric for the task is loaded and filled with the row, and which is called
    once on it: a judge that fails (refused, unreachable, no score in its reply) is a problem unless the task's spec
    has a fallback grader (`llm_judge:1.0|bbq_rule`), which is then named in a warning. `environment`: a run's
    environment factory (grpo/phases/environments.Environments.preflight): each trial completion gets a fresh
    environment reset on the row, what a function reading `environments` is handed.

    Raises GraderError listing every broken (task, grader) with what went wrong."""
    problems: list[str] = []
    graders: dict[str, Grader] = {}
    hung: set[str] = set()  # timed out once: its abandoned call may still hold whatever it waits for
    for name, tasks in term_names(specs).items():
        try:
            graders[name] = replace(resolve_grader(name, callables, reward_models, device), timeout_s=timeout_s)
        except GraderError as err:
            problems.append(f"task {', '.join(map(repr, tasks))}, {err}")
    for task, spec in specs.items():
        rows = samples_by_task.get(task) or []
        if not rows:
            problems.append(f"task {task!r}: no rows to try its graders on (is the task name right?)")
            continue
        rollouts = _preflight_rollouts(rows[0], encode or _utf8)
        if environment is not None:  # a run with environments: each trial completion gets one, reset on the row
            rollouts = [replace(r, environment=environment(r.sample)) for r in rollouts]
        for name in dict.fromkeys([n for n, _ in spec.terms] + ([spec.fallback] if spec.fallback else [])):
            if name == JUDGE_TERM:
                problems += _judge_problem(task, judge, rollouts[0], getattr(spec, "fallback", None))
            elif name in graders and name not in hung:
                try:
                    if all(v is None for v in graders[name].grade(rollouts)):  # TRL's None: not applicable
                        problems += _applies_nowhere(task, graders[name], rows, encode or _utf8)
                except GraderTimeout as err:
                    hung.add(name)
                    problems.append(f"task {task!r}, grader {name!r} on row {rows[0].id!r}: {err}")
                except Exception as err:  # anything a user's grader raises is reported, named, with the rest
                    detail = str(err) if isinstance(err, GraderError) else f"raised {type(err).__name__}: {err}"
                    problems.append(f"task {task!r}, grader {name!r} on row {rows[0].id!r}: {detail}")
    if problems:
        raise GraderError("reward preflight failed (nothing was trained):\n  - " + "\n  - ".join(problems))
    return graders


def _judge_problem(task: str, judge: Any, rollout: Rollout, fallback: str | None = None) -> list[str]:
    """[] when the judge scores the task's first row; else the problem, or (with a fallback) a warning and []."""
    from grpo.grading.judge import JudgeItem

    if judge is None:
        return [f"task {task!r}, grader {JUDGE_TERM!r}: no judge is configured (set judge.base_url)"]
    prompt = "\n\n".join(m["content"] for m in rollout.sample.messages)
    try:
        judge.rubric(task).render(prompt, rollout.text, rollout.sample.gold)
    except Exception as err:  # a rubric file that does not load or format
        return [f"task {task!r}, grader {JUDGE_TERM!r}: its rubric fails: {type(err).__name__}: {err}"]
    result = judge.score_one(JudgeItem(task, prompt, rollout.text, dict(rollout.sample.gold)))
    if result.score is not None:
        return []
    where = f"the judge at judge.base_url={judge.cfg.base_url!r} (judge.model={judge.cfg.model!r})"
    if fallback:
        print(f"warning: task {task!r}: {where} failed its trial call ({result.error}); its rewards will come from "
              f"the fallback {fallback!r}, the run stops when more than judge.max_fallback_share="
              f"{judge.cfg.max_fallback_share:g} of a step's rewards do", file=sys.stderr)
        return []
    return [f"task {task!r}, grader {JUDGE_TERM!r}: {where} failed its trial call: {result.error}; fix the judge "
            f"settings, or give the task a fallback grader (rewards.{task}=\"llm_judge:1.0|<rule grader>\")"]


def builtin_graders() -> dict[str, str]:
    """Name -> first docstring paragraph of every built-in grader, "llm_judge" included (for --help)."""
    out = {name: " ".join((fn.__doc__ or "").strip().split("\n\n")[0].split()) for name, fn in sorted(GRADERS.items())}
    out[JUDGE_TERM] = "the LLM judge (judge.* settings; rubric grpo/grading/rubrics/<task>.txt), score in [0, 1]"
    return out


def graders_help() -> str:
    """The end of --help: the built-in graders a rewards.<task> term may name."""
    return ("\n\nBuilt-in graders for rewards.<task> (besides llm_judge, a reward_models name, package.module:function "
            "and path/to/file.py:function; docs/CUSTOM_TASKS.md):\n"
            + "\n".join(f"  {name}: {doc}" for name, doc in builtin_graders().items()))
