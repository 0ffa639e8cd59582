"""The line printed after an early end resumes the run as printed (issue 62, part 3): the user's own command, TRL flags
or config file included, with `--resume auto` (and `--run-name` where the clock named the folder), after SIGINT,
SIGTERM, a second Ctrl-C and a full disk; the last line names the last complete checkpoint; a failed write of the
reference leaves no `.tmp-*`. Each printed line is run as printed, in a subprocess, and must resume."""

from __future__ import annotations

import errno
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo.run.checkpoint import files as ckpt
from grpo.run.checkpoint.resume_line import note_command_line, resume_advice, resume_command
from tests.trainer_helpers import cli_output

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")
TINY = ["--model.tiny_hidden", "32", "--model.tiny_layers", "1", "--model.tiny_heads", "2"]
OURS = [*TINY, "--data.demo_size", "24", "--data.eval_size", "2", "--rollout.max_new_tokens", "4", "--sft.steps", "0",
        "--train.eval_every", "0", "--train.tensorboard", "false", "--max-steps", "6"]
"""Our command line: the offline demo on the builtin tiny model, 6 RL steps, no evaluations on the way."""


def test_the_resume_command_is_the_users_own_with_resume_auto():
    argv = ["grpo_train.py", "--config", "my dir/trl.yaml", "--learning_rate", "1e-5", "--resume", "runs/x/step_2",
            "--overwrite", "--set", "checkpoint.resume=auto", "--checkpoint.resume=step", "--train.overwrite", "true"]
    line = resume_command(argv, "demo-20260101-000000")
    assert line == ("python grpo_train.py --config 'my dir/trl.yaml' --learning_rate 1e-5 --run-name "
                    "demo-20260101-000000 --resume auto")
    assert resume_command(["/usr/bin/no-such-grpo-dual", "--resume=auto"]) == "/usr/bin/no-such-grpo-dual --resume auto"


def test_the_advice_names_the_last_complete_checkpoint_and_from_python_the_python_call(tmp_path):
    for step in (2, 4):
        folder = tmp_path / "run" / ckpt.CKPT_DIR / f"{ckpt.PREFIX}{step:06d}"
        folder.mkdir(parents=True)
        (folder / ckpt.MANIFEST).write_text("{}")
    try:
        note_command_line(None)
        text = resume_advice(tmp_path / "run", "run")
        assert f"The last complete checkpoint is {tmp_path / 'run' / 'checkpoints' / 'step_000004'}" in text, text
        assert 'train(...) again with checkpoint={"resume": "auto"}' in text, text
        assert "trainer.train(resume_from_checkpoint=True)" in text, text
        note_command_line(["grpo-dual", "--preset", "custom"])
        assert resume_advice(tmp_path / "none", "").startswith("No complete checkpoint was written")
    finally:
        note_command_line(None)


def test_a_reference_that_does_not_fit_leaves_no_temporary_folder(tmp_path, monkeypatch):
    import torch

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt, "save_file", full)
    with pytest.raises(OSError):
        ckpt.save_reference(tmp_path, {"w": torch.zeros(2)})
    assert not list((tmp_path / ckpt.CKPT_DIR).glob(".tmp-*"))


def printed_line(text: str) -> list[str]:
    """The command line printed after "resume with:", split as a shell would, `python` this interpreter."""
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.rstrip().endswith("resume with:"))
    words = shlex.split(lines[at + 1])
    assert words[-2:] == ["--resume", "auto"], lines[at + 1]
    return [sys.executable, *words[1:]] if words[0] == "python" else words


def resumes(words: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run the printed line; it must resume from a checkpoint and finish the run."""
    done = subprocess.run(words, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    text = done.stdout + done.stderr
    assert done.returncode == 0, text
    assert "resumed from" in text, text
    return text


def slowed(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`python grpo_train.py argv` as a user starts it (sys.argv as typed), each RL step slowed so that a signal lands
    before the run's end."""
    code = ("import sys, time, grpo_train\nstep = grpo_train.rl_step\n"
            "grpo_train.rl_step = lambda run, n: (time.sleep(0.5), step(run, n))[1]\n"
            f"sys.argv = {['grpo_train.py', *argv]!r}\nsys.exit(grpo_train.command())\n")
    return subprocess.Popen([sys.executable, "-c", code], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def stopped(proc: subprocess.Popen, metrics: Path, signum: int) -> str:
    deadline = time.time() + 300
    while time.time() < deadline and not (metrics.exists() and '"step": 1' in metrics.read_text()):
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.2)
    proc.send_signal(signum)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signum, out
    return out


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_after_a_signal_our_command_line_resumes_as_printed(tmp_path, signum):
    out = stopped(slowed(["--output-dir", str(tmp_path), *OURS], ROOT), _metrics(tmp_path), signum)
    words = printed_line(out)
    assert "--run-name" in words  # the folder was named after the clock: auto must find it again
    resumes(words, ROOT)


def _metrics(root: Path) -> Path:
    class Newest:  # the run folder is named after the clock: whichever appears
        def exists(self) -> bool:
            return any(root.glob("*/metrics.jsonl"))

        def read_text(self) -> str:
            return next(root.glob("*/metrics.jsonl")).read_text()

    return Newest()  # type: ignore[return-value]


@pytest.mark.slow
def test_after_sigterm_a_trl_config_resumes_as_printed(tmp_path):
    import yaml

    shutil.copytree(ROOT / "examples" / "trl_grpo" / "math", tmp_path / "math")
    config = tmp_path / "trl.yaml"
    config.write_text(yaml.safe_dump({
        "model_name_or_path": "builtin:tiny", "reward_funcs": ["tests.trainer_helpers.trl_length_reward"],
        "max_steps": 6, "per_device_train_batch_size": 4, "num_generations": 4, "max_completion_length": 8,
        "use_cpu": True, "save_strategy": "no", "dataset_name": str(tmp_path / "math"),
        "output_dir": str(tmp_path / "out")}))
    env = {**os.environ, "GRPO_DUAL_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    argv = ["--config", str(config), *TINY, "--data.eval_size", "2"]
    out = stopped(slowed(argv, tmp_path, env), tmp_path / "out" / "grpo-dual" / "metrics.jsonl", signal.SIGTERM)
    words = printed_line(out)
    assert words[1:4] == ["grpo_train.py", "--config", str(config)], words  # the user's own command and file
    assert "--run-name" not in words  # the TRL config's run folder has a fixed name
    words[1] = str(ROOT / "grpo_train.py")  # started as `python grpo_train.py` from the repository
    resumes(words, tmp_path, env)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["rl_step", "evaluate_phase"], ids=["second-ctrl-c-mid-run", "ctrl-c-at-the-end"])
def test_a_ctrl_c_that_exits_at_once_names_the_last_checkpoint_and_resumes_as_printed(tmp_path, monkeypatch, where):
    import grpo_train

    original = getattr(grpo_train, where)

    def interrupted(run, at):  # a second Ctrl-C in step 4 (StopRequest raises), or one in the final evaluation
        if at in (4, "after_rl"):
            raise KeyboardInterrupt
        return original(run, at)

    monkeypatch.setattr(grpo_train, where, interrupted)
    code, text = cli_output(["--output-dir", str(tmp_path), *OURS, "--checkpoint.every", "1"])
    assert code == 130, text
    assert "can be started again with the same command" not in text, text
    last = "step_000003" if where == "rl_step" else "step_000006"
    assert f"The last complete checkpoint is {next(tmp_path.glob(f'*/checkpoints/{last}'))}" in text, text
    monkeypatch.undo()
    resumes(printed_line(text), ROOT)


@pytest.mark.slow
def test_a_full_disk_mid_run_names_the_last_checkpoint_and_resumes_as_printed(tmp_path, monkeypatch):
    write_folder = ckpt._write_folder

    def full_at_step_3(tmp, final, files, meta):
        if meta.get("step") == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return write_folder(tmp, final, files, meta)

    monkeypatch.setattr(ckpt, "_write_folder", full_at_step_3)
    code, text = cli_output(["--output-dir", str(tmp_path), *OURS, "--checkpoint.every", "1", "--run-name", "disk"])
    assert code == 1 and "No space left on device" in text, text
    assert f"The last complete checkpoint is {tmp_path / 'disk' / 'checkpoints' / 'step_000002'}" in text, text
    assert not list((tmp_path / "disk" / "checkpoints").glob(".tmp-*"))
    monkeypatch.undo()
    words = printed_line(text)
    assert words.count("--run-name") == 1
    resumes(words, ROOT)
