"""The seventh reliability pass: counts checked before arithmetic, files written only inside the folders the user
named, inert or contradictory settings named, and messages in the words the user wrote. Each probe is an input a
user gets wrong (the tiny model, examples/trl_grpo/math, 2 steps) and how it must end: exit status 2 with one line
naming the field, no traceback and no file of the user's changed (sha256 of every file before and after), or a run
that goes on with a printed note. In-process `grpo_train.cli` runs."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from grpo import config as C
from tests.test_reliability_trl import SMALL, User, refused
from tests.trainer_helpers import cli_output

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")
FLAGS_ONLY = ["--model_name_or_path", "builtin:tiny", "--reward_funcs", "tests.trainer_helpers.trl_length_reward",
              "--max_steps", "2", "--per_device_train_batch_size", "4", "--max_completion_length", "8",
              "--use_cpu", "true", "--save_strategy", "no"]
"""A TRL command line without --config (its dataset_name and output_dir are each probe's)."""


@pytest.fixture
def user(tmp_path, monkeypatch) -> User:
    monkeypatch.setenv("GRPO_DUAL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("grpo.data.dataset_dicts.hub_reachable", lambda: (False, "https://huggingface.co"))
    monkeypatch.chdir(tmp_path)  # TRL's default folder would land here: the probes see it
    return User(tmp_path)


def every_file(root: Path) -> dict[str, str]:
    """sha256 of every file under `root` (the run's own files included)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and "cache" not in p.relative_to(root).parts}


# ------------------------------------------------------------------ 1. counts checked before arithmetic
@pytest.mark.parametrize("where", ["file", "flag", "flags only"])
def test_zero_num_generations_is_refused_by_name_not_a_division_by_zero(user, where):
    if where == "file":
        user.config = user.write_config(num_generations=0)
        text = refused(user)
    elif where == "flag":
        text = refused(user, "--num_generations", "0")
    else:
        text = refused(user, *FLAGS_ONLY, "--dataset_name", str(user.data), "--output_dir", str(user.out),
                       "--num_generations", "0", config=False)
    assert "num_generations=0" in text and ">= 1" in text and "ZeroDivision" not in text, text


@pytest.mark.parametrize("argv, field", [
    (["--save_strategy", "steps", "--save_steps", "0"], "save_steps"),
    (["--save_strategy", "steps", "--save_steps", "-5"], "save_steps"),
    (["--eval_strategy", "steps", "--eval_steps", "0"], "eval_steps"),
    (["--logging_steps", "-1"], "logging_steps"),
])
def test_zero_or_negative_intervals_are_counts_not_a_share_of_the_run(user, argv, field):
    text = refused(user, *argv)
    assert f"GRPOConfig.{field}=" in text and "whole number >= 1" in text and "share of the run" not in text, text


def test_a_huge_accumulation_names_gradient_accumulation_steps_not_the_prompts(user):
    text = refused(user, "--gradient_accumulation_steps", "1000000000")
    assert "config field `--gradient_accumulation_steps` (train.grad_accum)" in text, text
    assert "train.prompts_per_micro_step` = 1" not in text and "use at most 1 " not in text, text


def test_a_huge_max_steps_is_named_in_the_disk_refusal(user):
    text = refused(user, "--max_steps", "100000000000000000000")
    assert "not enough disk space" in text and "fewer --max_steps (train.max_steps)" in text, text
    assert "--output_dir (train.output_dir)" in text and "--use_peft true (model.lora)" in text, text  # TRL's words


# ------------------------------------------------------------------ 2. files only inside the folders the user named
def test_a_trl_config_without_output_dir_writes_only_where_output_dir_names(user):
    user.config = user.write_config(output_dir=None)
    chosen = user.root / "chosen"
    code, text = cli_output(["--config", str(user.config), *SMALL, "--output-dir", str(chosen)])
    assert code == 0, text
    assert not (user.root / "trainer_output").exists(), text  # TRL's default beside ours: gone
    assert (chosen / "model.safetensors").is_file() and (chosen / "grpo-dual" / "final").is_dir()
    assert sorted(p.name for p in user.root.iterdir()) == sorted(["cache", "chosen", "math", "trl.yaml"])


def test_a_trl_config_naming_no_folder_says_trls_default_applies(user):
    user.config = user.write_config(output_dir=None)
    code, text = cli_output(["--config", str(user.config), *SMALL, "--print-config"])  # writes nothing
    assert code == 0 and '"final_model_dir": "trainer_output"' in text, text
    assert "note: output_dir is not set: the run and its final model go to trainer_output (TRL's default)" in text


@pytest.mark.parametrize("where", ["file", "flag"])
def test_an_empty_output_dir_is_refused(user, where):
    if where == "file":
        user.config = user.write_config(output_dir="")
        text = refused(user)
    else:
        text = refused(user, "--output_dir", "")
    assert "`output_dir` = '' is invalid: an empty folder name" in text, text
    assert not (user.root / "trainer_output").exists()


@pytest.mark.parametrize("inside", ["", "checkpoints", "checkpoints/step_000001"])
def test_final_model_dir_in_the_run_folder_or_its_checkpoints_is_refused_and_nothing_changes(user, inside):
    """LOST before: the final model's config.json written over the run's own config.json; its checkpoints called
    files no run wrote on the resume. Every file (the run's own too) keeps its sha256."""
    user.config = user.write_config(save_strategy="steps", save_steps=1)
    code, text = cli_output(["--config", str(user.config), *SMALL])
    assert code == 0, text
    run_dir = user.out / "grpo-dual"
    before = every_file(user.root)
    code, text = cli_output(["--config", str(user.config), *SMALL, "--max_steps", "4", "--resume", "auto",
                             "--checkpoint.final_model_dir", str(run_dir / inside)])
    assert code == 2 and "Traceback" not in text, text
    assert f"checkpoint.final_model_dir {run_dir / inside} is " in text and "nothing was touched" in text, text
    assert every_file(user.root) == before


@pytest.mark.parametrize("argv, said", [
    (["--out", ""], "--out is empty"),
    (["--out", "x", "--parts", ""], "--parts '' names no part"),
    (["--out", "x", "--parts", ","], "--parts ',' names no part"),
])
def test_gpu_check_refuses_an_empty_out_or_parts(tmp_path, argv, said):
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--cpu", *argv], cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and said in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written in the current folder


# ------------------------------------------------------------------ 4. inert or contradictory settings
def test_a_warm_up_beyond_the_run_gets_a_note(user):
    code, text = cli_output(["--config", str(user.config), *SMALL, "--warmup_steps", "1000000000"])
    assert code == 0, text
    assert "note: --warmup_steps 1000000000 (train.warmup_steps) is not below this run's 2 optimizer steps" in text


def test_a_trl_flag_and_our_field_for_one_setting_are_refused(user):
    text = refused(user, "--learning_rate", "1e-5", "--train.lr", "3e-5")
    assert "--learning_rate and --train.lr both set train.lr" in text, text


def test_an_empty_metric_for_best_model_is_refused_and_an_unset_one_noted(user):
    from grpo.run.trl.translation import translate

    text = refused(user, "--metric_for_best_model", "")
    assert "`metric_for_best_model` = '' is invalid: an empty metric name" in text, text
    done = translate({"load_best_model_at_end": True, "eval_strategy": "steps", "save_strategy": "steps",
                      "eval_steps": 1, "save_steps": 1})
    assert any(n.startswith("GRPOConfig.metric_for_best_model=None") and "mean held-out reward" in n
               for n in done.notes), done.notes


def test_an_early_stopping_threshold_without_patience_is_refused():
    with pytest.raises(C.ConfigError, match="train.early_stopping_threshold.*early_stopping_patience=0 turns"):
        C.load_config("demo", ["train.early_stopping_threshold=0.1"])


def test_best_model_and_the_report_say_final_holds_the_last_step_when_it_beat_the_best(tmp_path, capsys):
    """best/ holds step 4's weights; the last step (6), evaluated only after RL, scored higher: final/ holds the
    last step's model, and best.json (read into report.json) and the console say so."""
    from grpo.run.checkpoint.best_model import settle_best

    cfg = C.load_config("demo", ["checkpoint.keep_best=true", "train.eval_every=4"])
    best = tmp_path / "best"
    best.mkdir()
    (best / "best.json").write_text(json.dumps({"step": 4, "metric": "reward", "value": 0.25}))
    dist = types.SimpleNamespace(is_main=True, broadcast=lambda x: x, barrier=lambda: None)
    progress = types.SimpleNamespace(step=6, evals={"step_4": {"t": 0.25}, "after_rl": {"t": 0.5}})
    run = types.SimpleNamespace(cfg=cfg, run_dir=tmp_path, dist=dist, progress=progress)
    assert settle_best(run) is None  # the last step's weights stay: they are the best
    final = json.loads((best / "best.json").read_text())["final_model"]
    assert (final["step"] == 6 and final["value"] == 0.5 and "the last step's weights, not this folder's" in
            final["holds"])
    assert ("final model: the last step's, step 6 (reward 0.5), which beat every earlier evaluation" in
            capsys.readouterr().out)
    from grpo.run.doctor.report import _kept_models  # what report.json gets beside pareto_best

    assert _kept_models(tmp_path)["final_model"] == final


# ------------------------------------------------------------------ 6. messages in the words the user wrote
def test_an_empty_config_file_and_a_config_folder_are_named_as_such(user):
    empty = user.root / "empty.yaml"
    empty.write_text("# nothing yet\n")
    text = refused(user, "--config", str(empty), config=False)
    assert f"--config {empty} is empty" in text and "NoneType" not in text, text
    text = refused(user, "--config", str(user.data), config=False)
    assert f"--config {user.data} is a folder: give the YAML or JSON config file itself" in text, text


def test_report_to_wandb_without_wandb_names_report_to_and_the_pip_command(user, monkeypatch):
    monkeypatch.setattr("grpo.run.tracking.wandb_installed", lambda: False)
    user.config = user.write_config(report_to="wandb")
    text = refused(user)
    assert "GRPOConfig.report_to='wandb'" in text and "pip install wandb" in text, text
    assert "wandb_project" not in text, text


def test_omp_num_threads_that_is_not_a_number_gets_a_note(monkeypatch):
    from grpo.run.assembly.start_checks import inert_settings

    cfg = C.load_config("demo", [])
    monkeypatch.setenv("OMP_NUM_THREADS", "abc")
    assert any(n.startswith("OMP_NUM_THREADS='abc' is not a whole number") for n in inert_settings(cfg, "cpu"))
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert not any("OMP_NUM_THREADS" in n for n in inert_settings(cfg, "cpu"))


def test_use_peft_1_is_one_rule_in_a_file_and_as_a_flag(user):
    from grpo.run.trl.command_line import read_config_file

    in_file = read_config_file(str(user.write_config(use_peft=1)))
    as_flag = read_config_file(str(user.write_config()), {"use_peft": "1"})
    assert in_file["model"]["lora"] is True and as_flag["model"]["lora"] is True


def test_a_read_only_folder_is_named_read_only_not_short_of_space(user):
    from tests.test_reliability_trl import _tmpfs

    small = _tmpfs(user.root / "ro", "1m,ro")
    try:
        text = refused(user, "--output_dir", str(small))
        assert f"{small} is read-only for this process" in text and "not enough disk space" not in text, text
        assert "choose another --output_dir (train.output_dir)" in text, text  # in the words the user wrote
    finally:
        subprocess.run(["umount", str(small)], check=False)


def test_resume_from_a_pareto_point_says_what_it_is_and_what_to_give(tmp_path):
    from grpo.run.checkpoint.files import CheckpointError, resolve_resume

    point = tmp_path / "run" / "pareto" / "step_000002"
    point.mkdir(parents=True)
    (point / ".pareto_point").write_text("2\n")
    (point / "config.json").write_text("{}")
    with pytest.raises(CheckpointError) as err:
        resolve_resume(tmp_path / "run", str(point))
    text = str(err.value)
    assert f"{point} is a Pareto point" in text and "not a training checkpoint" in text, text
    assert f"--model.name {point}" in text and "a save was interrupted" not in text, text


def test_a_truncated_reference_checkpoint_names_the_way_out(tmp_path):
    import torch

    from grpo.run.checkpoint.files import CheckpointError, load_reference, save_reference

    folder = save_reference(tmp_path, {"w": torch.arange(64, dtype=torch.float32)})
    weights = next(p for p in folder.iterdir() if p.suffix == ".safetensors")
    weights.write_bytes(weights.read_bytes()[:40])  # cut short, as a full disk or a killed copy leaves it
    with pytest.raises(CheckpointError) as err:
        load_reference(tmp_path)
    text = str(err.value)
    assert "the post-SFT reference model" in text and "--overwrite" in text and "--run-name" in text, text
