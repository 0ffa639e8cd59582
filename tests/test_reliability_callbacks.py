"""Reliability of user code and files: every user callback has a time limit and a name, an exit from one is no
success, the judge's rate limit and the step's prompt count are checked against what can finish, rewards whose
size would overflow the advantages are refused naming their grader, and CSV files with a byte-order mark or ragged
rows are read or refused naming the line. Exit statuses are checked on the command line in a subprocess (a hung
reward function leaves a thread behind that must not hold the process)."""

from __future__ import annotations

import asyncio
import logging
import math
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from grpo import config as C
from grpo.core.advantages import group_advantages
from grpo.core.step_types import Rollout, Sample
from grpo.data.batching import check_prompts_per_step
from grpo.data.sources import TaskSource, load_sources
from grpo.data.tables import DataSourceError, read_tables
from grpo.grading import graders as GR
from grpo.grading.judge import RateLimiter
from grpo.grading.scoring import RewardSpec, score_rollouts
from tests.trainer_helpers import TINY_CLI as TINY
from tests.trainer_helpers import cli_output

ROOT = Path(__file__).resolve().parents[1]
REWARDS = '''
import sys, time
CALLS = 0
def hang(completion, gold):
    time.sleep(3600)
def hang_later(completion, gold):  # the preflight's two trial calls return; the first call of the run hangs
    global CALLS
    CALLS += 1
    if CALLS > 2:
        time.sleep(3600)
    return 0.5
def exit_now(completions, **kwargs):
    sys.exit(0)
def exit_later(completions, **kwargs):  # TRL-style: one trial call in the preflight returns, the next exits
    global CALLS
    CALLS += 1
    if CALLS > 1:
        sys.exit(0)
    return [0.0] * len(completions)
def interrupt(completion, gold):
    raise KeyboardInterrupt
def huge(completion, gold):
    return 1e308
def tiny_negative(completion, gold):
    return -1e308
'''
TIMEOUT = ["--train.reward_timeout_s", "1"]  # a short limit: the hung calls below sleep an hour


def _rewards(tmp_path: Path) -> str:
    path = tmp_path / "rewards.py"
    path.write_text(REWARDS)
    return str(path)


def run_subprocess(tmp_path: Path, *argv: str, limit_s: float = 240) -> tuple[int, str, float]:
    """(exit status, stderr + stdout, seconds) of `python grpo_train.py TINY argv` in a process of its own."""
    start = time.monotonic()
    proc = subprocess.run([sys.executable, str(ROOT / "grpo_train.py"), *TINY, "--train.output_dir",
                           str(tmp_path / "runs"), "--run-name", "r", *argv], cwd=tmp_path, capture_output=True,
                          text=True, timeout=limit_s)
    return proc.returncode, proc.stderr + proc.stdout, time.monotonic() - start


def run_cli(tmp_path: Path, *argv: str) -> tuple[int, str]:
    """(exit status, stderr + stdout) of grpo_train.cli in this process."""
    return cli_output([*TINY, "--train.output_dir", str(tmp_path / "runs"), "--run-name", "r", *argv])


# ------------------------------------------------------------------------------------- a reward function that hangs
def test_a_reward_function_that_hangs_in_the_preflight_stops_the_start_naming_it(tmp_path):
    grader = f"{_rewards(tmp_path)}:hang"
    code, text, seconds = run_subprocess(tmp_path, "--rewards.fairness", grader, *TIMEOUT)
    assert code == 2, text
    assert (f"task 'fairness', grader '{grader}'" in text and "did not return within train.reward_timeout_s=1 s"
            in text), text
    assert "Traceback" not in text
    assert seconds < 120  # not the hour the call sleeps: the abandoned thread does not hold the process
    assert not (tmp_path / "runs" / "r").exists()  # before the run folder and the model


def test_a_reward_function_that_hangs_mid_run_stops_the_run_naming_it(tmp_path):
    grader = f"{_rewards(tmp_path)}:hang_later"
    code, text, seconds = run_subprocess(tmp_path, "--rewards.fairness", grader, *TIMEOUT)
    assert code == 1, text
    assert f"error: task 'fairness', grader '{grader}': it did not return within train.reward_timeout_s=1 s" in text
    assert "Traceback" not in text and seconds < 120


@pytest.mark.parametrize("name,code", [("exit_now", 2), ("exit_later", 1)], ids=["preflight", "mid-run"])
def test_sys_exit_in_a_reward_function_is_a_failure_naming_it(tmp_path, name, code):
    grader = f"{_rewards(tmp_path)}:{name}"
    status, text, _ = run_subprocess(tmp_path, "--rewards.fairness", grader)
    assert status == code, text  # was 0: the process ended "successfully" inside the reward function
    assert f"task 'fairness', grader '{grader}'" in text and "it raised SystemExit(0)" in text, text
    assert "Traceback" not in text


def test_keyboard_interrupt_raised_by_a_reward_function_is_its_failure_not_a_ctrl_c(tmp_path):
    grader = f"{_rewards(tmp_path)}:interrupt"
    code, text = run_cli(tmp_path, "--rewards.fairness", grader, *TIMEOUT)
    assert code == 2, text  # was 130, "interrupted by SIGINT during set-up", the function unnamed
    assert f"task 'fairness', grader '{grader}'" in text and "it raised KeyboardInterrupt itself" in text, text


def test_call_limited_returns_reraises_and_gives_up_in_time():
    assert GR.call_limited(lambda: 3, 5.0, "f") == 3
    with pytest.raises(ZeroDivisionError):
        GR.call_limited(lambda: 1 / 0, 5.0, "f")
    start = time.monotonic()
    with pytest.raises(GR.GraderTimeout, match=r"train.reward_timeout_s=0.2 s"):
        GR.call_limited(lambda: time.sleep(30), 0.2, "f")
    assert time.monotonic() - start < 5
    with pytest.raises(GR.GraderError, match=r"SystemExit\(3\)"):
        GR.call_limited(lambda: sys.exit(3), 5.0, "f")


def test_a_user_function_keeps_one_worker_thread_until_it_hangs():
    """The worker thread of a function is started once and reused (a thread per call cost more than the demo's own
    graders); a call that outlives its limit leaves its worker behind, and the next call gets a new one. Over many
    calls the live threads stay the same."""
    who = "test_worker_reuse"
    first = GR.call_limited(threading.current_thread, 5.0, who)
    before = threading.active_count()
    assert all(GR.call_limited(threading.current_thread, 5.0, who) is first for _ in range(50))
    assert threading.active_count() == before and first is not threading.current_thread()
    with pytest.raises(GR.GraderTimeout):
        GR.call_limited(lambda: time.sleep(1.0), 0.05, who)
    assert GR.call_limited(threading.current_thread, 5.0, who) is not first


def _rollouts(n: int, task: str = "qa") -> list[Rollout]:
    sample = Sample(id="1", task=task, messages=({"role": "user", "content": "q"},), target="a", gold={"answer": "a"})
    return [Rollout(sample=sample, prompt_ids=(1,), completion_ids=(2, 3), text="x" * (i + 1), stopped=True,
                    truncated=False) for i in range(n)]


def test_a_time_limit_changes_no_value_a_user_function_returns():
    """The same calls in the same order: a function drawing from the global random state gives the same values on
    a worker thread as on the calling thread (the demo's checksum rests on this)."""
    def noisy(completion, gold):
        return random.random() + len(completion)

    values = []
    for timeout_s in (None, 5.0):
        random.seed(7)
        values.append(GR.Grader("noisy", "row", noisy, timeout_s=timeout_s).grade(_rollouts(6)))
    assert values[0] == values[1] and len(set(values[0])) == 6


def test_the_worker_takes_on_the_callers_grad_mode():
    """torch's grad mode is thread-local: a reward function on its worker thread sees the caller's, as it did on the
    calling thread (a new thread would have it on)."""
    def grad_on(completion, gold):
        return float(torch.is_grad_enabled())

    grader = GR.Grader("grad_on", "row", grad_on, timeout_s=5.0)
    with torch.no_grad():
        assert grader.grade(_rollouts(1)) == [0.0]
    assert grader.grade(_rollouts(1)) == [1.0]


def test_an_async_reward_function_under_a_time_limit():
    async def scores(completions, **kwargs):
        await asyncio.sleep(0)
        return [float(len(c)) for c in completions]

    assert GR.wrap("scores", scores).kind == "batched"
    grader = GR.Grader("scores", "batched", scores, timeout_s=5.0)
    assert grader.grade(_rollouts(3)) == [1.0, 2.0, 3.0]


def test_built_in_graders_are_called_on_the_calling_thread():
    seen = []
    grader = GR.Grader("rule", "rule", lambda c, g: seen.append(threading.current_thread()) or 1.0,
                       bounds=(0.0, 1.0), timeout_s=5.0)
    grader.grade(_rollouts(2))
    assert seen and all(t is threading.current_thread() for t in seen)


# ------------------------------------------------------------------------------------- rewards too large to train on
@pytest.mark.parametrize("name", ["huge", "tiny_negative"])
def test_a_reward_too_large_for_the_advantages_is_refused_naming_the_grader(tmp_path, name):
    grader = f"{_rewards(tmp_path)}:{name}"
    code, text = run_cli(tmp_path, "--rewards.fairness", grader)
    assert code == 2, text  # was: every step skipped as non-finite, no grader named
    assert f"task 'fairness', grader '{grader}'" in text and "MAX_ABS_REWARD" in text, text


def test_the_reward_bound_keeps_the_advantages_finite_and_one_beyond_it_would_not():
    """MAX_ABS_REWARD's reason, checked: a batch of 2**20 rewards at +-MAX_ABS_REWARD has finite, non-zero
    advantages under every scale; at 1e20 one group's std overflows float32 and its advantages collapse to 0, and
    at 1e39 the reward itself is inf in float32 and the advantages are NaN."""
    rewards = torch.tensor([GR.MAX_ABS_REWARD, -GR.MAX_ABS_REWARD] * 2**19)
    for scale in ("group", "batch", "none"):
        adv, _ = group_advantages(rewards, 4, scale=scale)
        assert torch.isfinite(adv).all() and (adv != 0).all(), scale
    adv, _ = group_advantages(torch.tensor([1e20, -1e20, 1e20, -1e20]), 4)
    assert (adv == 0).all()  # the signal lost without a word
    adv, _ = group_advantages(torch.tensor([1e39, -1e39, 1e39, -1e39]), 4)
    assert not torch.isfinite(adv).any()
    assert GR.checked(GR.MAX_ABS_REWARD, None) == GR.MAX_ABS_REWARD
    with pytest.raises(GR.GraderError, match="MAX_ABS_REWARD"):
        GR.checked(-2 * GR.MAX_ABS_REWARD, None)


def test_weights_that_carry_the_reward_past_the_bound_are_refused_naming_the_task():
    spec = RewardSpec("qa", (("len", 1e300),), aggregation="sum")
    graders = {"len": GR.Grader("len", "row", lambda c, g: 1.0)}
    with pytest.raises(GR.GraderError, match=r"task 'qa': the weighted reward .* rewards.qa"):
        score_rollouts(_rollouts(2), {"qa": spec}, None, graders)


# ------------------------------------------------------------------------------------- settings that cannot finish
def test_a_judge_rate_that_cannot_serve_a_step_is_refused_naming_the_field(tmp_path):
    judge = ["--judge.base_url", "http://127.0.0.1:9/v1", "--rewards.fairness", "llm_judge:1.0"]
    code, text = run_cli(tmp_path, *judge, "--judge.rate_limit_per_s", "1e-9")
    assert code == 2, text  # was: the second judge call waited 1e9 s without a word
    assert "config field `judge.rate_limit_per_s` = 1e-09" in text and "JUDGE_RATE_MAX_STEP_S" in text, text
    steps = C.load_config("demo", ["judge.base_url=http://127.0.0.1:9/v1"])
    least = steps.seqs_per_step / C.JUDGE_RATE_MAX_STEP_S
    C.load_config("demo", ["judge.base_url=http://127.0.0.1:9/v1", f"judge.rate_limit_per_s={least}"])  # just fits
    C.load_config("demo", ["judge.rate_limit_per_s=1e-9"])  # no judge: the rate limits nothing


def test_a_long_wait_for_a_judge_slot_is_said_once(monkeypatch, caplog):
    slept = []
    monkeypatch.setattr("grpo.grading.judge.time.sleep", slept.append)
    limiter = RateLimiter(0.05)  # one request per 20 s
    with caplog.at_level(logging.WARNING, logger="grpo.grading.judge"):
        for _ in range(3):
            limiter.wait()
    notes = [r.getMessage() for r in caplog.records if "request slot" in r.getMessage()]
    assert len(notes) == 1 and "judge.rate_limit_per_s=0.05" in notes[0], notes
    assert len(slept) == 2 and slept[-1] > 20


def test_more_prompts_a_step_than_rows_is_refused_before_the_model(tmp_path):
    code, text, _ = run_subprocess(tmp_path, "--train.prompts_per_micro_step", "100000", limit_s=300)
    assert code == 2, text  # was: 600,000 completions generated in one call, the step never ended
    assert "config field `train.prompts_per_micro_step` = 100000" in text and "training rows" in text, text
    assert not (tmp_path / "runs" / "r").exists()


def test_prompts_per_step_may_use_every_row_once_and_no_more():
    rows = {t: [r.sample for r in _rollouts(n, t)] for t, n in (("a", 3), ("b", 2))}  # 5 training rows
    check_prompts_per_step(rows, 5, 1)
    check_prompts_per_step(rows, 1, 5)
    with pytest.raises(C.ConfigError) as err:  # the micro-step alone fits: the accumulation is what draws too many
        check_prompts_per_step(rows, 3, 2)
    assert err.value.field == "train.grad_accum" and "at most 1 train.grad_accum" in str(err.value)
    with pytest.raises(C.ConfigError) as err:  # a micro-step beyond the rows is its own fault
        check_prompts_per_step(rows, 6, 1)
    assert err.value.field == "train.prompts_per_micro_step" and "at most 5" in str(err.value)
    with pytest.raises(C.ConfigError, match="on each of 2 processes"):
        check_prompts_per_step(rows, 3, 1, world=2)


# ------------------------------------------------------------------------------------- CSV files
def test_a_csv_with_a_byte_order_mark_is_read_with_plain_column_names(tmp_path):
    path = tmp_path / "qa.csv"
    path.write_bytes("\ufeffprompt,answer\nWhat is 2+2?,4\nWhat is 3+3?,6\n".encode("utf-8"))
    (table,) = read_tables(str(path), where="tasks.qa")
    assert [row for _, row in table.rows] == [{"prompt": "What is 2+2?", "answer": "4"},
                                              {"prompt": "What is 3+3?", "answer": "6"}]
    loaded = load_sources({"qa": TaskSource(path=str(path), target_field="answer")}, 0.0)
    assert [s.target for s in loaded.train] == ["4", "6"]  # was: refused, "DatasetGenerationError"


@pytest.mark.parametrize("body,line,fields", [
    ("q1,a\nq2,a,extra\n", 3, 3),
    ('"two\nlines",a\n\nq3\n', 5, 1),  # a quoted field spans lines 2-3, line 4 is blank
], ids=["too-many", "too-few-after-a-multiline-field"])
def test_a_ragged_csv_row_is_refused_naming_the_file_and_line(tmp_path, body, line, fields):
    path = tmp_path / "qa.csv"
    path.write_text("prompt,answer\n" + body)
    with pytest.raises(DataSourceError) as err:
        read_tables(str(path), where="tasks.qa")
    assert f"tasks.qa: {path}:{line}: this row has {fields} field(s), the header has 2" in str(err.value), err.value


def test_a_csv_that_is_not_utf8_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "qa.csv"
    path.write_bytes("prompt,answer\ncaf\xe9,1\n".encode("latin-1"))
    with pytest.raises(DataSourceError, match=rf"{path} is not UTF-8 text"):
        read_tables(str(path), where="tasks.qa")


def test_a_csv_field_longer_than_the_csv_modules_default_limit_is_read(tmp_path):
    path = tmp_path / "qa.csv"
    path.write_text(f"prompt,answer\n{'x' * 200_000},1\n")
    (table,) = read_tables(str(path), where="tasks.qa")
    assert len(table.rows[0][1]["prompt"]) == 200_000
    assert math.isclose(float(table.rows[0][1]["answer"]), 1.0)
