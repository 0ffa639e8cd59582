"""A TRL-style reward function gets every keyword TRL 1.16's GRPOTrainer passes, with TRL's meaning, read
from TRL's own `_calculate_rewards` on the same rows (a stand-in trainer holding what that method reads): the
dataset's columns, prompts / completions / completion_ids, trainer_state, log_metric, log_extra (its columns reach
the completions' rows of samples/, as TRL adds them to its completions table), and no `environments` (TRL passes it
only with an environment_factory, which grpo-dual has not)."""

from __future__ import annotations

import json
import types
import warnings
from collections import defaultdict

import pytest

from grpo.grading.graders import GraderError, preflight, reward_logs, set_trainer_state
from grpo.grading.scoring import RewardSpec, score_rollouts
from tests.test_graders import rollout

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: a tiny model gains nothing from threads

trl = pytest.importorskip("trl")
ROWS = [{"prompt": f"Write the word number {i} in capitals.", "answer": f"W{i}", "level": i % 3} for i in range(24)]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_DUAL_CACHE", str(tmp_path / "cache"))


def trl_stand_in(reward_funcs, global_step: int, max_steps: int):
    """What GRPOTrainer._calculate_rewards reads of its trainer, with TRL's own _log_completion_extra / _log_metric
    bound to it and the `environments` GRPOTrainer.__init__ sets without an environment_factory (None)."""
    from transformers import TrainerState
    from trl.trainer.grpo_trainer import GRPOTrainer

    fake = types.SimpleNamespace(
        accelerator=types.SimpleNamespace(device="cpu", is_main_process=True), reward_funcs=reward_funcs,
        reward_processing_classes=[None] * len(reward_funcs), reward_func_names=[f.__name__ for f in reward_funcs],
        state=TrainerState(global_step=global_step, max_steps=max_steps), args=types.SimpleNamespace(report_to=[]),
        environments=None, _pending_extra_logs=defaultdict(list), _pending_metrics=defaultdict(list))
    fake._log_completion_extra = types.MethodType(GRPOTrainer._log_completion_extra, fake)
    fake._log_metric = types.MethodType(GRPOTrainer._log_metric, fake)
    return fake


def spy(seen: list):
    def reward_spy(prompts, completions, completion_ids, **kwargs):
        seen.append({"prompts": prompts, "completions": completions, "completion_ids": completion_ids, **kwargs})
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        kwargs["log_extra"]("length", [len(t) for t in texts])
        kwargs["log_extra"]("step", [kwargs["trainer_state"].global_step] * len(texts))
        kwargs["log_metric"]("mean_level", sum(kwargs["level"]) / len(texts))
        return [float(len(t)) for t in texts]
    return reward_spy


def our_sample(tmp_path, conversational: bool):
    """The first row of ROWS as grpo-dual loads it (python_config + load_samples), and as TRL's dataset holds it."""
    from grpo.run.api import python_config
    from grpo.run.assembly.samples import load_samples

    rows = [{**r, "prompt": [{"role": "user", "content": r["prompt"]}]} if conversational else r for r in ROWS]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = trl.GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, max_steps=2)
    cfg, _ = python_config(None, {"caps": rows}, {"caps": [spy([])]}, None, {}, trl_args=args)
    loaded = load_samples(cfg.data, cfg.train.seed, cfg.tasks, announce=False)
    sample = loaded.train[0]
    (row,) = [r for r in rows if (r["prompt"][-1]["content"] if conversational else r["prompt"])
              == sample.messages[-1]["content"]]
    return sample, row


@pytest.mark.parametrize("conversational", [False, True], ids=["standard", "conversational"])
def test_a_reward_function_gets_every_keyword_trls_trainer_passes_with_trls_meaning(tmp_path, conversational):
    """A function asking for log_extra is not refused: the keywords are TRL's own (plus grpo-dual's `task` column),
    each with the value TRL's trainer gives it, so a reward function written for TRL runs as it is."""
    from trl.trainer.grpo_trainer import GRPOTrainer

    sample, row = our_sample(tmp_path, conversational)
    texts = ["W0", "a much longer reply"]
    ids = [[5, 6], [7, 8, 9]]
    completions = [[{"role": "assistant", "content": t}] for t in texts] if conversational else texts
    theirs: list = []
    fake = trl_stand_in([spy(theirs)], global_step=6, max_steps=10)
    trl_rewards = GRPOTrainer._calculate_rewards(fake, [row, row], [row["prompt"]] * 2, completions, ids)

    mine: list = []
    spec = {"caps": RewardSpec("caps", (("reward_spy", 1.0),), aggregation="sum")}
    graders = preflight(spec, {"caps": [sample]}, callables={"reward_spy": spy(mine)})
    mine.clear()
    set_trainer_state(6, 10)
    scored, _ = score_rollouts([rollout(sample, t, i) for t, i in zip(texts, ids, strict=True)], spec, graders=graders)
    (ours,), (trls,) = mine, theirs

    # every keyword TRL passes, no `environments` (TRL: none without a factory)
    assert set(ours) - {"task"} == set(trls)
    assert ours["task"] == ["caps", "caps"]  # grpo-dual's own column, documented
    for key in sorted(set(trls) - {"trainer_state", "log_extra", "log_metric"}):  # prompts ... and the columns
        assert ours[key] == trls[key], key
    assert type(ours["trainer_state"]) is type(trls["trainer_state"])  # transformers' TrainerState
    assert (ours["trainer_state"].global_step, ours["trainer_state"].max_steps) == (6, 10)
    assert [s.reward for s in scored] == trl_rewards[:, 0].tolist()
    logged = {c: [s.extra[c] for s in scored] for c in ("length", "step")}
    assert logged == dict(fake._pending_extra_logs) == {"length": [2, 19], "step": [6, 6]}  # log_extra's columns
    assert reward_logs() == {f"reward_log/{k}": sum(v) / len(v) for k, v in fake._pending_metrics.items()}


def test_environments_is_passed_as_trl_passes_it_without_an_environment_factory(tmp_path):
    """TRL's GRPOTrainer sets `self.environments = None` unless an environment_factory is given, and then does not
    pass the keyword at all: a function with `environments=None` gets its default in both; one that requires it fails
    in TRL (TypeError) and is named here before anything is trained, with the reason."""
    from trl.trainer.grpo_trainer import GRPOTrainer

    sample, row = our_sample(tmp_path, conversational=False)
    got = {}

    def optional(completions, environments=None, **kwargs):
        got.setdefault("calls", []).append((environments, "environments" in kwargs))
        return [1.0] * len(completions)

    def required(completions, environments, **kwargs):
        return [1.0] * len(completions)

    GRPOTrainer._calculate_rewards(trl_stand_in([optional], 0, 1), [row], [row["prompt"]], ["x"], [[1]])
    preflight({"caps": RewardSpec("caps", (("optional", 1.0),))}, {"caps": [sample]}, callables={"optional": optional})
    assert got["calls"] and set(got["calls"]) == {(None, False)}
    with pytest.raises(TypeError, match="environments"):
        GRPOTrainer._calculate_rewards(trl_stand_in([required], 0, 1), [row], [row["prompt"]], ["x"], [[1]])
    with pytest.raises(GraderError, match=r"\['environments'\].*environment_factory.*environments=None"):
        preflight({"caps": RewardSpec("caps", (("required", 1.0),))}, {"caps": [sample]},
                  callables={"required": required})


def test_log_extra_with_the_wrong_number_of_values_is_named(tmp_path):
    sample, _ = our_sample(tmp_path, conversational=False)

    def short(completions, log_extra, **kwargs):
        log_extra("note", ["only one"])
        return [0.0] * len(completions)

    spec = {"caps": RewardSpec("caps", (("short", 1.0),))}
    graders = preflight(spec, {"caps": [sample]}, callables={"short": short})  # the preflight drops what is logged
    with pytest.raises(GraderError, match=r"grader 'short'.*log_extra\('note', \.\.\.\) got 1 values for 3 "
                                          r"completions"):
        score_rollouts([rollout(sample, t) for t in ("a", "b", "c")], spec, graders=graders)


def test_log_extra_columns_reach_the_logged_completions_of_a_run(tmp_path):
    """GRPOConfig(log_completions=True): samples/step_N.jsonl holds each completion with the columns the reward
    functions logged for it (TRL's completions table), and evals/ the held-out completions with theirs."""
    import grpo_train

    def reward_len(completions, log_extra, trainer_state, **kwargs):
        log_extra("chars", [len(c) for c in completions])
        log_extra("scored_at", [trainer_state.global_step] * len(completions))
        return [-abs(20 - len(c)) for c in completions]

    def reward_words(completions, log_extra, **kwargs):
        log_extra("words", [len(c.split()) for c in completions])
        return [0.0] * len(completions)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = trl.GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, max_completion_length=4, max_steps=2,
                              per_device_train_batch_size=4, num_generations=2, logging_steps=1,
                              log_completions=True, gradient_checkpointing=False)
    run = grpo_train.train(["model.tiny_hidden=32", "model.tiny_layers=1", "model.tiny_heads=2", "sft.steps=0",
                            "data.eval_size=2"], tasks={"caps": ROWS[:-2]},
                           rewards={"caps": [reward_len, reward_words]},
                           args=args, eval_dataset=ROWS[-2:])  # TRL evaluates an eval_dataset only
    assert len(run.samples.training["caps"]) == len(ROWS) - 2
    for step in (1, 2):
        rows = [json.loads(line) for line in (run.run_dir / "samples" / f"step_{step:06d}.jsonl").open()]
        assert len(rows) == 4
        for r in rows:
            assert r["extra"] == {"chars": len(r["completion"]), "scored_at": step - 1,
                                  "words": len(r["completion"].split())}
    held_out = [json.loads(line) for line in (run.run_dir / "evals" / "after_rl.jsonl").open()]
    assert held_out and all(r["extra"]["chars"] == len(r["completion"]) for r in held_out)
