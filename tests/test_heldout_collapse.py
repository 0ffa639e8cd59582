"""The doctor reads the held-out greedy answers too: one answer taking most of a task's evaluation is a finding."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from grpo.run.doctor.end_checks import heldout_collapse
from grpo.run.doctor.thresholds import DoctorThresholds

TH = DoctorThresholds()  # collapse_share 0.6, collapse_rise, solved_reward 0.9


def replies(**counts):
    return [f"Answer: {letter}\nJustification: ..." for letter, n in counts.items() for _ in range(n)]


def test_a_greedy_collapse_onto_one_letter_during_rl_is_red_and_suggests_shuffled_options():
    # a seed-1 run that collapsed: after SFT 13 / 11 / 8 for B / A / C, after RL 27 of 32 "B"
    answers = {"after_sft": {"fairness": replies(B=13, A=11, C=8)}, "after_rl": {"fairness": replies(B=27, A=3, C=2)}}
    (f,) = heldout_collapse(answers, {"after_rl": {"fairness": 0.45}}, TH)
    assert (f.level, f.code, f.task) == ("red", "heldout_collapse", "fairness")
    assert "`b` is 84% of the held-out greedy answers after RL (41% before RL)" in f.message  # 27/32, 13/32
    assert "data.shuffle_options=true" in f.suggestion


def test_a_letter_collapse_with_options_already_shuffled_suggests_the_kl_pull_instead():
    # the preset's runs shuffle the options: suggesting data.shuffle_options=true to them is a step they took already
    answers = {"after_sft": {"fairness": replies(B=13, A=11, C=8)}, "after_rl": {"fairness": replies(B=27, A=3, C=2)}}
    shuffled = {"data": {"shuffle_options": True}, "kl": {"default": {"beta": 0.04}}}
    (f,) = heldout_collapse(answers, {"after_rl": {"fairness": 0.45}}, TH, config=shuffled)
    assert "shuffle_options" not in f.suggestion and "kl.fairness.beta" in f.suggestion
    (g,) = heldout_collapse(answers, {"after_rl": {"fairness": 0.45}}, TH, config={"data": {"shuffle_options": False}})
    assert "data.shuffle_options=true" in g.suggestion


def test_no_finding_when_solved_mixed_or_not_evaluated_after_rl():
    collapsed = {"after_sft": {"t": replies(B=5, A=5)}, "after_rl": {"t": replies(B=10)}}
    assert heldout_collapse(collapsed, {"after_rl": {"t": 0.95}}, TH) == []  # solved: one right answer is fine
    mixed = {"after_rl": {"t": replies(B=5, A=3, C=2)}}  # top share 0.5 < 0.6
    assert heldout_collapse(mixed, {"after_rl": {"t": 0.3}}, TH) == []
    assert heldout_collapse({"after_sft": {"t": replies(B=10)}}, {"after_sft": {"t": 0.3}}, TH) == []


def test_a_reward_at_the_solved_level_excuses_one_answer_only_on_the_unit_scale():
    collapsed = {"after_sft": {"t": replies(B=5, A=5)}, "after_rl": {"t": replies(B=10)}}
    judge_rows = [{"step": s, "reward/t/mean": 2.0 + s} for s in range(1, 4)]  # a judge scoring 0-10
    (f,) = heldout_collapse(collapsed, {"after_rl": {"t": 0.95}}, TH, judge_rows)
    assert f.level == "red" and "not on the 0-1 scale" in f.message
    unit_rows = [{"step": s, "reward/t/mean": 0.2 * s} for s in range(1, 4)]
    assert heldout_collapse(collapsed, {"after_rl": {"t": 0.95}}, TH, unit_rows) == []


def test_a_collapse_that_was_there_before_rl_is_yellow():
    answers = {"after_sft": {"t": replies(B=8, A=2)}, "after_rl": {"t": replies(B=17, A=3)}}  # 0.8 -> 0.85
    (f,) = heldout_collapse(answers, {"after_rl": {"t": 0.5}}, TH)
    assert f.level == "yellow" and "(80% before RL)" in f.message
    free = {"after_rl": {"t": ["Answer: The data does not say."] * 9 + ["Answer: Paris"]}}
    (g,) = heldout_collapse(free, {"after_rl": {"t": 0.2}}, TH)  # not evaluated before RL: counted from 0
    assert g.level == "red" and "kl.t.beta" in g.suggestion and "not evaluated" in g.message


def test_the_report_reads_evals_and_turns_red(tmp_path):
    from grpo.run.doctor.report import build_report

    run_dir = tmp_path / "run"
    shutil.copytree(Path(__file__).resolve().parent / "fixtures" / "run_demo", run_dir,
                    ignore=shutil.ignore_patterns("*.png", "report.json", "*.py"))
    assert build_report(run_dir)["verdict"] == "yellow"  # the fixture's own finding: kl_out_of_band
    (run_dir / "evals").mkdir()
    for phase, counts in (("after_sft", {"A": 4, "B": 3, "C": 3}), ("after_rl", {"A": 9, "B": 1})):
        (run_dir / "evals" / f"{phase}.jsonl").write_text("".join(
            json.dumps({"task": "fairness", "completion": c}) + "\n" for c in replies(**counts)))
    report = build_report(run_dir)  # eval.json: fairness 0.68 after RL, below solved
    codes = [(f["level"], f["code"], f["task"]) for f in report["findings"]]
    assert ("red", "heldout_collapse", "fairness") in codes and report["verdict"] == "red"


def test_one_letter_before_each_rows_own_option_text_is_one_answer(tmp_path):
    """The `nosft` runs of benchmarks/RESULTS.md: after RL every BBQ reply opens with "B)" and goes on with one of that
    row's options, a different text on each row; the doctor must see one answer there, not 64."""
    from conftest import ROOT, load_script

    from grpo.run.doctor.report import heldout_answers

    kept = ROOT / "benchmarks" / "results" / "dual_ablation_balanced" / "nosft-s1"  # its records gzipped, as kept
    run = load_script("benchmarks/dual_ablation.py").unpack(kept, tmp_path)  # as the run wrote them
    answers = heldout_answers(run)
    assert len({a.split("\n")[0] for a in answers["after_rl"]["fairness"]}) > 10  # many texts after the one letter
    findings = [f for f in heldout_collapse(answers, {"after_rl": {"fairness": 0.328}}, TH) if f.task == "fairness"]
    assert [(f.level, f.code) for f in findings] == [("red", "heldout_collapse")]
    assert "`b` is 100% of the held-out greedy answers after RL" in findings[0].message

