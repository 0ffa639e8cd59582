"""Task-balanced batches: the configured mix, without replacement within an epoch, resumable."""

from __future__ import annotations

from collections import Counter

import pytest

from grpo.core.step_types import Sample
from grpo.data.batching import TaskBalancedSampler


def _samples(task: str, n: int) -> list[Sample]:
    return [Sample(task=task, id=f"{task}-{i}", messages=({"role": "user", "content": str(i)},)) for i in range(n)]


def test_equal_mix_alternates_and_covers_each_epoch_once():
    sampler = TaskBalancedSampler({"a": _samples("a", 6), "b": _samples("b", 10)}, seed=0)
    batch = sampler.next_batch(4)
    assert [s.task for s in batch] == ["a", "b", "a", "b"]
    seen_a = [s.id for s in batch if s.task == "a"] + [s.id for s in sampler.next_batch(8) if s.task == "a"]
    assert sorted(seen_a[:6]) == sorted(f"a-{i}" for i in range(6)), "one epoch of a = every sample once"
    odd = [s.task for s in sampler.next_batch(1) + sampler.next_batch(1)]
    assert sorted(odd) == ["a", "b"], "odd batch sizes alternate"


def test_weighted_mix():
    sampler = TaskBalancedSampler({"a": _samples("a", 50), "b": _samples("b", 50)}, seed=1, mix={"a": 1, "b": 3})
    counts = Counter(s.task for s in sampler.next_batch(40))
    assert counts == {"a": 10, "b": 30}


def test_state_round_trip_continues_identically():
    data = {"a": _samples("a", 5), "b": _samples("b", 7)}
    one = TaskBalancedSampler(data, seed=3)
    one.next_batch(9)
    state = one.state_dict()
    two = TaskBalancedSampler(data, seed=3)
    two.load_state_dict(state)
    assert [s.id for s in one.next_batch(11)] == [s.id for s in two.next_batch(11)]


def test_bad_mix_and_empty_task_are_rejected():
    with pytest.raises(ValueError, match="positive weight"):
        TaskBalancedSampler({"a": _samples("a", 2), "b": _samples("b", 2)}, seed=0, mix={"a": 1})
    with pytest.raises(ValueError, match="no training samples"):
        TaskBalancedSampler({"a": [], "b": _samples("b", 2)}, seed=0)


def test_sft_demonstrations_are_stratified_by_task_and_answer():
    from collections import Counter as Cnt

    from grpo.phases.sft import stratified

    samples = ([Sample("a", f"a{i}", (), target="Answer: A") for i in range(10)]
               + [Sample("a", f"b{i}", (), target="Answer: B") for i in range(2)]
               + [Sample("h", f"h{i}", (), target="Answer: yes") for i in range(5)])
    picked = stratified(samples, [s.id for s in samples], 6)
    targets = Cnt(next(s.target for s in samples if s.id == p) for p in picked)
    assert targets == {"Answer: A": 2, "Answer: B": 2, "Answer: yes": 2}


def test_sft_demonstrations_of_free_form_answers_do_not_crowd_out_the_other_task():
    """BBQ's disambiguated targets quote their own context and HaluEval general's are ChatGPT replies: with the whole
    target as the class, every row was its own class, the sorted classes put BBQ's first, and all 48 demonstrations
    of the smollm2-dual warm-up were BBQ rows. The class is the answer ("Answer: B ..." -> "b"), and a task with
    more than FREE_FORM_CLASSES answers counts as one class."""
    from grpo.phases.sft import FREE_FORM_CLASSES, stratified

    samples = ([Sample("fairness", f"f{i}", (), target=f"Answer: {'ABC'[i % 3]}\nJustification: quote {i}")
                for i in range(60)]
               + [Sample("hallucination", f"h{i}", (), target=f"Answer: reply number {i} ...") for i in range(100)])
    assert 100 > FREE_FORM_CLASSES
    picked = stratified(samples, [s.id for s in samples], 48)
    letters = [samples[int(p[1:])].target[8] for p in picked if p.startswith("f")]
    assert {x: letters.count(x) for x in "ABC"} == {"A": 12, "B": 12, "C": 12}
    assert sum(p.startswith("h") for p in picked) == 12  # the free-form task: one class beside the three letters


def test_sft_targets_longer_than_the_cap_keep_their_first_tokens_and_no_end_of_turn():
    from grpo.models.modeling import build_tiny_tokenizer
    from grpo.phases.sft import sft_examples

    tok = build_tiny_tokenizer()
    long_target = "Answer: " + " ".join(["word"] * 40)
    samples = [Sample("h", "long", ({"role": "user", "content": "q"},), target=long_target),
               Sample("h", "short", ({"role": "user", "content": "q"},), target="Answer: no")]
    whole = sft_examples(tok, samples, None)
    cut = sft_examples(tok, samples, None, max_target_tokens=6)
    assert whole[0][1][-1] == tok.eos_token_id and len(whole[0][1]) > 7
    assert cut[0][1] == whole[0][1][:6] and tok.eos_token_id not in cut[0][1]
    assert cut[0][0] == whole[0][0]  # the prompt is untouched
    assert cut[1] == whole[1] and cut[1][1][-1] == tok.eos_token_id  # a short target keeps its EOS
