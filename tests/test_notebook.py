"""notebooks/quickstart.ipynb runs headless, from notebooks/, through the trainer's own functions, with its own budget,
and learns: its last cell shows the held-out reward after RL above the one before (and after) the SFT warm-up.

The kernel is a spec written for this test that starts `sys.executable -m ipykernel_launcher`, so the notebook runs in
this interpreter's environment whatever kernels (if any) are installed, and whether or not the venv is activated.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "quickstart.ipynb"
KERNEL_NAME = "grpo-dual-test"
TIMEOUT_S = 300  # per cell; the whole notebook takes ~1 min on one idle core
HELDOUT_LINE = re.compile(r"^held-out (\S+) .*  mean ([0-9.]+)$", re.M)  # the last cell's table, first to last
LEARNED = 0.05  # RL must raise the mean held-out reward by this much (~3 of the 64 held-out prompts)


def _write_kernel_spec(jupyter_dir: Path) -> None:
    spec_dir = jupyter_dir / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "grpo-dual test", "language": "python"}
    (spec_dir / "kernel.json").write_text(json.dumps(spec))


@pytest.mark.slow
def test_quickstart_notebook_learns_and_its_last_cell_shows_the_heldout_reward_rise(tmp_path, monkeypatch):
    """The notebook as a user runs it (its own budget: the demo's SFT warm-up, 30 RL steps), headless, on one
    thread; only where the run folder goes is set from outside."""
    jupyter_dir = tmp_path / "jupyter"
    _write_kernel_spec(jupyter_dir)
    monkeypatch.setenv("JUPYTER_PATH", str(jupyter_dir))  # read at kernel lookup, so the test's spec is found
    out = tmp_path / "runs"
    for name in ("GRPO_NOTEBOOK_STEPS", "GRPO_NOTEBOOK_OVERRIDES"):  # the notebook's own budget, not a caller's
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GRPO_NOTEBOOK_OUTPUT_DIR", str(out))
    monkeypatch.setenv("GRPO_NOTEBOOK_RUN_NAME", "nb")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the kernel is a child process: one thread, as on a shared CI core

    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=TIMEOUT_S, kernel_name=KERNEL_NAME,
                                     resources={"metadata": {"path": str(ROOT / "notebooks")}})
    client.execute()

    run_dir = out / "nb"
    steps = json.loads((run_dir / "config.json").read_text())["train"]["max_steps"]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert sorted({r["step"] for r in rows if "time/step" in r}) == list(range(1, steps + 1))
    evals = json.loads((run_dir / "eval.json").read_text())
    assert list(evals) == ["before_sft", "after_sft", "after_rl"]
    assert set(evals["after_rl"]) == {"fairness", "hallucination"}
    assert (run_dir / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    outputs = [o for cell in code for o in cell.get("outputs", [])]
    assert not any(o.get("output_type") == "error" for o in outputs)
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert "step 1 " in text and f"step {steps} " in text  # format_step_line printed each step

    last = code[-1].get("outputs", [])
    shown = HELDOUT_LINE.findall("".join(o.get("text", "") for o in last if o.get("output_type") == "stream"))
    assert [tag for tag, _ in shown] == list(evals)  # every evaluation, first to last, as eval.json holds them
    means = {tag: float(mean) for tag, mean in shown}
    for tag, rewards in evals.items():  # what the cell shows is the run's record
        assert means[tag] == pytest.approx(sum(rewards.values()) / len(rewards), abs=5e-4)
    assert means["after_rl"] > means["before_sft"]  # the last held-out reward shown is above the first
    assert means["after_rl"] >= means["after_sft"] + LEARNED, means  # and RL, not only the warm-up, raised it
    assert any("image/png" in o.get("data", {}) for o in last)  # the plot is shown inline
