"""grpo.run.doctor.plot: a non-empty PNG from the fixture run folder, in process and as `python -m grpo.run.doctor
plot`."""

import json
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grpo.run.doctor.plot import plot_run

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "run_demo"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MIN_PNG_BYTES = 20_000  # ten panels with lines and text; an empty figure of this size is still ~15 kB


@pytest.fixture
def run_dir(tmp_path):
    """A copy of the fixture run, so the test never writes into the source tree."""
    dst = tmp_path / "run_demo"
    shutil.copytree(FIXTURE, dst, ignore=shutil.ignore_patterns("*.png", "report.json", "*.py"))
    return dst


def test_plot_run_writes_png(run_dir):
    out = plot_run(run_dir)
    assert out == run_dir / "plot.png"
    data = out.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > MIN_PNG_BYTES


def test_plot_run_without_config_or_eval(tmp_path):
    rows = [{"step": s, "reward/fairness/mean": 0.1 * s, "health/grad_norm": 1.0} for s in range(5)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert plot_run(tmp_path).read_bytes()[:8] == PNG_MAGIC


def test_plot_run_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        plot_run(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="metrics.jsonl not found"):
        plot_run(tmp_path)
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError, match="empty"):
        plot_run(tmp_path)


def test_python_m_grpo_plot(run_dir):
    done = subprocess.run([sys.executable, "-m", "grpo.run.doctor", "plot", str(run_dir)], cwd=ROOT,
                          capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(run_dir / "plot.png")
    assert (run_dir / "plot.png").read_bytes()[:8] == PNG_MAGIC


def test_main_exits_2_with_a_message_on_a_missing_folder(tmp_path, monkeypatch, capsys):
    # in process (runpy), to spare a second interpreter start
    monkeypatch.setattr(sys, "argv", ["grpo.run.doctor", "plot", str(tmp_path / "nope")])
    # runpy warns when the module is already loaded
    monkeypatch.delitem(sys.modules, "grpo.run.doctor.__main__", raising=False)
    with pytest.raises(SystemExit) as exit_:
        runpy.run_module("grpo.run.doctor", run_name="__main__")
    assert exit_.value.code == 2 and "does not exist" in capsys.readouterr().err
