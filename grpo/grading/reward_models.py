"""Reward models: a folder holding an `AutoModelForSequenceClassification`, loaded once, scoring completions in
batches on the trainer's device.

What the model reads (as TRL's GRPOTrainer feeds a reward model): the prompt messages plus the completion as an
assistant turn, through the reward model's own chat template; a tokenizer without one reads the message contents
joined by a blank line, then the completion. Tokens: no special tokens added (the template has its own), padded
on the right, cut on the LEFT to `max_length` so the completion (the part being judged) is always kept.

Scores, from the logits (B, C) of a batch and the class column `label` (`normalize`):
  none     s = logits[:, label]                           the raw score, as TRL uses it (any real number)
  affine   s = (logits[:, label] - shift) / scale         put a reward model on the scale of other terms
  sigmoid  s = σ((logits[:, label] - shift) / scale)      in (0, 1): a Bradley–Terry model's P(beats a reply of
                                                          score `shift`); saturates for |logit - shift| >> scale
  softmax  s = softmax(logits)[:, label]                  in (0, 1): a classifier's probability of class `label`
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from grpo.config import RewardModelConfig, field_error
from grpo.core.step_types import Rollout
from grpo.models.tokens import raw_prompt

PROMPT_JOIN = "\n\n"  # between message contents when the reward model's tokenizer has no chat template


def _none(logits_BC: torch.Tensor, label: int, shift: float, scale: float) -> torch.Tensor:
    return logits_BC[:, label]


def _affine(logits_BC: torch.Tensor, label: int, shift: float, scale: float) -> torch.Tensor:
    return (logits_BC[:, label] - shift) / scale


def _sigmoid(logits_BC: torch.Tensor, label: int, shift: float, scale: float) -> torch.Tensor:
    return torch.sigmoid((logits_BC[:, label] - shift) / scale)


def _softmax(logits_BC: torch.Tensor, label: int, shift: float, scale: float) -> torch.Tensor:
    return torch.softmax(logits_BC, dim=-1)[:, label]


NORMALIZERS: dict[str, Callable[[torch.Tensor, int, float, float], torch.Tensor]] = {
    "none": _none, "affine": _affine, "sigmoid": _sigmoid, "softmax": _softmax,
}
"""How a reward model's logits become a score; see the module docstring for the formulas."""
BOUNDED = {"sigmoid": (0.0, 1.0), "softmax": (0.0, 1.0)}
"""The range every score lies in, for the normalisations that bound it."""
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def normalize_scores(logits_BC: torch.Tensor, normalize: str, label: int = 0, shift: float = 0.0,
                     scale: float = 1.0) -> torch.Tensor:
    """Scores (B,) from a reward model's logits (B, C), computed in float32."""
    if normalize not in NORMALIZERS:
        raise ValueError(f"normalize={normalize!r}: use one of {sorted(NORMALIZERS)}")
    if logits_BC.dim() != 2 or not 0 <= label < logits_BC.shape[1]:
        raise ValueError(f"label={label} does not index the logits of shape {tuple(logits_BC.shape)}: the model has "
                         f"{logits_BC.shape[-1]} output(s), use label 0..{logits_BC.shape[-1] - 1}")
    return NORMALIZERS[normalize](logits_BC.float(), label, shift, scale)


RewardModelSpec = RewardModelConfig
"""One reward model and how its scores are read: the `reward_models.<name>` config section itself
(grpo/config/sections.py); a reward term names it as `<name>`, or gives a folder path, which uses the section's
defaults."""


def check_spec(spec: RewardModelSpec, where: str) -> None:
    """The section's ranges (its `validate`) and its names against the registries above; ConfigError naming
    `<where>.<field>`, the bad value and the fix. grpo/run/assembly/config_check.py runs it on every reward_models
    entry."""
    spec.validate(where)
    if spec.normalize not in NORMALIZERS:
        raise field_error(f"{where}.normalize", spec.normalize, f"use one of {sorted(NORMALIZERS)}")
    if spec.dtype != "auto" and spec.dtype not in DTYPES:
        raise field_error(f"{where}.dtype", spec.dtype, f"use auto or one of {sorted(DTYPES)}")


class RewardModel:
    """A loaded reward model: `scores(rollouts)` -> one float per rollout, in batches of `spec.batch_size`."""

    def __init__(self, model: Any, tokenizer: Any, spec: RewardModelSpec, device: torch.device) -> None:
        self.model, self.tokenizer, self.spec, self.device = model, tokenizer, spec, device

    def text(self, rollout: Rollout) -> str:
        """The reward model's input for one completion (see the module docstring)."""
        messages = list(rollout.sample.messages)
        if raw_prompt(rollout.sample):  # TRL's standard-form prompt, as TRL scores it: its text and the completion's
            return messages[0]["content"] + rollout.text
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(messages + [{"role": "assistant", "content": rollout.text}],
                                                      tokenize=False)
        return PROMPT_JOIN.join(m["content"] for m in messages) + PROMPT_JOIN + rollout.text

    @torch.inference_mode()
    def scores(self, rollouts: Sequence[Rollout]) -> list[float]:
        out: list[float] = []
        spec = self.spec
        for start in range(0, len(rollouts), spec.batch_size):
            texts = [self.text(r) for r in rollouts[start:start + spec.batch_size]]
            enc = self.tokenizer(texts, return_tensors="pt", padding=True, truncation=True,
                                 max_length=spec.max_length, add_special_tokens=False)
            logits_BC = self.model(input_ids=enc["input_ids"].to(self.device),
                                   attention_mask=enc["attention_mask"].to(self.device)).logits
            out += normalize_scores(logits_BC, spec.normalize, spec.label, spec.shift, spec.scale).tolist()
        return out


def load_reward_model(spec: RewardModelSpec, device: torch.device | str, where: str = "reward model") -> RewardModel:
    """The model and tokenizer of `spec.path` on `device`, in eval mode without gradients. Raises ValueError naming
    `where` when the folder does not hold a sequence classifier with its trained score head."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    check_spec(spec, where)
    folder = Path(spec.path).expanduser()
    if not (folder / "config.json").is_file():
        raise ValueError(f"{where}: {folder} holds no config.json: give a folder written by save_pretrained")
    device = torch.device(device)
    dtype = DTYPES.get(spec.dtype) or ("auto" if device.type == "cuda" else torch.float32)
    try:
        model, info = AutoModelForSequenceClassification.from_pretrained(str(folder), dtype=dtype,
                                                                         output_loading_info=True)
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
    except (OSError, ValueError, KeyError) as err:
        raise ValueError(f"{where}: {folder} cannot be loaded as AutoModelForSequenceClassification: "
                         f"{type(err).__name__}: {err}") from err
    if info.get("missing_keys"):  # e.g. a causal LM folder: the classification head would be random
        raise ValueError(f"{where}: {folder} has no trained weights for {sorted(info['missing_keys'])[:4]}: its "
                         "scores would be random; give a folder saved from a trained sequence classifier")
    tokenizer.truncation_side = "left"  # keep the completion, which is what is being scored
    tokenizer.padding_side = "right"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"{where}: the tokenizer of {folder} has neither a pad nor an eos token to pad batches")
        tokenizer.pad_token = tokenizer.eos_token
    if model.config.pad_token_id is None:  # the classifier finds each row's last token through the pad id
        model.config.pad_token_id = tokenizer.pad_token_id
    model.to(device).eval().requires_grad_(False)
    return RewardModel(model, tokenizer, spec, device)
