"""notebooks/quickstart.ipynb runs headless, from notebooks/, through the trainer's own functions.

The kernel is a spec written for this test that starts `sys.executable -m ipykernel_launcher`, so the notebook runs in
this interpreter's environment whatever kernels (if any) are installed, and whether or not the venv is activated.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "quickstart.ipynb"
KERNEL_NAME = "grpo-dual-test"
TIMEOUT_S = 300  # per cell; a loaded 2-core CI machine runs the whole notebook in ~30-60 s
# The notebook's own default budget (3 RL steps, 96-token completions) takes minutes on a CPU; this shrinks it to a
# smoke test of the same code path.
SMALL_RUN = ("rollout.max_new_tokens=12 rollout.k=2 train.prompts_per_micro_step=1 data.demo_size=40 "
             "data.eval_size=2 sft.steps=2 sft.batch_size=2 train.tensorboard=false")


def _write_kernel_spec(jupyter_dir: Path) -> None:
    spec_dir = jupyter_dir / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "grpo-dual test", "language": "python"}
    (spec_dir / "kernel.json").write_text(json.dumps(spec))


@pytest.mark.slow
def test_quickstart_notebook_runs_and_writes_the_run_folder(tmp_path, monkeypatch):
    jupyter_dir = tmp_path / "jupyter"
    _write_kernel_spec(jupyter_dir)
    monkeypatch.setenv("JUPYTER_PATH", str(jupyter_dir))  # read at kernel lookup, so the test's spec is found
    out = tmp_path / "runs"
    monkeypatch.setenv("GRPO_NOTEBOOK_STEPS", "2")
    monkeypatch.setenv("GRPO_NOTEBOOK_OUTPUT_DIR", str(out))
    monkeypatch.setenv("GRPO_NOTEBOOK_RUN_NAME", "nb")
    monkeypatch.setenv("GRPO_NOTEBOOK_OVERRIDES", SMALL_RUN)
    monkeypatch.setenv("MPLBACKEND", "Agg")

    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=TIMEOUT_S, kernel_name=KERNEL_NAME,
                                     resources={"metadata": {"path": str(ROOT / "notebooks")}})
    client.execute()

    run_dir = out / "nb"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert sorted({r["step"] for r in rows if "time/step" in r}) == [1, 2]  # exactly the 2 RL steps asked for
    evals = json.loads((run_dir / "eval.json").read_text())
    assert {"before_sft", "after_sft", "after_rl"} <= set(evals)
    assert set(evals["after_rl"]) == {"fairness", "hallucination"}
    assert all(0.0 <= r <= 1.0 for r in evals["after_rl"].values())
    assert (run_dir / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((run_dir / "config.json").read_text())["train"]["max_steps"] == 2

    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert "step 1" in text and "step 2" in text  # format_step_line printed each step
    assert any("image/png" in o.get("data", {}) for o in outputs)  # the plot is shown inline
    assert not any(o.get("output_type") == "error" for o in outputs)
