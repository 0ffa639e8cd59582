"""Reliability of the run folder: nothing the user did not make a run folder is deleted (`--overwrite` of a model
folder), `~` is the home folder, a folder is locked while a run writes it (a second process is refused naming the
PID; a SIGKILLed holder leaves no stale lock), a failed start does not block its fixed retry, and a resume names
what changed since its checkpoint (config, data file, reward function source, --max-steps) before the model
loads (exit status 1, as a checkpoint error), going on only with --accept-changes, which the run folder records.
Tiny-model runs through `grpo_train.cli`."""

from __future__ import annotations

import contextlib
import io
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import grpo_train as G
from grpo.run.checkpoint.folder import LOCK_FILE, MARKER, RunFolderError, prepare_run_dir, release_run_dir
from tests.trainer_helpers import TINY_CLI as TINY
from tests.trainer_helpers import blocks_fresh_start, cli_output

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: a tiny model gains nothing from threads

ROOT = Path(__file__).resolve().parents[1]


def cli(*argv: str) -> tuple[int, str]:
    """(exit status, stderr + stdout) of `grpo_train.py TINY argv`, in this process."""
    return cli_output([*TINY, *argv])


def run_cli(out: Path, *argv: str, name: str = "r") -> tuple[int, str]:
    return cli("--train.output_dir", str(out), "--run-name", name, *argv)


# ------------------------------------------------------------------------------------------ nothing not ours deleted
def _model_folder(folder: Path) -> dict[str, bytes]:
    files = {"config.json": b'{"model_type": "llama"}', "model.safetensors": b"weights" * 100,
             "tokenizer.json": b"{}", "tokenizer_config.json": b"{}", "generation_config.json": b"{}",
             "chat_template.jinja": b"{{ messages }}"}
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return files


def test_overwrite_of_a_model_folder_deletes_nothing_and_names_why(tmp_path):
    """`--overwrite --output-dir <models> --run-name <model>` deleted model.safetensors and the tokenizer files (the
    folder held config.json, which once made it "a run folder")."""
    files = _model_folder(tmp_path / "models" / "smol")
    code, text = run_cli(tmp_path / "models", "--overwrite", name="smol")
    assert code == 2 and "Traceback" not in text, text
    assert str(tmp_path / "models" / "smol") in text and MARKER in text and "--overwrite will not delete" in text, text
    assert {p.name: p.read_bytes() for p in (tmp_path / "models" / "smol").iterdir()} == files  # nothing added either
    code, text = run_cli(tmp_path / "models", name="smol")  # without --overwrite: refused as well, nothing touched
    assert code == 2 and "a fresh run will not use it" in text, text
    assert {p.name: p.read_bytes() for p in (tmp_path / "models" / "smol").iterdir()} == files


def test_a_run_folder_of_an_older_version_is_not_overwritten_but_resumes(tmp_path):
    """Without the marker a folder is not known to be a run folder: --overwrite refuses it and says to delete it by
    hand; --resume of one holding checkpoints goes on (and marks it)."""
    old = tmp_path / "r"
    old.mkdir()
    (old / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(RunFolderError, match=r"older grpo-dual.*delete it by hand \(rm -r "):
        prepare_run_dir(old, resume="", overwrite=True)
    assert sorted(p.name for p in old.iterdir()) == ["metrics.jsonl"]
    (old / "checkpoints" / "step_000001").mkdir(parents=True)
    assert prepare_run_dir(old, resume="auto", overwrite=False) == old
    assert (old / MARKER).is_file() and (old / "metrics.jsonl").is_file()
    release_run_dir(old)
    assert prepare_run_dir(old, resume="", overwrite=True) == old  # marked now: an overwrite may start it over
    assert not (old / "metrics.jsonl").exists()
    release_run_dir(old)


def test_a_tilde_output_dir_is_the_home_folder_never_a_folder_named_tilde(tmp_path, monkeypatch):
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    code, text = cli("--output-dir", "~/runs", "--run-name", "r")  # as `--output-dir=~/runs` reaches the program
    assert code == 0, text
    assert (home / "runs" / "r" / "report.json").is_file() and not (cwd / "~").exists()
    with pytest.raises(RunFolderError, match="names no home folder"):
        prepare_run_dir("~no-such-user-39/runs/r", resume="", overwrite=False)
    assert not (cwd / "~no-such-user-39").exists()


# ------------------------------------------------------------------------------------------ one run, one folder
HOLDER = """
import sys, time
from grpo.run.checkpoint.folder import prepare_run_dir
prepare_run_dir(sys.argv[1], "", False)
open(sys.argv[1] + "/metrics.jsonl", "w").write('{"step": 1}\\n')  # a run that has started writing
print("locked", flush=True)
time.sleep(120)
"""


def _holder(folder: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_second_run_into_a_locked_folder_is_refused_naming_the_pid(tmp_path):
    """A fresh start, --resume auto and --overwrite into a folder a running process holds are each refused at once,
    naming the holder's PID, and nothing in the folder is touched; otherwise two runs with one run name both run to
    the end in one folder and the second wipes the first's ("stopped before its first checkpoint; starting it
    again")."""
    folder = tmp_path / "r"
    proc = _holder(folder)
    try:
        before = sorted(p.name for p in folder.iterdir())
        assert ".restartable" in before  # no checkpoint yet: restartable, but locked
        for extra in ([], ["--resume", "auto"], ["--overwrite"]):
            code, text = run_cli(tmp_path, *extra)
            assert code == 2 and f"PID {proc.pid}" in text and str(folder) in text and "in use" in text, (extra, text)
            assert sorted(p.name for p in folder.iterdir()) == before
            assert (folder / "metrics.jsonl").read_text() == '{"step": 1}\n'
    finally:
        proc.kill()
        proc.wait()


def test_a_sigkilled_holder_leaves_no_stale_lock(tmp_path):
    folder = tmp_path / "r"
    proc = _holder(folder)
    with pytest.raises(RunFolderError, match=f"PID {proc.pid}"):
        prepare_run_dir(folder, resume="", overwrite=True)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (folder / LOCK_FILE).exists()  # the file stays; the lock died with its process
    assert prepare_run_dir(folder, resume="", overwrite=True) == folder
    release_run_dir(folder)


def test_the_lock_is_released_at_the_end_of_a_run_and_train_runs_twice_in_one_process(tmp_path):
    """train() twice in one process on one folder (the second a resume), then another process may take it."""
    overrides = [f"train.output_dir={tmp_path}", "train.run_name=r", "model.tiny_hidden=32", "model.tiny_layers=1",
                 "model.tiny_heads=2", "data.demo_size=24", "data.eval_size=2", "rollout.max_new_tokens=4",
                 "rollout.k=2", "sft.steps=0", "train.eval_every=0", "train.sample_every=0",
                 "train.tensorboard=false", "train.prompts_per_micro_step=2"]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        G.train(overrides + ["train.max_steps=1"])
        run = G.train(overrides + ["train.max_steps=2", "checkpoint.resume=auto"])
    assert run.progress.step == 2
    probe = subprocess.run([sys.executable, "-c", "import sys; from grpo.run.checkpoint.folder import prepare_run_dir; "
                            "prepare_run_dir(sys.argv[1], 'auto', False); print('ok')", str(tmp_path / "r")],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert probe.stdout.strip() == "ok", probe.stderr


# ------------------------------------------------------------------------------------------ a failed start
def test_a_start_failing_on_a_bad_model_path_does_not_block_the_fixed_command(tmp_path):
    """The failed start left a folder holding only `.restartable`; the same command with a good model path was then
    refused ("it does not look like a run folder")."""
    empty = tmp_path / "no-model"
    empty.mkdir()
    code, text = run_cli(tmp_path / "runs", "--model.name", str(empty))
    assert code == 2 and str(empty) in text, text
    assert not blocks_fresh_start(tmp_path / "runs" / "r")
    code, text = run_cli(tmp_path / "runs")  # the default (tiny) model
    assert code == 0, text


# ------------------------------------------------------------------------------------------ resume: what changed
REWARD = "def score(completion, gold):\n    return float(len(completion) > {n})\n"


def _custom_task(tmp_path: Path, words: list[str]) -> list[str]:
    """Command-line flags of one custom task read from tmp/qa.jsonl, graded by the file tmp/rew.py."""
    (tmp_path / "qa.jsonl").write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"Say {w}", "target": w}) + "\n"
                                               for i, w in enumerate(words)))
    if not (tmp_path / "rew.py").exists():
        (tmp_path / "rew.py").write_text(REWARD.format(n=2))
    return ["--data.source", "none", "--tasks.qa.path", str(tmp_path / "qa.jsonl"),
            "--rewards.qa", f"{tmp_path / 'rew.py'}:score:1.0", "--train.output_dir", str(tmp_path / "out"),
            "--run-name", "r"]


WORDS = [f"w{i}" for i in range(24)]


def _accepted(tmp_path: Path) -> list[dict]:
    return [json.loads(x) for x in (tmp_path / "out" / "r" / "accepted_changes.jsonl").read_text().splitlines()]


def test_a_resume_with_a_changed_data_file_names_it_before_the_model_loads(tmp_path, monkeypatch):
    """With the built-in tokenizer a changed data file failed with an embedding-shape mismatch."""
    argv = _custom_task(tmp_path, WORDS)
    assert cli(*argv)[0] == 0
    _custom_task(tmp_path, [w.upper() + "zz" for w in WORDS])  # other rows: another vocabulary
    with monkeypatch.context() as mp:
        mp.setattr(G, "policy_from_config", lambda *a, **k: pytest.fail("the model loaded first"))
        code, text = cli(*argv, "--resume", "auto", "--max-steps", "2")
    assert code == 1 and "Traceback" not in text and "shape" not in text, text
    assert f"data file {tmp_path / 'qa.jsonl'} (tasks.qa.path) changed" in text and "--accept-changes" in text, text
    # the same rows written another way (key order): the file differs, the rows do not; accepted and recorded
    _custom_task(tmp_path, WORDS)
    (tmp_path / "qa.jsonl").write_text("".join(json.dumps({"target": w, "prompt": f"Say {w}", "id": f"q{i}"}) + "\n"
                                               for i, w in enumerate(WORDS)))
    code, text = cli(*argv, "--resume", "auto", "--max-steps", "2")
    assert code == 1 and "qa.jsonl" in text, text
    code, text = cli(*argv, "--resume", "auto", "--max-steps", "2", "--accept-changes")
    assert code == 0 and "changes accepted" in text, text
    (record,) = _accepted(tmp_path)
    assert record["step"] == 1 and any("qa.jsonl" in c for c in record["changes"])
    assert json.loads((tmp_path / "out" / "r" / "report.json").read_text())


def test_a_resume_with_a_changed_reward_function_names_it(tmp_path, monkeypatch):
    argv = _custom_task(tmp_path, WORDS)
    assert cli(*argv)[0] == 0
    (tmp_path / "rew.py").write_text(REWARD.format(n=3))
    with monkeypatch.context() as mp:
        mp.setattr(G, "policy_from_config", lambda *a, **k: pytest.fail("the model loaded first"))
        code, text = cli(*argv, "--resume", "auto", "--max-steps", "2")
    assert code == 1 and "different reward functions" in text, text
    assert f"reward function '{tmp_path / 'rew.py'}:score' (rewards.qa): its source changed" in text, text
    code, text = cli(*argv, "--resume", "auto", "--max-steps", "2", "--accept-changes")
    assert code == 0, text
    assert any("rew.py:score" in c for c in _accepted(tmp_path)[0]["changes"])


def test_a_resume_with_a_changed_config_is_refused_then_accepted_and_recorded(tmp_path):
    out = tmp_path / "out"
    assert run_cli(out)[0] == 0
    code, text = run_cli(out, "--resume", "auto", "--max-steps", "2", "--train.lr", "2e-2")
    assert code == 1 and "a different config" in text and "train.lr: checkpoint 0.01 vs now 0.02" in text, text
    assert not (out / "r" / "accepted_changes.jsonl").exists()
    code, text = run_cli(out, "--resume", "auto", "--max-steps", "2", "--train.lr", "2e-2", "--accept-changes")
    assert code == 0 and "train.lr" in text, text
    (record,) = [json.loads(x) for x in (out / "r" / "accepted_changes.jsonl").read_text().splitlines()]
    assert record["changes"] == ["train.lr: checkpoint 0.01 vs now 0.02"]
    with contextlib.redirect_stdout(io.StringIO()):  # the last checkpoint holds the accepted config: no change now
        assert run_cli(out, "--resume", "auto", "--max-steps", "3", "--train.lr", "2e-2")[0] == 0


def test_max_steps_below_the_checkpoint_step_is_refused_naming_both(tmp_path):
    """It ended at step 2 without a word."""
    out = tmp_path / "out"
    assert run_cli(out, "--max-steps", "2")[0] == 0
    code, text = run_cli(out, "--resume", "auto", "--max-steps", "1")
    assert code == 1 and "at step 2, past train.max_steps=1" in text and "--max-steps 2 or more" in text, text


def test_resume_with_overwrite_is_refused_as_contradictory(tmp_path):
    """The overwrite was ignored."""
    out = tmp_path / "out"
    assert run_cli(out)[0] == 0
    code, text = run_cli(out, "--resume", "auto", "--overwrite")
    assert code == 2 and "train.overwrite" in text and "give one of them" in text, text
    assert (out / "r" / "report.json").is_file()


def test_accept_changes_without_resume_is_a_config_error(tmp_path):
    code, text = run_cli(tmp_path, "--accept-changes")
    assert code == 2 and "checkpoint.accept_changes" in text, text
    assert not (tmp_path / "r").exists()


def test_a_reward_functions_source_is_its_own_text_and_a_rows_change_is_named_without_a_file(tmp_path):
    """A function handed in from Python (train(rewards=...), 'package.module:function') is fingerprinted by its own
    source: a change to it is named, a change elsewhere in its file is not. Rows that changed with no file changing
    (a Hub dataset, the demo's generator) are named by task."""
    import importlib.util

    from grpo.run.checkpoint.fingerprints import input_changes, source_hash

    def load(name: str, text: str):
        (tmp_path / f"{name}.py").write_text(text)
        spec = importlib.util.spec_from_file_location(name, tmp_path / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.score

    base = "def score(completion, gold):\n    return 1.0\n"
    first = source_hash("mod:score", load("m1", base))
    assert source_hash("mod:score", load("m2", base + "\n\ndef other():\n    return 2\n")) == first
    assert source_hash("mod:score", load("m3", base.replace("1.0", "0.5"))) != first
    assert source_hash("builtin", len) is None  # no source to show: not compared
    then = {"files": {}, "rows": {"qa": "a" * 64}, "rewards": {"mod:score": {"sha256": first, "tasks": ["qa"]}}}
    now = {"files": {}, "rows": {"qa": "b" * 64}, "rewards": {"mod:score": {"sha256": "c" * 64, "tasks": ["qa"]}}}
    assert input_changes(then, now) == [
        f"the rows of task 'qa' differ from the checkpoint's (sha256 {'a' * 12}... then, {'b' * 12}... now)",
        f"reward function 'mod:score' (rewards.qa): its source changed (sha256 {first[:12]}... at the checkpoint, "
        f"{'c' * 12}... now)"]
    assert input_changes(then, then) == []
