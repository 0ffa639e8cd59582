"""benchmarks/gpu_check.py --cpu: the GPU check's five parts run end to end on the CPU with tiny shapes, so the
command a GPU session runs has run here first. Its figures are the machinery's, not a speed claim."""

import json
import subprocess
import sys

import pytest
from conftest import ROOT

pytest.importorskip("trl")  # part b runs TRL's trainer beside ours


def test_gpu_check_runs_every_part_on_the_cpu(tmp_path):
    """The parts' budgets are the GPU session's plan, not what this test checks: on a busy 2-core machine they are
    taken ten times over (--budget-scale), so load alone cannot fail a part."""
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--cpu", "--out", str(tmp_path),
                           "--parts", "a,b,c,d,e", "--budget-scale", "10"], cwd=ROOT, capture_output=True,
                          text=True, timeout=3000)
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    log = (tmp_path / "gpu_check.log").read_text()
    parts = report["parts"]
    assert {name: part["status"] for name, part in parts.items()} == dict.fromkeys("abcde", "ok"), (
        proc.stdout[-3000:], log[-5000:])
    assert proc.returncode == 0
    # a: fp32 tokens of both engines are generate's, the graph step's bf16 log-probs within bf16's own rounding; the
    # LoRA fold moves bf16 log-probs by rounding only
    assert parts["a"]["passes"] == {"lean": True, "graph": True}
    assert parts["a"]["float32"]["graph_logprob_vs_forward"]["max_abs"] < 1e-4
    assert 0 < parts["a"]["fold_lora_bf16"]["max_abs_logprob_diff"] < 0.1
    # b: every engine decoded against the floor; our default path, each engine and TRL ran the same RL work
    assert set(parts["b"]["decode"]) == {"lean", "hf", "graph"}
    assert all(d["x_floor"] > 1 for d in parts["b"]["decode"].values())
    runs = parts["b"]["vs_trl"]
    assert set(runs) == {"ours-default", "ours-graph", "trl"}  # on the CPU the default is the lean loop
    assert all(r["trl_time_over_ours"] > 0 and r["cycle_spread"] >= 1 for k, r in runs.items() if k != "trl")
    # c: a profile table; d: the seed-shape machinery with its estimate; e: the demo's verdict
    assert "Name" in parts["c"]["table"] and parts["c"]["step_metrics"]["time/step"] > 0
    case = parts["d"]["cases"][0]
    assert case["status"] == "ok" and case["decode_x_floor"] > 1 and case["estimate"]
    assert parts["e"]["returncode"] == 0 and parts["e"]["verdict"].startswith("TOO SHORT TO JUDGE")
    # b: each side's phases on the same names, the rest of the step (grading + reference + update) on both
    for label in ("ours-default", "trl"):
        assert set(runs[label]["phase_s"]) == {"generate", "grading", "reference", "update", "rest"}, label
    assert runs["ours-graph"]["graph_counts"]["fallbacks"] == [0.0] * 3  # the graph engine's counts, cycle by cycle
    assert "gpu_check on cpu" in proc.stdout
    # the goals table: every goal with a figure and a status, the card, torch and the commit
    goals = {g["goal"]: g for g in report["goals"]}
    assert len(goals) == 10 and all(g["status"] in ("pass", "miss", "not measured") for g in goals.values())
    assert goals["e. the demo's verdict GREEN"]["figure"] == "TOO SHORT TO JUDGE"
    assert goals["b. decode <= 5x the floor (0.5B shape, graph engine)"]["status"] != "not measured"
    assert "goals on cpu, torch" in proc.stdout and "commit " in proc.stdout
    # a folder that holds a report is refused, not written over
    again = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--cpu", "--out",
                            str(tmp_path), "--parts", "e"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "holds an earlier report (gpu_check.json)" in again.stderr
    assert json.loads((tmp_path / "gpu_check.json").read_text()) == report


def test_gpu_check_refuses_a_budget_scale_that_is_no_positive_number(tmp_path):
    for bad in ("0", "-1", "nan"):
        proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--cpu", "--out", str(tmp_path / "r"),
                               "--budget-scale", bad], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and "--budget-scale" in proc.stderr and "Traceback" not in proc.stderr, bad
        assert not (tmp_path / "r").exists()


def test_gpu_check_refuses_an_out_it_cannot_write(tmp_path):
    """--out naming a file, or a folder it cannot make or write in: a message naming it, exit 2, no traceback."""
    script = ["-m", "benchmarks.gpu_check"]
    afile = tmp_path / "report.txt"
    afile.write_text("keep me")
    proc = subprocess.run([sys.executable, *script, "--cpu", "--out", str(afile)], cwd=ROOT, capture_output=True,
                          text=True)
    assert proc.returncode == 2 and "is a file; give a folder" in proc.stderr and "Traceback" not in proc.stderr
    assert afile.read_text() == "keep me"
    # a folder that cannot be made (its parent is a file: what a read-only disk gives as well, an OSError)
    proc = subprocess.run([sys.executable, *script, "--cpu", "--out", str(afile / "sub")], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "cannot write there" in proc.stderr and "Traceback" not in proc.stderr
