"""grpo/machine/memory_estimate.py arithmetic on hand-worked shapes, the phase model, the fixes, and
check_gpu_memory.py's CLI (grpo/run/assembly/gpu_memory_check.py)."""

import os
import re
import subprocess
import sys
import types
from dataclasses import replace

import pytest
from conftest import ROOT

from grpo.machine.memory_estimate import (
    GIB,
    KNOWN_SHAPES,
    LLAMA_TARGETS,
    EstimateInputs,
    ModelShape,
    cheapest_fixes,
    estimate,
    fits,
    format_table,
    graph_cache_budget,
    graph_slot_bytes,
    logit_bytes,
    lookup_known_shape,
    lora_param_count,
    param_counts,
    pass_tokens,
    shape_from_hf_config,
)

# A 2-layer shape small enough to work out by hand: h=8, heads=2 (head_dim 4), kv_heads=1 (kvo 4), I=16, V=10.
TINY = ModelShape("hand", hidden=8, layers=2, heads=2, kv_heads=1, intermediate=16, vocab=10, tie_embeddings=False)
LLAMA3_8B = KNOWN_SHAPES["meta-llama/Meta-Llama-3-8B-Instruct"]


def tiny_inputs(**kw):
    base = dict(shape=TINY, micro_batch_seqs=2, gen_batch_seqs=3, prompt_len=5, new_tokens=3, lora_r=2,
                cuda_overhead_gb=0.0, allocator_slack=0.0)
    return EstimateInputs(**{**base, **kw})


def llama_inputs(**kw):
    """The reference setup: 2 prompts × K=4 per micro-step, grad_accum 2, 512 + 96 tokens, LoRA r=8 on all 7."""
    base = dict(shape=LLAMA3_8B, micro_batch_seqs=8, gen_batch_seqs=16, prompt_len=512, new_tokens=96, k=4,
                lora_r=8, lora_dropout=0.05, grad_checkpointing=True)
    return EstimateInputs(**{**base, **kw})


# ---------------------------------------------------------------------------------------------- parameter counts
def test_param_counts_by_hand():
    # per layer: q 8·8 + k 8·4 + v 8·4 + o 8·8 + gate 8·16 + up 8·16 + down 16·8 = 576; 2 layers = 1152
    # other: norms 2·(2·8) = 32, embed + untied head 2·10·8 = 160, final norm 8 → 200
    assert param_counts(TINY) == {"linear": 1152, "other": 200, "total": 1352}


def test_lora_param_count_by_hand():
    # r=2: q 8·2+2·8=32, k 8·2+2·4=24, v 24, o 32, gate 8·2+2·16=48, up 48, down 16·2+2·8=48 → 256 per layer
    assert lora_param_count(TINY, 2, LLAMA_TARGETS) == 512
    assert lora_param_count(TINY, 2, ["q_proj", "v_proj"]) == 2 * (32 + 24)
    assert lora_param_count(TINY, 2, ["all-linear"]) == 512
    with pytest.raises(ValueError, match="c_attn"):
        lora_param_count(TINY, 2, ["c_attn"])


def test_published_llama3_8b_counts():
    # Meta's model card / HF safetensors index: 8,030,261,248 params; peft r=8 on all 7 linears: 20,971,520
    assert param_counts(LLAMA3_8B)["total"] == 8_030_261_248
    assert lora_param_count(LLAMA3_8B, 8, LLAMA_TARGETS) == 20_971_520
    # Qwen2.5-0.5B (tied, qkv bias): 494,032,768 on its model card ("0.49B")
    assert param_counts(KNOWN_SHAPES["Qwen/Qwen2.5-0.5B"])["total"] == 494_032_768


def test_counts_match_a_real_peft_model():
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=8, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                      intermediate_size=16, vocab_size=10, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    assert model.num_parameters() == param_counts(shape_from_hf_config(cfg.to_dict(), "x"))["total"]
    lora = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=list(LLAMA_TARGETS)))
    trainable = [p for p in lora.parameters() if p.requires_grad]
    assert sum(p.numel() for p in trainable) == 512
    assert {p.dtype for p in trainable} == {torch.float32}  # autocast_adapter_dtype=True upcasts bf16 adapters


# ------------------------------------------------------------------------------------------------------ bytes
def test_weight_bytes_per_precision():
    assert estimate(tiny_inputs(weight_dtype="bfloat16")).persistent["base weights"] == 1352 * 2
    assert estimate(tiny_inputs(weight_dtype="float16")).persistent["base weights"] == 1352 * 2
    assert estimate(tiny_inputs(weight_dtype="float32")).persistent["base weights"] == 1352 * 4
    # nf4 + double quant: 0.5 + (8/64 + 32/16384)/8 = 0.515869140625 B/param on the 1152 linear params = 594.28;
    # the 200 other params are upcast to fp32 by prepare_model_for_kbit_training: 800 → 1394
    assert estimate(tiny_inputs(load_in_4bit=True)).persistent["base weights"] == 1394
    # without double quant: 0.5 + (32/64)/8 = 0.5625 → 648 + 800
    assert estimate(tiny_inputs(load_in_4bit=True, double_quant=False)).persistent["base weights"] == 1448


def test_lora_states_are_fp32():
    p = estimate(tiny_inputs()).persistent
    assert p["LoRA params (fp32)"] == p["LoRA grads (fp32)"] == 512 * 4
    assert p["AdamW states (2× fp32)"] == 512 * 8


def test_full_finetune_keeps_a_frozen_copy_grads_and_states_in_param_dtype():
    p = estimate(tiny_inputs(lora=False)).persistent
    assert p["reference copy (frozen)"] == p["base weights"] == 1352 * 2
    assert p["grads"] == 1352 * 2
    assert p["AdamW states (2× bfloat16)"] == 1352 * 4   # torch AdamW: exp_avg, exp_avg_sq = zeros_like(param)


def test_generation_bytes_by_hand():
    g = estimate(tiny_inputs()).phases["generation"]
    # KV cache: 3 seqs × (5 + 3) tokens × 2 layers × 2 (K and V) × kvo 4 × 2 bytes = 768; torch.cat copies 1 layer: 384
    assert g["KV cache"] == 768 and g["KV cache growth (torch.cat of 1 layer)"] == 384
    # prefill peak of one layer, adapter on: 15 tokens × (2·2·8 + 2·2·16 + 8·16) = 15 × 224
    assert g["prefill temporaries (1 layer)"] == 3360
    assert g["sampling logits (last position)"] == 3 * 10 * (2 + 8)


def test_logits_bytes_by_hand():
    x = tiny_inputs()
    # logits_to_keep: 2 seqs × (3 + 1) kept × V 10 × 2 B = 160; chunk min(2·3 rows, 512) × 10 × 4 B × 2 temporaries =
    # 480
    assert logit_bytes(x, 2, copies=1) == (160, 480)
    assert logit_bytes(x, 2, copies=2)[0] == 320                                   # training: logits + their grad
    assert logit_bytes(tiny_inputs(logits_to_keep=False), 2, copies=1)[0] == 320   # all 8 positions
    assert logit_bytes(tiny_inputs(logsoftmax_chunk_rows=4), 2, copies=1)[1] == 4 * 10 * 4 * 2


def test_activation_bytes_by_hand():
    # per token per layer, bf16 LoRA on all 7, r=2, no dropout, SDPA:
    #   common: norms 2·4·8 = 64, SDPA q,k,v,out 2·(2·8 + 2·4) = 48, lse 4·2 = 8, SwiGLU 3·2·16 = 96 → 216
    #   LoRA: fp32 input copies 4·(6·8 + 16) = 256, lora_A outputs 7·4·2 = 56 → 312;   total 528
    # micro-batch tokens 2 × 8 = 16; no checkpointing: 2 layers × 16 × 528 = 16896
    # backward temporaries of one layer: 16 × (2·2·8 + 3·2·16 + 4·16) = 16 × 192 = 3072 (> the logits moment here)
    assert estimate(tiny_inputs()).phases["training"] == {"saved activations (all layers)": 16896,
                                                          "layer backward temporaries": 3072,
                                                          "allocator slack (0%)": 0}
    ck = estimate(tiny_inputs(grad_checkpointing=True)).phases["training"]
    assert ck["checkpointed layer inputs"] == 2 * 16 * 2 * 8    # L × tokens × 2 B × h
    assert ck["one layer recomputed"] == 16 * 528
    # dropout adds a 1-byte mask per input element of each target: 16 × 2 × (6·8 + 16) = 2048
    drop = estimate(tiny_inputs(lora_dropout=0.1)).phases["training"]["saved activations (all layers)"]
    assert drop - 16896 == 2048


def test_training_takes_the_larger_moment():
    # with V = 1000 the logits moment wins: saved 16896 + final norm 16·4·8 = 512 + logits 2·4·1000·2·2 = 32000
    # + chunk 6·1000·4·2 = 48000 = 97408 > the layer moment 16896 + 3072
    t = estimate(tiny_inputs(shape=replace(TINY, vocab=1000))).phases["training"]
    assert (t["final norm"], t["logits + grad"], t["log-softmax chunk (fp32)"]) == (512, 32000, 48000)
    assert sum(t.values()) == 97408


def test_fused_head_bytes_by_hand():
    # V = 1000, 2 seqs × 3 new tokens = 6 rows: final hidden 6·8·2 B = 96; one chunk min(6, 512) · 1000 · (3·4 + 2)
    # = 84000 instead of the logits + grad (32000) and the fp32 log-softmax chunk (48000)
    x = tiny_inputs(shape=replace(TINY, vocab=1000), fused_head=True)
    t = estimate(x).phases["training"]
    assert t == {"saved activations (all layers)": 16896, "final norm": 512, "final hidden states": 96,
                 "fused head chunk": 84000, "allocator slack (0%)": 0}
    assert estimate(x).phases["ref/old pass"] == {"final hidden states": 96, "fused head chunk": 84000,
                                                  "allocator slack (0%)": 0}


def test_shared_prompt_tokens_by_hand():
    # K = 2, 2 seqs per micro-batch = 1 group: 1·5 prompt + 2·3 completion = 11 tokens instead of 2·8 = 16;
    # saved 2 layers × 11 × 528 = 11616; the prompt's KV repeated: 2 seqs · 5 · 2 layers · 2 · kvo 4 · 2 B = 320;
    # backward temporaries 11 × 192 = 2112 (the layer moment, 14048, still wins over the logits moment, 13088)
    x = tiny_inputs(k=2, shared_prompt=True)
    assert pass_tokens(x, 2) == 11 and pass_tokens(tiny_inputs(k=2), 2) == 16
    assert estimate(x).phases["training"] == {"saved activations (all layers)": 11616,
                                              "prompt KV repeated K times (all layers)": 320,
                                              "layer backward temporaries": 2112, "allocator slack (0%)": 0}
    # with checkpointing: layer inputs 2 × 11 × 2 B × 8 = 352, the prompt cache of 1 group 1·5·2 layers·16 = 160 for
    # every layer, one layer recomputed 11 × 528 = 5808 with its repeat 2·5·16 = 160, backward temporaries 2112
    assert estimate(tiny_inputs(k=2, shared_prompt=True, grad_checkpointing=True)).phases["training"] == {
        "checkpointed layer inputs": 352, "prompt KV cache (one copy per group)": 160, "one layer recomputed": 5808,
        "layer backward temporaries": 2112, "prompt KV repeated K times (1 layer)": 160, "allocator slack (0%)": 0}
    # the 8B seed config without checkpointing: 8 × 608 tokens → 2 × 512 + 8 × 96 per micro-batch
    full, shared = estimate(llama_inputs(grad_checkpointing=False)), estimate(
        llama_inputs(grad_checkpointing=False, shared_prompt=True))
    ratio = (shared.phases["training"]["saved activations (all layers)"] /
             full.phases["training"]["saved activations (all layers)"])
    assert ratio == pytest.approx((2 * 512 + 8 * 96) / (8 * 608))


def test_reference_pass_only_when_needed():
    assert "ref/old pass" not in estimate(tiny_inputs(ref_pass=False, mu=1)).phases
    assert "ref/old pass" in estimate(tiny_inputs(ref_pass=False, mu=2)).phases
    assert "ref/old pass" in estimate(tiny_inputs(ref_pass=True)).phases
    # LoRA: the reference is the adapter-disabled base: no second copy of the weights
    assert "reference copy (frozen)" not in estimate(tiny_inputs()).persistent


# ------------------------------------------------------------------------------------------------ phase model
def test_peak_is_max_over_phases_not_sum():
    est = estimate(llama_inputs())
    totals = {p: est.total(p) for p in est.phases}
    assert est.peak_bytes == max(totals.values())
    everything = sum(est.persistent.values()) + sum(sum(d.values()) for d in est.phases.values())
    assert est.peak_bytes < everything
    # a huge generation batch with a tiny micro-batch moves the peak to generation
    gen_heavy = estimate(llama_inputs(gen_batch_seqs=256, micro_batch_seqs=1))
    assert gen_heavy.peak_phase == "generation"
    assert estimate(llama_inputs(grad_checkpointing=False)).peak_phase == "training"


@pytest.mark.parametrize("ckpt,phase,measured_gib", [
    (True, "generation", 18.02 + 0.75), (True, "ref/old pass", 15.98 + 0.75), (True, "training", 18.69 + 0.75),
    (False, "training", 64.49 + 0.75),
])
def test_matches_the_h100_measurement(ckpt, phase, measured_gib):
    # Random-weight Llama-3-8B shape on one H100 (torch 2.11, transformers 5.17, peft 0.21), 2nd RL step: peak
    # torch.cuda.max_memory_allocated per phase + 0.75 GiB context (NVML − reserved); docs/MEMORY.md "Measured".
    est = estimate(llama_inputs(grad_checkpointing=ckpt, allocator_slack=0.0))
    assert est.total(phase) / GIB == pytest.approx(measured_gib, rel=0.03)


def test_seed_config_numbers_make_sense():
    lora = estimate(llama_inputs())
    assert 14.9 < lora.persistent["base weights"] / GIB < 15.0           # 8.03e9 × 2 B = 14.96 GiB
    assert fits(lora, 40)
    assert not fits(estimate(llama_inputs(grad_checkpointing=False)), 40)
    qlora = estimate(llama_inputs(load_in_4bit=True))
    assert qlora.persistent["base weights"] < lora.persistent["base weights"] / 2
    # full fine-tuning: weights + frozen copy + grads + AdamW (bf16) = 8 B/param ≈ 60 GiB before activations
    assert not fits(estimate(llama_inputs(lora=False)), 80)


# ------------------------------------------------------------------------------------------------------ fixes
def _peak_of(line):
    return float(re.search(r"peak ([\d.]+) GiB", line).group(1))


def test_cheapest_fixes_really_fit_and_start_with_checkpointing():
    x = llama_inputs(grad_checkpointing=False)
    fixes = cheapest_fixes(x, 40, n=3)
    assert len(fixes) >= 2
    assert fixes[0].startswith("gradient checkpointing on")
    assert all(_peak_of(f) <= 40 for f in fixes)
    # the first one, re-derived independently
    assert _peak_of(fixes[0]) == pytest.approx(estimate(llama_inputs()).peak_bytes / GIB, abs=0.05)


def test_cheapest_fixes_empty_when_it_fits_or_nothing_can():
    assert cheapest_fixes(llama_inputs(), 40) == []
    assert cheapest_fixes(llama_inputs(lora=False), 16) == []   # 8B full FT cannot fit 16 GiB with these knobs


def test_format_table_lists_parts_and_verdict():
    text = format_table(estimate(llama_inputs()), 40)
    for part in ("base weights", "KV cache", "one layer recomputed", "PEAK (training)", "FITS on a 40.0 GiB GPU"):
        assert part in text
    assert "DOES NOT FIT" in format_table(estimate(llama_inputs(grad_checkpointing=False)), 40)


# ------------------------------------------------------------------------------------------------------ shapes
def test_shape_from_hf_config_and_lookup():
    d = {"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
         "intermediate_size": 8192, "vocab_size": 128256, "tie_word_embeddings": True, "head_dim": 64,
         "model_type": "llama"}
    assert shape_from_hf_config(d, "meta-llama/Llama-3.2-1B") == KNOWN_SHAPES["meta-llama/Llama-3.2-1B"]
    assert lookup_known_shape("META-LLAMA/meta-llama-3-8b-instruct") is LLAMA3_8B
    assert lookup_known_shape("nobody/nothing") is None
    with pytest.raises(ValueError, match="hidden_size"):
        shape_from_hf_config({"model_type": "t5"}, "t5")


# ------------------------------------------------------------------------------------------------------ CLI
def _cfg_stand_in(**model_kw):
    model = dict(name="meta-llama/Meta-Llama-3-8B-Instruct", dtype="auto", lora=True, lora_r=8, lora_dropout=0.05,
                 lora_target_modules=list(LLAMA_TARGETS), load_in_4bit=False, gradient_checkpointing=True,
                 attn_implementation="auto")
    ns = types.SimpleNamespace
    return ns(model=ns(**{**model, **model_kw}), rollout=ns(k=4, max_new_tokens=96), data=ns(max_prompt_tokens=512),
              train=ns(prompts_per_micro_step=2, grad_accum=2), loss=ns(mu=1), kl_enabled=True)


def test_inputs_from_config_stand_in():
    from grpo.run.assembly.memory_inputs import inputs_from_config

    x = inputs_from_config(_cfg_stand_in())
    assert (x.micro_batch_seqs, x.gen_batch_seqs, x.prompt_len, x.new_tokens) == (8, 16, 512, 96)
    assert x.weight_dtype == "bfloat16" and x.ref_pass and x.lora and x.shape is LLAMA3_8B
    assert inputs_from_config(_cfg_stand_in(), (7, 5)).weight_dtype == "float16"   # auto on a T4
    assert x.fused_head and not x.shared_prompt  # the fused head by default; the stand-in predates shared prompts
    assert inputs_from_config(_cfg_stand_in(shared_prompt_forward="auto", gradient_checkpointing=False)).shared_prompt
    assert inputs_from_config(_cfg_stand_in(shared_prompt_forward="auto")).shared_prompt  # checkpointing too
    assert not inputs_from_config(_cfg_stand_in(shared_prompt_forward="off",
                                                gradient_checkpointing=False)).shared_prompt
    with pytest.raises(ValueError, match="Known names"):
        inputs_from_config(_cfg_stand_in(name="nobody/nothing"))


def test_shape_from_local_folder(tmp_path):
    from grpo.run.assembly.memory_inputs import resolve_shape

    (tmp_path / "config.json").write_text('{"hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2, '
                                          '"num_key_value_heads": 1, "intermediate_size": 16, "vocab_size": 10}')
    shape = resolve_shape(types.SimpleNamespace(name=str(tmp_path)))
    assert param_counts(shape)["total"] == 1352


def _run(*args):
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    return subprocess.run([sys.executable, str(ROOT / "check_gpu_memory.py"), *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=120)


def test_cli_estimate_for_the_seed_preset():
    if not (ROOT / "grpo/config/__init__.py").exists():
        pytest.skip("grpo/config/__init__.py (the integrator's Config) is not there yet")
    out = _run("--estimate", "--preset", "llama3-8b-dual", "--gpu", "a100-40",
               "--set", "model.gradient_checkpointing=false", "--set", "model.shared_prompt_forward=off")
    assert out.returncode == 0, out.stderr
    assert "ESTIMATE for meta-llama/Meta-Llama-3-8B-Instruct" in out.stdout
    assert "DOES NOT FIT on a 39.6 GiB GPU" in out.stdout
    assert "1. gradient checkpointing on" in out.stdout
    # with shared prompts (auto, on once checkpointing is off) the activations shrink enough to fit
    shared = _run("--estimate", "--preset", "llama3-8b-dual", "--gpu", "a100-40",
                  "--set", "model.gradient_checkpointing=false")
    assert "FITS on a 39.6 GiB GPU" in shared.stdout and "prompt KV repeated K times" in shared.stdout


def test_cli_live_mode():
    torch = pytest.importorskip("torch")
    out = _run()
    assert out.returncode == 0, out.stderr
    if torch.cuda.is_available():   # GPU host: NVML lists the cards (needs nvidia-ml-py)
        assert "GPU 0 " in out.stdout or "pip install nvidia-ml-py" in out.stdout
    else:
        assert "No CUDA GPU visible (torch.cuda.is_available() is False); nothing to report." in out.stdout


def test_the_installed_commands_name_importable_callables():
    """pyproject.toml's [project.scripts] (what `pip install .` puts on PATH: `grpo-dual`, `grpo-check-gpu-memory`)
    each name a function that imports; the memory tool's is the one the root check_gpu_memory.py runs."""
    import importlib

    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["grpo-check-gpu-memory"] == "grpo.run.assembly.gpu_memory_check:check_gpu_memory"
    for name, target in scripts.items():
        module, _, attr = target.partition(":")
        assert callable(getattr(importlib.import_module(module), attr)), f"{name} = {target!r} is not a callable"
    shim = (ROOT / "check_gpu_memory.py").read_text()
    assert "from grpo.run.assembly.gpu_memory_check import check_gpu_memory" in shim


def test_the_root_script_still_runs():
    """Users know `python check_gpu_memory.py` by name: it stays, a thin wrapper of the installed command."""
    out = _run("--help")
    assert out.returncode == 0, out.stderr
    assert "--estimate" in out.stdout and "grpo-check-gpu-memory" in out.stdout
    bad = _run("--preset", "demo")
    assert bad.returncode == 2
    assert "--preset/--config/--gpu/--gpu-mem/--set and config flags need --estimate" in bad.stderr


# ------------------------------------------------------------------------------------------ the graph engine
def test_graph_generation_bytes_by_hand():
    """The graph engine (grpo/decoding/graph_decode.py): the rollout's slot (KV buffers of the bucketed prompt + new
    tokens, the next-token logits, the per-row buffers), the slots it keeps between rollouts, the prefill's cache of
    the distinct prompts, their one-layer temporaries, the step's sampler temporaries, and the folded LoRA copy only
    when asked."""
    x = tiny_inputs(graph_decode=True, k=3, graph_kept_bytes=0.0)
    slot = graph_slot_bytes(x)
    # 3 rows × (5 → 64 bucketed + 3) columns × 2 layers × 2 (K and V) × kvo 4 × 2 bytes
    assert slot["KV buffers"] == 3 * 67 * 2 * 2 * 4 * 2
    assert slot["next-token logits"] == 3 * 10 * 2 and slot["penalty buffers"] == 0
    # int64: tokens out 3 × 3, next / position / key 3 each, the 67 column indices, t / n / count, 1 stop id; bool:
    # the 3 × 67 attended columns and the 3 running rows
    assert slot["per-row buffers"] == 8 * (9 + 9 + 67 + 3 + 1) + 3 * 67 + 3
    penalised = graph_slot_bytes(tiny_inputs(graph_decode=True, repetition_penalty=True, count_penalties=True))
    assert penalised["penalty buffers"] == 3 * 10 * (1 + 4)  # a bool of the seen tokens, fp32 counts
    g = estimate(x).phases["generation"]
    assert g["rollout buffers (bucketed KV, logits)"] == sum(slot.values())
    assert "kept buffers of other shapes" not in g
    # one distinct prompt (3 rows, K 3) of 5 tokens, all layers; its prefill's one-layer peak over 5 tokens
    assert g["prefill cache (distinct prompts)"] == 1 * 5 * 2 * 2 * 4 * 2
    assert g["prefill temporaries (1 layer)"] == 5 * 224
    # 4 fp32 temporaries and the hash's int64 bits per row and vocabulary entry
    assert g["graph pool (sampler temporaries)"] == 3 * 10 * (4 * 4 + 8)
    assert "folded LoRA weights (rollout copy)" not in g
    assert "kept decoding buffers (graph engine)" not in estimate(x).phases["training"]
    kept = estimate(replace(x, graph_kept_bytes=2.5 * sum(slot.values())))
    assert kept.phases["training"]["kept decoding buffers (graph engine)"] == 2.5 * sum(slot.values())
    assert kept.phases["generation"]["kept buffers of other shapes"] == 1.5 * sum(slot.values())
    folded = estimate(tiny_inputs(graph_decode=True, k=3, fold_lora=True)).phases["generation"]
    # every adapted linear once more, in the weights' dtype: the 1152 decoder linear parameters × 2 bytes
    assert folded["folded LoRA weights (rollout copy)"] == 1152 * 2
    qlora = estimate(tiny_inputs(graph_decode=True, fold_lora=True, load_in_4bit=True)).phases["generation"]
    assert "folded LoRA weights (rollout copy)" not in qlora  # 4-bit weights are not folded


def test_the_graph_engine_keeps_what_the_peak_leaves_free():
    """The rollout's slot kept between rollouts only where it does not raise the step's estimated peak. The reference
    setup peaks in training (20.4 GiB against generation's 18.7): it keeps none. With 2 sequences a micro-batch
    training drops to 17.7 GiB, and what generation's peak leaves over it, 18.7 − 17.7 = 1.0 GiB, is less than one
    1.19 GiB slot: none. With 32 rows generating, generation (20.7) is far above every other phase: the rollout's
    2.38 GiB stay."""
    def budget_gib(**kw):
        return graph_cache_budget(llama_inputs(graph_decode=True, **kw)) / GIB

    assert budget_gib() == 0 and budget_gib(micro_batch_seqs=2) == 0
    big = llama_inputs(graph_decode=True, micro_batch_seqs=2, gen_batch_seqs=32)
    assert graph_cache_budget(big) == sum(graph_slot_bytes(big).values()) == pytest.approx(2.38 * GIB, rel=0.01)
    for x in [llama_inputs(graph_decode=True, **kw)
              for kw in ({}, {"micro_batch_seqs": 2}, {"grad_checkpointing": False})] + [big]:
        assert estimate(x).peak_bytes <= estimate(replace(x, graph_kept_bytes=0.0)).peak_bytes * (1 + 1e-9)


@pytest.mark.parametrize("settings", [{}, {"repetition_penalty": 1.2, "presence_penalty": 0.3,
                                           "stop_strings": ("\n\n",)}])
def test_the_estimators_graph_slot_is_what_the_engine_allocates(settings):
    """The estimator's kept-slot term equals the bytes the graph engine's `build_state` lays out for the same shape:
    a Llama of a real layout (GQA, head_dim 16), 6 rows of prompts up to 70 tokens (the 128-column bucket), 9 new
    tokens, fp32 and bf16."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from grpo.config import RolloutConfig
    from grpo.decoding import graph_decode as G
    from grpo.models.tokens import left_pad
    from grpo.run.assembly.memory_inputs import inputs_from_config

    config = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    rollout = RolloutConfig(k=3, max_new_tokens=9, **settings)
    stops = tuple(range(3, 3 + 1 + len(rollout.stop_strings)))  # the end-of-turn id and one per stop string
    rows = [list(range(5, 75)), list(range(5, 75)), list(range(5, 75)), [8, 9], [8, 9], [8, 9]]
    for dtype in (torch.float32, torch.bfloat16):
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype).eval()
        ids_BP, mask_BP = left_pad(rows, 0, multiple_of=G.PROMPT_BUCKET)
        sampling = G.StepSampling(rollout, do_sample=True, stop_ids=stops, pad_id=0)
        with torch.no_grad():
            state = G.build_state(model, ids_BP, mask_BP, torch.arange(6), sampling, 9, [], G.distinct_lists(rows))
        cfg = _cfg_stand_in()
        cfg.rollout = rollout
        cfg.train.prompts_per_micro_step, cfg.train.grad_accum, cfg.data.max_prompt_tokens = 2, 1, 70
        x = replace(inputs_from_config(cfg), shape=shape_from_hf_config(config.to_dict()), lora=False,
                    weight_dtype="float32" if dtype == torch.float32 else "bfloat16")
        assert x.gen_batch_seqs == 6 and x.graph_decode
        assert sum(graph_slot_bytes(x).values()) == G.state_bytes(state), (dtype, graph_slot_bytes(x))


def test_fold_auto_folds_only_where_the_peak_stays():
    """rollout.fold_lora=auto on a GPU: Llama-3-8B's 13 GiB copy would raise the seed config's peak, so it is not
    folded; a 2-layer LoRA model's copy fits under its training peak, so it is; the estimate follows the choice,
    and rollout.fold_lora=off is a fix the estimator offers."""
    from grpo.run.assembly.memory_inputs import fold_keeps_peak, inputs_from_config, lora_fold_choice

    keeps, without, folded = fold_keeps_peak(llama_inputs(graph_decode=True))
    copy = estimate(llama_inputs(graph_decode=True, fold_lora=True)).phases["generation"][
        "folded LoRA weights (rollout copy)"]
    assert copy / GIB == pytest.approx(13.0, abs=0.05)  # the 7 linears of 32 layers, 6.98e9 parameters × 2 bytes
    assert not keeps and folded > without + 10
    assert fold_keeps_peak(tiny_inputs(graph_decode=True, micro_batch_seqs=8))[0]
    cfg = _cfg_stand_in()
    cfg.rollout.fold_lora = "auto"
    fold, why = lora_fold_choice(cfg, (9, 0))
    assert not fold and "raise the step's estimated peak" in why
    assert not inputs_from_config(cfg).fold_lora
    cfg.rollout.fold_lora = "on"
    x = inputs_from_config(cfg)
    assert x.graph_decode and x.fold_lora
    fixes = cheapest_fixes(x, 30, n=3)
    assert fixes and fixes[0].startswith("rollout.fold_lora=off") and _peak_of(fixes[0]) < 30
    cfg.rollout.engine = "lean"
    assert not inputs_from_config(cfg).graph_decode and not inputs_from_config(cfg).fold_lora
