"""Rollouts: batching and order, sampling settings reaching the sampler, penalties, sanitiser, stop tokens."""

import pytest
import torch

from grpo.config import ConfigError, ModelConfig, RolloutConfig
from grpo.core.step_types import Rollout, Sample
from grpo.decoding.next_token import (
    NAN_LOGIT,
    NEGINF_LOGIT,
    POSINF_LOGIT,
    StepSampling,
    penalised,
    penalty_history,
    remember,
    sanitised,
)
from grpo.models.modeling import build_tiny_model, build_tiny_tokenizer
from grpo.models.tokens import encode_prompt, sft_example
from grpo.phases.generate import (
    STATIC_PROMPT_BUCKET,
    SamplingPlan,
    build_generation_config,
    generate_rollouts,
    greedy_complete,
    rollout_metrics,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
CORPUS = ["the answer is yes", "the answer is no", "who was more likely to forget the keys?"] * 5
NEW = 12


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer(CORPUS, vocab_size=300)


@pytest.fixture(scope="module")
def model(tok):
    m = build_tiny_model(tok, seed=3, hidden=64, layers=2, heads=4, kv_heads=2)
    m.train()  # rollouts must switch to eval themselves and give the train state back
    return m


@pytest.fixture(scope="module")
def samples():
    return [Sample("fairness", "a", ({"role": "user", "content": "who forgot?"},)),
            Sample("hallucination", "b", ({"role": "user", "content": "the answer is a much longer one"},))]


def completions(rollouts):
    return [r.completion_ids for r in rollouts]


def greedy(model, tok, samples, **kw):
    # min_new_tokens = max_new_tokens masks the stop token: every completion has exactly NEW tokens
    return greedy_complete(model, tok, samples, RolloutConfig(max_new_tokens=NEW, min_new_tokens=NEW, **kw))[0]


def sample(model, tok, samples, seed, k=2, **kw):
    rollout = RolloutConfig(k=k, max_new_tokens=NEW, min_new_tokens=NEW, **kw)
    return generate_rollouts(model, tok, samples, rollout, plan=SamplingPlan(generator_seed=seed))[0]


def repeat(ids, k=2):
    """Each completion k times: what k samples per prompt give when sampling is greedy."""
    return [x for x in ids for _ in range(k)]


def test_penalties_count_completion_tokens_only():
    # prompt = [7, 3], completion so far = [3, 5, 3]
    rollout = RolloutConfig(presence_penalty=0.5, frequency_penalty=0.25)
    sampling = StepSampling(rollout, do_sample=True, stop_ids=(0,), pad_id=0)
    seen_BV, counts_BV = penalty_history(torch.tensor([[7, 3]]), torch.ones(1, 2), 8, rollout)
    for token in (3, 5, 3):
        remember(torch.tensor([token]), seen_BV, counts_BV)
    scores = penalised(torch.zeros(1, 8), sampling, 3, torch.tensor([0]), seen_BV, counts_BV)
    expected = torch.zeros(1, 8)
    expected[0, 3] = -(2 * 0.25 + 0.5)  # generated twice: 2 × frequency + presence (its prompt copy not counted)
    expected[0, 5] = -(0.25 + 0.5)  # generated once
    # token 7 appears only in the prompt: untouched
    assert seen_BV is None and torch.equal(scores, expected)


def test_repetition_penalty_counts_the_prompts_real_tokens_and_the_completion():
    """CTRL's penalty, by hand: a seen positive logit divided by 1.5, a seen negative one multiplied; the left
    padding (id 2 under a 0 in the mask) is not seen, as in generate."""
    rollout = RolloutConfig(repetition_penalty=1.5)
    sampling = StepSampling(rollout, do_sample=True, stop_ids=(0,), pad_id=0)
    seen_BV, counts_BV = penalty_history(torch.tensor([[2, 4, 6]]), torch.tensor([[0, 1, 1]]), 8, rollout)
    remember(torch.tensor([1]), seen_BV, counts_BV)
    scores = torch.tensor([[3.0, 3.0, 3.0, 3.0, -3.0, 3.0, 0.0, 3.0]])
    out = penalised(scores, sampling, 1, torch.tensor([0]), seen_BV, counts_BV)
    assert counts_BV is None and out.tolist() == [[3.0, 2.0, 3.0, 3.0, -4.5, 3.0, 0.0, 3.0]]


def test_sanitiser_replaces_nan_and_inf():
    fixed = torch.zeros((), dtype=torch.long)
    scores = torch.tensor([[float("nan"), float("inf"), float("-inf"), 1.5], [0.0, 1.0, 2.0, 3.0]])
    out = sanitised(scores, fixed)
    assert out.tolist() == [[NAN_LOGIT, POSINF_LOGIT, NEGINF_LOGIT, 1.5], [0.0, 1.0, 2.0, 3.0]]
    assert int(fixed) == 1


def test_rollouts_are_grouped_per_sample_with_exact_prompt_ids(model, tok, samples):
    rollouts, metrics = generate_rollouts(model, tok, samples, RolloutConfig(k=3, max_new_tokens=NEW))
    assert len(rollouts) == 6 and metrics["rollout/num"] == 6.0
    for i, s in enumerate(samples):
        for r in rollouts[i * 3:(i + 1) * 3]:
            assert r.sample is s and list(r.prompt_ids) == encode_prompt(tok, s.messages)
            assert list(r.prompt_ids) == sft_example(tok, s.messages, "any target")[0]  # SFT sees the same ids
            assert r.text == tok.decode(r.completion_ids, skip_special_tokens=True)
    assert model.training  # train mode given back


def spy_generate(model, monkeypatch) -> dict:
    """The keyword arguments of the model's latest `generate` call (filled in as it is called)."""
    seen: dict = {}
    original = model.generate

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(model, "generate", spy)
    return seen


def test_generate_applies_every_setting_once_through_the_one_sampler(model, tok, samples, monkeypatch):
    """With transformers' generate (rollout.engine=hf): its own sampling and processors are off (neutral values passed
    explicitly, so a model's generation_config.json cannot add them), and its one logits processor carries the
    section; tests/test_decode.py checks that the tokens are transformers' own processors'."""
    from grpo.decoding.next_token import NextTokenProcessor

    seen = spy_generate(model, monkeypatch)
    rollout = RolloutConfig(k=2, temperature=0.7, top_k=5, top_p=0.9, min_p=0.05, repetition_penalty=1.3,
                            max_new_tokens=6, min_new_tokens=2, engine="hf")
    generate_rollouts(model, tok, samples, rollout, stop_ids=[4, 5])
    config = seen["generation_config"]
    assert (config.do_sample, config.repetition_penalty, config.min_new_tokens) == (False, 1.0, 0)
    assert config.max_new_tokens == 6 and config.eos_token_id == [4, 5] and config.pad_token_id == tok.pad_token_id
    (sampler,) = seen["logits_processor"]
    assert type(sampler) is NextTokenProcessor and sampler.sampling.rollout is rollout
    assert sampler.sampling.do_sample and sampler.sampling.stop_ids == (4, 5) and len(sampler.sampling.warps) == 4


def test_each_sampling_setting_changes_behaviour(model, tok, samples):
    reference = completions(greedy(model, tok, samples))
    assert completions(sample(model, tok, samples, seed=0)) != repeat(reference)  # plain sampling is not greedy
    # each setting pushed to its extreme reduces sampling to greedy: proof that it reached the sampler
    for seed, extreme in enumerate([{"top_k": 1}, {"temperature": 1e-4}, {"top_p": 1e-6}, {"min_p": 0.999}]):
        assert completions(sample(model, tok, samples, seed=seed, **extreme)) == repeat(reference), extreme
    hot = sample(model, tok, samples, seed=0, k=4, temperature=50.0)
    # near-uniform sampling over 300 tokens: 8 rows × 12 tokens are almost all distinct
    assert len({t for r in hot for t in r.completion_ids}) > 40


def test_penalties_change_greedy_output(model, tok, samples):
    plain = greedy(model, tok, samples)
    penalised = greedy(model, tok, samples, frequency_penalty=1e3)
    for r in penalised:
        assert len(set(r.completion_ids)) == len(r.completion_ids)  # a repeat costs 1000: never chosen
    assert any(len(set(r.completion_ids)) < NEW for r in plain)  # ... while the plain model does repeat
    assert completions(greedy(model, tok, samples, repetition_penalty=1e3)) != completions(plain)


def test_two_stop_ids_end_at_the_first_one_reached(model, tok, samples):
    # unmasked greedy reference (only the pad id stops it), so its prefix is what the run with `stops` produces
    rollout = RolloutConfig(max_new_tokens=NEW)
    full = greedy_complete(model, tok, samples[:1], rollout, stop_ids=[tok.pad_token_id])[0][0].completion_ids
    first_new = [t for t, tok_id in enumerate(full) if tok_id not in full[:t]]
    a_pos, b_pos = first_new[2], first_new[3]  # two tokens that first appear at a_pos < b_pos
    stops = [full[b_pos], full[a_pos]]  # order in the list does not matter; order in the text does
    rollouts, metrics = greedy_complete(model, tok, samples, rollout, stop_ids=stops)
    first = rollouts[0]
    assert first.completion_ids == full[:a_pos + 1] and first.completion_ids[-1] == full[a_pos]
    assert first.stopped and not first.truncated
    assert metrics["rollout/fairness/stopped"] == 1.0 and metrics["rollout/fairness/length"] == a_pos + 1
    assert tok.pad_token_id not in first.completion_ids  # padding after the stop is dropped


def test_truncated_when_max_new_tokens_is_reached(model, tok, samples):
    rollout = RolloutConfig(k=2, max_new_tokens=4, min_new_tokens=4)  # the stop token is masked throughout
    rollouts, metrics = generate_rollouts(model, tok, samples, rollout)
    assert all(len(r.completion_ids) == 4 and r.truncated and not r.stopped for r in rollouts)
    assert metrics["rollout/hallucination/truncated"] == 1.0 and metrics["rollout/hallucination/length"] == 4.0


def test_nan_logits_do_not_crash_generation(model, tok, samples):
    def poison(module, args, output):
        output = output.clone()
        output[..., ::2] = float("nan")  # NaN on every even token id
        output[..., 1] = float("inf")
        return output

    handle = model.lm_head.register_forward_hook(poison)
    try:
        rollouts, metrics = generate_rollouts(model, tok, samples, RolloutConfig(k=2, max_new_tokens=5))
    finally:
        handle.remove()
    assert all(r.completion_ids == (1,) * 5 for r in rollouts)  # the +Inf token wins, NaN tokens never sampled
    assert metrics["rollout/nonfinite_logit_rows"] == 4 * 5  # 4 rows × 5 steps


def test_sampling_is_reproducible_and_leaves_the_global_rng_alone(model, tok, samples):
    rollout = RolloutConfig(k=2, max_new_tokens=NEW)
    torch.manual_seed(123)
    first = completions(generate_rollouts(model, tok, samples, rollout)[0])
    torch.manual_seed(123)
    assert completions(generate_rollouts(model, tok, samples, rollout)[0]) == first
    state = torch.get_rng_state()
    seeded = completions(sample(model, tok, samples, seed=7, k=2))
    assert torch.equal(torch.get_rng_state(), state)
    assert completions(sample(model, tok, samples, seed=7, k=2)) == seeded


def test_greedy_complete_is_one_greedy_completion_per_sample(model, tok, samples):
    """The sampling settings do not apply to greedy completions: a hot temperature changes nothing, and the result is
    what sampling with top_k = 1 gives."""
    hot = RolloutConfig(max_new_tokens=NEW, min_new_tokens=NEW, temperature=5.0, top_p=0.5)
    rollouts, _ = greedy_complete(model, tok, samples, hot)
    assert len(rollouts) == len(samples)
    assert completions(rollouts) == completions(greedy(model, tok, samples))
    assert repeat(completions(rollouts)) == completions(sample(model, tok, samples, seed=0, top_k=1))


def test_rollout_metrics_by_hand():
    s = Sample("t", "1", ())

    def r(n, stopped):
        return Rollout(s, (1,), tuple(range(n)), "", stopped, not stopped)

    metrics = rollout_metrics([r(2, True), r(4, False), r(3, True)])
    assert metrics == {"rollout/num": 3.0, "rollout/tokens": 9.0, "rollout/t/length": 3.0,
                       "rollout/t/stopped": 2 / 3, "rollout/t/truncated": 1 / 3}


def test_an_ignored_setting_is_reported(monkeypatch):
    import transformers

    class DropsMinNewTokens(transformers.GenerationConfig):
        def __init__(self, **kwargs):
            kwargs.pop("min_new_tokens", None)
            super().__init__(**kwargs)

    monkeypatch.setattr(transformers, "GenerationConfig", DropsMinNewTokens)
    with pytest.warns(RuntimeWarning, match="min_new_tokens"):
        build_generation_config(RolloutConfig(), pad_id=0, stop_ids=[1])


def test_lora_policy_with_checkpointing_generates_and_gets_its_state_back(samples):
    from grpo.models.modeling import TINY_NAME, load_policy

    policy = load_policy(ModelConfig(name=TINY_NAME, lora=True, lora_r=4, lora_target_modules=["q_proj"],
                                     gradient_checkpointing=True, tiny_hidden=32, tiny_layers=1, tiny_heads=2),
                         tiny_corpus=CORPUS)
    rollouts, _ = generate_rollouts(policy.model, policy.tokenizer, samples, RolloutConfig(k=2, max_new_tokens=3))
    assert len(rollouts) == 4 and all(1 <= len(r.completion_ids) <= 3 for r in rollouts)
    assert policy.model.training and policy.model.config.use_cache is False
    assert policy.model.base_model.model.model.layers[0].gradient_checkpointing


def test_cache_implementation_reaches_the_generation_config(model, tok, samples, monkeypatch):
    seen = spy_generate(model, monkeypatch)
    generate_rollouts(model, tok, samples, RolloutConfig(k=2, max_new_tokens=3, cache_implementation="static"))
    assert seen["generation_config"].cache_implementation == "static"
    assert seen["input_ids"].shape[1] % STATIC_PROMPT_BUCKET == 0  # prompts padded to the bucket
    generate_rollouts(model, tok, samples, RolloutConfig(k=2, max_new_tokens=3, engine="hf"))
    assert seen["generation_config"].cache_implementation is None  # transformers' default: dynamic
    assert seen["input_ids"].shape[1] < STATIC_PROMPT_BUCKET  # no bucket padding on the dynamic path
    seen.clear()
    greedy_complete(model, tok, samples, RolloutConfig(max_new_tokens=3, cache_implementation="static"))
    assert not seen  # evaluation keeps the dynamic cache, so engine=auto decodes it with the lean loop
    greedy_complete(model, tok, samples, RolloutConfig(max_new_tokens=3, cache_implementation="static", engine="hf"))
    assert seen["generation_config"].cache_implementation is None
    from grpo.config import Config
    from grpo.run.assembly.config_check import check_config

    with pytest.raises(ConfigError, match="rollout.cache_implementation"):
        check_config(Config(rollout=RolloutConfig(cache_implementation="paged")))


def test_static_cache_and_bucket_padding_sample_the_same_ids(model, tok, samples):
    """The static cache left-pads prompts to STATIC_PROMPT_BUCKET columns: masked, with mask-derived positions, so
    greedy and seeded sampled completions are those of the dynamic cache, and each completion's log-probs under the
    padded prompt equal those under the unpadded one."""
    from grpo.models.logprobs import completion_logprobs
    from grpo.models.tokens import left_pad

    # top_k = 1: greedy decoding through the sampling path, which is the one that uses the static cache
    assert (completions(sample(model, tok, samples, seed=0, top_k=1, cache_implementation="static")) ==
            completions(sample(model, tok, samples, seed=0, top_k=1)))
    static = sample(model, tok, samples, seed=5, k=3, cache_implementation="static")
    assert completions(static) == completions(sample(model, tok, samples, seed=5, k=3))
    model.eval()
    try:
        for r in static:
            full = list(r.prompt_ids) + list(r.completion_ids)
            rows = {width: left_pad([full], tok.pad_token_id, multiple_of=width)
                    for width in (1, STATIC_PROMPT_BUCKET)}
            with torch.no_grad():
                logps = {w: completion_logprobs(model, ids, mask, ids.shape[1] - NEW)[0]
                         for w, (ids, mask) in rows.items()}
            assert rows[STATIC_PROMPT_BUCKET][0].shape[1] > len(full)  # really padded
            torch.testing.assert_close(logps[STATIC_PROMPT_BUCKET], logps[1], rtol=1e-5, atol=1e-5)
    finally:
        model.train()


def test_sanitiser_fixes_bad_rows_without_a_host_sync(monkeypatch):
    """Unless the caller allows a host read, the sanitiser rewrites bad rows with a select instead of branching on
    `.any()` (the graph engine's step, compiled and captured); the same result as with the read."""
    scores = torch.tensor([[0.0, float("nan"), 1.0], [0.0, float("-inf"), 2.0], [float("inf"), 0.0, 0.0]])
    read = sanitised(scores.clone(), torch.zeros((), dtype=torch.long), may_read_host=True)

    def no_sync(self):
        raise AssertionError("host sync")

    monkeypatch.setattr(torch.Tensor, "__bool__", no_sync)
    fixed = torch.zeros((), dtype=torch.long)
    out = sanitised(scores.clone(), fixed)
    monkeypatch.undo()
    torch.testing.assert_close(out, read)
    torch.testing.assert_close(out[[0, 2]], read[[0, 2]])  # the bad rows (NaN, +inf) fixed
    torch.testing.assert_close(out[1], scores[1])  # a good row, with its legitimate -inf mask, left alone
    assert int(fixed) == 2
    clean = torch.tensor([[0.0, 1.0]])
    assert sanitised(clean, torch.zeros((), dtype=torch.long), may_read_host=True) is clean  # no rewrite at all


def test_every_rollout_setting_is_read_by_the_code_it_configures(model, tok, samples):
    """Regression: rollout.cache_implementation once existed in the config but never reached the sampler (a copy
    record left it out). Now the section itself is passed: every RolloutConfig field must be read by the rollout
    code, the stop-token resolution, the toolbox (tools, environments) or the trainer's sampling-stream choice."""
    import dataclasses

    from grpo.machine.distributed import Dist
    from grpo.phases.tools import build_toolbox
    from grpo.run.assembly.owners import stop_token_ids
    from grpo.run.step_owners import per_completion_sampling

    read: set[str] = set()

    class Recording(RolloutConfig):
        def __getattribute__(self, name):
            read.add(name)
            return super().__getattribute__(name)

    rollout = Recording(k=2, max_new_tokens=3, presence_penalty=0.1, stop_strings=["yes"])
    stops = stop_token_ids(rollout, tok)
    generate_rollouts(model, tok, samples, rollout, stops)
    greedy_complete(model, tok, samples, rollout, stops)
    generate_rollouts(model, tok, samples, Recording(k=2, max_new_tokens=3, engine="graph"), stops)  # fold_lora
    per_completion_sampling(rollout, Dist())
    assert build_toolbox(rollout, tok) is None  # rollout.tools / environment_factory: neither set, no toolbox
    unread = {f.name for f in dataclasses.fields(RolloutConfig)} - read
    assert not unread, f"RolloutConfig fields nobody reads: {sorted(unread)}"
