"""The one tokenisation path: SFT examples, rollout prompts and every log-prob pass go through these functions, so
the ids scored in training are exactly the ids that were sampled, with the same template, padding side and slice.

    prompt ids  = apply_chat_template([system?] + messages, add_generation_prompt=True)
    SFT example = (prompt ids, tokenize(target) + [EOS])   # EOS = end of turn = the RL stage's stop token
    batch row   = [left-padded prompt (P) | right-padded completion (T)]; completion token t sits at column P + t
                  and its log-prob comes from the logits at column P - 1 + t     (grpo/core/step_types.py TrainBatch)
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

try:  # jinja2 comes with transformers; the error type tells "template refuses a system turn" apart from bugs
    from jinja2.exceptions import TemplateError
except ImportError:  # pragma: no cover - transformers requires jinja2 for chat templates
    TemplateError = ValueError  # type: ignore[misc,assignment]

SYSTEM_JOIN = "\n\n"
"""Separator when a system prompt is merged into an existing system turn or, for templates without a system role,
into the first user turn."""


def _ids_from_template(result: Any) -> list[int]:
    """`apply_chat_template(tokenize=True)` gives a BatchEncoding/dict in transformers v5 and a list in v4."""
    if isinstance(result, Mapping):
        result = result["input_ids"]
    if isinstance(result, torch.Tensor):
        result = result.tolist()
    if result and isinstance(result[0], list):  # batched form with one conversation
        if len(result) != 1:
            raise ValueError(f"expected one conversation from apply_chat_template, got {len(result)}")
        result = result[0]
    return [int(i) for i in result]


RAW_ROLE = "text"
"""The role of a Sample's one message when its prompt is text to tokenize as it is, without the chat template (TRL's
standard-form prompts under data.prompt_format=trl: `raw_prompts`)."""


def _raw_text(text: str, system_prompt: str | None) -> str:
    return system_prompt + SYSTEM_JOIN + text if system_prompt else text


def raw_prompts(samples: Sequence[Any]) -> list[Any]:
    """TRL's handling of `samples` (data.prompt_format=trl): a row whose prompt was a string (not conversational)
    becomes one RAW_ROLE message holding its text (a system message before it joined to it), tokenized as it is;
    conversational rows keep their messages and the chat template."""
    from dataclasses import replace

    return [s if s.conversational or raw_prompt(s) else
            replace(s, messages=({"role": RAW_ROLE, "content": SYSTEM_JOIN.join(m["content"] for m in s.messages)},))
            for s in samples]


def raw_prompt(sample: Any) -> bool:
    """Whether a Sample's prompt is text tokenized as it is, without the chat template (`raw_prompts`)."""
    return len(sample.messages) == 1 and sample.messages[0].get("role") == RAW_ROLE


def _with_system(messages: Sequence[Mapping[str, str]], system_prompt: str | None) -> list[dict[str, str]]:
    msgs = [dict(m) for m in messages]
    if not system_prompt:
        return msgs
    if msgs and msgs[0].get("role") == "system":
        msgs[0]["content"] = system_prompt + SYSTEM_JOIN + msgs[0]["content"]
        return msgs
    return [{"role": "system", "content": system_prompt}] + msgs


def encode_prompt(tokenizer, messages: Sequence[Mapping[str, str]], system_prompt: str | None = None) -> list[int]:
    """Token ids of the templated prompt, ending with the assistant generation prompt.

    `system_prompt` becomes a leading system turn (merged before an existing one). If the template rejects a system
    role (e.g. Gemma-style templates raise), it is prepended to the first user turn instead.
    """
    if len(messages) == 1 and messages[0].get("role") == RAW_ROLE:  # data.prompt_format=trl, a string prompt
        return [int(i) for i in tokenizer(_raw_text(messages[0]["content"], system_prompt))["input_ids"]]
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(f"tokenizer {type(tokenizer).__name__} has no chat_template; use an instruct model's "
                         "tokenizer or set tokenizer.chat_template (build_tiny_tokenizer sets one)")
    msgs = _with_system(messages, system_prompt)
    try:
        out = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    except TemplateError:
        if not system_prompt:
            raise
        rest = [dict(m) for m in messages if m.get("role") != "system"]
        if not rest or rest[0].get("role") != "user":
            raise
        system_text = msgs[0]["content"]
        rest[0]["content"] = system_text + SYSTEM_JOIN + rest[0]["content"]
        out = tokenizer.apply_chat_template(rest, add_generation_prompt=True, tokenize=True)
    return _ids_from_template(out)


def stop_token_id(tokenizer) -> int:
    """The end-of-turn id that ends SFT targets and stops rollouts (the tokenizer's EOS)."""
    if tokenizer.eos_token_id is None:
        raise ValueError(f"tokenizer {type(tokenizer).__name__} has no eos_token; set tokenizer.eos_token to the "
                         "end-of-turn token of its chat template (e.g. '<|im_end|>')")
    return int(tokenizer.eos_token_id)


def sft_example(tokenizer, messages: Sequence[Mapping[str, str]], target: str, system_prompt: str | None = None,
                eos: int | None = None) -> tuple[list[int], list[int]]:
    """(prompt_ids, completion_ids) for completion-only SFT: the same prompt ids a rollout sees, then the target's
    ids and the end-of-turn id `eos` (default: the tokenizer's EOS, the RL stop token)."""
    prompt_ids = encode_prompt(tokenizer, messages, system_prompt)
    target_ids = tokenizer(target, add_special_tokens=False)["input_ids"]
    return prompt_ids, [int(i) for i in target_ids] + [stop_token_id(tokenizer) if eos is None else int(eos)]


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int, multiple_of: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids_BP, mask_BP) with each sequence right-aligned; P = the longest length rounded up to a multiple of
    `multiple_of` (at least 1 column)."""
    if multiple_of < 1:
        raise ValueError(f"left_pad: multiple_of={multiple_of}; use a positive integer")
    width = -(-max([len(s) for s in seqs] + [0]) // multiple_of) * multiple_of
    ids_BP = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask_BP = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if len(s):
            ids_BP[i, width - len(s):] = torch.tensor(list(s), dtype=torch.long)
            mask_BP[i, width - len(s):] = 1
    return ids_BP, mask_BP


def right_pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids_BT, mask_BT) with each sequence left-aligned; T = the longest length."""
    width = max([len(s) for s in seqs] + [0])
    ids_BT = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask_BT = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if len(s):
            ids_BT[i, :len(s)] = torch.tensor(list(s), dtype=torch.long)
            mask_BT[i, :len(s)] = 1
    return ids_BT, mask_BT


def collate(prompt_ids_list: Sequence[Sequence[int]], completion_ids_list: Sequence[Sequence[int]],
            pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(input_ids_BL, attention_mask_BL, completion_mask_BT, P) in the TrainBatch layout [prompt_BP | completion_BT].

    `completion_mask_BT` is 1.0 (float) on exactly the given completion ids (stop token included) and 0.0 on padding;
    `attention_mask_BL` is 1 (long) on every real prompt or completion token.
    """
    if len(prompt_ids_list) != len(completion_ids_list):
        raise ValueError(f"collate: {len(prompt_ids_list)} prompts but {len(completion_ids_list)} completions; "
                         "pass one prompt per completion (repeat each prompt K times)")
    if not prompt_ids_list:
        raise ValueError("collate: empty batch")
    if any(len(p) == 0 for p in prompt_ids_list):
        raise ValueError("collate: a prompt is empty; the first completion token needs the logits of a prompt token")
    prompt_BP, prompt_mask_BP = left_pad(prompt_ids_list, pad_id)
    completion_BT, completion_mask_BT = right_pad(completion_ids_list, pad_id)
    input_ids_BL = torch.cat([prompt_BP, completion_BT], dim=1)
    attention_mask_BL = torch.cat([prompt_mask_BP, completion_mask_BT], dim=1)
    return input_ids_BL, attention_mask_BL, completion_mask_BT.float(), int(prompt_BP.shape[1])


def show_mask(tokenizer, input_ids_L: Sequence[int] | torch.Tensor, mask_L: Sequence[float] | torch.Tensor,
              color: bool = False) -> str:
    """The decoded tokens, trained ones (mask > 0) in [brackets] or, with `color=True`, in green (ANSI).

    `mask_L` may be as long as `input_ids_L` or shorter (a completion mask): it is then aligned to the right end.
    Padding is kept visible as its token so layout bugs show.
    """
    ids = [int(i) for i in (input_ids_L.tolist() if isinstance(input_ids_L, torch.Tensor) else input_ids_L)]
    mask = [float(m) for m in (mask_L.tolist() if isinstance(mask_L, torch.Tensor) else mask_L)]
    if len(mask) > len(ids):
        raise ValueError(f"show_mask: mask has {len(mask)} entries for {len(ids)} ids")
    mask = [0.0] * (len(ids) - len(mask)) + mask
    parts = []
    for tok_id, m in zip(ids, mask, strict=True):
        piece = tokenizer.decode([tok_id])
        if m > 0:
            parts.append(f"\x1b[32m{piece}\x1b[0m" if color else f"[{piece}]")
        else:
            parts.append(piece)
    return "".join(parts)
