"""Design invariants that cut across modules."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import grpo_train as G
from grpo.models.modeling import reference
from grpo.phases.batch import batch_logprobs
from tests.trainer_helpers import fast_config, rollout_batch

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: a tiny model gains nothing from threads

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("lora", [False, True])
def test_reference_is_the_post_sft_policy(tmp_path, lora):
    """After SFT warm-up the KL reference is the SFT model: reference log-probs equal the policy's."""
    extra = ["model.lora=true", "model.lora_r=4", "model.lora_dropout=0"] if lora else []
    run = G.setup(fast_config(tmp_path, "sft.steps=5", "sft.lr=1e-2", *extra))
    G.sft_phase(run)

    batch = rollout_batch(run, 2, 2)
    policy_logps = batch_logprobs(run.policy.model, batch, 8, 1.0)
    with reference(run.policy) as ref_model:
        ref_logps = batch_logprobs(ref_model, batch, 8, 1.0)
    torch.testing.assert_close(policy_logps, ref_logps, atol=1e-5, rtol=1e-5)


def test_nothing_happens_at_import(tmp_path):
    """Importing every module creates no file, parses no argv and loads no model."""
    modules = ["config", "grpo_train", "check_gpu_memory"] + [
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for p in sorted((ROOT / "grpo").rglob("*.py"))]
    code = ("import sys, importlib; sys.argv = ['x', '--definitely-not-a-flag']\n"
            f"sys.path.insert(0, {str(ROOT)!r})\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "import torch.nn as nn; print('models:', sum(isinstance(o, nn.Module) for o in "
            "__import__('gc').get_objects()))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "models: 0" in out.stdout
    assert list(tmp_path.iterdir()) == [], "importing created files"
