"""`grpo_train.train(...)`'s arguments as one checked Config: a Config, a preset or dotted overrides; tasks as
tasks.<task> sections; reward functions entered under names of their own; a model by name or already loaded."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from grpo.config import settings as C
from grpo.config.presets import CUSTOM_PRESET
from grpo.run.config_check import check_config


def python_config(config: C.Config | str | Sequence[str] | None, tasks: Mapping[str, Any] | None,
                  rewards: Mapping[str, Any] | None, model: str | tuple[Any, Any] | None,
                  sections: Mapping[str, Mapping[str, Any]]) -> tuple[C.Config, dict[str, Callable[..., Any]]]:
    """`train`'s arguments as one checked Config and the reward functions by the names its rewards.<task> give
    them."""
    if isinstance(config, C.Config):
        tree = C.to_dict(config)
    else:
        preset = config if isinstance(config, str) else (CUSTOM_PRESET if tasks else "demo")
        overrides = list(config) if config is not None and not isinstance(config, str) else []
        tree = C.config_tree(preset, overrides)
    for name, fields in sections.items():
        if not isinstance(fields, Mapping):
            raise C.ConfigError(f"train(..., {name}=...) must be a dict of the section's fields, e.g. "
                                f"train(rollout={{'k': 8}}); got {fields!r}", field=name)
        tree[name] = {**tree.get(name, {}), **fields} if isinstance(tree.get(name), dict) else fields
    for task, source in (tasks or {}).items():
        tree["tasks"][task] = ({"path": str(source)} if isinstance(source, (str, Path)) else
                               dataclasses.asdict(source) if dataclasses.is_dataclass(source) else dict(source))
    callables: dict[str, Callable[..., Any]] = {}
    for task, terms in (rewards or {}).items():
        tree["rewards"][task] = reward_terms(task, terms, callables, set(tree.get("reward_models", {})))
    if isinstance(model, str):
        tree["model"]["name"] = model
    elif model is not None and not (isinstance(model, tuple) and len(model) == 2):
        raise C.ConfigError(f"train(model=...) takes a model name or a (model, tokenizer) pair; got "
                            f"{type(model).__name__}", field="model.name")
    elif model is not None:
        tree["model"]["name"] = getattr(model[0], "name_or_path", "") or f"python:{type(model[0]).__name__}"
    return check_config(C.from_dict(tree)), callables


def reward_terms(task: str, terms: Any, callables: dict[str, Callable[..., Any]], taken: set[str]) -> str:
    """A rewards.<task> entry from `train`'s rewards[task]: a spec string as it is, or a list of functions, grader
    names and (grader, weight) pairs; each function is entered in `callables` under a name of its own (its
    __name__, made unique, never a built-in grader's or a reward model's)."""
    from grpo.grading.graders import JUDGE_TERM
    from grpo.core.rewards import GRADERS

    if isinstance(terms, str):
        return terms
    out = []
    for item in [terms] if callable(terms) or isinstance(terms, tuple) else list(terms):
        grader, weight = item if isinstance(item, tuple) else (item, None)
        if callable(grader):
            base = re.sub(r"[^\w.-]", "_", getattr(grader, "__name__", type(grader).__name__)) or "reward"
            name, n = base, 1
            while (name in GRADERS or name == JUDGE_TERM or name in taken
                   or (name in callables and callables[name] is not grader)):
                n += 1
                name = f"{base}_{n}"
            callables[name] = grader
        elif isinstance(grader, str):
            name = grader
        else:
            raise C.ConfigError(f"train(rewards={{{task!r}: ...}}): {grader!r} is neither a function nor a grader "
                                "name", field=f"rewards.{task}")
        out.append(name if weight is None else f"{name}:{float(weight)!r}")
    if not out:
        raise C.ConfigError(f"train(rewards={{{task!r}: []}}): give at least one grader", field=f"rewards.{task}")
    return ",".join(out)
