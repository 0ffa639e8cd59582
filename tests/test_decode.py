"""The lean decoding loop (grpo/decoding/decode.py): transformers' generate token for token, stopped rows dropped from
the batch, dropout off, and the choice between the two engines."""

from dataclasses import replace

import pytest
import torch

from grpo.config import Config, ConfigError, RolloutConfig
from grpo.core.step_types import Sample
from grpo.decoding.decode import (
    CompletionPenaltyProcessor,
    SanitizeLogitsProcessor,
    distinct_rows,
    lean_blocker,
    sampling_processors,
)
from grpo.decoding.sampling import row_keys
from grpo.models.modeling import build_tiny_model, build_tiny_tokenizer
from grpo.phases.generate import SamplingPlan, choose_engine, generate_rollouts, greedy_complete

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
CORPUS = ["the answer is yes", "the answer is no", "who was more likely to forget the keys?"] * 5
NEW = 16
K = 4
SAMPLES = [Sample("fairness", str(i), ({"role": "user", "content": text},))
           for i, text in enumerate(["who forgot?", "the answer is a much longer one than this", "no", "keys"])]


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer(CORPUS, vocab_size=300)


def tiny_model(tok, attn: str):
    model = build_tiny_model(tok, seed=3, hidden=64, layers=2, heads=4, kv_heads=2)
    model.set_attn_implementation(attn)
    return model


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def model(request, tok):
    return tiny_model(tok, request.param)


def most_sampled(model, tok) -> list[int]:
    """The three tokens the model samples most: as stop ids they end completions at many different lengths."""
    rollout = RolloutConfig(k=K, max_new_tokens=NEW, engine="hf")
    rollouts, _ = generate_rollouts(model, tok, SAMPLES, rollout, [tok.pad_token_id],
                                    plan=SamplingPlan(generator_seed=0))
    ids, counts = torch.tensor([t for r in rollouts for t in r.completion_ids]).unique(return_counts=True)
    return ids[counts.argsort(descending=True)[:3]].tolist()


@pytest.fixture(scope="module")
def stops(model, tok):
    return most_sampled(model, tok)


@pytest.fixture(scope="module")
def greedy_stops(model, tok):
    """For greedy decoding: from prompt j's greedy completion, the first new token at or after position 3j + 1, so
    the four prompts end at different lengths."""
    rollouts, _ = greedy_complete(model, tok, SAMPLES, RolloutConfig(max_new_tokens=NEW, engine="hf"),
                                  [tok.pad_token_id])
    stops = []
    for j, r in enumerate(rollouts):
        ids = r.completion_ids
        new = [t for t in range(3 * j + 1, len(ids)) if ids[t] not in ids[:t]]
        if new:
            stops.append(ids[new[0]])
    return stops


def rows_per_forward(model) -> tuple[list[int], object]:
    """Batch size of every forward (filled in as the model runs) and the hook handle. The LM head runs once per
    forward on both engines (the lean loop's fast steps call the layers, not the model's forward)."""
    sizes: list[int] = []
    handle = model.lm_head.register_forward_pre_hook(lambda module, args: sizes.append(int(args[0].shape[0])))
    return sizes, handle


SETTINGS = {
    "plain": {},
    "warpers": {"temperature": 0.7, "top_k": 20, "top_p": 0.9, "min_p": 0.02, "repetition_penalty": 1.3,
                "min_new_tokens": 3},
    "penalties": {"temperature": 1.5, "presence_penalty": 0.5, "frequency_penalty": 0.3, "repetition_penalty": 0.8},
    "greedy": {},  # greedy_complete: one completion per prompt
}


@pytest.mark.parametrize("steps", ["FastSteps", "HFSteps"])
@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_lean_loop_samples_what_generate_samples(model, tok, stops, greedy_stops, name, steps, monkeypatch):
    """Same seed, same settings: the lean loop and transformers' generate give the same tokens, row for row, also
    after rows stopped and were dropped from the model's batch (here as soon as any row stops, so every setting
    runs through several compactions), with the prefill computed once per distinct prompt. Both kinds of decoding step:
    the Llama family's FastSteps, and the model's whole forward (HFSteps, what every other model gets)."""
    import grpo.decoding.decode
    import grpo.decoding.decode_steps

    monkeypatch.setattr(grpo.decoding.decode, "COMPACT_FRACTION", 0.99)
    if steps == "HFSteps":
        monkeypatch.setattr(grpo.decoding.decode_steps, "FAST_STEP_ARCHITECTURES", frozenset())
    made: list[str] = []
    shipped = grpo.decoding.decode.make_steps

    def spy(*args, **kwargs):
        made.append(type(stepper := shipped(*args, **kwargs)).__name__)
        return stepper

    monkeypatch.setattr(grpo.decoding.decode, "make_steps", spy)
    sizes, handle = rows_per_forward(model)
    lengths, shrank = set(), False
    try:
        for seed in range(3):
            out = {}
            for engine in ("hf", "lean"):
                rollout = RolloutConfig(k=K, max_new_tokens=NEW, engine=engine, **SETTINGS[name])
                sizes.clear()
                if name == "greedy":
                    rollouts, _ = greedy_complete(model, tok, SAMPLES, rollout, greedy_stops)
                else:
                    rollouts, _ = generate_rollouts(model, tok, SAMPLES, rollout, stops,
                                                    plan=SamplingPlan(generator_seed=seed))
                out[engine] = [(r.completion_ids, r.stopped) for r in rollouts], list(sizes)
            assert out["lean"][0] == out["hf"][0], (name, seed)
            lean_sizes = out["lean"][1]
            rows = len(SAMPLES) * (1 if name == "greedy" else K)
            # the prefill computes each distinct prompt once (the K repeats share it), every step the running rows
            assert lean_sizes[0] == len(SAMPLES)
            assert lean_sizes[1] == rows and lean_sizes[1:] == sorted(lean_sizes[1:], reverse=True)
            shrank |= min(lean_sizes[1:]) < rows
            lengths |= {len(c) for c, _ in out["lean"][0]}
            assert set(out["hf"][1]) == {rows}  # generate computes every row to the end
    finally:
        handle.remove()
    assert len(lengths) > 2 and shrank  # rows ended at different lengths, and the lean loop dropped stopped rows
    assert set(made) == {steps}


def test_distinct_rows_maps_every_row_to_the_first_row_like_it():
    """Rows are alike when ids AND mask are: row 3 has row 0's ids, but its first column is a real token (a pad id
    inside a prompt, as with SmolLM2, whose pad is its end-of-turn token), not padding."""
    ids = torch.tensor([[0, 5, 6], [0, 5, 6], [7, 8, 9], [0, 5, 6], [0, 5, 6]])
    mask = torch.tensor([[0, 1, 1], [0, 1, 1], [1, 1, 1], [1, 1, 1], [0, 1, 1]])
    first_U, src_B = distinct_rows(ids, mask)
    assert first_U.tolist() == [0, 2, 3] and src_B.tolist() == [0, 0, 1, 2, 0]
    assert torch.equal(ids[first_U][src_B], ids) and torch.equal(mask[first_U][src_B], mask)
    assert distinct_rows(ids[1:4], mask[1:4]) is None  # every row distinct: nothing to share


def test_lean_loop_with_per_completion_keys_equals_generate(model, tok, stops):
    """The per-completion sampler (grpo/decoding/sampling.py) is one of the caller's processors: same tokens on both."""
    keys = row_keys(0, 1, range(len(SAMPLES)), K)
    out = {engine: generate_rollouts(model, tok, SAMPLES, RolloutConfig(k=K, max_new_tokens=NEW, top_p=0.95,
                                                                         engine=engine), stops,
                                     plan=SamplingPlan(row_keys=keys))[0]
           for engine in ("hf", "lean")}
    assert [r.completion_ids for r in out["lean"]] == [r.completion_ids for r in out["hf"]]


def test_deferred_stop_checks_change_nothing(model, tok, stops, monkeypatch):
    """On an accelerator the loop reads "rows still running" every 8 steps (no host sync per step); the extra steps
    after the last stop only append padding, so the rollouts are the same."""
    import grpo.decoding.decode

    rollout = RolloutConfig(k=K, max_new_tokens=NEW, engine="lean")
    every_step = generate_rollouts(model, tok, SAMPLES, rollout, stops, plan=SamplingPlan(generator_seed=1))[0]
    monkeypatch.setattr(grpo.decoding.decode, "_sync_every", lambda device: 3)
    deferred = generate_rollouts(model, tok, SAMPLES, rollout, stops, plan=SamplingPlan(generator_seed=1))[0]
    assert [(r.completion_ids, r.stopped) for r in deferred] == [(r.completion_ids, r.stopped) for r in every_step]


def test_dropout_is_off_while_decoding(tok):
    """A model with attention dropout 0.5, left in train mode: greedy decoding must not depend on the RNG, and the
    train mode comes back."""
    model = tiny_model(tok, "eager")
    model.config.attention_dropout = 0.5
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.5
    model.train()
    rollout = RolloutConfig(max_new_tokens=NEW, min_new_tokens=NEW, engine="lean")
    torch.manual_seed(1)
    first = greedy_complete(model, tok, SAMPLES, rollout)[0]
    torch.manual_seed(2)
    second = greedy_complete(model, tok, SAMPLES, rollout)[0]
    assert [r.completion_ids for r in first] == [r.completion_ids for r in second]
    assert model.training


def test_the_lean_processors_carry_every_setting(model, tok, monkeypatch):
    """The processors handed to the loop: generate's, with its values, in its order, ours in between."""
    from transformers import (
        MinNewTokensLengthLogitsProcessor,
        MinPLogitsWarper,
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    import grpo.decoding.decode as D

    seen = {}
    original = D.sampling_processors

    def spy(rollout, **kw):
        processors = original(rollout, **kw)
        seen.update(processors=list(processors), **kw)
        return processors

    monkeypatch.setattr(D, "sampling_processors", spy)
    rollout = RolloutConfig(k=2, temperature=0.7, top_k=5, top_p=0.9, min_p=0.05, repetition_penalty=1.3,
                            presence_penalty=0.2, max_new_tokens=6, min_new_tokens=2)
    rollouts, _ = generate_rollouts(model, tok, SAMPLES, rollout, [4, 5])
    kinds = [type(p) for p in seen["processors"]]
    assert kinds == [RepetitionPenaltyLogitsProcessor, MinNewTokensLengthLogitsProcessor, CompletionPenaltyProcessor,
                     SanitizeLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper,
                     MinPLogitsWarper]
    rep, min_new, penalty, _, temp, top_k, top_p, min_p = seen["processors"]
    assert (rep.penalty, min_new.min_new_tokens, min_new.eos_token_id.tolist()) == (1.3, 2, [4, 5])
    assert (penalty.presence, temp.temperature, top_k.top_k, top_p.top_p, min_p.min_p) == (0.2, 0.7, 5, 0.9, 0.05)
    assert (list(seen["stop_ids"]), seen["do_sample"]) == ([4, 5], True)
    assert max(len(r.completion_ids) for r in rollouts) <= 6
    # neutral values add nothing, as in generate; greedy drops the sampling warpers
    mask = torch.ones(1, 3, dtype=torch.long)
    neutral = RolloutConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0, min_new_tokens=0)
    at = dict(prompt_len=3, mask_BP=mask, stop_ids=[4])
    assert sampling_processors(neutral, do_sample=True, **at) == []
    assert sampling_processors(replace(neutral, temperature=0.5, top_k=3), do_sample=False, **at) == []


def test_the_engine_is_chosen_by_what_applies(model, tok):
    assert choose_engine(model, "auto", "dynamic", synced_gpus=False) == "lean"
    assert choose_engine(model, "hf", "dynamic", synced_gpus=False) == "hf"
    assert choose_engine(model, "auto", "static", synced_gpus=False) == "hf"
    assert choose_engine(model, "auto", "dynamic", synced_gpus=True) == "hf"
    with pytest.raises(ValueError, match="FSDP"):
        choose_engine(model, "lean", "dynamic", synced_gpus=True)
    # a model that prepares its own generation inputs (Phi-3 switches its rotary scaling there): generate decodes
    from transformers import Phi3Config, Phi3ForCausalLM

    phi3 = Phi3ForCausalLM(Phi3Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, pad_token_id=tok.pad_token_id))
    assert "prepare_inputs_for_generation" in lean_blocker(phi3, "dynamic", False)
    assert choose_engine(phi3, "auto", "dynamic", synced_gpus=False) == "hf"
    # a generation_config.json field generate would merge in and the lean loop would not apply: generate decodes
    model.generation_config.no_repeat_ngram_size = 2
    try:
        assert "no_repeat_ngram_size" in lean_blocker(model, "dynamic", False)
        assert choose_engine(model, "auto", "dynamic", synced_gpus=False) == "hf"
    finally:
        model.generation_config.no_repeat_ngram_size = 0


def test_config_refuses_an_engine_that_cannot_apply():
    from grpo.run.assembly.config_check import check_config

    with pytest.raises(ConfigError, match="rollout.engine"):
        RolloutConfig(engine="lean", cache_implementation="static")
    with pytest.raises(ConfigError, match="rollout.engine"):
        check_config(Config(rollout=RolloutConfig(engine="vllm")))
    assert RolloutConfig().engine == "auto"


def test_sliding_window_models_decode_like_generate(tok):
    """Mistral-style sliding-window attention (a window of 4, shorter than the prompts): the masks and caches stop
    at the window, so the lean loop leaves the step masks to transformers; the tokens are generate's."""
    from transformers import AutoModelForCausalLM, MistralConfig

    from grpo.models.modeling import has_sliding_window

    config = MistralConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, sliding_window=4,
                           pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    assert has_sliding_window(model.config) and not has_sliding_window(tiny_model(tok, "sdpa").config)
    out = {}
    for engine in ("hf", "lean"):
        rollout = RolloutConfig(k=2, max_new_tokens=NEW, min_new_tokens=NEW, engine=engine)
        out[engine] = [r.completion_ids
                       for r in generate_rollouts(model, tok, SAMPLES, rollout, plan=SamplingPlan(generator_seed=3))[0]]
    assert out["lean"] == out["hf"]
