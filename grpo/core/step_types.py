"""Typed records that flow through one RL step.

    Sample ──► Rollout (K per sample) ──► Scored ──► TrainBatch ──► metrics dict

Shapes: B = sequences in the batch, P = prompt length (left padded), T = completion length (right padded),
L = P + T. A TrainBatch holds `input_ids_BL = [prompt_BP | completion_BT]`, so the completion tokens of every row
start at column P and the log-prob of completion token t comes from the logits at column P - 1 + t.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterator

import torch


@dataclass(frozen=True)
class Sample:
    """One prompt of one task, with what its graders need."""

    task: str
    """Task name, e.g. "fairness" or "hallucination"; selects graders and the KL controller."""
    id: str
    """Stable id of the source row; the train / held-out split hashes it."""
    messages: tuple[dict[str, str], ...]
    """Chat messages ({"role", "content"}) WITHOUT the assistant answer; the chat template is applied later."""
    gold: dict[str, Any] = field(default_factory=dict)
    """Gold fields the graders use (label, unknown option, right answer, knowledge, ...)."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Anything else worth keeping (category, context condition, source file and line)."""
    target: str | None = None
    """A reference completion for SFT warm-up, when the task has one."""
    conversational: bool = False
    """The row gave its prompt as a list of messages (TRL's conversational format): TRL-style reward functions then
    get prompts and completions as message lists, otherwise as strings (grpo/grading/graders.py)."""


@dataclass(frozen=True)
class Rollout:
    """One sampled completion, holding exactly the token ids that were sampled."""

    sample: Sample
    prompt_ids: tuple[int, ...]
    """The templated prompt, unpadded."""
    completion_ids: tuple[int, ...]
    """The sampled ids, unpadded; includes the stop token when one ended the completion."""
    text: str
    """The completion decoded without special tokens."""
    stopped: bool
    """A stop token ended the completion."""
    truncated: bool
    """max_new_tokens was reached without a stop token."""
    model_mask: tuple[int, ...] | None = None
    """Multi-turn rollouts with tools (grpo/phases/tools.py): 1 on the completion ids the model sampled, 0 on tool
    results and the template text around them (never trained on); None = every completion id is the model's."""
    messages: tuple[dict[str, Any], ...] | None = None
    """Multi-turn rollouts: the completion as chat messages (assistant replies and tool results, in order); `text`
    is then the last reply. None for a single-turn rollout."""
    tool_use: Any = None
    """Multi-turn rollouts: what the trajectory did with its tools (grpo.core.tool_calls.ToolUse); None otherwise."""
    environment: Any = field(default=None, compare=False, repr=False)
    """Rollouts with rollout.environment_factory: the trajectory's environment instance (grpo/phases/environments.py),
    what reward functions get as `environments`; valid until the run's next rollouts reset it."""

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (the gather of a step's rollouts to every process) without its environment: an environment lives
        in its process (it may hold a lock, a socket, a sandbox) and the rewards read it before the gather."""
        return {**self.__dict__, "environment": None}

    @property
    def model_tokens(self) -> int:
        """The completion ids the model sampled itself: all of them, or (multi-turn) those `model_mask` marks 1;
        tool results and template text do not count (DAPO's overlong penalty reads this length)."""
        return len(self.completion_ids) if self.model_mask is None else sum(self.model_mask)


@dataclass(frozen=True)
class Scored:
    """A rollout with its reward. `reward is None` means grading failed: it is excluded, never counted as 0."""

    rollout: Rollout
    reward: float | None
    parts: dict[str, float | None] = field(default_factory=dict)
    """Per-grader raw scores (before weights), e.g. {"bbq_rule": 1.0, "format": 0.5}."""
    provider: str = "rule"
    """Who produced the reward: "rule", "judge:<model>", "cache", "fallback:<grader>", ..."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Columns reward functions logged for this completion through TRL's `log_extra` (written with it to samples/)."""


@dataclass
class TrainBatch:
    """A collated rollout batch. Everything here is detached: built once, before the μ update passes."""

    input_ids_BL: torch.Tensor
    attention_mask_BL: torch.Tensor
    completion_mask_BT: torch.Tensor
    """1.0 on sampled completion tokens (stop token included), 0.0 on padding."""
    prompt_len: int
    """P: every row's completion starts at this column."""
    task_ids_B: torch.Tensor
    """Index into the run's task list, per sequence."""
    advantages_B: torch.Tensor
    old_logps_BT: torch.Tensor | None = None
    """Log-probs under the rollout policy; None when the update is exactly on-policy (μ = 1)."""
    ref_logps_BT: torch.Tensor | None = None
    """Log-probs under the reference policy; None when no KL term is used."""
    entropy_mask_BT: torch.Tensor | None = None
    """1.0 on the tokens whose policy loss trains (loss.top_entropy_quantile); None = every completion token."""
    group_size: int = 1
    """K > 1: rows g·K … g·K + K − 1 are the K completions of one prompt, and the forward passes encode that prompt
    once for them (grpo/models/logprobs.completion_logprobs); micro-batches then hold whole groups. 1 = rows stand
    alone."""

    @property
    def size(self) -> int:
        return int(self.input_ids_BL.shape[0])

    @property
    def num_tokens(self) -> int:
        """Completion tokens in the whole batch: the `token-mean` denominator of one optimizer step."""
        return int(self.completion_mask_BT.sum().item())

    def select(self, idx: torch.Tensor | slice) -> "TrainBatch":
        """Rows `idx` of the batch (a view for slices). Columns are kept, so P stays valid."""

        def take(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[idx]

        return replace(
            self,
            input_ids_BL=self.input_ids_BL[idx],
            attention_mask_BL=self.attention_mask_BL[idx],
            completion_mask_BT=self.completion_mask_BT[idx],
            task_ids_B=self.task_ids_B[idx],
            advantages_B=self.advantages_B[idx],
            old_logps_BT=take(self.old_logps_BT),
            ref_logps_BT=take(self.ref_logps_BT),
            entropy_mask_BT=take(self.entropy_mask_BT),
        )

    def _lengths(self) -> tuple[list[int], list[int]]:
        """(prompt length, completion length) of every row, on the host: one read of the masks. The completion length
        is the column after the last trained token, which is the mask's sum when the mask has no holes; a multi-turn
        row (tool results masked out between the model's replies) keeps every column up to its last reply."""
        prompt_B = self.attention_mask_BL[:, :self.prompt_len].sum(1)
        T = self.completion_mask_BT.shape[1]
        columns_T = torch.arange(1, T + 1, device=self.completion_mask_BT.device, dtype=self.completion_mask_BT.dtype)
        completion_B = ((self.completion_mask_BT > 0) * columns_T).amax(1) if T else self.completion_mask_BT.sum(1)
        lengths = torch.stack([prompt_B.to(completion_B.dtype), completion_B]).long().tolist()
        return lengths[0], lengths[1]

    def micro_batch_rows(self, size: int) -> list[torch.Tensor]:
        """Row indices of each micro-batch: the rows sorted by (completion length, prompt length), `size` per
        micro-batch (the last may be shorter). Rows of similar length share a micro-batch, so cutting its
        all-padding columns (`micro_batches`) removes most of the padding. Sorting is stable, so the partition is
        deterministic. With groups (`group_size` K dividing `size`) whole groups are sorted instead, by (longest
        completion, prompt length), size / K groups per micro-batch, each group's rows in order.

        The loss of a step is a sum over micro-batches normalised by the whole step's counts, so which rows share a
        micro-batch changes nothing but the order of floating-point sums."""
        return [torch.tensor(rows, dtype=torch.long, device=self.input_ids_BL.device)
                for rows in self._row_groups(size, *self._lengths())]

    def _whole_groups(self, size: int) -> bool:
        K = self.group_size
        return K > 1 and size % K == 0 and self.size % K == 0

    def _row_groups(self, size: int, prompt: list[int], completion: list[int]) -> list[list[int]]:
        if self._whole_groups(size):
            K, per = self.group_size, size // self.group_size
            groups = sorted(range(self.size // K), key=lambda g: (max(completion[g * K:(g + 1) * K]), prompt[g * K]))
            return [[g * K + j for g in groups[start:start + per] for j in range(K)]
                    for start in range(0, len(groups), per)]
        order = sorted(range(self.size), key=lambda i: (completion[i], prompt[i]))
        return [order[start:start + size] for start in range(0, self.size, size)]

    def micro_batches(self, size: int) -> Iterator["TrainBatch"]:
        """The micro-batches of `micro_batch_rows(size)`, each without the columns that are padding in all its rows:
        leading prompt columns (P shrinks by their number) and trailing completion columns (T shrinks). Position ids
        come from the attention mask, so the log-probs of the kept tokens do not change. The bounds come from the
        row lengths read once, so slicing needs no device read per micro-batch."""
        prompt, completion = self._lengths()
        group_size = self.group_size if self._whole_groups(size) else 1
        for rows in self._row_groups(size, prompt, completion):
            lead = self.prompt_len - max(prompt[i] for i in rows)  # prompts are left-padded, completions right-padded
            keep_T = max(1, max(completion[i] for i in rows))
            part = self.select(torch.tensor(rows, dtype=torch.long, device=self.input_ids_BL.device))
            yield replace(part.columns(min(lead, self.prompt_len - 1), keep_T), group_size=group_size)

    def columns(self, lead: int, keep_T: int) -> "TrainBatch":
        """Prompt columns from `lead` on (P shrinks by `lead`) and the first `keep_T` completion columns."""
        P = self.prompt_len

        def cols(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[:, :keep_T]

        return replace(
            self,
            input_ids_BL=self.input_ids_BL[:, lead:P + keep_T],
            attention_mask_BL=self.attention_mask_BL[:, lead:P + keep_T],
            completion_mask_BT=self.completion_mask_BT[:, :keep_T],
            prompt_len=P - lead,
            old_logps_BT=cols(self.old_logps_BT),
            ref_logps_BT=cols(self.ref_logps_BT),
            entropy_mask_BT=cols(self.entropy_mask_BT),
        )

    def from_micro_batches(self, parts: list[torch.Tensor], size: int) -> torch.Tensor:
        """(B, T) in batch order from per-micro-batch (rows_i, T_i) results of `micro_batches(size)`; the columns
        trimmed away are 0."""
        T = self.completion_mask_BT.shape[1]
        out_BT = parts[0].new_zeros(self.size, T)
        for rows, part in zip(self.micro_batch_rows(size), parts, strict=True):
            out_BT[rows, :part.shape[1]] = part
        return out_BT
