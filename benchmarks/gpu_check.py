"""The GPU check in one command: exactness, speed against TRL, a profile, the 8B LoRA case and the demo, on one card.

    python benchmarks/gpu_check.py --out DIR          # one H100 / H200: parts a-d in at most 8 minutes, no network
    python benchmarks/gpu_check.py --out DIR --parts a,b,c,d,e      # with the demo on the card (e), 9.5 minutes
    python benchmarks/gpu_check.py --cpu --out DIR    # every part on tiny shapes on the CPU, under 3 minutes

Needs trl and datasets (requirements/dev.txt) for part b's TRL run; a machine without network carries their wheels
(../shared/measure-gpu/README.md shows how). Writes DIR/gpu_check.json (every figure, part by part, written after each
part) and DIR/gpu_check.log (everything printed), and ends with the goals table: each goal of the fast-on-the-card work
(`GOALS`), its figure and pass / miss / not measured, with the card, torch and the commit ($GRPO_DUAL_COMMIT where the
checkout has no .git). A DIR that holds an earlier report is refused, never written over. Each part runs in its own
subprocess with its own time budget: a part that fails or runs out of time is recorded with its error, and the next
one runs.

a. exactness: each engine's tokens against transformers' `generate` on the same rows, fp32 then bf16, sampled and
   greedy: lean against generate with the same torch seed; graph against generate with the same per-row sampler keys
   (the seeded sampler); and the graph step (compiled on CUDA) fed generate's greedy tokens: max |Δ log-prob| of
   them against the model's whole forward. An engine passes where its fp32 rows are all identical and (graph) its
   bf16 log-probs move no more than bf16 moves the forward's own against fp32: a compiled bf16 step cannot equal
   eager bf16 kernels bit for bit, so bf16 tokens may part where two tokens are within rounding. Also what folding
   LoRA for the rollout changes: the largest |Δ log-prob| of the rollout's tokens, folded against unfolded, in bf16.
b. speed: decoding 64 rows x 128 forced tokens per engine in ms per decode step, against the memory-bandwidth floor
   (weights + the mean KV cache read per step ÷ the measured copy bandwidth), and what the graph engine did (compiles,
   captures, fallbacks); and the RL step against TRL 1.16 on the Qwen2.5-0.5B shape (vs_trl.py's cuda workload, one
   run each): the default path and the other engine, s/step, the spread of the kept cycles (max / min) on both sides,
   peak memory, TRL's s/step ÷ ours, and each side's phases (generation, grading, reference, update; on CUDA events).
c. profile: torch.profiler over one steady RL step cut to 8 decode steps (the update whole): the top ops by device
   time.
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

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("a", "b", "c", "d", "e")
DEFAULT_PARTS = ("a", "b", "c", "d")
"""What a plain run does: the goals' parts, within 8 minutes. The demo on the card (e) is asked for by name."""
BUDGET_S = {"a": 100, "b": 200, "c": 60, "d": 100, "e": 90}
"""Seconds per part on a GPU at most: 460 for the default parts (the graph engine compiles its step once per process
and settings, 30-60 s for 24 layers; inductor's on-disk cache shortens the later ones). On an H200 (2026-11-27) part a
ran past 60 s, part b past 210 s with a compile that failed at every rollout (that retry is gone), part d took 44 s
and the demo ran past 45 s."""
CPU_BUDGET_S = {"a": 30, "b": 75, "c": 20, "d": 55, "e": 30}
"""On the CPU (tiny shapes, short runs; idle 2 cores): under 3 minutes in all."""
CPU_DEMO = ["--max-steps", "2", "--sft.steps", "2", "--data.eval_size", "8"]
"""The demo cut down on the CPU: the machinery of part e, not the demo's result."""
EXACT_NEW, SPEED_NEW = 48, 128
PROMPTS = ["who forgot the keys?", "the answer is a much longer one than this, is it not?", "no",
           "which of the two was more careful with money", "keys", "tell me what the context says about the nurse",
           "yes or no", "what is 12 times 7"]
K = 8


def log(*args: Any) -> None:
    print(*args, flush=True)


# ------------------------------------------------------------------------------------------------------- helpers
def _device(cpu: bool) -> str:
    return "cpu" if cpu else "cuda"


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def copy_bandwidth(device: str) -> float:
    """Bytes per second of a device-to-device copy (read + written), the memory system's measured rate."""
    import torch

    x = torch.empty(2**28 if device == "cuda" else 2**22, dtype=torch.float32, device=device)
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    _sync(device)
    return 2 * x.numel() * 4 * 10 / (time.perf_counter() - t0)


def build_model_dir(work: Path, shape_name: str, layers: int | None = None) -> Path:
    """A random model of `shape_name` (benchmarks/common.py SHAPES; `layers` overrides its depth) saved under work."""
    from dataclasses import replace

    from benchmarks import common

    shape = common.SHAPES[shape_name]
    if layers:
        shape = replace(shape, layers=layers)
    out = work / f"model-{shape_name}-{shape.layers}"
    if not (out / "config.json").is_file():
        common.build_and_save_model(shape, out, seed=0, dtype_name="float32")
    return out


def samples():
    from grpo.core.step_types import Sample

    return [Sample("fairness", str(i), ({"role": "user", "content": p},)) for i, p in enumerate(PROMPTS)]


def rollout_ids(model, tok, engine: str, new: int, *, seed: int = 0, keys=None, greedy: bool = False,
                forced: bool = False) -> list[list[int]]:
    from grpo.config import RolloutConfig
    from grpo.phases.generate import SamplingPlan, generate_rollouts, greedy_complete

    cfg = RolloutConfig(k=K, max_new_tokens=new, min_new_tokens=new if forced else 0, engine=engine)
    stops = [tok.pad_token_id]
    if greedy:
        rollouts, _ = greedy_complete(model, tok, samples(), cfg, stops)
    else:
        rollouts, _ = generate_rollouts(model, tok, samples(), cfg, stops, plan=SamplingPlan(generator_seed=seed,
                                                                                    row_keys=keys))
    return [list(r.completion_ids) for r in rollouts]


def compare(a: list[list[int]], b: list[list[int]]) -> dict[str, Any]:
    diffs = []
    for x, y in zip(a, b):
        if x != y:
            diffs.append(next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y))))
    return {"identical_rows": len(a) - len(diffs), "rows": len(a), "first_diff_positions": sorted(diffs)[:10]}


# ------------------------------------------------------------------------------------------------------- part a
def part_a(cpu: bool, work: Path) -> dict[str, Any]:
    """Each engine's tokens against generate's, fp32 and bf16; LoRA folded against unfolded."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo.decoding.sampling import row_keys

    device = _device(cpu)
    # the Qwen2.5-0.5B widths with 2 layers: exactness does not need the depth, and the graph step compiles faster
    model_dir = build_model_dir(work, "tiny" if cpu else "qwen2.5-0.5b", layers=None if cpu else 2)
    tok = AutoTokenizer.from_pretrained(model_dir)
    out: dict[str, Any] = {"model": str(model_dir.name)}
    keys = row_keys(0, 1, range(len(PROMPTS)), K)
    for dtype in ("float32", "bfloat16"):
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype),
                                                     attn_implementation="sdpa").to(device).eval()
        res: dict[str, Any] = {}
        hf = rollout_ids(model, tok, "hf", EXACT_NEW, seed=1)
        res["lean_sampled"] = compare(rollout_ids(model, tok, "lean", EXACT_NEW, seed=1), hf)
        hf_keys = rollout_ids(model, tok, "hf", EXACT_NEW, keys=keys)
        res["graph_sampled"] = compare(rollout_ids(model, tok, "graph", EXACT_NEW, keys=keys), hf_keys)
        hf_greedy = rollout_ids(model, tok, "hf", EXACT_NEW, greedy=True)
        for engine in ("lean", "graph"):
            res[f"{engine}_greedy"] = compare(rollout_ids(model, tok, engine, EXACT_NEW, greedy=True), hf_greedy)
        res["graph_logprob_vs_forward"] = step_logprob_change(model, tok, hf_greedy, device)
        out[dtype] = res
        log(dtype, json.dumps(res))
        del model
    # the forward's own bf16 rounding: its log-probs of the same tokens in bf16 against fp32
    out["bf16_forward_vs_fp32"] = forward_precision_change(model_dir, tok, hf_greedy, device)
    fp32_same = {engine: all(out["float32"][f"{engine}_{mode}"]["identical_rows"]
                             == out["float32"][f"{engine}_{mode}"]["rows"] for mode in ("sampled", "greedy"))
                 for engine in ("lean", "graph")}
    # an engine passes where its fp32 tokens are generate's and its bf16 step moves log-probs no more than bf16
    # moves the forward's own (a compiled bf16 step cannot equal eager bf16 kernels bit for bit)
    out["passes"] = {"lean": fp32_same["lean"],
                     "graph": fp32_same["graph"] and out["bfloat16"]["graph_logprob_vs_forward"]["max_abs"]
                     <= out["bf16_forward_vs_fp32"]["max_abs"]}
    out["fold_lora_bf16"] = fold_change(model_dir, tok, device)
    log("fold", json.dumps(out["fold_lora_bf16"]))
    return out


def _prompt_rows(tok) -> list[list[int]]:
    from grpo.models.tokens import encode_prompt

    return [encode_prompt(tok, s.messages, None) for s in samples()]


def forward_logprobs(model, tok, completions: list[list[int]], device: str):
    """Log-probs (B, N) of each greedy row's completion tokens under the model's whole forward (one per prompt)."""
    import torch

    from grpo.models.tokens import left_pad

    rows = _prompt_rows(tok)
    n = min(len(c) for c in completions)
    seqs = [r + c[:n] for r, c in zip(rows, completions)]
    ids, mask = left_pad(seqs, tok.pad_token_id)
    ids, mask = ids.to(device), mask.to(device)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float()
    L = ids.shape[1]
    lp = torch.log_softmax(logits[:, L - n - 1:L - 1], -1)
    return lp.gather(-1, ids[:, L - n:, None])[..., 0]


def step_logprob_change(model, tok, completions: list[list[int]], device: str) -> dict[str, float]:
    """The graph step (compiled on CUDA) fed the same tokens: max |Δ log-prob| of them against the whole forward."""
    import torch

    from grpo.config import RolloutConfig
    from grpo.decoding import graph_decode as G
    from grpo.models.modeling import generation_mode
    from grpo.models.tokens import left_pad

    rows = _prompt_rows(tok)
    n = min(len(c) for c in completions)
    ids_BP, mask_BP = left_pad(rows, tok.pad_token_id, multiple_of=G.PROMPT_BUCKET)
    fed = torch.tensor([c[:n] for c in completions], device=device)
    sampling = G.StepSampling(RolloutConfig(), do_sample=False, stop_ids=(tok.pad_token_id,), pad_id=tok.pad_token_id)
    graph = G.GraphStep(model)
    with generation_mode(model), torch.no_grad():
        state = G.build_state(model, ids_BP.to(device), mask_BP.to(device), torch.zeros(len(rows), dtype=torch.long),
                              sampling, n + 1, graph.fold(False), None)
        forward = graph.forward if device == "cpu" else torch.compile(graph.forward, fullgraph=True)
        got = []
        for t in range(n):
            got.append(torch.log_softmax(state.logits_BV.float(), -1).gather(1, fed[:, t:t + 1])[:, 0])
            state.next_B.copy_(fed[:, t])
            forward(state)
    diff = (torch.stack(got, 1) - forward_logprobs(model, tok, completions, device)).abs()
    return {"max_abs": float(diff.max()), "mean_abs": float(diff.mean()), "tokens": int(diff.numel())}


def forward_precision_change(model_dir: Path, tok, completions: list[list[int]], device: str) -> dict[str, float]:
    import torch
    from transformers import AutoModelForCausalLM

    lps = []
    for dtype in (torch.float32, torch.bfloat16):
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa").to(device)
        lps.append(forward_logprobs(model.eval(), tok, completions, device))
    diff = (lps[0] - lps[1]).abs()
    return {"max_abs": float(diff.max()), "mean_abs": float(diff.mean())}


def fold_change(model_dir: Path, tok, device: str, new: int = 32) -> dict[str, float]:
    """LoRA r 8 on every projection (random B, as after training), bf16: the rollout's tokens sampled with the
    adapter folded, then the log-prob of each under the folded and the unfolded step: the largest |difference|."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from grpo.config import RolloutConfig
    from grpo.decoding import graph_decode as G
    from grpo.models.modeling import generation_mode
    from grpo.models.tokens import left_pad

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, attn_implementation="sdpa")
    torch.manual_seed(0)  # lora_A's initialisation: the figure is the same from run to run
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=list(G.PROJECTIONS))).to(device)
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_((torch.rand(p.shape, generator=g) - 0.5) * 0.02)
    model.eval()
    rows = _prompt_rows(tok)
    ids_BP, mask_BP = left_pad(rows, tok.pad_token_id, multiple_of=G.PROMPT_BUCKET)
    ids_BP, mask_BP = ids_BP.to(device), mask_BP.to(device)
    sampling = G.StepSampling(RolloutConfig(), do_sample=True, stop_ids=(tok.pad_token_id,), pad_id=tok.pad_token_id)
    graph = G.GraphStep(model)
    new_ids, _ = G.decode_graph(model, rows, RolloutConfig(max_new_tokens=new, fold_lora="on"), (tok.pad_token_id,),
                                tok.pad_token_id, row_keys=list(range(len(rows))), compile_step=False, capture=False,
                                graph=graph)
    tokens_BN = torch.tensor(new_ids, device=device)
    with generation_mode(model), torch.no_grad():
        logps = {}
        for fold in (True, False):
            state = G.build_state(model, ids_BP, mask_BP, torch.arange(len(rows)), sampling, new, graph.fold(fold),
                                  None)
            got = []
            for t in range(tokens_BN.shape[1]):
                lp = torch.log_softmax(state.logits_BV.float(), -1).gather(1, tokens_BN[:, t:t + 1])[:, 0]
                got.append(lp)
                state.next_B.copy_(tokens_BN[:, t])
                graph.forward(state)
            logps[fold] = torch.stack(got, 1)
    diff = (logps[True] - logps[False]).abs()
    return {"max_abs_logprob_diff": float(diff.max()), "mean_abs_logprob_diff": float(diff.mean()),
            "tokens": int(diff.numel())}


# ------------------------------------------------------------------------------------------------------- part b
def part_b(cpu: bool, work: Path) -> dict[str, Any]:
    """Decode ms/step per engine against the floor; the RL step against TRL for the default path and each engine."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from benchmarks import vs_trl

    device = _device(cpu)
    bandwidth = copy_bandwidth(device)
    out: dict[str, Any] = {"copy_bandwidth_GBps": bandwidth / 1e9}
    model_dir = build_model_dir(work, "tiny" if cpu else "qwen2.5-0.5b")
    tok = AutoTokenizer.from_pretrained(model_dir)
    dtype = torch.float32 if cpu else torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa").to(device).eval()
    new = 32 if cpu else SPEED_NEW
    n_params = sum(p.numel() for p in model.parameters())
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    prompt_len = 40
    kv_bytes = (2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * (prompt_len + new / 2)
                * len(PROMPTS) * K * dtype.itemsize)
    floor_ms = 1000 * (n_params * dtype.itemsize + kv_bytes) / bandwidth
    out["decode_floor_ms"] = floor_ms
    decode: dict[str, Any] = {}
    from grpo.decoding.graph_decode import graph_counts

    for engine in ("lean", "hf", "graph"):
        times = []
        for rep in range(3):  # the first includes the graph engine's compile and capture
            _sync(device)
            t0 = time.perf_counter()
            ids = rollout_ids(model, tok, engine, new, seed=rep, forced=True)
            _sync(device)
            times.append(time.perf_counter() - t0)
        assert all(len(r) == new for r in ids), "not forced to full length"
        best = min(times[1:])
        decode[engine] = {"times_s": times, "ms_per_step": 1000 * best / new, "x_floor": 1000 * best / new / floor_ms}
        if engine == "graph":  # what ran: compiled and captured once (three rollouts of one shape), no fallback
            decode[engine]["counts"] = graph_counts(model)
        log("decode", engine, json.dumps(decode[engine]))
    out["decode"] = decode
    del model
    # the RL step against TRL: vs_trl.py's workers, one run each, TRL once
    preset = vs_trl.PRESETS["quick" if cpu else "cuda"]
    base = dict(preset["base"], cycles=3 if cpu else 4, warmup_cycles=1)
    step_dir = build_model_dir(work, preset["shape"])
    runs: dict[str, Any] = {}
    threads = vs_trl.CPU_THREADS if cpu else None
    (work / "vs_trl").mkdir(parents=True, exist_ok=True)
    # the default path, the other engine (the default is graph on CUDA, lean on the CPU), TRL
    other = "lean" if not cpu else "graph"
    for label, engine in (("ours-default", ""), (f"ours-{other}", other), ("trl", None)):
        spec = vs_trl.scenario("grpo", dict(base, ours_engine=engine or ""))
        t0 = time.perf_counter()
        r = vs_trl.spawn_run("trl" if engine is None else "ours", spec, step_dir, work / "vs_trl", label, threads)
        keep = ("sec_per_step", "cycle_spread", "peak_rss_mib", "peak_cuda_mib", "cycle_times_s", "phases",
                "graph_counts")
        runs[label] = {k: r.get(k) for k in keep}
        runs[label]["phase_s"] = phase_medians("trl" if engine is None else "ours", r.get("phases") or {},
                                               base["warmup_cycles"])
        log(f"vs TRL: {label}: {r['sec_per_step']:.3f} s/step, spread {r.get('cycle_spread')}, phases (median s) "
            f"{json.dumps(runs[label]['phase_s'])} ({time.perf_counter() - t0:.0f} s)")
    trl = runs["trl"]["sec_per_step"]
    for label, r in runs.items():
        if label != "trl":
            r["trl_time_over_ours"] = trl / r["sec_per_step"]
            mem = "peak_rss_mib" if cpu else "peak_cuda_mib"
            if r.get(mem) and runs["trl"].get(mem):
                r["peak_memory_over_trl"] = r[mem] / runs["trl"][mem]
    out["vs_trl"] = runs
    return out


PHASE_KEYS = {
    "ours": {"generate": ("time/generate",), "grading": ("time/reward",),
             "reference": ("time/ref_logps", "time/old_logps"), "update": ("time/update",)},
    "trl": {"generate": ("generate",), "grading": ("reward",), "reference": ("no_grad_logps",), "update": ("train",)},
}
"""Each side's timed phases by common name (both on CUDA events on a GPU: grpo/run/tracking.py StepTimer and
vs_trl.py's `_instrument`): generation, grading (the reward functions), the no-grad reference / old-policy passes,
and the update (TRL's: the cycle minus its generate-and-score, so its forward, backward and optimizer step)."""


def phase_medians(side: str, phases: dict[str, list[float]], warmup: int) -> dict[str, float]:
    """Median seconds per kept cycle of each common phase, and "rest" = grading + reference + update."""
    import statistics

    out = {}
    for name, keys in PHASE_KEYS[side].items():
        per_cycle = [sum(vals) for vals in zip(*(phases.get(k, []) for k in keys))][warmup:]
        if per_cycle:
            out[name] = statistics.median(per_cycle)
    if all(k in out for k in ("grading", "reference", "update")):
        out["rest"] = out["grading"] + out["reference"] + out["update"]
    return out


# ------------------------------------------------------------------------------------------------------- part c
def part_c(cpu: bool, work: Path) -> dict[str, Any]:
    """torch.profiler over one steady RL step of 8 decode steps (the update whole)."""
    from torch.profiler import ProfilerActivity, profile

    import grpo_train
    from benchmarks import vs_trl

    preset = vs_trl.PRESETS["quick" if cpu else "cuda"]
    spec = vs_trl.scenario("grpo", dict(preset["base"], max_new_tokens=8, cycles=4, warmup_cycles=1))
    model_dir = build_model_dir(work, preset["shape"])
    run = grpo_train.setup(vs_trl._our_config(spec, str(model_dir), str(work / "profile")))
    for step in (1, 2):
        grpo_train.rl_step(run, step)
    device = run.device.type
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    _sync(device)
    with profile(activities=activities) as prof:
        metrics = grpo_train.rl_step(run, 3)
        _sync(device)
    key = "device_time_total" if device == "cuda" else "cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=60)
    log(table)
    return {"step_metrics": {k: v for k, v in metrics.items() if k.startswith("time/")}, "table": table}


# ------------------------------------------------------------------------------------------------------- part d
def part_d(cpu: bool, work: Path, budget_s: float) -> dict[str, Any]:
    """gpu_memory.py's seed case (--tiny on the CPU): s/step, decode ms per step against its floor, peak vs estimate."""
    out_dir = work / "memory"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu_memory.py"), "--steps", "2" if cpu else "3", "--out",
           str(out_dir), "--budget-s", str(int(budget_s - 5))]
    cmd += ["--tiny", "--cases", "tiny-lora"] if cpu else ["--cases", "llama8b-lora-bf16-ckpt"]
    bandwidth = copy_bandwidth(_device(cpu))
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


# ------------------------------------------------------------------------------------------------------- part e
def part_e(cpu: bool, work: Path, budget_s: float) -> dict[str, Any]:
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
def run_part(name: str, cpu: bool, work: Path, budget_s: float) -> dict[str, Any]:
    fn: Callable[..., dict[str, Any]] = {"a": part_a, "b": part_b, "c": part_c, "d": part_d, "e": part_e}[name]
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


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="gpu_check.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder for gpu_check.json and gpu_check.log")
    p.add_argument("--cpu", action="store_true", help="every part on tiny shapes on the CPU (< 3 min)")
    p.add_argument("--parts", default=",".join(DEFAULT_PARTS),
                   help=f"comma list of the parts to run, of {','.join(PARTS)} (default: {','.join(DEFAULT_PARTS)})")
    p.add_argument("--part", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--budget", type=float, default=0.0, help=argparse.SUPPRESS)
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
    if not args.out.strip():  # before anything else: Path("") is the current folder, which nobody named
        p.error(out_problem(Path("")))
    out = Path(args.out)
    import torch

    if not args.cpu and not torch.cuda.is_available():
        raise SystemExit("gpu_check.py: no CUDA GPU is visible; run it on a GPU machine, or pass --cpu")
    problem = out_problem(out)
    if problem:
        p.error(problem)
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"machine": machine(args.cpu), "cpu": args.cpu, "parts": {}}
    budgets = CPU_BUDGET_S if args.cpu else BUDGET_S
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    with open(out / "gpu_check.log", "w") as log_file:
        for name in parts:
            result_file = work / f"part-{name}.json"
            cmd = [sys.executable, str(Path(__file__).resolve()), "--out", str(out), "--part", name, "--work",
                   str(work), "--result", str(result_file), "--budget", str(budgets[name])] + (
                ["--cpu"] if args.cpu else [])
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
    report["goals"] = goals(report)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
    log(summary(report))
    return 0 if all(r["status"] == "ok" for r in report["parts"].values()) else 1


def _get(report: dict[str, Any], *path: Any) -> Any:
    """report[path...] or None where a part did not run, failed, or lacks the figure."""
    node: Any = report["parts"]
    if node.get(path[0], {}).get("status") != "ok":
        return None
    for key in path:
        if not isinstance(node, (dict, list)):
            return None
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            return None
    return node


def _case_d(report: dict[str, Any]) -> dict[str, Any] | None:
    cases = _get(report, "d", "cases") or []
    return next((c for c in cases if c.get("status") == "ok"), None)


def _rest_ratio(report: dict[str, Any]) -> float | None:
    ours, trl = (_get(report, "b", "vs_trl", label, "phase_s", "rest") for label in ("ours-default", "trl"))
    return ours / trl if ours is not None and trl else None


def _compiled_and_captured(report: dict[str, Any]) -> tuple[str, bool | None]:
    counts = _get(report, "b", "decode", "graph", "counts")
    if not counts:
        return "not measured", None
    text = ", ".join(f"{k} {v}" for k, v in counts.items())
    return text, counts.get("compiles", 0) >= 1 and counts.get("captures", 0) >= 1 and not counts.get("fallbacks")


GOALS: list[tuple[str, Callable[[dict[str, Any]], tuple[str, bool | None]]]] = [
    ("a. every engine's fp32 tokens are generate's", lambda r: ("not measured", None) if not _get(r, "a", "passes")
     else (", ".join(f"{k} {'yes' if v else 'no'}" for k, v in _get(r, "a", "passes").items()),
           all(_get(r, "a", "passes").values()))),
    ("b. the decoding step compiled and captured, no fallback", _compiled_and_captured),
    ("b. TRL's time per step over ours (default path) >= 2", lambda r: _at_least(
        _get(r, "b", "vs_trl", "ours-default", "trl_time_over_ours"), 2.0, "{:.2f}x")),
    ("b. decode <= 5x the floor (0.5B shape, graph engine)", lambda r: _at_most(
        _get(r, "b", "decode", "graph", "x_floor"), 5.0, "{:.1f}x")),
    ("b. kept cycles within 1.3x (ours, default path)", lambda r: _at_most(
        _get(r, "b", "vs_trl", "ours-default", "cycle_spread"), 1.3, "{:.2f} (TRL " + (
            f"{_get(r, 'b', 'vs_trl', 'trl', 'cycle_spread'):.2f})" if _get(r, "b", "vs_trl", "trl", "cycle_spread")
            else "n/a)"))),
    ("b. grading + reference + update <= TRL's", lambda r: _at_most(_rest_ratio(r), 1.0, "{:.2f}x TRL's")),
    ("b. peak memory <= 0.7x TRL's", lambda r: _at_most(
        _get(r, "b", "vs_trl", "ours-default", "peak_memory_over_trl"), 0.7, "{:.2f}x")),
    ("d. decode <= 3x the floor (8B LoRA shape)", lambda r: _at_most(
        (_case_d(r) or {}).get("decode_x_floor"), 3.0, "{:.1f}x")),
    ("d. 8B estimate within 10 % (never under by more than 5 %)", lambda r: _estimate_goal(_case_d(r))),
    ("e. the demo's verdict GREEN", lambda r: ("not measured", None) if _get(r, "e", "verdict") is None else (
        _get(r, "e", "verdict").split(":")[0], _get(r, "e", "verdict") == "GREEN")),
]
"""The goals a GPU session checks (the fast-on-the-card issue's list), each read from the parts' figures: (what, a
function of the report giving (the figure, pass / miss / None = not measured))."""


def _at_most(value: float | None, bound: float, fmt: str) -> tuple[str, bool | None]:
    return ("not measured", None) if value is None else (fmt.format(value), value <= bound)


def _at_least(value: float | None, bound: float, fmt: str) -> tuple[str, bool | None]:
    return ("not measured", None) if value is None else (fmt.format(value), value >= bound)


def _estimate_goal(case: dict[str, Any] | None) -> tuple[str, bool | None]:
    """The estimate against the measured peak (reserved + context, as gpu_memory.py reports): within 10 %, and an
    estimate under the truth (an out-of-memory crash on the user's card) by at most 5 %."""
    error = None if case is None else case.get("error_pct")
    if error is None:
        return "not measured", None
    return f"{error:+.1f} %", -5.0 <= error <= 10.0


def goals(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Each goal with its figure and "pass", "miss" or "not measured"."""
    out = []
    for goal, read in GOALS:
        figure, ok = read(report)
        out.append({"goal": goal, "figure": figure, "status": "not measured" if ok is None else
                    ("pass" if ok else "miss")})
    return out


def goals_table(report: dict[str, Any]) -> str:
    """The goals table: the card, torch and the commit, then one row per goal."""
    m = report["machine"]
    rows = goals(report)
    width = max(len(r["goal"]) for r in rows)
    head = (f"goals on {m['device']}, torch {m['torch']}, commit {m.get('commit')}, {m['date']}"
            + (" (the CPU: the machinery runs; the goals are the GPU's)" if report["cpu"] else ""))
    fig = max(len("figure"), *(len(r["figure"]) for r in rows))
    lines = [head, f"{'goal':<{width}}  {'figure':<{fig}}  status", "-" * (width + fig + 16)]
    lines += [f"{r['goal']:<{width}}  {r['figure']:<{fig}}  {r['status']}" for r in rows]
    return "\n".join(lines)


def summary(report: dict[str, Any]) -> str:
    """The headline figures, one line each."""
    lines = [f"gpu_check on {report['machine']['device']} ({report['machine']['date']})"]
    parts = report["parts"]
    a = parts.get("a", {})
    if a.get("status") == "ok":
        lines.append(f"a. engines that pass (generate's tokens in fp32; bf16 log-probs within bf16's own rounding): "
                     f"{a['passes']}; graph step vs forward in bf16: max |Δ log-prob| "
                     f"{a['bfloat16']['graph_logprob_vs_forward']['max_abs']:.4f} (bf16 vs fp32 forward: "
                     f"{a['bf16_forward_vs_fp32']['max_abs']:.4f}); LoRA fold in bf16: "
                     f"{a['fold_lora_bf16']['max_abs_logprob_diff']:.4f}")
    b = parts.get("b", {})
    if b.get("status") == "ok":
        lines.append("b. decode ms/step (x floor): " + ", ".join(
            f"{e} {d['ms_per_step']:.2f} ({d['x_floor']:.1f}x)" for e, d in b["decode"].items()))
        lines.append("   TRL s/step / ours: " + ", ".join(
            f"{label} {r['trl_time_over_ours']:.2f}x (spread {r['cycle_spread']:.2f})"
            for label, r in b["vs_trl"].items() if label != "trl" and r.get("cycle_spread"))
            + f"; TRL's spread {b['vs_trl']['trl'].get('cycle_spread') or float('nan'):.2f}")
        lines.append("   phases, median s per kept cycle: " + "; ".join(
            f"{label} " + ", ".join(f"{k} {v:.3f}" for k, v in r.get("phase_s", {}).items())
            for label, r in b["vs_trl"].items()))
    e = parts.get("e", {})
    if e.get("status") == "ok":
        lines.append(f"e. demo verdict: {e['verdict']}")
    lines.append("parts: " + ", ".join(f"{n} {r['status']}" for n, r in parts.items()))
    return "\n".join(lines + ["", goals_table(report)])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
