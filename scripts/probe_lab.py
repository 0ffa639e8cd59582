"""The reliability probe's lab (scripts/reliability_probe.py): a case, what its act found, the folder it runs the
trainer in, and the classification of what came out (the outcomes are described in the probe's docstring)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
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

    def cli(self, *args: str, env: dict[str, str] | None = None, run: bool = True,
            limit_s: float | None = None) -> Proc:
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
