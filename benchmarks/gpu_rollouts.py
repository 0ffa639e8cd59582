"""What the GPU check's parts share (benchmarks/gpu_check.py): the prompts, a random model of a named shape, the
engines' rollouts of those prompts, a comparison of two rollouts token by token, and the device's copy bandwidth."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

PROMPTS = ["who forgot the keys?", "the answer is a much longer one than this, is it not?", "no",
           "which of the two was more careful with money", "keys", "tell me what the context says about the nurse",
           "yes or no", "what is 12 times 7"]
"""The prompts every part decodes: short and long, questions and not."""
K = 8
"""Completions per prompt: 8 prompts × K 8 = 64 rows a rollout."""


def log(*args: Any) -> None:
    print(*args, flush=True)


def device_of(cpu: bool) -> str:
    return "cpu" if cpu else "cuda"


def sync(device: str) -> None:
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
    sync(device)
    t0 = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    sync(device)
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
    for x, y in zip(a, b, strict=True):
        if x != y:  # rows of two lengths part where the shorter one ends
            diffs.append(next((i for i, (u, v) in enumerate(zip(x, y, strict=False)) if u != v), min(len(x), len(y))))
    return {"identical_rows": len(a) - len(diffs), "rows": len(a), "first_diff_positions": sorted(diffs)[:10]}
