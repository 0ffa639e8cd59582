"""TRL's metric keys: a reward term's values are logged under its function's name (TRL's rewards/<fn>/mean|std),
never the file path or import path that found it, and every step adds TRL's top-level keys (loss, reward,
reward_std, kl, entropy, completions/..., num_tokens, epoch, ...) to metrics.jsonl and TensorBoard alike."""

from __future__ import annotations

import functools
import json
import math
import textwrap

import pytest

from grpo.core.step_types import Rollout, Sample, Scored
from grpo.grading.graders import resolve_graders
from grpo.grading.scoring import RewardSpec, metric_names, reward_metrics, score_rollouts, term_matrix
from grpo.run.trl.log_keys import trl_log_keys

REWARDS = """
    def correct_len(completions, **kwargs):
        return [None if c.startswith("skip") else float(len(c)) for c in completions]
"""


def reward_file(folder, source=REWARDS):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "my_rewards.py"
    path.write_text(textwrap.dedent(source))
    return str(path)


def scored_row(task, text, reward, parts=None, ids=(1, 2), truncated=False):
    sample = Sample(task=task, id=text, messages=({"role": "user", "content": "Say it."},))
    rollout = Rollout(sample=sample, prompt_ids=(7, 8, 9), completion_ids=tuple(ids), text=text,
                      stopped=not truncated, truncated=truncated)
    return Scored(rollout=rollout, reward=reward, parts=dict(parts or {}))


class Scaled:
    """A callable instance: TRL names it after its class."""

    def __call__(self, completions, **kwargs):
        return [1.0 for _ in completions]


def scaled(completions, factor, **kwargs):
    return [factor * len(c) for c in completions]


def test_a_function_in_a_file_elsewhere_is_named_by_its_function_and_clashes_are_told_apart(tmp_path):
    """One file's function used by two tasks is one name; another file's function of the same name is
    correct_len_2; a callable instance is its class's name, a partial its function's (trl get_callable_name)."""
    here, there = reward_file(tmp_path / "a" / "b"), reward_file(tmp_path / "elsewhere")
    callables = {"scaled": functools.partial(scaled, factor=2.0), "Scaled": Scaled()}
    specs = {"qa": RewardSpec("qa", ((f"{here}:correct_len", 1.0), ("format", 1.0))),
             "zz": RewardSpec("zz", ((f"{here}:correct_len", 1.0), (f"{there}:correct_len", 1.0)),
                              aggregation="sum"),
             "more": RewardSpec("more", (("grpo.grading.trl_rewards:think_format_reward", 1.0),))}
    names = metric_names(resolve_graders(specs, callables), specs)
    assert names == {"grpo.grading.trl_rewards:think_format_reward": "think_format_reward",
                     f"{here}:correct_len": "correct_len", "format": "format",
                     f"{there}:correct_len": "correct_len_2"}
    partial_specs = {"p": RewardSpec("p", (("mod.py:scaled", 1.0),))}
    from grpo.grading.graders import wrap

    assert metric_names({"mod.py:scaled": wrap("mod.py:scaled", callables["scaled"])}, partial_specs) == {
        "mod.py:scaled": "scaled"}
    assert metric_names({"x.py:obj": wrap("x.py:obj", Scaled())}, {"p": RewardSpec("p", (("x.py:obj", 1.0),))}) == {
        "x.py:obj": "Scaled"}


def test_scored_parts_and_reward_metrics_carry_no_path_and_average_what_each_function_scored(tmp_path):
    here, there = reward_file(tmp_path / "a" / "b"), reward_file(tmp_path / "elsewhere")
    specs = {"qa": RewardSpec("qa", ((f"{here}:correct_len", 1.0),), aggregation="sum"),
             "zz": RewardSpec("zz", ((f"{here}:correct_len", 1.0), (f"{there}:correct_len", 2.0)),
                              aggregation="sum")}
    graders = resolve_graders(specs)
    rows = ([scored_row("qa", t, None).rollout for t in ("abcd", "skip", "ab")] +
            [scored_row("zz", t, None).rollout for t in ("abcdef", "a")])
    scored, _ = score_rollouts(rows, specs, graders=graders)
    assert [s.parts for s in scored] == [{"correct_len": 4.0}, {"correct_len": None}, {"correct_len": 2.0},
                                         {"correct_len": 6.0, "correct_len_2": 6.0},
                                         {"correct_len": 1.0, "correct_len_2": 1.0}]
    assert [s.reward for s in scored] == [4.0, None, 2.0, 18.0, 3.0]
    logged = reward_metrics(scored, ["qa", "zz"])
    assert not [k for k in logged if str(tmp_path) in k or ".py" in k or ":" in k]
    # TRL's: torch.nanmean over every completion the function scored (None left out), nanstd with Bessel's correction
    assert logged["rewards/correct_len/mean"] == pytest.approx((4 + 2 + 6 + 1) / 4)
    assert logged["rewards/correct_len/std"] == pytest.approx(math.sqrt(
        sum((v - 13 / 4) ** 2 for v in (4, 2, 6, 1)) / 3))
    assert logged["rewards/correct_len_2/mean"] == pytest.approx(3.5)
    assert logged["rewards/correct_len_2/std"] == pytest.approx(math.sqrt((2.5 ** 2 + 2.5 ** 2) / 1))
    # several tasks: the per-task breakdown too, without a path
    assert logged["rewards/qa/correct_len/mean"] == pytest.approx(3.0)
    assert logged["rewards/zz/correct_len/mean"] == pytest.approx(3.5)
    assert "rewards/qa/correct_len_2/mean" not in logged
    values, weights = term_matrix(scored, specs, metric_names(graders, specs))  # GDPO reads the named parts
    assert values[3].tolist() == [6.0, 6.0] and weights[3].tolist() == [1.0, 2.0] and math.isnan(values[0, 1])


def test_trl_top_level_keys_equal_hand_computed_values():
    scored = [scored_row("a", "x", 1.0, ids=(1, 2, 3)), scored_row("a", "y", None, ids=(1,)),
              scored_row("b", "z", 3.0, ids=(1, 2, 3, 4, 5), truncated=True), scored_row("b", "w", 4.0, ids=(1, 2))]
    metrics = {"loss/total": 0.25, "health/grad_norm": 1.5, "lr": 1e-5, "adv/frac_zero_std": 0.5, "kl/all": 0.02,
               "entropy/all": 0.7, "rollout/tokens_seen": 123.0, "loss/clip_frac_low": 0.1,
               "loss/clip_frac_high": 0.05, "time/step": 2.0, "kl/a": 9.0}
    out = trl_log_keys(metrics, scored, step=3, train_prompts=10, prompts_per_step=4)
    mean = (1 + 3 + 4) / 3
    assert out == pytest.approx({
        "loss": 0.25, "grad_norm": 1.5, "learning_rate": 1e-5, "frac_reward_zero_std": 0.5, "kl": 0.02,
        "entropy": 0.7, "num_tokens": 123.0, "clip_ratio/low_mean": 0.1, "clip_ratio/high_mean": 0.05,
        "clip_ratio/low_min": 0.1, "clip_ratio/high_max": 0.05,  # one process: the shares themselves, as TRL's
        "clip_ratio/region_mean": 0.15, "step_time": 2.0,
        "reward": mean, "reward_std": math.sqrt(((1 - mean) ** 2 + (3 - mean) ** 2 + (4 - mean) ** 2) / 2),
        "completions/mean_length": (3 + 1 + 5 + 2) / 4, "completions/min_length": 1.0,
        "completions/max_length": 5.0, "completions/clipped_ratio": 0.25,
        "completions/mean_terminated_length": 2.0, "completions/min_terminated_length": 1.0,
        "completions/max_terminated_length": 3.0,
        "epoch": 3 / (10 // 4)})  # TRL: global steps over the steps of an epoch, the incomplete batch dropped
    every_cut = trl_log_keys({}, [scored_row("a", "x", 1.0, truncated=True)], 1, 0, 4)
    assert every_cut["completions/mean_terminated_length"] == 0.0 and math.isnan(every_cut["reward_std"])
    assert "epoch" not in every_cut and "loss" not in every_cut  # no source: left out


def test_a_run_logs_trls_keys_without_paths_in_metrics_tensorboard_and_samples(tmp_path, monkeypatch):
    """A run whose reward function lives in a file in another folder: rewards/<fn>/mean in metrics.jsonl and
    TensorBoard (it was rewards/<task>/<path>:<fn>/mean), no key anywhere holds the path, the step's TRL keys
    equal those computed from the step's completions (samples/), and TensorBoard has every key metrics.jsonl has."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import grpo_train

    monkeypatch.setenv("GRPO_DUAL_CACHE", str(tmp_path / "cache"))
    path = reward_file(tmp_path / "elsewhere" / "rewards")
    rows = [{"prompt": f"Write the word number {i} in capitals.", "word": f"w{i}"} for i in range(24)]
    run = grpo_train.train(tasks={"caps": rows}, rewards={"caps": f"{path}:correct_len"}, sft={"steps": 0},
                           train={"max_steps": 2, "prompts_per_micro_step": 2, "eval_every": 0, "tensorboard": True,
                                  "sample_every": 1, "output_dir": str(tmp_path / "out"), "run_name": "keys"},
                           rollout={"k": 2, "max_new_tokens": 4}, data={"eval_size": 4})
    lines = (run.run_dir / "metrics.jsonl").read_text().splitlines()
    keys = {k for line in lines for k in json.loads(line)}
    assert not [k for k in keys if "elsewhere" in k or ".py" in k], keys
    stepped = [json.loads(line) for line in lines if "rewards/correct_len/mean" in line]
    assert [r["step"] for r in stepped] == [1, 2]
    trl_keys = {"loss", "grad_norm", "learning_rate", "reward", "reward_std", "frac_reward_zero_std", "kl", "entropy",
                "completions/mean_length", "completions/clipped_ratio", "num_tokens", "step_time", "epoch"}
    for row in stepped:
        assert trl_keys <= set(row), trl_keys - set(row)
        completions = [json.loads(line) for line in
                       (run.run_dir / "samples" / f"step_{row['step']:06d}.jsonl").read_text().splitlines()]
        assert not [k for c in completions for k in c["parts"] if "elsewhere" in k]
        rewards = [c["reward"] for c in completions if c["reward"] is not None]
        mean = sum(rewards) / len(rewards)
        assert row["reward"] == pytest.approx(mean)
        assert row["reward_std"] == pytest.approx(math.sqrt(sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1)))
        scored = [c["parts"]["correct_len"] for c in completions if c["parts"]["correct_len"] is not None]
        assert row["rewards/correct_len/mean"] == pytest.approx(sum(scored) / len(scored))
        assert row["completions/clipped_ratio"] == pytest.approx(sum(c["truncated"] for c in completions)
                                                                 / len(completions))
        assert row["learning_rate"] == row["lr"] and row["loss"] == row["loss/total"]
    assert stepped[1]["num_tokens"] > stepped[0]["num_tokens"] > 0  # TRL's running count
    assert stepped[1]["epoch"] == pytest.approx(2 * stepped[0]["epoch"])
    tags = set(EventAccumulator(str(run.run_dir / "tb")).Reload().Tags()["scalars"])
    numeric = {k for r in stepped for k, v in r.items() if isinstance(v, float) and k != "step"}
    assert numeric <= tags, numeric - tags


def test_trls_tool_keys_count_the_calls_that_ran_by_hand():
    """4 completions, 6 calls of which 2 a turn limit kept from running, 2 failed: TRL's loop counts 4 calls (it
    never reaches the last ones), 4 / 4 per completion, 2 of them failed."""
    from grpo.run.trl.log_keys import tool_frequencies

    metrics = {"tools/calls_per_rollout": 6 / 4, "tools/unrun_per_rollout": 2 / 4, "tools/failure_rate": 2 / 6}
    assert tool_frequencies(metrics) == pytest.approx({"tools/call_frequency": 1.0, "tools/failure_frequency": 0.5})
    only_unrun = {"tools/calls_per_rollout": 0.25, "tools/unrun_per_rollout": 0.25, "tools/failure_rate": 0.0}
    assert tool_frequencies(only_unrun) == {"tools/call_frequency": 0.0, "tools/failure_frequency": 0.0}
    assert tool_frequencies({"loss/total": 1.0}) == {}  # no tools, no tools/ keys (as TRL without tools)
