"""scripts/reliability_probe.py, the tester's probe of bad inputs: its cases parse, its classification says what its
docstring says, and one case runs end to end through the script. The whole probe takes ~15 minutes: it is run by
hand (docs/VALIDATION.md), not here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
probe = load_script("scripts/reliability_probe.py")


def test_every_case_has_a_unique_name_a_known_expectation_and_words_where_it_expects_a_refusal():
    names = [c.name for c in probe.CASES]
    assert len(names) == len(set(names)), names
    assert len(names) >= 41  # every bad input the probe was built to try, the control included
    for case in probe.CASES:
        assert case.expect in (probe.REFUSE, probe.HANDLE, probe.EITHER), case
        assert callable(case.act), case
        if case.expect != probe.HANDLE:
            assert case.words, f"{case.name}: a refusal must name something"
        assert all(isinstance(w, str) or (isinstance(w, tuple) and w and all(isinstance(x, str) for x in w))
                   for w in case.words), case


def test_the_list_prints_every_case():
    out = subprocess.run([sys.executable, "-m", "scripts.reliability_probe", "--list"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert [line.split()[0] for line in out.stdout.splitlines()] == [c.name for c in probe.CASES]


def _case(expect: str, words=("data.max_document_chars",)):
    return probe.Case("c", "g", expect, tuple(words), act=lambda lab: None)


def _trial(code, err="", out="", **kw):
    return probe.Trial(probe.Proc(code, out, err, 1.0), **kw)


@pytest.mark.parametrize("expect,trial,outcome", [
    (probe.REFUSE, _trial(2, "config error: data.max_document_chars must be >= 0, got -5"), "OK-refused"),
    (probe.REFUSE, _trial(2, "config error: a setting is out of range"), "VAGUE"),
    (probe.REFUSE, _trial(0, out="run folder: runs/r"), "SILENT"),
    (probe.REFUSE, _trial(None), "HANG"),
    (probe.REFUSE, _trial(1, "Traceback (most recent call last):\n  ...\nValueError: data.max_document_chars"),
     "TRACEBACK"),
    (probe.REFUSE, _trial(2, "error: data.max_document_chars", texts=["Traceback (most recent call last):\n"]),
     "TRACEBACK"),  # an earlier command of the case (a failed start) counts too
    (probe.REFUSE, _trial(2, "error: data.max_document_chars", lost=["runs/hf/model.safetensors deleted"]), "SILENT"),
    (probe.HANDLE, _trial(0), "OK-handled"),
    (probe.HANDLE, _trial(2, "error: refusing to --overwrite"), "REFUSED"),
    (probe.HANDLE, _trial(0, lost=["made a folder literally named ~"]), "SILENT"),
    (probe.EITHER, _trial(0), "OK-handled"),
    (probe.EITHER, _trial(2, "error: set HF_HOME", ), "VAGUE"),
])
def test_classify(expect, trial, outcome):
    assert probe.classify(_case(expect), trial)[0] == outcome


def test_words_known_only_at_run_time_and_alternatives_must_be_named():
    case = _case(probe.REFUSE, words=(("train.seed", "--seed"),))
    assert probe.classify(case, _trial(2, "config error: --seed 9999 is above 2**64"))[0] == "OK-refused"
    assert probe.classify(case, _trial(2, "config error: seed too large"))[0] == "VAGUE"
    running = _trial(2, "error: runs/r is in use by process 4242", words=["4243"])
    assert probe.classify(_case(probe.REFUSE, ("runs/r",)), running)[0] == "VAGUE"
    running.words = ["4242"]
    assert probe.classify(_case(probe.REFUSE, ("runs/r",)), running)[0] == "OK-refused"


@pytest.mark.slow
def test_the_control_case_and_one_refusal_run_through_the_script(tmp_path):
    """The probe's control (a valid tiny run) and one refused case, end to end: a line per case, the table, the
    count, and the exit status that follows from the outcomes."""
    proc = subprocess.run([sys.executable, "-m", "scripts.reliability_probe", "--only", "baseline",
                           "binary-config", "--keep", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    progress = dict(line.strip().split(": ", 1) for line in proc.stdout.splitlines() if line.startswith("  "))
    outcomes = {name: text.split(" (")[0] for name, text in progress.items()}
    assert outcomes["baseline"] == "OK-handled", proc.stdout + proc.stderr
    assert (tmp_path / "baseline" / "runs" / "r" / "final").is_dir()
    assert outcomes["binary-config"] in probe.OUTCOMES, proc.stdout
    assert any(line.startswith("binary-config ") and outcomes["binary-config"] in line
               for line in proc.stdout.splitlines()), proc.stdout  # its table row
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("2 cases: OK-refused ") and "OK-handled 1" in last, last
    assert proc.returncode == (1 if outcomes["binary-config"] in probe.FAILURES else 0), proc.stdout
