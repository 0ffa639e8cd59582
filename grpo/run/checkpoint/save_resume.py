"""A run's checkpoints: what one holds (everything needed to continue bit for bit), saving it from every process,
resuming from it, the post-SFT reference's weights, and loading a Pareto point's weights back (`train.doctor=restore`).
The files themselves (temporary folder, manifest of sha256, atomic rename, verification) are
grpo/run/checkpoint/files.py's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

from grpo import config as C
from grpo.core.losses import POLICY_LOSSES
from grpo.machine.distributed import Dist, rank_rng_state
from grpo.models.modeling import Policy
from grpo.run.checkpoint.files import (
    PREFIX,
    CheckpointError,
    config_differences,
    list_complete,
    load,
    load_reference,
    load_trainable_state,
    resolve_resume,
    rng_state,
    save,
    saved_run,
    set_rng_state,
    trainable_state,
    verify,
)
from grpo.run.checkpoint.fingerprints import input_changes
from grpo.run.checkpoint.folder import expand_home, run_started
from grpo.run.checkpoint.model_folder import CARD, save_model_folder, write_card
from grpo.run.checkpoint.resume_line import resume_advice
from grpo.run.checkpoint.trl_folders import save_trl_checkpoint
from grpo.run.record import Run


def reference_weights(policy: Policy, dist: Dist) -> dict[str, torch.Tensor]:
    """The weights that define the KL reference: the frozen copy (full FT) or the whole merged model (LoRA)."""
    return dist.full_state(policy.model if policy.is_lora else policy.ref_model)


def restore_best(run: Run) -> Path | None:
    """Load the weights of the best Pareto point (best mean held-out score) into the policy in place, on every rank;
    returns its folder, or None when the frontier is empty (the weights stay). Rank 0 holds the frontier and names the
    folder; every rank reads it (the same file, as on resume). The weight guard's last good copy becomes these."""
    best = run.progress.frontier.best() if run.dist.is_main else None
    where = run.dist.broadcast(None if best is None else str(best.path))
    if where is None:
        return None
    return load_weights(run, Path(where))


def load_weights(run: Run, folder: Path) -> Path:
    """Load the weights save_pretrained wrote into `folder` (a Pareto point, the best evaluation's copy) into the
    policy in place, on every rank (each reads the same files); the weight guard's last good copy becomes these.
    A folder that does not fit the policy (another adapter or model) is a CheckpointError naming it."""
    model = run.policy.model
    if run.policy.is_lora:  # the point is the adapter (save_pretrained of a PEFT model)
        from peft import set_peft_model_state_dict

        state = saved_weights(folder, "adapter_model")
        result = set_peft_model_state_dict(model, state)
        trainable = sum(p.requires_grad for p in model.parameters())
        if result.unexpected_keys or len(state) != trainable:
            raise CheckpointError(f"saved weights {folder} do not fit this adapter: {len(state)} tensors for "
                                       f"{trainable} trainable ones, unexpected {list(result.unexpected_keys)[:5]}")
    else:
        state = saved_weights(folder, "model")
        names = set(model.state_dict())
        missing, unexpected = names - set(state) - tied_names(model), set(state) - names
        if missing or unexpected:  # a tied output embedding is saved once, under the input embedding's name
            raise CheckpointError(f"saved weights {folder} do not fit this model: missing {sorted(missing)[:5]}, "
                                       f"unexpected {sorted(unexpected)[:5]}")
        run.dist.load_full_state(model, state, strict=False)
    run.updater.guard.snapshot()
    return folder


def saved_weights(folder: Path, stem: str) -> dict[str, torch.Tensor]:
    """The tensors save_pretrained wrote into `folder` as STEM.safetensors, or as its shards
    (STEM.safetensors.index.json)."""
    from safetensors.torch import load_file

    index = folder / f"{stem}.safetensors.index.json"
    files = (sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file()
             else [f"{stem}.safetensors"])
    if not all((folder / name).is_file() for name in files):
        raise CheckpointError(f"Pareto point {folder} has no {stem}.safetensors (or its shards): was it "
                                   "written by save_pretrained of this run?")
    return {k: v for name in files for k, v in load_file(str(folder / name)).items()}


def tied_names(model: torch.nn.Module) -> set[str]:
    """Parameter names that share their tensor with another name (tied input / output embeddings): every member of
    such a group, since save_pretrained keeps one of them."""
    groups: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    return {name for names in groups.values() if len(names) > 1 for name in names}


FINAL_DIR = "final"
"""The run folder's final model (save_pretrained's files): loadable with from_pretrained."""


def save_final_model(run: Run, state: dict | None = None) -> Path:
    """The final model into <run folder>/final, whole or not at all: written by save_pretrained into a temporary
    folder beside it, then renamed over it (a resumed run's old final/ is replaced only by a complete one). A write
    that fails (a full disk) removes the partial copy, freeing its space, and raises an OSError naming final/.
    `state`: the whole model's weights gathered from FSDP shards."""
    final = run.run_dir / FINAL_DIR
    for stale in run.run_dir.glob(".tmp-final-*"):  # a save killed before its rename
        shutil.rmtree(stale, ignore_errors=True)
    tmp = run.run_dir / f".tmp-final-{os.getpid()}"
    try:
        save_model_folder(run, tmp, state, say=True)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise OSError(err.errno, f"could not write the final model {final}: {err.strerror or err}") from None
    if final.exists():
        old = run.run_dir / f".old-final-{os.getpid()}"
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    return final


def write_final_cards(run: Run) -> list[Path]:
    """The final model's cards written again once the run's report.json (the doctor's verdict) and its last
    evaluation exist: in RUN/final/ and in checkpoint.final_model_dir (TRL's output_dir) when set."""
    folders = [run.run_dir / FINAL_DIR] + ([expand_home(run.cfg.checkpoint.final_model_dir)]
                                           if run.cfg.checkpoint.final_model_dir else [])
    return [write_card(run, folder) for folder in folders if (folder / CARD).is_file()]


def checkpoint_state(run: Run, rng_ranks: list[dict[str, Any]] | None = None,
                     gathered: tuple[dict, dict] | None = None) -> dict[str, Any]:
    """Everything needed to continue the run bit-for-bit. `rng_ranks`: every rank's RNG state (rank order);
    `gathered`: (weights, optimizer state) gathered from the shards when sharded."""
    rng_ranks = rng_ranks or [rng_state()]
    weights, optimizer = gathered or (trainable_state(run.policy.model), run.updater.optimizer.state_dict())
    update = run.updater
    return {"step": run.progress.step, "weights": weights, "optimizer": optimizer,
            "scheduler": update.scheduler.state_dict(),
            "controllers": {t: c.state_dict() for t, c in update.controllers.items()},
            "entropy_control": update.entropy_control.state_dict() if update.entropy_control is not None else None,
            "sampler": run.generation.sampler.state_dict(), "guard": update.guard.state_dict(),
            "evals": run.progress.evals,
            "measures": run.progress.measures,
            "surgery": update.surgery.state_dict() if update.surgery is not None else None,
            "frontier": run.progress.frontier.state_dict(), "counters": dict(run.rewarder.counters),
            "rng": rng_ranks[0],
            "rng_ranks": rng_ranks, "metrics_rows": run.tracker.rows_logged, "finished": run.progress.finished}


class FinalSaveError(OSError):
    """The final model could not be written; the message names the last complete checkpoint to resume from."""


def last_checkpoint_line(run: Run) -> str:
    """Where a run whose final save failed can go on from: its newest complete checkpoint, the command that resumes
    it (grpo/run/checkpoint/resume_line.py) and what that does from there."""
    complete = list_complete(run.run_dir)
    advice = resume_advice(run.run_dir, run.cfg.train.run_name, "free space")
    if not complete:
        return advice + " (checkpoint.every N keeps some checkpoints on the way)"
    finished = complete[-1].name == f"{PREFIX}{run.progress.step:06d}" and run.progress.finished
    return advice + ("\n(the run is finished there: it writes the final model without training again)" if finished
                     else "\n(it trains on from there)")


def save_final_checkpoint(run: Run) -> OSError | None:
    """The checkpoint of the finished run; a write the disk refuses is returned, not raised: the final model, a third
    of a checkpoint's size, is still worth writing (grpo_train.finish names it)."""
    try:
        save_checkpoint(run, final=True)
    except OSError as err:
        return err
    return None


def save_checkpoint(run: Run, final: bool = False) -> Path:
    """Rank 0 writes the checkpoint (weights are the same on every rank) with every rank's RNG state. `final`: a
    write the disk refuses is raised after every rank has left the collectives (save_final_checkpoint)."""
    rng_ranks = run.dist.gather(rng_state())
    gathered = None
    if run.dist.sharded:  # collectives: every rank takes part, rank 0 receives the whole state
        gathered = (run.dist.full_state(run.policy.model),
                    run.dist.optimizer_state(run.policy.model, run.updater.optimizer))
    folder, failed = None, None
    if run.dist.is_main:
        try:
            folder = save(run.run_dir, run.progress.step, checkpoint_state(run, rng_ranks, gathered),
                               C.to_dict(run.cfg), run.cfg.checkpoint.keep_last, inputs=run.start.inputs)
            save_trl_checkpoint(run, folder, gathered[0] if gathered else None)  # TRL's output_dir/checkpoint-N
            run_started(run.run_dir)  # a checkpoint to resume from: the folder is no longer restartable
        except OSError as err:
            if not final:
                raise
            failed = err
    folder = run.dist.broadcast(folder)  # also a barrier: no rank goes on before the checkpoint is complete
    if failed is not None:
        raise failed
    return folder


ACCEPTED = "accepted_changes.jsonl"
"""The run folder's record of every resume that went on with changes (checkpoint.accept_changes): one JSON line each."""


def check_resume(run_dir: Path, cfg: C.Config, inputs: dict[str, Any]) -> Path:
    """The checkpoint folder that checkpoint.resume names, once this run may go on from it; before the model loads.

    Refused (CheckpointError): a checkpoint past train.max_steps (naming both steps); a config, data file, task rows
    or reward function source that differs from the checkpoint's (`inputs`, grpo/run/checkpoint/fingerprints.py), every
    change named, unless checkpoint.accept_changes, which prints them and appends them to the run folder's ACCEPTED
    file."""
    trust = cfg.checkpoint.trust_pickle
    folder = resolve_resume(run_dir, cfg.checkpoint.resume, trust)
    if cfg.checkpoint.resume != "auto":  # "auto" verified it while choosing it
        verify(folder)
    step, saved_cfg, saved_inputs = saved_run(folder)
    counted = getattr(cfg.train, "num_epochs", 0)  # train.max_steps is counted from the rows later: `resume` checks
    if step is not None and step > cfg.train.max_steps and not counted:
        raise CheckpointError(f"checkpoint {folder} is at step {step}, past train.max_steps={cfg.train.max_steps}"
                                   f" (--max-steps): a resume goes on from step {step}, it cannot end at step "
                                   f"{cfg.train.max_steps}; give --max-steps {step} or more (or start a new run)")
    kinds = {}
    diffs = config_differences(saved_cfg, C.to_dict(cfg), config_defaults(cfg))
    changed = input_changes(saved_inputs, inputs) if saved_inputs is not None else []
    for line in changed:
        kinds["data" if line.startswith(("data file", "the rows")) else "reward functions"] = True
    if diffs:
        kinds = {"config": True, **kinds}
    if saved_inputs is None:
        print(f"note: checkpoint {folder} predates input fingerprints: its data files and reward functions are not "
              "compared with this run's", file=sys.stderr)
    changes = changed + diffs  # the data first: with the built-in tokenizer a changed file also changes the vocabulary
    if not changes:
        return folder
    listed = "\n  ".join(changes)
    if not cfg.checkpoint.accept_changes:
        what = "a different config" if list(kinds) == ["config"] else f"different {', '.join(kinds)}"
        raise CheckpointError(f"checkpoint {folder} was written with {what}:\n  {listed}"
                                   "\nresume with the same settings, data and reward functions; or go on with these "
                                   "changes with --accept-changes (checkpoint.accept_changes=true; recorded in "
                                   f"{Path(run_dir) / ACCEPTED}); or start a new run")
    record = {"time": time.strftime("%Y-%m-%d %H:%M:%S"), "checkpoint": str(folder), "step": step, "changes": changes}
    with open(Path(run_dir) / ACCEPTED, "a") as f:
        f.write(json.dumps(record) + "\n")
    print(f"note: resuming from {folder} with changes accepted (checkpoint.accept_changes; recorded in "
          f"{Path(run_dir) / ACCEPTED}):\n  {listed}", file=sys.stderr)
    return folder


def resume(run: Run, where: str) -> None:
    """Load the checkpoint `where` ("auto" = newest complete one of the run folder; `grpo_train.setup` hands in the
    folder `check_resume` chose, checked against this run's config and inputs) into `run`."""
    trust = run.cfg.checkpoint.trust_pickle
    folder = resolve_resume(run.run_dir, where, trust)
    state, saved_cfg = load(folder, trust_pickle=trust)
    diffs = config_differences(saved_cfg, C.to_dict(run.cfg), config_defaults(run.cfg))
    if diffs and not run.cfg.checkpoint.accept_changes:  # check_resume named them already, unless not called
        raise CheckpointError(f"checkpoint {folder} was written with a different config:\n  "
                                   + "\n  ".join(diffs) + "\nresume with the same settings, or start a new run")
    if state["step"] > run.cfg.train.max_steps:  # check_resume said so before the model loaded; a notebook may not
        raise CheckpointError(f"checkpoint {folder} is at step {state['step']}, past train.max_steps="
                                   f"{run.cfg.train.max_steps}; give --max-steps {state['step']} or more")
    ref = load_reference(folder.parent.parent, trust_pickle=trust)  # the run the checkpoint belongs to
    if ref is not None:  # the run had an SFT warm-up: restore its reference (and, under LoRA, the merged base)
        run.dist.load_full_state(run.policy.model if run.policy.is_lora else run.policy.ref_model, ref)
        run.updater.restart()  # under LoRA the trainable parameters are new objects
    if run.dist.sharded:
        run.dist.load_full_state(run.policy.model, state["weights"])
        run.dist.load_optimizer_state(run.policy.model, run.updater.optimizer, state["optimizer"])
    else:
        load_trainable_state(run.policy.model, state["weights"], folder)
        run.updater.optimizer.load_state_dict(state["optimizer"])
    update = run.updater
    update.scheduler.load_state_dict(state["scheduler"])
    for t, c in update.controllers.items():
        c.load_state_dict(state["controllers"][t])
    if update.entropy_control is not None and state.get("entropy_control") is not None:
        update.entropy_control.load_state_dict(state["entropy_control"])
    run.generation.sampler.load_state_dict(state["sampler"])
    update.guard.load_state_dict(state["guard"])
    if update.surgery is not None and state.get("surgery") is not None:
        update.surgery.load_state_dict(state["surgery"])
    run.progress.frontier.load_state_dict(state["frontier"])
    if run.dist.is_main:
        run.progress.frontier.remove_orphans()  # points saved after this checkpoint belong to the lost part of the run
    run.rewarder.counters = dict(state.get("counters", {}))
    update.guard.snapshot()
    run.progress.evals = state["evals"]
    run.progress.measures = state.get("measures", {})
    run.progress.step = state["step"]
    # not when extended
    run.progress.finished = bool(state.get("finished")) and run.progress.step >= run.cfg.train.max_steps
    set_rng_state(rank_rng_state(state, run.dist))
    if run.dist.is_main:
        run.tracker.resume_at(run.progress.step, state.get("metrics_rows"))  # metrics.jsonl, csv, samples, TensorBoard
        print(f"resumed from {folder} at step {run.progress.step}")
    run.dist.barrier()


def config_defaults(cfg: C.Config) -> dict[str, Any]:
    """Flat "section.field" -> dataclass default, for fields a checkpoint may predate (per-task KL included)."""
    flat: dict[str, Any] = {}
    for name, section in C.to_dict(C.Config()).items():
        if isinstance(section, dict) and name != "kl":
            flat.update({f"{name}.{k}": v for k, v in section.items()})
    for task in cfg.kl:
        flat.update({f"kl.{task}.{k}": v for k, v in dataclasses.asdict(C.TaskKLConfig()).items()})
    for spec in POLICY_LOSSES.values():  # a loss parameter left out is its registered default; a checkpoint from
        for p in spec.params:  # before the registry holds it as loss.<name>, absent now
            flat[f"loss.params.{p.name}"] = flat[f"loss.{p.name}"] = p.default
    return flat
