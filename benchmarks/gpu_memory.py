"""Measure real RL steps of the seed config on a GPU and compare them with the memory estimator
(grpo/machine/memory_estimate.py).

    python -m benchmarks.gpu_memory --out $OUT                      # the default GPU cases
    python -m benchmarks.gpu_memory --cases llama8b-lora-bf16 --steps 4 --out /tmp/mem
    python -m benchmarks.gpu_memory --tiny --out /tmp/mem           # the same machinery on CPU with a tiny shape

Each case is the preset `llama3-8b-dual` with `model.name=random:<shape>` (random weights of the real shape, built on
the GPU, no download: memory does not depend on weight values), demo prompts padded by a system prompt to ~300 tokens,
no SFT, LoRA r 8, 2 prompts × K 4 per micro-step, grad_accum 2, 96 new tokens forced (min_new_tokens = max). It runs
`grpo_train.setup(cfg)` then `grpo_train.rl_step(run, s)` for `--steps` steps — the trainer's own code path; the
generate / log-prob / update functions that rl_step calls are wrapped only to read the allocator's peak per phase.
Every case runs in its own subprocess (peaks never mix, an OOM or a hang costs one case) with a timeout.

Measured (all GiB = 2^30 B, max over the steps after `--warmup`):
- peak allocated / reserved = torch.cuda.max_memory_allocated / max_memory_reserved, reset at every phase boundary
- CUDA context = (total − free from cudaMemGetInfo) − torch reserved, read after the steps (nothing else on the GPU)
- error %      = 100 · (estimate.peak − (peak reserved + context)) / (peak reserved + context)
                 (the estimate counts the context and a fragmentation slack, as reserved + context does)
- alloc err %  = 100 · (estimate.peak − slack − (peak allocated + context)) / (peak allocated + context)
Writes results.json, results.md and run.log under --out (3 files).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30
SEED_PRESET = "llama3-8b-dual"
PROMPT_FILLER = ("You are a careful assistant. Read the context and the question, think about who is named and what "
                 "is known, and answer with the option the context supports. ")
"""One copy is ~87 tiny-tokenizer tokens; 3 copies + a demo prompt (34-39) give P ≈ 300, a BBQ/HaluEval-like length."""
GPU_FILLER_COPIES, TINY_FILLER_COPIES = 3, 1
NEW_TOKENS, TINY_NEW_TOKENS = 96, 16
DEMO_SIZE = 100
"""Demo prompts per task: plenty for a few steps, and the tiny tokenizer trains on them in well under a second."""
DEFAULT_BUDGET_S = 540
"""All cases together stop here: the device tool allows 600 s per command."""
MIN_CASE_S = 45
"""A case with less time left than this is skipped (8B import + init alone take ~20 s)."""
TINY_SHAPE = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 1024, "tie_word_embeddings": False}
"""Vocab 1024 > the tiny tokenizer's ~500 tokens, as real shapes exceed it: sampled ids past the tokenizer decode
fine."""
TINY_MODEL = "<tiny>"
"""Placeholder in a case's model: the child replaces it by random:<folder holding TINY_SHAPE as config.json>."""
COLUMNS = ["case", "measured peak allocated GiB", "reserved GiB", "estimated GiB", "error %", "s/step", "gen s",
           "train s", "notes"]


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    overrides: tuple[str, ...]
    needs_bnb: bool = False
    timeout_s: int = 240


LLAMA8B, QWEN05B = "random:meta-llama/Meta-Llama-3-8B-Instruct", "random:Qwen/Qwen2.5-0.5B-Instruct"
NO_CKPT, CKPT = "model.gradient_checkpointing=false", "model.gradient_checkpointing=true"
GPU_CASES = {c.name: c for c in [
    Case("qwen0.5b-lora-bf16", QWEN05B, ("model.lora=true", NO_CKPT), timeout_s=150),
    Case("qwen0.5b-full-bf16", QWEN05B, ("model.lora=false", NO_CKPT), timeout_s=150),
    Case("llama8b-lora-bf16", LLAMA8B, ("model.lora=true", NO_CKPT)),
    Case("llama8b-lora-bf16-ckpt", LLAMA8B, ("model.lora=true", CKPT)),
    # the seed config's checkpointing stays on under QLoRA; the random bf16 weights go through a 16 GB file once
    Case("llama8b-qlora", LLAMA8B, ("model.lora=true", "model.load_in_4bit=true", CKPT), needs_bnb=True,
         timeout_s=360),
]}
TINY_CASES = {c.name: c for c in [
    Case("tiny-lora", TINY_MODEL, ("model.lora=true", NO_CKPT), timeout_s=120),
    Case("tiny-full", TINY_MODEL, ("model.lora=false", NO_CKPT), timeout_s=120),
]}


def case_overrides(case: Case, tiny: bool, work: Path, steps: int) -> list[str]:
    """The seed preset's overrides for `case` (see the module docstring)."""
    from grpo.data.demo_tasks import DEMO_REWARDS

    model = f"random:{work / 'tiny_shape'}" if case.model == TINY_MODEL else case.model
    new = TINY_NEW_TOKENS if tiny else NEW_TOKENS
    out = [f"model.name={model}", "model.dtype=" + ("float32" if tiny else "bfloat16"), "model.lora_r=8",
           "data.source=demo", f"data.demo_size={DEMO_SIZE}",
           "data.system_prompt=" + PROMPT_FILLER * (TINY_FILLER_COPIES if tiny else GPU_FILLER_COPIES),
           "sft.steps=0", "rollout.k=4", "train.prompts_per_micro_step=2", "train.grad_accum=2",
           f"rollout.max_new_tokens={new}", f"rollout.min_new_tokens={new}", f"train.max_steps={steps}",
           "train.tensorboard=false", "train.sample_every=0", "train.eval_every=0",
           f"train.output_dir={work / 'runs'}", f"train.run_name={case.name}"]
    out += [f"rewards.{task}={spec}" for task, spec in DEMO_REWARDS.items()]  # demo tasks, demo graders
    return out + (["train.device=cpu"] if tiny else []) + list(case.overrides)


# ------------------------------------------------------------------------------------------------ child process
class PhaseMeter:
    """Peak allocator memory per phase: the peak counter is read and reset at every phase boundary."""

    PHASES = {"generate_rollouts": "generation", "batch_logprobs": "ref/old pass", "update_passes": "training"}

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.peaks: dict[str, dict[str, float]] = {}
        self.prompt_lens: list[int] = []
        self.completion_lens: list[int] = []

    def mark(self, phase: str) -> None:
        """Attribute the peak since the last mark to `phase`, then reset the counter."""
        import torch

        if not self.cuda:
            return
        torch.cuda.synchronize()
        now = {"allocated": torch.cuda.max_memory_allocated() / GIB, "reserved": torch.cuda.max_memory_reserved() / GIB}
        old = self.peaks.setdefault(phase, {"allocated": 0.0, "reserved": 0.0})
        self.peaks[phase] = {k: max(old[k], v) for k, v in now.items()}
        torch.cuda.reset_peak_memory_stats()

    @contextlib.contextmanager
    def installed(self, module: Any):
        """Wrap the phase functions that `module` (grpo/run/step_owners.py, the step's owners) calls by global name;
        restore them on exit."""
        originals = {name: getattr(module, name) for name in self.PHASES}

        def wrap(name: str, fn: Any) -> Any:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                self.mark("other")
                out = fn(*args, **kwargs)
                self.mark(self.PHASES[name])
                if name == "generate_rollouts":
                    self.prompt_lens += [len(r.prompt_ids) for r in out[0]]
                    self.completion_lens += [len(r.completion_ids) for r in out[0]]
                return out
            return wrapper

        for name, fn in originals.items():
            setattr(module, name, wrap(name, fn))
        try:
            yield self
        finally:
            for name, fn in originals.items():
                setattr(module, name, fn)

    def reset(self) -> None:
        """Start a measured window (after the warm-up steps)."""
        self.mark("warm-up")
        self.peaks.clear()
        self.prompt_lens.clear()
        self.completion_lens.clear()


def estimate_for(cfg: Any, prompt_len: int, cc: tuple[int, int]) -> dict[str, Any]:
    """The estimator's prediction for `cfg` at the measured prompt length (random:<shape> → the shape's name)."""
    from grpo.machine.memory_estimate import estimate, format_table
    from grpo.run.assembly.memory_inputs import inputs_from_config

    shape_cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, name=cfg.model.name[len("random:"):]))
    x = dataclasses.replace(inputs_from_config(shape_cfg, cc), prompt_len=prompt_len)
    est = estimate(x)
    slack = {p: sum(v for k, v in parts.items() if k.startswith("allocator slack")) for p, parts in est.phases.items()}
    return {"peak_gib": est.peak_bytes / GIB, "peak_phase": est.peak_phase,
            "peak_without_slack_gib": (est.peak_bytes - slack[est.peak_phase]) / GIB,
            "phases_gib": {p: est.total(p) / GIB for p in est.phases},
            "phases_without_slack_gib": {p: (est.total(p) - slack[p]) / GIB for p in est.phases},
            "persistent_gib": {k: v / GIB for k, v in est.persistent.items()}, "params": est.params,
            "table": format_table(est),
            "inputs": {k: v for k, v in dataclasses.asdict(x).items() if k != "shape"} | {"shape": x.shape.name}}


def run_child(case: Case, tiny: bool, work: Path, steps: int, warmup: int) -> dict[str, Any]:
    """Set up the run and time `steps` RL steps; everything measured goes into the returned dict."""
    import torch

    import grpo.run.step_owners as step_owners
    import grpo_train as T
    from grpo import config as C

    if not tiny and not torch.cuda.is_available():
        raise RuntimeError("the GPU cases need a CUDA GPU and none is visible; on a CPU machine run --tiny")
    cfg = C.load_config(SEED_PRESET, case_overrides(case, tiny, work, steps))
    cuda = cfg.train.device != "cpu" and torch.cuda.is_available()
    result: dict[str, Any] = {"case": case.name, "model": cfg.model.name, "status": "running", "steps": steps,
                              "warmup": warmup, "gpu": torch.cuda.get_device_name(0) if cuda else "cpu",
                              "torch": torch.__version__}
    t0 = time.perf_counter()
    run = T.setup(cfg)
    result["setup_s"] = time.perf_counter() - t0
    params = list(run.policy.model.parameters())
    result["params_numel"] = sum(p.numel() for p in params)  # 4-bit weights count packed (2 per byte element)
    result["trainable_numel"] = sum(p.numel() for p in run.policy.trainable_parameters())
    meter, times = PhaseMeter(cuda), []
    print(f"setup done in {result['setup_s']:.1f} s; stepping", flush=True)
    try:
        with meter.installed(step_owners):
            for step in range(1, steps + 1):
                if step == warmup + 1:
                    meter.reset()
                    result["allocated_at_window_start_gib"] = torch.cuda.memory_allocated() / GIB if cuda else None
                metrics = T.rl_step(run, step)
                meter.mark("other")
                if step > warmup:
                    times.append({k: v for k, v in metrics.items() if k.startswith("time/")})
                # grpo_train retries an OOM update with half the micro-batch: that step measured another config
                result["oom_retries"] = result.get("oom_retries", 0) + int(metrics.get("health/oom_retries", 0))
                print(f"step {step}: {metrics['time/step']:.2f} s", flush=True)
        result["status"] = "ok"
    except torch.OutOfMemoryError as err:  # the peak reached before the OOM is still worth reporting
        result["status"], result["error"] = "oom", str(err).splitlines()[0]
        meter.mark("oom")
    result["timing_s"] = {k: sum(t[k] for t in times) / len(times) for k in times[0]} if times else {}
    result["prompt_len"] = max(meter.prompt_lens, default=0)
    result["completion_len_mean"] = (sum(meter.completion_lens) / len(meter.completion_lens)
                                     if meter.completion_lens else 0.0)
    if cuda:
        free, total = torch.cuda.mem_get_info()
        result["cuda_context_gib"] = (total - free - torch.cuda.memory_reserved()) / GIB
        result["gpu_total_gib"] = total / GIB
        result["phase_peaks_gib"] = meter.peaks
        result["peak_allocated_gib"] = max(p["allocated"] for p in meter.peaks.values())
        result["peak_reserved_gib"] = max(p["reserved"] for p in meter.peaks.values())
    cc = tuple(torch.cuda.get_device_capability(0)) if cuda else (8, 0)
    result["estimate"] = estimate_for(cfg, result["prompt_len"] or cfg.data.max_prompt_tokens, cc)
    return result


def child_main(args: argparse.Namespace) -> int:
    table = TINY_CASES if args.tiny else GPU_CASES
    try:
        result = run_child(table[args.child], args.tiny, Path(args.work), args.steps, args.warmup)
    except Exception as err:  # noqa: BLE001 — any failure of a case is reported in its row, never lost
        result = {"case": args.child, "status": "error", "error": f"{type(err).__name__}: {err}",
                  "traceback": traceback.format_exc()[-3000:]}
        print(result["traceback"], file=sys.stderr, flush=True)
    Path(args.result).write_text(json.dumps(result, indent=2, default=str))
    return 0 if result["status"] in ("ok", "oom") else 1


# ----------------------------------------------------------------------------------------------- parent process
def derived(r: dict[str, Any]) -> dict[str, float | None]:
    """error % and alloc err % of one case (module docstring); None where a number is missing (CPU, failure)."""
    est, ctx = r.get("estimate") or {}, r.get("cuda_context_gib")
    out: dict[str, float | None] = {"error_pct": None, "alloc_error_pct": None}
    if est and ctx is not None and r.get("peak_reserved_gib"):
        measured = r["peak_reserved_gib"] + ctx
        out["error_pct"] = 100 * (est["peak_gib"] - measured) / measured
        measured_alloc = r["peak_allocated_gib"] + ctx
        out["alloc_error_pct"] = 100 * (est["peak_without_slack_gib"] - measured_alloc) / measured_alloc
    return out


def _num(v: Any, fmt: str = ".2f") -> str:
    return "n/a" if v is None else format(v, fmt)


def format_markdown(results: list[dict[str, Any]]) -> str:
    """The summary table (COLUMNS) and, for GPU cases, the per-phase measured vs estimated table."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in results:
        t, d = r.get("timing_s") or {}, derived(r)
        notes = r["status"] if r["status"] == "ok" else f"{r['status']}: {r.get('error', '')}"[:160]
        if r.get("oom_retries"):
            notes += f"; {r['oom_retries']} OOM retries with half micro-batch (peak not of this config)"
        if r.get("prompt_len"):
            notes += f"; P={r['prompt_len']}, T={r.get('completion_len_mean', 0):.0f}"
        if r.get("cuda_context_gib") is not None:
            notes += f"; ctx {r['cuda_context_gib']:.2f} GiB; alloc err {_num(d['alloc_error_pct'], '+.1f')}%"
        est = (r.get("estimate") or {}).get("peak_gib")
        lines.append("| " + " | ".join([r["case"], _num(r.get("peak_allocated_gib")), _num(r.get("peak_reserved_gib")),
                                        _num(est), _num(d["error_pct"], "+.1f"), _num(t.get("time/step")),
                                        _num(t.get("time/generate")), _num(t.get("time/update")), notes]) + " |")
    phase_rows = [(r["case"], p, v, (r.get("estimate") or {}).get("phases_without_slack_gib", {}).get(p),
                   r.get("cuda_context_gib") or 0.0)
                  for r in results for p, v in (r.get("phase_peaks_gib") or {}).items() if p not in ("other",)]
    if phase_rows:
        lines += ["", "Per phase: measured peak allocated + CUDA context vs the estimate without its slack (GiB)", "",
                  "| case | phase | allocated | allocated + context | estimate − slack |", "|---|---|---|---|---|"]
        lines += [f"| {c} | {p} | {v['allocated']:.2f} | {v['allocated'] + ctx:.2f} | {_num(e)} |"
                  for c, p, v, e, ctx in phase_rows]
    return "\n".join(lines)


def run_case(case: Case, args: argparse.Namespace, work: Path, timeout_s: float, log: Any) -> dict[str, Any]:
    """Run one case in its own process group; stream its output with a [case] prefix; kill it at the timeout."""
    result_path = work / f"{case.name}.json"
    cmd = [sys.executable, "-m", "benchmarks.gpu_memory", "--child", case.name, "--result", str(result_path),
           "--work", str(work), "--steps", str(args.steps), "--warmup", str(args.warmup),
           *(["--tiny"] if args.tiny else [])]
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
    tail: collections.deque[str] = collections.deque(maxlen=30)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)

    def pump() -> None:
        for line in proc.stdout:
            tail.append(line.rstrip())
            log.write(f"[{case.name}] {line}")
            print(f"[{case.name}] {line}", end="", flush=True)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # our own child's process group
        proc.wait()
        rc = None
    reader.join(timeout=10)
    if result_path.is_file():
        return json.loads(result_path.read_text())
    why = f"timed out after {timeout_s:.0f} s" if rc is None else f"exited with code {rc} and wrote no result"
    return {"case": case.name, "status": "timeout" if rc is None else "crashed", "error": why,
            "log_tail": "\n".join(tail)}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_memory",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="", help="comma-separated case names (default: all of the mode)")
    parser.add_argument("--tiny", action="store_true", help="CPU mode: tiny random shape, 16 new tokens")
    parser.add_argument("--steps", type=int, default=3, help="RL steps per case (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="steps left out of the timings and peaks (default 1)")
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S, help="wall-clock budget for all cases")
    parser.add_argument("--out", default="gpu_memory_out", help="folder for results.json, results.md, run.log")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--result", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--work", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not 0 <= args.warmup < args.steps:
        parser.error(f"--warmup {args.warmup} must be >= 0 and below --steps {args.steps}: one step must be measured")
    table = TINY_CASES if args.tiny else GPU_CASES
    names = [c.strip() for c in args.cases.split(",") if c.strip()] or list(table)
    unknown = [n for n in names if n not in table]
    if unknown:
        parser.error(f"unknown case(s) {unknown} for {'--tiny' if args.tiny else 'GPU'} mode; choose from "
                     f"{list(table)}")
    args.case_names = names
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpu_memory-"))
    (work / "tiny_shape").mkdir()
    (work / "tiny_shape" / "config.json").write_text(json.dumps(TINY_SHAPE))
    table, results = TINY_CASES if args.tiny else GPU_CASES, []
    deadline = time.monotonic() + args.budget_s
    with open(out / "run.log", "w") as log:
        for name in args.case_names:
            case, left = table[name], deadline - time.monotonic()
            if case.needs_bnb and importlib.util.find_spec("bitsandbytes") is None:
                results.append({"case": name, "status": "skipped",
                                "error": "bitsandbytes is not importable (carry its wheel: see this script's report)"})
            elif left < MIN_CASE_S:
                results.append({"case": name, "status": "skipped", "error": f"budget spent ({left:.0f} s left)"})
            else:
                print(f"=== {name}: up to {min(case.timeout_s, left):.0f} s", flush=True)
                t0 = time.monotonic()
                results.append(run_case(case, args, work, min(case.timeout_s, left), log))
                results[-1]["wall_s"] = time.monotonic() - t0
            results[-1].update(derived(results[-1]))
            print(f"=== {name}: {results[-1]['status']}", flush=True)
    table_md = format_markdown(results)
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    (out / "results.md").write_text(table_md + "\n")
    print("\n" + table_md, flush=True)
    return 0 if all(r["status"] in ("ok", "skipped") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
