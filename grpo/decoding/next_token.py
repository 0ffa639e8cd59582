"""The one sampler: `next_token`, scores → the next token, which every engine calls.

    scores_BV = logits_BV in fp32, then, in generate's order (`_get_logits_processor`):
        repetition penalty   s_v ← s_v · p if s_v < 0 else s_v / p, for v seen in the prompt (its real tokens) or the
                             completion so far (seen_BV)                                          (CTRL; transformers)
        min_new_tokens       s_v ← −inf for the stop ids while t < min_new_tokens
        presence / frequency s_v ← s_v − c_v · frequency − 1[c_v > 0] · presence, c_v = count of v in the completion
                             so far, the prompt excluded (counts_BV)      (OpenAI API reference, "Parameter details")
        sanitiser            a row holding NaN or +Inf: NaN → NAN_LOGIT, +Inf → POSINF_LOGIT, −Inf → NEGINF_LOGIT;
                             such rows counted in `fixed` (a device tensor)
        warps (sampling)     temperature, top-k, top-p, min-p: transformers' own classes, neutral values none
    next_B = argmax(scores_BV)                                        greedy
             argmax_v(scores_BV − log E(key_b, t, v))                 given per-row keys (grpo/decoding/sampling.py)
             multinomial(softmax(scores_BV))                          otherwise, from the torch RNG as generate draws

Who calls it: the graph engine's step inside its compiled (and captured) region (grpo/decoding/graph_decode.py
`GraphStep.sample`), the lean loop once per token (grpo/decoding/decode.py `decode`), and transformers' `generate`
(the hf engine, grpo/phases/generate.py `decode_hf`) through `NextTokenProcessor`, its one logits processor, which
hands back the token one-hot so that generate, decoding greedily, emits it. The penalties' memory of a row's tokens
(`penalty_history`, `remember`) is kept by the engine: the tokens it appended, padding on stopped rows included, as
transformers' own processors read them from the sequences.

Nothing here reads a value back to the host unless the caller allows it (`may_read_host`: the lean loop and generate on
the CPU, where a read costs nothing and saves the sanitiser's rewrite of a batch with no bad row), allocates a shape
that depends on the data, or imports: the graph engine compiles it as part of one graph.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from grpo.config import RolloutConfig
from grpo.decoding.sampling import keyed_choice

NAN_LOGIT = -1e4
"""NaN logits become this: exp(-1e4 - max) is 0 in fp32, so a NaN token is never picked unless all are NaN, and it
stays finite after division by any temperature ≥ 1e-30 in fp32 (|x| < 3e38)."""
POSINF_LOGIT = 1e4
"""+Inf logits become this: finite, but beats every ordinary logit (|logit| < ~100 in practice)."""
NEGINF_LOGIT = -1e4
"""-Inf logits (masks from min_new_tokens, or an overflowing model) become this; a row of all -Inf would otherwise
make softmax NaN. Like NAN_LOGIT it carries zero probability next to any ordinary logit."""

SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                   "frequency_penalty", "min_new_tokens")
"""The rollout section's fields `next_token` applies (each neutral value adds nothing, as in `generate`)."""


def warpers(temperature: float, top_k: int, top_p: float, min_p: float) -> list[Any]:
    """Hugging Face's sampling warpers for these settings, in `generate`'s order (neutral values add none)."""
    from transformers import MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    out: list[Any] = []
    if temperature != 1.0:
        out.append(TemperatureLogitsWarper(temperature))
    if top_k:
        out.append(TopKLogitsWarper(top_k=top_k))
    if top_p < 1.0:
        out.append(TopPLogitsWarper(top_p=top_p))
    if min_p > 0:
        out.append(MinPLogitsWarper(min_p=min_p))
    return out


@dataclass(frozen=True, eq=False)
class StepSampling:
    """One call's sampling: the rollout section (its SAMPLING_FIELDS) and the call's own values."""

    rollout: RolloutConfig
    do_sample: bool
    """False = greedy (evaluation): the warps do not apply."""
    stop_ids: tuple[int, ...]
    pad_id: int

    @property
    def key(self) -> tuple:
        """What a compiled step depends on (its cache key)."""
        return (self.do_sample, self.stop_ids, self.pad_id) + tuple(getattr(self.rollout, f) for f in SAMPLING_FIELDS)

    warps: list[Any] = field(init=False, repr=False)
    """Hugging Face's sampling warpers for these settings (none when greedy), built here, once: building them imports
    transformers, and an import inside the compiled step is a graph break (torch 2.11's dynamo refuses one of a lazy
    module, so the step was neither compiled whole nor captured)."""

    def __post_init__(self) -> None:
        r = self.rollout
        object.__setattr__(self, "warps", warpers(r.temperature, r.top_k, r.top_p, r.min_p) if self.do_sample else [])


def penalty_history(ids_BP: torch.Tensor, mask_BP: torch.Tensor, vocab: int,
                    rollout: RolloutConfig) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(seen_BV, counts_BV) before the first new token: the repetition penalty's seen tokens (the prompt's real ones;
    left padding is not seen, as in generate) and the presence / frequency penalties' completion counts (zeros);
    None where the penalty is off."""
    B, device = ids_BP.shape[0], ids_BP.device
    seen_BV = None
    if rollout.repetition_penalty != 1.0:  # ids past the vocabulary go to a spare column, dropped
        seen_BV = torch.zeros(B, vocab + 1, dtype=torch.bool, device=device)
        seen_BV.scatter_(1, torch.where(mask_BP.bool(), ids_BP.clamp(max=vocab), vocab), True)
        seen_BV = seen_BV[:, :vocab].contiguous()
    counts_BV = None
    if rollout.presence_penalty or rollout.frequency_penalty:
        counts_BV = torch.zeros(B, vocab, dtype=torch.float32, device=device)
    return seen_BV, counts_BV


def remember(next_B: torch.Tensor, seen_BV: torch.Tensor | None, counts_BV: torch.Tensor | None) -> None:
    """Add the tokens just appended (pad on stopped rows) to the penalties' history, in place."""
    if seen_BV is not None:
        seen_BV.scatter_(1, next_B[:, None], True)
    if counts_BV is not None:
        counts_BV.scatter_add_(1, next_B[:, None], torch.ones_like(counts_BV[:, :1]))


def penalised(scores_BV: torch.Tensor, sampling: StepSampling, t: int | torch.Tensor, stops_S: torch.Tensor,
              seen_BV: torch.Tensor | None, counts_BV: torch.Tensor | None) -> torch.Tensor:
    """The repetition penalty, min_new_tokens and the completion-only presence / frequency penalties, in generate's
    order (see the module docstring)."""
    rollout = sampling.rollout
    if seen_BV is not None:
        penalty = rollout.repetition_penalty
        penalised_BV = torch.where(scores_BV < 0, scores_BV * penalty, scores_BV / penalty)
        scores_BV = torch.where(seen_BV, penalised_BV, scores_BV)
    if rollout.min_new_tokens > 0 and not (isinstance(t, int) and t >= rollout.min_new_tokens):
        is_stop_V = torch.isin(torch.arange(scores_BV.shape[-1], device=scores_BV.device), stops_S)
        scores_BV = torch.where(is_stop_V & (t < rollout.min_new_tokens), float("-inf"), scores_BV)
    if counts_BV is not None:
        scores_BV = (scores_BV - rollout.frequency_penalty * counts_BV
                     - rollout.presence_penalty * (counts_BV > 0).to(scores_BV.dtype))
    return scores_BV


def sanitised(scores_BV: torch.Tensor, fixed: torch.Tensor, may_read_host: bool = False) -> torch.Tensor:
    """The logit sanitiser: the rows holding NaN or +Inf made finite (NAN_LOGIT, POSINF_LOGIT, NEGINF_LOGIT), their
    count added to `fixed` (0-d, on the device). A −Inf alone (a token masked by min_new_tokens) is legitimate: a row
    without NaN or +Inf is left as it is. `may_read_host`: a batch with no bad row is returned without the rewrite
    (one host read; free on the CPU)."""
    # one reduction finds the bad rows: a NaN or +Inf anywhere makes the row's sum NaN or +Inf
    sum_B = scores_BV.sum(dim=-1)
    bad_B = torch.isnan(sum_B) | (sum_B == float("inf"))
    fixed.add_(bad_B.sum())
    if may_read_host and not bool(bad_B.any()):
        return scores_BV
    fixed_BV = torch.nan_to_num(scores_BV, nan=NAN_LOGIT, posinf=POSINF_LOGIT, neginf=NEGINF_LOGIT)
    return torch.where(bad_B[:, None], fixed_BV, scores_BV)


def warped(scores_BV: torch.Tensor, sampling: StepSampling) -> torch.Tensor:
    """The sampling warps (temperature, top-k, top-p, min-p), in generate's order; none when greedy."""
    for warp in sampling.warps:
        scores_BV = warp(None, scores_BV)
    return scores_BV


def next_token(scores_BV: torch.Tensor, sampling: StepSampling, t: int | torch.Tensor, *, stops_S: torch.Tensor,
               keys_B: torch.Tensor | None, seen_BV: torch.Tensor | None, counts_BV: torch.Tensor | None,
               fixed: torch.Tensor, may_read_host: bool = False) -> torch.Tensor:
    """THE SAMPLER: the next token of each row (B,) from its fp32 scores at decoding step t (0 for the first new
    token): penalties, sanitiser, warps, then the draw (see the module docstring). `keys_B`: each row's sampler key
    (the keyed draw), None = the torch RNG; `fixed` counts the rows the sanitiser fixed."""
    scores_BV = penalised(scores_BV, sampling, t, stops_S, seen_BV, counts_BV)
    scores_BV = sanitised(scores_BV, fixed, may_read_host)
    if not sampling.do_sample:
        return torch.argmax(scores_BV, dim=-1)
    scores_BV = warped(scores_BV, sampling)
    if keys_B is None:
        return torch.multinomial(torch.softmax(scores_BV, dim=-1), num_samples=1).squeeze(1)
    return keyed_choice(scores_BV, keys_B, t)


class NextTokenProcessor:
    """`generate`'s one logits processor (the hf engine): `next_token` over the scores generate hands it, returned
    one-hot (0 at the drawn token, −inf elsewhere), so that generate, with its own sampling and processors off,
    emits exactly that token. The penalties' history is read from the sequences generate appended (`remember`).

    `mask_BP`: the prompt's padding mask (left padding is not seen by the repetition penalty); `keys_B`: each row's
    sampler key, or None to draw from the torch RNG as generate would."""

    def __init__(self, sampling: StepSampling, mask_BP: torch.Tensor, keys_B: torch.Tensor | None):
        self.sampling, self.mask_BP, self.keys_B = sampling, mask_BP, keys_B
        self.prompt_len = int(mask_BP.shape[1])
        self.fixed = torch.zeros((), dtype=torch.long)
        self.history: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)
        self.stops_S = torch.tensor(list(sampling.stop_ids), dtype=torch.long)

    def __call__(self, input_ids: torch.LongTensor, scores_BV: torch.Tensor) -> torch.Tensor:
        if self.keys_B is not None and input_ids.shape[0] != self.keys_B.numel():
            raise ValueError(f"NextTokenProcessor: {input_ids.shape[0]} rows but {self.keys_B.numel()} keys")
        device = scores_BV.device
        t = int(input_ids.shape[1]) - self.prompt_len  # decoding step: 0 for the first new token
        if t == 0:  # once: the tensors to the device, the history from the prompt
            self.fixed, self.stops_S = self.fixed.to(device), self.stops_S.to(device)
            self.keys_B = None if self.keys_B is None else self.keys_B.to(device)
            self.history = penalty_history(input_ids, self.mask_BP.to(device), scores_BV.shape[-1],
                                           self.sampling.rollout)
        else:
            remember(input_ids[:, -1], *self.history)
        next_B = next_token(scores_BV.float(), self.sampling, t, stops_S=self.stops_S, keys_B=self.keys_B,
                            seen_BV=self.history[0], counts_BV=self.history[1], fixed=self.fixed,
                            may_read_host=device.type == "cpu")
        onehot_BV = torch.full_like(scores_BV, float("-inf"))
        return onehot_BV.scatter_(1, next_B[:, None], 0.0)
