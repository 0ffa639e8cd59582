"""data.bbq_ambiguous_share: BBQ training rows thinned so that abstaining everywhere is not paid."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from grpo.config import ConfigError
from grpo.core.rule_graders import LETTERS, bbq_rule
from grpo.core.step_types import Sample
from grpo.data.bbq import condition_counts, load_bbq, with_ambiguous_share

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
needs_bbq = pytest.mark.skipif(not (DATA / "bbq").is_dir(), reason="shared BBQ data absent")


def test_condition_counts_by_hand():
    assert condition_counts(264, 264, 1 / 3) == (132, 264)  # 132 / 396 = 1/3: ambiguous rows dropped
    assert condition_counts(30, 90, 1 / 3) == (30, 60)  # already under a third: disambiguated rows dropped
    assert condition_counts(30, 60, 1 / 3) == (30, 60)  # already there: nothing dropped
    assert condition_counts(10, 30, 0.5) == (10, 10)
    assert condition_counts(7, 7, 0.333) == (3, 7)  # 7 * 0.333 / 0.667 = 3.49 -> 3
    assert condition_counts(0, 5, 1 / 3) == (0, 0)  # no ambiguous row: no disambiguated one can stay


def _sample(i: int, category: str, condition: str | None) -> Sample:
    gold = {"context_condition": condition} if condition else {"label": 1}
    return Sample(task="t", id=f"{category}/{i}", messages=({"role": "user", "content": str(i)},), gold=gold,
                  meta={"category": category})


def test_thinning_keeps_other_rows_and_the_order_and_is_seeded():
    rows = ([_sample(i, "Age", "ambig" if i % 2 else "disambig") for i in range(12)]
            + [_sample(i, "SES", "ambig") for i in range(12, 15)] + [_sample(i, "x", None) for i in range(15, 18)])
    kept = with_ambiguous_share(rows, 1 / 3, seed=0)
    by = Counter((s.meta["category"], s.gold.get("context_condition")) for s in kept)
    assert by == {("Age", "ambig"): 3, ("Age", "disambig"): 6, ("x", None): 3}  # SES has no disambiguated row
    assert [rows.index(s) for s in kept] == sorted(rows.index(s) for s in kept)
    assert with_ambiguous_share(rows, 1 / 3, seed=0) == kept
    assert any(with_ambiguous_share(rows, 1 / 3, seed=s) != kept for s in range(1, 6))
    assert with_ambiguous_share(rows, 0, seed=0) == rows


@needs_bbq
def test_at_a_third_a_context_blind_answer_earns_the_same_whatever_it_abstains():
    """On the real rows, graded by the preset's grader: answering "unknown" to every row and answering one of the two
    people at random earn the same mean reward once a third of the rows are ambiguous; as loaded (half), "unknown"
    earns half and a person a quarter, which is what pays a model that cannot read the context to abstain."""
    rows = load_bbq(DATA / "bbq", n_per_category=60, seed=0, shuffle_options=True).samples

    def rewards(samples: list[Sample]) -> tuple[float, float]:
        unknown = [bbq_rule(f"Answer: {s.gold['unknown_letter']}", s.gold) for s in samples]
        person = [sum(bbq_rule(f"Answer: {letter}", s.gold) for letter in LETTERS
                      if letter != s.gold["unknown_letter"]) / 2 for s in samples]
        return sum(unknown) / len(samples), sum(person) / len(samples)

    assert rewards(rows) == pytest.approx((0.5, 0.25))
    kept = with_ambiguous_share(rows, 1 / 3, seed=0)
    unknown, person = rewards(kept)
    assert unknown == pytest.approx(1 / 3) and person == pytest.approx(1 / 3)
    assert len(kept) == len(rows) * 3 // 4  # every disambiguated row kept, half of the ambiguous ones dropped


@needs_bbq
def test_the_share_thins_training_rows_only():
    from grpo.config.command_line import parse_trainer_argv
    from grpo.run.assembly.samples import load_samples

    args = ["--preset", "smollm2-dual", "--data.data_dir", str(DATA), "--data.halueval_per_subset", "20"]
    plain = load_samples(parse_trainer_argv(args, "t", "t")[0].data, 0)
    thinned = load_samples(parse_trainer_argv(args + ["--data.bbq_ambiguous_share", "0.333"], "t", "t")[0].data, 0)
    assert thinned.heldout == plain.heldout
    assert [s for s in thinned.train if s.task != "fairness"] == [s for s in plain.train if s.task != "fairness"]
    conditions = Counter(s.gold["context_condition"] for s in thinned.train if s.task == "fairness")
    assert conditions["ambig"] / (conditions["ambig"] + conditions["disambig"]) == pytest.approx(1 / 3, abs=0.01)
    assert conditions["disambig"] == sum(s.gold["context_condition"] == "disambig" for s in plain.train
                                         if s.task == "fairness")


def test_the_share_is_checked_and_needs_bbq_rows(tmp_path):
    from grpo.config.command_line import parse_trainer_argv
    from grpo.run.assembly.samples import load_samples

    with pytest.raises(ConfigError, match="data.bbq_ambiguous_share") as bad:
        parse_trainer_argv(["--data.bbq_ambiguous_share", "1.0"], "t", "t")
    assert bad.value.field == "data.bbq_ambiguous_share"
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(f'{{"task": "qa", "id": "{i}", "prompt": "2+{i}?", "answer": "{2 + i}"}}\n'
                            for i in range(20)))
    cfg = parse_trainer_argv(["--data.source", str(rows), "--data.bbq_ambiguous_share", "0.333"], "t", "t")[0]
    with pytest.raises(ConfigError, match="no BBQ training rows") as none:
        load_samples(cfg.data, 0)
    assert none.value.field == "data.bbq_ambiguous_share"
    demo = parse_trainer_argv(["--data.bbq_ambiguous_share", "0.333"], "t", "t")[0]  # its fairness rows are BBQ's shape
    conditions = Counter(s.gold["context_condition"] for s in load_samples(demo.data, 0).train
                         if "context_condition" in s.gold)
    assert conditions["ambig"] / sum(conditions.values()) == pytest.approx(1 / 3, abs=0.01)


@needs_bbq
def test_only_the_announcing_process_prints_what_loading_did(capsys):
    # under accelerate every rank loads the same rows; the lines are printed once, by rank 0 (announce=dist.is_main)
    from grpo.config.command_line import parse_trainer_argv
    from grpo.run.assembly.samples import load_samples

    args = ["--preset", "smollm2-dual", "--data.data_dir", str(DATA), "--data.halueval_per_subset", "20",
            "--data.bbq_ambiguous_share", "0.333", "--data.halueval_subsets", "general_recognition,qa"]
    data = parse_trainer_argv(args, "t", "t")[0].data  # qa_data.json is not in the shared data: a skip note
    quiet = load_samples(data, 0, announce=False)
    assert capsys.readouterr() == ("", "")
    loud = load_samples(data, 0)
    out, err = capsys.readouterr()
    assert "data.bbq_ambiguous_share=0.333: BBQ training rows" in out
    assert "note: HaluEval subset 'qa' skipped" in err
    assert quiet == loud
