"""A Pareto frontier of evaluated checkpoints over several maximised scores (one per task).

    a dominates b  ⇔  a_k ≥ b_k for every score k and a_k > b_k for at least one     (Pareto dominance)
    crowding(p)    = Σ_k (next_k − prev_k) / (max_k − min_k), ∞ at either end of any k   (Deb 2002, NSGA-II)

The frontier keeps only non-dominated points, each with a real checkpoint folder `root_dir/step_000123`.
When it holds more than `cap` points it drops the one with the smallest crowding distance (the most redundant;
the extremes of every score are never dropped while cap ≥ 2), ties broken by the lowest scalarised score and
then the oldest step. A point with the same scores as one already kept is rejected (it adds nothing).

Safety: the frontier deletes only folders directly inside `root_dir`, named `step_<digits>`, that hold its marker
file (written before `save_fn` runs). Give it a dedicated folder (e.g. `run_dir/"pareto"`).
`pareto.json` in `root_dir` is written atomically (tmp file + os.replace) after every change; paths in it are
relative to `root_dir`.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from grpo import config as C

MARKER = ".pareto_point"
"""File written into each point's folder; only folders holding it are ever deleted."""
STEP_DIR = re.compile(r"step_\d+")
REMOVING = ".removing-"
"""Prefix of a point folder being deleted (`_remove_dir`); such folders are the frontier's by construction."""
INDEX_FILE = "pareto.json"
RUN_SUBDIR = "pareto"
"""The frontier's folder inside a run folder (grpo_train.setup; the report reads its index from there)."""
Scalarize = str | Mapping[str, float]


@dataclass(frozen=True)
class ParetoPoint:
    step: int
    scores: dict[str, float]
    path: Path
    """Absolute checkpoint folder."""


def dominates(a: Mapping[str, float] | Sequence[float], b: Mapping[str, float] | Sequence[float]) -> bool:
    """a dominates b (scores maximised): a ≥ b everywhere and a > b somewhere. Dicts must share their keys."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        if set(a) != set(b):
            raise ValueError(f"pareto.dominates: score keys differ: {sorted(a)} vs {sorted(b)}")
        pairs = [(a[k], b[k]) for k in sorted(a)]
    else:
        if len(a) != len(b):
            raise ValueError(f"pareto.dominates: {len(a)} scores vs {len(b)}")
        pairs = list(zip(a, b, strict=True))  # type: ignore[arg-type]
    return all(x >= y for x, y in pairs) and any(x > y for x, y in pairs)


def scalarize_scores(scores: Mapping[str, float], how: Scalarize = "mean") -> float:
    """One number from the scores: "mean", "min" (the worst task), or a weighted sum with a weight per key."""
    if isinstance(how, Mapping):
        missing = set(scores) - set(how)
        if missing:
            raise ValueError(
                f"pareto: scalarisation weights miss keys {sorted(missing)}; give a weight for every score"
            )
        return sum(float(how[k]) * v for k, v in scores.items())
    if not scores:
        raise ValueError("pareto: no scores to scalarise (no task was evaluated: does every task have held-out rows?)")
    if how == "mean":
        return sum(scores.values()) / len(scores)
    if how == "min":
        return min(scores.values())
    raise ValueError(f"pareto: unknown scalarisation {how!r}; use 'mean', 'min' or a dict of weights")


def crowding_distances(points: Sequence[Mapping[str, float]]) -> list[float]:
    """NSGA-II crowding distance of each point within the set (∞ for the extremes of any score)."""
    if not points:
        return []
    dist = [0.0] * len(points)
    for key in points[0]:
        order = sorted(range(len(points)), key=lambda i: points[i][key])
        lo, hi = points[order[0]][key], points[order[-1]][key]
        dist[order[0]] = dist[order[-1]] = math.inf
        if hi == lo:
            continue
        for rank in range(1, len(order) - 1):
            gap = points[order[rank + 1]][key] - points[order[rank - 1]][key]
            dist[order[rank]] += gap / (hi - lo)
    return dist


def require_heldout_rows(train: Mapping[str, Sequence[object]], heldout: Mapping[str, Sequence[object]],
                         heldout_fraction: float) -> None:
    """Every task needs training rows, and held-out rows unless `heldout_fraction` is 0 (none held out on purpose,
    TRL's split: such a task is judged from its training rewards): evaluations, the report and the frontier compare
    held-out scores per task. Raises ValueError naming each task that lacks them, before any training starts."""
    problems = []
    for task in sorted(set(train) | set(heldout)):
        n_train, n_held = len(train.get(task, ())), len(heldout.get(task, ()))
        if n_held == 0 and heldout_fraction > 0:
            problems.append(f"task {task!r} has {n_train} rows and none held out for evaluation (data.heldout_fraction"
                            f"={heldout_fraction:g} of the rows, picked by a hash of each row's id): give it more "
                            f"rows (about {math.ceil(1 / heldout_fraction)} per held-out row) or raise "
                            "data.heldout_fraction")
        elif n_train == 0:
            problems.append(f"task {task!r} has all its {n_held} rows held out and none to train on: give it more "
                            "rows or lower data.heldout_fraction")
    if problems:
        raise ValueError("; ".join(problems))


def check_evaluations(train: Any, heldout: Mapping[str, Sequence[object]], keep_best: bool = False) -> None:
    """What needs held-out rows when no task has any (data.heldout_fraction=0 and no held-out rows given, TRL's
    split without an eval split): evaluations during RL (train.eval_every, train.eval_every_epoch) and the pass@K
    diagnostic (train.pass_at_k) are a ConfigError naming the field, as TRL refuses an eval_strategy without an
    eval_dataset. And a train.best_metric of one task (reward/<task>) that ranks evaluations (`keep_best`:
    checkpoint.keep_best, or early stopping) names a task with held-out rows. `train`: the train section."""
    task = train.best_metric.removeprefix("reward/")
    if (keep_best or train.early_stopping_patience) and train.best_metric != "reward" and not heldout.get(task):
        raise C.ConfigError(f"config field `train.best_metric` = {train.best_metric!r} is invalid: no task of this run "
                            f"named {task!r} has held-out rows (evaluated: "
                            f"{sorted(t for t, r in heldout.items() if r)})"
                            f"{C.did_you_mean([task], [t for t, r in heldout.items() if r])}; use reward (the mean) "
                            "or reward/<one of them>", field="train.best_metric")
    if any(heldout.values()):
        return
    why = ("no task of this run has held-out rows (data.heldout_fraction=0: every row trains, and none were given as "
           "held out): give held-out rows (tasks.<task>.heldout, a DatasetDict's test split, train(eval_dataset=...), "
           "TRL's dataset_test_split) or set data.heldout_fraction (e.g. 0.2), or")
    for field, value, off in (("eval_every", train.eval_every, "0 (TRL: eval_strategy=no)"),
                              ("eval_every_epoch", train.eval_every_epoch, "false (TRL: eval_strategy=no)"),
                              ("pass_at_k", train.pass_at_k, "0")):
        if value:
            raise C.ConfigError(f"config field `train.{field}` = {value!r} is invalid: it evaluates held-out prompts "
                                f"and {why} set train.{field}={off}", field=f"train.{field}")


class ParetoFrontier:
    """Non-dominated checkpoints with their scores; see the module docstring for the rules."""

    def __init__(self, cap: int, root_dir: str | Path, scalarize: Scalarize = "mean") -> None:
        if cap < 1:
            raise ValueError(f"ParetoFrontier: cap must be ≥ 1, got {cap}")
        self.cap, self.root_dir, self.scalarize = cap, Path(root_dir).resolve(), scalarize
        self.points: list[ParetoPoint] = []
        self.last_reason = ""
        """Why the last `offer` was accepted or rejected (for the log)."""

    # ---- queries -------------------------------------------------------------------------------------------
    def best(self, scalarize: Scalarize | None = None) -> ParetoPoint | None:
        """The point with the highest scalarised score (latest step on ties); None when empty."""
        how = self.scalarize if scalarize is None else scalarize
        if not self.points:
            return None
        return max(self.points, key=lambda p: (scalarize_scores(p.scores, how), p.step))

    def metrics(self) -> dict[str, float]:
        return {"pareto/size": float(len(self.points))}

    # ---- the one mutation ----------------------------------------------------------------------------------
    def offer(self, step: int, scores: Mapping[str, float], save_fn: Callable[[Path], None]) -> bool:
        """Add (step, scores) if no kept point dominates or equals it; returns whether it was added.

        On acceptance: `save_fn(root_dir/"step_{step:06d}")` writes the checkpoint into that (existing, empty)
        folder, dominated points and the capped point lose their folders, and `pareto.json` is rewritten.
        Empty `scores` raise ValueError (a frontier over no task means nothing was evaluated).
        Rejected (no save): a NaN/inf score, a dominated or duplicate point, a step already kept, or a new point
        that the cap would drop at once. `last_reason` says which.
        """
        scores = {k: float(v) for k, v in scores.items()}
        if not scores:
            raise ValueError(f"ParetoFrontier.offer: step {step} has no scores: no task had held-out rows to evaluate "
                             "(data.heldout_fraction / data.eval_size; see require_heldout_rows)")
        bad = sorted(k for k, v in scores.items() if not math.isfinite(v))
        if bad:
            return self._reject(f"step {step}: non-finite score for {bad}; not offered")
        if self.points and set(scores) != set(self.points[0].scores):
            raise ValueError(
                f"ParetoFrontier.offer: step {step} has scores {sorted(scores)}, "
                f"the frontier {sorted(self.points[0].scores)}"
            )
        for p in self.points:
            if p.step == step:
                return self._reject(f"step {step}: already on the frontier")
            if dominates(p.scores, scores) or p.scores == scores:
                return self._reject(f"step {step}: dominated by (or equal to) step {p.step}")
        survivors = [p for p in self.points if not dominates(scores, p.scores)]
        new = ParetoPoint(step, scores, self.root_dir / f"step_{step:06d}")
        kept = survivors + [new]
        dropped = [p for p in self.points if p not in survivors]
        while len(kept) > self.cap:
            victim = self._least_useful(kept)
            if victim is new:
                return self._reject(f"step {step}: non-dominated but dropped by the cap of {self.cap} (least crowded)")
            kept.remove(victim)
            dropped.append(victim)
        self._save(new, save_fn)
        self.points = sorted(kept, key=lambda p: p.step)
        self._write_index()  # the index never names a deleted folder: write it before deleting
        for p in dropped:
            self._remove_dir(p.path)
        self.last_reason = f"step {step}: added; removed steps {[p.step for p in dropped]}"
        return True

    def _reject(self, reason: str) -> bool:
        self.last_reason = reason
        return False

    def _least_useful(self, points: list[ParetoPoint]) -> ParetoPoint:
        dist = crowding_distances([p.scores for p in points])
        keys = [(dist[i], scalarize_scores(p.scores, self.scalarize), p.step) for i, p in enumerate(points)]
        return points[keys.index(min(keys))]

    # ---- files ---------------------------------------------------------------------------------------------
    def _save(self, point: ParetoPoint, save_fn: Callable[[Path], None]) -> None:
        if point.path.exists():  # a leftover of a crash between save and index write
            self._remove_dir(point.path)
        point.path.mkdir(parents=True)
        (point.path / MARKER).write_text(f"{point.step}\n")
        try:
            save_fn(point.path)
        except BaseException:
            self._remove_dir(point.path)
            raise
        if not any(f.name != MARKER for f in point.path.iterdir()):
            self._remove_dir(point.path)
            raise RuntimeError(
                f"ParetoFrontier: save_fn wrote nothing into {point.path}; it must write the checkpoint there"
            )

    def _check_owned(self, path: Path) -> Path:
        """The resolved path if the frontier may delete it; raises otherwise."""
        resolved = path.resolve()
        if path.is_symlink() or resolved.parent != self.root_dir or not STEP_DIR.fullmatch(resolved.name):
            raise ValueError(
                f"ParetoFrontier: refusing to touch {path}: not a step_<n> folder directly inside {self.root_dir}"
            )
        return resolved

    def _remove_dir(self, path: Path) -> None:
        resolved = self._check_owned(path)
        if not resolved.exists():
            return
        if not (resolved / MARKER).is_file():
            raise ValueError(
                f"ParetoFrontier: refusing to delete {resolved}: it has no {MARKER} marker, so it is not ours"
            )
        # renamed first (atomic), then deleted: a kill inside rmtree leaves a REMOVING folder that `remove_orphans`
        # sweeps, never a step folder without its marker that no later run may delete
        doomed = self.root_dir / f"{REMOVING}{resolved.name}-{os.getpid()}"
        os.replace(resolved, doomed)
        shutil.rmtree(doomed, ignore_errors=True)

    def remove_orphans(self) -> list[Path]:
        """Delete marked step folders in root_dir that the frontier does not list (left by a crash); call on resume."""
        if not self.root_dir.is_dir():
            return []
        listed = {p.path for p in self.points}
        orphans = [
            d
            for d in sorted(self.root_dir.iterdir())
            if STEP_DIR.fullmatch(d.name) and d.is_dir() and not d.is_symlink()
            and d.resolve() not in listed and (d / MARKER).is_file()
        ]
        for d in orphans:
            self._remove_dir(d)
        for d in self.root_dir.glob(f"{REMOVING}step_*"):  # deletions a kill interrupted
            if d.is_dir() and not d.is_symlink():
                shutil.rmtree(d, ignore_errors=True)
        return orphans

    def _write_index(self) -> None:
        self.root_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.root_dir / f".{INDEX_FILE}.tmp"
        tmp.write_text(json.dumps(self.state_dict(), indent=2, allow_nan=False))
        os.replace(tmp, self.root_dir / INDEX_FILE)

    # ---- resume --------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, object]:
        return {
            "cap": self.cap,
            "points": [{"step": p.step, "scores": p.scores, "path": p.path.name} for p in self.points],
        }

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        """Restore the points (paths relative to root_dir); every path must be a step folder inside root_dir."""
        points = []
        for item in state["points"]:  # type: ignore[union-attr]
            path = self._check_owned(self.root_dir / item["path"])
            points.append(ParetoPoint(int(item["step"]), {k: float(v) for k, v in item["scores"].items()}, path))
        self.points = sorted(points, key=lambda p: p.step)

    @classmethod
    def load(cls, cap: int, root_dir: str | Path, scalarize: Scalarize = "mean") -> "ParetoFrontier":
        """A frontier restored from root_dir/pareto.json when it exists, else an empty one."""
        frontier = cls(cap, root_dir, scalarize)
        index = frontier.root_dir / INDEX_FILE
        if index.is_file():
            frontier.load_state_dict(json.loads(index.read_text()))
        return frontier
