"""Outputs that load anywhere (issue 61, part 3): the model card in output_dir, final/ and each checkpoint-N (the base
model's Hub id, the method, the settings, the results; never peft's "More Information Needed"), the name a user loads
the base by (a packaged model's Hub id, a folder's named Hub id, a bare folder's path), TRL's output_dir/checkpoint-N
folders (the same names as TRL's own GRPOTrainer leaves, loadable with from_pretrained, save_total_limit honoured)
and a resume from checkpoint-N that goes on as one from the exact-resume checkpoint it stands for."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch

from grpo.run.checkpoint.files import CheckpointError, resolve_resume
from grpo.run.checkpoint.model_card import model_card
from grpo.run.checkpoint.model_folder import base_name

TEMPLATE = "More Information Needed"  # peft's empty card template
ROWS = [{"prompt": f"Describe the number {i}."} for i in range(16)]
SMOLLM2_HUB = "HuggingFaceTB/SmolLM2-135M-Instruct"


def reward_len(completions, **kwargs):
    return [-abs(20 - len(c)) for c in completions]


def card(**changes) -> str:
    values = dict(model_id="out", base_model=SMOLLM2_HUB, base_note=None, adapter=True, policy_loss="grpo",
                  agg_mode="token-mean", step=3, what="the final model",
                  data={"caps": {"training rows": 12, "held-out rows": 4, "source": "caps.jsonl"}},
                  settings={"K: completions per prompt (rollout.k)": 8, "learning rate (train.lr)": 1e-05},
                  results={"before_sft": {"caps": 0.25}, "after_rl": {"caps": 0.75}}, verdict="**green**",
                  versions={"grpo-dual": "0.4.0", "torch": "2.13"})
    return model_card(**{**values, **changes})


def test_the_card_names_the_base_the_method_the_settings_the_results_and_cites_the_method():
    text = card()
    front = text.split("---\n")[1]
    assert f"base_model: {SMOLLM2_HUB}" in front and "library_name: peft" in front
    assert "- grpo-dual\n- grpo\n- trl" in front
    assert "trained with grpo-dual's GRPO (loss.policy_loss=grpo, loss.agg_mode=token-mean)" in text
    assert "| K: completions per prompt (rollout.k) | 8 |" in text and "| learning rate (train.lr) | 1e-05 |" in text
    assert "| caps | 12 | 4 | caps.jsonl |" in text
    assert "| task | before_sft | after_rl |" in text and "| caps | 0.25 | 0.75 |" in text
    assert "**green**" in text and "- torch: 2.13" in text
    assert "arXiv:2402.03300" in text and "2507.18071" not in text
    assert 'AutoPeftModelForCausalLM.from_pretrained("out")' in text and TEMPLATE not in text
    gspo = card(policy_loss="gspo", adapter=False, base_model=None, verdict=None, results={})
    assert "grpo-dual's GSPO" in gspo and "arXiv:2507.18071" in gspo and "arXiv:2402.03300" not in gspo
    assert "- gspo\n" in gspo and "library_name: transformers" in gspo and "base_model:" not in gspo
    assert 'AutoModelForCausalLM.from_pretrained("out")' in gspo and "Not known yet" in gspo


def test_the_base_is_named_as_a_user_loads_it(tmp_path, capsys):
    name, note = base_name("smollm2-135m-instruct")
    assert name == SMOLLM2_HUB and "SmolLM2-135M-Instruct.Q4_1.gguf" in note and "dequantized" in note
    named = tmp_path / "named"
    named.mkdir()
    (named / "config.json").write_text(json.dumps({"_name_or_path": "org/model-1b"}))
    assert base_name(str(named)) == ("org/model-1b", None)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": SMOLLM2_HUB}))
    assert base_name(str(adapter))[0] == SMOLLM2_HUB and "dequantized" in base_name(str(adapter))[1]
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text(json.dumps({"_name_or_path": str(bare)}))
    where, note = base_name(str(bare))
    assert where == str(bare.resolve()) and "local folder" in note and "base_model_name_or_path" in note
    assert base_name("builtin:tiny") == (None, None) and base_name("org/name") == ("org/name", None)


# ------------------------------------------------------------------------------------------- TRL-configured runs
@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    """A tiny Llama model folder with a chat template (a bare local folder: its config names no Hub id)."""
    from transformers import LlamaForCausalLM

    from grpo.models.modeling import build_tiny_tokenizer, tiny_model_config

    folder = tmp_path_factory.mktemp("tiny") / "tiny"
    tok = build_tiny_tokenizer([r["prompt"] for r in ROWS] + ["The sky is blue.", "hello world"], vocab_size=300)
    torch.manual_seed(0)
    LlamaForCausalLM(tiny_model_config(len(tok), hidden=32, layers=1, heads=2, kv_heads=1)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def trl_args(out: Path, **fields):
    trl = pytest.importorskip("trl")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return trl.GRPOConfig(output_dir=str(out), **{
            "max_steps": 3, "per_device_train_batch_size": 4, "num_generations": 4, "max_completion_length": 6,
            "use_cpu": True, "report_to": "none", "save_strategy": "steps", "save_steps": 1, "save_total_limit": 2,
            "logging_steps": 1, "gradient_checkpointing": False, **fields})


def ours(out: Path, tiny_folder: Path, peft: bool = False, **kwargs):
    import grpo_train

    lora = None
    if peft:
        from peft import LoraConfig

        lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    return grpo_train.train(["data.eval_size=2"], tasks={"caps": ROWS}, rewards={"caps": [reward_len]},
                            model=str(tiny_folder), args=trl_args(out, **kwargs.pop("fields", {})), peft_config=lora,
                            **kwargs)


def checkpoints(out: Path) -> list[str]:
    return sorted((p.name for p in out.iterdir() if p.name.startswith("checkpoint-")), key=lambda n: int(n[11:]))


@pytest.fixture(scope="module")
def trls_folders(tiny_folder, tmp_path_factory) -> list[str]:
    """The checkpoint folders TRL's own GRPOTrainer leaves on the same config."""
    trl = pytest.importorskip("trl")
    from datasets import Dataset

    out = tmp_path_factory.mktemp("trl") / "out"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = trl.GRPOTrainer(model=str(tiny_folder), reward_funcs=reward_len, args=trl_args(out),
                                  train_dataset=Dataset.from_list(ROWS))
        trainer.train()
    return checkpoints(out)


def test_a_trl_run_leaves_trls_checkpoint_folders_each_loadable_with_its_card(tiny_folder, trls_folders, tmp_path,
                                                                              capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "out"
    run = ours(out, tiny_folder, eval_dataset=ROWS[:2])  # held out: evaluated before and after RL
    assert checkpoints(out) == trls_folders == ["checkpoint-2", "checkpoint-3"]
    for name in trls_folders:
        folder = out / name
        model = AutoModelForCausalLM.from_pretrained(folder)
        assert AutoTokenizer.from_pretrained(folder).vocab_size == run.tokenizer.vocab_size
        state = json.loads((folder / "trainer_state.json").read_text())
        assert state["global_step"] == int(name[11:]) and state["max_steps"] == 3
        assert sorted({row["step"] for row in state["log_history"]}) == list(range(1, int(name[11:]) + 1))
        text = (folder / "README.md").read_text()
        assert TEMPLATE not in text and "grpo-dual's GRPO" in text and f"{name} (RL step {name[11:]})" in text
        assert "library_name: transformers" in text and f"base_model: {tiny_folder.resolve()}" in text
    # the last: final's
    for (n, a), (_, b) in zip(run.policy.model.named_parameters(), model.named_parameters(), strict=True):
        assert torch.equal(a.detach(), b), n
    for folder in (out, run.run_dir / "final"):
        text = (folder / "README.md").read_text()
        after = run.progress.evals["after_rl"]["caps"]
        assert TEMPLATE not in text and "| task | before_sft | after_rl |" in text and f"| {after:.4g} |" in text
        assert f"**{run.report['verdict']}**" in text  # written again once report.json exists
    assert "the base model is the local folder" in capsys.readouterr().err


def test_a_lora_runs_outputs_load_with_auto_peft_and_name_their_base(tiny_folder, tmp_path):
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoTokenizer

    out = tmp_path / "out"
    run = ours(out, tiny_folder, peft=True, fields={"max_steps": 2})
    assert checkpoints(out) == ["checkpoint-1", "checkpoint-2"]
    for folder in (out, out / "checkpoint-2", run.run_dir / "final"):
        config = json.loads((folder / "adapter_config.json").read_text())
        assert config["base_model_name_or_path"] == str(tiny_folder.resolve())
        model = AutoPeftModelForCausalLM.from_pretrained(folder)
        AutoTokenizer.from_pretrained(folder)
        text = (folder / "README.md").read_text()
        assert TEMPLATE not in text and "library_name: peft" in text and "r=4, alpha=8" in text
        trained = {n: p for n, p in run.policy.model.named_parameters() if "lora_B" in n}
        loaded = {n: p for n, p in model.named_parameters() if "lora_B" in n}
        assert trained.keys() == loaded.keys() and all(torch.equal(trained[n].detach(), loaded[n]) for n in trained)


def test_a_resume_from_checkpoint_n_goes_on_as_one_from_step_n(tiny_folder, tmp_path):
    first = ours(tmp_path / "a" / "out", tiny_folder, fields={"save_total_limit": None})
    assert checkpoints(tmp_path / "a" / "out") == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    for copy in ("b", "c"):
        shutil.copytree(tmp_path / "a", tmp_path / copy)
    by_trl = ours(tmp_path / "b" / "out", tiny_folder, fields={"save_total_limit": None},
                  checkpoint={"resume": str(tmp_path / "b" / "out" / "checkpoint-2")})
    exact = ours(tmp_path / "c" / "out", tiny_folder, fields={"save_total_limit": None},
                 checkpoint={"resume": str(tmp_path / "c" / "out" / "grpo-dual" / "checkpoints" / "step_000002")})
    for (n, a), (_, b), (_, c) in zip(first.policy.model.named_parameters(), by_trl.policy.model.named_parameters(),
                                      exact.policy.model.named_parameters(), strict=True):
        assert torch.equal(b, c) and torch.equal(a, b), n
    rows = [[{k: v for k, v in json.loads(line).items() if not k.startswith(("time/", "memory/", "step_time"))}
             for line in (tmp_path / x / "out" / "grpo-dual" / "metrics.jsonl").read_text().splitlines()]
            for x in "bc"]
    assert rows[0] == rows[1] and [r["step"] for r in rows[0] if "lr" in r] == [1, 2, 3]
    out = tmp_path / "b" / "out"
    assert (resolve_resume(out / "grpo-dual", str(out / "checkpoint-1")) ==
            out / "grpo-dual" / "checkpoints" / "step_000001")
    shutil.rmtree(out / "grpo-dual" / "checkpoints" / "step_000001")
    with pytest.raises(CheckpointError, match="checkpoint it stands for.*is gone"):
        resolve_resume(out / "grpo-dual", str(out / "checkpoint-1"))
    foreign = tmp_path / "trl" / "checkpoint-5"
    foreign.mkdir(parents=True)
    with pytest.raises(CheckpointError, match="no grpo-dual run wrote it"):
        resolve_resume(out / "grpo-dual", str(foreign))


# ------------------------------------------------------------------------------------------- SmolLM2 (real model)
@pytest.mark.usefixtures("one_thread")  # tests/conftest.py: threads only contend on a shared 2-core box
def test_a_smollm2_adapter_names_its_hub_id_and_the_conversion_and_grpo_dual_loads_it_offline(smollm2_folder,
                                                                                             tmp_path, monkeypatch):
    """One LoRA step on SmolLM2-135M-Instruct (the packaged GGUF, converted): output_dir's adapter names the Hub id a
    user loads the base by, not the machine-local cache folder; its card says the weights were a dequantized Q4_1
    GGUF; grpo-dual loads the output (model.name=<output_dir>) offline from the local conversion, and the memory tool
    reads its base's shape."""
    import huggingface_hub.constants

    import grpo_train as G
    from grpo.config import ModelConfig
    from grpo.models.modeling import load_policy
    from grpo.run.assembly.memory_inputs import resolve_shape
    from tests.trainer_helpers import fast_config

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    out = tmp_path / "out"
    run = G.main(fast_config(tmp_path, "model.name=smollm2-135m-instruct", "model.lora=true", "model.lora_r=4",
                             "rollout.k=2", "train.prompts_per_micro_step=1", "rollout.max_new_tokens=4",
                             "train.max_steps=1", "data.eval_size=1", f"checkpoint.final_model_dir={out}"))
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == SMOLLM2_HUB
    text = (out / "README.md").read_text()
    assert f"base_model: {SMOLLM2_HUB}" in text and "SmolLM2-135M-Instruct.Q4_1.gguf" in text
    assert "dequantized" in text and TEMPLATE not in text and str(smollm2_folder) not in text
    loaded = load_policy(ModelConfig(name=str(out)), attn_implementation="sdpa")
    ids = run.tokenizer("The sky is", return_tensors="pt").input_ids
    with torch.no_grad():
        torch.testing.assert_close(loaded.model.eval()(ids).logits, run.policy.model.eval()(ids).logits, rtol=0,
                                   atol=1e-4)  # eval(): LoRA's dropout off
    assert resolve_shape(ModelConfig(name=str(out))).hidden == json.loads(
        (smollm2_folder / "config.json").read_text())["hidden_size"]
