"""One vocabulary per run: a run configured through TRL's fields (a GRPOConfig, a `trl grpo` file or flags) gets its
advice in TRL's words, ours in brackets (grpo/run/trl/vocabulary.py): the names come from the TRL tables' translation
(train.trl_names), a field the user set with grpo-dual's own flag or section keeps ours, and the doctor's findings,
the verdict's next step, the start's notes and the errors after set-up use them."""

from __future__ import annotations

import json

import pytest

from grpo import config as C
from grpo.run.trl.vocabulary import error_in_user_terms, in_user_terms

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")  # at collection: its log handler keeps the stderr it was imported under
pytestmark = pytest.mark.usefixtures("one_thread")
FLAGS = {"train": {"trl_names": {"rollout.k": "--num_generations", "train.lr": "--learning_rate",
                                 "kl.default.beta": "--beta", "train.max_steps": "--max_steps"}},
         "kl": {"default": {}, "own": {}}}


def zero_reward(completions, **kwargs):
    """A reward no completion can raise: every group's rewards are equal, no learning signal."""
    return [0.0 for _ in completions]


def test_a_grpo_dual_field_is_named_by_the_trl_flag_that_set_it_ours_in_brackets():
    said = in_user_terms("try `rollout.k=16`: more samples; a smaller train.lr cannot help; try "
                         "`kl.numbers.beta=<2× now>`: a stronger pull; kl.own.beta=0.1; `rollout.temperature=1.5`",
                         FLAGS)
    assert said == ("try `--num_generations 16` (rollout.k): more samples; a smaller --learning_rate (train.lr) cannot "
                    "help; try `--beta <2× now>` (kl.default.beta): a stronger pull; kl.own.beta=0.1; "
                    "`rollout.temperature=1.5`")  # a task with its own kl entry, and a field TRL did not set: ours
    assert in_user_terms(said, FLAGS) == said  # once only: a field shown in brackets is left alone
    four_bit = {"train": {"trl_names": {"model.load_in_4bit": "--load_in_4bit"}}}
    assert in_user_terms("set model.load_in_4bit=true", four_bit) == "set --load_in_4bit true (model.load_in_4bit)"
    fields = {"train": {"trl_names": {"rollout.k": "num_generations"}}}  # a GRPOConfig: its field names
    assert in_user_terms("try `rollout.k=16`: x", fields) == "try `num_generations=16` (rollout.k): x"
    assert in_user_terms("try `rollout.k=16`: x", {"train": {}}) == "try `rollout.k=16`: x"  # our own config
    err = error_in_user_terms(C.field_error("train.lr", 2.0, "use at most 1 (train.lr)"), FLAGS)
    assert str(err) == "config field `--learning_rate` (train.lr) = 2.0 is invalid: use at most 1 (train.lr)"
    assert err.field == "train.lr" and isinstance(err, C.ConfigError)


def test_the_names_come_from_the_translation_and_a_field_given_our_way_keeps_ours(tmp_path):
    """train.trl_names holds each grpo-dual field that holds its TRL field's value as it is (max_steps under
    num_iterations=1, not 2; no derived field), as flags for a command line and as field names for a GRPOConfig; a
    --section.field flag or a train(section=...) over a TRL value drops it (changing the TRL flag would change
    nothing)."""
    from grpo.config.command_line import parse_trainer_argv
    from grpo.run.api import python_config
    from grpo.run.trl.command_line import read_config_file, trl_flags

    path = tmp_path / "grpo.yaml"
    path.write_text("model_name_or_path: builtin:tiny\nnum_generations: 4\nmax_steps: 6\nlearning_rate: 1.0e-4\n"
                    "per_device_train_batch_size: 8\nuse_cpu: true\n")
    names = read_config_file(str(path))["train"]["trl_names"]
    assert names["rollout.k"] == "--num_generations" and names["train.max_steps"] == "--max_steps"
    assert names["train.lr"] == "--learning_rate" and "train.prompts_per_micro_step" not in names  # derived: 8 / 4
    cfg, args = parse_trainer_argv(["--config", str(path), "--rollout.k", "8"], prog="grpo-dual", description="",
                                   read_file=read_config_file, other=trl_flags())
    assert "rollout.k" not in cfg.train.trl_names and cfg.train.trl_names["train.lr"] == "--learning_rate"
    path.write_text(path.read_text() + "num_iterations: 2\n")
    assert "train.max_steps" not in read_config_file(str(path))["train"]["trl_names"]  # 3 RL steps are not 6
    args = trl.GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, num_generations=4, max_steps=4,
                          per_device_train_batch_size=4)
    cfg, _ = python_config(None, {"t": [{"prompt": f"p{i}"} for i in range(8)]}, {"t": "format"}, None,
                           {"train": {"lr": 1e-3}}, trl_args=args)
    assert cfg.train.trl_names["rollout.k"] == "num_generations" and "train.lr" not in cfg.train.trl_names


def test_a_trl_command_lines_findings_and_next_step_name_its_flags(tmp_path, capsys):
    """A `trl grpo` file and flags on the tiny model with a reward no completion can raise: the doctor's
    no_learning_signal, printed when it fires and in the report, names --num_generations (it said `rollout.k=8`);
    a GRPOConfig's run names num_generations."""
    import grpo_train

    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text("".join(json.dumps({"prompt": f"Say {i}."}) + "\n" for i in range(8)))
    (data / "test.jsonl").write_text("".join(json.dumps({"prompt": f"Tell {i}."}) + "\n" for i in range(2)))
    argv = ["--model_name_or_path", "builtin:tiny", "--dataset_name", str(data), "--reward_funcs",
            "test_vocabulary.zero_reward", "--max_steps", "2", "--per_device_train_batch_size", "4",
            "--num_generations", "4", "--max_completion_length", "4", "--use_cpu", "--output_dir",
            str(tmp_path / "out"), "--model.tiny_hidden", "32", "--model.tiny_layers", "1", "--model.tiny_heads", "2"]
    assert grpo_train.cli(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    report = json.loads((tmp_path / "out" / "grpo-dual" / "report.json").read_text())
    (signal,) = [f for f in report["findings"] if f["code"] == "no_learning_signal"]
    assert signal["suggestion"].startswith("try `--num_generations 8` (rollout.k):"), signal["suggestion"]
    assert "-> try `--num_generations 8` (rollout.k)" in out and "rollout.k=8" not in out
    assert "--max_steps 2 (train.max_steps)" in out and "--max_completion_length 4 (rollout.max_new_tokens)" in out

    rows = datasets.Dataset.from_list([{"prompt": f"Say {i}."} for i in range(8)])
    args = trl.GRPOConfig(output_dir=str(tmp_path / "api"), use_cpu=True, max_steps=2, num_generations=4,
                          per_device_train_batch_size=4, max_completion_length=4, report_to="none")
    run = grpo_train.train(["model.tiny_hidden=32", "model.tiny_layers=1", "model.tiny_heads=2"],
                           tasks={"t": rows}, rewards={"t": [zero_reward]}, args=args)
    (signal,) = [f for f in run.report["findings"] if f["code"] == "no_learning_signal"]
    assert signal["suggestion"].startswith("try `num_generations=8` (rollout.k):"), signal["suggestion"]
