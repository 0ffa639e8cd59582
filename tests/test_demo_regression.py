"""The training math does not change by accident: a short demo run through `grpo_train.main` gives the metrics and
final weights recorded in tests/fixtures/short_demo.json.

A deliberate behaviour change regenerates the fixture (and says so in its commit):

    python tests/test_demo_regression.py --regenerate

Tolerances are tight but not zero: another machine's SIMD kernels may round differently (the demo fingerprint of
scripts/demo_fingerprint.py is the bit-exact check on one machine).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "short_demo.json"

SHORT_DEMO = ["model.tiny_hidden=32", "model.tiny_layers=1", "model.tiny_heads=2", "data.demo_size=48",
              "data.eval_size=6", "rollout.k=4", "train.prompts_per_micro_step=4", "train.grad_accum=2",
              "train.max_steps=3", "train.eval_every=2", "train.sample_every=0", "train.tensorboard=false",
              "sft.steps=4", "sft.max_examples=8", "loss.mu=2", "train.seed=0"]
"""The demo preset, shrunk: 4 SFT steps, 3 RL steps of 2 micro-batches with μ = 2 (old log-probs reused), the
demo's KL band (reference pass on), evaluations before SFT, after SFT, at step 2 and at the end."""

RTOL = 1e-4
"""Relative tolerance on metrics and weight statistics: far above float32 rounding differences between kernels,
far below what a changed formula, order of passes or random draw moves."""
ATOL = 1e-6
"""Absolute tolerance: for values that are 0 up to rounding (advantage means, clip fractions)."""


def run_short_demo(out_dir: Path) -> dict:
    """Run the short demo into `out_dir`; return its metric lines, evaluations and per-tensor weight statistics."""
    import grpo_train
    from grpo import config as C
    from grpo.run.tracking import MEASURED_PREFIXES  # clock and memory readings (they depend on the machine)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: the same reduction order on every machine with the same kernels
    try:
        cfg = C.load_config("demo", SHORT_DEMO + [f"train.output_dir={out_dir}", "train.run_name=short"])
        run = grpo_train.main(cfg)
    finally:
        torch.set_num_threads(threads)
    metrics = [{k: v for k, v in json.loads(line).items() if not k.startswith(MEASURED_PREFIXES)}
               for line in (run.run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    weights = {}
    for name, p in sorted(run.policy.model.state_dict().items()):
        x = p.detach().double().flatten()
        weights[name] = [x.sum().item(), x.square().sum().item(), x.abs().max().item(), *x[:4].tolist()]
    return {"metrics": metrics, "eval": run.progress.evals, "weights": weights}


def differences(expected, actual, where: str = "") -> list[str]:
    """Where `actual` departs from `expected` (nested dicts / lists of numbers) beyond RTOL / ATOL."""
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or set(expected) != set(actual):
            extra = set(actual) - set(expected) if isinstance(actual, dict) else set()
            missing = set(expected) - set(actual) if isinstance(actual, dict) else set(expected)
            return [f"{where}: keys differ (missing {sorted(missing)}, new {sorted(extra)})"]
        return [d for k in expected for d in differences(expected[k], actual[k], f"{where}/{k}")]
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(expected) != len(actual):
            return [f"{where}: length {len(expected)} expected, got {actual!r:.80}"]
        return [d for i, (e, a) in enumerate(zip(expected, actual, strict=True))
                for d in differences(e, a, f"{where}[{i}]")]
    if isinstance(expected, float) or isinstance(actual, float):
        if isinstance(expected, float) and math.isnan(expected) and isinstance(actual, float) and math.isnan(actual):
            return []
        if not math.isclose(expected, actual, rel_tol=RTOL, abs_tol=ATOL):
            return [f"{where}: expected {expected!r}, got {actual!r}"]
        return []
    return [] if expected == actual else [f"{where}: expected {expected!r}, got {actual!r}"]


@pytest.mark.slow
def test_short_demo_matches_the_recorded_metrics_and_weights(tmp_path):
    expected = json.loads(FIXTURE.read_text())
    actual = run_short_demo(tmp_path)
    diffs = differences(expected, actual)
    assert not diffs, (f"{len(diffs)} value(s) moved; if the change is deliberate, regenerate with "
                       f"`python tests/test_demo_regression.py --regenerate`:\n" + "\n".join(diffs[:20]))


def test_the_comparison_catches_a_small_change():
    """The check above is not vacuous: a relative change of 1e-3 in one weight statistic or metric is reported."""
    expected = {"metrics": [{"step": 1, "loss/total": -0.25}], "weights": {"w": [1.0, 2.0]}}
    assert differences(expected, json.loads(json.dumps(expected))) == []
    moved = {"metrics": [{"step": 1, "loss/total": -0.25 * 1.001}], "weights": {"w": [1.0, 2.0]}}
    assert differences(expected, moved) == ["/metrics[0]/loss/total: expected -0.25, got -0.25025"]
    assert differences(expected, {"metrics": [], "weights": {"w": [1.0, 2.0]}})


if __name__ == "__main__":
    if sys.argv[1:] != ["--regenerate"]:
        sys.exit(__doc__)
    import tempfile

    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory() as tmp:
        FIXTURE.write_text(json.dumps(run_short_demo(Path(tmp)), indent=1, sort_keys=True) + "\n")
    print(f"wrote {FIXTURE}")
