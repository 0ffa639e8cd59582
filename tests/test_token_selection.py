"""Which tokens train: masking truncated completions (loss.mask_truncated) and the top-entropy share of tokens
(loss.top_entropy_quantile), against hand values, TRL 1.16's `GRPOTrainer.get_high_entropy_mask`
(trl/trainer/grpo_trainer.py:1380-1416) and its truncation rule (grpo_trainer.py:2487-2495), and the invariant that
micro-batching changes nothing."""

import copy
from types import SimpleNamespace

import pytest
import torch

from grpo.config import LossConfig
from grpo.core.losses import top_entropy_mask
from grpo.core.step_types import Rollout, Sample, Scored
from grpo.models.modeling import build_tiny_model, build_tiny_tokenizer
from grpo.phases.batch import batch_entropies, build_train_batch
from grpo.phases.update import Learner, StepSettings, update_passes

CORPUS = ["the answer is yes", "the answer is no", "who was more likely to forget the keys?"] * 5


# ------------------------------------------------------------------------------------------------- top-entropy mask
def test_top_entropy_mask_hand_values():
    # valid entropies 0.1, 0.5, 0.9, 0.3, 0.7 (padding 9.9 ignored). q = 0.4: threshold = 60th percentile, linear
    # interpolation: sorted (0.1, 0.3, 0.5, 0.7, 0.9), position 0.6·4 = 2.4 → 0.5 + 0.4·0.2 = 0.58 → keeps 0.9, 0.7.
    entropy = torch.tensor([[0.1, 0.5, 0.9], [0.3, 0.7, 9.9]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    assert torch.equal(top_entropy_mask(entropy, mask, 0.4), torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]]))
    assert torch.equal(top_entropy_mask(entropy, mask, 1.0), mask)  # q = 1 keeps every valid token
    # a wider pool (other ranks' tokens) moves the threshold: pool max 2.0 → only tokens ≥ 2.0 at q → 0+
    assert top_entropy_mask(entropy, mask, 0.01, pool=torch.tensor([0.1, 2.0])).sum() == 0
    assert torch.equal(top_entropy_mask(entropy, torch.zeros_like(mask), 0.5), torch.zeros_like(mask))
    with pytest.raises(ValueError, match="quantile"):
        top_entropy_mask(entropy, mask, 0.0)


@pytest.mark.parametrize("quantile", [0.2, 0.5, 0.9])
def test_top_entropy_mask_matches_trl(quantile):
    trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer")
    g = torch.Generator().manual_seed(3)
    entropy = torch.rand(5, 7, generator=g) * 3
    mask = (torch.arange(7)[None] < torch.tensor([7, 2, 5, 1, 4])[:, None]).float()
    one_process = SimpleNamespace(accelerator=SimpleNamespace(pad_across_processes=lambda t, dim, pad_index: t,
                                                               gather=lambda t: t))
    theirs = trl_grpo.GRPOTrainer.get_high_entropy_mask(one_process, entropy, mask, 1 - quantile)
    assert torch.equal(top_entropy_mask(entropy, mask, quantile), theirs.float())


# ------------------------------------------------------------------------------------------------ truncated masking
def _scored(completions, truncated, prompts):
    out = []
    for i, (c, tr, p) in enumerate(zip(completions, truncated, prompts, strict=True)):
        sample = Sample(task="ab"[i % 2], id=str(i), messages=())
        out.append(Scored(Rollout(sample, tuple(p), tuple(c), "", stopped=not tr, truncated=tr), reward=0.0))
    return out


PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14], [15, 16], [17, 18, 19]]
COMPLETIONS = [[20, 21, 22, 23], [24, 25], [26, 27, 28, 29], [30, 2], [31, 32, 33], [34]]
TRUNCATED = [True, False, True, False, False, False]  # rows 0, 2 reached max_new_tokens = 4 without a stop token
ADV = torch.tensor([1.0, -1.0, 0.5, 0.8, -0.3, 0.2])


def test_build_train_batch_masks_truncated_rows_only_when_asked():
    scored = _scored(COMPLETIONS, TRUNCATED, PROMPTS)
    plain = build_train_batch(scored, ADV, ["a", "b"], 0, torch.device("cpu"))
    masked = build_train_batch(scored, ADV, ["a", "b"], 0, torch.device("cpu"), mask_truncated=True)
    assert plain.num_tokens == 16 and masked.num_tokens == 8  # 4 + 4 tokens of rows 0 and 2 leave the count
    assert masked.completion_mask_BT[[0, 2]].sum() == 0
    assert torch.equal(masked.completion_mask_BT[[1, 3, 4, 5]], plain.completion_mask_BT[[1, 3, 4, 5]])
    assert torch.equal(masked.input_ids_BL, plain.input_ids_BL) and torch.equal(masked.attention_mask_BL,
                                                                                 plain.attention_mask_BL)


def _model():
    tok = build_tiny_tokenizer(CORPUS, vocab_size=300)
    return build_tiny_model(tok, seed=1, hidden=64, layers=2, heads=4, kv_heads=2)


def _step(model, batch, loss, size):
    m = copy.deepcopy(model)
    params = [p for p in m.parameters() if p.requires_grad]
    metrics = update_passes(Learner(m, torch.optim.SGD(params, lr=1.0), params), copy.copy(batch),
                         torch.tensor([0.1, 0.3]), loss, ["a", "b"],
                         StepSettings(micro_batch_seqs=size, temperature=1.0, max_grad_norm=1e9, skip_grad_norm=1e9))
    return params, metrics


def _close(a_params, b_params):
    for a, b in zip(a_params, b_params, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_masked_truncated_rows_update_as_if_they_were_not_there():
    model = _model()
    scored = _scored(COMPLETIONS, TRUNCATED, PROMPTS)
    keep = [i for i, tr in enumerate(TRUNCATED) if not tr]
    masked = build_train_batch(scored, ADV, ["a", "b"], 0, torch.device("cpu"), mask_truncated=True)
    without = build_train_batch([scored[i] for i in keep], ADV[keep], ["a", "b"], 0, torch.device("cpu"))
    for agg in ("token-mean", "seq-mean-token-mean"):
        loss = LossConfig(mask_truncated=True, agg_mode=agg)
        a, _ = _step(model, masked, loss, 6)
        b, _ = _step(model, without, LossConfig(agg_mode=agg), 4)
        if agg == "token-mean":  # the token count excludes the masked rows, so the update is the same
            _close(a, b)
        else:  # a per-sequence mean still counts the masked sequences (as TRL's grpo loss does: B in the mean),
            # so with SGD the step is 4/6 of the step without them
            for x, y, p in zip(a, b, model.parameters(), strict=True):
                torch.testing.assert_close(x - p, (y - p) * 4 / 6, rtol=1e-4, atol=1e-6)


def test_a_batch_of_truncated_completions_takes_no_step():
    model = _model()
    scored = _scored(COMPLETIONS[:2], [True, True], PROMPTS[:2])
    batch = build_train_batch(scored, ADV[:2], ["a", "b"], 0, torch.device("cpu"), mask_truncated=True)
    params, metrics = _step(model, batch, LossConfig(mask_truncated=True), 2)
    assert metrics["loss/no_tokens"] == 1.0 and metrics["health/skipped"] == 0.0
    _close(params, list(model.parameters()))
    with pytest.raises(ValueError, match="no completion tokens"):  # without the option an empty batch is a bug
        _step(model, batch, LossConfig(), 2)


# ------------------------------------------------------------------------------------- selection in the update
def test_top_entropy_selection_trains_only_selected_tokens():
    model = _model()
    batch = build_train_batch(_scored(COMPLETIONS, [False] * 6, PROMPTS), ADV, ["a", "b"], 0, torch.device("cpu"))
    loss = LossConfig(top_entropy_quantile=0.25)
    _, metrics = _step(model, batch, loss, 6)
    expected = top_entropy_mask(batch_entropies(model, batch, 6, 1.0), batch.completion_mask_BT, 0.25)
    assert metrics["loss/entropy_token_frac"] == pytest.approx(float(expected.sum()) / batch.num_tokens)
    assert 0 < expected.sum() < batch.num_tokens
    # the same update as the plain loss with a per-token advantage that is 0 on the unselected tokens
    per_token = copy.copy(batch)
    per_token.advantages_B = ADV[:, None] * expected
    a, _ = _step(model, batch, loss, 6)
    b, _ = _step(model, per_token, LossConfig(), 6)
    _close(a, b)


def test_micro_batching_changes_nothing_with_both_options_on():
    model = _model()
    scored = _scored(COMPLETIONS, TRUNCATED, PROMPTS)
    batch = build_train_batch(scored, ADV, ["a", "b"], 0, torch.device("cpu"), mask_truncated=True)
    for agg in ("token-mean", "seq-mean-token-mean"):
        loss = LossConfig(mask_truncated=True, top_entropy_quantile=0.5, agg_mode=agg, mu=2)
        runs = {size: _step(model, batch, loss, size) for size in (1, 2, 6)}
        _close(runs[1][0], runs[6][0])
        _close(runs[2][0], runs[6][0])
        assert runs[1][1]["loss/total"] == pytest.approx(runs[6][1]["loss/total"], abs=1e-6)
        moved = max((x - y).abs().max().item() for x, y in zip(runs[6][0], model.parameters(), strict=True))
        assert moved > 1e-5
