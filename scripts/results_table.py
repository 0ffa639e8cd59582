"""The demo's results table (docs/RESULTS.md), from real runs: run the demo for seeds 0-2 (or read run folders) and
print it.

    python -m scripts.results_table                       # runs `python grpo_train.py --seed N` for N = 0, 1, 2
    python -m scripts.results_table --write               # ... and replaces the table in docs/RESULTS.md
    python -m scripts.results_table --runs DIR0 DIR1 DIR2 # reads finished run folders instead (seed from config.json)
    python -m scripts.results_table --seeds 0 1 2 3 4 --out /tmp/demo_runs
    python -m scripts.results_table --preset smollm2-dual --out runs/smollm2-dual   # another preset's table

Columns, per seed and task, from the run's eval.json (greedy held-out reward, rule graders): before SFT, after SFT,
after RL, RL gain = after RL − after SFT; the wall time of the whole run (from config.json, written at start-up, to
report.json, written at the end) and its peak host memory (report.json's summary.host_peak_gb), on the seed's first
row. The rewards are deterministic for a given machine and thread count (the demo pins every RNG); the time and the
memory are not, so `tests/test_results_table.py` compares the reward columns exactly and only the format of those two.
Runs use OMP_NUM_THREADS=2 unless it is set (the table's "2 CPU cores"). A run folder's .jsonl records are read plain or
gzipped (a kept copy: benchmarks/common.read_record).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import has_record, read_record

ROOT = Path(__file__).resolve().parents[1]

TABLE_DOC = ROOT / "docs" / "RESULTS.md"
"""Where the demo's table stands (its first section) and where --write writes it."""
SEEDS = (0, 1, 2)
HEADER = "| seed | task | before SFT | after SFT | after RL | RL gain | wall time (2 CPU cores) | peak host memory |"
RULE = "|---|---|---|---|---|---|---|---|"
TIME_CELL = re.compile(r"^(\d+ s)?$")
"""A time cell: whole seconds on a seed's first row, empty on its other rows."""
MEMORY_CELL = re.compile(r"^(\d+\.\d\d GB|-)?$")
"""A memory cell: the run's peak resident set (report.json's summary.host_peak_gb, GiB) on a seed's first row ("-"
for a run that predates the figure), empty on its other rows."""
MEASURED_COLUMNS = 2
"""The last columns (wall time, peak memory) differ from run to run; the others must match."""


def table_rows(run_dir: Path) -> list[str]:
    """The table rows of one finished demo run folder (eval.json, config.json, report.json), tasks in sorted order."""
    evals = json.loads((run_dir / "eval.json").read_text())
    seed = json.loads((run_dir / "config.json").read_text())["train"]["seed"]
    missing = [p for p in ("before_sft", "after_sft", "after_rl") if p not in evals]
    if missing:
        raise ValueError(f"{run_dir / 'eval.json'} has no {missing} phase(s): is the run finished, with an SFT "
                         "warm-up?")
    seconds = (run_dir / "report.json").stat().st_mtime - (run_dir / "config.json").stat().st_mtime
    peak = json.loads((run_dir / "report.json").read_text()).get("summary", {}).get("host_peak_gb")
    memory = "-" if peak is None else f"{peak:.2f} GB"
    rows = []
    for i, task in enumerate(sorted(evals["after_rl"])):
        before, sft, rl = evals["before_sft"][task], evals["after_sft"][task], evals["after_rl"][task]
        measured = f" {seconds:.0f} s | {memory} |" if i == 0 else " | |"  # the table writes an empty cell as "| |"
        rows.append(f"| {seed} | {task} | {before:.3f} | {sft:.3f} | {rl:.3f} | {rl - sft:+.3f} |{measured}")
    return rows


def part_rows(run_dir: Path) -> list[str]:
    """Each grader's own held-out mean per phase (evals/<phase>.jsonl, written by every evaluation; averaged by
    grpo.phases.evaluation.part_means, as the run's eval_part/<task>/<grader> metrics are)."""
    from grpo.phases.evaluation import part_means  # imports torch: only when --parts asks for it

    seed = json.loads((run_dir / "config.json").read_text())["train"]["seed"]
    phases = [p for p in ("before_sft", "after_sft", "after_rl") if has_record(run_dir / "evals" / f"{p}.jsonl")]
    means: dict[tuple[str, str], dict[str, float]] = {}
    for phase in phases:
        kept = [json.loads(x) for x in read_record(run_dir / "evals" / f"{phase}.jsonl").splitlines() if x]
        for task, by_name in part_means((r["task"], r["parts"]) for r in kept).items():
            for name, mean in by_name.items():
                means.setdefault((task, name), {})[phase] = mean
    return [f"| {seed} | {task} | {name} | " + " | ".join(f"{by.get(p, float('nan')):.3f}" for p in phases) + " |"
            for (task, name), by in sorted(means.items())]


def table(run_dirs: list[Path]) -> str:
    """The whole table: header, rule, and every run's rows in the order given."""
    return "\n".join([HEADER, RULE] + [row for d in run_dirs for row in table_rows(d)])


def run_demo(seed: int, out: Path, preset: str = "demo") -> Path:
    """`python grpo_train.py --preset PRESET --seed SEED` into OUT/seedSEED; returns the run folder. Raises on a
    failed run."""
    name = f"seed{seed}"
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    done = subprocess.run([sys.executable, str(ROOT / "grpo_train.py"), "--preset", preset, "--seed", str(seed),
                           "--output-dir", str(out), "--run-name", name], cwd=ROOT, env=env, capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{preset} seed {seed} failed (exit {done.returncode}):\n"
                           f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return out / name


def doc_table(text: str) -> str:
    """The results table in TABLE_DOC's text: the HEADER line and the table lines right after it."""
    lines = text.splitlines()
    if HEADER not in lines:
        raise ValueError(f"{TABLE_DOC.relative_to(ROOT)} has no demo results table: no line equal to {HEADER!r}")
    start = lines.index(HEADER)
    end = start + 1
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return "\n".join(lines[start:end])


def replace_table(text: str, new_table: str) -> str:
    """TABLE_DOC's text with its results table replaced by `new_table` (everything else unchanged)."""
    old = doc_table(text)
    return text.replace(old, new_table, 1)


REWARD_TOLERANCE = 2 / 64
"""How far a committed reward cell may be from a fresh run's: two of the 64 held-out prompts. The demo pins every RNG,
so on this machine the cells come out identical run after run (1 or 2 threads); a CPU with other float kernels can
flip a greedy answer or two. A stale table (another preset, other code) is off by far more (e.g. after SFT 0.516
with a warm-up of 35 steps, 0.750 with 50)."""


def rewards_differ(produced: str, committed: str, tolerance: float = REWARD_TOLERANCE) -> list[str]:
    """The rows whose seed / task differ or whose reward cells differ by more than `tolerance` (empty = they match)."""
    a, b = rewards_only(produced), rewards_only(committed)
    if [r[:2] for r in a] != [r[:2] for r in b]:
        return [f"rows differ: {[r[:2] for r in a]} vs {[r[:2] for r in b]}"]
    return [f"seed {x[0]} {x[1]}: {x[2:]} vs {y[2:]}" for x, y in zip(a, b, strict=True)  # the same rows, checked above
            if len(x) != len(y) or any(abs(float(u) - float(v)) > tolerance for u, v in zip(x[2:], y[2:], strict=True))]


def rewards_only(table_text: str) -> list[list[str]]:
    """The cells of every table row without the measured columns (what must match between two runs of the same
    code)."""
    return [[c.strip() for c in line.strip("|").split("|")][:-MEASURED_COLUMNS] for line in table_text.splitlines()[2:]]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.results_table",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", nargs="+", type=Path, help="finished run folders to read instead of running")
    parser.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS), help="seeds to run (default 0 1 2)")
    parser.add_argument("--out", type=Path, default=None, help="where the runs go (default: a temporary folder)")
    parser.add_argument("--parts", action="store_true",
                        help="also print each grader's own held-out mean per phase (from evals/<phase>.jsonl)")
    parser.add_argument("--preset", default="demo", help="the preset run for each seed (default demo)")
    parser.add_argument("--write", action="store_true",
                        help="replace the demo table in docs/RESULTS.md with the new one")
    args = parser.parse_args(argv)
    if args.write and args.preset != "demo":
        parser.error("--write replaces docs/RESULTS.md's demo table; print another preset's table without it")
    try:
        if args.runs:
            dirs = args.runs
        else:
            out = args.out or Path(tempfile.mkdtemp(prefix="results_table_"))
            dirs = [run_demo(seed, out, args.preset) for seed in args.seeds]
        text = table(dirs)
    except (OSError, ValueError, KeyError, RuntimeError) as err:
        print(f"results_table: {err}", file=sys.stderr)
        return 1
    print(text)
    if args.parts:
        print("\n| seed | task | grader | before SFT | after SFT | after RL |\n|---|---|---|---|---|---|")
        print("\n".join(row for d in dirs for row in part_rows(d)))
    if args.write:
        TABLE_DOC.write_text(replace_table(TABLE_DOC.read_text(), text))
        print(f"wrote the table into {TABLE_DOC}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
