"""Crash-safe checkpoints: written to a temporary folder, fsynced, checksummed, then renamed into place.

A checkpoint folder `checkpoints/step_000123/` holds `state.pt` (trainable weights, optimizer, scheduler, KL
controllers, sampler position, guard and monitor state, RNG states, counters), `config.json` and `manifest.json`
(format version, step, sha256 and size of every file). The manifest is written last, and the folder only gets its
final name by an atomic rename, so a crash mid-save leaves a `.tmp-*` folder that is never taken for a checkpoint.
A folder whose files do not match its manifest is reported by name and skipped in favour of the previous one.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

FORMAT_VERSION = 1
CKPT_DIR = "checkpoints"
PREFIX = "step_"
MANIFEST = "manifest.json"
STATE = "state.pt"
# Fields that may differ between the saved run and the resumed one (they do not change what is computed).
RESUMABLE_CHANGES = ("checkpoint.", "train.max_steps", "train.log_every", "train.eval_every", "train.sample_every",
                     "train.tensorboard", "train.wandb_project", "train.output_dir", "train.run_name", "train.device",
                     "judge.num_workers", "judge.timeout_s", "judge.cache_path", "preset")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used; the message names the folder and what is wrong."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(run_dir: Path, step: int, state: dict[str, Any], config: dict[str, Any], keep_last: int) -> Path:
    """Write checkpoint `step` atomically and keep the newest `keep_last`. Returns its folder."""
    root = Path(run_dir) / CKPT_DIR
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{step:06d}"
    for stale in root.glob(f".tmp-{PREFIX}*"):  # saves of processes that died before their rename
        shutil.rmtree(stale, ignore_errors=True)
    tmp = root / f".tmp-{PREFIX}{step:06d}-{os.getpid()}"
    tmp.mkdir()
    torch.save(state, tmp / STATE)
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    files = {}
    for name in (STATE, "config.json"):
        _fsync_file(tmp / name)
        files[name] = {"sha256": _sha256(tmp / name), "bytes": (tmp / name).stat().st_size}
    manifest = {"format_version": FORMAT_VERSION, "step": step, "files": files}
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
    _fsync_file(tmp / MANIFEST)
    _fsync_dir(tmp)
    if final.exists():  # re-saving the same step (e.g. interrupted right after a periodic save)
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    for old in list_complete(run_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def verify(folder: Path) -> dict[str, Any]:
    """The manifest of `folder` after checking version and every file's size and checksum."""
    folder = Path(folder)
    manifest_path = folder / MANIFEST
    if not manifest_path.exists():
        raise CheckpointError(f"checkpoint {folder} is incomplete: no {MANIFEST} (a save was interrupted)")
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"checkpoint {folder}: {MANIFEST} is not valid JSON ({e})") from None
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {folder} has format version {manifest.get('format_version')!r}; this "
                              f"code reads version {FORMAT_VERSION}")
    for name, meta in manifest.get("files", {}).items():
        path = folder / name
        if not path.exists():
            raise CheckpointError(f"checkpoint {folder}: file {name} is missing")
        if path.stat().st_size != meta["bytes"] or _sha256(path) != meta["sha256"]:
            raise CheckpointError(f"checkpoint {folder}: file {name} is corrupt (size or sha256 differs from the "
                                  "manifest)")
    return manifest


def list_complete(run_dir: Path) -> list[Path]:
    """Checkpoint folders with a manifest, oldest first (not verified: see `find_resumable`)."""
    root = Path(run_dir) / CKPT_DIR
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and (p / MANIFEST).exists())


def find_resumable(run_dir: Path) -> Path | None:
    """The newest checkpoint of `run_dir` that verifies; broken ones are reported by name and skipped."""
    root = Path(run_dir) / CKPT_DIR
    candidates = sorted((p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX)),
                        reverse=True) if root.is_dir() else []
    for folder in candidates:
        try:
            verify(folder)
            return folder
        except CheckpointError as e:
            print(f"warning: {e}; trying the previous checkpoint", file=sys.stderr)
    return None


def load(folder: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(state, config dict) of a verified checkpoint."""
    verify(folder)
    state = torch.load(Path(folder) / STATE, map_location="cpu", weights_only=False)
    config = json.loads((Path(folder) / "config.json").read_text())
    return state, config


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_differences(saved: dict[str, Any], current: dict[str, Any],
                       defaults: dict[str, Any] | None = None) -> list[str]:
    """Fields that differ between two config dicts, ignoring those a resume may change.

    A field absent from the saved config (written before the field existed) counts as its value in `defaults`
    (a flat "section.field" -> default map), so adding a config field does not strand older checkpoints.
    """
    a, b = _flatten(saved), _flatten(current)
    defaults = defaults or {}
    diffs = []
    for key in sorted(set(a) | set(b)):
        if key.startswith(RESUMABLE_CHANGES):
            continue
        if a.get(key, defaults.get(key, "<absent>")) == b.get(key, defaults.get(key, "<absent>")):
            continue
        diffs.append(f"{key}: checkpoint {a.get(key, defaults.get(key, '<absent>'))!r} vs now "
                     f"{b.get(key, defaults.get(key, '<absent>'))!r}")
    return diffs


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The trainable parameters by name (the adapter under LoRA), copied to CPU."""
    return {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters() if p.requires_grad}


@torch.no_grad()
def load_trainable_state(model: torch.nn.Module, weights: dict[str, torch.Tensor], where: Path) -> None:
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    missing, extra = sorted(set(params) - set(weights)), sorted(set(weights) - set(params))
    if missing or extra:
        raise CheckpointError(f"checkpoint {where} does not fit this model: missing {missing[:5]}, unexpected "
                              f"{extra[:5]} (was it saved with another model or LoRA setting?)")
    for name, p in params.items():
        if p.shape != weights[name].shape:
            raise CheckpointError(f"checkpoint {where}: parameter {name} has shape {tuple(weights[name].shape)}, "
                                  f"the model has {tuple(p.shape)}")
        p.copy_(weights[name].to(p.device, p.dtype))


REFERENCE_FILE = "reference.pt"


def save_reference(run_dir: Path, weights: dict[str, torch.Tensor]) -> Path:
    """Write the post-SFT model once (the KL reference that checkpoints rely on), atomically."""
    path = Path(run_dir) / CKPT_DIR / REFERENCE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    torch.save(weights, tmp)
    _fsync_file(tmp)
    os.replace(tmp, path)
    _fsync_dir(path.parent)
    return path


def load_reference(run_dir: Path) -> dict[str, torch.Tensor] | None:
    path = Path(run_dir) / CKPT_DIR / REFERENCE_FILE
    if not path.exists():
        return None
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError) as e:
        raise CheckpointError(f"{path} (the post-SFT reference model) cannot be read: {e}") from None
