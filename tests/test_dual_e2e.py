"""The dual-objective preset end to end on the real BBQ / HaluEval files: rule graders, then the LLM judge."""

from __future__ import annotations

import json

import pytest

import grpo_train as G
from grpo import config as C
from tests.conftest import SHARED_DATA
from tests.judge_server import JudgeServer

pytestmark = pytest.mark.skipif(not (SHARED_DATA / "bbq").is_dir(), reason=f"{SHARED_DATA} is absent")

SMALL = ["model.tiny_hidden=32", "model.tiny_layers=1", "model.tiny_heads=2", "data.bbq_per_category=4",
         "data.halueval_per_subset=12", "data.eval_size=2", "rollout.max_new_tokens=6", "rollout.k=2",
         "train.prompts_per_micro_step=2", "train.grad_accum=1", "sft.steps=1", "train.max_steps=1",
         "train.eval_every=0", "train.tensorboard=false"]


def _cfg(tmp_path, *extra):
    return C.load_config("dual-bbq-halueval", [f"data.data_dir={SHARED_DATA}", "model.name=builtin:tiny",
                                               f"train.output_dir={tmp_path}", "train.run_name=d", *SMALL, *extra])


def test_dual_preset_with_rule_graders(tmp_path):
    run = G.main(_cfg(tmp_path))
    assert set(run.tasks) == {"fairness", "hallucination"}
    rows = [json.loads(x) for x in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    step = [r for r in rows if "reward/fairness/mean" in r][-1]
    for t in ("fairness", "hallucination"):
        for key in (f"reward/{t}/mean", f"kl/{t}", f"beta/{t}", f"rollout/{t}/length", f"rollout/{t}/truncated"):
            assert key in step, key
    assert step["beta/fairness"] == 0.10 and step["beta/hallucination"] == 0.30
    # every evaluation keeps its greedy completions with each grader's score; the reward is their weighted mean
    evals = json.loads((run.run_dir / "eval.json").read_text())
    assert sorted(p.stem for p in (run.run_dir / "evals").glob("*.jsonl")) == sorted(evals)
    kept = [json.loads(x) for x in (run.run_dir / "evals" / "after_rl.jsonl").read_text().splitlines()]
    for t, weights in (("fairness", {"bbq_rule": 1.0, "format": 0.2}),
                       ("hallucination", {"halueval_rule": 1.0, "format": 0.2})):
        mine = [r for r in kept if r["task"] == t]
        assert mine and all(set(r["parts"]) == set(weights) for r in mine)
        mean = sum(sum(w * r["parts"][g] for g, w in weights.items()) / 1.2 for r in mine) / len(mine)
        assert abs(mean - evals["after_rl"][t]) < 1e-9
        assert f"eval_part/{t}/format" in [k for r in rows for k in r]
    # BBQ's own measures of every evaluation: measures.json per tag, and the eval/fairness/bbq/... metrics
    measures = json.loads((run.run_dir / "measures.json").read_text())
    assert sorted(measures) == sorted(evals) and list(measures["after_rl"]["bbq"]) == ["fairness"]
    overall = measures["after_rl"]["bbq"]["fairness"]["overall"]
    assert overall["n_ambig"] + overall["n_disambig"] == len([r for r in kept if r["task"] == "fairness"])
    logged = {k: v for r in rows for k, v in r.items() if k.startswith("eval/fairness/bbq/")}
    defined = {k: float(v) for k, v in overall.items() if k in ("acc_ambig", "acc_disambig", "s_amb") and v is not None}
    assert defined and all(logged[f"eval/fairness/bbq/{k}"] == v for k, v in defined.items())


def test_dual_preset_through_the_llm_judge(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_TEST_JUDGE_KEY", "sk-test-secret-123")
    with JudgeServer() as server:
        run = G.main(_cfg(tmp_path, f"judge.base_url={server.url}", "judge.api_key_env=GRPO_TEST_JUDGE_KEY",
                          "judge.model=test-judge", "rewards.hallucination=llm_judge:1.0|halueval_rule"))
        assert server.count > 0
    rows = [json.loads(x) for x in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    step = [r for r in rows if "reward/hallucination/mean" in r][-1]
    assert step["judge/calls"] > 0 and step["judge/failures"] == 0
    assert step.get("judge/share/test-judge", 0) > 0, sorted(k for k in step if k.startswith("judge/"))
    for path in run.run_dir.rglob("*"):
        if path.is_file():
            assert b"sk-test-secret-123" not in path.read_bytes(), f"API key leaked into {path}"


def test_dual_preset_with_shuffled_options_and_recognition_records_the_gold_label_measures(tmp_path):
    # the tiny model holds 512 positions: 120 rows give held-out replies short enough (data.max_prompt_tokens)
    run = G.main(_cfg(tmp_path, "data.shuffle_options=true", "data.halueval_subsets=general_recognition",
                      "data.halueval_per_subset=120", "data.eval_size=6", "train.max_steps=2"))
    assert any("shuffled" in s.meta for s in run.samples.training["fairness"])
    assert all(s.gold["subset"] == "general_recognition" for s in run.samples.heldout["hallucination"])
    measures = json.loads((run.run_dir / "measures.json").read_text())
    after = measures["after_rl"]
    assert list(after["bbq"]) == ["fairness"] and list(after["recognition"]) == ["hallucination"]
    rec = after["recognition"]["hallucination"]["overall"]
    assert rec["n_yes"] + rec["n_no"] == len(run.samples.heldout["hallucination"][:6])
    rows = [json.loads(x) for x in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    if rec["balanced_accuracy"] is not None:
        logged = [r["eval/hallucination/recognition/balanced_accuracy"] for r in rows
                  if "eval/hallucination/recognition/balanced_accuracy" in r]
        assert logged[-1] == rec["balanced_accuracy"]
    report = json.loads((run.run_dir / "report.json").read_text())
    assert report["recognition"]["hallucination"]["after_rl"] == rec["balanced_accuracy"]
    assert report["bbq"]["fairness"]["after_rl"] == after["bbq"]["fairness"]["overall"]
