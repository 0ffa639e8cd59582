"""Crash-safe checkpoints that cannot run code: written to a temporary folder, fsynced, checksummed, renamed.

A checkpoint folder `checkpoints/step_000123/` holds
  * `tensors.safetensors`: every tensor of the state (trainable weights, optimizer moments, RNG states, ...);
  * `state.json`: the rest of the state (scheduler, KL controllers, sampler position, guard and monitor state,
    counters, python / numpy RNG states) with each tensor replaced by its name in the tensor file
    (the tree codec of grpo/run/checkpoint/treecodec.py: JSON node kinds only, nothing is imported or called on load);
  * `config.json`, `inputs.json` (the fingerprints of the run's data files, rows and reward functions:
    grpo/run/checkpoint/fingerprints.py; absent in checkpoints written before it) and `manifest.json` (format version,
    step, sha256 and size of every other file).
The manifest is written last, and the folder only gets its final name by an atomic rename, so a crash mid-save
leaves a `.tmp-*` folder that is never taken for a checkpoint. A folder whose files do not match its manifest is
reported by name and skipped in favour of the previous one. The manifest detects corruption, not tampering (the
same writer writes it); tampering cannot run code because no file is unpickled: safetensors and JSON only.

The post-SFT reference (`checkpoints/reference/`: `weights.safetensors` + `manifest.json`) is written the same way.

Format 1 (before): one pickle `state.pt` per step and a bare `checkpoints/reference.pt`. A pickle can run any code
when loaded, so those load only with `trust_pickle=True` (the config switch `checkpoint.trust_pickle`), for files
you wrote yourself; a legacy reference.pt is rewritten in the checksummed format when it is loaded that way.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from grpo.core.plumbing import fsync as _fsync
from grpo.core.plumbing import sha256 as _sha256
from grpo.core.plumbing import writing
from grpo.run.checkpoint.pareto import MARKER as PARETO_MARKER
from grpo.run.checkpoint.treecodec import TreeCodecError, decode_tree, encode_tree

FORMAT_VERSION = 2
LEGACY_VERSION = 1
"""state.pt pickles: read only behind trust_pickle."""
CKPT_DIR = "checkpoints"
PREFIX = "step_"
MANIFEST = "manifest.json"
TENSORS = "tensors.safetensors"
STATE_JSON = "state.json"
INPUTS = "inputs.json"
LEGACY_STATE = "state.pt"
REFERENCE_DIR = "reference"
REFERENCE_WEIGHTS = "weights.safetensors"
LEGACY_REFERENCE = "reference.pt"
TRUST_HINT = ("if you wrote it yourself (a trusted source), allow it with checkpoint.trust_pickle=true; the next "
              "checkpoint is written in the safe format")
# Fields that may differ between the saved run and the resumed one (they do not change what is computed).
RESUMABLE_CHANGES = ("checkpoint.", "train.max_steps", "train.log_every", "train.eval_every", "train.sample_every",
                     "train.tensorboard", "train.wandb_project", "train.output_dir", "train.run_name", "train.device",
                     "train.overwrite",
                     "judge.num_workers", "judge.timeout_s", "judge.cache_path", "preset")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used; the message names the folder and what is wrong."""


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


def remove_folder(folder: Path) -> None:
    """Delete a checkpoint folder so that a kill at any moment leaves it whole or gone: renamed first (atomic) to a
    `.tmp-` name that the next save sweeps away, then deleted. A plain rmtree killed midway left a folder with its
    manifest but not its tensors, which resume then had to skip as corrupt (scripts/kill_resume_soak.py found two
    in 20 kills)."""
    doomed = folder.parent / f".tmp-{folder.name}-removing-{os.getpid()}"
    os.replace(folder, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def _write_folder(tmp: Path, final: Path, files: dict[str, bytes | None], meta: dict[str, Any]) -> None:
    """Fill `tmp` (already holding the files named with None), checksum every file into the manifest, fsync,
    and rename it to `final` (replacing an older folder of that name)."""
    for name, data in files.items():
        if data is not None:
            (tmp / name).write_bytes(data)
    listed = {}
    for name in files:
        _fsync(tmp / name)
        listed[name] = {"sha256": _sha256(tmp / name), "bytes": (tmp / name).stat().st_size}
    (tmp / MANIFEST).write_text(json.dumps({"format_version": FORMAT_VERSION, **meta, "files": listed}, indent=2))
    _fsync(tmp / MANIFEST)
    _fsync(tmp)
    if final.exists():  # re-saving the same step (e.g. interrupted right after a periodic save)
        remove_folder(final)
    os.replace(tmp, final)
    _fsync(final.parent)


def save(run_dir: Path, step: int, state: dict[str, Any], config: dict[str, Any], keep_last: int,
         inputs: dict[str, Any] | None = None) -> Path:
    """Write checkpoint `step` atomically and keep the newest `keep_last`. Returns its folder. `inputs`: the run's
    input fingerprints (grpo/run/checkpoint/fingerprints.py), written as inputs.json when given.

    `state` is a tree of tensors, numpy arrays, numbers, strings, None, lists, tuples and dicts
    (grpo/run/checkpoint/treecodec.py); anything else raises CheckpointError naming its key before a file is written."""
    try:
        tree_json, tensors = encode_tree(state)
    except TreeCodecError as e:
        raise CheckpointError(f"checkpoint step {step} cannot be saved: {e}") from None
    root = Path(run_dir) / CKPT_DIR
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{step:06d}"
    for stale in root.glob(f".tmp-{PREFIX}*"):  # saves of processes that died before their rename
        shutil.rmtree(stale, ignore_errors=True)
    tmp = root / f".tmp-{PREFIX}{step:06d}-{os.getpid()}"
    tmp.mkdir()
    try:
        with writing(tmp / TENSORS):
            save_file(tensors, str(tmp / TENSORS))
        files: dict[str, bytes | None] = {TENSORS: None, STATE_JSON: tree_json.encode(),
                                          "config.json": json.dumps(config, indent=2).encode()}
        if inputs is not None:
            files[INPUTS] = json.dumps(inputs, indent=2).encode()
        _write_folder(tmp, final, files, {"step": step})
    except Exception:  # a full disk: the partial copy's space goes back (the final model may still fit)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in list_complete(run_dir)[:-keep_last]:
        remove_folder(old)
    return final


def verify(folder: Path) -> dict[str, Any]:
    """The manifest of `folder` after checking version and every file's size and checksum."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"no checkpoint at {folder}")
    manifest_path = folder / MANIFEST
    if not manifest_path.exists():
        raise CheckpointError(f"checkpoint {folder} is incomplete: no {MANIFEST} (a save was interrupted)")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"checkpoint {folder}: {MANIFEST} is not valid JSON ({e})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise CheckpointError(f"checkpoint {folder}: {MANIFEST} has no \"files\" table")
    if manifest.get("format_version") not in (LEGACY_VERSION, FORMAT_VERSION):
        raise CheckpointError(f"checkpoint {folder} has format version {manifest.get('format_version')!r}; this "
                              f"code reads version {FORMAT_VERSION} (and {LEGACY_VERSION}, behind "
                              "checkpoint.trust_pickle)")
    for name, meta in manifest["files"].items():
        path = folder / name
        if Path(name).name != name:
            raise CheckpointError(f"checkpoint {folder}: {MANIFEST} names {name!r}, which is not a file of the folder")
        if not path.exists():
            raise CheckpointError(f"checkpoint {folder}: file {name} is missing")
        if path.stat().st_size != meta.get("bytes") or _sha256(path) != meta.get("sha256"):
            raise CheckpointError(f"checkpoint {folder}: file {name} is corrupt (size or sha256 differs from the "
                                  "manifest)")
    return manifest


def list_complete(run_dir: Path) -> list[Path]:
    """Checkpoint folders with a manifest, oldest first (not verified: see `find_resumable`)."""
    root = Path(run_dir) / CKPT_DIR
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and (p / MANIFEST).exists())


def unusable(folder: Path, manifest: dict[str, Any], trust_pickle: bool = False) -> str | None:
    """Why a checkpoint whose manifest verifies still cannot be resumed here (None = it can): a legacy pickle
    without checkpoint.trust_pickle, or a manifest that does not list the files a checkpoint holds (a crafted or
    hand-made folder)."""
    if manifest.get("format_version") == LEGACY_VERSION:
        if not trust_pickle:
            return (f"checkpoint {folder} is in the old pickle format ({LEGACY_STATE}), refused without "
                    "checkpoint.trust_pickle")
        needed = {LEGACY_STATE, "config.json"}
    else:
        needed = {TENSORS, STATE_JSON, "config.json"}
    missing = sorted(needed - set(manifest["files"]))
    return f"checkpoint {folder}: its {MANIFEST} does not list {missing}" if missing else None


def find_resumable(run_dir: Path, trust_pickle: bool = False) -> Path | None:
    """The newest checkpoint of `run_dir` that verifies and can be loaded here; broken, crafted or (without
    `trust_pickle`) legacy ones are reported by name and skipped."""
    root = Path(run_dir) / CKPT_DIR
    candidates = sorted((p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX)),
                        reverse=True) if root.is_dir() else []
    for folder in candidates:
        try:
            why = unusable(folder, verify(folder), trust_pickle)
        except CheckpointError as e:
            why = str(e)
        if why is None:
            return folder
        print(f"warning: {why}; skipped, trying the previous checkpoint", file=sys.stderr)
    return None


TRL_MARKER = ".grpo-dual-checkpoint"
"""Written into each TRL checkpoint folder (output_dir/checkpoint-N, grpo/run/checkpoint/trl_folders.py): JSON naming
the exact-resume checkpoint it stands for (its path from output_dir, and its manifest's sha256)."""
TRL_CHECKPOINT = re.compile(r"checkpoint-(\d+)")
"""The name of TRL's checkpoint folders: checkpoint-<global step>."""


def exact_checkpoint(path: str | Path) -> Path:
    """The exact-resume checkpoint (RUN/checkpoints/step_N) that TRL's checkpoint folder `path`
    (output_dir/checkpoint-N) stands for, verified to be the one written beside it; CheckpointError naming what is
    wrong otherwise (a checkpoint-N no grpo-dual run wrote, its checkpoint deleted or replaced)."""
    folder = Path(path)
    try:
        record = json.loads((folder / TRL_MARKER).read_text())
        target = folder.parent / record["checkpoint"]
        expected = record["manifest_sha256"]
    except FileNotFoundError:
        raise CheckpointError(f"--resume {path}: {folder} holds no {TRL_MARKER}, so no grpo-dual run wrote it and "
                              "there is no exact-resume state to go on from (a TRL checkpoint-N holds the model, not "
                              f"the run's state); give a run folder's checkpoint (RUN/{CKPT_DIR}/{PREFIX}N) or auto"
                              ) from None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"--resume {path}: {folder / TRL_MARKER} is unreadable ({err})") from None
    if not (target / MANIFEST).is_file():
        raise CheckpointError(f"--resume {path}: the exact-resume checkpoint it stands for, {target}, is gone "
                              "(deleted, or kept out by checkpoint.keep_last / save_total_limit); resume from another "
                              "checkpoint-N, or with --resume auto")
    if _sha256(target / MANIFEST) != expected:
        raise CheckpointError(f"--resume {path}: {target} is not the checkpoint written beside {folder} (a later "
                              "run replaced it); resume from another checkpoint-N, or with --resume auto")
    return target


def resolve_resume(run_dir: Path, where: str, trust_pickle: bool = False) -> Path:
    """The checkpoint folder that `--resume WHERE` names, or CheckpointError saying why there is none.

    "auto": the newest complete checkpoint of `run_dir`. A checkpoint folder (holding manifest.json): itself. A run
    folder (holding checkpoints/) or its checkpoints/ folder: the newest complete checkpoint in it."""
    if where == "auto":
        folder = find_resumable(run_dir, trust_pickle)
        if folder is None:
            raise CheckpointError(f"--resume auto: no complete checkpoint under {Path(run_dir) / CKPT_DIR}; check "
                                  "--run-name / --output-dir, or start without --resume")
        return folder
    path = Path(where)
    if not path.exists():
        raise CheckpointError(f"--resume {where}: no checkpoint at {path} (give a checkpoint folder such as "
                              f"RUN/{CKPT_DIR}/{PREFIX}000050, a run folder, or auto)")
    if not path.is_dir():
        raise CheckpointError(f"--resume {where}: {path} is a file; give its checkpoint folder (the one holding "
                              f"{MANIFEST}) or the run folder")
    if (path / TRL_MARKER).is_file() or TRL_CHECKPOINT.fullmatch(path.name):  # TRL's output_dir/checkpoint-N
        return exact_checkpoint(path)
    if (path / PARETO_MARKER).is_file() or (not (path / MANIFEST).exists() and (path / "config.json").is_file()):
        what = "a Pareto point (a saved model" if (path / PARETO_MARKER).is_file() else "a saved model (weights"
        raise CheckpointError(f"--resume {where}: {path} is {what} without the optimizer state or the step), not a "
                              f"training checkpoint: give the run's checkpoint (RUN/{CKPT_DIR}/{PREFIX}000050, the run "
                              f"folder, or auto), or train on from this model in a new run with --model.name {path}")
    if (path / MANIFEST).exists() or path.name.startswith(PREFIX):
        return path  # verified (and a missing manifest reported) by `load`
    run = path.parent if path.name == CKPT_DIR else path
    if (run / CKPT_DIR).is_dir():
        folder = find_resumable(run, trust_pickle)
        if folder is None:
            raise CheckpointError(f"--resume {where}: the run folder {run} holds no complete checkpoint")
        return folder
    raise CheckpointError(f"--resume {where}: {path} is neither a checkpoint folder (no {MANIFEST}) nor a run "
                          f"folder (no {CKPT_DIR}/)")


def load(folder: Path, *, trust_pickle: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """(state, config dict) of a verified checkpoint. Nothing is unpickled unless `trust_pickle` and the folder is
    in the legacy format (state.pt)."""
    folder = Path(folder)
    manifest = verify(folder)
    config = _read_json(folder / "config.json", folder)
    if manifest["format_version"] == LEGACY_VERSION:
        if not trust_pickle:
            raise CheckpointError(f"checkpoint {folder} is in the old format: {LEGACY_STATE} is a Python pickle, and "
                                  "loading a pickle runs whatever code it names, so it is refused; " + TRUST_HINT)
        return torch.load(folder / LEGACY_STATE, map_location="cpu", weights_only=False), config
    try:
        tensors = load_file(str(folder / TENSORS))
        state = decode_tree((folder / STATE_JSON).read_text(), tensors)
    except (SafetensorError, TreeCodecError, OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"checkpoint {folder}: cannot read its state ({e})") from None
    return state, config


def saved_run(folder: Path) -> tuple[int | None, dict[str, Any], dict[str, Any] | None]:
    """(step, config dict, input fingerprints or None when it predates them) of the checkpoint `folder`, whose
    manifest has been verified: what a resume compares before the model loads."""
    folder = Path(folder)
    manifest = _read_json(folder / MANIFEST, folder)
    step = manifest.get("step") if isinstance(manifest, dict) else None
    inputs = _read_json(folder / INPUTS, folder) if (folder / INPUTS).is_file() else None
    return (step if isinstance(step, int) else None), _read_json(folder / "config.json", folder), inputs


def _read_json(path: Path, folder: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"checkpoint {folder}: cannot read {path.name} ({e})") from None


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


def save_reference(run_dir: Path, weights: dict[str, torch.Tensor]) -> Path:
    """Write the post-SFT model once (the KL reference that checkpoints rely on) as checkpoints/reference/:
    weights.safetensors under a manifest, atomically. Returns the folder."""
    root = Path(run_dir) / CKPT_DIR
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(f".tmp-{REFERENCE_DIR}*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = root / f".tmp-{REFERENCE_DIR}-{os.getpid()}"
    try:
        tree_json, tensors = encode_tree(dict(weights))
    except TreeCodecError as e:
        raise CheckpointError(f"the reference model cannot be saved: {e}") from None
    tmp.mkdir()
    try:
        with writing(tmp / REFERENCE_WEIGHTS):
            save_file(tensors, str(tmp / REFERENCE_WEIGHTS))
        _write_folder(tmp, root / REFERENCE_DIR, {REFERENCE_WEIGHTS: None, STATE_JSON: tree_json.encode()},
                      {"kind": "reference"})
    except Exception:  # a full disk: no empty or partial `.tmp-reference-N` left, its space goes back
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return root / REFERENCE_DIR


def load_reference(run_dir: Path, *, trust_pickle: bool = False) -> dict[str, torch.Tensor] | None:
    """The post-SFT reference weights of the run, verified against their manifest; None when the run had none.

    A legacy bare `checkpoints/reference.pt` (no checksum) is read only with `trust_pickle` (with torch's
    weights-only unpickler), then rewritten as checkpoints/reference/ so the next resume verifies it."""
    root = Path(run_dir) / CKPT_DIR
    folder, legacy = root / REFERENCE_DIR, root / LEGACY_REFERENCE
    if folder.exists():
        way_out = ("; the KL reference of the run's checkpoints is gone with it, so no checkpoint of this run can "
                   "resume: start the run again with --overwrite (or another --run-name), or restore the folder "
                   "from a copy")
        try:
            verify(folder)
            weights = decode_tree((folder / STATE_JSON).read_text(), load_file(str(folder / REFERENCE_WEIGHTS)))
        except CheckpointError as e:
            raise CheckpointError(f"{e} (the post-SFT reference model){way_out}") from None
        except (SafetensorError, TreeCodecError, OSError, UnicodeDecodeError) as e:
            raise CheckpointError(f"checkpoint {folder} (the post-SFT reference model) cannot be read: {e}"
                                  f"{way_out}") from None
        return weights
    if not legacy.exists():
        return None
    if not trust_pickle:
        raise CheckpointError(f"{legacy} (the post-SFT reference model) is in the old format: a pickle under no "
                              "checksum, so neither its origin nor its integrity can be checked, and it is refused; "
                              + TRUST_HINT)
    try:
        weights = torch.load(legacy, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise CheckpointError(f"{legacy} (the post-SFT reference model) cannot be read: {e}") from None
    save_reference(run_dir, weights)
    legacy.unlink()
    print(f"note: {legacy} was rewritten as {folder} (safetensors under a manifest)", file=sys.stderr)
    return weights


def optional_write(what: str, write: Callable[[], Any]) -> Any:
    """`write()`'s result, or None with a warning when it fails: an optional write (a full disk, a plot that cannot
    be drawn) must never lose a finished run."""
    try:
        return write()
    except (OSError, ValueError, RuntimeError) as err:
        print(f"warning: could not write {what}: {err}", file=sys.stderr)
        return None
