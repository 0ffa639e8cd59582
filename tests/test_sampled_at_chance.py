"""The pass@K diagnostic read against a uniform guess: a multiple-choice task whose right option is sampled no more
often than chance before RL is a finding (grpo/run/doctor/end_checks.sampled_at_chance) in the run's report."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from grpo.core.pass_at_k import guess_pass_at_k
from grpo.run.doctor.end_checks import sampled_at_chance

CONFIG = {"train": {"pass_at_k": 4}, "sft": {"max_examples": 48}}


def figures(task: str, got: float, one: float, choices: int) -> dict[str, float]:
    return {f"eval/{task}/pass_at_k": got, f"eval/{task}/pass_at_1": one,
            f"eval/{task}/pass_at_k_guess": guess_pass_at_k(choices, 4), f"eval/{task}/pass_at_1_guess": 1 / choices}


def test_at_or_below_a_guess_is_a_yellow_finding_above_it_none():
    # preset-s0 of smollm2-dual: BBQ pass@4 0.642 (pass@1 0.312) against a guess's 0.802 among 3 options
    (f,) = sampled_at_chance(figures("fairness", 0.642, 0.312, 3), CONFIG)
    assert (f.level, f.code, f.task) == ("yellow", "sampled_at_chance", "fairness")
    assert "among 4 sampled replies" in f.message and "0.642" in f.message and "(0.802)" in f.message
    assert "pass@1 0.312 vs 0.333" in f.message and "sft.max_examples=96" in f.suggestion
    edge = guess_pass_at_k(2, 4)
    assert [g.task for g in sampled_at_chance(figures("recog", edge, 0.5, 2), CONFIG)] == ["recog"]  # equal: fires
    assert sampled_at_chance(figures("recog", edge + 1e-3, 0.5, 2), CONFIG) == []
    # free-answer tasks have no guess figure: nothing to compare with
    assert sampled_at_chance({"eval/t/pass_at_k": 0.1, "eval/t/pass_at_1": 0.05}, CONFIG) == []


def test_the_report_turns_yellow_on_it_and_prints_both_figures(tmp_path):
    from grpo.run.doctor.report import build_report, format_report

    run_dir = tmp_path / "run"
    shutil.copytree(Path(__file__).resolve().parent / "fixtures" / "run_demo", run_dir,
                    ignore=shutil.ignore_patterns("*.png", "report.json", "*.py"))
    before = {(f["code"], f["task"]) for f in build_report(run_dir)["findings"]}
    (run_dir / "pass_at_k.json").write_text(json.dumps(figures("fairness", 0.5, 0.2, 3)))
    report = build_report(run_dir)
    assert {(f["code"], f["task"]) for f in report["findings"]} == before | {("sampled_at_chance", "fairness")}
    assert report["pass_at_k"]["eval/fairness/pass_at_k"] == pytest.approx(0.5)
    assert "pass@k before RL fairness: 0.500  (a uniform guess: 0.802)" in format_report(report)
