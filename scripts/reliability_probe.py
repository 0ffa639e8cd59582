"""A tester's probe of the command line: bad inputs and faults a user meets, each tried as a user would.

    python -m scripts.reliability_probe                   # every case (about 15 minutes on 2 CPU cores)
    python -m scripts.reliability_probe --only seed-2e70-config temperature-1e-300
    python -m scripts.reliability_probe --list            # the cases, their groups and the words each message needs

Each case writes what it needs (rows, a reward function, a config file, a fake model folder) into a temporary folder
of its own, runs `python grpo_train.py` there on the tiny demo model (a few RL steps, no warm-up) under a time limit,
and classifies what came out:

    OK-refused   exit status not 0, no traceback, and the message names every word the case lists (field, file)
    OK-handled   valid input (or a fault the program may absorb), exit status 0, nothing lost
    TRACEBACK    a Python traceback anywhere in the output
    SILENT       exit status 0 where the input should be refused, or something the user owns lost or mangled
    HANG         still running at the case's time limit (killed)
    VAGUE        refused, but the message does not name what the case lists
    REFUSED      valid input refused

A message is the standard error plus the last lines of the standard output; words are matched case-sensitively (a
field name is lower case, an environment variable upper case). Prints a table and a count per outcome; exit status
1 when any case is not OK-*. Words that may take several forms are alternatives ("train.max_steps" or
"--max-steps"). The cases are listed by group (what goes wrong); `baseline` is a valid run that checks the probe
itself.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "grpo_train.py"
TINY = ["--model.tiny_hidden", "32", "--model.tiny_layers", "1", "--model.tiny_heads", "2", "--data.demo_size", "24",
        "--data.eval_size", "2", "--rollout.max_new_tokens", "4", "--rollout.k", "2", "--sft.steps", "0",
        "--train.eval_every", "0", "--train.sample_every", "0", "--train.tensorboard", "false",
        "--train.prompts_per_micro_step", "2", "--train.lr", "1e-2", "--max-steps", "2"]
"""The demo preset cut to seconds: tests/test_reliability.py's tiny settings."""
RUN = ["--output-dir", "runs", "--run-name", "r"]
"""Every case's run folder: <case folder>/runs/r (relative: cases run in their own folder)."""
LIMIT_S = 120.0  # a tiny run takes 5-20 s on a shared 2-core machine; 120 s is a hang, not a slow start
SECOND_RUN_LIMIT_S = 60.0  # a second run into a folder in use is refused at once; one still going at 60 s trains
TAIL_LINES = 30  # the last lines of stdout that count as the message (a run that stops prints its reason last)
TRACEBACK = "Traceback (most recent call last)"

REFUSE, HANDLE, EITHER = "refuse", "handle", "either"
OK_REFUSED, OK_HANDLED = "OK-refused", "OK-handled"
FAILURES = ("TRACEBACK", "SILENT", "HANG", "VAGUE", "REFUSED")
OUTCOMES = (OK_REFUSED, OK_HANDLED, *FAILURES)

Word = str | tuple[str, ...]
"""A word the message must hold; a tuple: any one of them."""


@dataclass
class Proc:
    """What one command gave."""

    code: int | None
    """Exit status; None when the time limit killed it."""
    out: str
    err: str
    seconds: float

    @property
    def message(self) -> str:
        return "\n".join([self.err, *self.out.splitlines()[-TAIL_LINES:]])


@dataclass
class Trial:
    """What a case's act found: the command that decides (`proc`), every output that must hold no traceback, what
    the user lost, and words known only once it ran (a PID)."""

    proc: Proc
    texts: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    words: list[Word] = field(default_factory=list)


@dataclass(frozen=True)
class Case:
    name: str
    group: str
    """What goes wrong: data lost, two runs, resume, hang, false success, retry, traceback, ignored, ..."""
    expect: str
    """refuse | handle | either (valid or refused with the words: both fine)."""
    words: tuple[Word, ...]
    act: Callable[["Lab"], Trial]
    limit_s: float = LIMIT_S
    why: str = ""


# ------------------------------------------------------------------------------------------------ running commands
class Lab:
    """A case's folder and the way it runs the trainer: cwd = the folder, one torch thread, the case's time limit."""

    def __init__(self, folder: Path, limit_s: float, judge_url: Callable[[], str]):
        self.dir = folder
        self.limit_s = limit_s
        self.judge_url = judge_url
        self.background: list[subprocess.Popen] = []
        self.runs = 0

    def write(self, name: str, content: str | bytes) -> Path:
        path = self.dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        return path

    def env(self, **changes: str | None) -> dict[str, str]:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
        for key, value in changes.items():
            env.pop(key, None) if value is None else env.__setitem__(key, value)
        return env

    def argv(self, *args: str, run: bool = True) -> list[str]:
        return [sys.executable, str(TRAIN), *TINY, *(RUN if run else []), *args]

    def cli(self, *args: str, env: dict[str, str] | None = None, run: bool = True, limit_s: float | None = None) -> Proc:
        """Run the trainer to its end (or the time limit: killed with its process group, code None)."""
        start = time.time()
        proc = subprocess.Popen(self.argv(*args, run=run), cwd=self.dir, env=env or self.env(), text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=limit_s or self.limit_s)
            code: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            code = None
        self.runs += 1  # kept with the case's folder (--keep): what each command printed
        (self.dir / f"command_{self.runs}.txt").write_text(f"{self.argv(*args, run=run)}\nexit {code}\n"
                                                           f"--- stderr\n{err}\n--- stdout\n{out}")
        return Proc(code, out, err, time.time() - start)

    def start(self, *args: str, log: str = "background.log") -> subprocess.Popen:
        """Start the trainer in the background (output to a file: a pipe nobody reads blocks it when full)."""
        with open(self.dir / log, "w") as fh:
            proc = subprocess.Popen(self.argv(*args), cwd=self.dir, env=self.env(), stdout=fh, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        self.background.append(proc)
        return proc

    def wait_for(self, ready: Callable[[], bool], proc: subprocess.Popen, limit_s: float = 90.0) -> bool:
        deadline = time.time() + limit_s
        while time.time() < deadline and proc.poll() is None:
            if ready():
                return True
            time.sleep(0.1)
        return ready()

    def stop_background(self) -> None:
        for proc in self.background:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


def classify(case: Case, trial: Trial) -> tuple[str, str]:
    """(outcome, a short note) of one case: see the module docstring."""
    proc = trial.proc
    if proc.code is None:
        return "HANG", f"killed after {proc.seconds:.0f} s"
    if any(TRACEBACK in text for text in [proc.out, proc.err, *trial.texts]):
        text = next(t for t in [proc.err, proc.out, *trial.texts] if TRACEBACK in t)
        return "TRACEBACK", last_line(text)
    if trial.lost:
        return "SILENT", "; ".join(trial.lost)
    if proc.code == 0:
        return (OK_HANDLED, "exit 0") if case.expect != REFUSE else ("SILENT", "exit 0: " + last_line(proc.out))
    if case.expect == HANDLE:
        return "REFUSED", f"exit {proc.code}: {last_line(proc.message)}"
    missing = [w for w in (*case.words, *trial.words) if not named(w, proc.message)]
    note = f"exit {proc.code}: {error_line(proc.message)}"
    return ("VAGUE", f"{note} [does not name {' / '.join(map(show, missing))}]") if missing else (OK_REFUSED, note)


def named(word: Word, message: str) -> bool:
    return any(w in message for w in ((word,) if isinstance(word, str) else word))


def show(word: Word) -> str:
    return word if isinstance(word, str) else " or ".join(word)


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def error_line(text: str) -> str:
    """The line that says what went wrong: the last `error` / `config error` line, else the last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower().split(":")[0]]
    return errors[-1] if errors else (lines[-1] if lines else "(no output)")


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
        ready = (lambda: any((folder / "checkpoints").glob("step_*"))) if resume else (lambda: (folder / "config.json").exists())
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
        return Trial(lab.cli("--data.source", "none", "--tasks.t.path", "rows.csv", "--set", "rewards.t=reward.py:my_grader"))
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
         why="the task's data file replaced by other rows (the built-in tokenizer is built from the rows: the message names "
             "the file, not an embedding shape)"),
    Case("resume-changed-reward", "resume", REFUSE, ("my_grader",), resume_changed("reward"),
         why="the reward function's code changed"),
    Case("resume-max-steps-below", "resume", REFUSE, (("train.max_steps", "--max-steps"),), resume_changed("max_steps"),
         why="--max-steps 1 against a step-2 checkpoint (it ended at step 2)"),
    Case("resume-auto-overwrite", "resume", REFUSE, ("overwrite", "resume"), resume_changed("overwrite"),
         why="--resume auto --overwrite: two opposite requests, refused rather than one of them ignored"),
    # hangs
    Case("reward-hangs-mid-run", "hang", REFUSE, ("my_grader",),
         refused(*demo_rewards("my_grader"), "--train.reward_timeout_s", "5", files={"reward.py": mid_run("time.sleep(3600)")}),
         why="a reward function that hangs after the first step (train.reward_timeout_s 5)"),
    Case("judge-rate-limit-1e-9", "hang", REFUSE, ("judge.rate_limit_per_s",), judge_rate,
         why="judge.rate_limit_per_s 1e-9 (a fake judge on 127.0.0.1)"),
    Case("prompts-per-micro-step-100000", "hang", REFUSE, ("train.prompts_per_micro_step",),
         refused("--train.prompts_per_micro_step", "100000"), why="more prompts per micro-step than rows"),
    # a run that ends "successfully" when it did not
    Case("reward-sys-exit-preflight", "false success", REFUSE, ("my_grader",),
         refused(*demo_rewards("my_grader"), files={"reward.py": "import sys\ndef my_grader(completion, gold):\n    sys.exit(0)\n"}),
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
    Case("temperature-1e-300", "traceback", REFUSE, ("rollout.temperature",), refused("--rollout.temperature", "1e-300")),
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
         files={"reward.py": "def my_grader(completion, gold):\n    return 1e308 if len(completion) % 2 else -1e308\n"}),
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


# ------------------------------------------------------------------------------------------------ the fake judge
class JudgeServer:
    """tests/judge_server.py as a subprocess on a free port, started on first use."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def __call__(self) -> str:
        if self.proc is None:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            self.proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "judge_server.py"), "--port", str(port)],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.time() + 30
            while time.time() < deadline:
                with socket.socket() as s:
                    if s.connect_ex(("127.0.0.1", port)) == 0:
                        break
                time.sleep(0.1)
            self.url = f"http://127.0.0.1:{port}/v1"
        return self.url

    def close(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


# ------------------------------------------------------------------------------------------------ the probe
@dataclass
class Result:
    case: Case
    outcome: str
    note: str
    seconds: float


def run_case(case: Case, root: Path, judge: JudgeServer) -> Result:
    folder = root / case.name
    folder.mkdir(parents=True)
    lab = Lab(folder, case.limit_s, judge)
    start = time.time()
    try:
        trial = case.act(lab)
        outcome, note = classify(case, trial)
    except (RuntimeError, OSError) as e:  # the case could not be set up: the probe's failure, shown as such
        outcome, note = "TRACEBACK", f"probe set-up failed: {e}"
    finally:
        lab.stop_background()
    return Result(case, outcome, note, time.time() - start)


def table(results: list[Result], width: int = 150) -> str:
    name_w = max(len(r.case.name) for r in results)
    lines = [f"{'case':{name_w}}  {'group':15} {'outcome':10} {'s':>4}  note", "-" * width]
    for r in results:
        row = f"{r.case.name:{name_w}}  {r.case.group:15} {r.outcome:10} {r.seconds:4.0f}  {r.note}"
        lines.append(row if len(row) <= width else row[: width - 3] + "...")
    return "\n".join(lines)


def summary(results: list[Result]) -> str:
    counts = {o: sum(r.outcome == o for r in results) for o in OUTCOMES}
    return f"{len(results)} cases: " + ", ".join(f"{o} {n}" for o, n in counts.items() if n or o in (OK_REFUSED, OK_HANDLED))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run these cases only")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--keep", metavar="DIR", help="write the case folders here and keep them (default: a "
                        "temporary folder, deleted after)")
    args = parser.parse_args(argv)
    if args.list:
        for case in CASES:
            words = ", ".join(show(w) for w in case.words) or "-"
            print(f"{case.name:32} {case.group:15} {case.expect:7} needs: {words:45} {case.why}")
        return 0
    names = {c.name for c in CASES}
    unknown = sorted(set(args.only or ()) - names)
    if unknown:
        parser.error(f"no case named {', '.join(unknown)}; the cases: {', '.join(c.name for c in CASES)}")
    chosen = [c for c in CASES if not args.only or c.name in args.only]
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="grpo_probe_"))
    root.mkdir(parents=True, exist_ok=True)
    judge = JudgeServer()
    results = []
    try:
        for case in chosen:
            result = run_case(case, root, judge)
            print(f"  {case.name}: {result.outcome} ({result.seconds:.0f} s)", flush=True)
            results.append(result)
    finally:
        judge.close()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(table(results))
    print(summary(results))
    return 1 if any(r.outcome in FAILURES for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
