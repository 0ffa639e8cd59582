"""grpo.core.answer_metrics: answer classes of completions, their shares per step, and per-task zero-std groups."""

import math

import pytest

from grpo.core.answer_metrics import (
    ANSWER_CLASS_CHARS,
    EMPTY_ANSWER,
    AnswerShares,
    answer_class,
    answer_shares,
    step_answer_metrics,
    zero_std_fraction,
)


def test_answer_class_of_the_demo_replies_and_of_free_text():
    assert answer_class("Answer: unknown") == "unknown"
    assert answer_class("answer:  Unknown.") == "unknown"
    assert answer_class("Answer: (B).") == "b"
    assert answer_class("Answer: big\ufffd") == "big"  # a cut multi-byte token at the end is not part of the answer
    assert answer_class("Let me think.\nAnswer: yes\nEvidence: the knowledge line") == "yes"  # first line after it
    assert answer_class("Answer: no. Answer: yes") == "yes"  # the last label wins (a model that corrects itself)
    assert answer_class("  I cannot   answer that,\nsorry") == "i cannot answer that"  # no label: first line
    assert answer_class("") == EMPTY_ANSWER and answer_class("Answer: ...") == EMPTY_ANSWER
    long = "The " + "very " * 30 + "long reply"
    assert answer_class(long) == long.casefold()[:ANSWER_CLASS_CHARS] and len(answer_class(long)) == 40


def test_an_option_letter_with_its_text_is_the_letter():
    """Shuffled options put different text after the same letter on every row: the letter is the answer."""
    assert answer_class("Answer: B) The grandfather") == answer_class("B) The older man\n") == "b"
    assert answer_class("Answer: (C) Can't be determined") == "c"
    assert answer_class("a) lots") == "a" and answer_class("b)") == "b"
    assert answer_class("Answer: Bob") == "bob"  # a word is not a letter
    assert answer_class("I think a) is right") == "i think a) is right"  # only a reply that opens with the letter


def test_answer_shares_counts_normalised_classes():
    got = answer_shares(["Answer: unknown", "Answer: unknown", "Answer: yes", "answer: Unknown."])
    assert got == AnswerShares(top_answer="unknown", top_share=0.75, distinct=2)
    # a tie goes to the class seen first
    assert answer_shares(["Answer: no", "Answer: yes"]) == AnswerShares("no", 0.5, 2)
    with pytest.raises(ValueError, match="no completions"):
        answer_shares([])


def test_zero_std_fraction_follows_the_advantage_rule():
    # groups of 3: [1, 1, 1] tie; [0, 1, 0] signal; [0, None, nan] one valid -> no signal; [0.3, 0.1 + 0.2, 0.3] tie
    rewards = [1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, None, math.nan, 0.3, 0.1 + 0.2, 0.3]
    assert zero_std_fraction(rewards, 3) == 3 / 4
    with pytest.raises(ValueError, match="group_size=5"):
        zero_std_fraction(rewards, 5)


def test_step_answer_metrics_per_task_in_rollout_order():
    # two prompts per task, K = 2, tasks interleaved by prompt as the sampler does
    tasks = ["fair", "fair", "halu", "halu", "fair", "fair", "halu", "halu"]
    texts = ["Answer: C", "Answer: C", "Answer: unknown", "Answer: yes", "Answer: C", "Answer: A", "Answer: unknown",
             "Answer: unknown"]
    rewards = [1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0]
    assert step_answer_metrics(tasks, texts, rewards, 2) == {
        "rollout/fair/top_answer": "c", "rollout/fair/top_share": 0.75, "rollout/fair/answers": 2.0,
        "adv/fair/frac_zero_std": 0.5,  # fair groups: [1, 1] tie, [0, 1] signal
        "rollout/halu/top_answer": "unknown", "rollout/halu/top_share": 0.75, "rollout/halu/answers": 2.0,
        "adv/halu/frac_zero_std": 0.5,  # halu groups: [0, 1] signal, [1, 1] tie
    }
    with pytest.raises(ValueError, match="one of each per rollout"):
        step_answer_metrics(tasks, texts[:-1], rewards, 2)
