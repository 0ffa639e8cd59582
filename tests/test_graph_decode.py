"""The graph engine (grpo/decoding/graph_decode.py): one fixed-shape decoding step with the sampler inside. It samples
what transformers' generate samples with the same per-row sampler, its step gives the model's logits, it compiles as
one graph with no break, it reads nothing back to the host, and LoRA folded for the rollout changes only rounding."""

import warnings

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

from grpo.config import ConfigError, RolloutConfig
from grpo.decoding import graph_decode as G
from grpo.decoding.sampling import row_keys
from grpo.models.modeling import build_tiny_model, build_tiny_tokenizer, generation_mode
from grpo.models.tokens import left_pad
from grpo.phases.generate import SamplingPlan, choose_engine, generate_rollouts, greedy_complete
from tests.test_decode import CORPUS, NEW, SAMPLES, K, most_sampled

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
SETTINGS = {
    "plain": {},
    "warpers": {"temperature": 0.7, "top_k": 20, "top_p": 0.9, "min_p": 0.02, "repetition_penalty": 1.3,
                "min_new_tokens": 3},
    "penalties": {"temperature": 1.5, "presence_penalty": 0.5, "frequency_penalty": 0.3, "repetition_penalty": 0.8},
}
SYNC_OPS = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2", "equal", "is_nonzero", "item"}


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer(CORPUS, vocab_size=300)


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def model(request, tok):
    model = build_tiny_model(tok, seed=3, hidden=64, layers=2, heads=4, kv_heads=2)
    model.set_attn_implementation(request.param)
    return model


@pytest.fixture(scope="module")
def stops(model, tok):
    """tests/test_decode.py's stop ids (the same prompts), on this module's model."""
    return most_sampled(model, tok)


def completions(model, tok, engine, stops, settings, keys=None, seed=0, greedy=False):
    rollout = RolloutConfig(k=K, max_new_tokens=NEW, engine=engine, **settings)
    if greedy:
        rollouts, metrics = greedy_complete(model, tok, SAMPLES, rollout, stops)
    else:
        rollouts, metrics = generate_rollouts(model, tok, SAMPLES, rollout, stops,
                                              plan=SamplingPlan(generator_seed=seed, row_keys=keys))
    return [(r.completion_ids, r.stopped) for r in rollouts], metrics


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_the_graph_engine_samples_what_generate_samples(model, tok, stops, name):
    """The same per-row sampler keys: the graph engine's tokens are generate's (with the seeded sampler) and the lean
    loop's, row for row, rows stopping at many lengths, every sampling setting applied inside the step."""
    lengths = set()
    for step in range(3):
        keys = row_keys(8, step, range(len(SAMPLES)), K)
        out = {engine: completions(model, tok, engine, stops, SETTINGS[name], keys=keys)[0]
               for engine in ("hf", "lean", "graph")}
        assert out["graph"] == out["hf"] == out["lean"], (name, step)
        lengths |= {len(ids) for ids, _ in out["graph"]}
    assert len(lengths) > 2


def test_greedy_graph_decoding_is_generates(model, tok, stops):
    assert completions(model, tok, "graph", stops, {}, greedy=True)[0] == completions(
        model, tok, "hf", stops, {}, greedy=True)[0]


def test_without_run_keys_each_row_draws_its_key_from_the_seeded_rng(model, tok, stops):
    """rollout.sampling_rng=global: the graph engine's rows take their keys from the torch RNG, so a seeded call
    repeats itself and another seed draws other completions; the outer RNG state is left as it was."""
    state = torch.get_rng_state()
    first, _ = completions(model, tok, "graph", stops, {}, seed=5)
    assert torch.equal(torch.get_rng_state(), state)
    assert completions(model, tok, "graph", stops, {}, seed=5)[0] == first
    assert completions(model, tok, "graph", stops, {}, seed=6)[0] != first


def test_nonfinite_logits_are_fixed_and_counted_on_the_device(tok, stops):
    """A model whose logits hold NaN on one row: the sanitiser inside the step makes them finite (every draw a real
    token) and counts the row, as the lean loop's processor does."""
    model = build_tiny_model(tok, seed=3, hidden=64, layers=2, heads=4, kv_heads=2)
    model.set_attn_implementation("sdpa")
    head = model.lm_head
    handle = head.register_forward_hook(lambda m, args, out: torch.where(
        torch.arange(out.shape[0])[:, None, None] == 0, torch.full_like(out, float("nan")), out))
    try:
        out = {engine: completions(model, tok, engine, stops, {}, keys=row_keys(0, 1, range(4), K))
               for engine in ("lean", "graph")}
    finally:
        handle.remove()
    assert out["graph"][0] == out["lean"][0]
    assert out["graph"][1]["rollout/nonfinite_logit_rows"] == out["lean"][1]["rollout/nonfinite_logit_rows"] > 0


V = 97
SIZES = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256)
ARCHS = {
    "llama": lambda: LlamaConfig(**SIZES),
    "llama3-rope": lambda: LlamaConfig(**SIZES, rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                              "original_max_position_embeddings": 32}),
    "qwen2": lambda: Qwen2Config(**SIZES),
    "qwen3": lambda: Qwen3Config(**SIZES, head_dim=16),
}


def build(arch: str, attn: str = "sdpa", dtype=torch.float32) -> torch.nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(ARCHS[arch](), attn_implementation=attn, dtype=dtype)
        for name, p in model.named_parameters():
            if "norm" in name:
                p.data.uniform_(0.5, 1.5)
    return model.eval()


def padded_prompts(B: int = 4, P: int = 9) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(1, V, (P - w,), generator=g).tolist() for w in [0, 3, 1, 5][:B]]
    return left_pad(rows, 0, multiple_of=G.PROMPT_BUCKET)


def step_logits(model, ids_BP, mask_BP, fed_BT, sampling=None, fold=False, compiled=None) -> list[torch.Tensor]:
    """The graph step's logits after feeding the tokens of `fed_BT` one column at a time (the sampler draws, then
    the fed token replaces its draw)."""
    sampling = sampling or G.StepSampling(RolloutConfig(), do_sample=False, stop_ids=(V + 5,), pad_id=0)
    graph = G.GraphStep(model)
    with generation_mode(model), torch.no_grad():
        state = G.build_state(model, ids_BP, mask_BP, torch.arange(ids_BP.shape[0]), sampling, fed_BT.shape[1] + 1,
                              graph.fold(fold), None)
        logits = [state.logits_BV.clone()]
        for t in range(fed_BT.shape[1]):
            graph.sample(state, sampling)
            state.next_B.copy_(fed_BT[:, t])
            (compiled or graph.forward)(state)
            state.t.add_(1)
            logits.append(state.logits_BV.clone())
    return logits


def forward_logits(model, ids_BP, mask_BP, fed_BT) -> list[torch.Tensor]:
    """The model's whole forward over prompt + fed tokens: the logits after each column."""
    ids = torch.cat([ids_BP, fed_BT], dim=1)
    mask = torch.cat([mask_BP, torch.ones_like(fed_BT)], dim=1)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    P = ids_BP.shape[1]
    return [logits[:, P - 1 + t] for t in range(fed_BT.shape[1] + 1)]


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_the_step_gives_the_forwards_logits(arch):
    """Every column the step computes (keys / values written in place at its column, the not yet written columns
    masked) gives the logits of the model's own forward over the whole sequence: Llama, Llama 3 rope scaling, Qwen2's
    biased projections, Qwen3's per-head norms."""
    model = build(arch)
    ids_BP, mask_BP = padded_prompts()
    fed_BT = torch.randint(1, V, (4, 6), generator=torch.Generator().manual_seed(2))
    for t, (a, b) in enumerate(zip(step_logits(model, ids_BP, mask_BP, fed_BT),
                                   forward_logits(model, ids_BP, mask_BP, fed_BT), strict=True)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5, msg=lambda m, t=t: f"{arch} column {t}: {m}")


def lora_model(arch: str = "llama", dtype=torch.float32):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(build(arch, dtype=dtype), LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                           "down_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.uniform_(-0.3, 0.3)
    return model.eval()


def test_lora_folded_for_the_rollout_changes_only_rounding():
    """Each LoRA layer's update added into a copy of its weight: the step's logits are the adapter's (fp32, 1e-5),
    differ from the base model's, every projection of every layer is folded, and the model's own weights are left
    exactly as they were."""
    model = lora_model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ids_BP, mask_BP = padded_prompts()
    fed_BT = torch.randint(1, V, (4, 5), generator=torch.Generator().manual_seed(2))
    folded = step_logits(model, ids_BP, mask_BP, fed_BT, fold=True)
    graph = G.GraphStep(model)
    assert len(graph.fold(True)) == 7 * 2 and all(slot is not None for _, _, slot in graph.plan)
    assert graph.fold(False) == [] and all(slot is None for _, _, slot in graph.plan)
    unfolded = step_logits(model, ids_BP, mask_BP, fed_BT, fold=False)
    forward = forward_logits(model, ids_BP, mask_BP, fed_BT)
    for a, b, c in zip(folded, unfolded, forward, strict=True):
        torch.testing.assert_close(a, c, rtol=0, atol=1e-5)
        torch.testing.assert_close(b, c, rtol=0, atol=1e-5)
    with model.disable_adapter():
        base = forward_logits(model, ids_BP, mask_BP, fed_BT)
        assert graph.fold(True) == [] and all(slot is None for _, _, slot in graph.plan)  # adapters off
    assert (folded[-1] - base[-1]).abs().max() > 1e-2
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_lora_folded_in_bf16_moves_log_probs_by_rounding_only():
    """In bf16 the folded weight is rounded once: the sampled tokens' log-probs move by rounding, well under the
    noise of a bf16 forward (the figure for a real model: benchmarks/gpu_check.py)."""
    model = lora_model(dtype=torch.bfloat16)
    ids_BP, mask_BP = padded_prompts()
    fed_BT = torch.randint(1, V, (4, 8), generator=torch.Generator().manual_seed(2))
    folded = step_logits(model, ids_BP, mask_BP, fed_BT, fold=True)
    unfolded = step_logits(model, ids_BP, mask_BP, fed_BT, fold=False)
    diff = max((torch.log_softmax(a.float(), -1) - torch.log_softmax(b.float(), -1)).abs().max().item()
               for a, b in zip(folded[1:], unfolded[1:], strict=True))
    assert 0 < diff < 0.1


class CountOps(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_a_decoding_step_reads_nothing_back_to_the_host(model, tok, name):
    """No op of the step brings a value to the host (`.item()`, `nonzero`, ...): nothing stalls a GPU's launch queue,
    and the step can be captured as a CUDA graph."""
    rollout = RolloutConfig(**SETTINGS[name])
    sampling = G.StepSampling(rollout, do_sample=True, stop_ids=(3, 4), pad_id=tok.pad_token_id)
    ids_BP, mask_BP = left_pad([[5, 6, 7], [8, 9]], tok.pad_token_id, multiple_of=G.PROMPT_BUCKET)
    graph = G.GraphStep(model)
    with generation_mode(model), torch.no_grad():
        state = G.build_state(model, ids_BP, mask_BP, torch.arange(2), sampling, 8, graph.fold(True), None)
        with CountOps() as counted:
            for _ in range(3):
                graph.step(state, sampling)
    assert len(counted.ops) > 50 and not SYNC_OPS & set(counted.ops), sorted(SYNC_OPS & set(counted.ops))


def test_a_decoding_step_imports_nothing(model, tok):
    """The step runs no import statement: inside a compiled graph an import is a break, and torch 2.11's dynamo
    refuses one of transformers' lazy modules outright, which left the step uncompiled and uncaptured on an H200 (the
    warpers were built in the step, `from transformers import ...` each time)."""
    import builtins

    sampling = G.StepSampling(RolloutConfig(**SETTINGS["warpers"]), do_sample=True, stop_ids=(3, 4),
                              pad_id=tok.pad_token_id)
    ids_BP, mask_BP = left_pad([[5, 6, 7], [8, 9]], tok.pad_token_id, multiple_of=G.PROMPT_BUCKET)
    graph = G.GraphStep(model)
    imported, real = [], builtins.__import__
    with generation_mode(model), torch.no_grad():
        state = G.build_state(model, ids_BP, mask_BP, torch.arange(2), sampling, 8, graph.fold(True), None)
        builtins.__import__ = lambda name, *a, **k: imported.append(name) or real(name, *a, **k)
        try:
            for _ in range(3):
                graph.step(state, sampling)
        finally:
            builtins.__import__ = real
    assert sampling.warps and imported == [], imported


def test_the_step_compiles_as_one_graph_that_samples_what_generate_samples(tok):
    """`torch.compile(fullgraph=True)` of the step: one graph, no break (torch._dynamo.explain); the compiled step's
    logits equal the eager step's within 1e-5; decoding with it gives generate's tokens (fp32, the same keys)."""
    model = build_tiny_model(tok, seed=3, hidden=64, layers=2, heads=4, kv_heads=2)
    model.set_attn_implementation("sdpa")
    settings = dict(SETTINGS["warpers"], presence_penalty=0.2)
    rollout = RolloutConfig(k=K, max_new_tokens=NEW, **settings)
    sampling = G.StepSampling(rollout, do_sample=True, stop_ids=(3, 4), pad_id=tok.pad_token_id)
    ids_BP, mask_BP = left_pad([[5, 6, 7], [8, 9], [10, 11, 12, 13]], tok.pad_token_id, multiple_of=G.PROMPT_BUCKET)
    graph = G.graph_step_for(model)
    with generation_mode(model), torch.no_grad():
        state = G.build_state(model, ids_BP, mask_BP, torch.arange(3), sampling, 8, graph.fold(True), None)
        explained = torch._dynamo.explain(lambda s: graph.step(s, sampling))(state)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    torch._dynamo.reset()

    def run(compiled: bool) -> list[torch.Tensor]:
        with generation_mode(model), torch.no_grad():
            state = G.build_state(model, ids_BP, mask_BP, torch.arange(3), sampling, 8, graph.fold(True), None)
            step = G._compiled_step(graph, sampling, state, compiled)
            logits = []
            for _ in range(6):
                step(state)
                logits.append(state.logits_BV.clone())
            return logits + [state.out_BN.clone()]

    eager, compiled = run(False), run(True)
    for a, b in zip(eager[:-1], compiled[:-1], strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)
    assert torch.equal(eager[-1], compiled[-1])
    # the whole engine with the compiled step: generate's tokens
    import grpo.phases.generate

    keys = row_keys(3, 1, range(len(SAMPLES)), K)
    shipped = grpo.phases.generate.decode_graph
    try:
        grpo.phases.generate.decode_graph = lambda *a, **kw: shipped(*a, **kw, compile_step=True)
        out = generate_rollouts(model, tok, SAMPLES, rollout.__class__(**{**rollout.__dict__, "engine": "graph"}),
                                [3, 4], plan=SamplingPlan(row_keys=keys))[0]
    finally:
        grpo.phases.generate.decode_graph = shipped
    hf = generate_rollouts(model, tok, SAMPLES, rollout.__class__(**{**rollout.__dict__, "engine": "hf"}), [3, 4],
                           plan=SamplingPlan(row_keys=keys))[0]
    assert [r.completion_ids for r in out] == [r.completion_ids for r in hf]


def test_the_engine_choice(model, tok):
    """graph where it is asked for and applies; auto picks it on CUDA only (the CPU keeps the lean loop, which is
    faster there); a model it cannot replay is refused by name under graph, and auto falls back."""
    assert choose_engine(model, "graph", "dynamic", synced_gpus=False) == "graph"
    assert choose_engine(model, "auto", "dynamic", synced_gpus=False) == "lean"
    assert choose_engine(model, "auto", "dynamic", synced_gpus=False, on_cuda=True) == "graph"
    assert choose_engine(model, "auto", "static", synced_gpus=False, on_cuda=True) == "hf"
    with pytest.raises(ValueError, match="FSDP"):
        choose_engine(model, "graph", "dynamic", synced_gpus=True)
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=1, n_head=2))
    with pytest.raises(ValueError, match="rollout.engine=graph cannot decode here: GPT2LMHeadModel"):
        choose_engine(gpt2, "graph", "dynamic", synced_gpus=False)
    assert choose_engine(gpt2, "auto", "dynamic", synced_gpus=False, on_cuda=True) == "lean"
    with pytest.raises(ConfigError, match="rollout.engine"):
        RolloutConfig(engine="graph", cache_implementation="static")


def test_a_step_that_fails_to_compile_decodes_eagerly_with_a_warning(tok, monkeypatch):
    """No compiler, an op inductor cannot lower...: the engine warns once, naming the error, and decodes with the
    eager step: the same tokens."""
    model = build_tiny_model(tok, seed=3, hidden=64, layers=2, heads=4, kv_heads=2)
    model.set_attn_implementation("sdpa")

    def decode(**kw):
        return G.decode_graph(model, [[5, 6, 7], [8, 9]], RolloutConfig(temperature=0.7, max_new_tokens=8), (3, 4),
                              tok.pad_token_id, row_keys=[0, 1], graph=G.GraphStep(model), **kw)[0]

    eager = decode(compile_step=False)

    def broken(fn, **kw):
        def fails(*args):
            raise RuntimeError("inductor: no C++ compiler found")
        return fails

    monkeypatch.setattr(torch, "compile", broken)
    with pytest.warns(RuntimeWarning, match="compiling the decoding step failed .*no C\\+\\+ compiler"):
        assert decode(compile_step=True) == eager


def test_a_step_that_failed_to_compile_is_not_compiled_again(tok, monkeypatch, capsys):
    """A compile that failed is not tried at the next rollout of the same settings: torch retries a failed compile at
    every call of the compiled function, and on an H200 with torch 2.11 each retry of inductor's failing codegen cost
    ~25 s a rollout (191 ms a decode step instead of 5.5)."""
    model = build_tiny_model(tok, seed=3, hidden=64, layers=2, heads=4, kv_heads=2)
    model.set_attn_implementation("sdpa")
    graph, tries = G.GraphStep(model), []

    def broken(fn, **kw):
        def fails(*args):
            tries.append(1)
            raise RuntimeError("inductor: codegen failed")
        return fails

    monkeypatch.setattr(torch, "compile", broken)
    monkeypatch.setattr(G, "_ANNOUNCED", set())
    rollout = RolloutConfig(temperature=0.7, max_new_tokens=8)
    with warnings.catch_warnings():  # the warning is said once per process (the test above may have had it)
        warnings.simplefilter("ignore", RuntimeWarning)
        outs = [G.decode_graph(model, [[5, 6, 7], [8, 9]], rollout, (3, 4), tok.pad_token_id, row_keys=[0, 1],
                               graph=graph, compile_step=True)[0] for _ in range(3)]
    assert len(tries) == 1 and outs[0] == outs[1] == outs[2]
    assert "(compiled: False, CUDA graph: False)" in capsys.readouterr().out  # what runs, not what was asked for


class FakeCaptured:
    """Stands in for a CUDA graph on the CPU: made once per capture (counted), it replays the step it was made with on
    the state it was made with, as a CUDA graph replays fixed addresses. A rollout that laid out new buffers instead
    of writing into the captured ones would decode the old buffers and give other tokens."""

    made = 0
    warmups: list[int] = []

    def __init__(self, fn, state, mutable, pool=None, warmup=2):
        FakeCaptured.made += 1
        FakeCaptured.warmups.append(warmup)
        self.fn, self.state = fn, state

    def __call__(self, state):
        self.fn(self.state)


def replayed_engine(model, monkeypatch):
    """A GraphStep that compiles with torch's eager backend (dynamo traces and counts the graphs, nothing is
    generated) and 'captures' with FakeCaptured."""
    monkeypatch.setattr(G, "Captured", FakeCaptured)
    monkeypatch.setattr(FakeCaptured, "made", 0)
    monkeypatch.setattr(FakeCaptured, "warmups", [])
    graph = G.GraphStep(model)
    graph.backend = "eager"
    graph.pool = lambda: None
    return graph


SHORT = [[5, 6, 7], [8, 9], [10, 11, 12]]
LONG = [list(range(5, 75)), [8, 9], [10, 11]]  # 70 tokens: the next prompt bucket (128 columns)


def decode_rows(model, rows, graph, keys, **kw):
    rollout = RolloutConfig(temperature=0.8, top_k=50, max_new_tokens=8, **kw)
    return G.decode_graph(model, rows, rollout, (3, 4), 0, row_keys=keys, graph=graph, compile_step=graph.backend
                          is not None, capture=graph.backend is not None)[0]


def test_five_rollouts_over_two_prompt_buckets_compile_once_and_capture_twice(tok, monkeypatch):
    """Rollouts alternating between two prompt buckets: the step is compiled once (on a stand-in whose rows and
    columns are dynamic: one graph for every shape), each shape's buffers are laid out and captured once and refilled
    by its later rollouts, and every rollout gives the tokens a fresh engine gives for the same keys."""
    torch._dynamo.reset()
    model = build_tiny_model(tok, seed=3, hidden=64, layers=2, heads=4, kv_heads=2)
    model.set_attn_implementation("sdpa")
    graph = replayed_engine(model, monkeypatch)
    calls = [SHORT, LONG, SHORT, LONG, SHORT]
    keys = [[10 * i + r for r in range(3)] for i in range(len(calls))]
    kept = [decode_rows(model, rows, graph, k) for rows, k in zip(calls, keys, strict=True)]
    assert (graph.counts["compiles"], graph.counts["captures"], FakeCaptured.made) == (1, 2, 2), graph.counts
    assert len(graph.slots) == 2 and graph.counts["fallbacks"] == 0
    fresh = [G.decode_graph(model, rows, RolloutConfig(temperature=0.8, top_k=50, max_new_tokens=8), (3, 4), 0,
                            row_keys=k, graph=G.GraphStep(model), compile_step=False)[0]
             for rows, k in zip(calls, keys, strict=True)]
    assert kept == fresh
    assert len({tuple(map(tuple, out)) for out in kept}) == len(calls)  # the keys made every rollout differ
    torch._dynamo.reset()


def test_no_rollout_buffer_outlives_its_slot_once_the_step_is_compiled(tok, monkeypatch):
    """torch keeps the inputs it compiled a function on (its shape environment holds them); the step is compiled on a
    small stand-in, so a rollout's KV buffers are freed with their slot: none is left after a greedy call (no slot
    kept) nor after the kept slots are released. On an H200 a compile on the rollout's own buffers kept them alive."""
    import gc

    torch._dynamo.reset()
    model = build_tiny_model(tok, seed=3, hidden=64, layers=2, heads=4, kv_heads=2)
    model.set_attn_implementation("sdpa")
    graph = replayed_engine(model, monkeypatch)

    def alive(columns: int) -> int:
        gc.collect()
        return sum(isinstance(o, torch.Tensor) and o.dim() == 4 and o.shape[2] == columns for o in gc.get_objects())

    G.decode_graph(model, LONG, RolloutConfig(max_new_tokens=8), (3, 4), 0, greedy=True, graph=graph,
                   compile_step=True, capture=False)
    assert graph.counts["compiles"] == 1 and alive(128 + 8) == 0
    decode_rows(model, SHORT, graph, [1, 2, 3])
    assert graph.counts["compiles"] == 2 and alive(64 + 8) == 2 * 2  # the kept slot: K and V of 2 layers
    graph.release()
    assert alive(64 + 8) == 0
    torch._dynamo.reset()


def test_a_slot_is_laid_out_again_when_the_weights_move_and_greedy_calls_keep_none(tok, monkeypatch):
    """A captured step reads the model's tensors where they lay: after they move (a cast, a reload) the next rollout
    lays out and captures its shape anew. Greedy calls (evaluation batches of many shapes) keep no slot."""
    model = build_tiny_model(tok, seed=3, hidden=64, layers=2, heads=4, kv_heads=2)
    model.set_attn_implementation("sdpa")
    graph = replayed_engine(model, monkeypatch)
    first = decode_rows(model, SHORT, graph, [1, 2, 3])
    with torch.no_grad():
        for p in model.parameters():
            p.data = p.data.clone()  # same values, new addresses
    again = decode_rows(model, SHORT, graph, [1, 2, 3])
    assert first == again and FakeCaptured.made == 2 and len(graph.slots) == 1
    G.decode_graph(model, LONG, RolloutConfig(max_new_tokens=8), (3, 4), 0, greedy=True, graph=graph,
                   compile_step=False)
    assert len(graph.slots) == 1


def test_kept_slots_hold_at_most_twice_the_largest_one(tok):
    """Four prompt buckets in turn: the least recently used slots go once the kept ones hold more than
    GRAPH_CACHE_SLOTS times the largest one's bytes."""
    model = build_tiny_model(tok, seed=3, hidden=64, layers=2, heads=4, kv_heads=2)
    graph = G.GraphStep(model)
    graph.backend = None  # eager step, no capture
    for width in (3, 70, 130, 200):  # buckets of 64, 128, 192 and 256 columns
        decode_rows(model, [list(range(5, 5 + width)), [8, 9]], graph, [1, 2])
    sizes = [G.state_bytes(slot.state) for slot in graph.slots.values()]
    assert [key[2] for key in graph.slots] == [192, 256]
    assert sum(sizes) <= G.GRAPH_CACHE_SLOTS * max(sizes)
    assert graph.release() == sum(sizes) and not graph.slots


def test_a_slot_that_reads_folded_lora_weights_is_captured_again_with_the_new_adapters(monkeypatch):
    """LoRA folded for the rollout: the copies live for the rollout only (the update gets their memory back), so a
    kept slot's captured step is captured again, without a warm-up, at the next rollout, and decodes with the
    adapters the last update left; the compile is not repeated."""
    model = lora_model()
    graph = replayed_engine(model, monkeypatch)
    rows, keys = [[5, 6, 7], [8, 9, 10, 11]], [4, 5]
    before = decode_rows(model, rows, graph, keys, fold_lora="on")
    assert not next(iter(graph.slots.values())).state.folded  # freed with the rollout
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(-1.5)  # an update, in place
    after = decode_rows(model, rows, graph, keys, fold_lora="on")
    assert (graph.counts["compiles"], graph.counts["captures"], graph.counts["recaptures"]) == (1, 1, 1)
    assert FakeCaptured.warmups == [2, 0]
    fresh = G.decode_graph(model, rows, RolloutConfig(temperature=0.8, top_k=50, max_new_tokens=8, fold_lora="on"),
                           (3, 4), 0, row_keys=keys, graph=G.GraphStep(model), compile_step=False)[0]
    assert after == fresh and after != before


def test_a_run_counts_what_the_graph_engine_did_and_an_out_of_memory_retry_frees_its_buffers(tmp_path, monkeypatch):
    """Through the trainer (rollout.engine=graph on the CPU: eager, no capture): each step's rollout/graph_* counts,
    the rollout's shape kept between steps, and a CUDA out-of-memory error in the update frees the kept buffers and
    keeps none from then on."""
    import grpo.phases.update as U
    import grpo_train
    from tests.trainer_helpers import fast_config

    run = grpo_train.setup(fast_config(tmp_path, "rollout.engine=graph", "train.max_steps=3"))
    first = grpo_train.rl_step(run, 1)
    assert {k: first[k] for k in first if k.startswith("rollout/graph_")} == {
        "rollout/graph_compiles": 0.0, "rollout/graph_captures": 0.0, "rollout/graph_recaptures": 0.0,
        "rollout/graph_fallbacks": 0.0}
    graph = G.graph_step_for(run.policy.model)
    assert len(graph.slots) == 1
    real, oom = U.completion_logprobs, {"left": 1}

    def flaky(model, *a, **k):
        if oom["left"] and model.training:
            oom["left"] -= 1
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(model, *a, **k)

    monkeypatch.setattr(U, "completion_logprobs", flaky)
    assert grpo_train.rl_step(run, 2)["health/oom_retries"] == 1.0
    assert not graph.slots and graph.keep_bytes == 0
    grpo_train.rl_step(run, 3)
    assert not graph.slots
    run.tracker.close()
