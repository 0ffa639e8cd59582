"""Over time: 300 RL steps of the tiny model with everything that holds threads, files or memory between steps (an
LLM judge over HTTP with its thread pool and SQLite cache, a user reward function on its worker threads, a tool on
its timeout threads, TensorBoard, samples, checkpoints) leave host memory, open file descriptors and live threads as
they were after step 50 (the run's own open files exactly; memory, descriptors and threads within what a busy machine
can add): a leak of a few hundred bytes a call would pass, one of 100 KB, a file or a thread a step would not."""

from __future__ import annotations

import json
import mmap
import os
import re
import subprocess
import sys
import threading
from itertools import pairwise
from pathlib import Path

import pytest

from tests.test_tool_environments import keep_tokenizer
from tests.test_tool_rollouts import ROWS, TINY, calculator, calls_sometimes  # noqa: F401 - calls_sometimes: fixture

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: a 32-wide model gains nothing from threads

ROOT = Path(__file__).resolve().parents[1]
STEPS = 300
EARLY = 50
"""The step whose resources the last one is compared with: by then every pool has started its threads, every file
is open and the allocator has reached its working set."""
RSS_TOLERANCE = 0.05
"""Host memory after the last step within 5 % of step EARLY's (docs/BUG_FIXES.md section 18)."""


def os_threads() -> int:
    """The process's threads as the kernel counts them: OpenMP's and the HTTP client's too, not only Python's."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads: line in /proc/self/status")


LOAD_MARGIN = 10
"""How many descriptors or threads load alone may add between step EARLY and the last: the judge's pool starts its
threads (judge.num_workers, 8) and its HTTP client a connection each only as calls overlap, and on a busy machine more
of them overlap late in a run; a tool call's thread may still be ending. A leak of one a step adds STEPS - EARLY."""


def open_fds(run_dir: Path) -> tuple[int, int]:
    """This process's open file descriptors: all of them (sockets and pipes included), and those on files inside
    `run_dir` (what the run itself holds open by path, which no load changes)."""
    fds = os.listdir("/proc/self/fd")
    inside = str(run_dir.resolve()) + os.sep
    targets = []
    for fd in fds:
        try:
            targets.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the descriptor listdir itself held, closed by now
            pass
    return len(fds), sum(t.startswith(inside) for t in targets)


def follow_steps(monkeypatch, at: tuple[int, ...], run_dir: Path) -> dict[int, dict[str, float]]:
    """grpo_train.rl_step wrapped: after each step in `at`, this process's host memory (the step's own metric), open
    file descriptors (all, and those on files in `run_dir`) and threads."""
    import grpo_train as G

    seen: dict[int, dict[str, float]] = {}
    real_step = G.rl_step

    def step(run, n):
        metrics = real_step(run, n)
        if n in at:
            fds, run_files = open_fds(run_dir)
            seen[n] = {"rss": metrics["memory/host_rss_gb"], "fds": fds, "run_files": run_files,
                       "threads": os_threads(), "python_threads": threading.active_count()}
        return metrics

    monkeypatch.setattr(G, "rl_step", step)
    return seen


def grown(early: dict[str, float], last: dict[str, float]) -> list[str]:
    """What rose from `early` to `last` beyond what load can add: the run's own files not at all, every descriptor
    and thread by at most LOAD_MARGIN."""
    rose = [k for k in ("fds", "threads", "python_threads") if last[k] - early[k] > LOAD_MARGIN]
    return (["run_files"] if last["run_files"] != early["run_files"] else []) + rose


def judge_server():
    """tests/judge_server.py in its own process (its record of requests grows there, not here); its URL."""
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "judge_server.py"), "--port", "0", "--score", "7"],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()  # "fake judge at http://127.0.0.1:PORT/v1 (score 7); Ctrl-C to stop"
    return proc, line.split()[3]


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_300_steps_keep_memory_files_and_threads_flat(tmp_path, calls_sometimes, monkeypatch):  # noqa: F811
    import grpo_train as G

    keep_tokenizer(monkeypatch, calls_sometimes)  # the run's tokenizer, for the fixture's calculator calls
    seen = follow_steps(monkeypatch, (EARLY, STEPS), tmp_path)

    def answered(completions, answer, **kwargs):  # a user reward function: each call on a worker thread
        return [float(m[-1]["content"].strip() == a) for m, a in zip(completions, answer, strict=True)]

    server, url = judge_server()
    try:
        run = G.train(TINY + ["judge.api_key_env=", f"judge.base_url={url}", "judge.model=fake", "judge.max_retries=0",
                             "judge.rate_limit_per_s=1000"],
                      tasks={"calc": ROWS}, rewards={"calc": [answered, ("llm_judge", 0.5)]}, tools=[calculator],
                      train={"max_steps": STEPS, "prompts_per_micro_step": 2, "eval_every": 100, "sample_every": 50,
                             "log_every": STEPS, "output_dir": str(tmp_path), "run_name": "long"},
                      rollout={"k": 2, "max_new_tokens": 6, "max_tool_turns": 1}, data={"eval_size": 4},
                      sft={"steps": 0}, checkpoint={"every": 100})
    finally:
        server.kill()
        server.wait()
    rows = [json.loads(x) for x in (run.run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in rows if "loss/total" in r]
    assert len(steps) == STEPS and sum(r["tools/calls_per_rollout"] for r in steps) > 0  # the tool ran
    assert sum(r["judge/calls"] for r in steps) >= STEPS * 4 and not any(r["judge/failures"] for r in steps)
    early, last = seen[EARLY], seen[STEPS]
    assert abs(last["rss"] - early["rss"]) <= RSS_TOLERANCE * early["rss"], (early, last)
    assert not grown(early, last), (grown(early, last), early, last)
    assert not any(r.get("doctor/memory_growth") for r in steps)


LEAK_MB = 16
"""What the leaking reward function below keeps at every call (one call a step): 160 MB over the doctor's 10-step
window, far above its 10 % of a ~0.4 GB process."""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_reward_function_that_keeps_what_it_is_given_is_named_by_the_doctor(tmp_path, capsys, monkeypatch):
    """The doctor names a step that leaks memory; the 300-step test's check names one that leaks a file or a thread
    (one a step over 13 steps here: more than LOAD_MARGIN, as 250 would be there)."""
    import grpo_train as G

    kept, release = [], threading.Event()
    seen = follow_steps(monkeypatch, (1, 14), tmp_path)

    def hoarding(completions, answer, **kwargs):  # keeps 16 MB of its own at every call: the step leaks on purpose
        # fresh pages from the kernel, each touched: a bytearray could reuse what malloc had freed and grow the
        # resident set by less than 16 MB in a step (seen in CI: one step of 9 rose by less)
        block = mmap.mmap(-1, LEAK_MB * 2**20)
        for i in range(0, len(block), mmap.PAGESIZE):
            block[i] = 1
        kept.append(block)
        kept.append(open(tmp_path / f"kept-{len(kept)}.txt", "w"))  # noqa: SIM115 - a file left open on purpose
        threading.Thread(target=release.wait, daemon=True).start()  # a thread left waiting on purpose
        return [float(m[-1]["content"].strip() == a) for m, a in zip(completions, answer, strict=True)]

    run = G.train(TINY, tasks={"calc": ROWS}, rewards={"calc": [hoarding]},
                  train={"max_steps": 14, "prompts_per_micro_step": 2, "eval_every": 0, "sample_every": 0,
                         "output_dir": str(tmp_path), "run_name": "leak"},
                  rollout={"k": 2, "max_new_tokens": 4}, data={"eval_size": 2}, sft={"steps": 0})
    rows = [json.loads(x) for x in (run.run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in rows if "loss/total" in r]
    rss = [r["memory/host_rss_gb"] for r in steps]
    rises = [b - a for a, b in pairwise(rss)]
    assert rss[-1] - rss[0] > 0.8 * LEAK_MB / 1024 * len(rises)  # the metric sees the leak of every step
    assert sum(r > 0.5 * LEAK_MB / 1024 for r in rises) >= 0.9 * len(rises)  # step after step, not in one jump
    assert [r["doctor/memory_growth"] for r in steps] == [0.0] * 9 + [1.0] * 5  # from the first full window
    assert re.search(r"doctor: \[yellow\] memory_growth \(step 10\): host memory rose in [89] of the 9 steps",
                     capsys.readouterr().out)
    assert [f["code"] for f in run.report["findings"] if f["code"] == "memory_growth"] == ["memory_growth"]
    assert run.report["summary"]["host_peak_gb"] >= rss[-1]
    release.set()
    for k in kept:
        k.close()
    assert grown(seen[1], seen[14]) == ["run_files", "fds", "threads", "python_threads"], seen
