"""Shared prompts (model.shared_prompt_forward): the K completions of one prompt attend to that prompt encoded once.
Same log-probs, entropies, gradients and update as the per-row forward (up to rounding); groups stay whole in
micro-batches; and it is only used where it applies."""

import copy
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from grpo import config as C
from grpo.core.step_types import TrainBatch
from grpo.models.logprobs import completion_logprobs, groups_share_prompts, shared_prompt_blocker
from grpo.models.modeling import build_tiny_model, build_tiny_tokenizer, enable_checkpointing
from grpo.models.tokens import collate
from grpo.phases.update import Learner, StepSettings, update_passes

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
CORPUS = ["the answer is yes", "the answer is no", "who was more likely to forget the keys?"] * 5
K = 4
PROMPT_LENGTHS = [5, 12, 8]  # one per group: left padding of different widths
COMPLETION_LENGTHS = [[1, 7, 3, 9], [4, 4, 1, 2], [9, 6, 5, 8]]  # per row: right padding, and 1-token completions


@pytest.fixture(scope="module")
def model():
    tok = build_tiny_tokenizer(CORPUS, vocab_size=300)
    return build_tiny_model(tok, seed=1, hidden=64, layers=2, heads=4, kv_heads=2)


def make_batch(completion_lengths=COMPLETION_LENGTHS) -> TrainBatch:
    g = torch.Generator().manual_seed(0)
    prompts, completions = [], []
    for n, lengths in zip(PROMPT_LENGTHS, completion_lengths, strict=True):
        prompt = torch.randint(5, 250, (n,), generator=g).tolist()
        for m in lengths:
            prompts.append(prompt)
            completions.append(torch.randint(5, 250, (m,), generator=g).tolist())
    ids, attention, completion_mask, P = collate(prompts, completions, 0)
    B = len(prompts)
    return TrainBatch(input_ids_BL=ids, attention_mask_BL=attention, completion_mask_BT=completion_mask.float(),
                      prompt_len=P, task_ids_B=torch.tensor([0, 1] * (B // 2)),
                      advantages_B=torch.linspace(-1.0, 1.0, B), group_size=K)


def forward_rows(model) -> tuple[list[tuple[int, int]], object]:
    """(rows, columns) of every decoder forward, and the hook handle."""
    seen: list[tuple[int, int]] = []
    handle = model.model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    return seen, handle


def logps_entropy_grads(model, batch: TrainBatch, group_size: int, fused: bool):
    model.zero_grad(set_to_none=True)
    mask = batch.completion_mask_BT
    logps, entropy = completion_logprobs(model, batch.input_ids_BL, batch.attention_mask_BL, batch.prompt_len,
                                         temperature=0.7, with_entropy=True, fused_head=fused, group_size=group_size)
    ((logps * mask).sum() + 0.3 * (entropy * mask).sum()).backward()
    return logps * mask, entropy * mask, [p.grad.clone() for p in model.parameters() if p.requires_grad]


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused-head", "logits"])
def test_shared_prompts_give_the_per_row_logprobs_entropies_and_gradients(model, fused, train):
    model.train(train)
    batch = make_batch()
    seen, handle = forward_rows(model)
    try:
        shared = logps_entropy_grads(model, batch, K, fused)
        forwards_shared = list(seen)
        seen.clear()
        per_row = logps_entropy_grads(model, batch, 1, fused)
    finally:
        handle.remove()
    B, L, P, T = batch.size, batch.input_ids_BL.shape[1], batch.prompt_len, batch.completion_mask_BT.shape[1]
    # one forward over the 3 prompts, one over the 12 completions without their last column; per row: 12 × L
    assert forwards_shared == [(B // K, P), (B, T - 1)] and seen == [(B, L)]
    torch.testing.assert_close(shared[0], per_row[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(shared[1], per_row[1], rtol=1e-5, atol=1e-5)
    scale = max(g.abs().max().item() for g in per_row[2])
    for a, b in zip(shared[2], per_row[2], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5 * scale)
    assert scale > 1e-3


def test_one_token_completions_need_only_the_prompt_forward(model):
    batch = make_batch([[1] * K] * 3)
    seen, handle = forward_rows(model)
    try:
        with torch.no_grad():
            shared = completion_logprobs(model.eval(), batch.input_ids_BL, batch.attention_mask_BL,
                                         batch.prompt_len, group_size=K)[0]
            per_row = completion_logprobs(model, batch.input_ids_BL, batch.attention_mask_BL, batch.prompt_len)[0]
    finally:
        handle.remove()
    assert seen[0] == (3, batch.prompt_len) and len(seen) == 2  # the prompt forward, then the per-row forward
    torch.testing.assert_close(shared, per_row, rtol=1e-5, atol=1e-5)


def test_rows_whose_prompts_differ_take_the_per_row_forward(model):
    batch = make_batch()
    assert groups_share_prompts(batch.input_ids_BL, batch.attention_mask_BL, batch.prompt_len, K)
    ids = batch.input_ids_BL.clone()
    ids[5, batch.prompt_len - 1] += 1  # row 5 (group 1) now has another prompt
    assert not groups_share_prompts(ids, batch.attention_mask_BL, batch.prompt_len, K)
    assert not groups_share_prompts(batch.input_ids_BL[:10], batch.attention_mask_BL[:10], batch.prompt_len, K)
    seen, handle = forward_rows(model)
    try:
        with torch.no_grad():
            completion_logprobs(model.eval(), ids, batch.attention_mask_BL, batch.prompt_len, group_size=K)
    finally:
        handle.remove()
    assert seen == [tuple(ids.shape)]


def test_micro_batches_keep_groups_whole():
    batch = make_batch()
    # groups sorted by their longest completion (9, 4, 9) then prompt length (5, 12, 8): 1, 0, 2
    assert [r.tolist() for r in batch.micro_batch_rows(8)] == [[4, 5, 6, 7, 0, 1, 2, 3], [8, 9, 10, 11]]
    micro = list(batch.micro_batches(8))
    assert [mb.group_size for mb in micro] == [K, K]
    assert all(groups_share_prompts(mb.input_ids_BL, mb.attention_mask_BL, mb.prompt_len, K) for mb in micro)
    back = batch.from_micro_batches([mb.completion_mask_BT for mb in micro], 8)
    assert torch.equal(back, batch.completion_mask_BT)
    # a micro-batch size that splits groups (e.g. after the out-of-memory retry halved it): rows stand alone
    assert {mb.group_size for mb in batch.micro_batches(6)} == {1}


def test_an_update_with_shared_prompts_equals_the_per_row_update(model):
    """μ = 2 SGD steps (the second pass off-policy, with the first pass's log-probs as the old ones) and a KL term:
    the weights after the shared-prompt update equal those after the per-row update."""
    base = copy.deepcopy(model).eval()
    batch = make_batch()
    with torch.no_grad():
        logps = completion_logprobs(base, batch.input_ids_BL, batch.attention_mask_BL, batch.prompt_len)[0]
    batch.ref_logps_BT = (logps - 0.1) * batch.completion_mask_BT
    after = {}
    for group_size in (K, 1):
        m = copy.deepcopy(base)
        params = [p for p in m.parameters() if p.requires_grad]
        update_passes(Learner(m, torch.optim.SGD(params, lr=1.0), params), replace(batch, group_size=group_size),
                   torch.tensor([0.1, 0.3]), C.LossConfig(mu=2), ["a", "b"],
                   StepSettings(micro_batch_seqs=8, temperature=1.0, max_grad_norm=1e9, skip_grad_norm=1e9))
        after[group_size] = params
    for a, b in zip(after[K], after[1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert max((a - b).abs().max().item() for a, b in zip(after[K], base.parameters(), strict=True)) > 1e-4


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_shared_prompts_under_activation_checkpointing_give_the_per_row_gradients(model, lora):
    """transformers drops the KV cache inside checkpointed layers (a recompute would append twice); the prompt cache
    makes every write a repeatable set, so the layers keep it, the recompute in backward runs (4 attention calls per
    layer: 2 forwards, 2 recomputes) and the gradients are the per-row ones without checkpointing."""
    from peft import LoraConfig, get_peft_model

    m = copy.deepcopy(model)
    if lora:
        m = get_peft_model(m, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "up_proj"]))
        with torch.no_grad():
            for name, p in m.named_parameters():
                if "lora_B" in name:
                    p.uniform_(-0.3, 0.3)
    m.train()
    batch = make_batch()
    per_row = logps_entropy_grads(m, batch, 1, True)
    base = m.get_base_model() if lora else m
    enable_checkpointing(base)
    assert shared_prompt_blocker(m, training=True) is None
    calls: list[int] = []
    attention = base.model.layers[0].self_attn
    handle = attention.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        shared = logps_entropy_grads(m, batch, K, True)
    finally:
        handle.remove()
    assert len(calls) == 4
    torch.testing.assert_close(shared[0], per_row[0], rtol=1e-5, atol=1e-5)
    scale = max(g.abs().max().item() for g in per_row[2])
    for a, b in zip(shared[2], per_row[2], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5 * scale)
    assert not any(hasattr(layer, "_can_checkpoint_with_cache") and "_can_checkpoint_with_cache" in vars(layer)
                   for layer in base.modules())  # the switch is back to transformers' class default


def test_shared_prompts_apply_only_where_the_kv_cache_survives(model):
    from transformers import AutoModelForCausalLM, MistralConfig

    assert shared_prompt_blocker(model, training=True) is None
    m = copy.deepcopy(model)
    m.config.attention_dropout = 0.1  # dropout is no obstacle: the rows share the prompt's masks, unbiased
    assert shared_prompt_blocker(m, training=True) is None
    enable_checkpointing(m)
    assert shared_prompt_blocker(m, training=True) is None  # see the test above
    from transformers.modeling_layers import GradientCheckpointingLayer

    with pytest.MonkeyPatch.context() as patch:  # an older transformers: checkpointed layers would drop the cache
        patch.delattr(GradientCheckpointingLayer, "_can_checkpoint_with_cache")
        assert "drop the KV cache" in shared_prompt_blocker(m, training=True)
        assert shared_prompt_blocker(m, training=False) is None
    assert shared_prompt_blocker(SimpleNamespace(module=model), training=True) is None  # DDP: looked through
    windowed = AutoModelForCausalLM.from_config(MistralConfig(vocab_size=50, hidden_size=32, intermediate_size=64,
                                                              num_hidden_layers=1, num_attention_heads=2,
                                                              num_key_value_heads=1, sliding_window=4))
    assert "sliding-window" in shared_prompt_blocker(windowed, training=False)


def test_the_entry_point_decides_by_mode_size_and_blockers_and_refuses_what_cannot_apply(model, monkeypatch):
    import grpo.models.logprobs
    from grpo.run.step_owners import shares_prompts

    dist = SimpleNamespace(is_main=True)
    cfg = C.load_config("demo", [])
    assert cfg.model.shared_prompt_forward == "auto"
    small = sum(p.numel() for p in model.parameters())
    assert small < grpo.models.logprobs.SHARED_PROMPT_MIN_PARAMS and not shares_prompts(cfg, model, dist)
    monkeypatch.setattr(grpo.models.logprobs, "SHARED_PROMPT_MIN_PARAMS", small)
    assert shares_prompts(cfg, model, dist)
    assert shares_prompts(C.load_config("demo", ["model.shared_prompt_forward=on"]), model, dist)
    assert not shares_prompts(C.load_config("demo", ["model.shared_prompt_forward=off"]), model, dist)
    windowed = copy.deepcopy(model)
    windowed.config.sliding_window = 4  # Mistral-style windows: the cache would stop at the window
    assert not shares_prompts(cfg, windowed, dist)
    with pytest.raises(C.ConfigError, match="shared_prompt_forward=on cannot apply here: sliding-window"):
        shares_prompts(C.load_config("demo", ["model.shared_prompt_forward=on"]), windowed, dist)
    with pytest.raises(C.ConfigError, match="model.shared_prompt_forward"):
        C.load_config("demo", ["model.shared_prompt_forward=yes"])


def test_a_training_run_shares_its_prompts(tmp_path, monkeypatch):
    """setup + one RL step with model.shared_prompt_forward=on: the policy's training forwards encode one row per
    prompt (the reference is a separate model here), and the step completes."""
    import grpo_train

    cfg = C.load_config("demo", ["model.shared_prompt_forward=on", "train.max_steps=1", "sft.steps=0",
                                 "train.eval_every=0", "train.tensorboard=false", f"train.output_dir={tmp_path}",
                                 "train.run_name=shared", "kl.default.beta=0.04"])
    run = grpo_train.setup(cfg)
    assert run.updater.share_prompts
    seen, handle = forward_rows(run.policy.model)
    try:
        metrics = grpo_train.rl_step(run, 1)
    finally:
        handle.remove()
    run.tracker.close()
    P = cfg.prompts_per_step
    prompt_forwards = [rows for rows, _ in seen if rows <= P and rows < cfg.micro_batch_seqs]
    assert len(prompt_forwards) >= cfg.train.grad_accum  # the training pass: one prompt forward per micro-batch
    assert metrics["health/skipped"] == 0.0 and metrics["loss/total"] == metrics["loss/total"]  # a finite step
