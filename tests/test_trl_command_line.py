"""TRL's command line as it is. `trl grpo`'s config file and flags (GRPOScriptArguments, ModelConfig,
DatasetMixtureConfig, GRPOConfig) run with `grpo-dual` in its place: a YAML and the same flags plan the run of the
equivalent `train(..., args=GRPOConfig(...), peft_config=LoraConfig(...))`; every field of TRL's four records is
planned or refused by name (walked from TRL's own dataclasses); misspelt fields and flags get "did you mean" across
grpo-dual's names and TRL's; the dataset is read as TRL's script reads it; TRL's registry reward functions are TRL's;
a run leaves the final model in output_dir, loadable with from_pretrained as after TRL's trainer.save_model().
docs/TRL.md's offline `trl grpo` command, which trains SmolLM2-135M-Instruct, runs as written after the README's
set-up in tests/test_install.py."""

from __future__ import annotations

import dataclasses
import json
import shlex
import warnings
from pathlib import Path

import pytest
import torch

from grpo import config as C
from grpo.run.trl.command_line import (
    OTHER_RECORD_FIELDS,
    flag_value,
    read_config_file,
    translate_command_line,
    trl_flags,
)
from grpo.run.trl.config_table import INSTEAD, ROWS, TABLE
from grpo.run.trl.record_tables import MODEL_TABLE, RECORDS

trl = pytest.importorskip("trl")
ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: threads only contend on a shared 2-core box
ROWS_IN = [{"prompt": f"Write the word number {i} in capitals.", "word": f"w{i}"} for i in range(24)]
HELD = [{"prompt": f"Write the word number {i} in lower case.", "word": f"w{i}"} for i in range(6)]
TINY = ["--model.tiny_hidden", "32", "--model.tiny_layers", "1", "--model.tiny_heads", "2", "--data.eval_size", "2"]


def reward_len(completions, **kwargs):
    """A TRL-style reward function, named by its import path in the config files below."""
    return [-abs(20 - len(c)) for c in completions]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_DUAL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("grpo.data.dataset_dicts.hub_reachable", lambda: (False, "https://huggingface.co"))


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


GRPO_FIELDS = {"learning_rate": 1e-4, "num_generations": 4, "per_device_train_batch_size": 8,
               "gradient_accumulation_steps": 2, "max_steps": 6, "beta": 0.04, "loss_type": "grpo", "seed": 7,
               "max_completion_length": 16, "use_cpu": True, "lr_scheduler_type": "cosine", "warmup_steps": 1}
LORA = {"use_peft": True, "lora_r": 4, "lora_alpha": 8, "lora_dropout": 0.0,
        "lora_target_modules": ["q_proj", "v_proj"]}


def trl_yaml(tmp_path: Path, **extra) -> Path:
    import yaml

    data = tmp_path / "data"
    write_jsonl(data / "train.jsonl", ROWS_IN)
    write_jsonl(data / "test.jsonl", HELD)
    fields = {"model_name_or_path": "builtin:tiny", "dataset_name": str(data),
              "reward_funcs": ["test_trl_command_line.reward_len"], **LORA, **GRPO_FIELDS,
              "output_dir": str(tmp_path / "out"), **extra}
    path = tmp_path / "grpo.yaml"
    path.write_text(yaml.safe_dump(fields))
    return path


def printed_config(argv: list[str], capsys) -> C.Config:
    import grpo_train

    assert grpo_train.cli([*argv, "--print-config"]) == 0, capsys.readouterr().err
    return C.from_dict(json.loads(capsys.readouterr().out))


def test_a_trl_grpo_yaml_and_its_flags_plan_the_run_of_train_with_grpo_config_and_lora_config(tmp_path, capsys):
    """The YAML (model, a local dataset folder with a test split, a reward function by import path, LoRA, GRPOConfig
    fields), the same fields as flags, and `train(tasks={task: DatasetDict}, rewards=..., model=...,
    args=GRPOConfig(...), peft_config=LoraConfig(...))` give one config: the same rows file, the same sections."""
    import datasets
    import peft

    from grpo.core.plumbing import import_callable
    from grpo.run.api import python_config

    path = trl_yaml(tmp_path)
    from_yaml = printed_config(["--config", str(path)], capsys)
    flags = ["--model_name_or_path", "builtin:tiny", "--dataset_name", str(tmp_path / "data"),
             "--reward_funcs", "test_trl_command_line.reward_len", "--use_peft", "--lora_r", "4", "--lora_alpha", "8",
             "--lora_dropout", "0.0", "--lora_target_modules", "q_proj", "v_proj",
             "--output_dir", str(tmp_path / "out")]
    flags += [w for k, v in GRPO_FIELDS.items() for w in (f"--{k}", str(v).lower() if isinstance(v, bool) else str(v))]
    from_flags = printed_config(flags, capsys)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = trl.GRPOConfig(output_dir=str(tmp_path / "out"), **GRPO_FIELDS)
    loaded = datasets.load_dataset(str(tmp_path / "data"))
    lora = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                           task_type="CAUSAL_LM")
    from_api, callables = python_config(None, {"data": loaded}, {"data": [reward_len]}, "builtin:tiny", {}, lora,
                                        trl_args=args)
    assert set(from_yaml.tasks) == {"data"} and from_yaml.tasks["data"].heldout  # the test split is the held-out set
    for cfg in (from_yaml, from_flags):
        for section in ("model", "data", "rollout", "loss", "kl", "train", "sft", "checkpoint", "tasks"):
            if section == "train":  # the same settings, named the user's way (flags here, fields for the object)
                assert cfg.train.trl_names["rollout.k"] == "--num_generations"
                assert from_api.train.trl_names["rollout.k"] == "num_generations"
                assert dataclasses.replace(cfg.train, trl_names={}) == dataclasses.replace(from_api.train, trl_names={})
                continue
            assert getattr(cfg, section) == getattr(from_api, section), section
        assert import_callable(cfg.rewards["data"]) is callables[from_api.rewards["data"]] is reward_len
    assert (from_yaml.model.lora, from_yaml.model.lora_r, from_yaml.train.lr, from_yaml.rollout.k) == (True, 4, 1e-4, 4)
    assert from_yaml.checkpoint.final_model_dir == str(tmp_path / "out")
    over = printed_config(["--config", str(path), "--learning_rate", "3e-4", "--lora_r", "2", "--train.seed", "9"],
                          capsys)
    assert (over.train.lr, over.model.lora_r, over.train.seed) == (3e-4, 2, 9)  # flags over the file, ours over both


def test_every_field_of_trls_four_records_is_planned_or_refused_by_name(tmp_path):
    """Walks TRL 1.16's own dataclasses: each field of GRPOScriptArguments, ModelConfig and DatasetMixtureConfig has
    its row with TRL's default and the flag kind of its type; each row that allows one value refuses another by the
    field's name; each GRPOConfig field outside TABLE, set, is refused by name."""
    from trl import DatasetMixtureConfig, ModelConfig
    from trl.scripts.grpo import GRPOScriptArguments

    from grpo.run.trl.command_line import _kind_of_type

    kinds = trl_flags().kinds
    for cls, record in ((GRPOScriptArguments, "GRPOScriptArguments"), (ModelConfig, "ModelConfig"),
                        (DatasetMixtureConfig, "DatasetMixtureConfig")):
        rows = {row.trl: row for row in RECORDS[record]}
        fields = [f for f in dataclasses.fields(cls) if f.init]
        assert [f.name for f in fields] == list(rows), record  # every field, in TRL's order
        for f in fields:
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            assert rows[f.name].default == default, f.name
            if f.name != "datasets":
                assert kinds[f.name] == _kind_of_type(f.type), f.name
    for row in TABLE:
        assert kinds[row.trl] == _kind_of_type(next(f.type for f in dataclasses.fields(trl.GRPOConfig)
                                                    if f.name == row.trl)), row.trl
    base = {"model_name_or_path": "builtin:tiny"}
    for row in [*TABLE, *(r for rows in RECORDS.values() for r in rows)]:
        if getattr(row.convert, "instead", "").startswith("another value is refused"):
            with pytest.raises(C.ConfigError) as err:
                translate_command_line({**base, row.trl: "a value TRL allows and grpo-dual does not"})
            assert err.value.field == row.trl and row.trl in str(err.value)
    outside = [f.name for f in dataclasses.fields(trl.GRPOConfig) if f.init and f.name not in ROWS]
    assert len(outside) > 100
    for name in outside:  # resume_from_checkpoint: refused with the setting that does it here (--resume)
        with pytest.raises(C.ConfigError, match="cannot honour" if name not in INSTEAD else "--resume") as err:
            translate_command_line({**base, name: "not TRL's default"})
        assert err.value.field == name


@pytest.mark.parametrize("argv, guess", [
    (["--learning_rate", "1e-5"], "did you mean --train.lr?"),  # not a TRL command line: grpo-dual's field
    (["--num_generations", "4", "--preset", "demo"], "did you mean --rollout.k?"),
    (["--model_name_or_path", "builtin:tiny", "--lerning_rate", "1e-5"], "did you mean --learning_rate (TRL's; "
                                                                          "grpo-dual's --train.lr)?"),
    (["--model_name_or_path", "builtin:tiny", "--lora_rr", "8"], "did you mean --lora_r (TRL's; grpo-dual's "
                                                                  "--model.lora_r)?"),
    (["--train.lerning_rate", "1e-5"], "did you mean `train.lr`? TRL's learning_rate is --train.lr here"),
    (["--rollout.num_generations", "4"], "did you mean `rollout.k`?"),
    (["--model_name_or_path", "builtin:tiny", "--dataset_name", "rows.jsonl", "--reward_funcs", "acuracy_reward"],
     "did you mean `accuracy_reward`?"),
])
def test_a_trl_flag_or_a_misspelt_one_gets_a_did_you_mean(argv, guess, capsys, tmp_path, monkeypatch):
    import grpo_train

    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "rows.jsonl", ROWS_IN)
    assert grpo_train.cli(argv) == 2
    assert guess in capsys.readouterr().err


def test_a_misspelt_field_in_a_trl_file_and_trl_flags_beside_our_sections_get_a_did_you_mean(tmp_path, capsys):
    import grpo_train

    path = tmp_path / "grpo.yaml"
    path.write_text("model_name_or_path: builtin:tiny\nlerning_rate: 1.0e-5\nuse_pef: true\n")
    assert grpo_train.cli(["--config", str(path)]) == 2
    assert ("have no field(s) ['lerning_rate', 'use_pef'] (did you mean `learning_rate`, `use_peft`?)" in
            capsys.readouterr().err)
    ours = tmp_path / "ours.yaml"
    ours.write_text("preset: demo\ntrain:\n  max_steps: 3\n")
    assert grpo_train.cli(["--config", str(ours), "--learning_rate", "1e-5"]) == 2
    err = capsys.readouterr().err
    assert "holds grpo-dual's sections" in err and "did you mean --train.lr?" in err
    path.write_text("model_name_or_path: builtin:tiny\nnum_processes: 4\n")  # TRL's docs put the launcher's keys here
    assert grpo_train.cli(["--config", str(path)]) == 2
    assert "accelerate launch --num_processes N" in capsys.readouterr().err


def test_the_documented_hub_command_is_refused_offline_with_the_fix(tmp_path, capsys, monkeypatch):
    """docs/TRL.md's first command, TRL's own: without a network each Hub id is refused before any work, named."""
    import grpo_train

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    argv = shlex.split(docs_command(0).replace("\\\n", " "))[1:]
    assert grpo_train.cli(argv) == 2
    err = capsys.readouterr().err
    assert "dataset_name='HuggingFaceH4/Polaris-Dataset-53K'" in err and "save_to_disk" in err
    monkeypatch.chdir(ROOT)
    assert grpo_train.cli(["--model_name_or_path", "Qwen/Qwen2.5-0.5B", "--dataset_name", "examples/trl_grpo/math",
                           "--reward_funcs", "think_format_reward"]) == 2
    err = capsys.readouterr().err
    assert "model_name_or_path='Qwen/Qwen2.5-0.5B'" in err and "smollm2-135m-instruct" in err


def test_datasets_are_read_as_trls_script_reads_them(tmp_path):
    """A data file (one split), a folder with split files, a save_to_disk folder, a mixture with a test split; a
    train or test split that is not there is named; a dataset script is refused with the fix."""
    import datasets

    rows = write_jsonl(tmp_path / "rows.jsonl", ROWS_IN)
    one = translate_command_line({"dataset_name": str(rows), "use_cpu": True})
    assert list(one["tasks"]) == ["rows"] and "heldout" not in one["tasks"]["rows"]  # no test split: every row trains
    assert one["data"]["heldout_fraction"] == 0.0  # as in TRL, and the verdict is judged from the training rewards
    assert len(Path(one["tasks"]["rows"]["path"]).read_text().splitlines()) == len(ROWS_IN)
    saved = tmp_path / "saved"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS_IN),
                          "validation": datasets.Dataset.from_list(HELD)}).save_to_disk(str(saved))
    tree = translate_command_line({"dataset_name": str(saved), "dataset_test_split": "validation", "use_cpu": True})
    assert len(Path(tree["tasks"]["saved"]["heldout"]).read_text().splitlines()) == len(HELD)
    with pytest.raises(C.ConfigError, match=r"splits \['train', 'validation'\]") as err:
        translate_command_line({"dataset_name": str(saved), "dataset_test_split": "dev"})
    assert err.value.field == "dataset_test_split"
    with pytest.raises(C.ConfigError, match="dataset_train_split='all'"):
        translate_command_line({"dataset_name": str(saved), "dataset_train_split": "all"})
    mix = translate_command_line({"datasets": [{"path": str(rows)}, {"path": "json", "data_files": str(rows),
                                                                     "columns": ["prompt", "word"]}],
                                  "test_split_size": 0.25, "use_cpu": True})
    train = Path(mix["tasks"]["trl"]["path"]).read_text().splitlines()
    held = Path(mix["tasks"]["trl"]["heldout"]).read_text().splitlines()
    assert (len(train), len(held)) == (36, 12)
    script = tmp_path / "scripted"
    script.mkdir()
    (script / "scripted.py").write_text("import datasets\n")
    with pytest.raises(C.ConfigError, match="runs no dataset scripts"):
        translate_command_line({"dataset_name": str(script)})


def test_reward_funcs_are_trls_registry_or_import_paths_weighed_by_reward_weights(tmp_path, monkeypatch, capsys):
    from grpo.core.plumbing import import_callable
    from grpo.grading import trl_rewards

    rows = write_jsonl(tmp_path / "rows.jsonl", ROWS_IN)
    (tmp_path / "my_rewards.py").write_text("def short(completions, **kw):\n    return [0.0 for _ in completions]\n")
    monkeypatch.chdir(tmp_path)  # TRL imports a module of the working folder too
    tree = translate_command_line({"dataset_name": str(rows), "reward_funcs": ["think_format_reward",
                                   "my_rewards.short", "test_trl_command_line.reward_len"],
                                   "reward_weights": [1.0, 0.5, 2.0], "use_cpu": True})
    terms = tree["rewards"]["rows"].split(",")
    assert terms[0] == "grpo.grading.trl_rewards:think_format_reward:1.0"
    assert terms[1] in (f"{tmp_path / 'my_rewards.py'}:short:0.5", "my_rewards:short:0.5")  # a file if not importable
    assert import_callable(terms[1].rsplit(":", 1)[0]).__name__ == "short" and terms[2].endswith(":reward_len:2.0")
    assert import_callable(terms[2].rsplit(":", 1)[0]) is reward_len
    with pytest.raises(C.ConfigError, match="2 weights for 3 reward functions"):
        translate_command_line({"dataset_name": str(rows), "reward_funcs": ["a.b", "c.d", "e.f"],
                                "reward_weights": [1.0, 2.0]})
    with pytest.raises(C.ConfigError, match="score the rows of dataset_name"):
        translate_command_line({"reward_funcs": ["think_format_reward"], "model_name_or_path": "builtin:tiny"})
    model = tmp_path / "rm"
    model.mkdir()
    tree = translate_command_line({"dataset_name": str(rows), "reward_model_name_or_path": str(model),
                                   "reward_funcs": ["test_trl_command_line.reward_len"], "use_cpu": True})
    assert tree["rewards"]["rows"].split(",")[0] == "reward_model"  # TRL's script puts the reward model first
    assert tree["reward_models"]["reward_model"]["path"] == str(model)
    monkeypatch.setattr(trl_rewards, "missing", lambda name: "pip install math-verify")
    with pytest.raises(C.ConfigError, match="needs packages that are not installed here: pip install math-verify"):
        translate_command_line({"dataset_name": str(rows), "reward_funcs": ["accuracy_reward"]})


def test_trls_registry_rewards_are_trls_with_or_without_trl(monkeypatch):
    from trl.rewards import get_soft_overlong_punishment, think_format_reward

    from grpo.grading import trl_rewards

    completions = [[{"content": "<think>\nhm\n</think>\n4"}], [{"content": "4 <think>x</think>"}],
                   [{"content": "<think>a<think>b</think>"}]]
    ids = [[1] * 10, [1] * 1100, [1] * 1300]
    theirs = (think_format_reward(completions), get_soft_overlong_punishment(1280, 256)(ids))
    assert (trl_rewards.think_format_reward(completions), trl_rewards.soft_overlong_punishment_reward(ids)) == theirs
    monkeypatch.setattr(trl_rewards, "_trl", lambda name: None)  # TRL not installed: our own copies
    assert (trl_rewards.think_format_reward(completions), trl_rewards.soft_overlong_punishment_reward(ids)) == theirs
    assert theirs == ([1.0, 0.0, 0.0], [0.0, -0.296875, -1.0])
    with pytest.raises(TypeError, match="conversational"):
        trl_rewards.think_format_reward(["<think>a</think>"])


def test_the_model_record_applies_whole_when_given_and_its_defaults_are_trls(tmp_path, capsys, monkeypatch):
    tree = translate_command_line({"model_name_or_path": "builtin:tiny", "use_peft": True, "use_cpu": True})
    assert tree["model"] == {"name": "builtin:tiny", "dtype": "float32", "lora": True, "lora_r": 16, "lora_alpha": 32,
                             "lora_dropout": 0.05, "lora_target_modules": ["q_proj", "v_proj"],  # peft's for Llama
                             "load_in_4bit": False, "gradient_checkpointing": True, "compile": False,
                             "trust_remote_code": False}
    linear = translate_command_line({"model_name_or_path": "smollm2-135m-instruct", "use_peft": True,
                                     "lora_target_modules": "all-linear", "dtype": "auto", "use_cpu": True})["model"]
    assert linear["lora_target_modules"] == sorted(C.LLAMA_LORA_TARGETS) and linear["dtype"] == "float32"
    assert "lora" not in translate_command_line({"dataset_name": None, "learning_rate": 1e-5})["model"]
    unknown = tmp_path / "unknown-model"
    unknown.mkdir()
    (unknown / "config.json").write_text('{"model_type": "nonesuch"}')
    with pytest.raises(C.ConfigError, match="name the modules") as err:
        translate_command_line({"model_name_or_path": str(unknown), "use_peft": True, "use_cpu": True})
    assert err.value.field == "lora_target_modules"
    assert [row.trl for row in MODEL_TABLE][:3] == ["model_name_or_path", "model_revision", "dtype"]
    capsys.readouterr()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU: TRL would autocast to bf16; named
    on_gpu = translate_command_line({"model_name_or_path": "builtin:tiny", "ignore_bias_buffers": True})
    assert on_gpu["model"]["dtype"] == "float32"  # ModelConfig.dtype's default, over GRPOConfig.bf16's bfloat16
    err = capsys.readouterr().err
    assert "GRPOConfig.bf16=True: TRL autocasts" in err and "GRPOScriptArguments.ignore_bias_buffers=True" in err


def test_flag_words_become_trls_values_and_env_is_set(tmp_path, monkeypatch):
    assert flag_value("use_peft", True) is True and flag_value("use_peft", "false") is False
    assert flag_value("learning_rate", "1e-5") == 1e-5 and flag_value("dataset_config", "1") == "1"
    assert flag_value("reward_weights", ["1", "0.5"]) == [1, 0.5]
    assert flag_value("model_init_kwargs", '{"dtype": "bfloat16"}') == {"dtype": "bfloat16"}
    flags = trl_flags()
    taken, rest = flags.take(["--use_peft", "--reward_funcs", "a", "b", "--no_gradient_checkpointing", "--x", "1"])
    assert taken == {"use_peft": True, "reward_funcs": ["a", "b"], "gradient_checkpointing": "false"}
    assert rest == ["--x", "1"]
    with pytest.raises(C.ConfigError, match="--lora_r has no value"):
        flags.take(["--lora_r", "--use_peft"])
    monkeypatch.delenv("GRPO_TEST_VARIABLE", raising=False)
    path = tmp_path / "grpo.yaml"
    path.write_text("model_name_or_path: builtin:tiny\nenv:\n  GRPO_TEST_VARIABLE: set\n")
    read_config_file(str(path), {})
    import os

    assert os.environ["GRPO_TEST_VARIABLE"] == "set"
    assert set(OTHER_RECORD_FIELDS) >= {"reward_funcs", "use_peft", "datasets"}
    for name, same in flags.equivalents.items():  # each "did you mean" names a real grpo-dual field
        if "<" not in same:
            try:
                C.load_config("demo", [f"{same[2:]}=not a value"])
            except C.ConfigError as err:
                assert err.field == same[2:] and "unknown" not in str(err) and "section" not in str(err), name


def test_a_trl_file_trains_two_steps_of_the_tiny_model_and_output_dir_holds_the_adapter(tmp_path):
    """`grpo-dual --config grpo.yaml` (LoRA, a reward function by import path) trains 2 steps; output_dir holds the
    adapter and tokenizer as TRL's trainer.save_model leaves them: peft loads it onto the base, and it is the
    trained adapter."""
    from peft import PeftModel
    from transformers import AutoTokenizer

    import grpo_train

    path = trl_yaml(tmp_path, max_steps=2, per_device_train_batch_size=4, gradient_accumulation_steps=1,
                    max_completion_length=4, gradient_checkpointing=False)
    assert grpo_train.cli(["--config", str(path), *TINY]) == 0
    out = tmp_path / "out"
    run_dir = out / "grpo-dual"
    assert json.loads((run_dir / "report.json").read_text())  # the run's records, beside the model
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert max(m.get("step", 0) for m in metrics) == 2
    cfg = C.from_dict(json.loads((run_dir / "config.json").read_text()))
    from safetensors.torch import load_file

    from grpo.models.modeling import load_policy

    adapter, trained = (load_file(folder / "adapter_model.safetensors") for folder in (out, run_dir / "final"))
    assert adapter.keys() == trained.keys() and all(torch.equal(adapter[n], trained[n]) for n in adapter)
    assert any(t.abs().sum() > 0 for n, t in adapter.items() if "lora_B" in n)  # trained: B starts at zero
    base = load_policy(dataclasses.replace(cfg.model, lora=False), seed=0, tiny_corpus=[r["prompt"] for r in ROWS_IN])
    loaded = PeftModel.from_pretrained(base.model, out)  # peft reads output_dir as after TRL's save_model
    on_model = {n: t for n, t in loaded.state_dict().items() if "lora_" in n}
    assert len(on_model) == len(adapter) and all(any(torch.equal(t, a) for a in adapter.values())
                                                 for t in on_model.values())
    tokenizers = [AutoTokenizer.from_pretrained(folder) for folder in (out, run_dir / "final")]
    assert tokenizers[0].get_vocab() == tokenizers[1].get_vocab()


def docs_command(index: int) -> str:
    """The index-th ```bash block of docs/TRL.md."""
    text = (ROOT / "docs" / "TRL.md").read_text()
    return text.split("```bash\n")[index + 1].split("```")[0].strip()
