"""grpo.run.doctor.report on the fixture run: deltas worked out from eval.json by hand, findings and verdict."""

import json
import shutil
from pathlib import Path

import pytest

from grpo.run.doctor.report import build_report, format_report
from grpo.run.doctor.thresholds import DoctorThresholds

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "run_demo"


@pytest.fixture
def run_dir(tmp_path):
    dst = tmp_path / "run_demo"
    shutil.copytree(FIXTURE, dst, ignore=shutil.ignore_patterns("*.png", "report.json", "*.py"))
    return dst


def test_report_deltas_findings_and_verdict(run_dir):
    report = build_report(run_dir)
    # eval.json: fairness 0.41 -> 0.55 -> 0.68, hallucination 0.30 -> 0.42 -> 0.47
    fair, hall = report["tasks"]["fairness"], report["tasks"]["hallucination"]
    assert fair["delta"] == pytest.approx(0.27) and fair["delta_sft"] == pytest.approx(0.14)
    assert fair["delta_rl"] == pytest.approx(0.13)
    assert hall["delta"] == pytest.approx(0.17) and hall["delta_sft"] == pytest.approx(0.12)
    assert hall["delta_rl"] == pytest.approx(0.05)
    # the fixture holds kl/hallucination above its band [0.01, 0.05] for steps 30..59, and one skipped step
    assert [(f["level"], f["code"]) for f in report["findings"]] == [("yellow", "kl_out_of_band")]
    assert "kl/hallucination" in report["findings"][0]["message"] and "30 steps" in report["findings"][0]["message"]
    assert report["verdict"] == "yellow" and len(report["suggestions"]) == 1
    assert report["summary"]["rows"] == 60 and report["summary"]["skipped_steps"] == 1
    assert json.loads((run_dir / "report.json").read_text()) == json.loads(json.dumps(report))


def test_thresholds_change_the_verdict(run_dir):
    report = build_report(run_dir, DoctorThresholds(kl_band_patience=31))  # the excursion lasts 30 steps
    assert report["verdict"] == "green" and report["findings"] == []


def test_the_report_command_prints_the_summary_or_exits_2(run_dir, tmp_path, capsys):
    from grpo.run.doctor.__main__ import doctor_cli

    doctor_cli(["report", str(run_dir)])  # python -m grpo.run.doctor report RUN_DIR
    assert capsys.readouterr().out.strip() == format_report(json.loads((run_dir / "report.json").read_text()))
    with pytest.raises(SystemExit) as exit_:
        doctor_cli(["report", str(tmp_path / "nope")])
    assert exit_.value.code == 2 and "error: " in capsys.readouterr().err


def test_format_report_is_an_aligned_table(run_dir):
    text = format_report(build_report(run_dir))
    lines = text.splitlines()
    assert lines[1] == "Verdict: YELLOW"
    header = next(line for line in lines if line.startswith("task"))
    fair = next(line for line in lines if line.startswith("fairness"))
    hall = next(line for line in lines if line.startswith("hallucination"))
    assert len(header) == len(fair) == len(hall)  # right-aligned columns
    assert fair.split() == ["fairness", "0.410", "0.550", "0.680", "+0.140", "+0.130", "+0.270"]
    assert hall.split() == ["hallucination", "0.300", "0.420", "0.470", "+0.120", "+0.050", "+0.170"]
    assert "[yellow] kl_out_of_band" in text


def test_missing_phases_and_missing_eval(run_dir):
    (run_dir / "eval.json").write_text(json.dumps({"before_sft": {"fairness": 0.4}, "after_rl": {"fairness": 0.3}}))
    report = build_report(run_dir)
    row = report["tasks"]["fairness"]
    assert row["after_sft"] is None and row["delta_rl"] is None and row["delta"] == pytest.approx(-0.1)
    assert report["verdict"] == "red"  # 0.3 - 0.4 = -0.1 < -0.05: reward regressed
    assert "reward_regressed" in {f["code"] for f in report["findings"]}
    assert "-0.100" in format_report(report) and " - " in format_report(report)
    (run_dir / "eval.json").unlink()
    report = build_report(run_dir)
    assert report["tasks"] == {} and report["reasons"][-1].startswith("no eval.json")


# ---------------------------------------------------------------------------------------------------------------
# Verdicts of real runs (trimmed by tests/fixtures/make_run_fixture.py; each folder's SOURCE.md gives the command)
# ---------------------------------------------------------------------------------------------------------------

FIXTURES = FIXTURE.parent


def real_run(tmp_path, name):
    dst = tmp_path / name
    shutil.copytree(FIXTURES / name, dst, ignore=shutil.ignore_patterns("report.json", "*.md"))
    return build_report(dst)


def test_demo_seed0_is_green(tmp_path):
    report = real_run(tmp_path, "run_seed0")
    assert report["verdict"] == "green" and report["findings"] == []
    assert format_report(report).splitlines()[1] == "Verdict: GREEN"


def test_lora_run_with_zero_reward_at_every_step_is_red(tmp_path):
    report = real_run(tmp_path, "run_lora_zero")
    assert report["verdict"] == "red"
    found = {(f["code"], f["task"]) for f in report["findings"]}
    assert {("no_learning_signal", ""), ("reward_stuck", "fairness"), ("reward_stuck", "hallucination")} <= found
    signal = next(f for f in report["findings"] if f["code"] == "no_learning_signal")
    assert "120 steps in a row (steps 1-120)" in signal["message"]
    assert signal["suggestion"].startswith("try `model.lora=false`: the warm-up ended at loss 3.96 nats per token")


def test_notebook_three_steps_are_too_short_to_judge(tmp_path):
    report = real_run(tmp_path, "run_notebook")
    assert report["verdict"] == "too short to judge"
    assert report["reasons"][0].startswith("too short to judge: 3 RL step(s)")
    (signal,) = [f for f in report["findings"] if f["code"] == "no_learning_signal"]  # its 3 steps had loss 0, gnorm 0
    assert signal["level"] == "yellow" and "in any of the 3 step(s) so far" in signal["message"]
    assert format_report(report).splitlines()[1].startswith("Verdict: TOO SHORT TO JUDGE: 3 RL step(s), at least 20")


def zero_reward(completion: str, gold: dict) -> float:
    """A reward no completion can raise: every group of K is all zeros."""
    return 0.0


@pytest.mark.usefixtures("one_thread")
def test_a_real_run_that_cannot_learn_is_red(tmp_path):
    """Through grpo_train's own functions: a tiny model whose reward is 0 for every completion trains 6 steps; the
    report of its run folder says RED (no learning signal), not too short and not yellow. (The steps take ~2 s; the
    first import of transformers, when no other test did it, most of the rest.)"""
    import grpo_train as G
    from tests.trainer_helpers import fast_config

    zero = "tests.test_report:zero_reward:1.0"
    run = G.setup(fast_config(tmp_path, "train.max_steps=6", f"rewards.fairness={zero}",
                              f"rewards.hallucination={zero}",
                              "rollout.k=2", "rollout.max_new_tokens=2", "train.prompts_per_micro_step=1"))
    for step in range(1, 7):
        G.rl_step(run, step)
    run.tracker.close()
    report = build_report(run.run_dir)
    assert report["verdict"] == "red", report["reasons"]
    (signal,) = [f for f in report["findings"] if f["code"] == "no_learning_signal"]
    assert "6 steps in a row (steps 1-6)" in signal["message"]
    assert "every group had zero reward std" in signal["message"]


def demo_run(tmp_path, *overrides: str):
    """`python grpo_train.py` (the demo preset) with `overrides`, through grpo_train.main; returns the run folder."""
    import grpo_train as G
    from grpo import config as C

    cfg = C.load_config("demo", [f"train.output_dir={tmp_path}", "train.run_name=r", "train.tensorboard=false",
                                 *overrides])
    return G.main(cfg).run_dir


@pytest.mark.usefixtures("one_thread")
def test_the_lora_demo_run_learns_nothing_and_is_red(tmp_path):
    """`python grpo_train.py --model.lora true`, shortened to 6 RL steps and 8 held-out prompts per task: the adapter
    cannot fit the SFT demonstrations on the randomly initialised model, so every sampled completion scores 0 and
    every group is zero-std at every step; the report is RED (the fixture run_lora_zero is the full 120 steps)."""
    run_dir = demo_run(tmp_path, "model.lora=true", "train.max_steps=6", "data.eval_size=8")
    rows = [r for r in read_rows(run_dir) if "loss/total" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert all(r["reward/fairness/mean"] == r["reward/hallucination/mean"] == 0.0 for r in rows)
    assert all(r["adv/frac_zero_std"] == 1.0 and r["loss/total"] == 0.0 for r in rows)
    report = json.loads((run_dir / "report.json").read_text())
    assert report["verdict"] == "red"
    (signal,) = [f for f in report["findings"] if f["code"] == "no_learning_signal"]
    assert signal["level"] == "red" and "6 steps in a row (steps 1-6)" in signal["message"]
    assert signal["suggestion"].startswith("try `model.lora=false`: the warm-up ended at loss")


@pytest.mark.usefixtures("one_thread")
def test_the_notebooks_three_steps_are_too_short_to_judge(tmp_path):
    """The notebook's run (notebooks/quickstart.ipynb: 3 RL steps, 5 SFT steps, 8 held-out prompts per task) through
    the trainer: no red finding in 3 steps, so TOO SHORT TO JUDGE, not a colour."""
    run_dir = demo_run(tmp_path, "train.max_steps=3", "sft.steps=5", "data.eval_size=8")
    report = json.loads((run_dir / "report.json").read_text())
    assert report["verdict"] == "too short to judge", report["reasons"]
    assert report["reasons"][0].startswith("too short to judge: 3 RL step(s), at least 20 are needed")
    assert format_report(report).splitlines()[1].startswith("Verdict: TOO SHORT TO JUDGE: 3 RL step(s)")


def read_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_reported_seed1_history_is_red_with_collapse_onto_unknown(tmp_path):
    """The reported seed-1 collapse (docs/BUG_FIXES.md section 11), rebuilt from its reported figures
    (tests/fixtures/run_seed1_reported/SOURCE.md)."""
    report = real_run(tmp_path, "run_seed1_reported")
    assert report["verdict"] == "red"
    (collapse,) = [f for f in report["findings"] if f["code"] == "answer_collapse"]
    assert collapse["task"] == "hallucination" and "collapse onto `unknown`" in collapse["message"]
    assert "77% of the task's samples" in collapse["message"] and collapse["since"] == 45  # 6 collapsed steps of 10
    # in the window 36-45: top answer in 6 of 10 steps (>= half), mean share (4 x 0.4 + 6 x ~0.77) / 10 >= 0.6
    assert "[red] answer_collapse (since step 45): hallucination: collapse onto `unknown`" in format_report(report)


def test_real_seed1_run_that_stalls_is_red(tmp_path):
    """Seed 1 at lr 1e-3, a real run: held-out stuck at 0.703 / 0.688 from step 20, `yes` answers lost."""
    report = real_run(tmp_path, "run_seed1_lr1e-3")
    assert report["verdict"] == "red"
    found = {(f["code"], f["task"]) for f in report["findings"]}
    assert {("entropy_collapse", "fairness"), ("entropy_collapse", "hallucination"),
            ("answer_collapse", "fairness")} <= found
    stalled = next(f for f in report["findings"] if f["code"] == "entropy_collapse" and f["task"] == "hallucination")
    assert "stays at 0.688, below the solved level 0.9, over its last 3 evaluations" in stalled["message"]
    assert any(a["code"] == "answer_collapse" and "collapse onto `unknown`" in a["message"] for a in report["cleared"])


def test_real_seed1_run_at_the_preset_lr_recovers_and_is_green(tmp_path):
    """The same seed at the preset's learning rate on this machine: the same lost `yes` between steps 40 and 80, then
    1.000 on both tasks; no alarm is active at the end."""
    report = real_run(tmp_path, "run_seed1")
    assert report["verdict"] == "green" and report["findings"] == []


def test_the_report_gives_the_runs_peak_memory(run_dir):
    """summary.host_peak_gb / gpu_peak_gb: the largest memory/host_peak_gb / memory/gpu_peak_gb any row logged (a
    resumed run's process starts its peak again); the header line says them; None, and nothing said, without them."""
    report = build_report(run_dir)
    assert report["summary"]["host_peak_gb"] is None and report["summary"]["gpu_peak_gb"] is None
    assert "peak host memory" not in format_report(report)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    for i, row in enumerate(rows):
        row["memory/host_rss_gb"] = 1.0
        row["memory/host_peak_gb"] = 2.5 if i == 20 else 1.5  # e.g. a resume after step 20 started a new process
        row["memory/gpu_peak_gb"] = 7.25
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = build_report(run_dir)
    assert report["summary"]["host_peak_gb"] == 2.5 and report["summary"]["gpu_peak_gb"] == 7.25
    assert format_report(report).splitlines()[0].endswith(", peak host memory 2.50 GB, peak GPU memory 7.25 GB")
