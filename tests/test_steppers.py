"""The lean loop's decoding steps (grpo/decoding/decode_steps.py): FastSteps, the Llama family's layers called one by
one over in-place KV buffers, gives the logits of the model's whole forward bit for bit; and it is only used where it
applies."""

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    DynamicCache,
    LlamaConfig,
    MistralConfig,
    Phi3Config,
    Qwen2Config,
    Qwen3Config,
)

from grpo.decoding.decode_steps import FastSteps, HFSteps, fast_steps_blocker, make_steps

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
V = 97
SIZES = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128)
CONFIGS = {
    "llama": lambda: LlamaConfig(**SIZES),
    "llama3-rope": lambda: LlamaConfig(**SIZES, rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                              "original_max_position_embeddings": 32}),
    "mistral": lambda: MistralConfig(**SIZES, sliding_window=None),
    "qwen2": lambda: Qwen2Config(**SIZES),  # q / k / v projections with a bias
    "qwen3": lambda: Qwen3Config(**SIZES, head_dim=16),  # per-head q / k RMSNorm
}


def build(arch: str, attn: str, seed: int = 0) -> torch.nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(CONFIGS[arch](), attn_implementation=attn)
        for name, p in model.named_parameters():  # norms start at 1: make them matter
            if "norm" in name:
                p.data.uniform_(0.5, 1.5)
    return model.eval()


def prompt(padded: bool, B: int = 5, P: int = 9, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids_BP = torch.randint(1, V, (B, P), generator=g)
    mask_BP = torch.ones(B, P, dtype=torch.long)
    if padded:  # left padding of different widths
        for b, width in enumerate([0, 3, 1, 5, 2][:B]):
            mask_BP[b, :width] = 0
    return ids_BP, mask_BP


def run_steps(model, ids_BP, mask_BP, kind: type, n: int = 6, drop_after: int = 2,
              rows_B: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Prefill, then n steps fed the same tokens; after step `drop_after` rows 1 and 3 leave the batch. `rows_B`: the
    prefill runs on the given (distinct) rows, and the batch is their rows rows_B (as grpo/decoding/decode.py shares
    it)."""
    pos_BP = (mask_BP.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        out = model(input_ids=ids_BP, attention_mask=None if bool(mask_BP.all()) else mask_BP, position_ids=pos_BP,
                    past_key_values=DynamicCache(config=model.config), use_cache=True, logits_to_keep=1)
        logits = [out.logits[:, -1]]
        if rows_B is not None:
            mask_BP, pos_BP, logits = mask_BP[rows_B], pos_BP[rows_B], [logits[0][rows_B]]
        steps = (FastSteps(model, out.past_key_values, mask_BP, out.logits.dtype, n, rows_B) if kind is FastSteps
                 else HFSteps(model, out.past_key_values, mask_BP, out.logits.dtype, rows_B))
        g = torch.Generator().manual_seed(2)
        next_R1 = torch.randint(1, V, (mask_BP.shape[0], 1), generator=g)
        pos_R1 = pos_BP[:, -1:] + 1
        for t in range(n):
            if t == drop_after:
                keep_R = torch.tensor([0, 2, 4])
                steps.select(keep_R)
                next_R1, pos_R1 = next_R1[keep_R], pos_R1[keep_R]
            logits.append(steps(next_R1, pos_R1))
            next_R1 = torch.randint(1, V, (next_R1.shape[0], 1), generator=g)
            pos_R1 = pos_R1 + 1
    return logits


@pytest.mark.parametrize("padded", [True, False], ids=["left-padded", "unpadded"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("arch", sorted(CONFIGS))
def test_fast_steps_give_the_forwards_logits_bit_for_bit(arch, attn, padded):
    model = build(arch, attn)
    assert fast_steps_blocker(model) is None
    ids_BP, mask_BP = prompt(padded)
    fast = run_steps(model, ids_BP, mask_BP, FastSteps)
    whole = run_steps(model, ids_BP, mask_BP, HFSteps)
    assert [x.shape for x in fast] == [x.shape for x in whole]
    for t, (a, b) in enumerate(zip(fast, whole, strict=True)):
        assert torch.equal(a, b), (arch, attn, padded, t, (a - b).abs().max().item())


@pytest.mark.parametrize("kind", [FastSteps, HFSteps])
def test_a_prefill_of_the_distinct_rows_gives_the_whole_batchs_logits_bit_for_bit(kind):
    """The lean loop prefills each distinct prompt once and gathers the cache back to the batch's rows (an RL batch
    holds every prompt K times): every step's logits are those of the prefill over all rows, also after rows left
    the batch, up to float rounding (the CPU's matmul blocking depends on the row count: 1.2e-7 seen here)."""
    model = build("llama", "sdpa")
    ids_UP, mask_UP = prompt(True, B=3)
    rows_B = torch.tensor([0, 0, 1, 2, 2])
    whole = run_steps(model, ids_UP[rows_B], mask_UP[rows_B], kind)
    shared = run_steps(model, ids_UP, mask_UP, kind, rows_B=rows_B)
    assert [x.shape[0] for x in shared] == [5, 5, 5, 3, 3, 3, 3]  # prefill, steps 0-1, then rows 1 and 3 leave
    # a matmul over 3 rows may round differently than over 5
    for t, (a, b) in enumerate(zip(shared, whole, strict=True)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=lambda m, t=t: f"step {t}: {m}")


def test_fast_steps_run_lora_adapters():
    """Under PEFT the projections are LoRA layers: FastSteps calls them, so the adapter's contribution is in its
    logits exactly as in the forward's (and it does change them)."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(build("llama", "sdpa"), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj",
                                                                                                  "gate_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.uniform_(-0.5, 0.5)
    model.eval()
    assert fast_steps_blocker(model) is None
    ids_BP, mask_BP = prompt(True)
    fast = run_steps(model, ids_BP, mask_BP, FastSteps)
    assert all(torch.equal(a, b) for a, b in zip(fast, run_steps(model, ids_BP, mask_BP, HFSteps), strict=True))
    with model.disable_adapter():
        plain = run_steps(model, ids_BP, mask_BP, FastSteps)
    assert not torch.equal(fast[-1], plain[-1])


def test_fast_steps_write_their_cache_in_place():
    """The KV buffers are allocated once at P + steps columns; a step writes a column, it does not grow a copy."""
    model = build("llama", "sdpa")
    ids_BP, mask_BP = prompt(True)
    out = model(input_ids=ids_BP, attention_mask=mask_BP, past_key_values=DynamicCache(config=model.config),
                use_cache=True, logits_to_keep=1)
    steps = FastSteps(model, out.past_key_values, mask_BP, out.logits.dtype, 4)
    buffers = [K.data_ptr() for K in steps.K]
    assert steps.K[0].shape[2] == ids_BP.shape[1] + 4
    with torch.no_grad():
        for t in range(4):
            steps(torch.full((5, 1), 7), torch.full((5, 1), 10 + t))
    assert [K.data_ptr() for K in steps.K] == buffers and steps.n == ids_BP.shape[1] + 4


def test_fast_steps_apply_only_where_they_replay_the_model():
    assert fast_steps_blocker(build("qwen2", "sdpa")) is None
    windowed = AutoModelForCausalLM.from_config(MistralConfig(**SIZES, sliding_window=4), attn_implementation="sdpa")
    assert "sliding-window" in fast_steps_blocker(windowed)
    phi3 = AutoModelForCausalLM.from_config(Phi3Config(**SIZES, pad_token_id=0), attn_implementation="sdpa")
    assert "Phi3ForCausalLM" in fast_steps_blocker(phi3)
    flex = build("llama", "sdpa")
    flex.config._attn_implementation = "flex_attention"
    assert "flex_attention" in fast_steps_blocker(flex)
    offloaded = build("llama", "sdpa")
    offloaded.model.layers[1]._hf_hook = object()  # what accelerate's device_map attaches to a layer
    assert "accelerate hooks" in fast_steps_blocker(offloaded)
    ids_BP, mask_BP = prompt(True)
    for model, kind in ((build("llama", "eager"), FastSteps), (windowed, HFSteps), (phi3, HFSteps)):
        out = model(input_ids=ids_BP, attention_mask=mask_BP, past_key_values=DynamicCache(config=model.config),
                    use_cache=True, logits_to_keep=1)
        assert type(make_steps(model, out.past_key_values, mask_BP, out.logits.dtype, 3)) is kind
    assert type(make_steps(build("llama", "sdpa"), out.past_key_values, mask_BP, out.logits.dtype, 3,
                           fast=False)) is HFSteps


def test_fast_steps_empty_the_prefill_cache_layer_by_layer():
    """Moving the prompt's keys and values into the buffers holds one layer's prompt cache at a time on top of the
    buffers (not the whole prompt cache twice): when a layer's buffers are allocated, the earlier layers' prefill
    tensors are already freed."""
    import weakref

    from torch.utils._python_dispatch import TorchDispatchMode

    model = build("llama", "sdpa")
    ids_BP, mask_BP = prompt(True)
    with torch.no_grad():
        out = model(input_ids=ids_BP, attention_mask=mask_BP, past_key_values=DynamicCache(config=model.config),
                    use_cache=True, logits_to_keep=1)
    refs = [weakref.ref(t) for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]

    class AliveAtAllocation(TorchDispatchMode):
        counts: list[int] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func._overloadpacket in (torch.ops.aten.new_empty, torch.ops.aten.empty):
                self.counts.append(sum(r() is not None for r in refs))
            return func(*args, **(kwargs or {}))

    with AliveAtAllocation() as mode:
        FastSteps(model, out.past_key_values, mask_BP, out.logits.dtype, 4)
    assert mode.counts[:4] == [4, 4, 2, 2]  # layer 0's K and V buffers, then layer 1's once layer 0 is gone
    assert all(r() is None for r in refs)
