"""token_logprobs against a float64 log-softmax, its memory against the naive path, and completion_logprobs on a
tiny random Llama: a left-padded row must equal the same row run alone."""

import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from grpo.core.kernels import head_logprobs, token_logprobs
from grpo.models.logprobs import completion_logprobs, fused_head_parts
from grpo.models.model_calls import accepts_logits_to_keep, position_ids_from_mask


def naive_f64(logits, targets, temperature=1.0):
    return torch.log_softmax(logits.double() / temperature, -1).gather(-1, targets[..., None]).squeeze(-1)


# ---------------------------------------------------------------------------------------------------- token_logprobs
@pytest.mark.parametrize("temperature", [1.0, 0.6, 1.7])
@pytest.mark.parametrize("chunk_size", [1, 4, 512])
def test_token_logprobs_matches_float64_log_softmax(temperature, chunk_size):
    g = torch.Generator().manual_seed(0)
    logits = 4 * torch.randn(3, 7, 50, generator=g)
    targets = torch.randint(0, 50, (3, 7), generator=g)
    out = token_logprobs(logits, targets, temperature=temperature, chunk_size=chunk_size)
    assert out.dtype == torch.float32 and out.shape == (3, 7)
    torch.testing.assert_close(out.double(), naive_f64(logits, targets, temperature), atol=1e-5, rtol=0)


def test_token_logprobs_bf16_loses_no_precision_beyond_the_input():
    g = torch.Generator().manual_seed(1)
    logits = (5 * torch.randn(2, 9, 3000, generator=g)).to(torch.bfloat16)
    targets = torch.randint(0, 3000, (2, 9), generator=g)
    out = token_logprobs(logits, targets, temperature=0.8, chunk_size=4)
    assert out.dtype == torch.float32
    # Reference: the exact bf16 values, in float64. A bf16 log-softmax would be off by ~1e-2.
    torch.testing.assert_close(out.double(), naive_f64(logits, targets, 0.8), atol=1e-5, rtol=0)


def test_token_logprobs_gradient_matches_autograd_of_log_softmax():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 5, 13, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 13, (2, 5), generator=g)
    weights = torch.randn(2, 5, generator=g, dtype=torch.float64)
    a = logits.clone().requires_grad_(True)
    (token_logprobs(a, targets, temperature=0.7, chunk_size=3) * weights).sum().backward()
    b = logits.clone().requires_grad_(True)
    (naive_f64(b, targets, 0.7) * weights).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, atol=1e-10, rtol=0)


def test_token_logprobs_accepts_a_non_contiguous_view():
    logits = torch.randn(2, 6, 20)
    targets = torch.randint(0, 20, (2, 5))
    view = logits[:, :-1]
    assert not view.is_contiguous()
    torch.testing.assert_close(token_logprobs(view, targets, chunk_size=3).double(),
                               naive_f64(view, targets), atol=1e-5, rtol=0)


class PeakLiveBytes(TorchDispatchMode):
    """Peak bytes of tensor storages allocated by ops inside the mode and still alive (outputs that alias an
    existing storage, i.e. views of inputs, are not counted)."""

    def __init__(self, *existing: torch.Tensor):
        super().__init__()
        self.known = {x.untyped_storage().data_ptr() for x in existing}
        self.live = 0
        self.peak = 0

    def _release(self, ptr, nbytes):
        self.known.discard(ptr)
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for x in tree_flatten(out)[0]:
            if isinstance(x, torch.Tensor):
                storage = x.untyped_storage()
                ptr, nbytes = storage.data_ptr(), storage.nbytes()
                if ptr not in self.known and nbytes:
                    self.known.add(ptr)
                    self.live += nbytes
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(x, self._release, ptr, nbytes)
        return out


@pytest.mark.parametrize("with_grad", [False, True])
def test_chunked_path_peaks_far_below_the_naive_log_softmax(with_grad):
    B, T, V, rows = 2, 64, 32_000, 16
    logits = torch.randn(B, T, V, dtype=torch.bfloat16).requires_grad_(with_grad)
    targets = torch.randint(0, V, (B, T))
    peaks = {}
    for name, fn in {
        "naive": lambda: torch.log_softmax(logits.float() / 0.9, -1).gather(-1, targets[..., None]).squeeze(-1),
        "chunked": lambda: token_logprobs(logits, targets, temperature=0.9, chunk_size=rows),
    }.items():
        logits.grad = None
        with torch.set_grad_enabled(with_grad), PeakLiveBytes(logits, targets) as tracker:
            out = fn()
            if with_grad:
                out.sum().backward()
            del out
        peaks[name] = tracker.peak
    full_fp32, chunk_fp32 = B * T * V * 4, rows * V * 4
    grad_bytes = B * T * V * 2 if with_grad else 0  # the bf16 gradient of the logits, which any path must build
    assert peaks["naive"] >= full_fp32 + grad_bytes  # naive holds a (B, T, V) fp32 log-softmax
    assert peaks["chunked"] <= grad_bytes + 2 * chunk_fp32 + 64 * 1024, peaks  # + a few (B, T) vectors
    assert peaks["chunked"] < peaks["naive"] / 2, peaks


# ---------------------------------------------------------------------------------------------- completion_logprobs
def tiny_llama():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    return LlamaForCausalLM(cfg).eval()


def tiny_gpt2():
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    return GPT2LMHeadModel(cfg).eval()


PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]
COMPLETIONS = [[20, 21, 22], [30, 31, 32, 33], [40]]
PAD = 0


def left_right_padded(prompts, completions):
    P, T = max(map(len, prompts)), max(map(len, completions))
    ids, attn = [], []
    for p, c in zip(prompts, completions, strict=True):
        ids.append([PAD] * (P - len(p)) + p + c + [PAD] * (T - len(c)))
        attn.append([0] * (P - len(p)) + [1] * (len(p) + len(c)) + [0] * (T - len(c)))
    return torch.tensor(ids), torch.tensor(attn), P


def single_row(model, prompt, completion, **kw):
    ids = torch.tensor([prompt + completion])
    return completion_logprobs(model, ids, torch.ones_like(ids), len(prompt), **kw)


@pytest.mark.parametrize("make_model", [tiny_llama, tiny_gpt2])
def test_left_padded_rows_equal_each_row_alone(make_model):
    model = make_model()
    ids, attn, P = left_right_padded(PROMPTS, COMPLETIONS)
    with torch.no_grad():
        logps, ent = completion_logprobs(model, ids, attn, P, temperature=0.9, with_entropy=True)
        assert logps.shape == (3, 4) and ent.shape == (3, 4) and torch.isfinite(ent).all()
        for i, (p, c) in enumerate(zip(PROMPTS, COMPLETIONS, strict=True)):
            alone, alone_ent = single_row(model, p, c, temperature=0.9, with_entropy=True)
            torch.testing.assert_close(logps[i, :len(c)], alone[0], atol=1e-5, rtol=0)
            torch.testing.assert_close(ent[i, :len(c)], alone_ent[0], atol=1e-5, rtol=0)


def test_single_row_equals_a_manual_full_forward():
    model = tiny_llama()
    prompt, completion = PROMPTS[0], COMPLETIONS[0]
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits.double()
        logps, _ = single_row(model, prompt, completion)
    P = len(prompt)
    expected = torch.log_softmax(logits[0, P - 1:-1], -1).gather(-1, ids[0, P:, None]).squeeze(-1)
    torch.testing.assert_close(logps[0].double(), expected, atol=1e-5, rtol=0)


def test_gpt2_needs_mask_derived_positions():
    """Regression: with positions 0..L−1 (the forward's default), a left-padded GPT-2 row shifts its absolute
    positions and its log-probs change; completion_logprobs passes mask-derived positions instead."""
    model = tiny_gpt2()
    ids, attn, P = left_right_padded(PROMPTS, COMPLETIONS)
    with torch.no_grad():
        default_positions = model(input_ids=ids, attention_mask=attn).logits
        alone, _ = single_row(model, PROMPTS[1], COMPLETIONS[1])
    shifted = torch.log_softmax(default_positions[1, P - 1:-1].double(), -1).gather(
        -1, ids[1, P:, None]).squeeze(-1)
    assert (shifted - alone[0].double()).abs().max() > 1e-3


class NoLogitsToKeep(torch.nn.Module):
    """A wrapper whose forward does not take `logits_to_keep`: the full-logits fallback must give the same result."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, attention_mask, position_ids, use_cache):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          use_cache=use_cache)


def test_full_logits_fallback_equals_logits_to_keep():
    model = tiny_llama()
    wrapped = NoLogitsToKeep(model)
    assert accepts_logits_to_keep(model) and not accepts_logits_to_keep(wrapped)
    ids, attn, P = left_right_padded(PROMPTS, COMPLETIONS)
    with torch.no_grad():
        a, _ = completion_logprobs(model, ids, attn, P)
        b, _ = completion_logprobs(wrapped, ids, attn, P)
    torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_gradients_reach_the_parameters_and_mode_is_left_alone():
    model = tiny_llama()
    ids, attn, P = left_right_padded(PROMPTS, COMPLETIONS)
    logps, _ = completion_logprobs(model, ids, attn, P)
    logps.sum().backward()
    assert not model.training  # the caller owns train()/eval()
    assert model.lm_head.weight.grad is not None and model.lm_head.weight.grad.abs().sum() > 0
    assert model.model.embed_tokens.weight.grad.abs().sum() > 0


def test_position_ids_and_bad_prompt_len():
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    torch.testing.assert_close(position_ids_from_mask(mask), torch.tensor([[0, 0, 0, 1, 2, 0], [0, 1, 2, 3, 4, 5]]))
    with pytest.raises(ValueError, match="prompt_len"):
        completion_logprobs(tiny_llama(), torch.ones(1, 4, dtype=torch.long), torch.ones(1, 4), 4)


# ------------------------------------------------------------------------------------------------- the fused head
@pytest.mark.parametrize("temperature,chunk", [(1.0, 4), (0.7, 4), (1.3, 1000)])
def test_head_logprobs_match_a_float64_log_softmax_with_gradients(temperature, chunk):
    """Values and gradients (hidden and weight, through log-prob AND entropy) against autograd of the plain path."""
    torch.manual_seed(1)
    B, T, H, V = 3, 5, 7, 11
    hidden = torch.randn(B, T, H, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(V, H, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, V, (B, T))
    g_lp, g_ent = torch.randn(B, T, dtype=torch.float64), torch.randn(B, T, dtype=torch.float64)
    results = []
    for fused in (True, False):
        hidden.grad = weight.grad = None
        if fused:
            lp, ent = head_logprobs(hidden, weight, targets, temperature, with_entropy=True, chunk_size=chunk)
        else:
            log_p = torch.log_softmax(hidden @ weight.T / temperature, -1)
            lp, ent = log_p.gather(-1, targets[..., None]).squeeze(-1), -(log_p.exp() * log_p).sum(-1)
        (lp * g_lp + ent * g_ent).sum().backward()
        results.append((lp.detach(), ent.detach(), hidden.grad.clone(), weight.grad.clone()))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_fused_head_equals_the_logits_path_on_a_model():
    """completion_logprobs with and without the fused head: log-probs, entropies and every parameter gradient."""
    model = tiny_llama().train()
    assert fused_head_parts(model) is not None
    ids = torch.tensor([[0, 0, 5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16, 17, 18]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1], [1] * 8])
    results = []
    for fused in (True, False):
        model.zero_grad()
        lp, ent = completion_logprobs(model, ids, mask, 4, temperature=0.8, with_entropy=True, fused_head=fused)
        (lp.sum() + 0.3 * ent.sum()).backward()
        results.append((lp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (lp_a, ent_a, grads_a), (lp_b, ent_b, grads_b) = results
    torch.testing.assert_close(lp_a, lp_b, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent_a, ent_b, rtol=1e-5, atol=1e-5)
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=1e-4, atol=1e-5, msg=name)


def test_fused_head_gradient_of_either_output_alone():
    """The loss may use only the log-probs (entropy_coef = 0: the entropy is a metric) or only the entropy: the
    unused output's gradient is None, its term skipped, and each gradient still equals the logits path's."""
    model = tiny_llama().train()
    ids = torch.tensor([[0, 0, 5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16, 17, 18]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1], [1] * 8])
    for pick in (0, 1):
        grads = []
        for fused in (True, False):
            model.zero_grad()
            out = completion_logprobs(model, ids, mask, 4, temperature=0.8, with_entropy=True, fused_head=fused)
            out[pick].sum().backward()
            grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        for name in grads[0]:
            torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-4, atol=1e-5, msg=(pick, name))


def test_fused_head_applies_only_where_logits_are_hidden_times_head():
    model = tiny_llama()
    assert fused_head_parts(torch.nn.Module()) is None
    wrapped = torch.nn.Module()
    wrapped.module = model  # a DDP-style wrapper is looked through
    assert fused_head_parts(wrapped) == (model.get_decoder(), model.lm_head)
    model.config.model_type = "gemma2"  # soft-capped logits: not fused
    assert fused_head_parts(model) is None
    assert fused_head_parts(tiny_gpt2()) is None  # not in the list: the logits path


def test_fused_head_never_holds_the_logits(monkeypatch):
    """Peak live bytes of one training forward + backward: the fused path stays far below B·T·V (when it recomputes
    the log-softmax in backward, as it always does off the CPU)."""
    import grpo.core.kernels

    monkeypatch.setattr(grpo.core.kernels, "KEEP_LOG_SOFTMAX_BYTES", 0)
    torch.manual_seed(0)
    V, B, L = 8_000, 2, 200
    model = LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1)).train()
    ids, mask = torch.randint(0, V, (B, L)), torch.ones(B, L, dtype=torch.long)
    peaks = {}
    for fused in (True, False):
        model.zero_grad(set_to_none=True)
        with PeakLiveBytes(*model.parameters(), ids, mask) as tracker:
            lp, _ = completion_logprobs(model, ids, mask, 8, fused_head=fused, chunk_size=16)
            lp.sum().backward()
            del lp
        peaks[fused] = tracker.peak
    logits_bytes = B * (L - 8) * V * 4
    assert peaks[False] >= 2 * logits_bytes  # the logits and their gradient
    assert peaks[True] < logits_bytes / 2, peaks


class CountHeadProducts(TorchDispatchMode):
    """Counts matrix products whose output has `width` columns (the head's vocabulary)."""

    def __init__(self, width: int):
        super().__init__()
        self.width, self.count = width, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default) and out.shape[-1] == self.width:
            self.count += 1
        return out


@pytest.mark.parametrize("with_entropy", [False, True])
def test_kept_log_softmax_gives_the_recomputed_gradients_bit_for_bit_with_one_head_product_fewer(monkeypatch,
                                                                                                  with_entropy):
    """On the CPU the fused head keeps its forward's log-softmax chunks for backward (up to KEEP_LOG_SOFTMAX_BYTES)
    instead of recomputing them: the same values, so the same gradients bit for bit, with one head product (h·Wᵀ)
    per chunk fewer. 3 chunks of 4 rows here: forward 3 products, backward 3 (recompute) or 0, and never more."""
    import grpo.core.kernels

    g = torch.Generator().manual_seed(0)
    V, H = 37, 8
    hidden = torch.randn(2, 6, H, generator=g)
    weight = torch.randn(V, H, generator=g)
    targets = torch.randint(0, V, (2, 6), generator=g)
    results = {}
    for budget in (0, grpo.core.kernels.KEEP_LOG_SOFTMAX_BYTES):
        monkeypatch.setattr(grpo.core.kernels, "KEEP_LOG_SOFTMAX_BYTES", budget)
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        with CountHeadProducts(V) as counter:
            lp, ent = head_logprobs(h, w, targets, 0.7, with_entropy=with_entropy, chunk_size=4)
            forward = counter.count
            (lp.sum() + (ent.sum() if with_entropy else 0)).backward()
        results[budget] = (lp, h.grad, w.grad, forward, counter.count - forward)
    recomputed, kept = results[0], results[grpo.core.kernels.KEEP_LOG_SOFTMAX_BYTES]
    for a, b in zip(recomputed[:3], kept[:3], strict=True):
        assert torch.equal(a, b)
    assert (recomputed[3], recomputed[4]) == (3, 3) and (kept[3], kept[4]) == (3, 0)
    # the no-grad passes (old / reference log-probs) keep nothing and give the same values
    with torch.no_grad():
        lp_nograd, _ = head_logprobs(hidden, weight, targets, 0.7, chunk_size=4)
    assert torch.equal(lp_nograd, kept[0].detach())


@pytest.mark.parametrize("group_size", [1, 2])
def test_the_fused_forwards_compute_no_logits(group_size):
    """With the fused head the model's own LM head sees no position at all (`no_logits`), per row and with shared
    prompts: its logits are never used, and even one kept position per row is a full head product (0.8 s a forward
    on SmolLM2 at 32 rows). The log-probs are the logits path's."""
    model = tiny_llama().train()
    ids = torch.tensor([[0, 5, 6, 7, 8, 9], [0, 5, 6, 7, 10, 11], [3, 4, 6, 2, 12, 13], [3, 4, 6, 2, 14, 9]])
    mask = torch.tensor([[0, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1], [1] * 6, [1] * 6])
    positions: list[int] = []
    handle = model.lm_head.register_forward_pre_hook(lambda module, args: positions.append(args[0].shape[1]))
    try:
        fused, _ = completion_logprobs(model, ids, mask, 4, fused_head=True, group_size=group_size)
    finally:
        handle.remove()
    assert positions == [0] * group_size  # one forward per row, or the prompts' and the completions' forwards
    plain, _ = completion_logprobs(model, ids, mask, 4, fused_head=False, group_size=group_size)
    torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-6)
