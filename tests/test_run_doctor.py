"""The run doctor inside training (grpo_train: `consult_doctor` in `rl_step`, `doctor_stops` / `restore_best` in
`main`'s RL loop): the answer and doctor metrics in every step's row and in TensorBoard, the findings printed when they
fire, and `train.doctor` = warn | stop | restore, after a resume and on two processes.

Every run here scores 0 for every completion (tests.test_report.zero_reward): every group is zero-std, so the doctor's
no_learning_signal is yellow from step 1 and red at step 5 (DoctorThresholds.no_signal_steps = 5 dead steps in a row),
on the fast tiny config of tests/trainer_helpers.py (a step takes well under a second).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo.run.checkpoint.save_resume import saved_weights
from grpo.run.doctor.thresholds import ONLINE_CODES
from tests.trainer_helpers import fast_config

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]
ZERO = "tests.test_report:zero_reward:1.0"
RED_AT = 5
"""The step no_learning_signal turns red in a run dead from step 1 (DoctorThresholds.no_signal_steps)."""
DECAY = ["train.weight_decay=0.1", "train.eval_every=1"]
"""AdamW's decoupled weight decay moves the weights although every advantage is 0 (then the KL term pulls them back
to the reference), so a restored Pareto point differs from the weights of the step the doctor fires at; with an
evaluation every step, the frontier keeps step 1's point (every later one ties with its all-zero scores)."""


def zero_config(tmp_path, *extra: str):
    return fast_config(tmp_path, f"rewards.fairness={ZERO}", f"rewards.hallucination={ZERO}", *extra)


def rl_rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if "loss/total" in r]


def doctor_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("doctor: [")]


def test_stop_ends_rl_at_the_step_the_doctor_fires_then_finishes_the_run(tmp_path, capsys):
    import grpo_train as G
    from grpo.run.checkpoint import files as ckpt

    run = G.main(zero_config(tmp_path, "train.max_steps=9", "train.doctor=stop"))
    out = capsys.readouterr().out
    rows = rl_rows(run.run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]  # not 9: stopped after the step the red fired at
    assert doctor_lines(out) == ["doctor: [yellow] no_learning_signal (step 1): no learning signal in any of the 1 "
                                 "step(s) so far: every group had zero reward std; mean reward fairness 0.000, "
                                 "hallucination 0.000 (red at 5 steps in a row)",
                                 "doctor: [red] no_learning_signal (step 5): no learning signal for 5 steps in a row "
                                 "(steps 1-5): every group had zero reward std; mean reward fairness 0.000, "
                                 "hallucination 0.000"]
    assert "doctor: RL stopped after step 5 (train.doctor=stop): no_learning_signal" in out
    # each step's row: the answer metrics the doctor reads, and its scalars (1 while a code is active, any level)
    assert [r["doctor/red"] for r in rows] == [0.0, 0.0, 0.0, 0.0, 1.0]
    assert [r["doctor/no_learning_signal"] for r in rows] == [1.0] * 5
    assert all(r[f"doctor/{code}"] == 0.0 for r in rows for code in ONLINE_CODES if code != "no_learning_signal")
    for task in ("fairness", "hallucination"):
        assert all(isinstance(r[f"rollout/{task}/top_answer"], str) and 0 < r[f"rollout/{task}/top_share"] <= 1
                   and r[f"adv/{task}/frac_zero_std"] == 1.0 for r in rows)
    # then the end of a run as usual: evaluated after RL, a final checkpoint of step 5, the report says RED
    assert "after_rl" in run.progress.evals and run.progress.finished and run.progress.step == RED_AT
    assert ckpt.find_resumable(run.run_dir).name == "step_000005"
    report = json.loads((run.run_dir / "report.json").read_text())
    assert report["verdict"] == "red" and report["findings"][0]["code"] == "no_learning_signal"


def test_warn_only_prints_and_logs_and_tensorboard_gets_the_scalars(tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import grpo_train as G

    run = G.main(zero_config(tmp_path, "train.max_steps=7", "train.tensorboard=true"))
    out = capsys.readouterr().out
    rows = rl_rows(run.run_dir)
    assert [r["step"] for r in rows] == list(range(1, 8)) and "RL stopped" not in out  # warn: the run goes on
    lines = doctor_lines(out)  # each finding printed when it fires, not again while it holds
    assert [line.split(":")[1] for line in lines] == [" [yellow] no_learning_signal (step 1)",
                                                      " [red] no_learning_signal (step 5)"]
    assert [r["doctor/red"] for r in rows] == [0.0] * 4 + [1.0] * 3
    acc = EventAccumulator(str(run.run_dir / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {f"doctor/{code}" for code in ONLINE_CODES} | {"doctor/red", "rollout/fairness/top_share"} <= tags
    assert [(e.step, e.value) for e in acc.Scalars("doctor/red")] == [(s, float(s >= RED_AT)) for s in range(1, 8)]
    assert "rollout/fairness/top_answer" not in tags  # a string: in metrics.jsonl, not a scalar


def test_restore_loads_the_best_pareto_points_weights(tmp_path, monkeypatch, capsys):
    import grpo_train as G

    before_restore = {}
    real_step = G.rl_step

    def step_and_keep_weights(run, step):
        metrics = real_step(run, step)
        before_restore.update({n: p.detach().clone() for n, p in run.policy.model.named_parameters()})
        return metrics

    monkeypatch.setattr(G, "rl_step", step_and_keep_weights)
    run = G.main(zero_config(tmp_path, "train.max_steps=9", "train.doctor=restore", *DECAY))
    out = capsys.readouterr().out
    assert [r["step"] for r in rl_rows(run.run_dir)] == [1, 2, 3, 4, 5]
    point = run.run_dir / "pareto" / "step_000001"
    assert f"doctor: weights restored from the best Pareto point {point}" in out
    assert run.progress.frontier.best().path == point
    saved = saved_weights(point, "model")
    now = dict(run.policy.model.named_parameters())
    assert saved.keys() == now.keys()
    assert all(torch.equal(now[n].detach(), saved[n]) for n in saved)  # exactly the point's weights
    assert any(not torch.equal(before_restore[n], saved[n]) for n in saved)  # which step 5's were not
    final = saved_weights(run.run_dir / "final", "model")  # the final model is the restored one
    assert all(torch.equal(final[n], saved[n]) for n in saved)


def test_a_resumed_run_replays_the_doctor_and_stops_where_the_uninterrupted_run_does(tmp_path, capsys):
    """Cut after step 3 (three dead steps), resumed: the doctor is fed metrics.jsonl first, so its streak goes on and
    turns red at step 5, not at step 3 + 5; the yellow active at the checkpoint is printed once at the resume."""
    import grpo_train as G

    base = ["train.doctor=stop", "checkpoint.every=1"]
    G.main(zero_config(tmp_path, "train.max_steps=3", *base))
    capsys.readouterr()
    run = G.main(zero_config(tmp_path, "train.max_steps=9", "checkpoint.resume=auto", *base))
    out = capsys.readouterr().out
    assert [r["step"] for r in rl_rows(run.run_dir)] == [1, 2, 3, 4, 5]
    assert [line.split(":")[1] for line in doctor_lines(out)] == [
        " [yellow] no_learning_signal (active since step 1, before the resume)", " [red] no_learning_signal (step 5)"]
    assert [r["doctor/red"] for r in rl_rows(run.run_dir)] == [0.0, 0.0, 0.0, 0.0, 1.0]


def test_the_notebook_path_gets_the_doctor_from_rl_step(tmp_path):
    """A notebook calls rl_step without main: the first step starts the doctor (fed what metrics.jsonl holds)."""
    import grpo_train as G

    run = G.setup(zero_config(tmp_path, "train.max_steps=5"))
    assert run.doctor is None
    metrics = [G.rl_step(run, step) for step in range(1, 6)]
    assert [m["doctor/red"] for m in metrics] == [0.0] * 4 + [1.0]
    assert [(f.level, f.code) for f in run.progress.alarms] == [("red", "no_learning_signal")]  # fired at step 5
    run.tracker.close()


def test_two_processes_stop_together_and_restore_on_every_rank(tmp_path):
    """Rank 0 alone holds the doctor; the stop is OR-ed over the ranks, so both leave the loop after step 5 (a rank
    left behind would hang in the next step's collectives) and both take part in the restore (a broadcast of the
    point's folder); rank 0's weights, the ones saved, are the point's."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    overrides = [arg for o in ["model.tiny_hidden=32", "model.tiny_layers=1", "model.tiny_heads=2",
                                        "data.demo_size=24", "data.eval_size=4", "rollout.max_new_tokens=6",
                                        "sft.steps=0", "rollout.k=4", "train.prompts_per_micro_step=1",
                                        "train.sample_every=0", "train.tensorboard=false", "train.lr=1e-2",
                                        f"rewards.fairness={ZERO}", f"rewards.hallucination={ZERO}",
                                        "train.doctor=restore", *DECAY] for arg in ("--set", o)]
    proc = subprocess.run([*launch, "grpo_train.py", "--device", "cpu", "--max-steps", "9", "--output-dir",
                           str(tmp_path), "--run-name", "r", *overrides], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "x 2 processes" in proc.stdout
    assert proc.stdout.count("doctor: RL stopped after step 5 (train.doctor=restore)") == 1  # rank 0 speaks
    point = tmp_path / "r" / "pareto" / "step_000001"
    assert f"weights restored from the best Pareto point {point}" in proc.stdout
    assert [r["step"] for r in rl_rows(tmp_path / "r")] == [1, 2, 3, 4, 5]
    saved, final = saved_weights(point, "model"), saved_weights(tmp_path / "r" / "final", "model")
    assert saved.keys() == final.keys() and all(torch.equal(final[n], saved[n]) for n in saved)
