"""Peak memory and time of one training micro-batch (forward + backward of `completion_logprobs`), with the LM head
fused into the log-prob computation (`grpo/core/kernels.head_logprobs`) and without (the model builds the logits).

    python -m benchmarks.fused_head                       # CPU, the tiny shape
    python -m benchmarks.fused_head --device cuda --shape qwen2.5-0.5b

Prints one line per variant: peak memory above the model (GPU: torch.cuda.max_memory_allocated; CPU: not measured),
median seconds over --repeats, and the largest log-prob / gradient-norm difference between the variants.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from benchmarks.common import SHAPES
from grpo.models.logprobs import completion_logprobs
from grpo.models.modeling import tiny_model_config


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fused_head",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    p.add_argument("--seqs", type=int, default=32, help="sequences per micro-batch (4 prompts x K 8)")
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--completion", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    from transformers import AutoModelForCausalLM

    shape, device = SHAPES[args.shape], torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = tiny_model_config(shape.vocab or 384, hidden=shape.hidden, layers=shape.layers, heads=shape.heads,
                               kv_heads=shape.kv_heads, intermediate=shape.intermediate,
                               max_positions=shape.max_positions, arch=shape.arch)
    config.tie_word_embeddings = shape.tied
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype).to(device).train()
    L = args.prompt + args.completion
    ids = torch.randint(0, config.vocab_size, (args.seqs, L), device=device)
    mask = torch.ones_like(ids)
    if device.type == "cuda":
        print(f"GPU: {torch.cuda.get_device_name(device)}; torch {torch.__version__}")
    print(f"shape {args.shape} ({sum(x.numel() for x in model.parameters()) / 1e6:.0f}M parameters, vocab "
          f"{config.vocab_size}), {dtype}, {args.seqs} sequences x ({args.prompt} prompt + {args.completion} "
          "completion) tokens, forward + backward")
    results = {}
    for fused in (False, True):
        times, peak = [], None
        for _ in range(args.repeats):
            model.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            start = time.perf_counter()
            lp, _ = completion_logprobs(model, ids, mask, args.prompt, with_entropy=True, fused_head=fused)
            lp.float().mean().backward()
            if device.type == "cuda":
                torch.cuda.synchronize()
                peak = (torch.cuda.max_memory_allocated() - base) / 2**20
            times.append(time.perf_counter() - start)
        grad_norm = torch.sqrt(sum(x.grad.float().pow(2).sum() for x in model.parameters())).item()
        results[fused] = (lp.detach().float(), grad_norm)
        label = "fused head" if fused else "logits    "
        mem = f"peak {peak:,.0f} MiB above the model" if peak is not None else "peak not measured on CPU"
        print(f"{label}: {mem}; {statistics.median(times[1:] or times) * 1000:.1f} ms median; grad norm "
              f"{grad_norm:.6g}")
    (lp_a, g_a), (lp_b, g_b) = results[False], results[True]
    print(f"max |log-prob difference| {(lp_a - lp_b).abs().max().item():.3g}; grad norm ratio {g_b / g_a:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
