"""SFT warm-up: completion-only cross-entropy on reference completions, same chat template and EOS as RL.

loss = − Σ_t mask_t · log π(y_t | prompt, y_<t) / Σ_t mask_t over the step's completion tokens (token mean).
The prompt tokens are never trained on; the end-of-turn token that RL uses as its stop token is.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any, Callable, Iterable, Sequence

import torch

from grpo.config import SFTConfig
from grpo.core.answer_metrics import answer_class
from grpo.core.step_types import Sample
from grpo.models.logprobs import completion_logprobs
from grpo.models.modeling import Policy
from grpo.models.tokens import collate, sft_example
from grpo.phases.update import adamw


def sft_examples(tokenizer, samples: Sequence[Sample], system_prompt: str | None,
                 max_target_tokens: int = 0, encode: Callable[[list], list[int]] | None = None,
                 ) -> list[tuple[list[int], list[int]]]:
    """(prompt_ids, completion_ids) for every sample that has a target; the completion ends with EOS.

    max_target_tokens > 0: a target longer than that keeps its first max_target_tokens tokens and no EOS, as a
    rollout that reaches rollout.max_new_tokens does (sft.max_target_tokens). `encode`: a prompt's ids from its
    messages as the rollouts render it (a run with tools: a template that shows the tools shows them here too);
    default the chat template with `system_prompt`."""
    out = []
    for s in samples:
        if s.target:
            prompt_ids, completion_ids = sft_example(tokenizer, list(s.messages), s.target,
                                                     system_prompt=system_prompt)
            if encode is not None:
                prompt_ids = encode(list(s.messages))
            if 0 < max_target_tokens < len(completion_ids) - 1:  # the last id is the EOS
                completion_ids = completion_ids[:max_target_tokens]
            out.append((list(prompt_ids), list(completion_ids)))
    return out


def sft_loss(model: torch.nn.Module, examples: Sequence[tuple[list[int], list[int]]], pad_id: int,
             device: torch.device, num_tokens: int | None = None) -> torch.Tensor:
    """Token-mean negative log-likelihood of the completions (prompt positions carry no loss). `num_tokens`: the
    denominator when `examples` are one share of a larger batch (data parallelism); default their own count."""
    input_ids, attention, mask, prompt_len = collate([p for p, _ in examples], [c for _, c in examples], pad_id)
    logps_BT, _ = completion_logprobs(model, input_ids.to(device), attention.to(device), prompt_len)
    mask_BT = mask.to(device=device, dtype=logps_BT.dtype)
    denominator = mask_BT.sum().clamp(min=1) if num_tokens is None else max(num_tokens, 1)
    return -(logps_BT * mask_BT).sum() / denominator


SFT_MAX_GRAD_NORM = 1.0
"""The warm-up clips its gradient norm here: a first step on a fresh task can be large, and SFT has no health guard."""


def run_sft(policy: Policy, examples: Sequence[tuple[list[int], list[int]]], sft: SFTConfig, *,
            device: torch.device, seed: int, progress: Callable[[range], Iterable[int]] = iter,
            dist: Any = None) -> list[float]:
    """`sft.steps` AdamW steps (learning rate `sft.lr`) on shuffled batches of `sft.batch_size` `examples` (without
    replacement per epoch), on the policy's trainable parameters (padding with its tokenizer's pad id). Returns the
    losses.

    With `dist` (data parallelism) every rank draws the same batch and trains on rows rank, rank + world, …; the
    loss is divided by the whole batch's token count and the gradients are summed over ranks before clipping, so
    the step equals the one-process step.
    """
    if not examples:
        raise ValueError("SFT warm-up has no examples: the training samples carry no `target` completions "
                         "(set sft.steps=0 to skip the warm-up)")
    model, params, pad_id = policy.model, policy.trainable_parameters(), policy.tokenizer.pad_token_id
    steps, batch_size = sft.steps, sft.batch_size
    optimizer = adamw(params, lr=sft.lr, weight_decay=0.0)
    rng = random.Random(seed)
    order: list[int] = []
    losses = []
    model.train()
    for _ in progress(range(steps)):
        if len(order) < batch_size:
            fresh = list(range(len(examples)))
            rng.shuffle(fresh)
            order += fresh
        batch = [examples[i] for i in order[:batch_size]]
        del order[:batch_size]
        optimizer.zero_grad(set_to_none=True)
        if dist is not None and dist.active:
            mine = batch[dist.rank::dist.world]
            tokens = sum(len(c) for _, c in batch)
            loss = sft_loss(model, mine, pad_id, device, tokens) if mine else torch.zeros((), device=device)
            if dist.sharded:  # FSDP reduce-scatters the MEAN over ranks in backward: scale to get the sum
                (loss * dist.world).backward()
            else:
                if mine:
                    loss.backward()
                dist.sum_grads(params)
            loss = dist.sum(loss.detach().reshape(1).clone())[0]
        else:
            loss = sft_loss(model, batch, pad_id, device)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(params, SFT_MAX_GRAD_NORM)
        optimizer.step()
        losses.append(loss.item())
    return losses


FREE_FORM_CLASSES = 16
"""A task whose SFT targets fall into more answer classes than this answers in free form (HaluEval general's ChatGPT
replies, each its own class): `stratified` counts all its targets as one class."""


def stratified(samples: list[Sample], examples: list, n: int) -> list:
    """`n` of `examples` (parallel to `samples`), round-robin over (task, answer class) so that every answer of every
    task is demonstrated before any is repeated; the class is grpo.core.answer_metrics.answer_class of the target. A
    free-form task (more than FREE_FORM_CLASSES classes) is one class: else its answers, every one its own class, took
    every demonstration from the tasks with a few answers."""
    classes_per_task = Counter(task for task, _ in {(s.task, answer_class(s.target or "")) for s in samples})
    free_form = {task for task, n in classes_per_task.items() if n > FREE_FORM_CLASSES}
    groups: dict[tuple[str, str], list] = {}
    for sample, example in zip(samples, examples, strict=True):
        key = (sample.task, "" if sample.task in free_form else answer_class(sample.target or ""))
        groups.setdefault(key, []).append(example)
    keys, picked, i = sorted(groups), [], 0
    while len(picked) < min(n, len(examples)):
        for key in keys:
            if i < len(groups[key]) and len(picked) < n:
                picked.append(groups[key][i])
        i += 1
    return picked
