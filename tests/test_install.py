"""grpo-dual installs as a package: the README's first set-up command (`pip install torch==2.13.0 -e .` in a fresh
virtualenv, from a clean copy of the checkout) and `pip install .`. Then, from another folder, the `grpo-dual` command
runs the demo for a few steps, `grpo-check-gpu-memory --help` runs, and a script imports the Python API and trains the
built-in model for a few steps on a datasets.Dataset built in memory, with TRL's documented reward functions and a
peft LoraConfig; and every `grpo-dual` / `grpo-check-gpu-memory` command the docs show (their ```bash blocks, and
the README's inline ones) runs as it is written, from the checkout, after the README's set-up alone. Only `grpo` and
`grpo_train` are installed at the top level: nothing generic (`config`, `presets`, `command_line`) lands in
site-packages.

The fresh virtualenv borrows this interpreter's packages (torch, transformers, ...) through a .pth file, so pip finds
every dependency of the package already installed and the test needs no download; the package itself is built and
installed for real (setuptools from this environment: the README's command with --no-build-isolation, which is all
that changes in it). The commands run without a network (HF_HUB_OFFLINE=1): the docs' Hub ids are refused before any
work, as docs/TRL.md says they are offline.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
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


def use_the_package(python: Path, bin_dir: Path, tmp_path: Path) -> dict[str, str]:
    """From a folder outside the checkout: the `grpo-dual` command trains the demo for a few steps,
    `grpo-check-gpu-memory --help` runs, the Python API trains; their outputs and the run's files (`check_the_package`
    reads them)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "use_api.py").write_text(API_SCRIPT)
    # the three at once, each its own process (the runs in their own folders, out/cli and out/api): a short run of the
    # tiny model keeps less than two cores busy, so together they end sooner than one after another
    commands = [[str(bin_dir / "grpo-dual"), *SHORT, "--output-dir", "out", "--run-name", "cli"],
                [str(bin_dir / "grpo-check-gpu-memory"), "--help"], [str(python), "use_api.py"]]
    with ThreadPoolExecutor(len(commands)) as pool:
        cli, memory, api = (done.stdout for done in pool.map(lambda cmd: run_ok(cmd, cwd=elsewhere), commands))
    return {"cli": cli, "memory": memory, "api": api, "elsewhere": str(elsewhere)}


def check_the_package(used: dict[str, str], home: Path) -> None:
    """What `use_the_package` saw: the demo trained (a verdict, the final model) in its folder, the memory tool's help,
    and the API's run; `grpo` and `grpo_train` are the ones under `home`."""
    elsewhere = Path(used["elsewhere"])
    report = json.loads((elsewhere / "out" / "cli" / "report.json").read_text())
    assert report["verdict"] and "run folder: out/cli" in used["cli"]
    assert (elsewhere / "out" / "cli" / "final").is_dir()
    assert "--estimate" in used["memory"]  # the tool the out-of-memory message names, installed with the package

    result = json.loads(used["api"].strip().splitlines()[-1])
    assert result["steps"] == 2 and result["verdict"] and result["lora"]
    assert Path(result["grpo"]).is_relative_to(home) and Path(result["grpo_train"]).is_relative_to(home)
    assert result["generic"] == []


def pip_installed(root: Path) -> dict:
    """`pip install` of a clean copy of the checkout into a fresh virtualenv, then the package used from another
    folder: its site-packages and what `use_the_package` saw."""
    source = tracked_copy(root / "checkout")
    python = fresh_venv(root / "venv")
    run_ok([str(python), "-m", "pip", "install", "-q", "--no-build-isolation", str(source)], cwd=root)
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    listed = sorted(p.name for p in purelib.iterdir() if p.name not in ("__pycache__", "outer.pth"))
    return {"purelib": purelib, "listed": listed, "used": use_the_package(python, root / "venv" / "bin", root)}


def test_pip_install_puts_the_package_alone_into_site_packages_and_it_trains_from_another_folder(tmp_path):
    installed = pip_installed(tmp_path)
    purelib = installed["purelib"]
    dist_info = next(purelib.glob("grpo_dual-*.dist-info"))
    # what site-packages holds right after the install: the package, the trainer module, the metadata, the .pth
    assert installed["listed"] == sorted(["grpo", "grpo_train.py", dist_info.name])
    assert (purelib / "grpo" / "grading" / "rubrics" / "fairness.txt").is_file()  # package data travels
    check_the_package(installed["used"], purelib)


# ------------------------------------------------------------------------------ the README's set-up, then the docs
COMMANDS = ("grpo-dual", "grpo-check-gpu-memory")
"""The commands the README's set-up puts on the PATH."""
DOCS = ("README.md", "MEMORY_OPTIMIZATION.md", "QUICK_START.md", "BUG_FIXES_SUMMARY.md", *(
    f"docs/{p.name}" for p in sorted((ROOT / "docs").glob("*.md"))))


def bash_lines(text: str) -> list[str]:
    """The command lines of a document's ```bash blocks: a trailing backslash joins lines, comments dropped."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                lines.append(" ".join(line.split()))
    return lines


def readme_setup() -> list[str]:
    """The words of the `pip install ...` part of the README's first set-up command (the one that runs the demo)."""
    setup = next(c for c in bash_lines((ROOT / "README.md").read_text()) if "pip install" in c and "grpo_train" in c)
    (pip,) = [part.strip() for part in setup.split("&&") if part.strip().startswith("pip install")]
    return pip.split()


def documented_commands() -> list[str]:
    """Every command line of the docs that starts with a command the README's set-up installs: the ```bash blocks'
    lines, and the README's inline `grpo-dual ...` / `grpo-check-gpu-memory ...` with arguments."""
    found: list[str] = []
    for name in DOCS:
        path = ROOT / name
        if not path.is_file():
            continue
        text = path.read_text()
        found += [line for line in bash_lines(text) if line.split()[0] in COMMANDS]
        if name == "README.md":
            found += [" ".join(c.split()) for c in re.findall(r"`([^`\n]+)`", text)
                      if len(c.split()) > 1 and c.split()[0] in COMMANDS]
    return list(dict.fromkeys(found))


def hub_ids(line: str, cwd: Path) -> list[str]:
    """The model and dataset arguments of a command line that name no local path: Hugging Face Hub ids."""
    words = line.split()
    return [words[i + 1] for i, w in enumerate(words[:-1]) if w in ("--model_name_or_path", "--dataset_name")
            and "/" in words[i + 1] and not (cwd / words[i + 1]).exists()]


def as_typed(line: str, setup: dict, timeout: int = 600) -> subprocess.CompletedProcess:
    """`line` run by the shell as a user types it, in the checkout, with the set-up's virtualenv first on the PATH
    and no network."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env.update(PATH=f"{setup['bin']}:{env.get('PATH', '')}", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    return subprocess.run(line, shell=True, cwd=setup["checkout"], capture_output=True, text=True, timeout=timeout,
                          env=env)


def readme_setup_in(root: Path) -> dict:
    """A clean copy of the checkout and a fresh virtualenv under `root`, after the README's set-up command in it:
    {checkout, python, bin}."""
    checkout = tracked_copy(root / "checkout")
    python = fresh_venv(root / "venv")
    words = readme_setup()
    assert words[:2] == ["pip", "install"] and "-e" in words and "." in words, words  # the checkout, as a package
    run_ok([str(python), "-m", "pip", "install", "-q", "--no-build-isolation", *words[2:]], cwd=checkout)
    return {"checkout": checkout, "python": python, "bin": root / "venv" / "bin"}


@pytest.fixture(scope="module")
def readme_setup_done(tmp_path_factory) -> dict:
    """`readme_setup_in`, once for the module."""
    return readme_setup_in(tmp_path_factory.mktemp("readme"))


def test_the_readme_setup_installs_the_checkout_and_its_commands(readme_setup_done, tmp_path):
    """The README's first command leaves `grpo-dual` and `grpo-check-gpu-memory` on the PATH (they were not, and the
    docs' `grpo-dual --config ...` answered `command not found`), running the checkout's code."""
    for command in COMMANDS:
        assert (readme_setup_done["bin"] / command).is_file(), f"the README's set-up does not install {command}"
    check_the_package(use_the_package(readme_setup_done["python"], readme_setup_done["bin"], tmp_path),
                      readme_setup_done["checkout"])


SMOLLM2 = "smollm2-135m-instruct"
"""The packaged model docs/TRL.md's offline command trains (requirements/model.txt)."""


def test_every_documented_command_runs_as_written_after_the_readme_setup(readme_setup_done):
    """Each documented command but the SmolLM2 runs (next test): exit 0, or, for a Hub id without a network, the
    refusal docs/TRL.md describes (exit 2, the id named, before any work). `grpo-dual --help` fits the terminal."""
    lines = [line for line in documented_commands() if SMOLLM2 not in line
             and "examples/trl_grpo/grpo.yaml" not in line]
    assert any(line.startswith("grpo-dual --help") for line in lines)
    assert any(line.startswith("grpo-check-gpu-memory --estimate") for line in lines)
    with ThreadPoolExecutor(2) as pool:  # each its own process, none writes: two at a time on two cores
        dones = list(pool.map(lambda line: as_typed(line, readme_setup_done), lines))
    for line, done in zip(lines, dones, strict=True):
        assert done.returncode != 127, f"`{line}`: command not found"
        hub = hub_ids(line, readme_setup_done["checkout"])
        if hub:
            assert done.returncode == 2 and any(f"={name!r}" in done.stderr for name in hub), (line, done.stderr)
            assert "Traceback" not in done.stderr and "HF_HUB_OFFLINE" in done.stderr, (line, done.stderr)
        else:
            assert done.returncode == 0, (f"`{line}` exited {done.returncode}:\n{done.stdout[-2000:]}\n"
                                          f"{done.stderr[-2000:]}")


def test_the_documented_smollm2_runs_train_as_written_and_output_dir_loads(readme_setup_done, smollm2_folder):
    """docs/TRL.md's offline `trl grpo` command (TRL's documented line with the program name changed, a local dataset
    and SmolLM2-135M-Instruct, 2 steps) and the same run from its config file, `grpo-dual --config
    examples/trl_grpo/grpo.yaml`, as written: each trains, and from_pretrained(output_dir) loads the final model and its
    tokenizer as after TRL's trainer.save_model(output_dir), the run's own final/ beside its records."""
    pytest.importorskip("math_verify")  # TRL's accuracy_reward (requirements/dev.txt)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    lines = [line for line in documented_commands() if SMOLLM2 in line or "examples/trl_grpo/grpo.yaml" in line]
    assert any("--config examples/trl_grpo/grpo.yaml" in line for line in lines) and len(lines) >= 2, lines
    checkout = readme_setup_done["checkout"]
    for line in lines:  # one after another: two at once share the cores, and each must end within as_typed's limit
        done = as_typed(line, readme_setup_done)
        assert done.returncode == 0, f"`{line}` exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        words = line.split()
        out = checkout / (words[words.index("--output_dir") + 1] if "--output_dir" in words else "smollm2-grpo-yaml")
        assert "accuracy_reward" in json.loads((out / "grpo-dual" / "config.json").read_text())["rewards"]["math"]
        loaded = AutoModelForCausalLM.from_pretrained(out)  # as after TRL's trainer.save_model(output_dir)
        final = AutoModelForCausalLM.from_pretrained(out / "grpo-dual" / "final")
        assert type(loaded).__name__ == "LlamaForCausalLM" and loaded.num_parameters() > 100_000_000
        assert all(torch.equal(a, b)
                   for a, b in zip(loaded.state_dict().values(), final.state_dict().values(), strict=True))
        assert AutoTokenizer.from_pretrained(out).eos_token == "<|im_end|>"
