"""The lean decoding loop (grpo/decoding/decode.py): transformers' generate token for token, stopped rows dropped from
the batch, dropout off, and the choice between the two engines."""

from dataclasses import replace

import pytest
import torch

from grpo.config import Config, ConfigError, RolloutConfig
from grpo.core.step_types import Sample
from grpo.decoding.decode import distinct_rows, lean_blocker
from grpo.decoding.sampling import keyed_choice, row_keys
from grpo.models.modeling import build_tiny_model, build_tiny_tokenizer
from grpo.models.tokens import left_pad
from grpo.phases.generate import SamplingPlan, choose_engine, cut_completion, generate_rollouts, greedy_complete

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
    forward on both engines (the lean loop's layer-by-layer forward calls the layers, not the model's forward)."""
    sizes: list[int] = []
    handle = model.lm_head.register_forward_pre_hook(lambda module, args: sizes.append(int(args[0].shape[0])))
    return sizes, handle


class CompletionPenalty:
    """Presence and frequency penalties over the completion tokens only, from their definition (OpenAI's API
    reference): the test's own, independent of the package's sampler."""

    def __init__(self, prompt_len: int, presence: float, frequency: float):
        self.prompt_len, self.presence, self.frequency = prompt_len, presence, frequency

    def __call__(self, input_ids, scores_BV):
        completion_BN = input_ids[:, self.prompt_len:]
        counts_BV = torch.zeros_like(scores_BV)
        counts_BV.scatter_add_(1, completion_BN, torch.ones_like(completion_BN, dtype=scores_BV.dtype))
        return scores_BV - self.frequency * counts_BV - self.presence * (counts_BV > 0).to(scores_BV.dtype)


class KeyedDraw:
    """The last processor given row keys: transformers' warpers, then the exponential race over each row's key,
    returned one-hot so that generate, decoding greedily, emits the drawn token."""

    def __init__(self, keys, prompt_len: int, rollout: RolloutConfig):
        from transformers import MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

        self.keys_B, self.prompt_len = torch.tensor(list(keys)), prompt_len
        self.warps = [w for w, on in ((TemperatureLogitsWarper(rollout.temperature), rollout.temperature != 1.0),
                                      (TopKLogitsWarper(max(rollout.top_k, 1)), rollout.top_k > 0),
                                      (TopPLogitsWarper(rollout.top_p), rollout.top_p < 1.0),
                                      (MinPLogitsWarper(rollout.min_p), rollout.min_p > 0)) if on]

    def __call__(self, input_ids, scores_BV):
        for warp in self.warps:
            scores_BV = warp(input_ids, scores_BV)
        choice_B = keyed_choice(scores_BV, self.keys_B, int(input_ids.shape[1]) - self.prompt_len)
        return torch.full_like(scores_BV, float("-inf")).scatter_(1, choice_B[:, None], 0.0)


def transformers_reference(model, rows, rollout: RolloutConfig, stops, pad_id: int, *, greedy: bool = False,
                           keys=None, seed: int = 0) -> list[tuple[tuple[int, ...], bool]]:
    """(completion ids, stopped) of each row as transformers' own `generate` samples them: its own repetition
    penalty, min_new_tokens, warpers and multinomial draw (seeded), the completion-only penalties as a caller's
    processor, or, given row keys, the keyed race as the last processor. What the engines' one sampler must equal."""
    from transformers import GenerationConfig, LogitsProcessorList

    ids_BP, mask_BP = left_pad(rows, pad_id)
    P = ids_BP.shape[1]
    sample = not greedy and keys is None
    extra = dict(temperature=rollout.temperature, top_k=rollout.top_k, top_p=rollout.top_p,
                 **({"min_p": rollout.min_p} if rollout.min_p else {})) if sample else {}
    config = GenerationConfig(do_sample=sample, max_new_tokens=rollout.max_new_tokens,
                              min_new_tokens=rollout.min_new_tokens, repetition_penalty=rollout.repetition_penalty,
                              eos_token_id=list(stops), pad_token_id=pad_id, **extra)
    processors = [CompletionPenalty(P, rollout.presence_penalty, rollout.frequency_penalty)]
    if keys is not None and not greedy:
        processors.append(KeyedDraw(keys, P, rollout))
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        out = model.generate(input_ids=ids_BP, attention_mask=mask_BP, generation_config=config,
                             logits_processor=LogitsProcessorList(processors))
    return [(tuple(ids), stopped) for ids, stopped in (cut_completion(row, stops) for row in out[:, P:].tolist())]


SETTINGS = {    "plain": {},
    "warpers": {"temperature": 0.7, "top_k": 20, "top_p": 0.9, "min_p": 0.02, "repetition_penalty": 1.3,
                "min_new_tokens": 3},
    "penalties": {"temperature": 1.5, "presence_penalty": 0.5, "frequency_penalty": 0.3, "repetition_penalty": 0.8},
    "greedy": {},  # greedy_complete: one completion per prompt
}


@pytest.mark.parametrize("forward_kind", ["LayerForward", "WholeForward"])
@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_lean_loop_samples_what_generate_samples(model, tok, stops, greedy_stops, name, forward_kind, monkeypatch):
    """Same seed, same settings: the lean loop, the hf engine (generate through the one sampler) and transformers'
    own generate (its processors and sampler: `transformers_reference`) give the same tokens, row for row, also
    after rows stopped and were dropped from the model's batch (here as soon as any row stops, so every setting
    runs through several compactions), with the prefill computed once per distinct prompt. Both kinds of one-token
    forward: the Llama family's LayerForward, and the model's whole forward (WholeForward, what every other model
    gets)."""
    import grpo.decoding.decode
    import grpo.decoding.token_forward

    monkeypatch.setattr(grpo.decoding.decode, "COMPACT_FRACTION", 0.99)
    if forward_kind == "WholeForward":
        monkeypatch.setattr(grpo.decoding.token_forward, "LAYER_FORWARD_ARCHITECTURES", frozenset())
    made: list[str] = []
    shipped = grpo.decoding.decode.token_forward

    def spy(*args, **kwargs):
        made.append(type(forward_one := shipped(*args, **kwargs)).__name__)
        return forward_one

    monkeypatch.setattr(grpo.decoding.decode, "token_forward", spy)
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
            prompts = [r.prompt_ids for r in rollouts]
            reference = transformers_reference(model, prompts, rollout, greedy_stops if name == "greedy" else stops,
                                               tok.pad_token_id, greedy=name == "greedy", seed=seed)
            assert out["lean"][0] == out["hf"][0] == reference, (name, seed)
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
    assert set(made) == {forward_kind}


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
    """The per-completion sampler (grpo/decoding/sampling.py): the same tokens from the lean loop, the hf engine and
    transformers' own generate with the keyed race as its last processor."""
    keys = row_keys(0, 1, range(len(SAMPLES)), K)
    rollout = RolloutConfig(k=K, max_new_tokens=NEW, top_p=0.95, presence_penalty=0.3)
    out = {engine: generate_rollouts(model, tok, SAMPLES, replace(rollout, engine=engine), stops,
                                     plan=SamplingPlan(row_keys=keys))[0]
           for engine in ("hf", "lean")}
    reference = transformers_reference(model, [r.prompt_ids for r in out["lean"]], rollout, stops, tok.pad_token_id,
                                       keys=keys)
    assert [(r.completion_ids, r.stopped) for r in out["lean"]] == reference
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


def test_the_one_sampler_carries_every_setting(model, tok, monkeypatch):
    """What every engine hands `next_token`: the rollout section with its values, transformers' warpers in
    generate's order, the stop ids, the penalties' history where a penalty is on; neutral values add nothing, and
    greedy decoding drops the warps."""
    from transformers import MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    import grpo.decoding.decode as D
    from grpo.decoding.next_token import StepSampling

    seen = []
    original = D.next_token

    def spy(scores_BV, sampling, t, **kw):
        seen.append((sampling, t, kw))
        return original(scores_BV, sampling, t, **kw)

    monkeypatch.setattr(D, "next_token", spy)
    rollout = RolloutConfig(k=2, temperature=0.7, top_k=5, top_p=0.9, min_p=0.05, repetition_penalty=1.3,
                            presence_penalty=0.2, max_new_tokens=6, min_new_tokens=2, engine="lean")
    rollouts, _ = generate_rollouts(model, tok, SAMPLES, rollout, [4, 5])
    sampling, _, kw = seen[0]
    assert [type(w) for w in sampling.warps] == [TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper,
                                                 MinPLogitsWarper]
    temp, top_k, top_p, min_p = sampling.warps
    assert (temp.temperature, top_k.top_k, top_p.top_p, min_p.min_p) == (0.7, 5, 0.9, 0.05)
    assert sampling.rollout is rollout and sampling.do_sample and sampling.stop_ids == (4, 5)
    assert kw["stops_S"].tolist() == [4, 5] and kw["seen_BV"] is not None and kw["counts_BV"] is not None
    assert [t for _, t, _ in seen] == list(range(len(seen)))  # one call per token, the step counted from 0
    assert max(len(r.completion_ids) for r in rollouts) <= 6
    neutral = RolloutConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    assert StepSampling(neutral, do_sample=True, stop_ids=(4,), pad_id=0).warps == []
    hot = replace(neutral, temperature=0.5, top_k=3)
    assert StepSampling(hot, do_sample=False, stop_ids=(4,), pad_id=0).warps == []
    seen.clear()
    generate_rollouts(model, tok, SAMPLES, replace(rollout, repetition_penalty=1.0, presence_penalty=0.0), [4, 5])
    assert seen[0][2]["seen_BV"] is None and seen[0][2]["counts_BV"] is None  # penalties off: no history kept


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
