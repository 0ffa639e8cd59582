"""Crash-safe checkpoints: exact resume, corrupt/incomplete detection, config mismatch, clean interruption; a
format that cannot run code (safetensors + JSON), legacy pickles only behind trust_pickle, the reference under a
manifest, and what `--resume WHERE` resolves to."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import grpo_train as G
from grpo.run.checkpoint import files as ckpt
from grpo.run.tracking import MEASURED_PREFIXES
from tests.trainer_helpers import fast_config

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: a tiny model gains nothing from threads

ROOT = Path(__file__).resolve().parents[1]
BASE = ["sft.steps=3", "sft.lr=1e-3", "checkpoint.every=2", "train.eval_every=2"]


def _lines(run_dir: Path, after: int):
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(MEASURED_PREFIXES)}
            for r in rows if r.get("step", 0) > after]


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
    newest = folders[-1] / ckpt.TENSORS
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
    assert proc.returncode == 130, out  # 128 + SIGINT, as shells expect of an interrupted program
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
    before = signal.getsignal(signal.SIGINT)  # default_int_handler, or SIG_IGN in a background job without job control
    with stop.installed():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        assert stop.requested
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)
    assert signal.getsignal(signal.SIGINT) is before  # the previous handler is back


# ------------------------------------------------------------------------------------------ the safe format
def _rich_state():
    """Every kind of value grpo_train puts in `state`, from the real producers (AdamW, LambdaLR, RNG getters)."""
    import numpy as np

    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda n: 1.0)
    rng = ckpt.rng_state()
    tied = torch.arange(6, dtype=torch.float32)
    return {"step": 7, "weights": {"a.weight": tied, "b.weight": tied[:3], "bf16": torch.ones(2, dtype=torch.bfloat16)},
            "optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "rng": rng, "rng_ranks": [rng],
            "evals": {"step_2": {"fairness": 0.25}}, "counters": {"judge/calls": 3.0},
            "odd": {"nan": math.nan, "inf": -math.inf, "tuple": (1, "x", None), "$key": True, 5: "int key",
                    "np": np.float32(0.1), "arr": np.arange(4, dtype=np.int16).reshape(2, 2), "empty": []},
            "surgery": None}


def _same(a, b, path="state"):
    import numpy as np

    assert type(a) is type(b), f"{path}: {type(a)} vs {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), path
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b), path
    elif isinstance(a, dict):
        assert list(a) == list(b), path
        for k in a:
            _same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), path
    else:
        assert a == b, path


def test_safe_format_round_trips_every_state_type_and_rng_restores_bit_exact(tmp_path):
    import random

    import numpy as np

    state = _rich_state()
    folder = ckpt.save(tmp_path, 7, state, {"train": {"lr": 1e-3}}, keep_last=2)
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "manifest.json", "state.json",
                                                         "tensors.safetensors"]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["format_version"] == 2 and sorted(manifest["files"]) == ["config.json", "state.json",
                                                                              "tensors.safetensors"]
    loaded, config = ckpt.load(folder)
    assert config == {"train": {"lr": 1e-3}}
    _same(state, loaded)
    expected = (random.random(), np.random.rand(3).tolist(), torch.rand(3).tolist())
    random.seed(123), np.random.seed(123), torch.manual_seed(123)  # move every generator away
    ckpt.set_rng_state(loaded["rng"])
    assert (random.random(), np.random.rand(3).tolist(), torch.rand(3).tolist()) == expected
    opt = torch.optim.AdamW(torch.nn.Linear(3, 2).parameters(), lr=1e-3)
    opt.load_state_dict(loaded["optimizer"])  # the optimizer accepts what came back
    assert opt.state_dict()["state"][0]["step"] == state["optimizer"]["state"][0]["step"]


@pytest.mark.parametrize("bad, where", [(object(), "state['counters']['bad']"), ({1, 2}, "state['counters']['bad']"),
                                        (lambda: 0, "state['counters']['bad']"), (1j, "state['counters']['bad']")])
def test_save_refuses_what_it_cannot_store_naming_the_key(tmp_path, bad, where):
    with pytest.raises(ckpt.CheckpointError) as err:
        ckpt.save(tmp_path, 3, {"step": 3, "counters": {"ok": 1.0, "bad": bad}}, {}, keep_last=1)
    assert where in str(err.value) and "cannot be stored" in str(err.value)
    assert not (tmp_path / ckpt.CKPT_DIR).exists()  # refused before anything was written


class _Payload:
    """Pickles to `open(marker, "w")`: loading it with the full unpickler creates the marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _legacy_checkpoint(run_dir: Path, marker: Path) -> Path:
    """A format-1 folder as the old writer made it (state.pt pickle + a manifest that matches it)."""
    import hashlib

    folder = run_dir / ckpt.CKPT_DIR / "step_000004"
    folder.mkdir(parents=True)
    torch.save({"step": 4, "evil": _Payload(marker)}, folder / "state.pt")
    (folder / "config.json").write_text("{}")
    files = {n: {"sha256": hashlib.sha256((folder / n).read_bytes()).hexdigest(), "bytes": (folder / n).stat().st_size}
             for n in ("state.pt", "config.json")}
    (folder / "manifest.json").write_text(json.dumps({"format_version": 1, "step": 4, "files": files}))
    return folder


def test_crafted_legacy_state_pt_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    folder = _legacy_checkpoint(tmp_path / "run", marker)
    assert ckpt.find_resumable(tmp_path / "run", trust_pickle=True) == folder  # it verifies: the manifest cannot tell
    assert ckpt.find_resumable(tmp_path / "run") is None  # without the switch, --resume auto does not pick it
    with pytest.raises(ckpt.CheckpointError) as err:
        ckpt.load(folder)
    message = str(err.value)
    assert "state.pt is a Python pickle" in message and "refused" in message
    assert "checkpoint.trust_pickle=true" in message
    assert not marker.exists()
    state, _ = ckpt.load(folder, trust_pickle=True)  # the switch really unpickles: the payload ran, in tmp_path
    state["evil"].close()
    assert state["step"] == 4 and marker.exists()


def test_reference_is_under_a_manifest_and_flipped_bytes_are_caught(tmp_path):
    weights = {"embed.weight": torch.randn(8, 4), "lm_head.weight": torch.randn(8, 4)}
    weights["tied"] = weights["embed.weight"]  # tied weights share memory: stored twice, equal
    folder = ckpt.save_reference(tmp_path, weights)
    assert folder == tmp_path / "checkpoints" / "reference"
    assert sorted(json.loads((folder / "manifest.json").read_text())["files"]) == ["state.json", "weights.safetensors"]
    _same(weights, ckpt.load_reference(tmp_path))
    data = bytearray((folder / "weights.safetensors").read_bytes())
    for i in range(len(data) - 64, len(data)):  # 64 flipped bytes inside the tensor data
        data[i] ^= 0xFF
    (folder / "weights.safetensors").write_bytes(bytes(data))
    with pytest.raises(ckpt.CheckpointError, match="file weights.safetensors is corrupt"):
        ckpt.load_reference(tmp_path)
    assert ckpt.find_resumable(tmp_path) is None  # the reference folder is never taken for a step checkpoint


def test_legacy_reference_pt_needs_trust_and_is_rewritten_checksummed(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    weights = {"w": torch.arange(4.0)}
    torch.save(weights, tmp_path / "checkpoints" / "reference.pt")
    with pytest.raises(ckpt.CheckpointError, match="reference.pt .* old format.*checkpoint.trust_pickle=true"):
        ckpt.load_reference(tmp_path)
    _same(weights, ckpt.load_reference(tmp_path, trust_pickle=True))
    assert not (tmp_path / "checkpoints" / "reference.pt").exists()
    _same(weights, ckpt.load_reference(tmp_path))  # now the checksummed folder, no switch needed
    assert ckpt.load_reference(tmp_path / "elsewhere") is None  # a run without SFT has no reference


def test_a_tampered_state_json_is_an_error_not_code(tmp_path):
    folder = ckpt.save(tmp_path, 1, {"step": 1, "w": torch.ones(2)}, {}, keep_last=1)
    for text in ('{"step": {"$tensor": "nope"}}', '{"x": {"$ndarray": "w", "dtype": "|O", "shape": [1]}}',
                 '{"x": {"$dict": [[[1], 2]]}}', "not json"):
        (folder / "state.json").write_text(text)
        with pytest.raises(ckpt.CheckpointError, match="corrupt"):  # the manifest catches it first
            ckpt.load(folder)
        manifest = json.loads((folder / "manifest.json").read_text())  # a tamperer rewrites the manifest too
        manifest["files"]["state.json"] = {"sha256": __import__("hashlib").sha256(text.encode()).hexdigest(),
                                           "bytes": len(text.encode())}
        (folder / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(ckpt.CheckpointError, match="cannot read its state"):
            ckpt.load(folder)


def test_resume_target_resolution(tmp_path):
    run = tmp_path / "run"
    with pytest.raises(ckpt.CheckpointError, match=f"no checkpoint at {tmp_path / 'nowhere'}"):
        ckpt.resolve_resume(run, str(tmp_path / "nowhere"))
    with pytest.raises(ckpt.CheckpointError, match="--resume auto: no complete checkpoint under"):
        ckpt.resolve_resume(run, "auto")
    first = ckpt.save(run, 2, {"step": 2}, {}, keep_last=3)
    newest = ckpt.save(run, 4, {"step": 4}, {}, keep_last=3)
    assert ckpt.resolve_resume(run, "auto") == newest
    assert ckpt.resolve_resume(tmp_path, str(first)) == first  # a checkpoint folder: itself
    assert ckpt.resolve_resume(tmp_path, str(run)) == newest  # a run folder: its newest checkpoint
    assert ckpt.resolve_resume(tmp_path, str(run / "checkpoints")) == newest
    with pytest.raises(ckpt.CheckpointError, match="is a file"):
        ckpt.resolve_resume(run, str(first / "manifest.json"))
    with pytest.raises(ckpt.CheckpointError, match="neither a checkpoint folder .* nor a run folder"):
        ckpt.resolve_resume(run, str(tmp_path))
    with pytest.raises(ckpt.CheckpointError, match="no checkpoint at"):
        ckpt.verify(tmp_path / "missing")


def test_a_kill_while_old_checkpoints_are_pruned_leaves_no_half_deleted_checkpoint(tmp_path, monkeypatch):
    """keep_last pruning killed midway (scripts/kill_resume_soak.py found it twice in 20 kills): the folder being
    deleted had lost tensors.safetensors but kept its manifest, so it looked complete and failed verification.
    Deleting goes through a rename: whatever the moment of the kill, every folder that looks complete verifies."""
    run = tmp_path / "run"
    ckpt.save(run, 1, {"step": 1, "w": torch.ones(3)}, {}, keep_last=1)
    real_rmtree = ckpt.shutil.rmtree

    def killed_midway(path, ignore_errors=False):  # deletes the tensors, then the process dies
        (Path(path) / ckpt.TENSORS).unlink()
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(ckpt.shutil, "rmtree", killed_midway)
    with pytest.raises(KeyboardInterrupt):
        ckpt.save(run, 2, {"step": 2, "w": torch.zeros(3)}, {}, keep_last=1)
    monkeypatch.setattr(ckpt.shutil, "rmtree", real_rmtree)
    complete = ckpt.list_complete(run)
    assert [p.name for p in complete] == ["step_000002"]
    for folder in complete:
        ckpt.verify(folder)
    ckpt.save(run, 3, {"step": 3, "w": torch.ones(3)}, {}, keep_last=1)  # the next save sweeps the leftover away
    assert sorted(p.name for p in (run / ckpt.CKPT_DIR).iterdir()) == ["step_000003"]
