"""The config layer's base: `ConfigError`, the field checks every section runs (`_check`, `_one_of`, naming the field,
the bad value and the fix) and the bounds on numbers that scale logits, losses and weights, with the reason for each.

Standard library only. The section dataclasses are grpo/config/input_sections.py's (model, data, tasks.<task>,
reward_models.<name>), grpo/config/algorithm_sections.py's (rollout, loss, kl.<task>, multi) and
grpo/config/sections.py's (train, sft, judge, checkpoint and the whole `Config`); grpo/config/__init__.py re-exports
every name of them.
"""

from __future__ import annotations

import re
import typing
import unicodedata
from typing import Any


class ConfigError(ValueError):
    """A config value is wrong. The message names the field, the value and the fix; `field` is the dotted name of the
    field at fault (None for errors about no one field, e.g. an unknown preset)."""

    def __init__(self, message: str, field: str | None = None, fix: str | None = None):
        super().__init__(message)
        self.field = field
        self.fix = fix
        """The fix alone (field_error's), so that a rule can be reported under another name: a TRL field checked by
        the rule of the grpo-dual field it sets is named as the user wrote it."""


def field_error(name: str, value: Any, fix: str) -> ConfigError:
    """The error for field `name` (dotted) holding `value`, with the fix; every field check raises this."""
    return ConfigError(f"config field `{name}` = {value!r} is invalid: {fix}", field=name, fix=fix)


def _inside_folder(name: str) -> bool:
    """True when `name` is one plain folder name: no separator, not absolute, not `.` or `..`, no control character
    (a newline or tab in a folder name breaks every log line and shell command that prints it)."""
    return ("/" not in name and "\\" not in name and name not in (".", "..") and not name.startswith("~")
            and ":" not in name[:2] and not any(unicodedata.category(c) == "Cc" for c in name))


def _env_name(value: str) -> bool:
    """True when `value` reads as an environment variable's name, not as a pasted secret."""
    long_mixed = len(value) >= 32 and not value.isupper()  # e.g. a 39-character mixed-case key
    return bool(ENV_NAME.fullmatch(value)) and not value.startswith(KEY_PREFIXES) and not long_mixed


def _check(ok: bool, name: str, value: Any, fix: str) -> None:
    if not ok:
        raise field_error(name, value, fix)


def _one_of(name: str, value: Any, allowed: typing.Iterable[str]) -> None:
    allowed = list(allowed)
    _check(value in allowed, name, value, f"use one of {allowed}")


# Names implemented by a registry (policy losses, aggregation modes, KL estimators, advantage scales, KL controllers,
# combine methods, decoding engines, cache implementations) are checked against that registry by
# grpo/run/assembly/config_check.py, which every entry point runs right after building the Config: this module imports
# no torch.
SHARED_PROMPT_MODES = ("auto", "on", "off")
JUDGE_RATE_MAX_STEP_S = 3600.0
"""The longest judge.rate_limit_per_s may hold one RL step's judge calls (seqs_per_step / rate): a rate slower than
that (1e-9 for 1e9, a per-minute figure given per second) would leave the run waiting without a word for hours."""
TINY_MIN_VOCAB = 256 + 6
"""The smallest builtin:tiny vocabulary: the byte-level BPE's 256-byte alphabet plus its 6 special tokens
(grpo/models/modeling.py SPECIAL_TOKENS; tests/test_config_fields.py checks the two agree)."""
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
"""What an environment variable's name looks like; judge.api_key_env must be one (or empty)."""
KEY_PREFIXES = ("sk-", "sk_", "sk-ant-", "key-", "Bearer ")
LLAMA_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# Bounds on the numbers that scale logits, losses and weights: past them a value means nothing more and only turns the
# run non-finite, far from the setting (tests/test_reliability_inputs.py checks each against the code it protects).
LOGIT_BOUND = 1e4
"""The largest logit magnitude the sampler is built for: grpo/decoding/decode.py POSINF_LOGIT (= this) replaces +Inf
by it, and a model's ordinary logits stay below ~100. Every factor bounded below keeps such a logit finite in fp32."""
MIN_TEMPERATURE = 1e-20
"""Smallest rollout.temperature. The sampler and every log-prob pass divide the fp32 logits by it; with the penalties
at their bounds a logit reaches at most LOGIT_BOUND x MAX_REPETITION_PENALTY + MAX_LOGIT_PENALTY x (1 + tokens) before
the division, ~1e10 even at a million tokens, and 1e10 / 1e-20 = 1e30 stays below fp32's 3.4e38 (1e-300 rounds to
0 in fp32: inf, then a NaN sampling distribution). Far below it sampling is greedy already (a logit gap of 0.01 is
1e18 nats); for greedy decoding use top_k=1."""
MAX_REPETITION_PENALTY = 1e4
"""rollout.repetition_penalty lies in [1 / this, this]: it divides a repeated token's positive logit and multiplies
its negative one, so at 1e4 (or 1e-4) every ordinary logit (|z| < 100) of a repeat is already pushed past any other
token's and a larger factor changes no choice; it only moves the logits towards fp32's limit."""
MAX_LOGIT_PENALTY = LOGIT_BOUND
"""|rollout.presence_penalty| and |rollout.frequency_penalty| (per occurrence) are at most this: a penalty of
LOGIT_BOUND already outweighs every ordinary logit, so a repeat is never (or, negative, always) chosen; beyond it
nothing changes but overflow (-1e300 is -inf in fp32, and -inf x 0 a NaN for every token not yet written)."""
MAX_LR = 1.0
"""Largest train.lr / sft.lr. AdamW moves every weight by about lr per step whatever the loss's scale (its update is
the gradient over its own running RMS), and a trained model's weights are O(0.01-0.1): a rate of 1 rewrites them in
one step. Fine-tuning uses 1e-7..1e-4, training a small model from scratch at most ~1e-2."""
MAX_LOSS_WEIGHT = 1e3
"""Largest kl.<task>.beta / kl.<task>.beta_max and loss.entropy_coef. The policy term is an advantage (unit scale after
group normalisation) times a ratio near 1, the KL and entropy terms are in nats per token: weighted by 1e3 either
outweighs the reward as soon as it exceeds 1e-3 nats, so a larger weight only freezes (or flattens) the policy while
its gradient heads for fp32's limit (1e300 x a gradient is inf: NaN weights or every step skipped)."""
MAX_SEED = 2**32 - 1
"""Largest train.seed: grpo/run/assembly/process.seed_everything seeds numpy's global RNG, which takes [0, 2**32)
(torch.manual_seed takes [-2**63, 2**64), Python's random any integer): the narrowest of the three."""
