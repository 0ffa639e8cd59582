"""The demo beside busy neighbours: how much longer it takes with one and with two processes spinning on the CPU.

    python -m benchmarks.busy_neighbours [--repeats 3] [--cpus 0,1] [--repo PATH] [--json OUT]
                                         [-- trainer arguments, default: --seed 0 --max-steps 40]

For each load (0, 1, 2 neighbours) it starts that many `python -c "while True: pass"` processes, runs
`python grpo_train.py <arguments>` from `--repo` (this checkout by default: point it at another checkout for a before
/ after comparison), and stops the neighbours; loads alternate idle, one, two within each repeat, so a drift of the
machine touches every load alike. Per load, the median over repeats of:

    wall     the trainer process's wall time, start-up included (what a user waits for)
    steps    Σ time/step of its metrics.jsonl (the RL steps alone)
    ratio    median(load) / median(idle), both for wall and for steps

The goal: one neighbour <= 2.5x the idle wall time, two <= 3.5x (on 2 cores one spinning neighbour leaves a
fair share of half the machine: 2x). Measure on a machine with nothing else running: `--cpus 0,1` pins the trainer
and its neighbours to those CPUs (a 2-core sandbox on a larger machine; the trainer's train.threads=0 then reads 2 from
its affinity mask). Nothing runs at import.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parents[1]
DEMO_ARGS = ("--seed", "0", "--max-steps", "40")
"""What is timed: the demo's first 40 RL steps (its SFT warm-up and evaluations included)."""
LOADS = (0, 1, 2)
GOALS = {1: 2.5, 2: 3.5}
"""Wall-time ratio to idle each load must stay under (the module docstring's goal)."""
SPIN = "while True: pass"


def pinned(cpus: Sequence[int] | None):
    """A preexec_fn that pins the child to `cpus` (None = leave its affinity alone)."""
    if not cpus:
        return None
    return lambda: os.sched_setaffinity(0, set(cpus))


def start_neighbours(n: int, cpus: Sequence[int] | None) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", SPIN], preexec_fn=pinned(cpus)) for _ in range(n)]


def stop(procs: Sequence[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def steps_time(run_dir: Path) -> float:
    """Σ time/step over the RL rows of the run's metrics.jsonl."""
    total = 0.0
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line) if line.strip() else {}
        total += float(row.get("time/step", 0.0))
    return total


def trainer_command(args: Sequence[str], out: Path, name: str) -> list[str]:
    """The trainer's command line: the demo (or `args`) into the run folder out/name."""
    return [sys.executable, "grpo_train.py", *args, "--train.output_dir", str(out), "--train.run_name", name,
            "--train.tensorboard", "false"]


def run_once(repo: Path, args: Sequence[str], load: int, cpus: Sequence[int] | None, out: Path) -> dict[str, float]:
    """One trainer run beside `load` neighbours: {"wall": s, "steps": s}."""
    name = f"busy{load}-{time.monotonic_ns()}"
    cmd = trainer_command(args, out, name)
    neighbours = start_neighbours(load, cpus)
    try:
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=repo, preexec_fn=pinned(cpus), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        wall = time.perf_counter() - start
    finally:
        stop(neighbours)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed with exit status {proc.returncode}:\n{proc.stdout[-3000:]}")
    folder = out / name
    return {"wall": wall, "steps": steps_time(folder) if (folder / "metrics.jsonl").is_file() else float("nan")}


def summary(runs: dict[int, list[dict[str, float]]]) -> dict[int, dict[str, float]]:
    """Per load: the median wall and steps time, and their ratios to idle's."""
    med = {load: {k: statistics.median(r[k] for r in rs) for k in ("wall", "steps")} for load, rs in runs.items()}
    return {load: {**m, "wall_ratio": m["wall"] / med[0]["wall"], "steps_ratio": m["steps"] / med[0]["steps"]}
            for load, m in med.items()}


def table(result: dict[int, dict[str, float]]) -> str:
    lines = ["| busy neighbours | wall s | wall ratio | RL steps s | steps ratio | goal (wall) |",
             "|---|---|---|---|---|---|"]
    for load, m in sorted(result.items()):
        goal = f"<= {GOALS[load]}x: {'met' if m['wall_ratio'] <= GOALS[load] else 'MISSED'}" if load in GOALS else "-"
        lines.append(f"| {load} | {m['wall']:.1f} | {m['wall_ratio']:.2f}x | {m['steps']:.1f} | "
                     f"{m['steps_ratio']:.2f}x | {goal} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[int, dict[str, float]]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.busy_neighbours", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs per load (the median is reported)")
    parser.add_argument("--cpus", default="", help="pin the trainer and its neighbours to these CPUs, e.g. 0,1")
    parser.add_argument("--repo", type=Path, default=ROOT, help="the checkout whose grpo_train.py runs")
    parser.add_argument("--json", type=Path, help="write the per-run times and the summary here")
    parser.add_argument("trainer_args", nargs="*", default=list(DEMO_ARGS))
    args = parser.parse_args(argv)
    cpus = [int(c) for c in args.cpus.split(",") if c.strip()] or None
    runs: dict[int, list[dict[str, float]]] = {load: [] for load in LOADS}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for load in LOADS:
                one = run_once(args.repo.resolve(), args.trainer_args, load, cpus, Path(tmp))
                runs[load].append(one)
                print(f"repeat {repeat + 1}/{args.repeats}, {load} busy: {one['wall']:.1f} s wall, "
                      f"{one['steps']:.1f} s of RL steps", flush=True)
    result = summary(runs)
    print(f"\n`python grpo_train.py {' '.join(args.trainer_args)}` in {args.repo}, median of {args.repeats}"
          + (f", pinned to CPUs {args.cpus}" if cpus else f", {len(os.sched_getaffinity(0))} CPUs") + ":")
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "summary": result, "args": sys.argv[1:]}, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
