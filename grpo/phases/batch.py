"""Collation of scored rollouts into a TrainBatch, and the no-grad old / reference log-prob passes.

The batch holds the exact sampled ids (never re-tokenised text), in the layout [left-padded prompt | completion],
so the log-prob pass scores exactly the tokens the sampler produced, with the same template and padding side.
"""

from __future__ import annotations

from typing import Sequence

import torch

from grpo.core.step_types import Scored, TrainBatch
from grpo.models.logprobs import completion_logprobs
from grpo.models.tokens import collate, right_pad


def build_train_batch(scored: Sequence[Scored], advantages_B: torch.Tensor, tasks: Sequence[str], pad_id: int,
                      device: torch.device, group_size: int = 1, mask_truncated: bool = False) -> TrainBatch:
    """Collate the rollouts (order kept) with their advantages; nothing here carries a graph. `group_size` K > 1:
    the rollouts come as K consecutive completions per prompt, and the forward passes may encode each prompt once
    (TrainBatch.group_size). `mask_truncated` (loss.mask_truncated): the completion mask of every truncated rollout
    is zero, so it carries no loss and no count in the step's denominators (its tokens still sit in the batch).
    A multi-turn rollout (Rollout.model_mask) keeps its whole trajectory in the batch, and its completion mask is 0 on
    the tool results and template text between its replies: the loss, KL and entropy never see them."""
    input_ids, attention, completion_mask, prompt_len = collate(
        [list(s.rollout.prompt_ids) for s in scored], [list(s.rollout.completion_ids) for s in scored], pad_id)
    if any(s.rollout.model_mask is not None for s in scored):  # multi-turn: train on the model's own tokens only
        model_BT = right_pad([s.rollout.model_mask or [1] * len(s.rollout.completion_ids) for s in scored], 0)[0]
        completion_mask = completion_mask * model_BT.to(completion_mask.dtype)
    if mask_truncated:
        kept_B = torch.tensor([not s.rollout.truncated for s in scored], dtype=completion_mask.dtype)
        completion_mask = completion_mask * kept_B[:, None]
    task_ids = torch.tensor([tasks.index(s.rollout.sample.task) for s in scored], dtype=torch.long)
    return TrainBatch(input_ids_BL=input_ids.to(device), attention_mask_BL=attention.to(device),
                      completion_mask_BT=completion_mask.to(device=device, dtype=torch.float32),
                      prompt_len=prompt_len, task_ids_B=task_ids.to(device),
                      advantages_B=advantages_B.detach().to(device=device, dtype=torch.float32),
                      group_size=group_size)


@torch.no_grad()
def batch_entropies(model: torch.nn.Module, batch: TrainBatch, micro_batch_seqs: int, temperature: float,
                    ) -> torch.Tensor:
    """Per-token entropies (nats, at `temperature`) of the policy at the batch's completion positions, in eval mode,
    no graph; 0 on padding. The top-entropy token selection (loss.top_entropy_quantile) reads them."""
    was_training = model.training
    model.eval()
    try:
        parts = [completion_logprobs(model, mb.input_ids_BL, mb.attention_mask_BL, mb.prompt_len,
                                     temperature=temperature, with_entropy=True,
                                     group_size=mb.group_size)[1].float()
                 for mb in batch.micro_batches(micro_batch_seqs)]
    finally:
        model.train(was_training)
    return batch.from_micro_batches(parts, micro_batch_seqs) * batch.completion_mask_BT


@torch.no_grad()
def batch_logprobs(model: torch.nn.Module, batch: TrainBatch, micro_batch_seqs: int, temperature: float,
                   ) -> torch.Tensor:
    """Per-token log-probs of the batch's completions under `model`, in eval mode (dropout off), no graph."""
    was_training = model.training
    model.eval()
    try:
        parts = [completion_logprobs(model, mb.input_ids_BL, mb.attention_mask_BL, mb.prompt_len,
                                     temperature=temperature, group_size=mb.group_size)[0].float()
                 for mb in batch.micro_batches(micro_batch_seqs)]
    finally:
        model.train(was_training)
    return batch.from_micro_batches(parts, micro_batch_seqs) * batch.completion_mask_BT
