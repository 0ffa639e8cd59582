"""Soak test of crash safety: SIGKILL a training run at chosen moments, resume it each time, compare every output.

    python -m scripts.kill_resume_soak [--kills 20] [--steps 150] [--seed 0] [--out /tmp/grpo_soak]

1. An uninterrupted reference run of the tiny demo config (evaluation every --eval-every steps, so the Pareto
   frontier saves points; TensorBoard on; a checkpoint every step).
2. The same config started, killed with SIGKILL and resumed with `--resume auto`, `--kills` times. The kills take
   turns between three moments:
     checkpoint  a random moment 0..--max-delay s after the run wrote a fresh checkpoint (mid-step or mid-save);
     evaluation  0..0.15 s after the metrics row of an evaluation step appeared (held-out generation, scoring,
                 eval.json, the frontier's offer);
     pareto      right after a new Pareto point folder appeared (pareto/step_N/ being written).
   Each kill says where it landed. Before each resume every checkpoint folder that looks complete is verified
   against its manifest; a run killed before its first checkpoint is started afresh. Then it runs to the end.
3. Compared with the reference, after removing wall-clock timings and memory readings (`time/*`, `memory/*`): every
   file of `final/` byte for byte, metrics.jsonl, metrics.csv, samples.jsonl, eval.json, pareto/pareto.json and the
   TensorBoard scalars.
Prints the differences and `kills: 20 (...), corrupt checkpoints: 0, identical: final/ yes, metrics.jsonl yes, ...`.
Exit status 1 if anything differs or a checkpoint was corrupt. tests/test_kill_resume_soak.py runs a short version
(`--kills 3 --steps 15 --eval-every 3 --max-delay 0.5`, one kill per moment) as a subprocess on every test run.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import grpo.run.checkpoint.files as ckpt
from grpo.run.tracking import MEASURED_PREFIXES

ROOT = Path(__file__).resolve().parents[1]

TINY = ["--model.tiny_hidden", "32", "--model.tiny_layers", "1", "--model.tiny_heads", "2", "--data.demo_size", "40",
        "--data.eval_size", "4", "--rollout.max_new_tokens", "6", "--sft.steps", "4", "--train.tensorboard", "true",
        "--checkpoint.every", "1", "--train.lr", "3e-3", "--train.sample_every", "2",
        # rewards that pull the two tasks apart (long vs short replies): held-out scores move and trade off, so the
        # Pareto frontier keeps accepting points (the demo's rule rewards stay at 0 for a model this small)
        "--set", "rewards.fairness=scripts.kill_resume_soak:longer:1.0",
        "--set", "rewards.hallucination=scripts.kill_resume_soak:shorter:1.0"]
LENGTH_CAP = 24  # characters: the longest reply max_new_tokens=6 of the tiny tokenizer gives is about this long
MODES = ("checkpoint", "evaluation", "pareto")
KILL_ORDER = ("pareto", "checkpoint", "evaluation")
"""The order the kills aim at the moments. A Pareto kill needs an evaluation that moves the frontier (the first one
always does: step `eval_every`), a checkpoint kill a random delay's worth of steps, an evaluation kill any evaluation
ahead. Aimed in MODES' order, the checkpoint and evaluation kills could leave the Pareto kill only the last
evaluation, which a loaded machine can miss ("kills: 2 (checkpoint 1, evaluation 1, pareto 0)")."""
WAIT_S = 300  # longest wait for the moment a kill aims at, before killing anyway


def longer(completion: str, gold: dict) -> float:
    """Reward of the soak's fairness task: longer replies score higher (capped)."""
    return min(len(completion), LENGTH_CAP) / LENGTH_CAP


def shorter(completion: str, gold: dict) -> float:
    """Reward of the soak's hallucination task: shorter replies score higher."""
    return 1.0 - longer(completion, gold)


def command(out: Path, name: str, steps: int, seed: int, eval_every: int, resume: bool) -> list[str]:
    cmd = [sys.executable, str(ROOT / "grpo_train.py"), "--output-dir", str(out), "--run-name", name,
           "--max-steps", str(steps), "--seed", str(seed), "--train.eval_every", str(eval_every), *TINY]
    return cmd + (["--resume", "auto"] if resume else [])


def _newest_step(run_dir: Path) -> int:
    folders = ckpt.list_complete(run_dir) if run_dir.exists() else []
    return int(folders[-1].name[len(ckpt.PREFIX):]) if folders else -1


def _metric_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    steps = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            steps.append(int(json.loads(line).get("step", 0)))
        except (json.JSONDecodeError, ValueError):
            pass  # a line being written
    return steps


def _pareto_points(run_dir: Path) -> set[str]:
    root = run_dir / "pareto"
    return {p.name for p in root.glob("step_*")} if root.is_dir() else set()


def _evals(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "eval.json").read_text())
    except (OSError, json.JSONDecodeError):  # absent, or being written
        return {}


def _wait(proc: subprocess.Popen, ready: Callable[[], bool], poll_s: float) -> bool:
    deadline = time.time() + WAIT_S
    while time.time() < deadline and proc.poll() is None:
        if ready():
            return True
        time.sleep(poll_s)
    return False


def kill_once(proc: subprocess.Popen, run_dir: Path, mode: str, eval_every: int, rng: random.Random,
              max_delay: float) -> str | None:
    """Wait for the moment `mode` aims at, SIGKILL the run, and say where the kill landed (None: it had ended)."""
    # First a fresh checkpoint: the run is past start-up and its resume has already trimmed the files and removed
    # the Pareto folders of the killed run, so what appears next is this run's.
    start = _newest_step(run_dir)
    _wait(proc, lambda: _newest_step(run_dir) > start, 0.05)
    now, points = _newest_step(run_dir), _pareto_points(run_dir)
    if mode == "checkpoint":
        time.sleep(rng.uniform(0.0, max_delay))
    elif mode == "evaluation":  # the metrics row of an RL step that an evaluation follows
        _wait(proc, lambda: any(s % eval_every == 0 and s > now for s in _metric_steps(run_dir)), 0.01)
        time.sleep(rng.uniform(0.0, 0.15))
    else:  # a new Pareto point folder (its marker is written before the model), else the end of the evaluation
        evaluated = set(_evals(run_dir))
        _wait(proc, lambda: bool(_pareto_points(run_dir) - points) or bool(set(_evals(run_dir)) - evaluated), 0.002)
        if not _pareto_points(run_dir) - points:  # eval.json written: the frontier's offer comes next, then a save
            saved = _newest_step(run_dir)
            _wait(proc, lambda: bool(_pareto_points(run_dir) - points) or _newest_step(run_dir) > saved, 0.002)
    if proc.poll() is not None:
        return None
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    new_points = _pareto_points(run_dir) - points
    index = run_dir / "pareto" / "pareto.json"
    listed = {p["path"] for p in json.loads(index.read_text())["points"]} if index.exists() else set()
    evals = _evals(run_dir)
    last = max(_metric_steps(run_dir) or [0])
    if new_points - listed:
        return f"mid Pareto save ({', '.join(sorted(new_points - listed))} not yet in pareto.json)"
    if last % eval_every == 0 and f"step_{last}" not in evals:
        return f"during the evaluation of step {last}"
    if new_points:
        return f"after a Pareto save ({', '.join(sorted(new_points))}), at step {last}"
    return f"after step {last}'s metrics"


def _rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(MEASURED_PREFIXES)}
            for line in path.read_text().splitlines() if line.strip()]


def _csv(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return [{k: v for k, v in row.items() if not k.startswith(MEASURED_PREFIXES)} for row in csv.DictReader(fh)]


def _scalars(tb_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logging.getLogger("tensorboard").setLevel(logging.ERROR)  # its note on purged steps is expected here
    acc = EventAccumulator(str(tb_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in sorted(acc.Tags()["scalars"])
            if not tag.startswith(MEASURED_PREFIXES)}


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def compare(reference: Path, soak: Path) -> dict[str, list[str]]:
    """Per output: the differences between the two run folders (empty list = identical)."""
    out: dict[str, list[str]] = {}
    a, b = _files(reference / "final"), _files(soak / "final")
    out["final/"] = [f"{name}: {'missing' if name not in b else 'extra' if name not in a else 'differs'}"
                     for name in sorted(set(a) | set(b)) if a.get(name) != b.get(name)]
    for name, read in (("metrics.jsonl", _rows), ("samples.jsonl", _rows), ("metrics.csv", _csv)):
        ra, rb = read(reference / name), read(soak / name)
        out[name] = [] if ra == rb else [f"{len(ra)} rows vs {len(rb)}; first difference: {_first_difference(ra, rb)}"]
    for name in ("eval.json", "pareto/pareto.json"):
        ja, jb = (json.loads(p.read_text()) if p.exists() else None for p in (reference / name, soak / name))
        out[name] = [] if ja == jb else [f"{ja} vs {jb}"]
    sa, sb = _scalars(reference / "tb"), _scalars(soak / "tb")
    differing = [tag for tag in sorted(set(sa) | set(sb)) if sa.get(tag) != sb.get(tag)]
    out["TensorBoard"] = [f"{len(differing)} tags, e.g. {tag}: "
                          f"{_first_difference(sa.get(tag) or [], sb.get(tag) or [])}" for tag in differing[:1]]
    return out


def _first_difference(a: list, b: list) -> str:
    """Where two sequences first differ, in a line (the step of a metrics row, the (step, value) of a scalar)."""
    # the two may differ in length: they part where the shorter one ends
    i = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    def show(seq: list) -> str:
        if i >= len(seq):
            return "<end>"
        item = seq[i]
        return f"row of step {item.get('step')}" if isinstance(item, dict) else repr(item)
    return f"at {i}: {show(a)} vs {show(b)}"


def kill_in_turn(args: argparse.Namespace, out: Path, rng: random.Random) -> tuple[int, int, dict[str, int]]:
    """Start the soak run (resuming from its newest checkpoint once it has one) and kill it, --kills times, each kill
    in the next mode of KILL_ORDER; every complete checkpoint verified before each start. Returns (kills, corrupt
    checkpoints found, kills landed per mode)."""
    kills, corrupt, landed = 0, 0, {m: 0 for m in MODES}
    run_dir, logs = out / "soak", out / "logs"
    logs.mkdir(parents=True)
    while kills < args.kills:
        has_ckpt = bool(ckpt.list_complete(run_dir))
        if not has_ckpt:  # killed before its first checkpoint: a fresh start (the folder would be refused)
            shutil.rmtree(run_dir, ignore_errors=True)
        for folder in ckpt.list_complete(run_dir):
            try:
                ckpt.verify(folder)
            except ckpt.CheckpointError as e:
                corrupt += 1
                print(f"  corrupt: {e}", flush=True)
        mode = KILL_ORDER[kills % len(KILL_ORDER)]
        log = logs / f"launch_{kills + 1:02d}.log"
        with open(log, "w") as fh:  # a file, not a pipe: a pipe nobody reads would block the run when full
            proc = subprocess.Popen(command(out, "soak", args.steps, args.seed, args.eval_every, has_ckpt),
                                    stdout=fh, stderr=subprocess.STDOUT)
            where = kill_once(proc, run_dir, mode, args.eval_every, rng, args.max_delay)
        if where is None:
            print(f"  run ended (exit {proc.returncode}) before kill {kills + 1}; raise --steps. Its output:\n"
                  f"{log.read_text()[-2000:]}", flush=True)
            break
        kills += 1
        landed[mode] += 1
        newest = ckpt.find_resumable(run_dir) if run_dir.exists() else None
        print(f"  kill {kills:2d} [{mode:10s}] {where}; newest complete checkpoint: "
              f"{newest.name if newest else 'none'}", flush=True)
    return kills, corrupt, landed


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.kill_resume_soak",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--eval-every", type=int, default=5, help="evaluation (and Pareto offers) every N steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="/tmp/grpo_soak")
    parser.add_argument("--max-delay", type=float, default=2.0,
                        help="longest wait after a fresh checkpoint before a 'checkpoint' kill, seconds")
    args = parser.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    rng = random.Random(args.seed)

    print("reference run (uninterrupted) ...", flush=True)
    reference = subprocess.run(command(out, "reference", args.steps, args.seed, args.eval_every, False),
                               capture_output=True, text=True)
    if reference.returncode != 0:
        print(f"the reference run failed (exit {reference.returncode}):\n{reference.stderr[-3000:]}")
        return 1

    kills, corrupt, landed = kill_in_turn(args, out, rng)
    run_dir = out / "soak"
    final = subprocess.run(command(out, "soak", args.steps, args.seed, args.eval_every,
                                   bool(ckpt.list_complete(run_dir))), capture_output=True, text=True)
    if final.returncode != 0:
        print(f"the last resume failed (exit {final.returncode}):\n{final.stderr[-3000:]}")
        return 1
    diffs = compare(out / "reference", run_dir)
    for what, lines in diffs.items():
        for line in lines:
            print(f"  {what} differs: {line}")
    verdict = ", ".join(f"{what} {'no' if lines else 'yes'}" for what, lines in diffs.items())
    print(f"kills: {kills} ({', '.join(f'{m} {n}' for m, n in landed.items())}), corrupt checkpoints: {corrupt}, "
          f"identical: {verdict}")
    return 0 if corrupt == 0 and not any(diffs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
