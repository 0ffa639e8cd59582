"""Reliability: what a user can get wrong ends in one line naming the culprit, the documented exit status, and
nothing left behind that blocks running the same command again. In-process `grpo_train.cli` runs of the tiny
model (tests/test_validation_doc.py's settings)."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import grpo_train as G
from grpo import config as C
from grpo.core.step_types import Sample
from grpo.run.assembly.samples import duplicate_report, load_samples
from tests.trainer_helpers import TINY_CLI as TINY
from tests.trainer_helpers import blocks_fresh_start, cli_output

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"


def run_cli(out: Path, *argv: str, name: str = "r") -> tuple[int, str]:
    """(exit status, stderr + stdout) of `grpo_train.py TINY argv` writing run folder out/name."""
    return cli_output([*TINY, "--train.output_dir", str(out), "--run-name", name, *argv])


def assert_retry_not_blocked(out: Path, name: str = "r") -> None:
    """No folder that blocks a fresh start: none at all, or one marked restartable."""
    folder = out / name
    assert not folder.exists() or not blocks_fresh_start(folder), sorted(p.name for p in folder.iterdir())


# ------------------------------------------------------------------------------------- every named task has rows
def _dual_dir(tmp_path: Path, halueval: list[str] | None) -> Path:
    if not (SHARED / "bbq" / "Religion.jsonl").is_file():
        pytest.skip(f"shared BBQ data not found at {SHARED}")
    root = tmp_path / "data"
    (root / "bbq").mkdir(parents=True)
    shutil.copy(SHARED / "bbq" / "Religion.jsonl", root / "bbq" / "Religion.jsonl")
    if halueval is not None:
        (root / "halueval").mkdir()
        for subset in halueval:
            shutil.copy(SHARED / "halueval" / "general_data.json", root / "halueval" / f"{subset}_data.json")
    return root


@pytest.mark.parametrize("halueval,subsets,culprit", [
    (None, [], "halueval does not exist"),  # the folder is missing
    ([], ["qa", "dialogue"], "qa_data.json"),  # the folder is there, every subset named is absent
    (["general"], ["qa"], "qa_data.json"),
], ids=["no-halueval-folder", "no-subset-file", "only-absent-subsets"])
def test_a_task_the_preset_names_without_rows_stops_before_the_model(tmp_path, halueval, subsets, culprit):
    root = _dual_dir(tmp_path, halueval)
    extra = ["--data.halueval_subsets", ",".join(subsets)] if subsets else []
    code, text = run_cli(tmp_path / "runs", "--preset", "dual-bbq-halueval", "--data.data_dir", str(root), *extra)
    assert code == 2, text
    assert culprit in text and "Traceback" not in text, text
    assert_retry_not_blocked(tmp_path / "runs")


def test_a_present_subset_beside_absent_ones_is_a_note_not_an_error(tmp_path):
    root = _dual_dir(tmp_path, ["general"])
    data = C.load_config("dual-bbq-halueval", [f"data.data_dir={root}", "data.halueval_subsets=general,qa",
                                                "data.halueval_per_subset=5", "data.bbq_per_category=8"]).data
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rows = load_samples(data, seed=0)
    assert {s.task for s in rows.every} == {"fairness", "hallucination"}
    assert "subset 'qa' skipped" in err.getvalue()


def test_no_bbq_folder_is_an_error_naming_it(tmp_path):
    root = tmp_path / "data"
    (root / "halueval").mkdir(parents=True)
    code, text = run_cli(tmp_path / "runs", "--preset", "dual-bbq-halueval", "--data.data_dir", str(root))
    assert code == 2 and str(root / "bbq") in text, text
    assert_retry_not_blocked(tmp_path / "runs")


# ------------------------------------------------------------------------------------- duplicate rows and ids
def _sample(i: str, text: str = "q", task: str = "qa") -> Sample:
    return Sample(task=task, id=i, messages=({"role": "user", "content": text},))


def test_duplicate_report_counts_and_names_the_first_offenders():
    rows = [_sample("a"), _sample("a"), _sample("b", "x"), _sample("b", "y"), _sample("c"), _sample("d", task="z")]
    (line,) = duplicate_report(rows)
    assert line == ("task 'qa': 2 id(s) used by more than one row, 1 of its 5 rows exact duplicates of an earlier "
                    "row (first: 'a' x2, 'b' x2)")
    assert duplicate_report([_sample("a"), _sample("b")]) == []


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("kind", ["every-row-twice", "ids-used-twice"])
def test_duplicate_rows_and_ids_are_warned_with_counts(tmp_path, kind):
    rows = [{"task": "qa", "id": f"r{i}", "prompt": f"question {i}?"} for i in range(40)]
    rows = rows + rows if kind == "every-row-twice" else rows + [dict(r, prompt=r["prompt"] + "!") for r in rows[:30]]
    data = C.load_config("demo", [f"data.source={_jsonl(tmp_path / 'rows.jsonl', rows)}"]).data
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        load_samples(data, seed=0)
    copies = 40 if kind == "every-row-twice" else 0
    shared = 40 if kind == "every-row-twice" else 30
    assert (f"warning: task 'qa': {shared} id(s) used by more than one row, {copies} of its {40 + shared} rows exact "
            "duplicates of an earlier row (first: 'r0' x2, 'r1' x2, 'r2' x2)") in err.getvalue()


def test_all_rows_sharing_one_id_names_the_id_in_the_error(tmp_path):
    rows = [{"task": "qa", "id": "same", "prompt": f"question {i}?"} for i in range(20)]
    path = _jsonl(tmp_path / "rows.jsonl", rows)
    from grpo.data.heldout_split import stable_hash01

    frac = 0.5 if stable_hash01("same") < 0.5 else 0.99  # the one id lands on the held-out side
    assert stable_hash01("same") < frac
    data = C.load_config("demo", [f"data.source={path}", f"data.heldout_fraction={frac}"]).data
    with contextlib.redirect_stderr(io.StringIO()), pytest.raises(ValueError) as err:
        load_samples(data, seed=0)
    assert "gave no training rows" in str(err.value) and "'same' x20" in str(err.value), str(err.value)


# ------------------------------------------------------------------------------------- a failed run can be re-run
def test_a_run_that_fails_before_its_first_checkpoint_reruns_with_the_same_command(tmp_path, monkeypatch):
    real = G.evaluate_phase

    def broken(run, label):
        raise ValueError("evaluation broke")

    monkeypatch.setattr(G, "evaluate_phase", broken)  # a failure after the run folder was made
    code, text = run_cli(tmp_path)
    assert code == 1 and "evaluation broke" in text and "Traceback" not in text, text
    assert (tmp_path / "r" / "config.json").is_file()
    assert_retry_not_blocked(tmp_path)
    monkeypatch.setattr(G, "evaluate_phase", real)
    code, text = run_cli(tmp_path)
    assert code == 0, text
    assert "stopped before its first checkpoint" in text
    assert blocks_fresh_start(tmp_path / "r")  # a finished run is protected again
    code, text = run_cli(tmp_path)
    assert code == 2 and "is not empty" in text, text


# ------------------------------------------------------------------------------------- Ctrl-C / SIGTERM anywhere
@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_sft_stops_with_a_message_and_the_shell_exit_status(tmp_path, sig, code):
    cmd = [sys.executable, "-X", "faulthandler", "grpo_train.py", *TINY, "--output-dir", str(tmp_path), "--run-name",
           "s", "--sft.steps", "100000", "--sft.batch_size", "2"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not (tmp_path / "s" / "eval.json").exists():  # the first evaluation is done
        time.sleep(0.2)
    time.sleep(1.0)
    assert proc.poll() is None, proc.stdout.read()
    proc.send_signal(sig)
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:  # once in a clean-clone CI run (2026-11-25), not reproduced: say where it hung
        proc.send_signal(signal.SIGABRT)  # -X faulthandler: every thread's stack on the way out
        out, _ = proc.communicate(timeout=30)
        pytest.fail(f"still running 60 s after {signal.Signals(sig).name}; its threads:\n{out[-8000:]}")
    assert proc.returncode == code, out
    assert f"interrupted by {signal.Signals(sig).name}" in out and "Traceback" not in out, out
    assert_retry_not_blocked(tmp_path, "s")


# ------------------------------------------------------------------------------------- inputs that gave tracebacks
def _pickle_file(tmp_path: Path) -> str:
    import pickle

    path = tmp_path / "model.pkl"
    path.write_bytes(pickle.dumps({"weights": [1, 2, 3]}))
    return str(path)


def _empty_folder(tmp_path: Path) -> str:
    (tmp_path / "empty_model").mkdir()
    return str(tmp_path / "empty_model")


@pytest.mark.parametrize("make,culprit", [
    (lambda tmp: "/nonexistent/path", "/nonexistent/path does not exist"),
    (_pickle_file, "is a file, not a model folder"),
    (_empty_folder, "empty_model"),
], ids=["missing-path", "pickle-file", "empty-folder"])
def test_a_model_name_that_does_not_load_is_one_line_naming_it(tmp_path, make, culprit):
    name = make(tmp_path)
    code, text = run_cli(tmp_path / "runs", "--model.name", name)
    assert code == 2, text
    assert f"config field `model.name` = {name!r} cannot be loaded" in text and culprit in text, text
    assert "Traceback" not in text
    assert_retry_not_blocked(tmp_path / "runs")


# ------------------------------------------------------------------------------------- data.max_prompt_tokens
def _long_rows(tmp_path: Path) -> Path:
    rows = [{"task": "qa", "id": f"s{i}", "prompt": f"short question {i}?"} for i in range(30)]
    rows += [{"task": "qa", "id": f"l{i}", "prompt": "word " * 300 + f"question {i}?"} for i in range(10)]
    return _jsonl(tmp_path / "rows.jsonl", rows)


def test_prompts_over_max_prompt_tokens_are_dropped_with_a_count(tmp_path):
    path = _long_rows(tmp_path)
    code, text = run_cli(tmp_path / "runs", "--data.source", str(path), "--data.max_prompt_tokens", "64",
                         "--rewards.qa", "tests.trainer_helpers:length_reward:1.0", "--data.eval_size", "4")
    assert code == 0, text
    # a count line per side (training, held-out): the 10 long rows, less those beyond data.eval_size held out
    counts = [int(n) for n in re.findall(r"data.max_prompt_tokens: (\d+) of \d+ \w+(?:-\w+)? prompts of task 'qa' "
                                         r"are longer than 64 tokens and are dropped", text)]
    assert counts and 0 < sum(counts) <= 10, text


def test_drop_long_prompts_keeps_exactly_the_prompts_that_fit():
    from grpo.models.modeling import build_tiny_tokenizer
    from grpo.models.tokens import encode_prompt
    from grpo.run.assembly.samples import drop_long_prompts

    tok = build_tiny_tokenizer()
    rows = {"qa": [_sample(str(i), "word " * i) for i in range(0, 60, 5)]}
    lengths = [len(encode_prompt(tok, s.messages)) for s in rows["qa"]]
    limit = sorted(lengths)[len(lengths) // 2]
    err = io.StringIO()
    with contextlib.redirect_stdout(err):
        kept = drop_long_prompts(rows, tok, limit, "training")
    assert [s.id for s in kept["qa"]] == [s.id for s, n in zip(rows["qa"], lengths, strict=True) if n <= limit]
    n_dropped = sum(n > limit for n in lengths)
    dropped = f"{n_dropped} of {len(lengths)} training prompts of task 'qa' are longer than {limit} tokens"
    assert dropped in err.getvalue()
    with pytest.raises(C.ConfigError) as e:
        drop_long_prompts(rows, tok, min(lengths) - 1, "training")
    assert e.value.field == "data.max_prompt_tokens"


@pytest.mark.parametrize("prompt,new,positions,expected", [
    (512, 96, 2048, (512, "")),  # fits: unchanged
    (512, 96, None, (512, "")),  # no limit known
    (512, 96, 512, (416, "data.max_prompt_tokens=512 lowered to 416: the model's 512 positions hold the prompt and "
                         "rollout.max_new_tokens=96")),
])
def test_prompt_token_limit_fits_the_model_positions(prompt, new, positions, expected):
    from grpo.run.assembly.samples import prompt_token_limit

    assert prompt_token_limit(prompt, new, positions) == expected


def test_completions_longer_than_the_model_positions_are_refused_before_training(tmp_path):
    code, text = run_cli(tmp_path, "--rollout.max_new_tokens", "600")  # the tiny model has 512 positions
    assert code == 2 and "config field `rollout.max_new_tokens` = 600" in text and "512 positions" in text, text
    assert_retry_not_blocked(tmp_path)


def test_a_start_that_fails_in_a_folder_named_after_its_clock_leaves_no_folder(tmp_path):
    """Without --run-name the folder is named after the start's time, so a retry never reuses it: a start that
    failed before writing anything must not leave it behind holding only the restart marker."""
    err, std = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(std):
        code = G.cli([*TINY, "--train.output_dir", str(tmp_path / "runs"), "--rollout.max_new_tokens", "600"])
    assert code == 2 and "rollout.max_new_tokens" in err.getvalue() + std.getvalue()
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == []
    code, _ = run_cli(tmp_path / "runs", "--rollout.max_new_tokens", "600", name="named")  # a name the user chose
    assert code == 2 and sorted(p.name for p in (tmp_path / "runs" / "named").iterdir()) == [
        ".grpo-dual-run", ".grpo-dual.lock", ".restartable"]  # bookkeeping only: the retry reuses it


# ------------------------------------------------------------------------------------- the judge: tried before the
# model
JUDGE = ["--judge.api_key_env", "", "--judge.max_retries", "0", "--judge.timeout_s", "5", "--train.max_steps", "2"]
REFUSED = "http://127.0.0.1:9/v1"  # nothing listens on port 9


def _metrics(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if '"time/step"' in line]


@pytest.mark.parametrize("status", [None, 500, 401], ids=["refused", "http-500", "http-401"])
def test_a_failing_judge_without_fallback_stops_before_the_model(tmp_path, status):
    from tests.judge_server import JudgeServer, Reply

    with JudgeServer(reply=lambda body, n: Reply(status=status or 200)) as server:
        url = REFUSED if status is None else server.url
        code, text = run_cli(tmp_path, *JUDGE, "--judge.base_url", url, "--rewards.fairness", "llm_judge:1.0")
    assert code == 2, text
    assert "task 'fairness', grader 'llm_judge': the judge at judge.base_url=" in text and url in text, text
    assert "failed its trial call" in text and "Traceback" not in text
    assert not (tmp_path / "r").exists()  # nothing made: before the run folder and the model


def test_a_failing_judge_with_a_fallback_logs_its_share_and_stops_past_the_limit(tmp_path):
    argv = [*JUDGE, "--judge.base_url", REFUSED, "--rewards.fairness", "llm_judge:1.0|format"]
    code, text = run_cli(tmp_path, *argv, "--judge.max_fallback_share", "1")  # allowed: trains on the fallback
    assert code == 0, text
    assert "failed its trial call" in text and "rewards will come from the fallback 'format'" in text
    rows = _metrics(tmp_path / "r")
    assert [r["reward/fairness/fallback_share"] for r in rows] == [1.0, 1.0]
    assert all("reward/hallucination/fallback_share" not in r for r in rows)  # no fallback there: no share
    code, text = run_cli(tmp_path, *argv, name="s")  # default judge.max_fallback_share = 0.5
    assert code == 1, text
    assert ("step 1: 100% of task 'fairness''s rewards came from its fallback grader, above "
            "judge.max_fallback_share=0.5") in text and "Traceback" not in text
    assert _metrics(tmp_path / "s")[0]["reward/fairness/fallback_share"] == 1.0  # the step is logged first
    assert_retry_not_blocked(tmp_path, "s")


def test_a_working_judge_is_called_once_per_judged_task_before_the_model(tmp_path):
    from tests.judge_server import JudgeServer

    with JudgeServer() as server:
        code, text = run_cli(tmp_path, *JUDGE, "--judge.base_url", server.url, "--rewards.fairness", "llm_judge:1.0",
                             "--rewards.hallucination", "llm_judge:1.0", "--train.max_steps", "1",
                             "--data.eval_size", "1", "--train.sample_every", "0", "--judge.cache_path",
                             str(tmp_path / "cache.sqlite"), "--model.name", "/nonexistent/model")
        assert code == 2 and "model.name" in text, text  # stopped at the model: after the judge's trial calls
        assert server.count == 2


def test_fallback_shares_count_the_fallback_providers():
    from grpo.core.step_types import Rollout, Scored
    from grpo.grading.scoring import RewardSpec, check_fallback_share, fallback_shares

    def scored(task, provider):
        sample = _sample("1", task=task)
        rollout = Rollout(sample=sample, prompt_ids=(1,), completion_ids=(2,), text="x", stopped=True, truncated=False)
        return Scored(rollout=rollout, reward=0.5, parts={}, provider=provider)

    specs = {"a": RewardSpec("a", (("llm_judge", 1.0),), fallback="format"), "b": RewardSpec("b", (("format", 1.0),))}
    rows = [scored("a", "fallback:format"), scored("a", "judge:m"), scored("a", "cache:m"),
            scored("a", "fallback:format"), scored("b", "rule")]
    shares = fallback_shares(rows, specs)
    assert shares == {"reward/a/fallback_share": 0.5}
    check_fallback_share(shares, 0.5, step=3)  # at the limit: goes on
    with pytest.raises(ValueError, match=r"step 3: 50% of task 'a''s rewards .* judge.max_fallback_share=0.4"):
        check_fallback_share(shares, 0.4, step=3)


# ------------------------------------------------------------------------------------- judge settings: one line, exit 2
@pytest.mark.parametrize("argv,culprit", [
    (["--judge.api_key_env", "GRPO_NO_SUCH_KEY_VAR"], "environment variable 'GRPO_NO_SUCH_KEY_VAR' is not set"),
    (["--judge.kind", "anthropic", "--judge.api_key_env", ""], "pip install anthropic"),
    (["--judge.api_key_env", "sk-proj-Abc123SECRETvalue0987654321xyz"], "config field `judge.api_key_env`"),
], ids=["no-key-in-env", "anthropic-without-sdk", "key-pasted-into-env-field"])
def test_judge_settings_a_user_gets_wrong_end_in_one_line(tmp_path, argv, culprit, monkeypatch):
    monkeypatch.delenv("GRPO_NO_SUCH_KEY_VAR", raising=False)
    if "anthropic" in argv and _has("anthropic"):
        pytest.skip("the anthropic SDK is installed here")
    code, text = run_cli(tmp_path, "--judge.base_url", REFUSED, "--rewards.fairness", "llm_judge:1.0", *argv)
    assert code == 2, text
    assert culprit in text and "Traceback" not in text, text
    assert "SECRET" not in text
    assert not (tmp_path / "r").exists()


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


# ------------------------------------------------------------------------------------- --resume auto and crafted
# folders
def _manifest(folder: Path, version: int, names: list[str]) -> None:
    import hashlib

    files = {n: {"sha256": hashlib.sha256((folder / n).read_bytes()).hexdigest(), "bytes": (folder / n).stat().st_size}
             for n in names}
    (folder / "manifest.json").write_text(json.dumps({"format_version": version, "step": 9, "files": files}))


def _craft(root: Path, kind: str) -> Path:
    folder = root / "checkpoints" / "step_000009"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    if kind == "legacy-pickle":
        (folder / "state.pt").write_bytes(b"not loaded")
        _manifest(folder, 1, ["state.pt", "config.json"])
    elif kind == "manifest-lists-nothing":
        _manifest(folder, 2, [])
    elif kind == "no-manifest":
        pass
    elif kind == "unknown-version":
        _manifest(folder, 7, ["config.json"])
    return folder


@pytest.mark.parametrize("kind", ["legacy-pickle", "manifest-lists-nothing", "no-manifest", "unknown-version"])
def test_resume_auto_skips_a_newer_unusable_folder_and_says_so(tmp_path, kind, capsys):
    import torch

    from grpo.run.checkpoint import files as ckpt

    good = ckpt.save(tmp_path, 3, {"step": 3, "weights": {"w": torch.arange(3.0)}}, {"a": 1}, keep_last=3)
    crafted = _craft(tmp_path, kind)
    assert ckpt.resolve_resume(tmp_path, "auto") == good
    err = capsys.readouterr().err
    assert str(crafted) in err and "skipped, trying the previous checkpoint" in err, err
    if kind == "legacy-pickle":  # with the switch the legacy folder is the newest usable one
        assert ckpt.resolve_resume(tmp_path, "auto", trust_pickle=True) == crafted


# ------------------------------------------------------------------------------------- the doctor on None / inf rewards
@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["rewards-none", "rewards-infinite"])
def test_the_doctor_does_not_advise_a_learning_rate_for_broken_rewards(value):
    from grpo.run.doctor.verdict import check_history
    from tests.test_doctor import BANDS, CONFIG, TH, healthy, rl

    rows = healthy()
    for row in rl(rows)[-10:]:  # the judge stopped answering: every reward None, the mean NaN (or a grader gave inf)
        row["reward/fairness/mean"] = value
        row["reward/fairness/std"] = float("nan")
    findings = check_history(rows, TH, BANDS, config=CONFIG)
    (bad,) = [f for f in findings if f.code == "non_finite"]
    assert "rewards.fairness" in bad.suggestion and "a smaller train.lr cannot help" in bad.suggestion, bad.suggestion
    assert bad.task == "fairness"
    assert not [f for f in findings if "train.lr=" in f.suggestion], [(f.code, f.suggestion) for f in findings]
    rows = healthy()
    rl(rows)[6]["loss/total"] = float("nan")  # not a reward: the step size is still the advice
    (bad,) = [f for f in check_history(rows, TH, BANDS, config=CONFIG) if f.code == "non_finite"]
    assert "train.lr=" in bad.suggestion


# ------------------------------------------------------------------------------------- settings that were accepted
@pytest.mark.parametrize("argv,field", [
    (["--train.seed", "-1"], "train.seed"),
    (["--train.weight_decay", "-5"], "train.weight_decay"),
    (["--loss.adv_clip", "0"], "loss.adv_clip"),
    (["--loss.adv_clip", "-2"], "loss.adv_clip"),
    (["--model.lora_alpha", "-16"], "model.lora_alpha"),
    (["--model.tiny_vocab", "1"], "model.tiny_vocab"),
    (["--run-name", "../escape"], "train.run_name"),
    (["--run-name", "/tmp/elsewhere"], "train.run_name"),
], ids=lambda v: "_".join(v) if isinstance(v, list) else v)
def test_a_bad_setting_stops_before_anything_naming_its_field(tmp_path, argv, field):
    out = tmp_path / "runs"
    err, std = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(std):
        code = G.cli([*TINY, "--train.output_dir", str(out), *argv])
    text = err.getvalue() + std.getvalue()
    assert code == 2, text
    assert f"config field `{field}` = " in text and "Traceback" not in text, text
    assert not out.exists() and not (tmp_path / "escape").exists()


@pytest.mark.parametrize("resume", ["auto", "/nonexistent/checkpoint"])
def test_a_resume_with_nothing_to_resume_leaves_a_folder_a_fresh_start_may_use(tmp_path, resume):
    code, text = run_cli(tmp_path, "--resume", resume)
    assert code == 1 and ("no complete checkpoint" in text or "no checkpoint at /nonexistent" in text), text
    assert "Traceback" not in text
    assert_retry_not_blocked(tmp_path)
    code, text = run_cli(tmp_path)  # the same command without --resume
    assert code == 0, text


# ------------------------------------------------------------------------------------------------- a full disk
def test_a_full_disk_is_one_line_naming_the_file_and_the_same_command_runs_again(tmp_path):
    """A file-size limit (as `ulimit -f`: every write past it fails with EFBIG, as on a full disk) in the middle of
    the run: safetensors reported 'I/O error: File too large' in a traceback, without the path. Now one line naming
    the file, exit 1, and the same command without the limit runs."""
    import resource

    argv = [sys.executable, str(ROOT / "grpo_train.py"), *TINY, "--sft.steps", "2", "--train.output_dir",
            str(tmp_path / "out"), "--run-name", "full"]

    def limit() -> None:  # in the child, before it starts: writes past 64 KiB fail (Python ignores SIGXFSZ)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))

    proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300, preexec_fn=limit)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert "could not write" in line and str(tmp_path / "out" / "full") in line and "File too large" in line
    assert_retry_not_blocked(tmp_path / "out", "full")
    again = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
