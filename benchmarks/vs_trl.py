"""Side-by-side speed and memory of grpo-dual's RL step and TRL's GRPOTrainer on the same work.

    python -m benchmarks.vs_trl --quick                                  # tiny model, 2 CPU cores, < 5 min
    python -m benchmarks.vs_trl                                          # "small" model on CPU, more repeats
    python -m benchmarks.vs_trl --device cuda --shape qwen2.5-0.5b       # random Qwen2.5-0.5B shape, bf16
    python -m benchmarks.vs_trl --quick --out bench.json --scenarios grpo
    python -m benchmarks.vs_trl --model smollm2-135m-instruct --prompts long   # the real model, BBQ-length prompts

One model + tokenizer is built from a config (fixed seed) and saved once, or `--model NAME` names a packaged real
model (grpo/models/pretrained.py; converted once into its cache folder); every run loads that folder, so both trainers
start from identical weights. `--prompts long` puts BBQ-length contexts in front of every prompt (a system message of
real BBQ contexts, LONG_CONTEXT_TOKENS tokens or so) on both sides. Each run is its own subprocess (peak RSS / GPU
memory never mix), runs alternate (ours, TRL, ours, TRL ...), and warm-up rollout cycles are dropped. Generation is
forced to full length (ours: rollout.min_new_tokens = max_new_tokens; TRL: generation_kwargs={"min_new_tokens": N}), so
both sides generate and train on exactly the same number of tokens; the workers check it from what each run produced.

    one rollout cycle = P prompts × K completions generated once, then μ optimizer steps over all of them
    completions per optimizer step: ours prompts_per_micro_step·K·grad_accum = TRL per_device_train_batch_size·GA
    steady-state s/step = Σ cycle_time[w:] / (cycles_kept · μ)                           (benchmarks/common.py)

Needs `pip install -r requirements/dev.txt` (trl, datasets). Requires TRL only here; it is not a runtime dependency.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks import common

ROOT = Path(__file__).resolve().parents[1]
TRAINERS = ("ours", "trl")
GRPO_CLIP = (0.2, 0.28)
"""(clip_low, clip_high) for token-level GRPO: PPO's 0.2 and DAPO's clip-higher 0.28."""
GSPO_CLIP = (3e-4, 4e-4)
"""GSPO clips the per-sequence geometric-mean ratio, so its range is ~1000× narrower (GSPO paper §5.1)."""
CPU_THREADS = 1
"""Threads per run on CPU. The 2-core machines are shared: with 2 OpenMP threads a busy neighbour makes every barrier
spin and step times swing (benchmarks/RESULTS.md, "Threads"); one thread per run is steady, and both trainers get the
same."""
OUR_TIME_KEYS = ("time/generate", "time/reward", "time/old_logps", "time/ref_logps", "time/update", "time/step")


@dataclass(frozen=True)
class BenchSpec:
    """One benchmark configuration, mapped to both trainers by `build_configs`."""

    name: str
    """Scenario label: "grpo" (token ratio, μ = 1) or "gspo" (sequence ratio, μ = 2)."""
    policy_loss: str
    """ours loss.policy_loss: grpo | gspo. TRL: importance_sampling_level token | sequence."""
    mu: int
    """Optimizer steps per rollout batch (ours loss.mu, TRL num_iterations)."""
    prompts_per_micro_step: int
    grad_accum: int
    k: int
    max_new_tokens: int
    """Completions are forced to exactly this length on both sides."""
    beta: float = 0.04
    """KL coefficient; > 0, so both sides run the reference pass."""
    clip_low: float = GRPO_CLIP[0]
    clip_high: float = GRPO_CLIP[1]
    lr: float = 1e-6
    temperature: float = 1.0
    device: str = "cpu"
    dtype: str = "float32"
    cycles: int = 4
    """Rollout cycles per run (each = μ optimizer steps)."""
    warmup_cycles: int = 1
    """Cycles dropped from the steady-state numbers (allocator, caches, first-call overheads)."""
    seed: int = 0
    demo_size: int = 200
    """Demo prompts generated per task (the prompt pool both sides draw from)."""
    system_prompt: str = ""
    """A system message in front of every prompt on both sides (data.system_prompt): "" for the short workload, BBQ
    contexts for `--prompts long`."""
    ours_cache: str = ""
    """Our `rollout.cache_implementation` ("static": static KV cache, decoding compiled by transformers on CUDA);
    "" = the config default (dynamic). TRL always decodes with its dynamic cache."""
    ours_engine: str = ""
    """Our `rollout.engine` (auto | lean | graph | hf); "" = the config default (auto: graph on CUDA, lean on the
    CPU)."""

    @property
    def prompts_per_cycle(self) -> int:
        return self.prompts_per_micro_step * self.grad_accum

    @property
    def completions_per_cycle(self) -> int:
        return self.prompts_per_cycle * self.k

    @property
    def optimizer_steps(self) -> int:
        return self.cycles * self.mu


def scenario(name: str, base: dict[str, Any]) -> BenchSpec:
    """The two compared losses: GRPO token-level at μ = 1, GSPO sequence-level at μ = 2 (old-log-prob pass on)."""
    if name == "grpo":
        return BenchSpec(name="grpo", policy_loss="grpo", mu=1, clip_low=GRPO_CLIP[0], clip_high=GRPO_CLIP[1], **base)
    if name == "gspo":
        return BenchSpec(name="gspo", policy_loss="gspo", mu=2, clip_low=GSPO_CLIP[0], clip_high=GSPO_CLIP[1], **base)
    raise ValueError(f"--scenarios: unknown scenario {name!r}; use grpo, gspo or grpo,gspo")


def build_configs(spec: BenchSpec, model_dir: str, out_dir: str) -> tuple[list[str], dict[str, Any]]:
    """(our `section.field=value` overrides for config.load_config("demo", ...), TRL GRPOConfig kwargs). Pure.

    The correspondence, field by field, is the table in benchmarks/NOTES.md. TRL counts COMPLETIONS per device
    batch; ours counts PROMPTS per micro-step (× K completions each).
    """
    n = spec.max_new_tokens
    ours = [
        f"model.name={model_dir}", f"model.dtype={spec.dtype}", "model.attn_implementation=sdpa", "model.lora=false",
        "model.gradient_checkpointing=false", "data.source=demo", f"data.demo_size={spec.demo_size}",
        f"rollout.k={spec.k}", f"rollout.max_new_tokens={n}", f"rollout.min_new_tokens={n}",
        f"rollout.temperature={spec.temperature}", "rollout.top_k=0", "rollout.top_p=1.0", "rollout.min_p=0.0",
        f"loss.policy_loss={spec.policy_loss}", f"loss.mu={spec.mu}", f"loss.clip_low={spec.clip_low}",
        f"loss.clip_high={spec.clip_high}", "loss.agg_mode=token-mean", "loss.kl_estimator=k3",
        "loss.adv_scale=group", "loss.entropy_coef=0.0",
        "kl.default.controller=fixed", f"kl.default.beta={spec.beta}",
        f"train.prompts_per_micro_step={spec.prompts_per_micro_step}", f"train.grad_accum={spec.grad_accum}",
        f"train.max_steps={spec.cycles}", f"train.lr={spec.lr}", "train.weight_decay=0.0", "train.warmup_steps=0",
        "train.max_grad_norm=1.0", f"train.seed={spec.seed}", f"train.device={spec.device}", "train.eval_every=0",
        "train.sample_every=0", "train.tensorboard=false", f"train.output_dir={out_dir}", "train.run_name=ours",
        "sft.steps=0", f"data.system_prompt={spec.system_prompt}",
    ] + ([f"rollout.cache_implementation={spec.ours_cache}"] if spec.ours_cache else []) + (
        [f"rollout.engine={spec.ours_engine}"] if spec.ours_engine else [])
    trl = {
        "output_dir": str(Path(out_dir) / "trl"),
        "per_device_train_batch_size": spec.prompts_per_micro_step * spec.k,  # completions, not prompts
        "gradient_accumulation_steps": spec.grad_accum,
        "steps_per_generation": spec.grad_accum,  # one generation batch per optimizer step, like ours
        "num_generations": spec.k,
        "max_completion_length": n,
        "generation_kwargs": {"min_new_tokens": n},  # forced full length, like rollout.min_new_tokens
        "num_iterations": spec.mu,
        "beta": spec.beta,
        "loss_type": "dapo",  # Σ m·ℓ / tokens of the whole accumulated batch = our token-mean
        "importance_sampling_level": "sequence" if spec.policy_loss == "gspo" else "token",
        "epsilon": spec.clip_low,
        "epsilon_high": spec.clip_high,
        "temperature": spec.temperature, "top_p": 1.0, "top_k": 0, "min_p": None,
        "scale_rewards": "group",
        "mask_truncated_completions": False,  # every completion is truncated here; masking would train on nothing
        "max_steps": spec.optimizer_steps,
        "learning_rate": spec.lr, "lr_scheduler_type": "constant", "warmup_steps": 0, "weight_decay": 0.0,
        "max_grad_norm": 1.0, "optim": "adamw_torch",
        "gradient_checkpointing": False,  # TRL's default is True; ours is off
        "bf16": spec.dtype == "bfloat16", "fp16": False, "use_cpu": spec.device == "cpu",
        "disable_dropout": True, "use_vllm": False, "report_to": "none", "logging_steps": 1,
        "save_strategy": "no", "seed": spec.seed, "remove_unused_columns": False, "dataloader_num_workers": 0,
        "log_completions": False,
    }
    return ours, trl


# ------------------------------------------------------------------------------------------------------- workers
def _our_config(spec: BenchSpec, model_dir: str, out_dir: str):
    from grpo import config as C

    overrides, _ = build_configs(spec, model_dir, out_dir)
    return C.load_config("demo", overrides)


def run_ours(spec: BenchSpec, model_dir: str, out_dir: str) -> dict[str, Any]:
    """`grpo_train.setup` + `rl_step` (the real code path) for spec.cycles rollout cycles."""
    import torch

    import grpo.run.step_owners as owners
    import grpo_train

    rss_imports = common.peak_rss_mib()
    lengths: list[int] = []
    peak_after_generate_mib: list[float | None] = []  # peak so far, read right after each generate phase
    shipped_generate = owners.generate_rollouts  # what the rollout owner calls (grpo_train.rl_step's rollouts)

    def counted_generate(*args: Any, **kwargs: Any):  # count what was really generated, as on the TRL side
        rollouts, metrics = shipped_generate(*args, **kwargs)
        peak_after_generate_mib.append(common.peak_cuda_mib())
        lengths.extend(len(r.completion_ids) for r in rollouts)
        return rollouts, metrics

    owners.generate_rollouts = counted_generate
    try:
        cfg = _our_config(spec, model_dir, out_dir)
        run = grpo_train.setup(cfg)
        marks, phases = [(time.perf_counter(), time.process_time())], {k: [] for k in OUR_TIME_KEYS}
        graph: dict[str, list[float]] = {}  # rollout/graph_* per cycle, when the graph engine decodes
        for step in range(1, spec.cycles + 1):
            metrics = grpo_train.rl_step(run, step)
            if run.device.type == "cuda":
                torch.cuda.synchronize()
            marks.append((time.perf_counter(), time.process_time()))
            for k in OUR_TIME_KEYS:
                phases[k].append(metrics[k])
            for k in (k for k in metrics if k.startswith("rollout/graph_")):
                graph.setdefault(k[len("rollout/graph_"):], []).append(metrics[k])
        run.tracker.close()
    finally:  # an in-process caller (a test) keeps the owner as it was
        owners.generate_rollouts = shipped_generate
    wall, cpu = common.cycle_deltas(marks, 1)
    return {"cycle_times_s": wall, "cycle_cpu_s": cpu, "optimizer_steps": int(run.updater.scheduler.last_epoch),
            "rss_after_imports_mib": rss_imports, **common.length_counts(lengths), "phases": phases,
            "peak_cuda_after_generate_mib": peak_after_generate_mib, "graph_counts": graph}


def trl_dataset(spec: BenchSpec, model_dir: str, out_dir: str):
    """The same training prompt pool our run draws from (same demo samples, same held-out split), as TRL rows."""
    from datasets import Dataset

    from grpo.run.assembly.samples import group_by_task, load_samples

    cfg = _our_config(spec, model_dir, out_dir)
    rows = load_samples(cfg.data, cfg.train.seed, cfg.tasks)
    train, _ = group_by_task(rows.train, rows.heldout, cfg.data)
    rows = [{"prompt": [dict(m) for m in s.messages], "task": s.task, "gold": json.dumps(s.gold)}
            for task in sorted(train) for s in train[task]]
    return Dataset.from_list(rows)


def _demo_reward(lengths: list[int]):
    """TRL reward function: the demo rule graders; also records the token length of every completion."""
    from grpo.data.demo_tasks import fairness_grader, hallucination_grader

    graders = {"fairness": fairness_grader, "hallucination": hallucination_grader}

    def demo_rule_reward(prompts, completions, completion_ids, task, gold, **_: Any) -> list[float]:
        lengths.extend(len(c) for c in completion_ids)
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [graders[t](x, json.loads(g)) for x, t, g in zip(texts, task, gold, strict=True)]

    return demo_rule_reward


def _instrument(trainer, events: list[tuple[str, float, Any]]) -> None:
    """Wrap TRL's phase methods on the instance to record (phase, host start, duration) events. On CUDA the duration
    is a pair of CUDA events around the call, read after training (`resolve_events`): the host clock would charge a
    phase's queued kernels to a later one, and our phase timers read CUDA events too (grpo/run/tracking.py:
    StepTimer)."""
    import torch

    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()

    def timed(name: str, fn, only_no_grad: bool = False):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            start = end = None
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            out = fn(*args, **kwargs)
            if not only_no_grad or not torch.is_grad_enabled():
                if cuda:
                    end.record()
                events.append((name, t0, (start, end) if cuda else time.perf_counter() - t0))
            return out
        return wrapper

    trainer._generate_single_turn = timed("generate", trainer._generate_single_turn)
    trainer._calculate_rewards = timed("reward", trainer._calculate_rewards)
    trainer._get_per_token_logps_and_entropies = timed("no_grad_logps", trainer._get_per_token_logps_and_entropies,
                                                       only_no_grad=True)
    trainer._generate_and_score_completions = timed("generate_and_score", trainer._generate_and_score_completions)


def resolve_events(events: list[tuple[str, float, Any]]) -> list[tuple[str, float, float]]:
    """(phase, host start, seconds): CUDA event pairs read as elapsed device time (after a synchronize)."""
    import torch

    if any(isinstance(d, tuple) for _, _, d in events):
        torch.cuda.synchronize()
    return [(name, t0, d[0].elapsed_time(d[1]) / 1000 if isinstance(d, tuple) else d) for name, t0, d in events]


def run_trl(spec: BenchSpec, model_dir: str, out_dir: str) -> dict[str, Any]:
    """TRL's GRPOTrainer on the saved model for spec.cycles · μ optimizer steps."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from grpo.models.modeling import DTYPES

    rss_imports = common.peak_rss_mib()
    _, kwargs = build_configs(spec, model_dir, out_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=DTYPES[spec.dtype], attn_implementation="sdpa")
    lengths: list[int] = []
    marks: list[tuple[float, float]] = []  # (wall, process CPU) at the start and after every optimizer step

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if not marks:
                marks.append((time.perf_counter(), time.process_time()))

        def on_step_end(self, args, state, control, **kw):
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.synchronize()
            marks.append((time.perf_counter(), time.process_time()))

    trainer = GRPOTrainer(model=model, reward_funcs=_demo_reward(lengths), args=GRPOConfig(**kwargs),
                          train_dataset=trl_dataset(spec, model_dir, out_dir), processing_class=tokenizer,
                          callbacks=[StepTimer()])
    events: list[tuple[str, float, Any]] = []
    _instrument(trainer, events)
    trainer.train()
    wall, cpu = common.cycle_deltas(marks, spec.mu)  # a cycle = μ optimizer steps = one generation batch
    phases = common.bucket_events(resolve_events(events), [w for w, _ in marks[::spec.mu]],
                                  ("generate", "reward", "no_grad_logps", "generate_and_score"))
    phases["train"] = [c - g for c, g in zip(wall, phases["generate_and_score"], strict=True)]
    return {"cycle_times_s": wall, "cycle_cpu_s": cpu, "optimizer_steps": int(trainer.state.global_step),
            "rss_after_imports_mib": rss_imports, **common.length_counts(lengths), "phases": phases}


def worker(trainer: str, spec: BenchSpec, model_dir: str, out_dir: str, result_path: str) -> None:
    """Run one trainer in this (fresh) process and write its measurements, peaks included, to `result_path`."""
    result = (run_ours if trainer == "ours" else run_trl)(spec, model_dir, out_dir)
    import torch

    result.update(trainer=trainer, spec=spec.name, peak_rss_mib=common.peak_rss_mib(),
                  peak_cuda_mib=common.peak_cuda_mib(), torch_threads=torch.get_num_threads())
    sec, cps = common.steady_state(result["cycle_times_s"], spec.warmup_cycles, spec.mu, spec.completions_per_cycle)
    cpu_sec, _ = common.steady_state(result["cycle_cpu_s"], spec.warmup_cycles, spec.mu, spec.completions_per_cycle)
    kept = result["cycle_times_s"][spec.warmup_cycles:]
    result.update(sec_per_step=sec, completions_per_s=cps, cpu_sec_per_step=cpu_sec,
                  cycle_spread=max(kept) / min(kept) if kept and min(kept) > 0 else None)
    Path(result_path).write_text(json.dumps(result))


# ------------------------------------------------------------------------------------------------- orchestration
def check_same_work(spec: BenchSpec, runs: list[dict[str, Any]]) -> None:
    """Every run generated spec.completions_per_cycle completions of exactly N tokens per cycle and took μ·cycles
    optimizer steps; otherwise the comparison is void and we stop with what differed."""
    want = {"completions": spec.cycles * spec.completions_per_cycle, "optimizer_steps": spec.optimizer_steps,
            "completion_tokens": spec.cycles * spec.completions_per_cycle * spec.max_new_tokens,
            "min_completion_len": spec.max_new_tokens, "max_completion_len": spec.max_new_tokens}
    for r in runs:
        bad = {k: (r[k], v) for k, v in want.items() if r[k] != v}
        if bad:
            raise RuntimeError(f"{r['trainer']} run of scenario {spec.name!r} did different work than specified "
                               f"(got, wanted): {bad}; the comparison would be unfair")


def spawn_run(trainer: str, spec: BenchSpec, model_dir: Path, work: Path, tag: str,
              threads: int | None) -> dict[str, Any]:
    """One run of `trainer` in a fresh subprocess (`--worker`), so peak RSS / GPU memory are its own."""
    cmd = [sys.executable, "-m", "benchmarks.vs_trl", "--worker", trainer, "--spec-json", json.dumps(asdict(spec)),
           "--model-dir", str(model_dir), "--work-dir", str(work / tag), "--result", str(work / f"{tag}.json")]
    return common.spawn(cmd, ROOT, work / f"{tag}.json", work / f"{tag}.log", threads)


PRESETS: dict[str, dict[str, Any]] = {
    # 2 CPU cores, under 5 minutes for both scenarios: 2 repeats x 2 trainers x 2 scenarios = 8 subprocesses.
    "quick": {"shape": "tiny", "repeats": 2, "base": {"prompts_per_micro_step": 2, "grad_accum": 2, "k": 4,
                                                      "max_new_tokens": 32, "cycles": 4, "warmup_cycles": 1}},
    "cpu": {"shape": "small", "repeats": 3, "base": {"prompts_per_micro_step": 2, "grad_accum": 2, "k": 4,
                                                     "max_new_tokens": 64, "cycles": 5, "warmup_cycles": 1}},
    # the GPU run: 8 prompts x K 8 = 64 completions of 128 tokens per rollout cycle, bf16.
    "cuda": {"shape": "qwen2.5-0.5b", "repeats": 3, "base": {"prompts_per_micro_step": 4, "grad_accum": 2, "k": 8,
                                                             "max_new_tokens": 128, "cycles": 6, "warmup_cycles": 2,
                                                             "device": "cuda", "dtype": "bfloat16"}},
}


LONG_CONTEXT_TOKENS = 300
"""About how long `--prompts long` makes every prompt's context: BBQ prompts run ~100-400 tokens."""


def long_context(data_dir: Path, tokens: int = LONG_CONTEXT_TOKENS) -> str:
    """Real BBQ contexts (the first rows of the first category file, sorted) joined until about `tokens` words-ish
    tokens (4 characters a token): the same text on both sides, without commas or '=' (it travels as an override)."""
    files = sorted((data_dir / "bbq").glob("*.jsonl"))
    if not files:
        raise SystemExit(f"--prompts long needs BBQ data in {data_dir}/bbq (../shared/data)")
    parts: list[str] = []
    with open(files[0]) as f:
        for line in f:
            parts.append(json.loads(line)["context"].replace(",", ";").replace("=", "-"))
            if sum(map(len, parts)) >= 4 * tokens:
                break
    return "Background: " + " ".join(parts)


def orchestrate(specs: list[BenchSpec], shape_name: str, repeats: int, work: Path,
                threads: int | None, model_name: str = "") -> dict[str, Any]:
    """Save the model once (or resolve the packaged `model_name`), then run ours and TRL alternately `repeats` times
    per spec; check the work matched."""
    if model_name:
        from safetensors import safe_open
        from transformers import AutoConfig

        from grpo.models.pretrained import resolve_model_name

        model_dir = Path(resolve_model_name(model_name))
        with safe_open(str(next(model_dir.glob("*.safetensors"))), "pt") as f:
            n = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
        model_info = {"name": model_name, "parameters": n,
                      "model_type": AutoConfig.from_pretrained(model_dir).model_type}
    else:
        model_dir = work / "model"
        model_info = common.build_and_save_model(common.SHAPES[shape_name], model_dir, seed=specs[0].seed,
                                                 dtype_name=specs[0].dtype)
    results = []
    for spec in specs:
        runs = []
        for r in range(repeats):
            for trainer in TRAINERS:  # alternate: ours, TRL, ours, TRL ...
                t0 = time.perf_counter()
                runs.append(spawn_run(trainer, spec, model_dir, work, f"{spec.name}-{trainer}-{r}", threads))
                print(f"  {spec.name} {trainer:4s} repeat {r + 1}/{repeats}: {runs[-1]['sec_per_step']:.3f} s/step "
                      f"({time.perf_counter() - t0:.0f} s with start-up)", flush=True)
        check_same_work(spec, runs)
        results.append({"spec": asdict(spec), "runs": runs, **common.summarise(runs, TRAINERS, spec.warmup_cycles)})
    return {"date": time.strftime("%Y-%m-%d %H:%M"), "shape": model_name or shape_name, "model": model_info,
            "machine": common.machine_info(threads, ("torch", "transformers", "trl")), "repeats": repeats,
            "results": results}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.vs_trl", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny model, 2 repeats, < 5 min on 2 CPU cores")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--shape", choices=sorted(common.SHAPES), default=None, help="model shape (default per preset)")
    p.add_argument("--model", default="", help="a packaged real model (grpo/models/pretrained.py), e.g. "
                   "smollm2-135m-instruct, instead of a random --shape")
    p.add_argument("--prompts", choices=("short", "long"), default="short",
                   help="short: the demo's prompts; long: BBQ contexts in front of each (~300 more tokens)")
    p.add_argument("--scenarios", default="grpo,gspo", help="comma list of grpo (μ=1) and gspo (μ=2)")
    p.add_argument("--repeats", type=int, default=None, help="runs per trainer per scenario")
    p.add_argument("--cycles", type=int, default=None, help="rollout cycles per run (warm-up included)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up cycles dropped from the numbers")
    p.add_argument("--threads", type=int, default=None,
                   help=f"threads per run; 0 = torch's choice (default {CPU_THREADS} on CPU, torch's on CUDA)")
    p.add_argument("--ours-cache", default="", choices=("", "static"),
                   help="our rollout.cache_implementation: static = static KV cache, decoding compiled by "
                        "transformers on CUDA (default: the config's dynamic cache)")
    p.add_argument("--ours-engine", default="", choices=("", "auto", "lean", "graph", "hf"),
                   help="our rollout.engine (default: the config's auto: graph on CUDA, lean on the CPU)")
    p.add_argument("--out", default="", help="write all measurements as JSON here")
    p.add_argument("--work-dir", default="", help="keep models, logs and run folders here (default: a temp dir)")
    # internal: one run in a fresh process
    p.add_argument("--worker", choices=TRAINERS, help=argparse.SUPPRESS)
    p.add_argument("--spec-json", help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def specs_from_args(args: argparse.Namespace) -> tuple[list[BenchSpec], str, int]:
    preset = PRESETS["cuda" if args.device == "cuda" else "quick" if args.quick else "cpu"]
    base = dict(preset["base"])
    if args.cycles is not None:
        base["cycles"] = args.cycles
    if args.warmup is not None:
        base["warmup_cycles"] = args.warmup
    if base["cycles"] <= base["warmup_cycles"]:
        raise SystemExit(f"--cycles {base['cycles']} must exceed --warmup {base['warmup_cycles']}")
    base["ours_cache"] = args.ours_cache
    base["ours_engine"] = args.ours_engine
    if args.prompts == "long":
        base["system_prompt"] = long_context(ROOT.parent / "shared" / "data")
    specs = [scenario(s.strip(), base) for s in args.scenarios.split(",") if s.strip()]
    return specs, args.shape or preset["shape"], args.repeats or preset["repeats"]


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args.worker, BenchSpec(**json.loads(args.spec_json)), args.model_dir, args.work_dir, args.result)
        return 0
    specs, shape, repeats = specs_from_args(args)
    if args.device == "cuda" and not __import__("torch").cuda.is_available():
        raise SystemExit("--device cuda: no CUDA GPU is visible; run on a GPU machine or drop --device cuda")
    with tempfile.TemporaryDirectory(prefix="vs_trl_") as tmp:
        work = Path(args.work_dir) if args.work_dir else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        threads = (CPU_THREADS if args.device == "cpu" else None) if args.threads is None else (args.threads or None)
        report = orchestrate(specs, shape, repeats, work, threads, model_name=args.model)
        report["wall_s"] = time.perf_counter() - t0
    m = report["machine"]
    print(f"\nvs TRL {m['trl']} | {report['shape']} ({report['model']['parameters']:,} parameters) | "
          f"{args.prompts} prompts | {specs[0].device} "
          f"{specs[0].dtype} | threads {m['threads'] or 'default'} | {repeats} repeats | "
          f"{report['wall_s']:.0f} s wall\n")
    ours_label = "ours" + "".join(f" ({x})" for x in (f"{args.ours_cache} cache" if args.ours_cache else "",
                                                      f"engine {args.ours_engine}" if args.ours_engine else "") if x)
    print(common.table(report["results"], TRAINERS, (ours_label, "TRL")))
    print("\nper-phase time per rollout cycle (steady state):\n")
    print(common.phase_table(report["results"], TRAINERS))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
        print(f"\nwritten: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
