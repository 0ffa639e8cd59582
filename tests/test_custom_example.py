"""docs/CUSTOM_TASKS.md's example trains as the doc says: its command, read from the doc (so the doc cannot drift),
run as it is on examples/custom_task/ (60 reviews, 60 colors) with only the run folder added, must raise the held-out
reward above the one after SFT; its Python example builds the same config and runs; every config field it names
exists.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys

import pytest
from conftest import ROOT

from grpo import config as C
from grpo.config.command_line import parse_trainer_argv

DOC = ROOT / "docs" / "CUSTOM_TASKS.md"
EXAMPLE = "examples/custom_task/"
RISE = 0.05  # the held-out mean must gain at least this much in RL (one held-out row of 16 is 0.0625 of its task)
RUN_LIMIT_S = 300  # ~35 s on one idle core; a loaded 2-core CI machine may take a few times that


def doc_text() -> str:
    return DOC.read_text()


def example_argv() -> list[str]:
    """The arguments of the doc's one ```bash command that trains the example (continuation lines joined)."""
    blocks = [b for b in re.findall(r"```bash\n(.*?)```", doc_text(), re.S) if EXAMPLE in b]
    assert len(blocks) == 1, f"docs/CUSTOM_TASKS.md should hold one bash command training {EXAMPLE}, found {blocks}"
    words = shlex.split(blocks[0].replace("\\\n", " "), comments=True)
    assert words[:2] == ["python", "grpo_train.py"], words
    return words[2:]


def python_example() -> str:
    blocks = [b for b in re.findall(r"```python\n(.*?)```", doc_text(), re.S) if "from grpo_train import train" in b]
    assert len(blocks) == 1, "docs/CUSTOM_TASKS.md should hold one Python example calling train(...)"
    return blocks[0]


def comparable(cfg: C.Config) -> dict:
    """The config minus where the run goes and the rewards' spelling (a file path on the command line, the function
    itself from Python)."""
    tree = C.to_dict(cfg)
    for key in ("output_dir", "run_name", "tensorboard", "max_steps"):
        tree["train"].pop(key)
    tree["sft"].pop("steps")
    tree.pop("rewards")
    return tree


def test_the_docs_command_parses_to_the_custom_preset_on_both_example_tasks():
    cfg, _ = parse_trainer_argv(example_argv(), prog="grpo_train.py", description="")
    assert cfg.preset == "custom" and cfg.data.source == "none"
    assert sorted(cfg.tasks) == ["colors", "reviews"] and sorted(cfg.rewards) == ["colors", "reviews"]
    for task, source in cfg.tasks.items():
        assert (ROOT / source.path).is_file(), source.path
        assert all((ROOT / term.split(":")[0]).is_file() for term in cfg.rewards[task].split(","))


def test_every_config_field_the_doc_names_exists():
    text = doc_text()
    refs = set(re.findall(r"(?<![\w/.-])--([a-z_]+(?:\.[a-z_0-9<>]+)+)", text))
    refs |= set(re.findall(r"`([a-z_]+(?:\.[a-z_0-9<>]+)+)`", text))
    sections = {f.name: f.type for f in dataclasses.fields(C.Config)}
    checked = 0
    for ref in sorted(refs):
        head, *rest = ref.split(".")
        if head not in sections or ref.endswith((".py", ".jsonl", ".csv", ".md", ".json", ".txt", ".ipynb")):
            continue  # a file name or a module path, not a field
        checked += 1
        if head in C.DICT_SECTIONS or head == "kl":  # tasks.<task>.field, reward_models.<name>.field, kl.<task>.field
            kind = C.DICT_SECTIONS.get(head, C.TaskKLConfig)
            assert len(rest) in (1, 2), ref
            if len(rest) == 2 and rest[1] != "<field>":
                assert rest[1] in {f.name for f in dataclasses.fields(kind)}, ref
        elif head == "rewards":
            assert len(rest) == 1, ref
        else:
            section = type(getattr(C.Config(), head))
            assert len(rest) == 1 and rest[0] in {f.name for f in dataclasses.fields(section)}, ref
    assert checked >= 10  # the pattern still finds the doc's fields


def test_the_docs_python_example_runs_and_builds_the_commands_config(tmp_path, monkeypatch):
    """The Python example, as written, through the real `train` with a 2-step budget and a temporary run folder."""
    import grpo_train

    real, runs = grpo_train.train, []

    def short_train(*args, **kwargs):
        kwargs["train"] = {**kwargs.get("train", {}), "output_dir": str(tmp_path), "run_name": "python",
                           "max_steps": 2, "tensorboard": False}
        kwargs["sft"] = {**kwargs.get("sft", {}), "steps": 2}
        runs.append(real(*args, **kwargs))
        return runs[-1]

    monkeypatch.setattr(grpo_train, "train", short_train)
    monkeypatch.chdir(ROOT)  # the doc's paths are relative to the repository
    exec(compile(python_example(), str(DOC), "exec"), {"__name__": "docs_example"})
    (run,) = runs
    assert set(run.report["tasks"]) == {"reviews", "colors"}
    cli_cfg, _ = parse_trainer_argv(example_argv(), prog="grpo_train.py", description="")
    assert comparable(run.cfg) == comparable(cli_cfg)
    assert run.cfg.rewards == {"reviews": "answer_matches", "colors": "answer_matches"}


def quoted_errors() -> list[tuple[list[str], str]]:
    """The doc's indented examples of a failing command: (its arguments, the error text it quotes)."""
    examples = []
    for block in re.findall(r"((?:^    .*\n)+)", doc_text(), re.M):
        lines = [line[4:] for line in block.splitlines()]
        if lines[0].startswith("$ python grpo_train.py"):
            command = " ".join(lines).split("error:")[0]
            quoted = " ".join(line.strip() for line in lines if not line.startswith(("$", "    --")))
            examples.append((shlex.split(command.replace("\\", " "))[3:], quoted))
    return examples


def test_the_docs_error_examples_are_what_the_trainer_prints(tmp_path):
    examples = quoted_errors()
    assert len(examples) == 2, examples
    for argv, quoted in examples:
        done = subprocess.run([sys.executable, "grpo_train.py", *argv, "--output-dir", str(tmp_path)], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]  # before the model loads
        assert " ".join(done.stderr.split()) == quoted, (done.stderr, quoted)
        assert not any(tmp_path.iterdir())  # nothing was written: the run folder is made after the checks


@pytest.mark.slow
def test_the_docs_command_trains_the_example_and_the_heldout_reward_rises(tmp_path):
    argv = example_argv() + ["--output-dir", str(tmp_path), "--run-name", "doc", "--train.tensorboard", "false"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "grpo_train.py", *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=RUN_LIMIT_S)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_dir = tmp_path / "doc"
    evals = json.loads((run_dir / "eval.json").read_text())
    report = json.loads((run_dir / "report.json").read_text())
    assert set(evals["after_rl"]) == {"reviews", "colors"}
    mean = {tag: sum(evals[tag].values()) / len(evals[tag]) for tag in ("before_sft", "after_sft", "after_rl")}
    assert mean["after_rl"] >= mean["after_sft"] + RISE, evals  # RL, not only the warm-up, raised it
    assert mean["after_sft"] > mean["before_sft"]
    for task, row in report["tasks"].items():  # the report says the same, per task; no task got worse in RL
        assert row["after_rl"] == evals["after_rl"][task] and row["after_rl"] >= row["after_sft"], report["tasks"]
    assert "the settings of preset 'custom' apply" in done.stdout
