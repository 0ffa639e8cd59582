"""The best evaluated model and early stopping, as transformers' Trainer keeps them for TRL.

    checkpoint.keep_best          load_best_model_at_end: the final model is the best evaluation's
    train.best_metric             metric_for_best_model: reward (the mean held-out reward) or reward/<task>
    train.greater_is_better       greater_is_better
    train.early_stopping_patience EarlyStoppingCallback(early_stopping_patience, early_stopping_threshold)
    train.early_stopping_threshold

The rules are transformers' (Trainer._determine_best_metric, EarlyStoppingCallback.check_metric_value): an
evaluation is the new best when it is strictly better than the best so far (or is the first); early stopping counts
the evaluations in a row that are not better than the best *before* them by more than the threshold, and stops RL
once the count reaches the patience. Evaluations are the held-out ones during RL, every train.eval_every steps
(eval.json's step_N), and, for the best model, the last step's (after_rl). The best's weights are saved when it is
evaluated (RUN/best/, with best.json naming its step), and loaded back into the policy before the final model is
written; eval.json's after_rl then holds the best's scores (the final model's), the last step's going to its step_N.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from grpo import config as C
from grpo.run.checkpoint.files import optional_write
from grpo.run.checkpoint.model_folder import save_model_folder
from grpo.run.record import Run
from grpo.run.trl.vocabulary import in_user_terms

BEST_SUBDIR = "best"
"""The run folder's copy of the best evaluated model (checkpoint.keep_best)."""
BEST_FILE = "best.json"
"""Beside it: {"step", "metric", "value"} of the evaluation it is."""


def metric_value(results: Mapping[str, float], metric: str) -> float | None:
    """train.best_metric of one evaluation's {task: held-out reward}: "reward" the mean over its tasks,
    "reward/<task>" that task's; None when it has no such value (or a non-finite one)."""
    if metric == "reward":
        values = [float(v) for v in results.values()]
        value = math.fsum(values) / len(values) if values else None
    else:
        value = results.get(metric.removeprefix("reward/"))
    return float(value) if value is not None and math.isfinite(float(value)) else None


def better(value: float, best: float | None, greater: bool) -> bool:
    """transformers' comparison: the first value, or one strictly greater (smaller, unless `greater`) than the best."""
    return best is None or (value > best if greater else value < best)


def patience_count(values: Sequence[float], threshold: float, greater: bool) -> int:
    """EarlyStoppingCallback's counter after these evaluations, in order: 0 after one that beats the best before it
    by more than `threshold` (or the first), one more after any other; the best moves with every strict improvement,
    threshold or not (Trainer._determine_best_metric runs after the callback)."""
    count, best = 0, None
    for value in values:
        count = 0 if best is None or (better(value, best, greater) and abs(value - best) > threshold) else count + 1
        best = value if better(value, best, greater) else best
    return count


def step_evaluations(evals: Mapping[str, Mapping[str, float]], metric: str) -> list[tuple[int, float]]:
    """(step, best_metric) of the evaluations during RL (eval.json's step_N), in step order."""
    points = [(int(tag[5:]), metric_value(results, metric)) for tag, results in evals.items()
              if tag.startswith("step_") and tag[5:].isdigit()]
    return sorted((step, value) for step, value in points if value is not None)


def keep_if_best(run: Run, step: int, results: Mapping[str, float], state: dict | None = None) -> None:
    """After evaluation step_N (rank 0; `state`: the whole model gathered from FSDP shards): its weights replace
    RUN/best/ when it is the best so far (checkpoint.keep_best), written whole into a new folder first."""
    train = run.cfg.train
    value = metric_value(results, train.best_metric)
    earlier = [v for s, v in step_evaluations(run.progress.evals, train.best_metric) if s < step]
    best = None
    for v in earlier:
        best = v if better(v, best, train.greater_is_better) else best
    if value is None or not better(value, best, train.greater_is_better):
        return
    folder, fresh = run.run_dir / BEST_SUBDIR, run.run_dir / f".{BEST_SUBDIR}.new"
    shutil.rmtree(fresh, ignore_errors=True)
    save_model_folder(run, fresh, state, what=f"the best held-out evaluation's model (RL step {step})")
    (fresh / BEST_FILE).write_text(json.dumps({"step": step, "metric": train.best_metric, "value": value}))
    shutil.rmtree(folder, ignore_errors=True)
    fresh.rename(folder)


def stops_early(run: Run) -> bool:
    """After evaluation step_N: whether RL ends here (train.early_stopping_patience evaluations in a row without an
    improvement), on every process; rank 0 decides, says why and logs early_stopping/* at the step (the report names
    the stop in the verdict)."""
    train = run.cfg.train
    if not train.early_stopping_patience:
        return False
    stop = False
    if run.dist.is_main:
        points = step_evaluations(run.progress.evals, train.best_metric)
        count = patience_count([v for _, v in points], train.early_stopping_threshold, train.greater_is_better)
        stop = count >= train.early_stopping_patience
        if stop:
            best_step, best = points[0]
            for s, v in points:
                best_step, best = (s, v) if better(v, best, train.greater_is_better) else (best_step, best)
            run.tracker.log({"early_stopping/stopped": 1.0, "early_stopping/best": best,
                             "early_stopping/best_step": float(best_step), "early_stopping/patience": float(count)},
                            run.progress.step)
            print(in_user_terms(f"early stopping after step {run.progress.step}: {count} evaluations in a row did "
                                f"not improve train.best_metric={train.best_metric} by more than "
                                f"train.early_stopping_threshold={train.early_stopping_threshold:g} over its best "
                                f"{best:.4g} (step {best_step}): train.early_stopping_patience={count}",
                                C.to_dict(run.cfg)), flush=True)
    return run.dist.any(stop)


def best_of_run(evals: Mapping[str, Mapping[str, float]], metric: str, greater: bool,
                last_step: int) -> tuple[int, float] | None:
    """(step, value) of the best evaluation of RL: the step_N ones in order, then after_rl as the last step's (the
    earlier wins a tie, as a strictly better one alone replaces the best); None without one."""
    points = step_evaluations(evals, metric)
    final = metric_value(evals.get("after_rl", {}), metric)
    if final is not None and not any(step == last_step for step, _ in points):
        points.append((last_step, final))
    best: tuple[int, float] | None = None
    for step, value in points:
        best = (step, value) if better(value, None if best is None else best[1], greater) else best
    return best


def settle_best(run: Run) -> Path | None:
    """Before the final model is written (checkpoint.keep_best): when an earlier evaluation beat the last step's,
    load its weights (RUN/best/) into the policy on every process, and make eval.json's after_rl (what the report
    and the Pareto point read as the final model's) its scores, the last step's going to step_<last>. Returns the
    folder loaded, or None (the last step is the best, or nothing to keep)."""
    from grpo.run.checkpoint.save_resume import load_weights

    if not run.cfg.checkpoint.keep_best:
        return None
    train, progress, folder = run.cfg.train, run.progress, run.run_dir / BEST_SUBDIR
    chosen = None
    if run.dist.is_main:
        best = best_of_run(progress.evals, train.best_metric, train.greater_is_better, progress.step)
        kept = json.loads((folder / BEST_FILE).read_text()) if (folder / BEST_FILE).is_file() else {}
        if best is not None and best[0] == progress.step and kept.get("step") not in (None, best[0]):
            _last_won(run, kept, best)
        if best is not None and best[0] != progress.step:
            if kept.get("step") == best[0]:
                chosen = str(folder)
            else:  # a resumed run whose best/ is another evaluation's: the last model stays, said so
                print(f"warning: {folder} holds step {kept.get('step')}'s weights, not the best evaluation's (step "
                      f"{best[0]}): the final model is the last step's", file=sys.stderr)
    chosen = run.dist.broadcast(chosen)
    if chosen is None:
        return None
    load_weights(run, Path(chosen))
    if run.dist.is_main:
        last = progress.evals["after_rl"]
        _relabel(run, best[0])
        _write_final(folder, best[0], best[1], "this folder's weights (the best evaluation's)")
        print(in_user_terms(f"final model: the best evaluation's, step {best[0]} ({train.best_metric} {best[1]:.4g}), "
                            f"not the last step's ({metric_value(last, train.best_metric)}): checkpoint.keep_best=true",
                            C.to_dict(run.cfg)), flush=True)
    run.dist.barrier()
    return Path(chosen)


def _write_final(folder: Path, step: int, value: float, what: str) -> None:
    """best.json's `final_model` {step, value, holds}: which model final/ (and the output folder) holds."""
    kept = json.loads((folder / BEST_FILE).read_text())
    kept["final_model"] = {"step": step, "value": value, "holds": what}
    (folder / BEST_FILE).write_text(json.dumps(kept))


def _last_won(run: Run, kept: Mapping[str, Any], best: tuple[int, float]) -> None:
    """The last step's evaluation beat best/'s: final/ holds the last step's model, best/ an earlier, worse one.
    best.json and the console say so, so that best/ is not read as the model the run chose."""
    _write_final(run.run_dir / BEST_SUBDIR, best[0], best[1], "the last step's weights, not this folder's: the last "
                 "step's evaluation beat this one")
    print(in_user_terms(f"final model: the last step's, step {best[0]} ({run.cfg.train.best_metric} {best[1]:.4g}), "
                        f"which beat every earlier evaluation; {run.run_dir / BEST_SUBDIR} keeps step "
                        f"{kept.get('step')}'s weights ({kept.get('value')}): checkpoint.keep_best=true",
                        C.to_dict(run.cfg)), flush=True)


def _relabel(run: Run, step: int) -> None:
    """eval.json, measures.json and evals/: after_rl becomes step `step`'s (the final model's), and the last step's
    evaluation its step_<last> (unless that exists), files rewritten in place."""
    progress, folder = run.progress, run.run_dir
    last = f"step_{progress.step}"
    for records, name in ((progress.evals, "eval.json"), (progress.measures, "measures.json")):
        if "after_rl" in records:
            records.setdefault(last, records["after_rl"])
            records["after_rl"] = records.get(f"step_{step}", records["after_rl"])
            (folder / name).write_text(json.dumps(records, indent=2))
    evals = folder / "evals"
    if (evals / "after_rl.jsonl").is_file() and not (evals / f"{last}.jsonl").exists():
        shutil.copyfile(evals / "after_rl.jsonl", evals / f"{last}.jsonl")
    if (evals / f"step_{step}.jsonl").is_file():
        shutil.copyfile(evals / f"step_{step}.jsonl", evals / "after_rl.jsonl")


def offer_evaluation(run: Run, results: dict[str, float], state: dict[str, Any] | None) -> None:
    """An RL step's held-out evaluation: its weights offered to the Pareto frontier (saved as a point if they join it)
    and, with checkpoint.keep_best, kept in best/ when they are the best so far. `state`: the full weights when
    sharded, else None."""
    step = run.progress.step
    run.progress.frontier.offer(step, results, save_fn=lambda path: save_model_folder(
        run, path, state, what=f"a Pareto point (RL step {step})"))
    if run.cfg.checkpoint.keep_best:  # RUN/best/: the best evaluation's weights, for the final model
        keep_if_best(run, step, results, state)


def offer_final_point(run: Run, final: Path) -> None:
    """The final model offered to the Pareto frontier with its after_rl scores (a copy of final/), after it is
    saved: a point that cannot be written is a warning. Offered again by a run resumed from its final checkpoint."""
    results = run.progress.evals.get("after_rl")
    frontier = run.progress.frontier
    if not results or frontier is None or any(p.step == run.progress.step for p in frontier.points):
        return

    def copy_final(path: Path) -> None:
        for item in final.iterdir():
            shutil.copyfile(item, path / item.name)

    optional_write(f"the Pareto point of step {run.progress.step}",
                   lambda: frontier.offer(run.progress.step, results, save_fn=copy_final))
