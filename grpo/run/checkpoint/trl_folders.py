"""TRL's checkpoint folders: with a TRL output_dir (checkpoint.final_model_dir) and checkpoints on (checkpoint.every,
TRL's save_strategy="steps" / save_steps), each checkpoint of the run also leaves output_dir/checkpoint-N, where N
is TRL's global step (optimizer steps: RL step x loss.mu), as transformers' Trainer does:

    checkpoint-N/   the model (or LoRA adapter) + tokenizer + model card (model_folder.save_model_folder),
                    trainer_state.json (transformers' TrainerState: global_step, epoch, max_steps, log_history = the
                    run's metrics rows of its RL steps so far, best_metric, best_model_checkpoint),
                    TRL_MARKER naming the exact-resume checkpoint it stands for (RUN/checkpoints/step_N, with the
                    sha256 of its manifest) and the run folder, both as paths from output_dir (a copied output_dir
                    stays whole): `--resume output_dir/checkpoint-N` goes on from there
                    (files.exact_checkpoint)

checkpoint.keep_last (save_total_limit) keeps the newest ones, and the best evaluation's as well under
checkpoint.keep_best (load_best_model_at_end), as transformers rotates them; only folders this run wrote (their
TRL_MARKER names its run folder) are ever deleted or replaced.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from grpo.core.plumbing import sha256
from grpo.run.checkpoint.files import MANIFEST, TRL_CHECKPOINT, TRL_MARKER
from grpo.run.checkpoint.folder import expand_home
from grpo.run.checkpoint.model_folder import save_model_folder
from grpo.run.record import Run
from grpo.run.tracking import read_metrics

STATE_FILE = "trainer_state.json"


def trl_checkpoints(cfg) -> bool:
    """Whether the run leaves TRL's checkpoint-N folders: a TRL output_dir and checkpoints every N steps or epoch."""
    return bool(cfg.checkpoint.final_model_dir) and bool(cfg.checkpoint.every or cfg.checkpoint.every_epoch)


def _record(folder: Path) -> dict:
    try:
        record = json.loads((folder / TRL_MARKER).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def written_by(folder: Path, run_dir: Path) -> bool:
    """Whether the checkpoint-N `folder` is one the run of `run_dir` wrote."""
    named = _record(folder).get("run_dir")
    return isinstance(named, str) and (folder.parent / named).resolve() == Path(run_dir).resolve()


def _best(run: Run, out: Path) -> tuple[float | None, int | None, str | None]:
    """(best_metric, best_global_step, best_model_checkpoint) as TrainerState holds them (checkpoint.keep_best)."""
    try:
        best = json.loads((run.run_dir / "best" / "best.json").read_text())
    except (OSError, ValueError):
        return None, None, None
    step = int(best["step"]) * run.cfg.loss.mu
    return float(best["value"]), step, str(out / f"checkpoint-{step}")


def trainer_state_record(run: Run, out: Path, global_step: int) -> dict:
    """transformers' trainer_state.json of the checkpoint at `global_step`."""
    from transformers import TrainerState

    cfg, mu = run.cfg, run.cfg.loss.mu
    prompts = sum(len(rows) for rows in run.samples.training.values()) or 1
    rows = read_metrics(run.run_dir) if (run.run_dir / "metrics.jsonl").is_file() else []
    rows = [row for row in rows if int(row.get("step", 0)) >= 1]  # the RL steps' rows (step 0: notes before RL)
    best_metric, best_step, best_folder = _best(run, out) if cfg.checkpoint.keep_best else (None, None, None)
    state = TrainerState(epoch=run.progress.step * cfg.prompts_per_step / prompts, global_step=global_step,
                         max_steps=cfg.total_updates, logging_steps=cfg.train.log_every * mu,
                         eval_steps=cfg.train.eval_every * mu, save_steps=cfg.checkpoint.every * mu,
                         train_batch_size=cfg.seqs_per_step, log_history=rows, best_metric=best_metric,
                         best_global_step=best_step, best_model_checkpoint=best_folder)
    return json.loads(state.to_json_string()) if hasattr(state, "to_json_string") else vars(state)


def save_trl_checkpoint(run: Run, exact: Path, state: dict | None = None) -> Path | None:
    """output_dir/checkpoint-N beside the exact-resume checkpoint `exact` (rank 0; module docstring), written whole
    into a temporary folder first; then the rotation. None when the run leaves none (`trl_checkpoints`)."""
    if not trl_checkpoints(run.cfg):
        return None
    out = expand_home(run.cfg.checkpoint.final_model_dir)
    global_step = run.progress.step * run.cfg.loss.mu
    final, tmp = out / f"checkpoint-{global_step}", out / f".tmp-checkpoint-{global_step}-{os.getpid()}"
    if final.exists() and not written_by(final, run.run_dir):
        print(f"warning: {final} was not written by this run: left as it is, no TRL checkpoint written there")
        return None
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        save_model_folder(run, tmp, state, what=f"checkpoint-{global_step} (RL step {run.progress.step})")
        (tmp / STATE_FILE).write_text(json.dumps(trainer_state_record(run, out, global_step), indent=2) + "\n")
        record = {"checkpoint": os.path.relpath(exact, out), "manifest_sha256": sha256(exact / MANIFEST),
                  "step": run.progress.step, "global_step": global_step, "run_dir": os.path.relpath(run.run_dir, out)}
        (tmp / TRL_MARKER).write_text(json.dumps(record, indent=1) + "\n")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():
        old = out / f".old-checkpoint-{global_step}-{os.getpid()}"
        os.replace(final, old)
        shutil.rmtree(old, ignore_errors=True)
    os.replace(tmp, final)
    rotate(run, out)
    return final


def rotate(run: Run, out: Path) -> list[Path]:
    """Delete this run's checkpoint-N folders beyond checkpoint.keep_last (save_total_limit; 0 keeps all), the
    newest kept, and the best evaluation's too under checkpoint.keep_best; the folders deleted."""
    keep_last = run.cfg.checkpoint.keep_last
    ours = sorted((f for f in out.iterdir() if TRL_CHECKPOINT.fullmatch(f.name) and written_by(f, run.run_dir)),
                  key=lambda f: int(f.name.split("-")[1]))
    if not keep_last:
        return []
    kept = set(ours[-keep_last:])
    if run.cfg.checkpoint.keep_best:
        best = _best(run, out)[2]
        kept |= {f for f in ours if str(f) == best}
    gone = [f for f in ours if f not in kept]
    for folder in gone:
        shutil.rmtree(folder, ignore_errors=True)
    return gone
