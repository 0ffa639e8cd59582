"""grpo.report on the fixture run: deltas worked out from eval.json by hand, findings and verdict."""

import json
import shutil
from pathlib import Path

import pytest

from grpo.health import HealthThresholds
from grpo.report import build_report, format_report

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
    report = build_report(run_dir, HealthThresholds(kl_band_patience=31))  # the excursion lasts 30 steps
    assert report["verdict"] == "green" and report["findings"] == []


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
