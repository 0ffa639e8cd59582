"""The GPU check in one command: exactness, speed against TRL, a profile, the 8B LoRA case and the demo, on one card.

    python -m benchmarks.gpu_check --out DIR          # one H100 / H200: parts a-d in at most 8 minutes, no network
    python -m benchmarks.gpu_check --out DIR --parts a,b,c,d,e      # with the demo on the card (e), 9.5 minutes
    python -m benchmarks.gpu_check --cpu --out DIR    # every part on tiny shapes on the CPU, under 3 minutes

Run it from the checkout's root, in the module form above (the file run by its path no longer finds the project's
modules). Needs trl and datasets (requirements/dev.txt) for part b's TRL run; a machine without network
carries their wheels (../shared/measure-gpu/README.md shows how). Writes DIR/gpu_check.json (every figure, part by part,
written after each part) and DIR/gpu_check.log (everything printed), and ends with the goals table: each goal of the
fast-on-the-card work (benchmarks/gpu_goals.py), its figure and pass / miss / not measured, with the card, torch and the
commit ($GRPO_DUAL_COMMIT where the checkout has no .git). A DIR that holds an earlier report is refused, never written
over. Each part runs in its own subprocess with its own time budget: a part that fails or runs out of time is recorded
with its error, and the next one runs.

a. exactness (benchmarks/gpu_exactness.py): each engine's tokens against transformers' `generate` on the same rows, fp32
   then bf16, sampled and greedy: lean against generate with the same torch seed; graph against generate with the same
   per-row sampler keys (the seeded sampler); and the graph step (compiled on CUDA) fed generate's greedy tokens: max |Δ
   log-prob| of them against the model's whole forward. An engine passes where its fp32 rows are all identical and
   (graph) its bf16 log-probs move no more than bf16 moves the forward's own against fp32: a compiled bf16 step cannot
   equal eager bf16 kernels bit for bit, so bf16 tokens may part where two tokens are within rounding. Also what folding
   LoRA for the rollout changes: the largest |Δ log-prob| of the rollout's tokens, folded against unfolded, in bf16.
b. speed (benchmarks/gpu_speed.py): decoding 64 rows x 128 forced tokens per engine in ms per decode step, against the
   memory-bandwidth floor (weights + the mean KV cache read per step ÷ the measured copy bandwidth), and what the graph
   engine did (compiles, captures, fallbacks); and the RL step against TRL 1.16 on the Qwen2.5-0.5B shape (vs_trl.py's
   cuda workload, one run each): the default path and the other engine, s/step, the spread of the kept cycles (max /
   min) on both sides, peak memory, TRL's s/step ÷ ours, and each side's phases (generation, grading, reference, update;
   on CUDA events).
c. profile (benchmarks/gpu_speed.py): torch.profiler over one steady RL step cut to 8 decode steps (the update whole):
   the top ops by device time.
d. the seed's shape: Llama-3-8B LoRA r 8 bf16 with checkpointing (gpu_memory.py's llama8b-lora-bf16-ckpt): s/step,
   decode ms per step against its floor, peak memory against the estimate.
e. the demo (`python grpo_train.py --seed 0`) on the card: its verdict and held-out rewards.

--cpu runs the same code on the CPU with tiny shapes and short runs (tests/test_gpu_check.py): it shows the
machinery works, not any speed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from benchmarks.gpu_exactness import exactness
from benchmarks.gpu_goals import goals, summary
from benchmarks.gpu_rollouts import copy_bandwidth, device_of, log
from benchmarks.gpu_speed import profile_step, speed

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("a", "b", "c", "d", "e")
DEFAULT_PARTS = ("a", "b", "c", "d")
"""What a plain run does: the goals' parts, within 8 minutes. The demo on the card (e) is asked for by name."""
BUDGET_S = {"a": 100, "b": 200, "c": 60, "d": 100, "e": 90}
"""Seconds per part on a GPU at most: 460 for the default parts (the graph engine compiles its step once per process
and settings; inductor's on-disk cache shortens the later compiles). What each part took on an H200, which these
budgets follow: benchmarks/RESULTS.md, "On a GPU"."""
CPU_BUDGET_S = {"a": 30, "b": 75, "c": 20, "d": 55, "e": 30}
"""On the CPU (tiny shapes, short runs; idle 2 cores): under 3 minutes in all."""
CPU_DEMO = ["--max-steps", "2", "--sft.steps", "2", "--data.eval_size", "8"]
"""The demo cut down on the CPU: the machinery of part e, not the demo's result."""


# ------------------------------------------------------------------------------- part d: the seed's shape
def seed_shape(cpu: bool, work: Path, budget_s: float) -> dict[str, Any]:
    """gpu_memory.py's seed case (--tiny on the CPU): s/step, decode ms per step against its floor, peak vs estimate."""
    out_dir = work / "memory"
    cmd = [sys.executable, "-m", "benchmarks.gpu_memory", "--steps", "2" if cpu else "3", "--out",
           str(out_dir), "--budget-s", str(int(budget_s - 5))]
    cmd += ["--tiny", "--cases", "tiny-lora"] if cpu else ["--cases", "llama8b-lora-bf16-ckpt"]
    bandwidth = copy_bandwidth(device_of(cpu))
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=budget_s)
    log(proc.stdout[-3000:], proc.stderr[-2000:])
    results = json.loads((out_dir / "results.json").read_text())
    from benchmarks.gpu_memory import NEW_TOKENS, TINY_NEW_TOKENS, derived

    new = TINY_NEW_TOKENS if cpu else NEW_TOKENS
    for r in results:
        r.update(derived(r))  # error % of the estimate against the measured peak (reserved + CUDA context)
        gen_s = (r.get("timing_s") or {}).get("time/generate")
        if gen_s and r.get("params_numel"):
            # an upper bound (the prefill and the sampling are in it) against the weights read once per step
            r["decode_ms_per_step"] = 1000 * gen_s / new
            r["decode_floor_ms"] = 1000 * r["params_numel"] * (4 if cpu else 2) / bandwidth
            r["decode_x_floor"] = r["decode_ms_per_step"] / r["decode_floor_ms"]
    return {"cases": results, "returncode": proc.returncode, "copy_bandwidth_GBps": bandwidth / 1e9}


# ------------------------------------------------------------------------------- part e: the demo on the card
def demo_on_card(cpu: bool, work: Path, budget_s: float) -> dict[str, Any]:
    """The demo on this device: its verdict and held-out rewards (on the CPU, cut to a few steps)."""
    cmd = [sys.executable, str(ROOT / "grpo_train.py"), "--seed", "0", "--output-dir", str(work / "demo"),
           "--run-name", "demo"] + (CPU_DEMO if cpu else [])
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=budget_s)
    text = proc.stdout + proc.stderr
    log(text[-2500:])
    verdict = re.search(r"^Verdict: (.+)$", text, re.M)
    report = work / "demo" / "demo" / "report.json"
    found = json.loads(report.read_text()) if report.is_file() else {}
    return {"returncode": proc.returncode, "verdict": verdict.group(1).strip() if verdict else None,
            "findings": [f.get("summary", f) if isinstance(f, dict) else f for f in found.get("findings", [])],
            "eval": found.get("eval")}


# ------------------------------------------------------------------------------------------------- orchestration
PART_RUNS: dict[str, Callable[..., dict[str, Any]]] = {"a": exactness, "b": speed, "c": profile_step,
                                                       "d": seed_shape, "e": demo_on_card}
"""Each part's function: (cpu, work) -> its figures; the parts that run a subprocess (d, e) take its budget too."""


def run_part(name: str, cpu: bool, work: Path, budget_s: float) -> dict[str, Any]:
    fn = PART_RUNS[name]
    return fn(cpu, work, budget_s) if name in ("d", "e") else fn(cpu, work)


def child(args: argparse.Namespace) -> int:
    import torch

    if args.cpu:
        torch.set_num_threads(1)
    work = Path(args.work)
    t0 = time.perf_counter()
    try:
        result = {"status": "ok", **run_part(args.part, args.cpu, work, args.budget)}
    except Exception as err:  # noqa: BLE001 - a failed part is a figure too: recorded, and the next part runs
        result = {"status": "error", "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
        log(result["traceback"])
    result["wall_s"] = time.perf_counter() - t0
    Path(args.result).write_text(json.dumps(result, indent=2, default=str))
    return 0


def commit() -> str:
    """The checkout's commit (git), else $GRPO_DUAL_COMMIT (a copy without .git, as a GPU machine gets), else
    "unknown"."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                               text=True, timeout=10).stdout.strip()
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip() + (" + uncommitted changes" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return os.environ.get("GRPO_DUAL_COMMIT", "unknown")


def machine(cpu: bool) -> dict[str, Any]:
    import platform

    import torch

    info = {"date": time.strftime("%Y-%m-%d %H:%M"), "python": platform.python_version(), "torch": torch.__version__,
            "device": "cpu" if cpu else torch.cuda.get_device_name(), "commit": commit()}
    for package in ("transformers", "trl", "peft"):
        try:
            info[package] = __import__(package).__version__
        except ImportError:
            info[package] = None
    return info


def out_problem(out: Path) -> str | None:
    """Why --out cannot take this report (None = it can): an empty name (Path("") is the current folder, which the
    user did not name), a file, a folder holding an earlier report (never written over), or one this process cannot
    create or write in."""
    if not str(out).strip() or str(out) == ".":
        return "--out is empty; name the folder for the report (it will hold gpu_check.json, gpu_check.log and work/)"
    if out.exists() and not out.is_dir():
        return f"--out {out} is a file; give a folder (it will hold gpu_check.json, gpu_check.log and work/)"
    for name in ("gpu_check.json", "gpu_check.log"):
        if (out / name).exists():
            return (f"--out {out} holds an earlier report ({name}); give a new folder, e.g. --out "
                    f"{out.parent / (out.name + '-2')}, so that it is kept")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".gpu_check_write_test"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        return f"--out {out}: cannot write there ({err.strerror or err})"
    return None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder for gpu_check.json and gpu_check.log")
    p.add_argument("--cpu", action="store_true", help="every part on tiny shapes on the CPU (< 3 min)")
    p.add_argument("--parts", default=",".join(DEFAULT_PARTS),
                   help=f"comma list of the parts to run, of {','.join(PARTS)} (default: {','.join(DEFAULT_PARTS)})")
    p.add_argument("--part", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--budget", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--budget-scale", type=float, default=1.0,
                   help="multiply every part's time budget (a shared or busy machine; the test suite uses 10)")
    return p


def run_in_turn(parts: list[str], out: Path, cpu: bool, budget_scale: float = 1.0) -> dict[str, Any]:
    """Each part in its own subprocess under its budget, the report rewritten after each; a part that fails or runs
    out of time is recorded with its error, and the next one runs."""
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"machine": machine(cpu), "cpu": cpu, "parts": {}}
    budgets = {name: s * budget_scale for name, s in (CPU_BUDGET_S if cpu else BUDGET_S).items()}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    with open(out / "gpu_check.log", "w") as log_file:
        for name in parts:
            result_file = work / f"part-{name}.json"
            cmd = [sys.executable, "-m", "benchmarks.gpu_check", "--out", str(out), "--part", name, "--work",
                   str(work), "--result", str(result_file), "--budget", str(budgets[name]), *(["--cpu"] if cpu else [])]
            log(f"=== part {name} (up to {budgets[name]} s)")
            log_file.write(f"=== part {name}\n")
            log_file.flush()
            t0 = time.perf_counter()
            try:
                subprocess.run(cmd, cwd=ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT,
                               timeout=budgets[name])
                result = json.loads(result_file.read_text()) if result_file.is_file() else {
                    "status": "error", "error": "the part wrote no result (see gpu_check.log)"}
            except subprocess.TimeoutExpired:
                result = {"status": "timeout", "error": f"ran past its budget of {budgets[name]} s"}
            result["wall_s"] = time.perf_counter() - t0
            report["parts"][name] = result
            (out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
            log(f"=== part {name}: {result['status']} in {result['wall_s']:.0f} s"
                + (f": {result.get('error')}" if result["status"] != "ok" else ""))
    return report


def main(argv: list[str]) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.part:
        return child(args)
    parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise SystemExit(f"--parts: unknown part(s) {unknown}; use some of {', '.join(PARTS)}")
    if not parts:  # else nothing runs and the exit status says all passed
        p.error(f"--parts {args.parts!r} names no part; use some of {', '.join(PARTS)}, e.g. --parts "
                f"{','.join(DEFAULT_PARTS)}")
    if not args.budget_scale > 0:  # also NaN: every part would time out at once
        p.error(f"--budget-scale {args.budget_scale}: give a number above 0 (1 = the budgets as written)")
    if not args.out.strip():  # before anything else: Path("") is the current folder, which nobody named
        p.error(out_problem(Path("")))
    out = Path(args.out)
    import torch

    if not args.cpu and not torch.cuda.is_available():
        raise SystemExit("python -m benchmarks.gpu_check: no CUDA GPU is visible; run it on a GPU machine, or pass "
                         "--cpu")
    problem = out_problem(out)
    if problem:
        p.error(problem)
    report = run_in_turn(parts, out, args.cpu, args.budget_scale)
    report["goals"] = goals(report)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
    log(summary(report))
    return 0 if all(r["status"] == "ok" for r in report["parts"].values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
