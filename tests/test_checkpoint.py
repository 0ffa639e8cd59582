"""Crash-safe checkpoints: exact resume, corrupt/incomplete detection, config mismatch, clean interruption."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import grpo_train as G
from grpo import checkpoint as ckpt
from tests.trainer_helpers import fast_config

ROOT = Path(__file__).resolve().parents[1]
BASE = ["sft.steps=3", "sft.lr=1e-3", "checkpoint.every=2", "train.eval_every=2"]


def _lines(run_dir: Path, after: int):
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows if r.get("step", 0) > after]


def _weights(run):
    return {n: p.detach().clone() for n, p in run.policy.model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("lora", [False, True])
def test_exact_resume(tmp_path, lora):
    """2N steps in one go == N steps, then resume, then N steps: bit-identical weights, identical metrics."""
    extra = BASE + (["model.lora=true", "model.lora_r=4"] if lora else [])
    full = G.main(fast_config(tmp_path / "a", "train.max_steps=4", *extra))
    G.main(fast_config(tmp_path / "b", "train.max_steps=2", *extra))
    resumed = G.main(fast_config(tmp_path / "b", "train.max_steps=4", "checkpoint.resume=auto", *extra))
    wa, wb = _weights(full), _weights(resumed)
    assert wa.keys() == wb.keys()
    for name in wa:
        assert torch.equal(wa[name], wb[name]), f"{name} differs after resume"
    assert _lines(full.run_dir, 2) == _lines(resumed.run_dir, 2)


def test_truncated_and_incomplete_checkpoints_are_skipped(tmp_path, capsys):
    run = G.main(fast_config(tmp_path, "train.max_steps=4", "checkpoint.every=2", "checkpoint.keep_last=3"))
    folders = ckpt.list_complete(run.run_dir)
    assert [f.name for f in folders] == ["step_000002", "step_000004"]
    newest = folders[-1] / ckpt.STATE
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # a write cut off half way
    (run.run_dir / ckpt.CKPT_DIR / ".tmp-step_000006-123").mkdir()  # a save that died before the rename
    (run.run_dir / ckpt.CKPT_DIR / "step_000008").mkdir()  # a folder without a manifest
    assert ckpt.find_resumable(run.run_dir) == folders[0]
    err = capsys.readouterr().err
    assert "step_000004" in err and "corrupt" in err and "step_000008" in err and "incomplete" in err
    with pytest.raises(ckpt.CheckpointError, match="corrupt"):
        ckpt.load(folders[-1])


def test_config_mismatch_on_resume_is_reported(tmp_path):
    G.main(fast_config(tmp_path, "train.max_steps=2"))
    with pytest.raises(ckpt.CheckpointError) as err:
        G.main(fast_config(tmp_path, "train.max_steps=4", "checkpoint.resume=auto", "train.lr=0.5",
                           "rollout.k=2"))
    assert "train.lr" in str(err.value) and "rollout.k" in str(err.value)


def test_sigint_leaves_a_resumable_checkpoint(tmp_path):
    cmd = [sys.executable, "grpo_train.py", "--output-dir", str(tmp_path), "--run-name", "sig", "--max-steps", "500",
           "--model.tiny_hidden", "32", "--model.tiny_layers", "1", "--model.tiny_heads", "2",
           "--data.demo_size", "24", "--data.eval_size", "2", "--rollout.max_new_tokens", "4", "--sft.steps", "0",
           "--train.eval_every", "0", "--train.tensorboard", "false"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = tmp_path / "sig" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.exists() and '"step": 2' in metrics.read_text()):
        time.sleep(0.2)
    assert proc.poll() is None, proc.stdout.read()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "--resume auto" in out
    folder = ckpt.find_resumable(tmp_path / "sig")
    assert folder is not None
    ckpt.verify(folder)
    state, _ = ckpt.load(folder)
    assert state["step"] >= 2


def test_a_checkpoint_older_than_a_config_field_still_resumes():
    """A field missing from the saved config counts as its default; a real difference is still reported."""
    saved = {"train": {"lr": 1e-5}, "data": {"source": "demo"}}
    current = {"train": {"lr": 1e-5}, "data": {"source": "demo", "task_mix": ""}}
    assert ckpt.config_differences(saved, current, {"data.task_mix": ""}) == []
    current["data"]["task_mix"] = "fairness:2,hallucination:1"
    assert ckpt.config_differences(saved, current, {"data.task_mix": ""}) == [
        "data.task_mix: checkpoint '' vs now 'fairness:2,hallucination:1'"]


def test_second_ctrl_c_exits_at_once():
    """The first SIGINT asks for a clean stop after the step; a second one interrupts immediately."""
    stop = G.StopRequest()
    with stop.installed():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        assert stop.requested
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the previous handler is back
