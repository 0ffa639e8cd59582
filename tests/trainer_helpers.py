"""Shared pieces of the trainer tests: a fast tiny config, a reward with within-group variance, a tool call as the
model writes it, and whether a run folder blocks a fresh start."""

from __future__ import annotations

import contextlib
import io
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

import torch

from grpo import config as C
from grpo.core.tool_calls import DEFAULT_FORMAT
from grpo.run.checkpoint.folder import BOOKKEEPING, MARKER, RESTARTABLE
from grpo.run.tracking import MEASURED_PREFIXES

TINY_CLI = ["--model.tiny_hidden", "32", "--model.tiny_layers", "1", "--model.tiny_heads", "2", "--data.demo_size",
            "24", "--data.eval_size", "2", "--rollout.max_new_tokens", "4", "--rollout.k", "2", "--sft.steps", "0",
            "--train.eval_every", "0", "--train.sample_every", "0", "--train.tensorboard", "false",
            "--train.prompts_per_micro_step", "2", "--train.lr", "1e-2", "--train.max_steps", "1"]
"""Command-line flags of a one-step run of the tiny demo model (no warm-up, no evaluation): the reliability tests'."""


def cli_output(argv: list[str]) -> tuple[int, str]:
    """(exit status, stderr + stdout) of `grpo_train.py argv`, run in this process."""
    import grpo_train

    err, std = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(std):
        code = grpo_train.cli(list(argv))
    return code, err.getvalue() + std.getvalue()


def length_reward(completion: str, gold: dict) -> float:
    """Longer completions score higher (capped): varied rewards inside a group, so advantages are non-zero."""
    return min(len(completion), 24) / 24.0


def trl_length_reward(completions: list, **kwargs: Any) -> list[float]:
    """A TRL-style reward function (a batch of completions, TRL's keyword arguments): longer completions score
    higher, capped, so a group's rewards differ."""
    return [min(len(c if isinstance(c, str) else c[-1]["content"]), 24) / 24.0 for c in completions]


def fast_config(out_dir, *extra: str, preset: str = "demo") -> C.Config:
    """A tiny, fast demo config (1 layer, short completions, no SFT, no eval) writing to `out_dir`."""
    base = [f"train.output_dir={out_dir}", "train.run_name=t", "model.tiny_hidden=32", "model.tiny_layers=1",
            "model.tiny_heads=2", "data.demo_size=24", "data.eval_size=4", "rollout.max_new_tokens=6",
            "sft.steps=0", "rollout.k=4", "train.prompts_per_micro_step=2", "train.grad_accum=1",
            "train.max_steps=2", "train.eval_every=0", "train.sample_every=0", "train.tensorboard=false",
            "train.lr=1e-2", "rewards.fairness=tests.trainer_helpers:length_reward:1.0",
            "rewards.hallucination=tests.trainer_helpers:length_reward:1.0"]
    return C.load_config(preset, base + list(extra))


def assert_resume_is_bit_identical(tmp_path, extra: list[str], used_metric: str) -> None:
    """4 steps in one go == 2 steps, then a resume to 4 (`extra`: the config under test, which checkpoints every 2
    steps): the same metrics after step 2 but wall times, and the same weights. `used_metric` must be non-zero in
    them: what the test is about (a tool call, an environment's method) did happen."""
    import json

    import grpo_train as G

    full = G.main(fast_config(tmp_path / "a", "train.max_steps=4", *extra))
    G.main(fast_config(tmp_path / "b", "train.max_steps=2", *extra))
    resumed = G.main(fast_config(tmp_path / "b", "train.max_steps=4", "checkpoint.resume=auto", *extra))

    def lines(run_dir):
        rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if not k.startswith(MEASURED_PREFIXES)}
                for r in rows if r.get("step", 0) > 2]

    a, b = lines(full.run_dir), lines(resumed.run_dir)
    assert a == b and sum(r.get(used_metric, 0) for r in a) > 0
    for (name, pa), (_, pb) in zip(full.policy.model.named_parameters(), resumed.policy.model.named_parameters(),
                                   strict=True):
        assert torch.equal(pa, pb), name


def rollout_batch(run, n_prompts: int = 2, k: int | None = None):
    """A collated TrainBatch of real rollouts of `run`'s policy, scored, with group advantages (no ref/old passes)."""
    from grpo.core.advantages import group_advantages
    from grpo.grading.scoring import score_rollouts
    from grpo.phases.batch import build_train_batch
    from grpo.phases.generate import generate_rollouts

    k = k or run.cfg.rollout.k
    rollouts, _ = generate_rollouts(run.policy.model, run.tokenizer, run.generation.sampler.next_batch(n_prompts),
                                    replace(run.cfg.rollout, k=k), run.generation.stop_ids)
    scored, _ = score_rollouts(rollouts, run.rewarder.specs, None)
    adv, _ = group_advantages(torch.tensor([s.reward for s in scored]), k)
    return build_train_batch(scored, adv, run.tasks, run.tokenizer.pad_token_id, run.device)


def call_text(name: str, arguments: Mapping[str, Any]) -> str:
    """A tool call in the default format, as a model that calls `name` writes it."""
    return DEFAULT_FORMAT.write(name, arguments)


def blocks_fresh_start(path: str | Path) -> bool:
    """True when a fresh run into `path` would stop (grpo/run/checkpoint/folder.prepare_run_dir): a folder with run
    contents, not marked restartable, or with contents and no marker, or holding a checkpoint."""
    path = Path(path)
    if not path.is_dir():
        return False
    entries = {p.name for p in path.iterdir()}
    if not entries - set(BOOKKEEPING):
        return False
    return MARKER not in entries or RESTARTABLE not in entries or any((path / "checkpoints").glob("step_*"))
