"""Tiny model and tokenizer, policy loading (full / LoRA), the reference policy, saving, and mode switches."""

import pytest
import torch

from grpo.config import ConfigError, ModelConfig
from grpo.models.modeling import (
    TINY_NAME,
    build_tiny_model,
    build_tiny_tokenizer,
    generation_mode,
    inference_mode,
    load_policy,
    reference,
    save_pretrained,
)
from grpo.models.tokens import encode_prompt

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
CORPUS = ["the answer is yes", "the answer is no", "who was more likely to forget the keys?"] * 5
SIZES = {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2}


def tiny(**kw) -> ModelConfig:
    """The model section of the tiny model of SIZES (key-value heads: half the heads)."""
    return ModelConfig(name=TINY_NAME, tiny_hidden=64, tiny_layers=2, tiny_heads=4, **kw)


def logits_of(model, ids):
    with inference_mode(model):
        return model(input_ids=ids).logits


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer(CORPUS, vocab_size=300)


@pytest.fixture(scope="module")
def ids(tok):
    return torch.tensor([encode_prompt(tok, [{"role": "user", "content": "who forgot the keys?"}])])


def test_tokenizer_round_trips_through_save_and_auto_load(tok, tmp_path):
    from transformers import AutoTokenizer

    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    text = "Ünïcode 😀 and the answer is yes"
    assert loaded(text)["input_ids"] == tok(text)["input_ids"]
    assert loaded.decode(tok(text)["input_ids"]) == text  # byte-level BPE: any text round-trips
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "q"}]
    assert encode_prompt(loaded, messages) == encode_prompt(tok, messages)
    assert (loaded.pad_token, loaded.eos_token) == ("<|pad|>", "<|end|>")
    assert (loaded.pad_token_id, loaded.eos_token_id) == (tok.pad_token_id, tok.eos_token_id)


def test_tiny_model_takes_special_ids_and_seed(tok):
    a = build_tiny_model(tok, seed=1, **SIZES)
    b = build_tiny_model(tok, seed=1, **SIZES)
    c = build_tiny_model(tok, seed=2, arch="qwen2", **SIZES)
    assert type(a).__name__ == "LlamaForCausalLM" and type(c).__name__ == "Qwen2ForCausalLM"
    assert (a.config.pad_token_id, a.config.eos_token_id) == (tok.pad_token_id, tok.eos_token_id)
    assert a.config.vocab_size == len(tok)
    assert torch.equal(a.model.embed_tokens.weight, b.model.embed_tokens.weight)
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)


def test_tiny_model_rejects_bad_head_sizes(tok):
    with pytest.raises(ValueError, match="must divide"):
        build_tiny_model(tok, seed=0, hidden=64, heads=3, kv_heads=1)


def module_state(model):
    return ({n: m.training for n, m in model.named_modules()},
            {n: m.gradient_checkpointing for n, m in model.named_modules() if hasattr(m, "gradient_checkpointing")},
            model.config.use_cache, model.generation_config.use_cache)


def test_generation_mode_restores_train_cache_and_checkpointing_exactly(tok):
    policy = load_policy(tiny(gradient_checkpointing=True), tiny_corpus=CORPUS)
    model = policy.model
    model.model.layers[1].eval()  # a mixed state must come back as it was, not as a blanket train()
    before = module_state(model)
    assert before[2] is False and any(before[1].values())
    with generation_mode(model):
        assert not any(m.training for m in model.modules())
        assert model.config.use_cache is True and model.generation_config.use_cache is True
        assert not any(m.gradient_checkpointing for m in model.modules() if hasattr(m, "gradient_checkpointing"))
        assert torch.is_grad_enabled()
    assert module_state(model) == before
    with pytest.raises(RuntimeError, match="boom"), inference_mode(model):
        assert model.config.use_cache is False and not torch.is_grad_enabled()
        raise RuntimeError("boom")
    assert module_state(model) == before  # restored on an exception too


def test_full_finetuning_reference_is_a_frozen_copy(ids):
    policy = load_policy(tiny(lora=False), tiny_corpus=CORPUS)
    ref = policy.ref_model
    assert not policy.is_lora and not ref.training
    assert not any(p.requires_grad for p in ref.parameters())
    assert len(policy.trainable_parameters()) == len(list(policy.model.parameters()))
    before = logits_of(ref, ids).clone()
    optimizer = torch.optim.SGD(policy.trainable_parameters(), lr=1.0)
    policy.model(input_ids=ids).logits.sum().backward()
    optimizer.step()
    with reference(policy) as ref_module:
        assert ref_module is ref
        assert torch.equal(logits_of(ref_module, ids), before)
    assert not torch.allclose(logits_of(policy.model, ids), before)


def lora_policy(**kw):
    return load_policy(tiny(lora=True, lora_r=4, lora_alpha=8, lora_target_modules=["q_proj", "v_proj"], **kw),
                       tiny_corpus=CORPUS)


def perturb_lora_b(model, seed=0):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(torch.randn(p.shape, generator=gen) * 0.5)


def test_lora_reference_is_the_base_with_adapter_disabled(tok, ids):
    policy = lora_policy()
    assert policy.is_lora and policy.ref_model is None
    # q_proj 64→64 and v_proj 64→32 (2 kv heads × 16): r·(in + out) each = 4·128 + 4·96 = 896 per layer, 2 layers
    assert sum(p.numel() for p in policy.trainable_parameters()) == 1792
    base = build_tiny_model(policy.tokenizer, seed=0, **SIZES)  # same seed and tokenizer → the same base weights
    base_logits = logits_of(base, ids)
    assert torch.allclose(logits_of(policy.model, ids), base_logits, atol=1e-6)  # B = 0 at init
    perturb_lora_b(policy.model)
    with reference(policy) as ref_module:
        assert torch.allclose(logits_of(ref_module, ids), base_logits, atol=1e-6)
    assert not torch.allclose(logits_of(policy.model, ids), base_logits, atol=1e-3)  # adapter back on after


def test_lora_with_checkpointing_trains_the_adapter(ids):
    policy = lora_policy(gradient_checkpointing=True)
    policy.model.train()
    policy.model(input_ids=ids).logits.square().mean().backward()
    grads = {n: p.grad for n, p in policy.model.named_parameters() if p.requires_grad}
    assert all(g is not None for g in grads.values())
    # B starts at 0, so dL/dA = 0 at init but dL/dB ≠ 0 for every adapted layer
    assert all(g.abs().sum() > 0 for n, g in grads.items() if "lora_B" in n)


def test_save_and_reload_lora_gives_the_same_logits(ids, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    policy = lora_policy()
    perturb_lora_b(policy.model)
    save_pretrained(policy, tmp_path, include_base=True)
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    reloaded = PeftModel.from_pretrained(base, tmp_path)
    assert torch.allclose(logits_of(reloaded, ids), logits_of(policy.model, ids), atol=1e-6)
    reloaded_tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded_tokenizer("the answer")["input_ids"] == policy.tokenizer("the answer")["input_ids"]


def test_save_and_reload_full_model_gives_the_same_logits(ids, tmp_path):
    from transformers import AutoModelForCausalLM

    policy = load_policy(tiny(), tiny_corpus=CORPUS)
    save_pretrained(policy, tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert torch.allclose(logits_of(reloaded, ids), logits_of(policy.model, ids), atol=1e-6)
    # a saved directory loads back as a policy through the same path as a hub id
    again = load_policy(ModelConfig(name=str(tmp_path), lora=False))
    assert torch.allclose(logits_of(again.model, ids), logits_of(policy.model, ids), atol=1e-6)


def test_qlora_without_cuda_or_bitsandbytes_names_the_fix(tmp_path):
    policy = load_policy(tiny(), tiny_corpus=CORPUS)
    save_pretrained(policy, tmp_path)
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present; the missing-CUDA error cannot be provoked")
    with pytest.raises(ConfigError, match="set model.load_in_4bit=false"):
        load_policy(ModelConfig(name=str(tmp_path), lora=True, load_in_4bit=True))
    with pytest.raises(ConfigError, match="also set model.lora=true"):  # the section refuses it before any load
        load_policy(ModelConfig(name=str(tmp_path), lora=False, load_in_4bit=True))


def test_qlora_on_a_machine_without_it_exits_2_before_any_work(tmp_path, capsys):
    """4-bit on CPU is refused right after the config: exit 2, one line, no run folder, not the right message under
    a full traceback after the data has loaded and the run folder is made."""
    import grpo_train as G

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present; the missing-CUDA error cannot be provoked")
    code = G.cli(["--model.lora", "true", "--model.load_in_4bit", "true", "--output-dir", str(tmp_path / "out"),
                  "--run-name", "r"])
    err = capsys.readouterr().err
    assert code == 2 and "config field `model.load_in_4bit` = True is invalid" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_load_policy_lora_settings_are_the_configs():
    """Regression: load_policy defaulted LoRA r / alpha / dropout to 16 / 32 / 0.0 while the config said 8 / 16 /
    0.05, so a caller relying on either got the other's numbers. load_policy takes the model section itself and
    has no LoRA parameter of its own: the adapter it builds has the section's numbers."""
    import inspect

    assert not [n for n in inspect.signature(load_policy).parameters if n.startswith("lora")]
    section = tiny(lora=True, lora_target_modules=["q_proj"])
    adapter = load_policy(section, tiny_corpus=CORPUS).model.peft_config["default"]
    assert ((adapter.r, adapter.lora_alpha, adapter.lora_dropout, sorted(adapter.target_modules)) ==
            (section.lora_r, section.lora_alpha, section.lora_dropout, ["q_proj"]))
