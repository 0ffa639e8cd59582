"""The reward functions `trl grpo --reward_funcs NAME` names (TRL 1.16's trl/scripts/grpo.py registry), as module
functions a reward term can name ("grpo.grading.trl_rewards:think_format_reward").

    accuracy_reward               TRL's (math_verify compares the completion's answer with the row's `solution`)
    reasoning_accuracy_reward     TRL's (the same, on the text after the reasoning)
    think_format_reward           TRL's when TRL is installed, else the same regular expression here
    get_soft_overlong_punishment  TRL's get_soft_overlong_punishment(max_completion_len=1280, soft_punish_cache=256),
                                  the values TRL's script fixes, else the same formula here

Each is TRL's own function where TRL is installed, so the rewards are TRL's. accuracy_reward and
reasoning_accuracy_reward are TRL's only: math verification is math_verify's, and a copy here would not be TRL's
rule. `missing(name)` says what to install for one of them (the command line refuses it before any work).
"""

from __future__ import annotations

import importlib.util
import re
from typing import Any, Callable, Sequence

SCRIPT_REWARDS: dict[str, str] = {
    "accuracy_reward": "accuracy_reward",
    "reasoning_accuracy_reward": "reasoning_accuracy_reward",
    "think_format_reward": "think_format_reward",
    "get_soft_overlong_punishment": "soft_overlong_punishment_reward",
}
"""TRL's registry name (`--reward_funcs NAME`) -> the function of this module that stands for it."""

TRL_ONLY = {"accuracy_reward", "reasoning_accuracy_reward"}
"""Registry names computed by TRL alone (they need TRL and math_verify)."""

SOFT_OVERLONG = {"max_completion_len": 1280, "soft_punish_cache": 256}
"""The values TRL's script gives get_soft_overlong_punishment (trl/scripts/grpo.py)."""

THINK_PATTERN = r"^<think>(?!.*<think>)(.*?)</think>.*$"
"""TRL's think_format_reward: one <think>...</think> block at the start of the completion."""


def term(name: str) -> str:
    """The reward term ("module:function") of TRL's registry name `name`."""
    return f"{__name__}:{SCRIPT_REWARDS[name]}"


def missing(name: str) -> str | None:
    """What to install before TRL's registry reward `name` can run here ("pip install ..."), or None."""
    if name not in TRL_ONLY:
        return None
    wanted = [package for module, package in (("trl", "trl==1.16.0"), ("math_verify", "math-verify"))
              if importlib.util.find_spec(module) is None]
    return f"pip install {' '.join(wanted)}" if wanted else None


def _trl(name: str) -> Callable[..., Any] | None:
    """TRL's reward function `name` (trl.rewards), or None when TRL is not installed."""
    if importlib.util.find_spec("trl") is None:
        return None
    import trl.rewards

    return getattr(trl.rewards, name)


def _contents(completions: Sequence[Any], name: str) -> list[str]:
    """The text of each conversational completion ([{"role": "assistant", "content": ...}]), as TRL reads it."""
    if any(isinstance(c, str) for c in completions):
        raise TypeError(f"TRL's {name} reads conversational completions (completion[0]['content']); this dataset's "
                        "prompts are plain strings, so its completions are too: give the prompts as lists of messages "
                        "(TRL's conversational format)")
    return [c[0]["content"] for c in completions]


def _need(name: str) -> Callable[..., Any]:
    how = missing(name)
    if how is not None:
        raise ImportError(f"TRL's {name} needs packages that are not installed: {how}")
    fn = _trl(name)
    assert fn is not None  # missing() found trl
    return fn


def accuracy_reward(completions: list, solution: list, **kwargs: Any) -> list[float | None]:
    """TRL's accuracy_reward: 1 when the completion's answer equals the row's `solution` by math_verify, else 0;
    None for a row whose solution does not parse."""
    _contents(completions, "accuracy_reward")
    return _need("accuracy_reward")(completions=completions, solution=solution, **kwargs)


def reasoning_accuracy_reward(completions: list, solution: list, **kwargs: Any) -> list[float | None]:
    """TRL's reasoning_accuracy_reward: accuracy_reward on the text after the reasoning block."""
    _contents(completions, "reasoning_accuracy_reward")
    return _need("reasoning_accuracy_reward")(completions=completions, solution=solution, **kwargs)


def think_format_reward(completions: list, **kwargs: Any) -> list[float]:
    """TRL's think_format_reward: 1 when the completion starts with one <think>...</think> block, else 0."""
    contents = _contents(completions, "think_format_reward")
    fn = _trl("think_format_reward")
    if fn is not None:
        return fn(completions=completions, **kwargs)
    return [1.0 if re.match(THINK_PATTERN, c, re.DOTALL | re.MULTILINE) else 0.0 for c in contents]


def soft_overlong_punishment_reward(completion_ids: list, **kwargs: Any) -> list[float]:
    """TRL's get_soft_overlong_punishment(1280, 256) (DAPO's Eq. 13): 0 up to 1024 tokens, then falling linearly to
    -1 at 1280, -1 beyond."""
    fn = _trl("get_soft_overlong_punishment")
    if fn is not None:
        return fn(**SOFT_OVERLONG)(completion_ids=completion_ids, **kwargs)
    top, cache = SOFT_OVERLONG["max_completion_len"], SOFT_OVERLONG["soft_punish_cache"]
    out = []
    for ids in completion_ids:
        n = len(ids)
        out.append(0.0 if n <= top - cache else (top - cache - n) / cache if n <= top else -1.0)
    return out
