"""Micro-batches: rows grouped by length, each micro-batch trimmed of the columns that are padding in all its rows,
results put back in batch order; the log-probs and the update do not change."""

import copy

import torch

from grpo.config import LossConfig
from grpo.core.step_types import TrainBatch
from grpo.models.logprobs import completion_logprobs
from grpo.models.modeling import build_tiny_model, build_tiny_tokenizer
from grpo.models.tokens import collate
from grpo.phases.batch import batch_logprobs
from grpo.phases.update import Learner, StepSettings, update_passes

CORPUS = ["the answer is yes", "the answer is no", "who was more likely to forget the keys?"] * 5
PAD = 0
# prompt and completion lengths that differ a lot between neighbours, so the consecutive split pads heavily
PROMPT_LENGTHS = [3, 11, 4, 12, 5, 10, 2, 9]
COMPLETION_LENGTHS = [1, 14, 2, 13, 3, 12, 4, 11]


def make_batch() -> TrainBatch:
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, 250, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]
    completions = [torch.randint(5, 250, (n,), generator=g).tolist() for n in COMPLETION_LENGTHS]
    ids, attention, completion_mask, P = collate(prompts, completions, PAD)
    return TrainBatch(input_ids_BL=ids, attention_mask_BL=attention, completion_mask_BT=completion_mask.float(),
                      prompt_len=P, task_ids_B=torch.tensor([0, 1] * 4),
                      advantages_B=torch.linspace(-1.0, 1.0, len(prompts)))


def cells(batches) -> int:
    return sum(mb.input_ids_BL.numel() for mb in batches)


def test_micro_batches_group_rows_by_length_and_drop_padding_columns():
    batch = make_batch()
    rows = batch.micro_batch_rows(2)
    assert [r.tolist() for r in rows] == [[0, 2], [4, 6], [7, 5], [3, 1]]  # by completion length, then prompt
    micro = list(batch.micro_batches(2))
    for r, mb in zip(rows, micro, strict=True):
        prompt_lens = [PROMPT_LENGTHS[i] for i in r.tolist()]
        completion_lens = [COMPLETION_LENGTHS[i] for i in r.tolist()]
        assert mb.prompt_len == max(prompt_lens) and mb.completion_mask_BT.shape[1] == max(completion_lens)
        assert torch.equal(mb.input_ids_BL[:, mb.prompt_len:][mb.completion_mask_BT.bool()],
                           batch.input_ids_BL[r, batch.prompt_len:][batch.completion_mask_BT[r].bool()])
    consecutive = [batch.select(slice(i, i + 2)) for i in range(0, batch.size, 2)]
    # by hand: (4+2)·2 + (5+4)·2 + (10+12)·2 + (12+14)·2 = 126 cells, against 4 · (12+14)·2 = 208
    assert (cells(micro), cells(consecutive)) == (126, 208)
    # results come back in batch order, zero where a micro-batch had no column
    back = batch.from_micro_batches([mb.completion_mask_BT for mb in micro], 2)
    assert torch.equal(back, batch.completion_mask_BT)


def test_trimmed_micro_batches_give_the_same_log_probs_and_update():
    tok = build_tiny_tokenizer(CORPUS, vocab_size=300)
    model = build_tiny_model(tok, seed=1, hidden=64, layers=2, heads=4, kv_heads=2).eval()
    batch = make_batch()
    with torch.no_grad():
        untrimmed = completion_logprobs(model, batch.input_ids_BL, batch.attention_mask_BL, batch.prompt_len)[0]
    for size in (1, 2, 3, 8):
        torch.testing.assert_close(batch_logprobs(model, batch, size, 1.0), untrimmed * batch.completion_mask_BT,
                                   rtol=1e-5, atol=1e-5)
    # one SGD step (the update is the gradient): micro-batches of 2, sorted and trimmed, against the whole batch
    batch.ref_logps_BT = untrimmed.detach() - 0.1
    params_by_size = {}
    for size in (2, 8):
        m = copy.deepcopy(model)
        params = [p for p in m.parameters() if p.requires_grad]
        update_passes(Learner(m, torch.optim.SGD(params, lr=1.0), params), copy.copy(batch), torch.tensor([0.1, 0.3]),
                   LossConfig(mu=2), ["a", "b"],
                   StepSettings(micro_batch_seqs=size, temperature=1.0, max_grad_norm=1e9, skip_grad_norm=1e9))
        params_by_size[size] = params
    for a, b in zip(params_by_size[2], params_by_size[8], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    moved = max((a - b).abs().max().item() for a, b in zip(params_by_size[2], model.parameters(), strict=True))
    assert moved > 1e-4
