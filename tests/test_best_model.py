"""The best evaluated model and early stopping, as transformers' Trainer keeps them for TRL
(grpo/run/checkpoint/best_model.py): transformers' own rules on hand-made sequences and against EarlyStoppingCallback
itself; a run whose held-out reward peaks before its end leaves the best evaluation's model in final/ and output_dir
(re-evaluated, it scores the recorded best); early stopping ends RL after `patience` evaluations without an improvement
and says so in the verdict; TRL's load_best_model_at_end / metric_for_best_model / greater_is_better translate with
transformers' rules; and the report finds a held-out reward that fell from its best by more than its sampling error."""

from __future__ import annotations

import json
import random

import pytest
import torch

from grpo import config as C
from grpo.run.checkpoint.best_model import best_of_run, better, patience_count, step_evaluations
from grpo.run.doctor.end_checks import FELL_Z, heldout_fell

pytestmark = pytest.mark.usefixtures("one_thread")
PEAKED = ["model.tiny_hidden=64", "model.tiny_layers=1", "model.tiny_heads=2", "data.demo_size=48", "data.eval_size=8",
          "rollout.k=4", "rollout.max_new_tokens=5", "sft.steps=30", "sft.max_examples=16", "sft.lr=3e-3",
          "train.max_steps=10", "train.eval_every=1", "train.lr=2e-3", "train.prompts_per_micro_step=4",
          "train.tensorboard=false", "train.sample_every=0", "train.threads=1", "train.run_name=r"]
"""The demo cut small, its RL steps too large for it: measured, its held-out reward peaks at step 1 (0.562) and ends
at 0.375 (seed 0, 1 thread)."""


def test_a_better_evaluation_is_a_strictly_better_one_and_the_patience_counts_as_transformers_does():
    assert better(0.5, None, True) and better(0.6, 0.5, True) and not better(0.5, 0.5, True)
    assert better(0.4, 0.5, False) and not better(0.6, 0.5, False)
    # the best moves with 0.51 (strictly better), the counter does not reset (not better by more than 0.05)
    assert patience_count([0.5, 0.51, 0.52, 0.7], threshold=0.05, greater=True) == 0
    assert patience_count([0.5, 0.51, 0.52], threshold=0.05, greater=True) == 2
    assert patience_count([0.5, 0.4, 0.3], threshold=0.0, greater=False) == 0  # lower is better
    evals = {"before_sft": {"a": 0.1}, "step_2": {"a": 0.5, "b": 0.7}, "step_10": {"a": 0.9, "b": 0.1},
             "after_rl": {"a": 0.7, "b": 0.6}}
    assert step_evaluations(evals, "reward") == [(2, pytest.approx(0.6)), (10, pytest.approx(0.5))]
    assert step_evaluations(evals, "reward/a") == [(2, 0.5), (10, 0.9)]
    assert best_of_run(evals, "reward", True, 12) == (12, pytest.approx(0.65))  # the last step's, strictly better
    assert best_of_run(evals, "reward/a", True, 12) == (10, 0.9)
    assert best_of_run({**evals, "after_rl": {"a": 0.5, "b": 0.7}}, "reward", True, 12)[0] == 2  # a tie: the first


def test_the_patience_counter_is_transformers_early_stopping_callbacks():
    """EarlyStoppingCallback.check_metric_value with Trainer's best-metric update after it, on random sequences."""
    transformers = pytest.importorskip("transformers")
    from types import SimpleNamespace

    rng = random.Random(0)
    for _ in range(200):
        values = [round(rng.random(), 2) for _ in range(rng.randint(1, 8))]
        greater, threshold = rng.random() < 0.5, rng.choice([0.0, 0.05, 0.2])
        callback = transformers.EarlyStoppingCallback(early_stopping_patience=3, early_stopping_threshold=threshold)
        state, args = SimpleNamespace(best_metric=None), SimpleNamespace(greater_is_better=greater)
        for value in values:
            callback.check_metric_value(args, state, None, value)
            if state.best_metric is None or (value > state.best_metric if greater else value < state.best_metric):
                state.best_metric = value  # Trainer._determine_best_metric, after the callback
        assert patience_count(values, threshold, greater) == callback.early_stopping_patience_counter, values


@pytest.mark.slow
def test_a_run_that_peaks_before_its_end_keeps_the_best_evaluations_model(tmp_path):
    """checkpoint.keep_best (TRL's load_best_model_at_end): final/ and checkpoint.final_model_dir hold the weights of
    the best evaluation, here step 1's, not the last step's; loaded and evaluated again they score the recorded best;
    eval.json's after_rl is that score, the last step's moved to its step_N."""
    from safetensors.torch import load_file

    import grpo_train
    from grpo.phases.evaluation import evaluate
    from grpo.run.checkpoint.save_resume import load_weights

    out = tmp_path / "output_dir"
    cfg = C.load_config("demo", [*PEAKED, f"train.output_dir={tmp_path}", "checkpoint.keep_best=true",
                                 f"checkpoint.final_model_dir={out}"])
    run = grpo_train.main(cfg)
    evals = run.progress.evals
    steps = [(int(t[5:]), sum(r.values()) / len(r)) for t, r in evals.items() if t.startswith("step_")]
    best_step, best = max(steps, key=lambda p: (p[1], -p[0]))
    last = dict(steps)[10]
    assert best_step < 10 and best > last  # it peaked before its end
    assert evals["after_rl"] == evals[f"step_{best_step}"]
    final = load_file(run.run_dir / "final" / "model.safetensors")
    kept = load_file(run.run_dir / "best" / "model.safetensors")
    published = load_file(out / "model.safetensors")
    assert final.keys() == kept.keys() == published.keys()
    assert all(torch.equal(final[k], kept[k]) and torch.equal(final[k], published[k]) for k in final)
    load_weights(run, run.run_dir / "final")  # the final model, evaluated again as every evaluation is
    again, _ = evaluate(run.policy.model, run.tokenizer, run.samples.heldout, run.cfg.rollout, run.generation.stop_ids,
                        lambda rollouts: run.rewarder.score(rollouts)[0])
    assert again == evals[f"step_{best_step}"]
    report = json.loads((run.run_dir / "report.json").read_text())
    assert report["tasks"]["fairness"]["after_rl"] == evals[f"step_{best_step}"]["fairness"]
    assert "best model (best/)" in run.start.disk  # the disk plan counts the kept copy
    assert not [f for f in report["findings"] if f["code"] == "heldout_fell"]  # the final model is the best


@pytest.mark.slow
def test_early_stopping_ends_rl_after_patience_evaluations_without_an_improvement(tmp_path, capsys):
    """train.early_stopping_patience=2 with a threshold no evaluation can beat (rewards lie in [0, 1]): evaluation 1
    sets the best, 2 and 3 do not improve on it, so RL ends after step 3 of 10, and the verdict says why."""
    import grpo_train

    cfg = C.load_config("demo", [*PEAKED, f"train.output_dir={tmp_path}", "train.early_stopping_patience=2",
                                 "train.early_stopping_threshold=10"])
    run = grpo_train.main(cfg)
    rows = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in rows if "loss/total" in r) == 3 and run.progress.step == 3
    assert sorted(t for t in run.progress.evals if t.startswith("step_")) == ["step_1", "step_2", "step_3"]
    report = json.loads((run.run_dir / "report.json").read_text())
    assert report["stopped_early"].startswith("stopped early after step 3: 2 evaluations in a row did not improve")
    assert report["reasons"][0] == report["stopped_early"]
    out = capsys.readouterr().out
    assert "early stopping after step 3" in out and f"  ({report['stopped_early']})" in out


def test_trls_best_model_fields_translate_with_transformers_rules(tmp_path):
    from grpo.run.trl.translation import translate

    trl = pytest.importorskip("trl")
    done = translate({"load_best_model_at_end": True, "metric_for_best_model": "eval_reward", "eval_strategy": "steps",
                      "eval_steps": 5, "save_strategy": "steps", "save_steps": 10, "use_cpu": True})
    assert done.tree["checkpoint"]["keep_best"] is True and done.tree["train"]["best_metric"] == "reward"
    assert done.tree["train"]["greater_is_better"] is True
    args = trl.GRPOConfig(output_dir=str(tmp_path), use_cpu=True, load_best_model_at_end=True, eval_strategy="steps",
                          eval_steps=5, save_steps=10)  # transformers sets metric_for_best_model="loss" here
    assert args.metric_for_best_model == "loss" and args.greater_is_better is False
    done = translate(args)
    assert (done.tree["train"]["best_metric"], done.tree["train"]["greater_is_better"]) == ("reward", True)
    assert any(n.startswith("GRPOConfig.metric_for_best_model='loss': grpo-dual's held-out evaluation")
               for n in done.notes)
    for fields, field, message in [
            ({"eval_strategy": "no"}, "load_best_model_at_end", "eval_strategy=no evaluates nothing"),
            ({"eval_strategy": "steps", "eval_steps": 5, "save_strategy": "epoch"}, "save_strategy",
             "requires the save and eval strategy to match"),
            ({"eval_strategy": "steps", "eval_steps": 10, "save_steps": 15}, "save_steps",
             "a multiple of the evaluation steps"),
            ({"eval_strategy": "steps", "eval_steps": 5, "metric_for_best_model": "eval_accuracy"},
             "metric_for_best_model", "gives the mean held-out reward")]:
        with pytest.raises(C.ConfigError, match=message) as err:
            translate({"load_best_model_at_end": True, "use_cpu": True, **fields})
        assert err.value.field == field


def test_a_held_out_reward_that_fell_from_its_best_by_more_than_its_sampling_error_is_a_finding():
    """Step 20's 16 held-out prompts at 0.75, the final model's: the same prompts, 4 of the right ones wrong (a fall of
    0.25, 2.2 standard errors of the per-prompt difference): heldout_fell, with the fix (a smaller step, a stronger KL
    pull, keep the best); 3 wrong (1.9 standard errors): within the noise, silent; a final model at its best: silent."""
    config = {"train": {"lr": 1e-4}}
    best = {f"r{i}": 1.0 if i < 12 else 0.0 for i in range(16)}

    def fell(wrong: int) -> list:
        final = {k: (0.0 if int(k[1:]) < wrong else v) for k, v in best.items()}
        evals = {"step_20": {"t": 0.75}, "after_rl": {"t": sum(final.values()) / 16}}
        return heldout_fell({"step_20": {"t": best}, "after_rl": {"t": final}}, evals, config)

    (finding,) = fell(4)
    assert finding.level == "yellow" and finding.task == "t" and FELL_Z == 2.0
    assert ("fell from its best 0.750 (step 20) to 0.500 after RL: -0.250 over 16 prompts, 2.2 standard errors" in
            finding.message)
    assert finding.suggestion.startswith("try `train.lr=5e-05`") and "checkpoint.keep_best=true" in finding.suggestion
    assert fell(3) == [] and fell(0) == []
