"""docs/VALIDATION.md matches the code: every row of its table is tried.

Each row names an input; `TRIALS` holds, per row, a function that provokes that input through the command line
(`grpo_train.cli`, in-process) or the function the row's second column names, and returns what came out (the
message and, for the command line, the exit status). The test checks every example message of the row (`...` = any
text) and the exit status the row documents. A row without a trial, or a trial without a row, fails the test.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import grpo_train as G
from grpo import config as C
from grpo.config.command_line import split_argv
from grpo.run.checkpoint import files as ckpt

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "VALIDATION.md"
TINY = ["--model.tiny_hidden", "32", "--model.tiny_layers", "1", "--model.tiny_heads", "2", "--data.demo_size", "24",
        "--data.eval_size", "2", "--rollout.max_new_tokens", "4", "--rollout.k", "2", "--sft.steps", "0",
        "--train.eval_every", "0", "--train.sample_every", "0", "--train.tensorboard", "false",
        "--train.prompts_per_micro_step", "2", "--train.lr", "1e-2", "--run-name", "r"]


@dataclass
class Outcome:
    text: str
    """Everything the trial printed or raised."""
    code: int | None = None
    """The command line's exit status; None when a function was called."""


def table_rows() -> list[dict[str, str]]:
    rows = []
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):  # the table of inputs is the doc's first; later sections have their own tables
            break
        if not line.startswith("| ") or line.startswith("| input ") or set(line) <= set("|- "):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        assert len(cells) == 4, f"a row of {DOC.name} needs 4 cells: {line}"
        rows.append(dict(zip(("input", "where", "happens", "example"), cells, strict=True)))
    return rows


def examples(cell: str) -> list[str]:
    """The ``...`` spans of the example cell (Markdown drops one space inside each end)."""
    return [m.strip() for m in re.findall(r"``(.+?)``", cell)]


def matches(example: str, text: str) -> bool:
    pattern = ".*?".join(re.escape(part.strip()) for part in example.split("..."))
    return re.search(pattern, " ".join(text.split()), re.S) is not None


def cli(argv: list[str]) -> Outcome:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = G.cli(argv)
    return Outcome(err.getvalue() + out.getvalue(), code)


def raised(fn, *args, **kwargs) -> Outcome:
    """The message of the exception `fn` raises (the trial fails if it raises none)."""
    try:
        fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - any exception: its message is what the row documents
        return Outcome(f"{type(e).__name__}: {e}")
    raise AssertionError(f"{fn.__name__} raised nothing")


def config_error(*argv: str):
    return lambda tmp, mp: cli([*argv, "--output-dir", str(tmp), "--print-config"])


def task_name_typo(tmp, mp):
    out = cli([*TINY, "--kl.fairnes.beta", "0.5", "--output-dir", str(tmp)])
    assert not (tmp / "r").exists()  # stopped before the run folder (and the model)
    return out


def data_rows(tmp, mp):
    from grpo.data.halueval import load_halueval

    path = tmp / "qa_data.json"
    good = {"knowledge": "k", "question": "q", "right_answer": "a", "hallucinated_answer": "b"}
    path.write_text(json.dumps(good) + "\n" + json.dumps({"knowledge": "k", "question": "q"}) + "\n{oops\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = load_halueval(str(path), subset="qa")
    assert len(result.samples) == 1 and result.skipped == 2
    return Outcome(" ".join(str(w.message) for w in caught))


def no_heldout(tmp, mp):
    from grpo.run.checkpoint.pareto import require_heldout_rows

    return raised(require_heldout_rows, {"qa": [1, 2, 3]}, {}, 0.2)


def nothing_held_out(tmp, mp):
    return cli([*TINY, "--data.heldout_fraction", "0", "--train.eval_every", "5", "--train.output_dir", str(tmp)])


def best_without_evaluations(tmp, mp):
    from grpo.run.trl.translation import translate

    outs = [cli([*TINY, "--checkpoint.keep_best", "true", "--train.output_dir", str(tmp / "a")]),
            cli([*TINY, "--train.eval_every", "2", "--checkpoint.keep_best", "true", "--train.best_metric",
                 "reward/fairnes", "--train.output_dir", str(tmp / "b")]),
            raised(translate, {"load_best_model_at_end": True, "eval_strategy": "steps", "eval_steps": 5,
                               "save_strategy": "epoch", "use_cpu": True})]
    assert [o.code for o in outs] == [2, 2, None], outs
    return Outcome(" ".join(o.text for o in outs), 2)


def empty_scores(tmp, mp):
    from grpo.run.checkpoint.pareto import ParetoFrontier

    return raised(ParetoFrontier(3, tmp / "pareto").offer, 3, {}, lambda path: None)


def unusable_replies(tmp, mp):
    from grpo.grading.rubrics import parse_score

    return Outcome(raised(parse_score, '{"score": 11}').text + " " + raised(parse_score, "I think it is good").text)


def garbage_replies(tmp, mp):
    from judge_server import JudgeServer, Reply

    from grpo.grading.judge import Judge, JudgeItem

    with JudgeServer(lambda body, n: Reply.garbage() if n % 2 == 0 else Reply.empty_choices()) as server:
        cfg = C.JudgeConfig(base_url=server.url, api_key_env="", max_retries=2, rate_limit_per_s=1000.0)
        with Judge(cfg, backoff_base_s=0.01, backoff_max_s=0.02) as judge:
            result = judge.score_batch([JudgeItem("fairness", "Q?", "A")])[0]
            metrics = judge.metrics()
    assert result.score is None and server.count == 3 and metrics["judge/retries"] == 2.0
    assert metrics["judge/errors/bad_body"] == 2.0 and metrics["judge/errors/no_choices"] == 1.0
    return Outcome(result.error or "")


def run_folder_used(tmp, mp):
    from grpo.run.checkpoint.folder import prepare_run_dir

    (tmp / "r").mkdir()
    (tmp / "r" / ".grpo-dual-run").write_text("{}\n")  # a run folder this program made (its marker)
    (tmp / "r" / "metrics.jsonl").write_text("{}\n")
    return raised(prepare_run_dir, tmp / "r", "", False)


def run_folder_not_ours(tmp, mp):
    from grpo.run.checkpoint.folder import prepare_run_dir

    (tmp / "r").mkdir()
    (tmp / "r" / "config.json").write_text("{}\n")  # a model folder holds config.json too
    (tmp / "r" / "model.safetensors").write_bytes(b"weights")
    return raised(prepare_run_dir, tmp / "r", "", True)


def run_folder_locked(tmp, mp):
    import subprocess
    import sys

    from grpo.run.checkpoint.folder import prepare_run_dir

    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from grpo.run.checkpoint.folder import "
                               "prepare_run_dir; prepare_run_dir(sys.argv[1], '', False); print('locked', flush=True); "
                               "time.sleep(60)", str(tmp / "r")], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        return raised(prepare_run_dir, tmp / "r", "", False)
    finally:
        holder.kill()
        holder.wait()


def output_dir_file(tmp, mp):
    from grpo.run.checkpoint.folder import prepare_run_dir

    (tmp / "file.txt").write_text("x")
    return raised(prepare_run_dir, tmp / "file.txt" / "r", "", False)


def output_dir_read_only(tmp, mp):
    import os

    from grpo.run.checkpoint.folder import prepare_run_dir

    if os.geteuid() == 0:  # root ignores permission bits: sysfs refuses everyone
        base = Path("/sys")
    else:
        base = tmp / "read-only"
        base.mkdir(mode=0o500)
    return raised(prepare_run_dir, base / "r", "", False)


def resume_missing(tmp, mp):
    return raised(ckpt.resolve_resume, tmp, str(tmp / "nowhere"))


def ckpt_incomplete(tmp, mp):
    (tmp / "checkpoints" / "step_000008").mkdir(parents=True)
    return raised(ckpt.verify, tmp / "checkpoints" / "step_000008")


def ckpt_corrupt(tmp, mp):
    folder = ckpt.save(tmp, 4, {"w": torch.ones(4)}, {}, keep_last=1)
    (folder / ckpt.TENSORS).write_bytes((folder / ckpt.TENSORS).read_bytes()[:-3])
    return raised(ckpt.verify, folder)


def reference_corrupt(tmp, mp):
    folder = ckpt.save_reference(tmp, {"w": torch.ones(4)})
    data = bytearray((folder / ckpt.REFERENCE_WEIGHTS).read_bytes())
    data[-1] ^= 0xFF
    (folder / ckpt.REFERENCE_WEIGHTS).write_bytes(bytes(data))
    return raised(ckpt.load_reference, tmp)


def ckpt_legacy(tmp, mp):
    folder = ckpt.save(tmp, 4, {"step": 4}, {}, keep_last=1)
    torch.save({"step": 4}, folder / ckpt.LEGACY_STATE)
    manifest = json.loads((folder / ckpt.MANIFEST).read_text())
    manifest["format_version"] = 1
    manifest["files"] = {n: manifest["files"][n] for n in ("config.json",)}
    (folder / ckpt.MANIFEST).write_text(json.dumps(manifest))
    return raised(ckpt.load, folder)


def ckpt_unstorable(tmp, mp):
    return raised(ckpt.save, tmp, 3, {"counters": {"bad": {1, 2}}}, {}, keep_last=1)


def ckpt_version(tmp, mp):
    folder = ckpt.save(tmp, 1, {"step": 1}, {}, keep_last=1)
    manifest = json.loads((folder / ckpt.MANIFEST).read_text())
    (folder / ckpt.MANIFEST).write_text(json.dumps({**manifest, "format_version": 0}))
    return raised(ckpt.verify, folder)


def ckpt_other_model(tmp, mp):
    return raised(ckpt.load_trainable_state, torch.nn.Linear(2, 2), {"weight": torch.ones(2, 2)}, tmp)


def ckpt_config_mismatch(tmp, mp):
    argv = [*TINY, "--output-dir", str(tmp), "--max-steps", "2", "--resume", "auto"]
    saved = C.load_config("demo", split_argv(argv)[0])  # the run that wrote the checkpoint: lr 1e-2
    ckpt.save(tmp / "r", 1, {"step": 1}, C.to_dict(saved), keep_last=1)  # the check comes before the state is used
    return cli([*argv, "--train.lr", "2e-2"])


def torn_metrics(tmp, mp):
    from grpo.run.tracking import JsonlTracker

    (tmp / "metrics.jsonl").write_text('{"step": 1, "a"\n{"step": 2}\n')
    return raised(JsonlTracker, tmp)


def numerics(tmp, mp):
    from grpo.core.weight_guard import WeightGuard

    guard = WeightGuard([torch.nn.Parameter(torch.ones(2))], max_consecutive=5)

    def five_bad_steps():
        for _ in range(5):
            guard.record(skipped=True, reason="non-finite or exploding gradient norm")

    return raised(five_bad_steps)


def deepspeed(tmp, mp):
    from grpo.machine.distributed import check_strategy

    return raised(check_strategy, "DEEPSPEED")


def fsdp_unsupported(tmp, mp):
    cfg = C.load_config("demo", ["model.lora=true", "multi.combine=pcgrad"])
    return raised(G.check_sharding, cfg, SimpleNamespace(grad_scaler=None), SimpleNamespace(world=2))


def fsdp_one_process(tmp, mp):
    return cli(["--train.sharding", "fsdp", "--output-dir", str(tmp)])


def cpu_relaunch(tmp, mp):
    import grpo.machine.distributed as D

    class Exec(Exception):
        pass

    def fake_execve(path, argv, env):
        raise Exec(" ".join(argv))

    mp.setattr(D.os, "execve", fake_execve)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(Exec) as started:
        D.relaunch_on_cpu(2, "grpo_train.py", ["--max-steps", "1"])
    assert "--nproc_per_node=2 grpo_train.py --max-steps 1" in str(started.value)
    return Outcome(err.getvalue())


def other_process_count(tmp, mp):
    from grpo.machine.distributed import Dist, rank_rng_state

    rng = ckpt.rng_state()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert rank_rng_state({"rng_ranks": [rng, rng], "rng": rng, "step": 3}, Dist()) is rng
    return Outcome(" ".join(str(w.message) for w in caught))


def cuda_oom(tmp, mp):
    import grpo.run.step_owners as step_owners
    from tests.trainer_helpers import fast_config

    run = G.setup(fast_config(tmp, "train.prompts_per_micro_step=2", "rollout.k=4"))
    calls = []

    def update_passes(*args, **kwargs):
        calls.append(run.updater.micro_batch_seqs)
        if len(calls) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return {"loss/total": 0.0, "health/skipped": 0.0, "health/grad_norm_max": 0.0}

    mp.setattr(step_owners, "update_passes", update_passes)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        stats = run.updater.update(batch=None)
    assert calls == [8, 4] and stats["health/oom_retries"] == 1.0
    return Outcome(err.getvalue())


def dual_missing_task(tmp, mp):
    import shutil

    religion = ROOT.parent / "shared" / "data" / "bbq" / "Religion.jsonl"
    if not religion.is_file():
        pytest.skip(f"shared BBQ data not found at {religion.parent}")
    root = tmp / "data"
    (root / "bbq").mkdir(parents=True)
    shutil.copy(religion, root / "bbq" / "Religion.jsonl")
    out = cli([*TINY, "--preset", "dual-bbq-halueval", "--data.data_dir", str(root), "--output-dir", str(tmp / "runs")])
    assert not (tmp / "runs").exists()
    return out


def duplicate_rows(tmp, mp):
    from grpo.core.step_types import Sample
    from grpo.run.assembly.samples import duplicate_report

    rows = [Sample(task="qa", id=i, messages=({"role": "user", "content": "q"},)) for i in "abcabc"]
    return Outcome("\n".join(f"warning: {line}" for line in duplicate_report(rows)))


def long_prompts(tmp, mp):
    rows = [{"task": "qa", "id": f"s{i}", "prompt": f"short question {i}?"} for i in range(30)]
    rows += [{"task": "qa", "id": f"l{i}", "prompt": "word " * 300} for i in range(10)]
    path = tmp / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = cli([*TINY, "--train.max_steps", "1", "--data.source", str(path), "--data.max_prompt_tokens", "64",
               "--rewards.qa", "tests.trainer_helpers:length_reward:1.0", "--data.eval_size", "4",
               "--output-dir", str(tmp)])
    assert out.code == 0, out.text
    return Outcome(out.text)


def model_not_loading(tmp, mp):
    return cli([*TINY, "--model.name", "/nonexistent/path", "--output-dir", str(tmp)])


def judge_trial_call(tmp, mp):
    return cli([*TINY, "--judge.base_url", "http://127.0.0.1:9/v1", "--judge.api_key_env", "",
                "--judge.max_retries", "0", "--rewards.fairness", "llm_judge:1.0", "--output-dir", str(tmp)])


def judge_settings(tmp, mp):
    mp.delenv("GRPO_NO_SUCH_KEY_VAR", raising=False)
    return cli([*TINY, "--judge.base_url", "http://127.0.0.1:9/v1", "--judge.api_key_env", "GRPO_NO_SUCH_KEY_VAR",
                "--rewards.fairness", "llm_judge:1.0", "--output-dir", str(tmp)])


def ckpt_crafted_newer(tmp, mp):
    good = ckpt.save(tmp, 3, {"step": 3, "weights": {"w": torch.arange(3.0)}}, {"a": 1}, keep_last=3)
    crafted = tmp / "checkpoints" / "step_000009"
    crafted.mkdir()
    (crafted / "manifest.json").write_text(json.dumps({"format_version": 2, "step": 9, "files": {}}))
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert ckpt.resolve_resume(tmp, "auto") == good
    return Outcome(err.getvalue())


TRL_BASE = {"model_name_or_path": "builtin:tiny", "reward_funcs": ["tests.trainer_helpers.trl_length_reward"],
            "max_steps": 1, "per_device_train_batch_size": 2, "num_generations": 2, "max_completion_length": 4,
            "use_cpu": True, "save_strategy": "no"}
SMALL = ["--model.tiny_hidden", "32", "--model.tiny_layers", "1", "--model.tiny_heads", "2", "--data.eval_size", "2"]


def trl_file(tmp, mp, text: str = "", **fields) -> Path:
    """A TRL config file over a copy of examples/trl_grpo/math (tmp/math), its output_dir tmp/out."""
    import shutil

    import yaml

    mp.setenv("GRPO_DUAL_CACHE", str(tmp / "cache"))
    mp.setattr("grpo.data.dataset_dicts.hub_reachable", lambda: (False, "https://huggingface.co"))
    if not (tmp / "math").exists():
        shutil.copytree(ROOT / "examples" / "trl_grpo" / "math", tmp / "math")
    path = tmp / "trl.yaml"
    path.write_text(yaml.safe_dump({**TRL_BASE, "dataset_name": str(tmp / "math"), "output_dir": str(tmp / "out"),
                                    **fields}) + text)
    return path


def trl_type(tmp, mp):
    return cli(["--config", str(trl_file(tmp, mp, max_steps=2.7)), *SMALL, "--print-config"])


def trl_rule(tmp, mp):
    return cli(["--config", str(trl_file(tmp, mp)), *SMALL, "--max_completion_length", "0", "--print-config"])


def trl_repeats(tmp, mp):
    return cli(["--config", str(trl_file(tmp, mp, "max_steps: 3\n")), *SMALL, "--print-config"])


def inert(tmp, mp):
    from grpo.run.assembly.start_checks import inert_settings

    return Outcome("; ".join(inert_settings(C.load_config("demo", ["rollout.fold_lora=on"]), torch.device("cpu"))))


def too_many_threads(tmp, mp):
    return cli([*TINY, "--train.threads", "100000", "--output-dir", str(tmp)])


def trl_data(tmp, mp):
    path = trl_file(tmp, mp)
    train = tmp / "math" / "train.jsonl"
    lines = train.read_text().splitlines()
    lines[6] = '{"prompt": broken'
    train.write_text("\n".join(lines) + "\n")
    return cli(["--config", str(path), *SMALL, "--print-config"])


def offline_uncached(tmp, mp):
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("HF_HOME", str(tmp / "hf"))
    mp.delenv("HF_HUB_CACHE", raising=False)
    return cli(["--config", str(trl_file(tmp, mp)), *SMALL, "--dataset_name", "someone/not-cached", "--print-config"])


def lora_targets(tmp, mp):
    ours = cli([*TINY, "--train.output_dir", str(tmp / "ours"), "--model.lora", "true",
                "--model.lora_target_modules", "nonexistent_proj"])
    theirs = cli(["--config", str(trl_file(tmp, mp)), *SMALL, "--use_peft", "--lora_target_modules",
                  "nonexistent_proj"])
    assert ours.code == theirs.code, (ours, theirs)
    return Outcome(ours.text + theirs.text, theirs.code)


def output_dir_foreign(tmp, mp):
    return cli(["--config", str(trl_file(tmp, mp)), *SMALL, "--output_dir", str(tmp / "math")])


def trl_count(tmp, mp):
    return cli(["--config", str(trl_file(tmp, mp)), *SMALL, "--num_generations", "0"])


def final_in_run_folder(tmp, mp):
    return cli([*TINY, "--output-dir", str(tmp), "--checkpoint.final_model_dir", str(tmp / "r")])


def trl_and_our_flag(tmp, mp):
    return cli(["--config", str(trl_file(tmp, mp)), *SMALL, "--learning_rate", "1e-5", "--train.lr", "3e-5"])


def memory_tool(tmp, mp):
    from grpo.run.assembly.gpu_memory_check import check_gpu_memory

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = check_gpu_memory(["--estimate", "--gpu-mem", "0"])
        except SystemExit as e:
            code = e.code
    return Outcome(err.getvalue() + out.getvalue(), code)


def disk_full(tmp, mp):
    import collections

    usage = collections.namedtuple("usage", "total used free")
    mp.setattr("grpo.run.assembly.disk_plan.shutil.disk_usage",
               lambda path: usage(10**12, 10**12 - 3 * 10**6, 3 * 10**6))
    return cli([*TINY, "--output-dir", str(tmp)])


def disk_full_at_the_end(tmp, mp):
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    mp.setattr("grpo.run.checkpoint.save_resume.save_model_folder", full)
    return cli([*TINY, "--train.max_steps", "1", "--output-dir", str(tmp)])


def stopped_early(tmp, mp):
    write_folder = ckpt._write_folder

    def full_at_step_2(folder, final, files, meta):
        if meta.get("step") == 2:
            raise OSError(28, "No space left on device")
        return write_folder(folder, final, files, meta)

    mp.setattr(ckpt, "_write_folder", full_at_step_2)
    return cli([*TINY, "--train.max_steps", "3", "--checkpoint.every", "1", "--output-dir", str(tmp)])


def memory_tool_configs(tmp, mp):
    from grpo.run.assembly.gpu_memory_check import check_gpu_memory

    shape = {"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
             "intermediate_size": 1536, "vocab_size": 49152, "max_position_embeddings": 8192}
    texts, codes = [], []
    for name, extra, argv in (("q", {"quantization_config": {"quant_method": "hqq"}}, []),
                              ("p", {}, ["--data.max_prompt_tokens", "100000000"])):
        (tmp / name).mkdir()
        (tmp / name / "config.json").write_text(json.dumps({**shape, **extra}))
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            codes.append(check_gpu_memory(["--estimate", "--set", f"model.name={tmp / name}", *argv]))
        texts.append(out.getvalue())
    assert codes == [2, 2], texts
    return Outcome(" ".join(texts), 2)


TRIALS = {
    "config value (type, range, choice)": config_error("--rollout.k", "1"),
    "config value of the wrong type": config_error("--train.lr", "abc"),
    "unknown name (loss, estimator, controller, engine, combine, grader)": config_error("--loss.policy_loss", "ppo"),
    "unknown field": config_error("--rollout.kk", "3"),
    "cross-field rules": config_error("--model.load_in_4bit", "true"),
    "per-task KL band": config_error("--preset", "llama3-8b-dual", "--kl.fairness.band_low", "0.9"),
    "a `kl.<task>` or `rewards.<task>` entry naming no task of the run (a typo)": task_name_typo,
    "data rows": data_rows,
    "a task without held-out rows (e.g. a JSONL task of 3 rows)": no_heldout,
    "held-out evaluations asked for (`train.eval_every`, `train.eval_every_epoch`, `train.pass_at_k`) where no task "
    "has held-out rows (`data.heldout_fraction=0`, TRL's split, and no eval split)": nothing_held_out,
    "the best model or early stopping without an evaluation to rank (`checkpoint.keep_best`, "
    "`train.early_stopping_patience` with `train.eval_every=0`), a `train.best_metric` naming no evaluated task, TRL's "
    "`load_best_model_at_end` against transformers' rules (an eval strategy, the save strategy the same, `save_steps` "
    "a "
    "multiple of `eval_steps`)": best_without_evaluations,
    "Pareto scores of no task": empty_scores,
    "judge replies without a usable score": unusable_replies,
    "judge replies that are not JSON, or have no choices": garbage_replies,
    "run folder not empty on a fresh run": run_folder_used,
    "a folder this program did not make a run folder (a model folder; a run folder of a version before the marker), "
    "with or without `--overwrite`": run_folder_not_ours,
    "a run folder that another running process writes": run_folder_locked,
    "`--output-dir` that is a file": output_dir_file,
    "`--output-dir` that cannot be written": output_dir_read_only,
    "`--resume` a path that does not exist": resume_missing,
    "checkpoints: incomplete": ckpt_incomplete,
    "checkpoints: corrupt": ckpt_corrupt,
    "checkpoints: the post-SFT reference corrupt": reference_corrupt,
    "checkpoints: old format (`state.pt`, a pickle)": ckpt_legacy,
    "checkpoints: a state value that cannot be stored": ckpt_unstorable,
    "checkpoints: format version": ckpt_version,
    "checkpoints: other model / LoRA setting": ckpt_other_model,
    "checkpoints: config mismatch on resume": ckpt_config_mismatch,
    "metrics.jsonl with a line torn by a kill": torn_metrics,
    "numerics during training": numerics,
    "several processes: a strategy not supported (DeepSpeed)": deepspeed,
    "FSDP with what it does not support": fsdp_unsupported,
    "`train.sharding=fsdp` in one process": fsdp_one_process,
    "`accelerate launch --cpu --num_processes N` (accelerate starts one process)": cpu_relaunch,
    "a checkpoint from another process count": other_process_count,
    "CUDA out of memory in the update": cuda_oom,
    "a task the preset names without rows (`halueval/` missing, or only absent HaluEval subsets)": dual_missing_task,
    "duplicate rows or ids in task data": duplicate_rows,
    "prompts longer than `data.max_prompt_tokens`": long_prompts,
    "`model.name` that does not load (a missing path, a pickle file, a folder without a model)": model_not_loading,
    "a judge that fails its trial call (refused, HTTP error, no score), no fallback grader": judge_trial_call,
    "a judge setting a user gets wrong (no key in the variable, `judge.kind=anthropic` without its SDK, a key pasted "
    "into `judge.api_key_env`)": judge_settings,
    "checkpoints: a crafted or legacy folder newer than the good ones": ckpt_crafted_newer,
    "a TRL value of the wrong type, in a config file or a flag (`max_steps: 2.7`, `--eval_steps abc`, `use_peft: "
    "maybe`, `num_generations: [4]`, `--reward_weights abc`)": trl_type,
    "a rule a TRL value breaks (checked by the rule of the grpo-dual field it sets), or a `--section.field` flag that "
    "clashes with a value a TRL field set": trl_rule,
    "a key given twice in one table of a config file; a TRL flag or `--config` given twice": trl_repeats,
    "a setting that cannot act in this run (`rollout.fold_lora` without LoRA or off the graph engine, "
    "`rollout.sampling_rng=global` under the graph engine; TRL's `fp16` on the CPU)": inert,
    "`train.threads` above the CPUs the process may use": too_many_threads,
    "a TRL dataset that cannot be used: an empty data file, a line that is not JSON, rows without TRL's `prompt` "
    "column, a chat message of an unknown role": trl_data,
    "a Hub id under `HF_HUB_OFFLINE=1` that is not in the local cache (a dataset, a model)": offline_uncached,
    "LoRA target modules the model does not have": lora_targets,
    "an output folder (`checkpoint.final_model_dir`, TRL's `output_dir`) holding what no run wrote there: the model "
    "being trained, a dataset, another run's files, anything else": output_dir_foreign,
    "the memory tool's `--gpu-mem` that is no card's (0, negative, nan, 1e400); a `config.json` that is not a "
    "model's": memory_tool,
    "a run whose planned writes do not fit the free space of a file system it writes to": disk_full,
    "a disk that fills up at the end of a run": disk_full_at_the_end,
    "a TRL count below 1 that the batch arithmetic divides by or repeats (`num_generations`, "
    "`per_device_train_batch_size`, `gradient_accumulation_steps`, `num_iterations`); an interval (`save_steps`, "
    "`eval_steps`, `logging_steps`) of 0 or less": trl_count,
    "`checkpoint.final_model_dir` the run folder itself or inside its `checkpoints/`": final_in_run_folder,
    "a TRL flag and our flag for one setting on one command line (`--learning_rate 1e-5 --train.lr 3e-5`)":
        trl_and_our_flag,
    "a run stopped early: Ctrl-C or SIGTERM (once or twice), a disk that fills up mid-run, a failure after set-up":
        stopped_early,
    "the memory tool on a `config.json` that is not a dense, unquantized model: a mixture of experts, weights saved "
    "quantized (`quantization_config`), a `data.max_prompt_tokens` beyond `max_position_embeddings`":
        memory_tool_configs,
}
ROWS = table_rows()


def test_every_row_has_a_trial_and_every_trial_a_row():
    assert [r["input"] for r in ROWS] == list(TRIALS)


def test_the_functions_the_table_names_exist():
    import importlib

    for row in ROWS:
        for name in re.findall(r"`([a-z_]+(?:\.[A-Za-z_]+)+)`", row["where"]):
            module, _, attr = name.rpartition(".")
            while module:
                try:
                    obj = importlib.import_module(module)
                    break
                except ImportError:
                    module, _, outer = module.rpartition(".")
                    attr = f"{outer}.{attr}"
            else:
                raise AssertionError(f"{name}: no module")
            for part in attr.split("."):
                obj = getattr(obj, part)


@pytest.mark.parametrize("row", ROWS, ids=[r["input"] for r in ROWS])
def test_row(row, tmp_path, monkeypatch):
    outcome = TRIALS[row["input"]](tmp_path, monkeypatch)
    shown = examples(row["example"])
    assert shown, f"row {row['input']!r} gives no example message"
    for example in shown:
        assert matches(example, outcome.text), f"{example!r} not in:\n{outcome.text}"
    documented = re.search(r"exits? (\d)", row["happens"])
    if outcome.code is not None:
        assert documented, f"row {row['input']!r}: the command line exited {outcome.code}; say so in the row"
        assert outcome.code == int(documented.group(1)), outcome.text
    assert "Traceback" not in outcome.text
