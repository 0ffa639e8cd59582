"""Multi-turn rollouts with a deterministic tool, or a deterministic environment that cannot be pickled, on 2 CPU
processes equal the 1-process run with the same global batch (as tests/test_distributed.py establishes for single-turn
rollouts): the same trajectories and tool calls, rewards and tool metrics gathered over the processes, and the same
optimizer step."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from tests.test_distributed import accelerate_cli, max_diff
from tests.tool_dist_worker import SCENARIOS, tool_step

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def two_process_runs(out: Path) -> tuple[subprocess.CompletedProcess, Path]:
    """The 2-process side into `out`."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [*accelerate_cli(), "launch", "--num_processes", "2", "--cpu", str(ROOT / "tests" / "tool_dist_worker.py"),
           str(out), *SCENARIOS]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900), out


@pytest.fixture(scope="module")
def two_process(tmp_path_factory) -> Path:
    proc, out = two_process_runs(tmp_path_factory.mktemp("two_process_tools"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "starting 2 CPU processes" in proc.stderr
    return out


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_two_processes_with_tools_equal_one_process(two_process, tmp_path, monkeypatch, scenario):
    from grpo.phases import tools as T

    one = tool_step(tmp_path, scenario, 1, lambda fn: monkeypatch.setattr(T, "decoder", lambda *a, **k: fn))
    m1, m2 = one["metrics"], json.loads((two_process / f"{scenario}.json").read_text())
    assert m1["rollout/num"] == m2["rollout/num"] == 2 * 2 * 4  # micro-batches x prompts x K, all processes
    assert m1["rollout/tokens"] == m2["rollout/tokens"]
    tool_keys = sorted(k for k in m1 if k.startswith("tools/"))
    assert tool_keys and tool_keys == sorted(k for k in m2 if k.startswith("tools/"))
    assert {k: m1[k] for k in tool_keys} == {k: m2[k] for k in tool_keys}
    assert 0 < m1["tools/calls_per_rollout"] < 1  # some trajectories called the tool, some did not
    for task in ("fairness", "hallucination"):
        assert m1[f"reward/{task}/mean"] == pytest.approx(m2[f"reward/{task}/mean"], abs=1e-12)
    assert max_diff(one["weights"], torch.load(two_process / f"{scenario}.pt")) <= 1e-5
    assert m2["health/grad_norm"] == pytest.approx(m1["health/grad_norm"], rel=1e-5) and m1["health/grad_norm"] > 0
    assert m2["loss/total"] == pytest.approx(m1["loss/total"], rel=1e-4, abs=1e-8)
