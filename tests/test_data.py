"""Loaders on the real BBQ / HaluEval files in ../shared/data, HaluEval-format fixtures, and the stable split."""

from __future__ import annotations

import hashlib
import json
import random
import warnings
from collections import Counter
from pathlib import Path

import pytest
from conftest import SHARED_DATA

from grpo.data.json_rows import read_records
from grpo.data.loading import DataSpec, load_bbq, load_halueval, load_task, split_heldout_samples

FIXTURES = Path(__file__).resolve().parent / "fixtures"
BBQ_DIR = SHARED_DATA / "bbq"
GENERAL = SHARED_DATA / "halueval" / "general_data.json"
PRESENT = ("Age", "Disability_status", "Nationality", "Physical_appearance", "Religion", "Sexual_orientation")
needs_bbq = pytest.mark.skipif(not BBQ_DIR.is_dir(), reason=f"shared BBQ data not found at {BBQ_DIR}")
needs_general = pytest.mark.skipif(not GENERAL.is_file(), reason=f"shared HaluEval data not found at {GENERAL}")


def raw_row(category: str, example_id: int) -> dict:
    """The source row, read independently of the loader."""
    for line in (BBQ_DIR / f"{category}.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["example_id"] == example_id:
            return row
    raise LookupError(example_id)


@pytest.fixture(scope="module")
def all_bbq():
    return load_bbq(BBQ_DIR).samples


@needs_bbq
def test_bbq_all_present_categories_full_counts(all_bbq):
    counts = Counter(s.meta["category"] for s in all_bbq)
    # Row counts of the six files (README: 11,956 rows in all).
    assert counts == {"Age": 3680, "Disability_status": 1556, "Nationality": 3080, "Physical_appearance": 1576,
                      "Religion": 1200, "Sexual_orientation": 864}
    assert len({s.id for s in all_bbq}) == 11956
    assert {s.task for s in all_bbq} == {"fairness"}


@needs_bbq
def test_bbq_unknown_option_matches_answer_info_on_every_real_row(all_bbq):
    by_id = {s.id: s for s in all_bbq}
    for category in PRESENT:
        for line in (BBQ_DIR / f"{category}.jsonl").read_text().splitlines():
            row = json.loads(line)
            tagged = [k for k, (_, tag) in row["answer_info"].items() if tag == "unknown"]
            gold = by_id[f"bbq/{category}/{row['example_id']}"].gold
            assert gold["unknown_letter"] == "ABC"[int(tagged[0][-1])]
            assert gold["label_letter"] == "ABC"[row["label"]]
            if row["context_condition"] == "ambig":  # README: the gold of an ambiguous row is the unknown option
                assert gold["label_letter"] == gold["unknown_letter"]


@needs_bbq
def test_bbq_stratified_equal_cells_and_deterministic():
    samples = load_bbq(BBQ_DIR, n_per_category=40, seed=3).samples
    assert len(samples) == 6 * 40
    cells = Counter((s.meta["category"], s.gold["context_condition"], s.gold["question_polarity"]) for s in samples)
    assert set(cells.values()) == {10} and len(cells) == 6 * 4
    again = load_bbq(BBQ_DIR, n_per_category=40, seed=3).samples
    other = load_bbq(BBQ_DIR, n_per_category=40, seed=4).samples
    assert [s.id for s in again] == [s.id for s in samples]
    assert {s.id for s in other} != {s.id for s in samples}


@needs_bbq
def test_bbq_remainder_and_subset_of_categories():
    samples = load_bbq(BBQ_DIR, categories=["Religion"], n_per_category=42).samples
    cells = Counter((s.gold["context_condition"], s.gold["question_polarity"]) for s in samples)
    # 42 = 4·10 + 2: the first two cells (ambig/neg, ambig/nonneg) get one more.
    assert cells == {("ambig", "neg"): 11, ("ambig", "nonneg"): 11, ("disambig", "neg"): 10, ("disambig", "nonneg"): 10}
    with pytest.raises(FileNotFoundError, match="Gender_identity"):
        load_bbq(BBQ_DIR, categories=["Religion", "Gender_identity"])
    with pytest.raises(FileNotFoundError, match="Klingon"):
        load_bbq(BBQ_DIR, categories=["Klingon"])
    with pytest.raises(ValueError, match="lower n_per_category"):
        load_bbq(BBQ_DIR, categories=["Religion"], n_per_category=4 * 301)  # 300 rows per cell


@needs_bbq
def test_bbq_prompt_gold_and_target_of_a_real_row(all_bbq):
    row = raw_row("Age", 28)  # ambiguous, unknown option first: "Unknown | The granddaughter | The grandmother"
    sample = next(s for s in all_bbq if s.id == "bbq/Age/28")
    prompt = sample.messages[-1]["content"]
    assert f"Context: {row['context']}" in prompt and f"Question: {row['question']}" in prompt
    assert "A) Unknown\nB) The granddaughter\nC) The grandmother" in prompt
    assert '"Answer: <letter>"' in prompt and "Justification:" in prompt
    assert sample.gold["unknown_letter"] == "A" and sample.gold["label"] == 0
    assert sample.target.startswith("Answer: A\nJustification: ")
    disamb = next(s for s in all_bbq if s.id == "bbq/Age/1")  # "The grandson was struggling with the app ..."
    assert disamb.target == ('Answer: B\nJustification: The context states: "The grandson was struggling with '
                             'the app and not really listening the advice from the grandfather."')
    assert disamb.meta["line"] == 2 and disamb.meta["category"] == "Age"


@needs_bbq
def test_bbq_system_prompt_and_custom_template():
    samples = load_bbq(BBQ_DIR, categories=["Religion"], n_per_category=4, system_prompt="Be fair.",
                       template="{question} :: {ans0}").samples
    assert samples[0].messages[0] == {"role": "system", "content": "Be fair."}
    row = raw_row("Religion", samples[0].meta["example_id"])
    assert samples[0].messages[1]["content"] == f"{row['question']} :: {row['ans0']}"


@needs_general
def test_halueval_general_real_file():
    result = load_halueval(GENERAL)
    samples = result.samples
    assert len(samples) == 4507 and result.skipped == 0
    assert Counter(s.gold["hallucination"] for s in samples) == {"no": 3692, "yes": 815}
    assert len({s.id for s in samples}) == 4507  # the file repeats ID "ID" on two rows: the 2nd gets @line
    assert "halueval/general/ID@line2159" in {s.id for s in samples}
    second = samples[1]  # ID 2, "Provide a few examples of homophones.", labelled hallucinated
    assert second.id == "halueval/general/2" and second.gold["hallucination"] == "yes"
    assert second.target is None and samples[0].target.startswith("Answer: the, a, and")
    assert second.messages[-1]["content"].startswith("Provide a few examples of homophones.")


def test_halueval_fixture_formats_agree():
    lines = load_halueval(FIXTURES / "halueval" / "qa.jsonl").samples
    array = load_halueval(FIXTURES / "halueval" / "qa_array.json").samples
    concat = load_halueval(FIXTURES / "halueval" / "qa_concat.json").samples
    assert len(lines) == 3
    assert [s.gold for s in lines] == [s.gold for s in array] == [s.gold for s in concat]
    assert [s.id for s in lines] == [s.id for s in array] == [s.id for s in concat]
    first = lines[0]
    assert first.gold["subset"] == "qa" and first.gold["right_answer"] == "Arthur's Magazine"
    assert "Evidence:" in first.messages[-1]["content"] and "Question: Which magazine" in first.messages[-1]["content"]
    # The evidence of the SFT target is the knowledge sentence sharing most words with the right answer.
    assert first.target == ("Answer: Arthur's Magazine\nEvidence: Arthur's Magazine (1844-1846) was an American "
                            "literary periodical published in Philadelphia in the 19th century.")
    assert [s.meta["line"] for s in concat] == [1, 7, 13]  # each pretty-printed object spans 6 lines


def test_halueval_dialogue_and_summarization_fixtures():
    dialogue = load_halueval(FIXTURES / "halueval" / "dialogue.jsonl").samples
    assert [s.gold["subset"] for s in dialogue] == ["dialogue", "dialogue"]
    assert dialogue[1].gold["right_answer"] == "Stephen King wrote The Shining; he also wrote It."
    assert "[Human]: Who wrote The Shining?" in dialogue[1].messages[-1]["content"]
    full = load_halueval(FIXTURES / "halueval" / "summarization.jsonl").samples[0]
    assert full.target.startswith("Summary: The city council approved") and not full.meta["truncated"]
    cut = load_halueval(FIXTURES / "halueval" / "summarization.jsonl", max_doc_chars=60).samples[0]
    # The first 60 chars end inside "new budget on Tuesday." — cut back to the last space, then the mark.
    assert cut.gold["knowledge"] == "The city council approved a new budget on Tuesday. The plan …"
    assert (cut.meta["truncated"] and "Document: The city council approved a new budget on Tuesday. The plan …" in
            cut.messages[-1]["content"])


def test_malformed_file_reports_file_and_line_and_skips():
    path = FIXTURES / "halueval" / "qa_bad.jsonl"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = load_halueval(path)
    messages = [str(w.message) for w in caught]
    assert len(result.samples) == 3 and result.skipped == 3
    assert any(f"{path}:2: skipped bad row: invalid JSON" in m for m in messages)
    assert any(f"{path}:4: skipped bad row: missing qa fields ['right_answer', 'hallucinated_answer']" in m
               for m in messages)
    assert any(f"{path}:5: skipped bad row: a list, not an object" in m for m in messages)
    assert [s.meta["line"] for s in result.samples] == [1, 3, 6]


def test_read_records_array_with_non_objects(tmp_path):
    path = tmp_path / "a.json"
    path.write_text('[{"a": 1}, 2, {"b": 3}]')
    read = read_records(path)  # problems are collected; finish() warns about them
    with pytest.warns(UserWarning, match=r"a.json:2: skipped bad row: array element 1 is a int"):
        read.finish()
    assert [row for _, row in read.rows] == [{"a": 1}, {"b": 3}] and read.skipped == 1
    path.write_text('[{"a": 1}, {"b": ]')
    with pytest.raises(ValueError, match="not a valid JSON array"):
        read_records(path)


def test_generic_jsonl_rows_name_their_task_and_the_hf_kind_reads_the_same_file():
    path = FIXTURES / "generic.jsonl"
    with pytest.warns(UserWarning, match=rf"{path}:3: skipped bad row: no task name: column 'task' is empty"):
        samples, metrics = load_task(DataSpec(kind="jsonl", path=str(path)))
    first, second = samples
    assert (first.task, first.id, first.gold, first.messages, first.conversational) == (
        "math", "m1", {"answer": "5"}, ({"role": "user", "content": "What is 2 + 3?"},), False)
    assert second.gold == {"answer": "16"} and second.target == "16" and second.conversational
    assert second.id == hashlib.sha256("What is 4 * 4?".encode()).hexdigest()[:16]
    assert (first.meta, second.meta) == ({"source": str(path), "line": 1}, {"source": str(path), "line": 2})
    assert metrics == {"data/math/rows": 2.0, "data/all/skipped": 1.0}
    samples, metrics = load_task(DataSpec(kind="jsonl", path=str(path), task="math"))  # the default task
    assert len(samples) == 3 and metrics == {"data/math/rows": 3.0, "data/math/skipped": 0.0}
    through_datasets, _ = load_task(DataSpec(kind="hf", path=str(path), task="math"))
    assert [(s.task, s.id, s.messages, s.gold) for s in through_datasets] == [
        (s.task, s.id, s.messages, s.gold) for s in samples]


def _by_hand(sample_id: str, salt: str, fraction: float) -> bool:
    return int(hashlib.sha256(f"{salt}:{sample_id}".encode()).hexdigest()[:16], 16) / 2**64 < fraction


@needs_bbq
def test_split_is_stable_order_free_and_close_to_fraction(all_bbq):
    train, heldout = split_heldout_samples(all_bbq, 0.2, salt="s")
    assert len(train) + len(heldout) == len(all_bbq)
    # Binomial(11956, 0.2): sd = sqrt(n·p·(1-p)) ≈ 43.7 rows; 4 sd ≈ 175 rows ≈ 0.0146 of n.
    assert abs(len(heldout) / len(all_bbq) - 0.2) < 0.0146
    assert {s.id for s in heldout} == {s.id for s in all_bbq if _by_hand(s.id, "s", 0.2)}
    shuffled = list(all_bbq)
    random.Random(0).shuffle(shuffled)
    _, heldout2 = split_heldout_samples(shuffled, 0.2, salt="s")
    assert {s.id for s in heldout2} == {s.id for s in heldout}
    _, other_salt = split_heldout_samples(all_bbq, 0.2, salt="t")
    assert {s.id for s in other_salt} != {s.id for s in heldout}
    assert split_heldout_samples(all_bbq[:10], 0.0)[1] == []
    with pytest.raises(ValueError, match="heldout_fraction"):
        split_heldout_samples(all_bbq, 1.0)


def test_template_naming_an_absent_field_is_a_config_error_not_a_skipped_row():
    with pytest.raises(ValueError, match=r"uses \{passage\}, but rows only have the fields"):
        load_halueval(FIXTURES / "halueval" / "qa.jsonl", template="{passage} {question}")


@needs_bbq
def test_halueval_file_that_is_not_json_stops_the_run_naming_the_file(tmp_path):
    """A non-JSON HaluEval file is one error naming it: read row by row it would give one warning per line, then
    drop the whole task from the run."""
    from types import SimpleNamespace

    from grpo.data.json_rows import DataFileError
    from grpo.run.assembly.samples import load_samples

    bad = tmp_path / "halueval" / "qa_data.json"
    bad.parent.mkdir()
    bad.write_text("knowledge,question,right_answer\nParis is in France.,Where is Paris?,France\n")
    with pytest.raises(DataFileError, match=rf"{bad}: not a JSON data file: none of its 2 rows is a JSON object "
                                            r"\(first: 1: skipped bad row: invalid JSON"):
        load_halueval(bad, subset="qa")
    # The way source=dual reaches it: the subset is named, so no detection error hid the problem.
    (tmp_path / "bbq").mkdir()
    (tmp_path / "bbq" / "Religion.jsonl").write_text((BBQ_DIR / "Religion.jsonl").read_text())
    data = SimpleNamespace(source="dual", data_dir=str(tmp_path), bbq_categories=[], bbq_per_category=4,
                           halueval_subsets=["qa"], halueval_per_subset=10, max_document_chars=100, system_prompt="",
                           shuffle_options=False)
    with pytest.raises(DataFileError, match=str(bad)):
        load_samples(data, seed=0)
    # JSON, but not one row of the subset: also an error, not an empty subset.
    bad.write_text('{"question": "Where is Paris?"}\n')
    with pytest.raises(DataFileError, match=rf"{bad}: no usable HaluEval qa row \(first: {bad}:1: skipped bad "
                                            r"row: missing qa fields"):
        load_halueval(bad, subset="qa")
