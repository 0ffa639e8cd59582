"""Environments for stateful tool tasks, TRL 1.16's `environment_factory` (experimental there): a class (or any
callable) whose instances hold one rollout's state.

    env = factory()                            one instance per trajectory, pooled: built once, reset per rollout
    observation = env.reset(**row)             the row's fields (prompt and columns); None, or text appended to the
                                               prompt's last message before generation (TRL: content + observation)
    env.<public method>(**arguments)           the model's tools, described by signature and docstring as tools=[...]
    reward_fn(..., environments=[env, ...])    each completion's environment, in completion order

An environment with a `get_reward()` method owns a reward, as in TRL: it becomes one more term of every task's reward,
weight 1, named after the class (`environment_rewards`), called once per completed rollout.

`reset` and `get_reward` are never tools, nor a method whose name starts with "_" (TRL's rule). The pool hands out
instances in trajectory order, so a rollout that resets its environment from the row alone is the same after a
resume. A Rollout keeps its environment until the next rollouts of the run reset it: reward functions read it right
after the rollouts, as TRL's do.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

from grpo.config import ConfigError
from grpo.core.plumbing import UserCodeError, import_callable, importable_ref
from grpo.core.step_types import Sample

RESERVED = ("reset", "get_reward")
"""Methods of an environment that are not tools (TRL 1.16's)."""
FIELD = "rollout.environment_factory"


class ToolError(ConfigError):
    """A tool cannot be used: no schema (docstring / type hints), a chat template that cannot render a tool message.
    The message names the tool and the fix; the field at fault is rollout.tools."""

    def __init__(self, message: str):
        super().__init__(message, field="rollout.tools")


class EnvironmentFailure(ConfigError):
    """An environment cannot be built or reset: names the environment, the row and the fix."""

    def __init__(self, message: str):
        super().__init__(message, field=FIELD)


def tool_methods(instance: Any) -> list[str]:
    """The public methods of `instance`'s class that become tools (read on the class: properties are not run)."""
    return [name for name, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)
            if name not in RESERVED and not name.startswith("_")]


@dataclass
class Environments:
    """The run's environment factory, the tools its instances offer and the pool of instances."""

    factory: Callable[[], Any] = field(repr=False)
    name: str
    """The environment's class name."""
    methods: list[str]
    schemas: list[dict[str, Any]] = field(repr=False)
    pool: list[Any] = field(default_factory=list, repr=False)

    def instances(self, n: int) -> list[Any]:
        """`n` instances, the first `n` of the pool (grown as needed): trajectory i gets instance i every time."""
        while len(self.pool) < n:
            self.pool.append(self._new())
        return self.pool[:n]

    def _new(self) -> Any:
        try:
            return self.factory()
        except Exception as err:  # the user's constructor: named, with what it raised
            raise EnvironmentFailure(f"environment {self.name}: building one raised "
                                     f"{type(err).__name__}: {err}") from err

    def reset(self, env: Any, sample: Sample) -> tuple[dict[str, Any], ...]:
        """Reset `env` for `sample`'s row; the prompt's messages with the observation appended (TRL's rule)."""
        try:
            observation = env.reset(**reset_arguments(sample))
        except Exception as err:  # the user's reset: the run stops naming it (a tool's error goes to the model)
            raise EnvironmentFailure(f"environment {self.name}: reset() on row {sample.id!r} of task {sample.task!r} "
                                     f"raised {type(err).__name__}: {err}") from err
        if observation is None:
            return tuple(sample.messages)
        if not isinstance(observation, str):
            raise EnvironmentFailure(f"environment {self.name}: reset() returned a {type(observation).__name__} on "
                                     f"row {sample.id!r}; return None or a str (appended to the prompt, as in TRL)")
        last = dict(sample.messages[-1])
        return tuple(sample.messages[:-1]) + ({**last, "content": last["content"] + observation},)

    def preflight(self, sample: Sample) -> Any:
        """A fresh instance reset on `sample`'s row: what the reward preflight hands a function that reads
        `environments` (grpo/grading/graders.preflight)."""
        env = self._new()
        self.reset(env, sample)
        return env


def environment_rewards(specs: Mapping[str, Any], callables: Mapping[str, Callable[..., Any]] | None,
                        environments: Environments | None) -> tuple[dict[str, Any], dict[str, Callable[..., Any]]]:
    """(specs, callables) with the environment's `get_reward` as one more term of every task, weight 1, named after
    its class (TRL 1.16: an extra reward source logged under the class name); unchanged without one. The term is a
    TRL-style reward function reading `environments`."""
    callables = dict(callables or {})
    if environments is None or not callable(getattr(environments.pool[0], "get_reward", None)):
        return dict(specs), callables
    taken = {name for spec in specs.values() for name, _ in spec.terms} | set(callables)
    name, n = environments.name, 1
    while name in taken:
        n += 1
        name = f"{environments.name}_{n}"

    def get_reward(environments: Sequence[Any], **kwargs: Any) -> list[float]:
        return [env.get_reward() for env in environments]

    get_reward.__name__ = name
    callables[name] = get_reward
    return {task: replace(spec, terms=(*spec.terms, (name, 1.0))) for task, spec in specs.items()}, callables


def reset_arguments(sample: Sample) -> dict[str, Any]:
    """What `reset` receives, TRL's row: `prompt` (the messages of a conversational row, else the prompt's text)
    and the row's other columns (its gold fields)."""
    prompt = [dict(m) for m in sample.messages] if sample.conversational else sample.messages[-1]["content"]
    return {**sample.gold, "prompt": prompt}


def tool_schema(fn: Callable[..., Any], error: Callable[[str], ConfigError] = ToolError, what: str = "tool",
                fix: str = "as for TRL's tools=[...]") -> dict[str, Any]:
    """The function's JSON schema from its signature and docstring: transformers' `get_json_schema`, what TRL and
    `apply_chat_template(tools=...)` use (type hints on every argument, a Google-style docstring with an Args
    section). A function or method without one raises `error` naming it as `what` and ending with `fix` (an
    environment's method: EnvironmentFailure, "or start its name with '_' ...")."""
    from transformers.utils import get_json_schema

    try:
        return get_json_schema(fn)
    except Exception as err:  # transformers raises its own TypeError / DocstringParsingException subclasses
        raise error(f"{what} {getattr(fn, '__name__', fn)!r}: no JSON schema from its signature and docstring "
                    f"({err}); give every argument a type hint and write a docstring with an Args: section, "
                    f"{fix}") from err


def build_environments(factory: Callable[[], Any], tool_names: Sequence[str] = ()) -> Environments:
    """Probe one instance (kept as the pool's first): it must have a callable `reset`; its public methods become
    tools, described by their signature and docstring. ConfigError naming rollout.environment_factory."""
    name = getattr(factory, "__name__", type(factory).__name__)
    box = Environments(factory, name, [], [])
    instance = box._new()
    box.name = type(instance).__name__
    if not callable(getattr(instance, "reset", None)):
        raise EnvironmentFailure(f"environment {box.name} has no reset method; TRL's environments define reset(self, "
                                 "**kwargs) returning None or the text to append to the prompt")
    try:
        box.schemas = [tool_schema(getattr(instance, m), EnvironmentFailure, "method",
                                   "or start its name with '_' to keep it from the model")
                       for m in tool_methods(instance)]
    except EnvironmentFailure as err:
        raise EnvironmentFailure(f"environment {box.name}: {err}") from err
    box.methods = [s["function"]["name"] for s in box.schemas]
    if clash := sorted(set(box.methods) & set(tool_names)):
        raise EnvironmentFailure(f"environment {box.name}'s methods {clash} have the names of rollout.tools; rename "
                                 "one of each")
    box.pool.append(instance)
    return box


def resolve_environment(spec: str, callables: Mapping[str, Callable[..., Any]] | None = None,
                        tool_names: Sequence[str] = ()) -> Environments | None:
    """The run's Environments from rollout.environment_factory ("" = none): "package.module:Class",
    "path/to/file.py:Class" or a name of `callables` (a factory handed to `train(environment_factory=...)`)."""
    if not spec:
        return None
    try:
        factory = callables[spec] if callables and spec in callables else import_callable(spec)
    except UserCodeError as err:
        raise EnvironmentFailure(f"config field `{FIELD}`: {spec!r}: {err}") from err
    return build_environments(factory, tool_names)


def callable_spec(entry: Callable[..., Any] | str, fallback: str) -> tuple[str, dict[str, Callable[..., Any]]]:
    """A function or class handed to `train(...)` (a tool, an environment factory) as the config string that names
    it and the callables that string needs: a string stays itself; an importable one is "module:name" (config.json
    then names it, and a resumed run finds it again); any other (defined in __main__, a notebook, a closure) is
    entered under its own name (`fallback` when it has none) with itself in the mapping."""
    if isinstance(entry, str):
        return entry, {}
    ref = importable_ref(entry)
    if ref is not None:
        return ref, {}
    name = getattr(entry, "__name__", fallback)
    return name, {name: entry}


def factory_spec(factory: Callable[[], Any] | str) -> tuple[str, dict[str, Callable[..., Any]]]:
    """`train(environment_factory=...)` as a rollout.environment_factory string and the callables it names
    (`callable_spec`; a factory without a name goes by its type's)."""
    return callable_spec(factory, type(factory).__name__)
