"""benchmarks/vs_trl.py compares like with like: both configurations do the same work per run.

Hand-worked example used throughout: 3 prompts per micro-step × K 4 × grad_accum 2 → 24 completions per optimizer
step (TRL: per_device_train_batch_size 12 completions × GA 2); 16 forced new tokens → 384 completion tokens per
rollout cycle; 5 cycles at μ = 2 → 10 optimizer steps.
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace

import pytest
from conftest import SHARED_DATA

from benchmarks import common, vs_trl
from grpo import config as C

HAS_TRL = importlib.util.find_spec("trl") is not None and importlib.util.find_spec("datasets") is not None
BASE = {"prompts_per_micro_step": 3, "grad_accum": 2, "k": 4, "max_new_tokens": 16, "cycles": 5}


def configs(name: str):
    spec = vs_trl.scenario(name, BASE)
    ours, trl = vs_trl.build_configs(spec, "/nonexistent/model", "/tmp/out")
    return spec, C.load_config("demo", ours), trl


@pytest.mark.parametrize("name", ["grpo", "gspo"])
def test_same_completions_tokens_and_steps(name):
    spec, cfg, trl = configs(name)
    mu = 1 if name == "grpo" else 2
    # completions per optimizer step: ours counts prompts (× K), TRL counts completions
    assert cfg.seqs_per_step == 24
    assert trl["per_device_train_batch_size"] * trl["gradient_accumulation_steps"] == 24
    assert cfg.micro_batch_seqs == trl["per_device_train_batch_size"] == 12
    # one generation batch per rollout cycle, of the same size
    assert trl["per_device_train_batch_size"] * trl["steps_per_generation"] == cfg.prompts_per_step * cfg.rollout.k
    assert trl["num_generations"] == cfg.rollout.k == 4
    # forced full length on both sides → the same completion tokens
    assert cfg.rollout.min_new_tokens == cfg.rollout.max_new_tokens == 16
    assert trl["max_completion_length"] == trl["generation_kwargs"]["min_new_tokens"] == 16
    assert spec.completions_per_cycle * spec.max_new_tokens == 384
    # μ optimizer steps per cycle; TRL steps_per_generation · num_iterations micro-batches at GA per step
    assert cfg.loss.mu == trl["num_iterations"] == mu
    assert trl["steps_per_generation"] * trl["num_iterations"] // trl["gradient_accumulation_steps"] == mu
    assert cfg.total_updates == trl["max_steps"] == 5 * mu
    # TRL runs an old-log-prob pass iff GA % (steps_per_generation · μ) != 0 (grpo_trainer.py); ours iff μ > 1
    trl_old_pass = trl["gradient_accumulation_steps"] % (trl["steps_per_generation"] * trl["num_iterations"]) != 0
    assert trl_old_pass == (cfg.loss.mu > 1) == (name == "gspo")


@pytest.mark.parametrize("name", ["grpo", "gspo"])
def test_same_loss_kl_and_regime(name):
    spec, cfg, trl = configs(name)
    assert cfg.kl_enabled and cfg.kl_for("fairness").beta == trl["beta"] == 0.04  # both run the reference pass
    assert cfg.kl_for("hallucination").controller == "fixed"  # β never moves, as in TRL
    level = {"grpo": "token", "gspo": "sequence"}[name]
    assert trl["importance_sampling_level"] == level and cfg.loss.policy_loss == name
    assert cfg.loss.agg_mode == "token-mean" and trl["loss_type"] == "dapo"  # Σ m·ℓ / tokens of the whole step
    assert (cfg.loss.clip_low, cfg.loss.clip_high) == (trl["epsilon"], trl["epsilon_high"])
    assert cfg.loss.kl_estimator == "k3"  # TRL's per_token_kl is k3
    assert cfg.rollout.temperature == trl["temperature"] and cfg.loss.adv_scale == trl["scale_rewards"] == "group"
    assert not cfg.model.gradient_checkpointing and not trl["gradient_checkpointing"]
    assert not cfg.model.lora and not trl["mask_truncated_completions"]
    assert cfg.sft.steps == 0 and trl["use_vllm"] is False


def test_steady_state_drops_warmup_cycles():
    # cycles 9 s (warm-up), 2 s, 4 s at μ = 2 with 8 completions per cycle: 6 s / 4 steps; 16 completions / 6 s
    sec, cps = common.steady_state([9.0, 2.0, 4.0], warmup_cycles=1, mu=2, completions_per_cycle=8)
    assert sec == pytest.approx(1.5) and cps == pytest.approx(16 / 6)
    with pytest.raises(ValueError, match="warm-up"):
        common.steady_state([1.0], warmup_cycles=1, mu=1, completions_per_cycle=8)


def test_check_same_work_rejects_a_short_completion():
    spec = vs_trl.scenario("grpo", {**BASE, "cycles": 1})
    good = {"trainer": "trl", "completions": 24, "optimizer_steps": 1, "completion_tokens": 384,
            "min_completion_len": 16, "max_completion_len": 16}
    vs_trl.check_same_work(spec, [good])
    with pytest.raises(RuntimeError, match="min_completion_len"):
        vs_trl.check_same_work(spec, [{**good, "min_completion_len": 15, "completion_tokens": 383}])


@pytest.mark.skipif(not HAS_TRL, reason="trl/datasets not installed (pip install -r requirements/dev.txt)")
def test_trl_config_derives_the_same_generation_batch(tmp_path):
    from trl import GRPOConfig

    _, cfg, trl = configs("gspo")
    args = GRPOConfig(**{**trl, "output_dir": str(tmp_path)})
    assert args.generation_batch_size == cfg.seqs_per_step == 24
    assert args.steps_per_generation == 2 and args.num_iterations == 2


@pytest.mark.skipif(not HAS_TRL, reason="trl/datasets not installed (pip install -r requirements/dev.txt)")
@pytest.mark.slow
def test_real_runs_do_the_same_work(tmp_path):
    # 1 prompt × K 2 × GA 2 = 4 completions of 8 tokens = 32 tokens; 1 cycle at μ = 2 = 2 optimizer steps
    shape = common.Shape(arch="llama", hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64, vocab=None)
    common.build_and_save_model(shape, tmp_path / "model", seed=0, dtype_name="float32")
    spec = replace(vs_trl.scenario("gspo", {"prompts_per_micro_step": 1, "grad_accum": 2, "k": 2,
                                            "max_new_tokens": 8, "cycles": 1}), warmup_cycles=0, demo_size=20)
    ours = vs_trl.run_ours(spec, str(tmp_path / "model"), str(tmp_path / "ours"))
    trl = vs_trl.run_trl(spec, str(tmp_path / "model"), str(tmp_path / "trl"))
    for r, name in ((ours, "ours"), (trl, "trl")):
        assert (r["completions"], r["completion_tokens"], r["optimizer_steps"]) == (4, 32, 2), name
        assert r["min_completion_len"] == r["max_completion_len"] == 8, name
        assert len(r["cycle_times_s"]) == 1, name
    vs_trl.check_same_work(spec, [{**ours, "trainer": "ours"}, {**trl, "trainer": "trl"}])


@pytest.mark.skipif(not HAS_TRL, reason="trl/datasets not installed (pip install -r requirements/dev.txt)")
@pytest.mark.skipif(not (SHARED_DATA / "bbq").is_dir(), reason=f"shared BBQ data not found at {SHARED_DATA / 'bbq'}")
def test_the_long_workload_gives_both_sides_the_same_bbq_contexts(tmp_path):
    """--prompts long: every prompt both trainers see starts with the same system message of real BBQ contexts
    (~LONG_CONTEXT_TOKENS tokens), carried through our config (data.system_prompt) into TRL's rows."""
    args = vs_trl.parse_args(["--prompts", "long", "--scenarios", "grpo"])
    (spec,), _, _ = vs_trl.specs_from_args(args)
    assert len(spec.system_prompt) >= 4 * vs_trl.LONG_CONTEXT_TOKENS and spec.system_prompt.startswith("Background:")
    ours, _ = vs_trl.build_configs(spec, "builtin:tiny", str(tmp_path))
    assert C.load_config("demo", ours).data.system_prompt == spec.system_prompt
    rows = vs_trl.trl_dataset(spec, "builtin:tiny", str(tmp_path))
    assert len(rows) > 0 and all(r["prompt"][0] == {"role": "system", "content": spec.system_prompt} for r in rows)
    short = vs_trl.specs_from_args(vs_trl.parse_args(["--scenarios", "grpo"]))[0][0]
    assert short.system_prompt == "" and all(r["prompt"][0]["role"] == "user"
                                             for r in vs_trl.trl_dataset(short, "builtin:tiny", str(tmp_path)))
