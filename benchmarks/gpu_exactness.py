"""Part a of the GPU check (benchmarks/gpu_check.py), exactness: each engine's tokens against transformers'
`generate` on the same rows, fp32 then bf16; the graph step fed generate's greedy tokens against the model's whole
forward; and what folding LoRA for the rollout changes in bf16."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.gpu_rollouts import PROMPTS, K, build_model_dir, compare, device_of, log, rollout_ids, samples

EXACT_NEW = 48
"""New tokens per row in the exactness runs."""


def exactness(cpu: bool, work: Path) -> dict[str, Any]:
    """Each engine's tokens against generate's, fp32 and bf16; LoRA folded against unfolded."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo.decoding.sampling import row_keys

    device = device_of(cpu)
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
    seqs = [r + c[:n] for r, c in zip(rows, completions, strict=True)]
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
