"""Shared pieces of the benchmarks: model shapes, saving one model every trainer loads, peak-memory
probes, the median / min–max summary and table, and reading kept run records (plain or gzipped).

    steady-state s/step = Σ cycle_time[w:] / (len(cycle_time[w:]) · μ)   (w warm-up cycles dropped; μ optimizer
                                                                         steps per rollout cycle)
    completions/s       = len(cycle_time[w:]) · completions_per_cycle / Σ cycle_time[w:]
    ratio               = median(ours) / median(TRL);  speed-up = median s/step of TRL / median s/step of ours

Nothing runs at import.
"""

from __future__ import annotations

import argparse
import gzip
import resource
import statistics
import sys
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any, Sequence

KIB_PER_MIB = 1024
"""`ru_maxrss` is in KiB on Linux (bytes on macOS, handled in `peak_rss_mib`)."""
BYTES_PER_MIB = 1024 * 1024


@dataclass(frozen=True)
class Shape:
    """Size of the randomly initialised benchmark model (a Llama or Qwen2 config)."""

    arch: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int | None
    """None = the builtin tokenizer's vocabulary; a number larger than it pads the embedding (e.g. Qwen's 151936)."""
    tied: bool = False
    max_positions: int = 2048


SHAPES: dict[str, Shape] = {
    # --quick: seconds per step on 2 CPU cores.
    "tiny": Shape(arch="llama", hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=None),
    # default CPU run: big enough that the model, not Python, dominates a step.
    "small": Shape(arch="llama", hidden=256, layers=4, heads=8, kv_heads=4, intermediate=688, vocab=None),
    # the GPU run: Qwen2.5-0.5B's published config.json sizes, random weights, tied embeddings.
    "qwen2.5-0.5b": Shape(arch="qwen2", hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864,
                          vocab=151936, tied=True, max_positions=32768),
}


def step_shape_flags(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The flags of a timed RL step's shape that the real-model benchmarks share: repeats, prompts, K and prompt
    tokens (real_model_parts.py, real_model_settings.py)."""
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=60)
    return parser


def build_and_save_model(shape: Shape, out_dir: Path, seed: int, dtype_name: str) -> dict[str, Any]:
    """Builtin tokenizer (trained on the demo corpus) + a random model of `shape`, saved to `out_dir`.

    Both trainers load this folder, so they start from identical weights. Token ids beyond the tokenizer's
    vocabulary (when shape.vocab is larger) decode to nothing with the fast tokenizer: harmless, since generation
    is forced to full length and the rule rewards only read the decoded text.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from grpo.data.demo_tasks import demo_corpus
    from grpo.models.modeling import DTYPES, build_tiny_tokenizer, tiny_model_config

    tokenizer = build_tiny_tokenizer(demo_corpus(), vocab_size=384)
    vocab = max(shape.vocab or 0, len(tokenizer))
    config = tiny_model_config(vocab, hidden=shape.hidden, layers=shape.layers, heads=shape.heads,
                               kv_heads=shape.kv_heads, intermediate=shape.intermediate,
                               max_positions=shape.max_positions, arch=shape.arch)
    config.tie_word_embeddings = shape.tied
    config.pad_token_id, config.bos_token_id, config.eos_token_id = (
        tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=DTYPES[dtype_name])
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    return {"parameters": sum(p.numel() for p in model.parameters()), "model_vocab": vocab,
            "tokenizer_vocab": len(tokenizer)}


def machine_info(threads: int | None, packages: Sequence[str]) -> dict[str, Any]:
    """Where the numbers were taken: platform, CPU count, threads per run, GPU name, package versions."""
    import importlib
    import os
    import platform

    import torch

    info: dict[str, Any] = {"platform": platform.platform(), "cpu_count": os.cpu_count(), "threads": threads,
                            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                            "python": platform.python_version()}
    info.update({p: importlib.import_module(p).__version__ for p in packages})
    return info


def peak_rss_mib() -> float:
    """Peak resident memory of THIS process so far (each run is its own subprocess, so peaks never mix).

    Linux: VmHWM of /proc/self/status, the high-water mark of this process's own address space. Not `ru_maxrss`:
    Linux carries ru_maxrss over `execve`, so a child would report at least its parent's peak.
    """
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / KIB_PER_MIB  # "VmHWM:   123456 kB"
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / BYTES_PER_MIB if sys.platform == "darwin" else peak / KIB_PER_MIB


def peak_cuda_mib() -> float | None:
    """Peak CUDA memory allocated by torch in this process, or None without CUDA."""
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return torch.cuda.max_memory_allocated() / BYTES_PER_MIB


def steady_state(cycle_times_s: Sequence[float], warmup_cycles: int, mu: int,
                 completions_per_cycle: int) -> tuple[float, float]:
    """(seconds per optimizer step, completions per second) over the cycles after the warm-up ones."""
    kept = list(cycle_times_s)[warmup_cycles:]
    if not kept:
        raise ValueError(f"steady_state: {len(cycle_times_s)} cycles measured and {warmup_cycles} are warm-up; "
                         "run more cycles (--cycles) or fewer warm-up cycles (--warmup)")
    total = sum(kept)
    return total / (len(kept) * mu), len(kept) * completions_per_cycle / total


def cycle_deltas(marks: Sequence[tuple[float, float]], mu: int) -> tuple[list[float], list[float]]:
    """(wall, CPU) seconds per rollout cycle from (wall, CPU) clock marks taken at the start and after every optimizer
    step; a cycle is `mu` optimizer steps."""
    kept = list(marks)[::mu]
    return [b[0] - a[0] for a, b in pairwise(kept)], [b[1] - a[1] for a, b in pairwise(kept)]


def bucket_events(events: Sequence[tuple[str, float, float]], bounds: Sequence[float],
                  names: Sequence[str]) -> dict[str, list[float]]:
    """Sum (name, start, duration) events into the cycles delimited by `bounds` (len(bounds) − 1 cycles)."""
    out = {n: [0.0] * (len(bounds) - 1) for n in names}
    for name, start, duration in events:
        idx = next((i for i, b in enumerate(bounds[1:]) if bounds[i] <= start < b), None)
        if idx is not None:
            out[name][idx] += duration
    return out


def length_counts(lengths: Sequence[int]) -> dict[str, int]:
    """Completions, completion tokens and the shortest / longest completion actually generated."""
    return {"completions": len(lengths), "completion_tokens": int(sum(lengths)),
            "min_completion_len": min(lengths, default=-1), "max_completion_len": max(lengths, default=-1)}


def spread(values: Sequence[float | None]) -> dict[str, float] | None:
    """{"median", "min", "max"} of the non-None values, or None when there are none."""
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return None
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def fmt_spread(s: dict[str, float] | None, digits: int = 3) -> str:
    if s is None:
        return "n/a"
    return f"{s['median']:.{digits}g} ({s['min']:.{digits}g}–{s['max']:.{digits}g})"


def ratio(ours: dict[str, float] | None, theirs: dict[str, float] | None) -> str:
    if ours is None or theirs is None or theirs["median"] == 0:
        return "n/a"
    return f"{ours['median'] / theirs['median']:.2f}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ subprocess runs, tables
def spawn(cmd: list[str], cwd: Path, result: Path, log: Path, threads: int | None) -> dict[str, Any]:
    """Run one measurement in a fresh Python process; it writes its JSON to `result`. Loud on failure."""
    import json
    import os
    import subprocess

    # keep any PYTHONPATH the caller set (e.g. packages installed with --target), the repo root first
    path = os.pathsep.join(p for p in (str(cwd), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": path}
    if threads:  # set before torch is imported in the child: OpenMP reads it once
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    with open(log, "w") as f:
        proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode != 0 or not result.exists():
        raise RuntimeError(f"benchmark run {result.stem} failed with exit status {proc.returncode}; last output:\n"
                           f"{log.read_text()[-3000:]}\n(full log: {log})")
    return json.loads(result.read_text())


SUMMARY_METRICS = ("sec_per_step", "cpu_sec_per_step", "completions_per_s", "peak_rss_mib", "rss_after_imports_mib",
                   "peak_cuda_mib", "cycle_spread")


def summarise(runs: list[dict[str, Any]], trainers: Sequence[str], warmup_cycles: int) -> dict[str, Any]:
    """Per trainer: median / min–max over runs of each summary metric, and per phase over steady-state cycles."""
    out: dict[str, Any] = {}
    for t in trainers:
        rs = [r for r in runs if r["trainer"] == t]
        out[t] = {m: spread([r[m] for r in rs]) for m in SUMMARY_METRICS}
        names = sorted(rs[0]["phases"]) if rs else []
        out[t]["phases_s_per_cycle"] = {n: spread([v for r in rs for v in r["phases"][n][warmup_cycles:]])
                                        for n in names}
    a, b = out[trainers[0]]["sec_per_step"], out[trainers[1]]["sec_per_step"]
    out["speedup"] = b["median"] / a["median"] if a and b else None
    return out


def table(results: list[dict[str, Any]], trainers: Sequence[str], labels: Sequence[str]) -> str:
    """One row per scenario × metric: both trainers' median (min–max) and the ratio first / second."""
    metrics = [("s / optimizer step", "sec_per_step", 3), ("CPU s / optimizer step", "cpu_sec_per_step", 3),
               ("completions / s", "completions_per_s", 3),
               ("peak RSS MiB", "peak_rss_mib", 4), ("RSS after imports MiB", "rss_after_imports_mib", 3),
               ("peak GPU MiB", "peak_cuda_mib", 4), ("cycle spread (max / min of kept cycles)", "cycle_spread", 3)]
    rows = []
    for res in results:
        name = res["spec"]["name"]
        for label, key, digits in metrics:
            a, b = res[trainers[0]][key], res[trainers[1]][key]
            if a is not None or b is not None:
                rows.append([name, label, fmt_spread(a, digits), fmt_spread(b, digits), ratio(a, b)])
        speed = res["speedup"]
        rows.append([name, f"speed-up ({labels[1]} s/step ÷ {labels[0]} s/step)", "", "",
                     "n/a" if speed is None else f"{speed:.2f}×"])
    return markdown_table(["scenario", "metric", f"{labels[0]} median (min–max)", f"{labels[1]} median (min–max)",
                           f"{labels[0]}/{labels[1]}"], rows)


def phase_table(results: list[dict[str, Any]], trainers: Sequence[str]) -> str:
    rows = [[res["spec"]["name"], t, phase, fmt_spread(s)]
            for res in results for t in trainers for phase, s in res[t]["phases_s_per_cycle"].items()]
    return markdown_table(["scenario", "trainer", "phase", "s per rollout cycle, median (min–max)"], rows)


GZ = ".gz"
"""A kept record's suffix: the repository keeps run records (metrics.jsonl, evals/<phase>.jsonl) gzipped, a trainer's
run folder holds them plain; the readers below take either."""
GZIP_LEVEL = 9


def record_path(path: Path) -> Path:
    """Where record `path` (e.g. RUN/metrics.jsonl) is: `path` itself, else its gzipped copy `path`.gz, else `path`
    (missing)."""
    path = Path(path)
    packed = path.with_name(path.name + GZ)
    return packed if not path.is_file() and packed.is_file() else path


def has_record(path: Path) -> bool:
    """Whether record `path` exists, plain or gzipped (`record_path`)."""
    return record_path(path).is_file()


def read_record(path: Path) -> str:
    """The text of record `path`, read plain or from its gzipped copy (`record_path`); FileNotFoundError naming both
    when neither exists."""
    found = record_path(path)
    if not found.is_file():
        raise FileNotFoundError(f"{path}: missing (nor is there {path}{GZ})")
    return gzip.decompress(found.read_bytes()).decode() if found.name.endswith(GZ) else found.read_text()


def gzip_bytes(text: str) -> bytes:
    """`text` gzipped with no file name and time 0 in the header, so the same text gives the same bytes (a kept record
    changes in git only when its content does)."""
    return gzip.compress(text.encode(), compresslevel=GZIP_LEVEL, mtime=0)


def write_packed(path: Path, text: str) -> Path:
    """Write `text` gzipped to `path`.gz (`gzip_bytes`) and return that path."""
    out = Path(path).with_name(Path(path).name + GZ)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(gzip_bytes(text))
    return out
