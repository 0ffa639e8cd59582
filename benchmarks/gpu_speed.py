"""Parts b and c of the GPU check (benchmarks/gpu_check.py): decoding speed per engine against the memory-bandwidth
floor, the RL step against TRL (the default path, the other engine, TRL; each side's phases), and a profile of one
steady RL step."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from benchmarks.gpu_rollouts import PROMPTS, K, build_model_dir, copy_bandwidth, device_of, log, rollout_ids, sync

SPEED_NEW = 128
"""New tokens per row, forced, in the decode timing on a GPU (32 on the CPU)."""


def speed(cpu: bool, work: Path) -> dict[str, Any]:
    """Part b: decode ms/step per engine against the floor; the RL step against TRL for the default path and the
    other engine."""
    return {**decode_speed(cpu, work), "vs_trl": against_trl(cpu, work)}


def decode_speed(cpu: bool, work: Path) -> dict[str, Any]:
    """Decode ms per step of each engine (the best of the 2nd and 3rd rollouts, forced to full length) against the
    memory-bandwidth floor: the weights and the mean KV cache read once per step at the measured copy bandwidth."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo.decoding.graph_decode import graph_counts

    device = device_of(cpu)
    bandwidth = copy_bandwidth(device)
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
    decode: dict[str, Any] = {}
    for engine in ("lean", "hf", "graph"):
        times = []
        for rep in range(3):  # the first includes the graph engine's compile and capture
            sync(device)
            t0 = time.perf_counter()
            ids = rollout_ids(model, tok, engine, new, seed=rep, forced=True)
            sync(device)
            times.append(time.perf_counter() - t0)
        assert all(len(r) == new for r in ids), "not forced to full length"
        best = min(times[1:])
        decode[engine] = {"times_s": times, "ms_per_step": 1000 * best / new, "x_floor": 1000 * best / new / floor_ms}
        if engine == "graph":  # what ran: compiled and captured once (three rollouts of one shape), no fallback
            decode[engine]["counts"] = graph_counts(model)
        log("decode", engine, json.dumps(decode[engine]))
    return {"copy_bandwidth_GBps": bandwidth / 1e9, "decode_floor_ms": floor_ms, "decode": decode}


def against_trl(cpu: bool, work: Path) -> dict[str, Any]:
    """The RL step against TRL: vs_trl.py's workers, one run each of the default path, the other engine (the default
    is graph on CUDA, lean on the CPU) and TRL: s/step, the spread of the kept cycles, peak memory, each side's
    phases, and TRL's time and memory over ours."""
    from benchmarks import vs_trl

    preset = vs_trl.PRESETS["quick" if cpu else "cuda"]
    base = dict(preset["base"], cycles=3 if cpu else 4, warmup_cycles=1)
    step_dir = build_model_dir(work, preset["shape"])
    runs: dict[str, Any] = {}
    threads = vs_trl.CPU_THREADS if cpu else None
    (work / "vs_trl").mkdir(parents=True, exist_ok=True)
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
    return runs


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
        # a phase a side did not time (an empty list) leaves its sum out, so strict=False
        per_cycle = [sum(vals) for vals in zip(*(phases.get(k, []) for k in keys), strict=False)][warmup:]
        if per_cycle:
            out[name] = statistics.median(per_cycle)
    if all(k in out for k in ("grading", "reference", "update")):
        out["rest"] = out["grading"] + out["reference"] + out["update"]
    return out


def profile_step(cpu: bool, work: Path) -> dict[str, Any]:
    """Part c: torch.profiler over one steady RL step of 8 decode steps (the update whole)."""
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
    sync(device)
    with profile(activities=activities) as prof:
        metrics = grpo_train.rl_step(run, 3)
        sync(device)
    key = "device_time_total" if device == "cuda" else "cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=60)
    log(table)
    return {"step_metrics": {k: v for k, v in metrics.items() if k.startswith("time/")}, "table": table}
