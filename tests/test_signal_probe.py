"""benchmarks/signal_probe.py: the likelihood probe of what a model tells apart before training, on numbers by hand."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import ROOT
from conftest import load_script as _load

DATA = ROOT.parent / "shared" / "data"




probe = _load("benchmarks/signal_probe.py")


def test_auc_counts_pairs_ranked_right_and_ties_as_half():
    assert probe.auc([3.0, 2.0], [1.0, 0.0]) == 1.0
    assert probe.auc([0.0], [1.0]) == 0.0
    # pairs: (2,1) right, (2,3) wrong, (1,1) tie, (1,3) wrong -> (1 + 0.5) / 4
    assert probe.auc([2.0, 1.0], [1.0, 3.0]) == pytest.approx(0.375)
    assert probe.auc([], [1.0]) is None


def row(condition, label, unknown, letter, cloze, category="Age"):
    return {"condition": condition, "category": category, "label": label, "unknown": unknown, "letter": letter,
            "cloze": cloze}


def test_bbq_summary_on_a_hand_made_table():
    rows = [
        # ambiguous: gold = unknown (index 2 / 0)
        row("ambig", 2, 2, letter=[0.0, -1.0, -2.0], cloze=[-3.0, -2.0, -1.0]),   # letter A (wrong), cloze unknown
        row("ambig", 0, 0, letter=[-1.0, -2.0, -3.0], cloze=[-1.0, -0.5, -2.0]),  # letter A (right), cloze B
        # disambiguated: gold is a person
        row("disambig", 1, 2, letter=[-2.0, -1.0, -3.0], cloze=[-2.0, -1.5, -1.0]),  # letter B right; cloze unknown,
        #                                                                             persons: B right
        row("disambig", 0, 1, letter=[-2.0, -3.0, -1.0], cloze=[-4.0, -1.0, -3.0]),  # letter C; cloze unknown (B),
        #                                                                             persons: C (wrong)
    ]
    s = probe.bbq_summary(rows)
    assert s["ambig"] == {"n": 2, "letter_acc": 0.5, "letter_top_share": 1.0, "cloze_acc": 0.5,
                          "cloze_persons_acc": None, "unknown_top": 0.5}
    assert s["disambig"] == {"n": 2, "letter_acc": 0.5, "letter_top_share": 0.5, "cloze_acc": 0.0,
                             "cloze_persons_acc": 0.5, "unknown_top": 1.0}
    # unknown's cloze margin: ambiguous 1.0 (-1 - -2), -0.5 (-1 - -0.5); disambiguated 0.5, 2.0
    # pairs ranked ambiguous-first: (1.0 > 0.5) only -> 1 / 4
    assert s["auc_ambiguity_cloze"] == pytest.approx(0.25)
    # letter margins: ambiguous -2 (-2 - 0), 1 (-1 - -2); disambiguated -2 (-3 - -1), -2 (-3 - -1)
    # pairs: (-2, -2) tie twice, (1, -2) yes twice -> 3 / 4
    assert s["auc_ambiguity_letter"] == pytest.approx(0.75)


def test_recognition_summary_reads_the_margin_against_the_label():
    s = probe.recognition_summary([2.0, 0.5, -1.0, -0.2], ["yes", "no", "no", "yes"])
    # yes margins 2.0, -0.2; no margins 0.5, -1.0: pairs right (2>.5, 2>-1, -.2>-1), wrong (-.2<.5) -> 3/4
    assert s["auc"] == pytest.approx(0.75)
    # verdicts by sign: yes, yes, no, no -> recall yes 1/2, recall no 1/2
    assert s["balanced_accuracy"] == pytest.approx(0.5) and s["yes_rate"] == pytest.approx(0.5)


def test_reply_logprobs_match_one_unpadded_pass_per_reply():
    from grpo.config import ModelConfig
    from grpo.models.modeling import load_policy

    policy = load_policy(ModelConfig(name="builtin:tiny"), seed=0)
    model = policy.model.eval()
    prompt, replies = [5, 6, 7, 8], [[9], [10, 11, 12]]
    got_sum = probe.reply_logprobs(model, prompt, replies, pad=0)
    got_mean = probe.reply_logprobs(model, prompt, replies, pad=0, per_token=True)
    for reply, s, m in zip(replies, got_sum, got_mean, strict=True):
        with torch.no_grad():
            logps = model(torch.tensor([prompt + reply])).logits[0].log_softmax(-1)
        want = [float(logps[len(prompt) - 1 + j, t]) for j, t in enumerate(reply)]
        assert s == pytest.approx(sum(want), abs=1e-4)
        assert m == pytest.approx(sum(want) / len(want), abs=1e-4)


@pytest.mark.skipif(not (DATA / "bbq").is_dir(), reason="needs ../shared/data")
def test_the_script_runs_on_the_real_rows(tmp_path, capsys):
    out = tmp_path / "probe.json"
    report = probe.main(["--model", "builtin:tiny", "--bbq-per-category", "4", "--recognition-rows", "8",
                         "--threads", "1", "--data-dir", str(DATA), "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert report["bbq"]["ambig"]["n"] + report["bbq"]["disambig"]["n"] == 4 * len(report["bbq_by_category"])
    assert report["recognition"]["n"] == 8
    assert "| disambiguated |" in capsys.readouterr().out
