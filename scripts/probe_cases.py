"""The reliability probe's cases (scripts/reliability_probe.py): what each case writes into its folder, how it runs
the trainer there, and the list of cases by group (what goes wrong)."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path
from typing import Callable

from scripts.probe_lab import EITHER, HANDLE, REFUSE, SECOND_RUN_LIMIT_S, Case, Lab, Proc, Trial, Word, last_line

# ------------------------------------------------------------------------------------------------ what cases write
ROWS = [{"id": f"q{i}", "prompt": f"Is {i} even? Reply yes or no.", "answer": "yes" if i % 2 == 0 else "no"}
        for i in range(24)]
LENGTH_REWARD = "def my_grader(completion, gold):\n    return min(len(completion), 10) / 10\n"
TASK = ["--data.source", "none", "--tasks.t.path", "rows.jsonl", "--set", "rewards.t=reward.py:my_grader"]
"""A task of the user's own: rows.jsonl graded by reward.py:my_grader (written by `own_task`)."""


def own_task(lab: Lab, reward: str = LENGTH_REWARD, rows: list[dict] = ROWS) -> list[str]:
    lab.write("rows.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    lab.write("reward.py", reward)
    return TASK


def demo_rewards(name: str) -> list[str]:
    """Both demo tasks graded by reward.py:<name> only."""
    return ["--set", f"rewards.fairness=reward.py:{name}:1.0", "--set", f"rewards.hallucination=reward.py:{name}:1.0"]


def mid_run(body: str) -> str:
    """A reward function that scores normally until the run has written its first metrics row, then does `body`."""
    return ("import os, sys, time\n"
            "def my_grader(completion, gold):\n"
            "    if os.path.exists('runs/r/metrics.jsonl'):\n"
            f"        {body}\n"
            "    return min(len(completion), 10) / 10\n")


def refused(*args: str, env: dict[str, str | None] | None = None, files: dict[str, str | bytes] | None = None,
            task: bool = False, run: bool = True) -> Callable[[Lab], Trial]:
    """An act that writes `files`, then runs the tiny demo (with the user's task when `task`) with `args`."""
    def act(lab: Lab) -> Trial:
        for name, content in (files or {}).items():
            lab.write(name, content)
        extra = own_task(lab) if task else []
        return Trial(lab.cli(*extra, *args, env=lab.env(**(env or {})), run=run))
    return act


def checkpointed(lab: Lab, *args: str) -> Proc:
    """A finished 2-step run of the user's task with a checkpoint per step, that resumes then act on."""
    proc = lab.cli(*own_task(lab), "--checkpoint.every", "1", *args)
    if proc.code != 0:
        raise RuntimeError(f"the run to resume did not finish (exit {proc.code}): {last_line(proc.err)}")
    return proc


# ------------------------------------------------------------------------------------------------ the cases' acts
HF_FILES = {"config.json": '{"model_type": "llama"}', "model.safetensors": "weights", "tokenizer.json": "{}",
            "tokenizer_config.json": "{}", "generation_config.json": "{}", "chat_template.jinja": "{{ messages }}"}


def overwrite_hf_folder(lab: Lab) -> Trial:
    for name, text in HF_FILES.items():
        lab.write(f"runs/hf/{name}", text)
    proc = lab.cli("--output-dir", "runs", "--run-name", "hf", "--overwrite", run=False)
    lost = [f"runs/hf/{n} deleted or changed" for n, t in HF_FILES.items()
            if not (lab.dir / "runs" / "hf" / n).is_file() or (lab.dir / "runs" / "hf" / n).read_text() != t]
    return Trial(proc, lost=lost)


def tilde_output_dir(lab: Lab) -> Trial:
    home_dir = lab.dir / "home"
    home_dir.mkdir()
    proc = lab.cli("--output-dir=~/runs", "--run-name", "r", env=lab.env(HOME=str(home_dir)), run=False)
    lost = ["made a folder literally named ~"] if (lab.dir / "~").exists() else []
    if proc.code == 0 and not (home_dir / "runs" / "r" / "config.json").is_file():
        lost.append("exit 0 but no run folder under $HOME/runs")
    return Trial(proc, lost=lost)


def two_runs(resume: bool) -> Callable[[Lab], Trial]:
    """A long run of the demo, then the same command (with --resume auto when `resume`) while it trains."""
    def act(lab: Lab) -> Trial:
        first = lab.start("--max-steps", "100000", "--checkpoint.every", "1")
        folder = lab.dir / "runs" / "r"
        ready = ((lambda: any((folder / "checkpoints").glob("step_*"))) if resume
                 else (lambda: (folder / "config.json").exists()))
        if not lab.wait_for(ready, first):
            raise RuntimeError(f"the first run did not start: {last_line((lab.dir / 'background.log').read_text())}")
        second = lab.cli("--max-steps", "100000", "--checkpoint.every", "1", *(["--resume", "auto"] if resume else []),
                         limit_s=SECOND_RUN_LIMIT_S)
        lost = []
        if second.code is None:  # not refused: it trained the same folder until the limit
            lost.append(f"the second run trained the same folder for {SECOND_RUN_LIMIT_S:.0f} s (killed)")
            second = Proc(0, second.out, second.err, second.seconds)
        if first.poll() is not None:
            lost.append(f"the first run ended (exit {first.returncode}) while the second started")
        if not (folder / "config.json").exists():
            lost.append("the first run's folder was wiped")
        return Trial(second, lost=lost, words=[str(first.pid)])
    return act


def resume_changed(change: str) -> Callable[[Lab], Trial]:
    """A finished 2-step run of the user's task, one input changed, then `--resume auto --max-steps 4`."""
    def act(lab: Lab) -> Trial:
        checkpointed(lab)
        args = ["--checkpoint.every", "1", "--resume", "auto", "--max-steps", "4"]
        if change == "data":
            other = [{"id": f"z{i}", "prompt": f"Name a colour number {i}.", "answer": "red"} for i in range(30)]
            lab.write("rows.jsonl", "".join(json.dumps(r) + "\n" for r in other))
        elif change == "reward":
            lab.write("reward.py", LENGTH_REWARD.replace("/ 10", "/ 5"))
        elif change == "max_steps":
            args = ["--checkpoint.every", "1", "--resume", "auto", "--max-steps", "1"]
        elif change == "overwrite":
            args += ["--overwrite"]
        return Trial(lab.cli(*TASK, *args))
    return act


def failed_start_retry(*flags: str) -> Callable[[Lab], Trial]:
    """A start with a model folder that fails to load (a config.json, no weights: it passes the early check that the
    path exists, so the run folder is made before the load fails), then the same command with the built-in model."""
    def act(lab: Lab) -> Trial:
        lab.write("bad_model/config.json", '{"model_type": "llama"}')
        first = lab.cli("--model.name", "bad_model", *flags)
        if first.code == 0:
            return Trial(first, lost=["a model folder without weights ran to exit 0"])
        second = lab.cli(*flags)
        return Trial(second, texts=[first.out, first.err])
    return act


def sigkill_then_resume(lab: Lab) -> Trial:
    """SIGKILL a run after its first checkpoint (its folder lock dies with it), then `--resume auto`."""
    first = lab.start("--max-steps", "100000", "--checkpoint.every", "1")
    if not lab.wait_for(lambda: any((lab.dir / "runs" / "r" / "checkpoints").glob("step_*")), first):
        raise RuntimeError(f"the run to kill did not start: {last_line((lab.dir / 'background.log').read_text())}")
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    return Trial(lab.cli("--max-steps", "3", "--checkpoint.every", "1", "--resume", "auto"))


def wandb_missing(lab: Lab) -> Trial:
    lab.write("shim/wandb/__init__.py", "raise ModuleNotFoundError(\"No module named 'wandb'\", name='wandb')\n")
    path = os.pathsep.join([str(lab.dir / "shim"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return Trial(lab.cli("--train.wandb_project", "probe", env=lab.env(PYTHONPATH=path)))


def judge_args(lab: Lab) -> list[str]:
    return ["--set", "rewards.fairness=llm_judge:1.0", "--judge.base_url", lab.judge_url(), "--judge.api_key_env", "",
            "--judge.max_retries", "0", "--judge.timeout_s", "5"]


def judge_rate(lab: Lab) -> Trial:
    return Trial(lab.cli(*judge_args(lab), "--judge.rate_limit_per_s", "1e-9"))


def judge_cache_folder(lab: Lab) -> Trial:
    (lab.dir / "cache_folder").mkdir()
    return Trial(lab.cli(*judge_args(lab), "--judge.cache_path", "cache_folder"))


def truncated_weights(lab: Lab) -> Trial:
    base = lab.cli("--max-steps", "1")
    if base.code != 0:
        raise RuntimeError(f"the run whose final/ is the model did not finish: {last_line(base.err)}")
    model = lab.dir / "model"
    shutil.copytree(lab.dir / "runs" / "r" / "final", model)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return Trial(lab.cli("--model.name", "model", "--run-name", "t"))


def template_attribute(lab: Lab) -> Trial:
    own_task(lab)
    return Trial(lab.cli(*TASK, "--tasks.t.template", "{prompt.__class__} {answer}"))


def csv_task(text: str) -> Callable[[Lab], Trial]:
    def act(lab: Lab) -> Trial:
        lab.write("rows.csv", text.encode("utf-8"))
        lab.write("reward.py", LENGTH_REWARD)
        return Trial(lab.cli("--data.source", "none", "--tasks.t.path", "rows.csv", "--set",
                             "rewards.t=reward.py:my_grader"))
    return act


CSV_ROWS = "id,prompt,answer\n" + "".join(f"{r['id']},{r['prompt']},{r['answer']}\n" for r in ROWS)
RAGGED = CSV_ROWS.replace("q5,Is 5 even? Reply yes or no.,no\n", "q5,Is 5 even? Reply yes or no.,no,extra,cells\n")


def home(value: str | None, **more: str) -> Callable[[Lab], Trial]:
    """The user's CSV task (read through `datasets`, which caches under $HF_HOME, by default ~/.cache) with HOME
    changed (None: unset) and `more` environment variables."""
    def act(lab: Lab) -> Trial:
        lab.write("rows.csv", CSV_ROWS)
        lab.write("reward.py", LENGTH_REWARD)
        env = lab.env(HOME=value, **more)
        for var in ("HF_HOME", "HF_DATASETS_CACHE", "XDG_CACHE_HOME"):
            if var not in more:
                env.pop(var, None)
        proc = lab.cli("--data.source", "none", "--tasks.t.path", "rows.csv", "--set", "rewards.t=reward.py:my_grader",
                       env=env)
        return Trial(proc)
    return act


SEED = str(2 ** 70)
HOME_WORDS: tuple[Word, ...] = (("HOME", "HF_HOME", "HF_DATASETS_CACHE", "XDG_CACHE_HOME"),)
"""A cache that cannot be written: the message says which variable to point at a writable folder."""

CASES: tuple[Case, ...] = (
    Case("baseline", "control", HANDLE, (), refused(), why="a valid tiny run: the probe's control"),
    # data lost
    Case("overwrite-hf-model-folder", "data lost", REFUSE, ("runs/hf",), overwrite_hf_folder,
         why="--overwrite onto a Hugging Face model folder (config.json, model.safetensors, ...)"),
    Case("output-dir-tilde", "data lost", EITHER, ("~",), tilde_output_dir,
         why="--output-dir=~/runs with no shell to expand it: expanded, or refused naming ~"),
    # two runs, one folder
    Case("two-runs-one-folder", "two runs", REFUSE, ("runs/r",), two_runs(resume=False),
         why="the same command started while the first run trains: refused at once, naming the PID and the folder"),
    Case("resume-while-running", "two runs", REFUSE, ("runs/r",), two_runs(resume=True),
         why="--resume auto while the same run is still training"),
    # resume that accepts a different run
    Case("resume-changed-data", "resume", REFUSE, ("rows.jsonl",), resume_changed("data"),
         why="the task's data file replaced by other rows (the built-in tokenizer is built from the rows: the message "
             "names the file, not an embedding shape)"),
    Case("resume-changed-reward", "resume", REFUSE, ("my_grader",), resume_changed("reward"),
         why="the reward function's code changed"),
    Case("resume-max-steps-below", "resume", REFUSE, (("train.max_steps", "--max-steps"),), resume_changed("max_steps"),
         why="--max-steps 1 against a step-2 checkpoint (it ended at step 2)"),
    Case("resume-auto-overwrite", "resume", REFUSE, ("overwrite", "resume"), resume_changed("overwrite"),
         why="--resume auto --overwrite: two opposite requests, refused rather than one of them ignored"),
    # hangs
    Case("reward-hangs-mid-run", "hang", REFUSE, ("my_grader",),
         refused(*demo_rewards("my_grader"), "--train.reward_timeout_s", "5",
                 files={"reward.py": mid_run("time.sleep(3600)")}),
         why="a reward function that hangs after the first step (train.reward_timeout_s 5)"),
    Case("judge-rate-limit-1e-9", "hang", REFUSE, ("judge.rate_limit_per_s",), judge_rate,
         why="judge.rate_limit_per_s 1e-9 (a fake judge on 127.0.0.1)"),
    Case("prompts-per-micro-step-100000", "hang", REFUSE, ("train.prompts_per_micro_step",),
         refused("--train.prompts_per_micro_step", "100000"), why="more prompts per micro-step than rows"),
    # a run that ends "successfully" when it did not
    Case("reward-sys-exit-preflight", "false success", REFUSE, ("my_grader",),
         refused(*demo_rewards("my_grader"),
                 files={"reward.py": "import sys\ndef my_grader(completion, gold):\n    sys.exit(0)\n"}),
         why="a reward function calling sys.exit(0) on its first call (the preflight)"),
    Case("reward-sys-exit-mid-run", "false success", REFUSE, ("my_grader",),
         refused(*demo_rewards("my_grader"), files={"reward.py": mid_run("sys.exit(0)")}),
         why="a reward function calling sys.exit(0) after the first step"),
    Case("reward-keyboard-interrupt", "false success", REFUSE, ("my_grader",),
         refused(*demo_rewards("my_grader"), files={"reward.py": mid_run("raise KeyboardInterrupt")}),
         why="a reward function raising KeyboardInterrupt after the first step"),
    # a failed start blocks its retry
    Case("failed-start-then-retry", "retry", HANDLE, (), failed_start_retry("--overwrite"),
         why="--overwrite with a model folder that fails to load, then the same command with the built-in model"),
    Case("failed-start-then-retry-plain", "retry", HANDLE, (), failed_start_retry(),
         why="as above without --overwrite"),
    Case("sigkill-then-resume", "retry", HANDLE, (), sigkill_then_resume,
         why="SIGKILL after the first checkpoint, then --resume auto: no stale lock"),
    # tracebacks
    Case("binary-config", "traceback", REFUSE, ("probe.yaml",), refused("--config", "probe.yaml",
         files={"probe.yaml": bytes(range(256)) * 4}), why="a binary, non-UTF-8 --config file"),
    Case("wandb-missing", "traceback", REFUSE, (("train.wandb_project", "pip install wandb"),), wandb_missing,
         why="train.wandb_project without wandb (an `import wandb` that fails, by a PYTHONPATH shim)"),
    Case("temperature-1e-300", "traceback", REFUSE, ("rollout.temperature",),
         refused("--rollout.temperature", "1e-300")),
    Case("judge-cache-path-folder", "traceback", REFUSE, ("judge.cache_path",), judge_cache_folder,
         why="judge.cache_path naming a folder (a fake judge on 127.0.0.1)"),
    Case("truncated-safetensors", "traceback", REFUSE, ("model.safetensors",), truncated_weights,
         why="model.name a run's final/ folder whose model.safetensors was cut in half"),
    # accepted and ignored or mangled
    Case("max-document-chars-negative", "ignored", REFUSE, ("data.max_document_chars",),
         refused("--data.max_document_chars", "-5")),
    Case("presence-penalty-huge", "ignored", REFUSE, ("rollout.presence_penalty",),
         refused("--rollout.presence_penalty", "-1e300")),
    Case("repetition-penalty-tiny", "ignored", REFUSE, ("rollout.repetition_penalty",),
         refused("--rollout.repetition_penalty", "1e-300")),
    Case("run-name-newline", "ignored", REFUSE, (("train.run_name", "--run-name"),),
         refused("--output-dir", "runs", "--run-name", "a\nb", run=False)),
    Case("template-attribute", "ignored", REFUSE, ("tasks.t.template",), template_attribute,
         why="a prompt template reaching into an object ({prompt.__class__})"),
    # vague
    Case("seed-2e70-config", "vague", REFUSE, ("train.seed",),
         refused("--config", "probe.yaml", files={"probe.yaml": f"train:\n  seed: {SEED}\n"}),
         why="a seed above torch's range in a config file"),
    Case("seed-huge-command-line", "vague", REFUSE, (("train.seed", "--seed"),), refused("--seed", "9" * 400)),
    Case("sft-lr-1e300", "vague", REFUSE, ("sft.lr",), refused("--sft.steps", "2", "--sft.lr", "1e300")),
    Case("kl-beta-1e300", "vague", REFUSE, ("kl.default.beta",), refused("--kl.default.beta", "1e300")),
    Case("entropy-coef-1e300", "vague", REFUSE, ("loss.entropy_coef",), refused("--loss.entropy_coef", "1e300")),
    Case("weight-decay-1e300", "vague", REFUSE, ("train.weight_decay",), refused("--train.weight_decay", "1e300")),
    Case("reward-plus-1e308", "vague", REFUSE, ("my_grader",), refused(*demo_rewards("my_grader"),
         files={"reward.py": "def my_grader(completion, gold):\n    return 1e308\n"}), why="a reward returning 1e308"),
    Case("reward-plus-minus-1e308", "vague", REFUSE, ("my_grader",), refused(*demo_rewards("my_grader"),
         files={"reward.py": "def my_grader(completion, gold):\n"
                             "    return 1e308 if len(completion) % 2 else -1e308\n"}),
         why="a reward returning +1e308 or -1e308"),
    Case("csv-utf8-bom", "vague", HANDLE, (), csv_task("\ufeff" + CSV_ROWS),
         why="a CSV whose first bytes are a UTF-8 byte-order mark (valid)"),
    Case("csv-ragged", "vague", REFUSE, ("rows.csv", ("line", "row")), csv_task(RAGGED),
         why="a CSV with a row of too many cells: the message names the file and the line"),
    Case("home-read-only", "vague", EITHER, HOME_WORDS, home("/sys"),
         why="HOME=/sys (read-only even for root) with a CSV task (datasets caches under ~/.cache)"),
    Case("home-missing", "vague", EITHER, HOME_WORDS, home("/proc/no_such_home"),
         why="HOME a folder that does not exist and cannot be made"),
    Case("hf-cache-read-only", "vague", EITHER, HOME_WORDS, home(str(Path.home()), HF_HOME="/sys/hf"),
         why="HF_HOME read-only, HOME fine"),
)
