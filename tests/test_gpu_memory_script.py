"""benchmarks/gpu_memory.py on CPU (--tiny) and the random:<shape> models it measures (grpo/models/modeling.py).

Parameter counts are worked out by hand from the shapes (or are the models' published counts), never read back from
the code under test.
"""

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import ROOT
from conftest import load_script as _load

from grpo.config import ModelConfig
from grpo.models.modeling import RANDOM_PREFIX, build_tiny_tokenizer, load_policy, random_model_config

TINY = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 1024, "tie_word_embeddings": False}
# per layer: q 64·64 + k 64·32 + v 64·32 + o 64·64 + gate/up/down 3·64·128 = 36,864; 2 layers = 73,728;
# norms 2 layers · 2 · 64 = 256; embeddings + untied head 2 · 1024 · 64 = 131,072; final norm 64
TINY_PARAMS = 73_728 + 256 + 131_072 + 64
# LoRA r=8 on all seven linears: Σ (in·8 + 8·out) per layer = 1024 + 768 + 768 + 1024 + 1536 + 1536 + 1536 = 8,192
TINY_LORA_PARAMS = 2 * 8_192




def shape_dir(tmp_path, **changes):
    folder = tmp_path / "shape"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**TINY, **changes}))
    return str(folder)


def test_tiny_run_writes_the_table_and_json(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")  # a 64-wide model gains nothing from threads on a shared CPU
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_memory", "--tiny", "--cases",
                           "tiny-lora", "--steps", "1", "--warmup", "0", "--out", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    header = (tmp_path / "results.md").read_text().splitlines()[0]
    for column in ("case", "measured peak allocated GiB", "reserved GiB", "estimated GiB", "error %", "s/step",
                   "gen s", "train s"):
        assert f"| {column} |" in header
    assert "| tiny-lora |" in proc.stdout  # the table is printed too
    (r,) = json.loads((tmp_path / "results.json").read_text())
    assert r["status"] == "ok"
    assert r["params_numel"] == TINY_PARAMS + TINY_LORA_PARAMS and r["trainable_numel"] == TINY_LORA_PARAMS
    assert r["estimate"]["params"] == {"base": TINY_PARAMS, "trainable": TINY_LORA_PARAMS}
    assert r["completion_len_mean"] == 16  # min_new_tokens = max_new_tokens forces full-length completions
    assert r["estimate"]["inputs"]["prompt_len"] == r["prompt_len"] > 87  # the system filler alone is ~87 tokens
    t = r["timing_s"]
    parts = t["time/generate"] + t["time/reward"] + t["time/old_logps"] + t["time/ref_logps"] + t["time/update"]
    assert t["time/step"] > 0 and parts == pytest.approx(t["time/step"], abs=1e-6)
    assert r["gpu"] == "cpu" and "peak_allocated_gib" not in r  # --tiny runs on the CPU: no allocator peaks


def test_random_llama_shape_builds_the_requested_model(tmp_path):
    policy = load_policy(ModelConfig(name=RANDOM_PREFIX + shape_dir(tmp_path)), dtype="float32", seed=3, device="cpu")
    model, tok = policy.model, policy.tokenizer
    c = model.config
    assert type(model).__name__ == "LlamaForCausalLM"
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.intermediate_size,
            c.vocab_size) == (64, 2, 4, 2, 128, 1024)
    assert sum(p.numel() for p in model.parameters()) == TINY_PARAMS
    assert c.pad_token_id == tok.pad_token_id and model.generation_config.eos_token_id == tok.eos_token_id
    assert len(tok) < 1024  # the tiny tokenizer is smaller than the shape's vocab, as for real shapes
    logits = model(input_ids=torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, 1024) and torch.isfinite(logits).all()


def test_random_qwen_like_shape_has_biases_and_tied_head(tmp_path):
    folder = shape_dir(tmp_path, model_type="qwen2", tie_word_embeddings=True)
    policy = load_policy(ModelConfig(name=RANDOM_PREFIX + folder), dtype="float32", device="cpu")
    assert type(policy.model).__name__ == "Qwen2ForCausalLM"
    # q/k/v biases 64 + 32 + 32 per layer; the head shares the embedding (1024 · 64 once)
    assert sum(p.numel() for p in policy.model.parameters()) == 73_728 + 2 * 128 + 256 + 1024 * 64 + 64


@pytest.mark.parametrize("name, published", [
    ("random:meta-llama/meta-llama-3-8b-instruct", 8_030_261_248),  # Meta-Llama-3-8B model card: 8.03B
    ("random:Qwen/Qwen2.5-0.5B-Instruct", 494_032_768),  # Qwen2.5-0.5B model card: 0.49B
])
def test_known_shapes_match_the_published_parameter_counts(name, published):
    from transformers import AutoModelForCausalLM

    config = random_model_config(name, build_tiny_tokenizer())
    with torch.device("meta"):  # shapes only: nothing is allocated
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    assert sum(p.numel() for p in model.parameters()) == published


def test_unknown_or_too_small_shapes_are_refused(tmp_path):
    tok = build_tiny_tokenizer()
    with pytest.raises(ValueError, match="Meta-Llama-3-8B-Instruct"):  # the error lists the known names
        random_model_config("random:nobody/no-such-model", tok)
    with pytest.raises(ValueError, match="vocab 100 is smaller"):
        random_model_config(RANDOM_PREFIX + shape_dir(tmp_path, vocab_size=100), tok)


def test_error_percentages_and_missing_numbers():
    gm = _load("benchmarks/gpu_memory.py")
    r = {"case": "x", "status": "ok", "peak_allocated_gib": 9.0, "peak_reserved_gib": 9.5, "cuda_context_gib": 0.5,
         "estimate": {"peak_gib": 11.0, "peak_without_slack_gib": 10.5}}
    d = gm.derived(r)
    assert d["error_pct"] == pytest.approx(10.0)  # 11 vs 9.5 + 0.5
    assert d["alloc_error_pct"] == pytest.approx(100 / 9.5)  # 10.5 vs 9.0 + 0.5
    table = gm.format_markdown([r, {"case": "y", "status": "skipped", "error": "no bitsandbytes"}])
    assert "| x | 9.00 | 9.50 | 11.00 | +10.0 |" in table
    assert "| y | n/a | n/a | n/a | n/a | n/a | n/a | n/a | skipped: no bitsandbytes |" in table
