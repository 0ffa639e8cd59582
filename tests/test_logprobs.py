"""token_logprobs against a float64 log-softmax, its memory against the naive path, and completion_logprobs on a
tiny random Llama: a left-padded row must equal the same row run alone."""

import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from grpo.logprobs import accepts_logits_to_keep, completion_logprobs, position_ids_from_mask, token_logprobs


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
    for p, c in zip(prompts, completions):
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
        for i, (p, c) in enumerate(zip(PROMPTS, COMPLETIONS)):
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
