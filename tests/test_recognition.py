"""HaluEval hallucination recognition: the formulation (loader), its grader, balanced accuracy per evaluation."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest
from conftest import SHARED_DATA

from grpo.core.recognition_measures import recognition_measures
from grpo.core.rule_graders import GRADERS, halueval_recognition, halueval_rule, recognition_verdict
from grpo.data.halueval import load_halueval

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "halueval"
GENERAL = SHARED_DATA / "halueval" / "general_data.json"
needs_general = pytest.mark.skipif(not GENERAL.is_file(), reason=f"shared HaluEval data not found at {GENERAL}")


@pytest.mark.parametrize("completion, verdict", [
    ("Answer: Yes\nThe response invents a date.", "yes"), ("answer: no.", "no"), ("Answer: Hallucinated", "yes"),
    ("No, it is faithful.", "no"), ("Answer: maybe", None), ("", None), ("Answer: **Yes**", "yes"),
])
def test_recognition_verdict(completion, verdict):
    assert recognition_verdict(completion) == verdict


def test_halueval_recognition_grades_by_the_gold_label():
    yes, no = {"hallucination": "yes"}, {"hallucination": "no"}
    assert halueval_recognition("Answer: Yes", yes) == 1.0 and halueval_recognition("Answer: No", yes) == 0.0
    assert halueval_recognition("Answer: No", no) == 1.0 and halueval_recognition("Answer: Yes", no) == 0.0
    assert halueval_recognition("I cannot tell", no) == 0.0  # a refusal earns nothing
    assert halueval_recognition("Answer: Yes", {"hallucination": "?"}) is None
    assert GRADERS["halueval_recognition"] is halueval_recognition
    # the preset's halueval_rule term grades recognition rows by the label too
    assert halueval_rule("Answer: Yes", {"subset": "qa_recognition", "hallucination": "yes"}) == 1.0
    assert halueval_rule("Answer: Yes", {"subset": "general_recognition", "hallucination": "no"}) == 0.0


def test_balanced_accuracy_by_hand():
    pairs = [("yes", "yes"), ("yes", "no"), ("yes", None), ("no", "no"), ("no", "no"), ("no", "yes"), ("no", "no")]
    m = recognition_measures(pairs)
    # recall on yes = 1/3, on no = 3/4: balanced = (1/3 + 3/4) / 2 = 13/24
    assert m["recall_yes"] == pytest.approx(1 / 3) and m["recall_no"] == pytest.approx(3 / 4)
    assert m["balanced_accuracy"] == pytest.approx(13 / 24)
    assert m["accuracy"] == pytest.approx(4 / 7) and m["yes_rate"] == pytest.approx(2 / 7)
    assert m["invalid"] == pytest.approx(1 / 7) and (m["n_yes"], m["n_no"]) == (3, 4)


def test_a_constant_verdict_is_balanced_accuracy_one_half_whatever_the_class_balance():
    # the general subset: 815 "yes" of 4,507; always "no" is 81.9 % accurate, balanced 0.5
    pairs = [("yes", "no")] * 815 + [("no", "no")] * 3692
    m = recognition_measures(pairs)
    assert m["accuracy"] == pytest.approx(3692 / 4507) and m["balanced_accuracy"] == 0.5
    assert recognition_measures([("no", "no")])["balanced_accuracy"] == 1.0  # one class: its recall
    assert recognition_measures([])["balanced_accuracy"] is None
    with pytest.raises(ValueError, match="yes"):
        recognition_measures([("maybe", "no")])


@needs_general
def test_general_recognition_shows_chatgpts_reply_and_keeps_the_label():
    samples = load_halueval(GENERAL, subset="general_recognition").samples
    assert len(samples) == 4507 and Counter(s.gold["hallucination"] for s in samples) == {"no": 3692, "yes": 815}
    rows = ([json.loads(x) for x in GENERAL.read_text().splitlines()] if GENERAL.read_text().lstrip()[0] == "{"
            else json.loads(GENERAL.read_text()))
    first, row = samples[0], rows[0]
    prompt = first.messages[-1]["content"]
    assert first.id.startswith("halueval/general_recognition/") and first.gold["subset"] == "general_recognition"
    assert f"User query: {row['user_query']}" in prompt and f"Response: {row['chatgpt_response']}" in prompt
    assert first.target == ("Answer: Yes" if row["hallucination"] == "yes" else "Answer: No")
    assert all(halueval_recognition(s.target, s.gold) == 1.0 for s in samples)  # the SFT target is right


def _qa_rows(n):
    return [{"knowledge": f"Fact {i} is in city {i}.", "question": f"Where is fact {i}?",
             "right_answer": f"City {i}", "hallucinated_answer": f"Town {i + 1000}"} for i in range(n)]


def test_qa_recognition_shows_the_right_or_the_hallucinated_answer_seeded_per_row(tmp_path):
    path = tmp_path / "qa_data.json"
    rows = _qa_rows(200)
    path.write_text("\n".join(json.dumps(r) for r in rows))
    samples = load_halueval(path, subset="qa_recognition", seed=0).samples
    by_id = {s.id: s for s in samples}
    for s, row in zip(samples, rows, strict=True):
        shown = row["hallucinated_answer"] if s.gold["hallucination"] == "yes" else row["right_answer"]
        assert s.gold["shown_answer"] == shown and f"Proposed answer: {shown}\n" in s.messages[-1]["content"]
        assert halueval_recognition(s.target, s.gold) == 1.0
    assert 70 < sum(s.gold["hallucination"] == "yes" for s in samples) < 130  # ~ half of 200 (sd ~7)
    assert ({s.id: s.gold for s in load_halueval(path, subset="qa_recognition", seed=0).samples} ==
            {i: s.gold for i, s in by_id.items()})  # deterministic
    other = load_halueval(path, subset="qa_recognition", seed=1).samples
    assert any(a.gold["hallucination"] != b.gold["hallucination"] for a, b in zip(samples, other, strict=True))
    # the pick is random.Random(f"{seed}:{row id}") < 0.5
    s0 = samples[0]
    assert (random.Random(f"0:{s0.id.split('/')[-1]}").random() < 0.5) == (s0.gold["hallucination"] == "yes")


def test_dialogue_and_summarization_recognition_on_the_fixtures():
    for subset, field in (("dialogue", "Proposed response: "), ("summarization", "Proposed summary: ")):
        samples = load_halueval(FIXTURES / f"{subset}.jsonl", subset=f"{subset}_recognition").samples
        assert samples and all(s.gold["subset"] == f"{subset}_recognition" for s in samples)
        for s in samples:
            assert field + s.gold["shown_answer"] in s.messages[-1]["content"]
            assert s.gold["hallucination"] in ("yes", "no") and s.target in ("Answer: Yes", "Answer: No")


def test_an_unknown_subset_names_the_valid_ones():
    with pytest.raises(ValueError, match="general_recognition"):
        load_halueval(FIXTURES / "qa.jsonl", subset="qa_recognise")


@needs_general
def test_data_halueval_subsets_general_recognition_reads_the_general_file():
    from grpo.config.command_line import parse_trainer_argv
    from grpo.run.assembly.samples import load_samples

    args = ["--data.source", "dual", "--data.data_dir", str(SHARED_DATA), "--data.bbq_categories", "Age",
            "--data.bbq_per_category", "4", "--data.halueval_subsets", "general_recognition,general",
            "--data.halueval_per_subset", "5"]
    every = load_samples(parse_trainer_argv(args, "t", "t")[0].data, 0).every
    subsets = Counter(s.gold.get("subset") for s in every if s.task == "hallucination")
    assert subsets == {"general_recognition": 5, "general": 5}


def test_record_measures_reports_balanced_accuracy_per_task_and_subset():
    from grpo.core.step_types import Rollout, Sample, Scored
    from grpo.phases.evaluation import record_measures

    def scored(subset, label, text):
        sample = Sample(task="hallucination", id=f"{subset}{label}{text}", messages=(),
                        gold={"subset": subset, "hallucination": label})
        return Scored(Rollout(sample, (), (), text, True, False), reward=None)

    rows = [scored("general_recognition", "yes", "Answer: Yes"), scored("general_recognition", "no", "Answer: Yes"),
            scored("general_recognition", "no", "Answer: No"), scored("qa_recognition", "yes", "Answer: No")]
    store: dict = {}
    metrics = record_measures(store, "after_sft", rows)
    rec = store["after_sft"]["recognition"]["hallucination"]
    # overall: recall yes = 1/2, recall no = 1/2 -> 0.5; general: yes 1/1, no 1/2 -> 0.75; qa: yes 0/1 -> 0
    assert rec["overall"]["balanced_accuracy"] == 0.5
    assert rec["by_subset"]["general_recognition"]["balanced_accuracy"] == 0.75
    assert rec["by_subset"]["qa_recognition"]["balanced_accuracy"] == 0.0
    assert metrics["eval/hallucination/recognition/balanced_accuracy"] == 0.5
    assert metrics["eval/hallucination/recognition/general_recognition/balanced_accuracy"] == 0.75
    assert "eval/hallucination/recognition/qa_recognition/recall_no" not in metrics  # undefined: no "no" row


def test_report_tables_recognition_balanced_accuracy(tmp_path):
    import shutil

    from grpo.run.doctor.report import build_report, format_report

    run_dir = tmp_path / "run"
    shutil.copytree(Path(__file__).resolve().parent / "fixtures" / "run_demo", run_dir,
                    ignore=shutil.ignore_patterns("*.png", "report.json", "*.py"))

    def phase(bal, yes_rate):
        m = {"balanced_accuracy": bal, "yes_rate": yes_rate}
        return {"recognition": {"hallucination": {"overall": m, "by_subset": {}}}}

    (run_dir / "measures.json").write_text(json.dumps(
        {"before_sft": phase(0.5, 1.0), "after_sft": phase(0.55, 0.4), "after_rl": phase(0.7, 0.3)}))
    report = build_report(run_dir)
    row = report["recognition"]["hallucination"]
    assert (row["before_sft"], row["after_sft"], row["after_rl"]) == (0.5, 0.55, 0.7)
    assert row["delta_rl"] == pytest.approx(0.15) and row["yes_rate_after_rl"] == 0.3
    assert ("Recognition hallucination (balanced accuracy): before_sft 0.500  after_sft 0.550  after_rl 0.700  "
            "Δ rl +0.150" in format_report(report))


@needs_general
def test_general_recognition_under_a_limit_is_balanced_by_label():
    # 815 "yes" to 3,692 "no" in the file, 90 to 210 in its first 300 rows: a plain-accuracy reward on those rows
    # paid "Answer: No" to everything 0.7. Under a limit each label gets half, in file order.
    samples = load_halueval(GENERAL, subset="general_recognition", limit=300).samples
    assert Counter(s.gold["hallucination"] for s in samples) == {"yes": 150, "no": 150}
    lines = [s.meta["line"] for s in samples]
    assert lines == sorted(lines)
    every = load_halueval(GENERAL, subset="general_recognition").samples
    first_no = [s.id for s in every if s.gold["hallucination"] == "no"][:150]
    assert [s.id for s in samples if s.gold["hallucination"] == "no"] == first_no
    # more than the file has of one label: all of that one, half the limit of the other
    big = load_halueval(GENERAL, subset="general_recognition", limit=2000).samples
    assert Counter(s.gold["hallucination"] for s in big) == {"yes": 815, "no": 1000}
    # the generation subset keeps plain file order
    plain = load_halueval(GENERAL, subset="general", limit=300).samples
    assert Counter(s.gold["hallucination"] for s in plain) == {"yes": 90, "no": 210}
