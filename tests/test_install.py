"""grpo-dual installs as a package: `pip install .` and `pip install -e .` of a clean copy of the checkout into a fresh
virtualenv, then, from another folder, the `grpo-dual` command runs the demo for a few steps, `grpo-check-gpu-memory --help` runs, and a script imports
the Python API and trains the built-in model for a few steps on a datasets.Dataset built in memory, with TRL's
documented reward functions and a peft LoraConfig. Only `grpo` and `grpo_train` are installed at the top
level: nothing generic (`config`, `presets`, `command_line`) lands in site-packages.

The fresh virtualenv borrows this interpreter's packages (torch, transformers, ...) through a .pth file, so pip finds
every dependency of the package already installed and the test needs no download; the package itself is built and
installed for real (setuptools from this environment, no build isolation).
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

SHORT = ["--train.max_steps", "2", "--sft.steps", "2", "--data.demo_size", "48", "--data.eval_size", "4",
         "--train.eval_every", "0", "--train.tensorboard", "false"]
"""The demo, cut to a few steps."""

API_SCRIPT = """
import importlib.util, json, sys
from datasets import Dataset
from peft import LoraConfig
from grpo_train import train


def reward_len(completions, **kwargs):  # TRL's documented example reward function
    return [-abs(20 - len(completion)) for completion in completions]


def reward_num_unique_letters(completions, **kwargs):  # TRL's other documented example
    return [float(len(set(completion))) for completion in completions]


rows = Dataset.from_list([{"prompt": f"Tell me about the number {i}."} for i in range(24)])
run = train(tasks={"numbers": rows}, rewards={"numbers": [reward_len, reward_num_unique_letters]},
            peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
            train={"max_steps": 2, "prompts_per_micro_step": 2, "eval_every": 0, "tensorboard": False,
                   "output_dir": "out", "run_name": "api"},
            rollout={"k": 2, "max_new_tokens": 4}, data={"eval_size": 4})
import grpo, grpo_train
print(json.dumps({"steps": run.progress.step, "verdict": run.report.get("verdict"), "lora": run.policy.is_lora,
                  "grpo": grpo.__file__, "grpo_train": grpo_train.__file__,
                  "generic": [m for m in ("config", "presets", "command_line") if importlib.util.find_spec(m)]}))
"""
"""A newcomer's first run: a Dataset built in memory, TRL's documented reward functions, a LoraConfig, the built-in
model, a few steps."""


def tracked_copy(dest: Path) -> Path:
    """The checkout's tracked files as they are in the working tree (what a clean clone holds), copied to `dest`."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout ({listed.stderr.strip()}): no list of tracked files to copy")
    for rel in filter(None, listed.stdout.split("\0")):
        if (ROOT / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest / rel)
    return dest


def fresh_venv(where: Path) -> Path:
    """A virtualenv without pip or setuptools of its own, seeing this interpreter's packages; returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    outer = [*site.getsitepackages(), sysconfig.get_paths()["purelib"]]
    Path(purelib, "outer.pth").write_text("\n".join(dict.fromkeys(outer)) + "\n")
    return python


def run_ok(cmd: list[str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.parametrize("editable", [False, True], ids=["install", "editable"])
def test_the_installed_command_and_api_train_from_another_folder(tmp_path, editable):
    source = tracked_copy(tmp_path / "checkout")
    python = fresh_venv(tmp_path / "venv")
    run_ok([str(python), "-m", "pip", "install", "-q", "--no-build-isolation", *(["-e"] if editable else []),
            str(source)], cwd=tmp_path)
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    dist_info = next(purelib.glob("grpo_dual-*.dist-info"))
    if not editable:  # what site-packages holds: the package, the trainer module, the metadata, the .pth
        assert sorted(p.name for p in purelib.iterdir() if p.name not in ("__pycache__", "outer.pth")) == \
            sorted(["grpo", "grpo_train.py", dist_info.name])
        assert (purelib / "grpo" / "grading" / "rubrics" / "fairness.txt").is_file()  # package data travels
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    command = tmp_path / "venv" / "bin" / "grpo-dual"
    out = run_ok([str(command), *SHORT, "--output-dir", "out", "--run-name", "cli"], cwd=elsewhere).stdout
    report = json.loads((elsewhere / "out" / "cli" / "report.json").read_text())
    assert report["verdict"] and "run folder: out/cli" in out
    assert (elsewhere / "out" / "cli" / "final").is_dir()
    memory = run_ok([str(tmp_path / "venv" / "bin" / "grpo-check-gpu-memory"), "--help"], cwd=elsewhere).stdout
    assert "--estimate" in memory  # the tool the out-of-memory message names, installed with the package

    (elsewhere / "use_api.py").write_text(API_SCRIPT)
    result = json.loads(run_ok([str(python), "use_api.py"], cwd=elsewhere).stdout.strip().splitlines()[-1])
    assert result["steps"] == 2 and result["verdict"] and result["lora"]
    home = source if editable else purelib
    assert Path(result["grpo"]).is_relative_to(home) and Path(result["grpo_train"]).is_relative_to(home)
    assert result["generic"] == []
