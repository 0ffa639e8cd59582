"""data.shuffle_options: BBQ options in a seeded order per row and epoch, the gold letter following."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from grpo.core.rule_graders import LETTERS, bbq_rule
from grpo.data.batching import TaskBalancedSampler
from grpo.data.bbq import (
    balanced_heldout,
    balanced_positions,
    for_epoch,
    load_bbq,
    option_order,
    order_with_gold_at,
    permuted_row,
)

BBQ_DIR = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "bbq"
needs_bbq = pytest.mark.skipif(not BBQ_DIR.is_dir(), reason="shared BBQ data absent")

ROW = {"example_id": 7, "category": "Age", "context": "c", "question": "q", "ans0": "The grandfather",
       "ans1": "The grandson", "ans2": "Can't be determined", "label": 1, "context_condition": "disambig",
       "question_polarity": "neg", "additional_metadata": {"stereotyped_groups": ["old"]},
       "answer_info": {"ans0": ["grandfather", "old"], "ans1": ["grandson", "nonOld"],
                       "ans2": ["Can't be determined", "unknown"]}}


def test_option_order_is_a_permutation_fixed_by_seed_row_and_epoch():
    assert sorted(option_order(0, "bbq/Age/7", 0)) == [0, 1, 2]
    assert option_order(0, "bbq/Age/7", 0) == option_order(0, "bbq/Age/7", 0)
    orders = {option_order(s, f"bbq/Age/{i}", e) for s in range(3) for i in range(10) for e in range(3)}
    assert len(orders) == 6  # every permutation occurs


def test_permuted_row_moves_options_tags_and_label_together():
    row = permuted_row(ROW, (2, 0, 1))  # shown: unknown, grandfather, grandson
    assert [row[f"ans{i}"] for i in range(3)] == ["Can't be determined", "The grandfather", "The grandson"]
    assert row["answer_info"]["ans0"][1] == "unknown" and row["answer_info"]["ans2"][0] == "grandson"
    assert row["label"] == 2 and row[f"ans{row['label']}"] == ROW["ans1"]
    with pytest.raises(ValueError, match="permutation"):
        permuted_row(ROW, (0, 0, 1))


@needs_bbq
def test_shuffled_samples_keep_the_gold_answer_text_and_the_letters_follow():
    plain = {s.id: s for s in load_bbq(BBQ_DIR, categories=["Age"], n_per_category=40, seed=3).samples}
    shuffled = load_bbq(BBQ_DIR, categories=["Age"], n_per_category=40, seed=3, shuffle_options=True).samples
    assert sorted(plain) == sorted(s.id for s in shuffled)
    moved = 0
    for s in shuffled:
        p, g = plain[s.id], s.gold
        gold_text = p.gold["answers"][p.gold["label"]]
        assert g["answers"][g["label"]] == gold_text and g["label_letter"] == LETTERS[g["label"]]
        assert sorted(g["answers"]) == sorted(p.gold["answers"])
        for key in ("unknown_letter", "target_letter"):
            assert g["answers"][LETTERS.index(g[key])] == p.gold["answers"][LETTERS.index(p.gold[key])]
        prompt = s.messages[-1]["content"]
        assert f"{g['label_letter']}) {gold_text}\n" in prompt
        assert s.target.startswith(f"Answer: {g['label_letter']}\n")  # the SFT reference follows too
        assert bbq_rule(s.target, g) == 1.0 and bbq_rule(p.target, g) == (1.0 if p.target[8] == g["label_letter"]
                                                                            else 0.0)
        moved += g["answers"] != p.gold["answers"]
    assert moved > len(shuffled) / 2  # 5 of 6 orders move something


@needs_bbq
def test_shuffled_gold_letters_are_about_uniform():
    samples = load_bbq(BBQ_DIR, categories=["Age"], seed=0, shuffle_options=True).samples  # 3,680 rows
    counts = Counter(s.gold["label_letter"] for s in samples)
    # 1/3 each: the standard error of a share is sqrt(1/3 * 2/3 / 3680) = 0.0078; allow 4 of them
    assert all(abs(counts[c] / len(samples) - 1 / 3) < 0.032 for c in LETTERS), counts
    unknown = Counter(s.gold["unknown_letter"] for s in samples)
    assert all(abs(unknown[c] / len(samples) - 1 / 3) < 0.032 for c in LETTERS), unknown


@needs_bbq
def test_shuffling_is_off_by_default_and_leaves_samples_as_the_file_has_them():
    samples = load_bbq(BBQ_DIR, categories=["Age"], n_per_category=8, seed=0).samples
    rows = {json.loads(x)["example_id"]: json.loads(x) for x in (BBQ_DIR / "Age.jsonl").read_text().splitlines()}
    for s in samples:
        row = rows[s.meta["example_id"]]
        assert s.gold["answers"] == [row["ans0"], row["ans1"], row["ans2"]] and s.gold["label"] == row["label"]
        assert "shuffled" not in s.meta and for_epoch(s, 5) is s


@needs_bbq
def test_each_epoch_shows_its_own_order_and_the_sampler_uses_it():
    samples = load_bbq(BBQ_DIR, categories=["Age"], n_per_category=8, seed=1, shuffle_options=True).samples
    assert all(for_epoch(s, 0) is s for s in samples)
    later = [for_epoch(s, 1) for s in samples]
    assert [x.id for x in later] == [s.id for s in samples]
    assert any(a.gold["answers"] != b.gold["answers"] for a, b in zip(samples, later, strict=True))
    for a, b in zip(samples, later, strict=True):
        assert b.gold["answers"][b.gold["label"]] == a.gold["answers"][a.gold["label"]]
        assert b.gold["answers"] == [b.meta["shuffled"]["row"][f"ans{i}"] for i in option_order(1, b.id, 1)]
    assert for_epoch(later[0], 1) is later[0] and for_epoch(later[0], 0).gold == samples[0].gold
    sampler = TaskBalancedSampler({"fairness": samples}, seed=0)
    first, second = sampler.next_batch(len(samples)), sampler.next_batch(len(samples))
    assert all(s.meta["shuffled"]["epoch"] == 0 for s in first)
    assert all(s.meta["shuffled"]["epoch"] == 1 for s in second)
    assert {s.id: s.gold for s in second} == {s.id: s.gold for s in later}


@needs_bbq
def test_data_shuffle_options_reaches_the_builtin_bbq_source():
    from grpo.config.command_line import parse_trainer_argv
    from grpo.run.assembly.samples import load_samples

    args = ["--data.source", "dual", "--data.data_dir", str(BBQ_DIR.parent), "--data.bbq_categories", "Age",
            "--data.bbq_per_category", "8", "--data.halueval_subsets", "general", "--data.halueval_per_subset", "2"]
    off = load_samples(parse_trainer_argv(args, "t", "t")[0].data, 0).every
    on = load_samples(parse_trainer_argv(args + ["--data.shuffle_options", "true"], "t", "t")[0].data, 0).every
    assert not any("shuffled" in s.meta for s in off)
    assert [s.id for s in on] == [s.id for s in off]
    assert all(("shuffled" in s.meta) == s.id.startswith("bbq/") for s in on)
    assert [s.gold for s in on if not s.id.startswith("bbq/")] == [s.gold for s in off if not s.id.startswith("bbq/")]


def test_balanced_positions_hold_each_letter_equally_often_within_each_condition():
    conditions = ["ambig"] * 7 + ["disambig"] * 6 + ["ambig"] * 3  # 10 ambiguous rows, 6 disambiguated
    positions = balanced_positions(conditions, seed=4)
    ambig = Counter(p for p, c in zip(positions, conditions, strict=True) if c == "ambig")
    disambig = Counter(p for p, c in zip(positions, conditions, strict=True) if c == "disambig")
    assert disambig == {0: 2, 1: 2, 2: 2}
    assert sorted(ambig.values()) == [3, 3, 4] and set(ambig) == {0, 1, 2}  # 10 = 3 + 3 + 4
    assert positions == balanced_positions(conditions, seed=4)
    assert any(balanced_positions(conditions, seed=s) != positions for s in range(5, 9))
    assert balanced_positions([], seed=0) == []


def test_order_with_gold_at_moves_the_gold_and_keeps_the_others_in_order():
    assert order_with_gold_at((2, 0, 1), label=0, position=0) == (0, 2, 1)
    assert order_with_gold_at((2, 0, 1), label=0, position=2) == (2, 1, 0)
    assert order_with_gold_at((2, 0, 1), label=0, position=1) == (2, 0, 1)  # already there: unchanged
    row = permuted_row(ROW, order_with_gold_at((2, 0, 1), label=ROW["label"], position=0))
    assert row["label"] == 0 and row["ans0"] == ROW["ans1"]


@needs_bbq
def test_the_evaluated_rows_make_every_one_letter_answer_score_a_third_in_each_condition():
    # the preset's BBQ rows: 6 categories x 60, seed 0; one letter to every row of 64 random orders scored 0.19-0.44
    samples = load_bbq(BBQ_DIR, n_per_category=60, seed=0, shuffle_options=True).samples
    held = samples[::5][:64]
    shown = balanced_heldout(held)
    assert [s.id for s in shown] == [s.id for s in held]
    before = Counter(s.gold["label_letter"] for s in held)
    assert max(before.values()) - min(before.values()) > 3  # independent orders: the letters are uneven
    for condition in ("ambig", "disambig"):
        rows = [s for s in shown if s.gold["context_condition"] == condition]
        counts = Counter(s.gold["label_letter"] for s in rows)
        assert set(counts) == set(LETTERS) and max(counts.values()) - min(counts.values()) <= 1, (condition, counts)
    for a, b in zip(held, shown, strict=True):  # the same question and options; the gold text and the SFT target follow
        assert sorted(a.gold["answers"]) == sorted(b.gold["answers"])
        assert b.gold["answers"][b.gold["label"]] == a.gold["answers"][a.gold["label"]]
        assert f"{b.gold['label_letter']}) {b.gold['answers'][b.gold['label']]}\n" in b.messages[-1]["content"]
        assert b.target.startswith(f"Answer: {b.gold['label_letter']}\n") and bbq_rule(b.target, b.gold) == 1.0
        assert (b.gold["answers"][LETTERS.index(b.gold["unknown_letter"])] ==
                a.gold["answers"][LETTERS.index(a.gold["unknown_letter"])])
    assert balanced_heldout(shown) == shown  # a second pass shows the same
    plain = load_bbq(BBQ_DIR, categories=["Age"], n_per_category=8, seed=0).samples
    assert balanced_heldout(plain) == plain  # the file's order (shuffle_options off) is left alone


@needs_bbq
def test_a_run_evaluates_the_balanced_rows():
    from grpo.config.command_line import parse_trainer_argv
    from grpo.run.assembly.samples import group_by_task, load_samples

    cfg = parse_trainer_argv(["--preset", "smollm2-dual", "--data.data_dir", str(BBQ_DIR.parent)], "t", "t")[0]
    rows = load_samples(cfg.data, cfg.train.seed)
    _, heldout = group_by_task(rows.train, rows.heldout, cfg.data)
    bbq = heldout["fairness"]
    assert len(bbq) == cfg.data.eval_size
    for condition in ("ambig", "disambig"):
        counts = Counter(s.gold["label_letter"] for s in bbq if s.gold["context_condition"] == condition)
        assert max(counts.values()) - min(counts.values()) <= 1, (condition, counts)
