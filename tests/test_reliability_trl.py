"""The sixth reliability pass: TRL's command line as safe as our own. Each probe is an input a user gets wrong on the
TRL command line, its settings or the tools beside them (the tiny model, examples/trl_grpo/math, 2 steps), and how it
must end: exit status 2 with one line naming the field, the file and line or the row, no traceback, and no file
outside the run's own folder changed (checksums before and after); or a run that goes on with a printed note.
In-process `grpo_train.cli` runs; the end-to-end ones are marked slow."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from tests.trainer_helpers import cli_output

ROOT = Path(__file__).resolve().parents[1]
MATH = ROOT / "examples" / "trl_grpo" / "math"
pytestmark = pytest.mark.usefixtures("one_thread")
BASE = {"model_name_or_path": "builtin:tiny", "reward_funcs": ["tests.trainer_helpers.trl_length_reward"],
        "max_steps": 2, "per_device_train_batch_size": 4, "num_generations": 4, "max_completion_length": 8,
        "use_cpu": True, "save_strategy": "no"}
"""The probes' TRL config file (its dataset_name and output_dir are each probe's folders): 2 RL steps of 1 prompt x
4 completions of up to 8 tokens."""
SMALL = ["--model.tiny_hidden", "32", "--model.tiny_layers", "1", "--model.tiny_heads", "2", "--data.eval_size", "2"]


class User:
    """A user's folder: the dataset (a copy of examples/trl_grpo/math), the config file, an output folder."""

    def __init__(self, root: Path) -> None:
        self.root, self.data, self.out = root, root / "math", root / "out"
        shutil.copytree(MATH, self.data)
        self.config = self.write_config()

    def write_config(self, text: str = "", **fields) -> Path:
        import yaml

        path = self.root / "trl.yaml"
        path.write_text(yaml.safe_dump({**BASE, "dataset_name": str(self.data), "output_dir": str(self.out),
                                        **fields}) + text)
        return path

    def files(self) -> dict[str, str]:
        """sha256 of every file under the user's folder but the output folder (the run's own) and the cache."""
        return {str(p.relative_to(self.root)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(self.root.rglob("*")) if p.is_file() and not p.is_relative_to(self.out)
                and not p.is_relative_to(self.root / "cache")}


@pytest.fixture
def user(tmp_path, monkeypatch) -> User:
    monkeypatch.setenv("GRPO_DUAL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("grpo.data.dataset_dicts.hub_reachable", lambda: (False, "https://huggingface.co"))
    return User(tmp_path)


def refused(user: User, *argv: str, config: bool = True) -> str:
    """The one message of a start refused with exit status 2, no traceback, nothing of the user's changed, no model
    loaded ("precision: ..." is printed as it loads)."""
    before = user.files()
    code, text = cli_output([*(["--config", str(user.config)] if config else []), *SMALL, *argv])
    assert code == 2, text
    assert "Traceback" not in text and "precision:" not in text, text
    assert user.files() == before
    return text


# ------------------------------------------------------------------ 1. every TRL value checked before it is used
TYPES = [
    (["--max_steps", "abc"], "`max_steps` = 'abc' is invalid: expected int"),
    (["--max_steps", "2.7"], "`max_steps` = 2.7 is invalid: expected int"),
    (["--eval_steps", "abc"], "`eval_steps` = 'abc' is invalid: expected float"),
    (["--learning_rate", "abc"], "`learning_rate` = 'abc' is invalid: expected float"),
    (["--reward_weights", "abc"], "`reward_weights` = 'abc' is invalid: expected float"),
    (["--num_generations", "[4]"], "`num_generations` = [4] is invalid: expected int"),
    (["--use_peft", "maybe"], "--use_peft maybe: use true or false"),
    (["--model_init_kwargs", "abc"], "GRPOConfig.model_init_kwargs='abc': give a table"),
    (["--loss_type", "grpoo"], "(did you mean `grpo`?)"),
]


@pytest.mark.parametrize("argv,says", TYPES, ids=[" ".join(a) for a, _ in TYPES])
def test_a_trl_flag_of_the_wrong_type_is_refused_naming_it(user, argv, says):
    assert says in refused(user, *argv, "--print-config")


def _typed_rows(*kinds):
    from grpo.run.trl.config_table import TABLE
    from grpo.run.trl.record_tables import RECORDS
    from grpo.run.trl.rows import field_type

    return [row.trl for row in [*TABLE, *(r for rows in RECORDS.values() for r in rows)]
            if field_type(row) in kinds and row.trl != "datasets"]


@pytest.mark.parametrize("field", _typed_rows(int, float, int | None, float | None, bool, bool | None))
def test_every_numeric_or_bool_trl_flag_given_a_word_is_refused_naming_it(user, field):
    """Every number and switch of TRL's four records (--max_steps abc was one of 14 numeric flags that ended in a
    ValueError traceback; --use_peft maybe trained LoRA in a YAML)."""
    from grpo.config.command_line import ALIASES

    text = refused(user, f"--{field}", "abc", "--print-config")
    named = ALIASES.get(field, field)  # --seed is also grpo-dual's own shortcut, train.seed
    assert f"`{named}` = 'abc' is invalid: expected " in text or f"--{field} abc: use true or false" in text, text


YAML_TYPES = [
    ({"use_peft": "maybe"}, "`use_peft` = 'maybe' is invalid: use true or false"),
    ({"use_peft": 2}, "`use_peft` = 2 is invalid: expected bool"),  # 0 / 1 read as the flag's (the seventh pass)
    ({"max_steps": 2.7}, "`max_steps` = 2.7 is invalid: expected int"),
    ({"per_device_train_batch_size": "abc"}, "`per_device_train_batch_size` = 'abc' is invalid: expected int"),
    ({"num_generations": [4]}, "`num_generations` = [4] is invalid: expected int"),
    ({"reward_weights": "abc"}, "`reward_weights` = 'abc' is invalid: expected a list of numbers"),
    ({"lora_target_modules": 5}, "`lora_target_modules` = 5 is invalid: expected a name or a list of names"),
    ({"report_to": 5}, "GRPOConfig.report_to=5: give none, tensorboard, wandb, all, or a list of them"),
]


@pytest.mark.parametrize("fields,says", YAML_TYPES, ids=[str(f) for f, _ in YAML_TYPES])
def test_a_trl_config_value_of_the_wrong_type_is_refused_naming_it(user, fields, says):
    user.config = user.write_config(**fields)
    assert says in refused(user, "--print-config")


def test_a_yaml_number_written_without_a_dot_is_read_as_the_number(user):
    """PyYAML reads `1e-5` as text: the field's type makes it the number (as our own fields do)."""
    user.config = user.write_config(learning_rate="1e-5")
    code, text = cli_output(["--config", str(user.config), *SMALL, "--print-config"])
    assert code == 0, text
    assert json.loads(text[text.index("{"):])["train"]["lr"] == 1e-5


# ------------------------------------------------------------------ 4. messages that name what the user set
NAMED = [
    (["--max_completion_length", "0"], "`max_completion_length` = 0 is invalid: use a positive integer (TRL's "
     "max_completion_length is grpo-dual's rollout.max_new_tokens)"),
    (["--gradient_accumulation_steps", "0"], "GRPOConfig.gradient_accumulation_steps=0: it counts micro-batches"),
    (["--learning_rate", "-1"], "`learning_rate` = -1.0 is invalid: use a learning rate in (0, 1]"),
    (["--rollout.max_new_tokens", "100000000"], "`rollout.max_new_tokens` = '100000000' is invalid: it breaks the "
     "rule of `rollout.max_trajectory_tokens` (from TRL's max_completion_length=8)"),
    (["--resume_from_checkpoint", "out/grpo-dual/checkpoints/step_000002"], "grpo-dual resumes with --resume"),
    (["--warmup_steps", "-1"], "GRPOConfig.warmup_steps=-1.0: use 0 (no warm-up)"),
]


@pytest.mark.parametrize("argv,says", NAMED, ids=[" ".join(a) for a, _ in NAMED])
def test_a_rule_a_trl_value_breaks_names_the_field_the_user_set(user, argv, says):
    assert says in refused(user, *argv, "--print-config")


def test_each_trl_field_is_checked_as_the_type_trl_gives_it():
    """FIELD_TYPES and the defaults agree with TRL 1.16's own annotations, field by field (walked from its dataclasses):
    a number, a bool or text exactly; a list of names, reward_weights' numbers, or a table a converter reads."""
    import dataclasses

    trl = pytest.importorskip("trl")
    from trl import DatasetMixtureConfig, ModelConfig
    from trl.scripts.grpo import GRPOScriptArguments

    from grpo.run.trl.config_table import TABLE
    from grpo.run.trl.record_tables import RECORDS
    from grpo.run.trl.rows import NUMBERS, TEXT_OR_LIST, field_type

    annotations = {f.name: str(f.type) for cls in (trl.GRPOConfig, GRPOScriptArguments, ModelConfig,
                                                  DatasetMixtureConfig) for f in dataclasses.fields(cls)}
    simple = {"<class 'int'>": int, "<class 'float'>": float, "<class 'bool'>": bool, "<class 'str'>": str,
              "int | None": int, "float | None": float, "bool | None": bool, "str | None": str}
    for row in [*TABLE, *(r for rows in RECORDS.values() for r in rows)]:
        theirs, ours = annotations[row.trl], field_type(row)
        if ours is __import__("typing").Any:  # a table, a list of tables, text or true / false: its converter reads it
            assert row.convert is not None, row.trl
        elif theirs in simple:  # None allowed or not: a row may map unset onto a value
            base = simple[theirs]
            assert ours in (base, base | None), (row.trl, theirs, ours)
        elif "Strategy" in theirs or "SchedulerType" in theirs or "OptimizerNames" in theirs:
            assert ours is str, (row.trl, theirs, ours)  # an enum of text
        else:
            assert ours in (TEXT_OR_LIST, NUMBERS), (row.trl, theirs, ours)


# ------------------------------------------------------------------ 3. repeats named
def test_a_key_given_twice_in_a_config_file_is_refused_with_both_lines(user, tmp_path):
    user.config = user.write_config("learning_rate: 1.0e-5\nmax_steps: 3\n")  # max_steps is in BASE too
    text = refused(user, "--print-config")
    assert f"--config {user.config}: line " in text and "`max_steps` is given twice (first at line " in text, text
    path = tmp_path / "ours.json"
    path.write_text('{"train": {"seed": 1, "lr": 0.01, "seed": 2}}')
    code, text = cli_output(["--config", str(path), "--print-config"])
    assert code == 2 and "`seed` is given twice in one table" in text and str(path) in text, text


REPEATS = [
    (["--reward_funcs", "a", "--reward_funcs", "b"], "--reward_funcs is given twice (a, then b): give it once; a list "
     "flag takes several words: --reward_funcs a b"),
    (["--learning_rate", "1e-5", "--learning_rate", "1e-4"], "--learning_rate is given twice (1e-5, then 1e-4)"),
]


@pytest.mark.parametrize("argv,says", REPEATS, ids=[" ".join(a) for a, _ in REPEATS])
def test_a_trl_flag_given_twice_is_refused(user, argv, says):
    assert says in refused(user, *argv, "--print-config")


def test_config_given_twice_is_refused_and_our_own_flag_twice_is_named(user):
    text = refused(user, "--config", str(user.config), "--print-config")  # a second --config after refused()'s
    assert "--config is given 2 times" in text, text
    code, text = cli_output(["--config", str(user.config), *SMALL, "--rollout.k", "4", "--rollout.k", "8",
                             "--print-config"])
    assert code == 0 and "the last value applies: rollout.k (4, 8: 8 applies)" in text, text
    assert json.loads(text[text.index("{"):])["rollout"]["k"] == 8


# ------------------------------------------------------------------ 3. settings that cannot act named; threads bounded
INERT = [
    (["rollout.fold_lora=on"], "cpu", "rollout.fold_lora=on does nothing in this run: it folds LoRA adapters for the "
     "graph engine's rollouts, and this run trains without LoRA (model.lora=false)"),
    (["rollout.fold_lora=off", "model.lora=true"], "cpu", "only the graph engine folds LoRA, and rollout.engine=auto "
     "picks it on a CUDA GPU only, and this run is on the CPU"),
    (["rollout.fold_lora=on", "model.lora=true", "rollout.engine=lean"], "cuda", "this run decodes with the lean "
     "engine (rollout.engine=lean)"),
    (["rollout.engine=graph", "rollout.sampling_rng=global"], "cpu", "rollout.sampling_rng=global under "
     "rollout.engine=graph: the graph engine always samples with its per-row sampler"),
]


@pytest.mark.parametrize("overrides,device,says", INERT, ids=[" ".join(o) for o, _, _ in INERT])
def test_a_setting_that_cannot_act_in_the_run_is_named(overrides, device, says):
    import torch

    from grpo import config as C
    from grpo.run.assembly.start_checks import inert_settings

    assert [says in n for n in inert_settings(C.load_config("demo", overrides), torch.device(device))] == [True]
    for quiet in (["rollout.fold_lora=on", "model.lora=true"], ["rollout.sampling_rng=global"], []):
        assert not inert_settings(C.load_config("demo", quiet), torch.device("cuda" if quiet[:1] == [
            "rollout.fold_lora=on"] else "cpu")), quiet  # graph may fold on a GPU; global is transformers' on the CPU


def test_fp16_on_the_cpu_is_named_not_dropped_silently(user):
    code, text = cli_output(["--config", str(user.config), *SMALL, "--fp16", "--print-config"])
    assert code == 0 and text.count("GRPOConfig.fp16=True: not applied: this run is on the CPU") == 1, text
    assert json.loads(text[text.index("{"):])["model"]["dtype"] == "float32"


@pytest.mark.parametrize("over", [1, 100_000, 10**30])
def test_train_threads_above_the_processs_cpus_is_refused_before_the_data_loads(user, over):
    from grpo.machine.host_resources import cpu_share

    threads = str(cpu_share().affinity + over)  # 64 on 2 CPUs ran silently, 100000 and 10**30 failed late
    text = refused(user, "--train.threads", threads)
    assert f"`train.threads` = {threads} is invalid: this process may use" in text, text
    assert not user.out.exists()


@pytest.mark.slow
def test_a_run_with_a_setting_that_cannot_act_trains_and_says_so(user):
    code, text = cli_output(["--config", str(user.config), *SMALL, "--rollout.fold_lora", "on"])
    assert code == 0, text
    assert "note: rollout.fold_lora=on does nothing in this run" in text, text
    assert (user.out / "grpo-dual" / "final").is_dir()


# ------------------------------------------------------------------ 4. the user's own data file, line and row named
def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _write(path: Path, rows: list, bad: dict[int, str] | None = None) -> None:
    lines = [json.dumps(r) for r in rows]
    for number, text in (bad or {}).items():
        lines[number - 1] = text
    path.write_text("".join(line + "\n" for line in lines))


def test_data_files_whose_columns_differ_say_so(user):
    train = user.data / "train.jsonl"
    _write(train, [{"question": r["prompt"][0]["content"], "solution": r["solution"]} for r in _rows(train)])
    assert "because column names don't match" in refused(user, "--print-config")


def test_an_empty_data_file_is_named(user):
    (user.data / "train.jsonl").write_text("")
    assert f"dataset_name: {user.data / 'train.jsonl'} is empty: it holds no rows" in refused(user, "--print-config")


def test_a_malformed_line_is_named_with_its_file_and_line(user):
    train = user.data / "train.jsonl"
    _write(train, _rows(train), {7: '{"prompt": broken'})
    text = refused(user, "--print-config")
    assert f"dataset_name: {train}:7: not valid JSON (Expecting value): fix or delete that line" in text, text


def test_rows_without_a_prompt_column_name_the_users_dataset_not_the_cache_copy(user):
    for split in ("train", "test"):
        path = user.data / f"{split}.jsonl"
        _write(path, [{"question": r["prompt"][0]["content"], "solution": r["solution"]} for r in _rows(path)])
    text = refused(user, "--print-config")
    assert (f"the rows of dataset_name='{user.data}' (split 'train') have no `prompt` column (its columns: "
            "['question', 'solution'])" in text and "cache" not in text), text


def test_an_unknown_chat_role_names_the_dataset_split_and_row(user):
    train = user.data / "train.jsonl"
    rows = _rows(train)
    rows[3]["prompt"][0]["role"] = "wizard"
    _write(train, rows)
    text = refused(user, "--print-config")
    assert f"dataset_name='{user.data}', split 'train', row 4: message 1 of its prompt has the role 'wizard'" in text


def test_an_unknown_chat_role_in_a_task_file_is_a_bad_row_named_by_file_and_line(tmp_path):
    import warnings

    from grpo.data.sources import TaskSource, load_source_samples

    path = tmp_path / "qa.jsonl"
    _write(path, [{"messages": [{"role": "wizard" if i == 1 else "user", "content": f"q{i}"}]} for i in range(3)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        samples, _ = load_source_samples("qa", TaskSource(path=str(path)))
    assert [s.meta["line"] for s in samples] == [1, 3]
    assert [str(w.message) for w in caught] == [f"{path}:2: skipped bad row: column 'messages' has a message of the "
                                                "role 'wizard'; chat templates know system, user, assistant, tool (and "
                                                "some developer, ipython, function)"]


def test_a_role_the_models_template_refuses_names_the_row_not_jinja(tmp_path):
    from grpo.core.step_types import Sample
    from grpo.data.json_rows import DataFileError
    from grpo.models.modeling import build_tiny_tokenizer
    from grpo.run.assembly.samples import prompt_tokens

    tokenizer = build_tiny_tokenizer(["a question"])  # its template takes system, user, assistant and tool
    sample = Sample(task="qa", id="1", messages=({"role": "developer", "content": "hi"},), gold={},
                    meta={"source": str(tmp_path / "qa.jsonl"), "line": 9})
    with pytest.raises(DataFileError, match=rf"^{tmp_path / 'qa.jsonl'} line 9 \(task 'qa', roles \['developer'\]\): "
                                            "the model's chat template refuses its messages: unknown chat role"):
        prompt_tokens(tokenizer, sample)


@pytest.mark.parametrize("flag,what", [("--dataset_name", "dataset"), ("--model_name_or_path", "model")])
def test_an_uncached_hub_id_offline_says_the_hub_is_off_and_it_is_not_cached(user, monkeypatch, flag, what):
    from grpo.data.dataset_dicts import check_hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(user.root / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    text = refused(user, flag, "someone/not-cached", "--print-config")
    assert (f"{flag[2:]}='someone/not-cached': the Hugging Face Hub is switched off here (HF_HUB_OFFLINE=1) and "
            f"someone/not-cached is not in the local Hugging Face cache ({user.root / 'hf' / 'hub'})" in text), text
    (user.root / "hf" / "hub" / f"{what}s--someone--not-cached").mkdir(parents=True)
    check_hub("someone/not-cached", flag[2:], what)  # cached: the offline load reads it


def test_our_own_model_name_offline_and_uncached_says_so(tmp_path, monkeypatch):
    from grpo.run.assembly.model_loading import model_load_error

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    err = model_load_error("someone/not-cached", OSError("We couldn't connect to 'https://huggingface.co'"))
    assert err.field == "model.name" and "cannot be loaded: the Hugging Face Hub is switched off here" in str(err)


def test_lora_target_modules_the_model_lacks_are_named_before_it_loads(user):
    text = refused(user, "--use_peft", "--lora_target_modules", "nonexistent_proj", "q_proj")
    assert ("`--lora_target_modules` (model.lora_target_modules) = ['nonexistent_proj', 'q_proj'] is invalid: "
            "builtin:tiny (llama) has no module named ['nonexistent_proj']" in text and "model.name" not in text), text
    assert not user.out.exists()


# ------------------------------------------------------------------ 2. no write over what the run did not create
def _model_folder(root: Path) -> Path:
    """A saved model folder (the tiny model's save_pretrained), the kind a user starts from."""
    from grpo import config as C
    from grpo.models.modeling import load_policy, save_pretrained

    policy = load_policy(C.ModelConfig(name="builtin:tiny", tiny_hidden=32, tiny_layers=1, tiny_heads=2), seed=0,
                         tiny_corpus=["What is 2 + 2?"])
    return save_pretrained(policy, root / "model")


def _another_run(root: Path) -> Path:
    code, text = cli_output([*SMALL, "--max-steps", "1", "--sft.steps", "0", "--train.eval_every", "0",
                             "--data.demo_size", "24", "--rollout.k", "2", "--train.prompts_per_micro_step", "2",
                             "--rollout.max_new_tokens", "4", "--output-dir", str(root), "--run-name", "theirs"])
    assert code == 0, text
    return root / "theirs"


FOREIGN = [
    ("the starting model", lambda user: ["--model_name_or_path", str(_model_folder(user.root)), "--output_dir",
                                         str(user.root / "model")], "is the folder of the model being trained"),
    ("another run's folder", lambda user: ["--output_dir", str(_another_run(user.root))],
     "it looks like another run's folder"),
    ("the dataset", lambda user: ["--output_dir", str(user.data)], "(test.jsonl, train.jsonl): it looks like a "
                                                                    "dataset's folder"),
]


@pytest.mark.parametrize("argv,says", [f[1:] for f in FOREIGN], ids=[f[0] for f in FOREIGN])
def test_an_output_dir_holding_what_no_run_wrote_is_refused_before_the_model_loads(user, argv, says):
    argv = argv(user)
    folder = Path(argv[argv.index("--output_dir") + 1])
    entries = sorted(p.name for p in folder.iterdir())
    text = refused(user, *argv)  # the user's files (the model, the run, the data are under user.root) unchanged
    assert says in text and "Choose another output folder" in text and "nothing in it was touched" in text, text
    assert sorted(p.name for p in folder.iterdir()) == entries  # not even the run folder grpo-dual/ was made


def test_an_output_dir_a_run_wrote_is_written_again_and_only_its_files(user, tmp_path):
    from grpo.run.checkpoint.folder import FINAL_MANIFEST, check_final_model_dir, publish_final

    final = tmp_path / "run" / "final"
    final.mkdir(parents=True)
    (final / "model.safetensors").write_bytes(b"full")
    (final / "config.json").write_text("{}")
    out = publish_final(final, tmp_path / "out")
    assert sorted(p.name for p in out.iterdir()) == [FINAL_MANIFEST, "config.json", "model.safetensors"]
    check_final_model_dir(out, out / "grpo-dual", "builtin:tiny")  # every file there is a run's: written again
    (final / "model.safetensors").unlink()  # the next run trains an adapter
    (final / "adapter_model.safetensors").write_bytes(b"adapter")
    publish_final(final, out)
    assert sorted(p.name for p in out.iterdir()) == [FINAL_MANIFEST, "adapter_model.safetensors", "config.json"]
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"holds files no run wrote there \(notes.txt\)"):
        check_final_model_dir(out, out / "grpo-dual", "builtin:tiny")
    (out / "notes.txt").unlink()
    (out / ".config.json.tmp4242").write_text("{")  # a copy a killed final save left: the run's, and cleaned
    check_final_model_dir(out, out / "grpo-dual", "builtin:tiny")
    publish_final(final, out)
    assert not (out / ".config.json.tmp4242").exists()
    (out / FINAL_MANIFEST).unlink()  # an output written before the manifest: its files match the run's final/
    check_final_model_dir(out, tmp_path / "run", "builtin:tiny")


@pytest.mark.slow
def test_a_trl_output_dir_is_trained_into_again_with_overwrite_and_resumed(user):
    argv = ["--config", str(user.config), *SMALL, "--save_strategy", "steps", "--save_steps", "1"]
    assert cli_output(argv)[0] == 0
    first = (user.out / "model.safetensors").read_bytes()
    code, text = cli_output([*argv, "--overwrite", "--seed", "5"])
    assert code == 0, text
    assert (user.out / "model.safetensors").read_bytes() != first  # another seed: another model, written there
    assert (user.out / "model.safetensors").read_bytes() == (user.out / "grpo-dual" / "final" /
                                                              "model.safetensors").read_bytes()
    code, text = cli_output([*argv, "--seed", "5", "--resume", "auto"])  # resumed from the finished run's checkpoint
    assert code == 0, text


# ------------------------------------------------------------------ 5. the memory tool cannot say FITS wrongly
def memory_tool(*argv: str) -> tuple[int, str]:
    """(exit status, stderr + stdout) of `grpo-check-gpu-memory argv`, in this process."""
    import contextlib
    import io

    from grpo.run.assembly.gpu_memory_check import check_gpu_memory

    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = check_gpu_memory(list(argv))
        except SystemExit as e:  # argparse's error: exit 2 with its message
            code = e.code
    return code, err.getvalue() + out.getvalue()


@pytest.mark.parametrize("gib", ["0", "-5", "nan", "1e400", "inf", "abc"])
def test_a_gpu_memory_that_is_no_cards_is_refused(gib):
    code, text = memory_tool("--estimate", "--gpu-mem", gib)
    assert code == 2 and "argument --gpu-mem:" in text and "FITS" not in text and "Traceback" not in text, text


def test_a_small_gpu_memory_is_estimated_against_and_not_taken_as_unset():
    code, text = memory_tool("--estimate", "--preset", "llama3-8b-dual", "--gpu-mem", "1")  # the smallest card taken
    assert code == 0 and "on 1 GiB (--gpu-mem)" in text and "DOES NOT FIT on a 1.0 GiB GPU" in text, text


@pytest.mark.parametrize("content,says", [("garbage{", "is not JSON (Expecting value"),
                                          ('{"hidden_size": "wide", "num_hidden_layers": 2}', "lacks"),
                                          ("[1, 2]", "is not a JSON object")])
def test_a_garbage_config_json_is_named_with_its_file(tmp_path, content, says):
    (tmp_path / "config.json").write_text(content)
    code, text = memory_tool("--estimate", "--set", f"model.name={tmp_path}")
    assert code == 2 and says in text and "Traceback" not in text, text
    assert f"{tmp_path / 'config.json'}" in text or f"config.json of '{tmp_path}'" in text, text


def test_a_trl_config_is_estimated_as_the_trainer_runs_it(user):
    """The tool reads `--config trl.yaml` and TRL's flags as the trainer does: the same estimate inputs as the
    config the trainer prints for the same command line."""
    from grpo import config as C
    from grpo.run.assembly.gpu_memory_check import estimated_config
    from grpo.run.assembly.memory_inputs import inputs_from_config

    argv = ["--config", str(user.config), *SMALL, "--per_device_train_batch_size", "8", "--use_peft"]
    code, text = cli_output([*argv, "--print-config"])
    assert code == 0, text
    trained = C.from_dict(json.loads(text[text.index("{"):]))
    code, text = memory_tool("--estimate", *argv, "--gpu", "l4-24")
    assert code == 0 and "ESTIMATE for builtin:tiny on l4-24" in text and "LoRA r=16" in text, text
    assert "micro-batch 8 seqs" in text and "8 new tokens" in text, text
    theirs = {"per_device_train_batch_size": "8", "use_peft": True}
    estimated = estimated_config(None, str(user.config), theirs, SMALL_OVERRIDES)
    assert inputs_from_config(estimated) == inputs_from_config(trained)


SMALL_OVERRIDES = [f"{SMALL[i][2:]}={SMALL[i + 1]}" for i in range(0, len(SMALL), 2)]


# ------------------------------------------------------------------ 6. a disk preflight
def _free(monkeypatch, free_bytes: int) -> None:
    """A file system with `free_bytes` free, as shutil.disk_usage reports it to the disk check."""
    import collections

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr("grpo.run.assembly.disk_plan.shutil.disk_usage", lambda path: usage(10**12, 10**12 - free_bytes,
                                                                                     free_bytes))


def test_a_run_whose_writes_do_not_fit_is_refused_before_the_model_loads_with_the_numbers(user, monkeypatch):
    _free(monkeypatch, 3 * 10**6)
    text = refused(user, "--save_strategy", "steps", "--save_steps", "1")
    assert "not enough disk space: this run will write about " in text and "that file system has 3.0 MB free" in text
    assert "final model " in text and "checkpoints (" in text and "choose another --output_dir" in text, text
    assert not user.out.exists()


def test_a_thin_margin_is_a_warning_and_the_plan_is_in_the_banner(user, monkeypatch):
    from grpo.run.assembly.disk_plan import DiskPlan, check_disk

    _free(monkeypatch, 40 * 10**6)
    line = check_disk(DiskPlan({"final model": 30e6}, {user.out: 30e6}), resume=False)
    assert "30.0 MB under" in line and "(40.0 MB free: warning, a thin margin" in line, line
    _free(monkeypatch, 10**12)
    code, text = cli_output(["--config", str(user.config), *SMALL])
    assert code == 0 and "disk: this run writes about " in text and "a thin margin" not in text, text


@pytest.mark.slow
def test_the_plan_is_an_upper_bound_of_what_a_run_writes_and_counts_the_model_without_loading_it(user):
    """The parameter count from the shape is the loaded model's; a run with checkpoints every step, evaluations and
    its output_dir copy writes less than planned (and not far less: the plan's parts are the run's)."""
    from grpo import config as C
    from grpo.models.modeling import load_policy
    from grpo.run.assembly.disk_plan import _counts, plan_writes

    argv = ["--config", str(user.config), *SMALL, "--save_strategy", "steps", "--save_steps", "1", "--eval_strategy",
            "steps", "--eval_steps", "1", "--save_total_limit", "2", "--max_steps", "3"]
    folder = _model_folder(user.root)  # a model folder: its config.json gives the count, exact
    from_folder = C.ModelConfig(name=str(folder))
    assert _counts(from_folder)[0] == sum(p.numel() for p in load_policy(from_folder, seed=0).model.parameters())
    code, text = cli_output([*argv, "--print-config"])
    cfg = C.from_dict(json.loads(text[text.index("{"):]))  # builtin:tiny: counted at its vocabulary's cap
    code, text = cli_output(argv)
    assert code == 0, text
    written = sum(p.stat().st_size for p in user.out.rglob("*") if p.is_file())
    planned = plan_writes(cfg, {"math": []}, user.out / "grpo-dual", "cpu").total()
    assert written <= planned <= 4 * written, (written, planned)


def _tmpfs(folder: Path, size: str):
    """A tmpfs of `size` mounted on `folder` (root only), or a skip."""
    import subprocess

    folder.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True
                      ).returncode:
        pytest.skip("mounting a tmpfs needs root and a kernel that allows it")
    return folder


@pytest.mark.slow
def test_on_a_small_file_system_the_demo_is_refused_before_it_trains(tmp_path):
    import subprocess

    small = _tmpfs(tmp_path / "small", "3m")
    try:
        code, text = cli_output(["--max-steps", "20", "--output-dir", str(small), "--run-name", "demo"])
        assert code == 2 and "not enough disk space" in text and "that file system has 3.1 MB free" in text, text
        assert "precision:" not in text and not (small / "demo").exists()
    finally:
        subprocess.run(["umount", str(small)], check=False)


# ------------------------------------------------------------------ 7. an end that saves what matters first
def _full(*args, **kwargs):
    raise OSError(28, "No space left on device")


def _loadable(folder: Path) -> None:
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(folder).num_parameters() > 0


@pytest.mark.slow
def test_optional_writes_that_fail_at_the_end_do_not_stop_the_final_model(user, monkeypatch):
    monkeypatch.setattr("grpo.run.checkpoint.pareto.ParetoFrontier.offer", _full)  # the final model's Pareto point
    monkeypatch.setattr("grpo.run.doctor.plot_run", _full)
    code, text = cli_output(["--config", str(user.config), *SMALL])
    assert code == 0 and "Traceback" not in text, text
    assert "warning: could not write the Pareto point of step 2: [Errno 28] No space left on device" in text, text
    assert "warning: could not write plot.png" in text, text
    _loadable(user.out / "grpo-dual" / "final")
    _loadable(user.out)  # TRL's output_dir
    assert (user.out / "grpo-dual" / "report.json").is_file()


@pytest.mark.slow
def test_a_final_save_that_fails_names_the_last_checkpoint_and_resume_auto_writes_it(user, monkeypatch):
    argv = ["--config", str(user.config), *SMALL, "--save_strategy", "steps", "--save_steps", "1"]
    with monkeypatch.context() as patched:
        # the disk fills as the final model is written
        patched.setattr("grpo.run.checkpoint.save_resume.save_model_folder", _full)
        code, text = cli_output(argv)
    run_dir = user.out / "grpo-dual"
    assert code == 1 and "Traceback" not in text, text
    # the user's own command (tests/test_resume_line.py)
    assert (f"could not write the final model {run_dir / 'final'}: No space left on device. The last complete "
            f"checkpoint is {run_dir / 'checkpoints' / 'step_000002'}: free space, then resume with:\n  python "
            f"grpo_train.py --config {user.config} " in text), text
    assert "--resume auto\n(the run is finished there: it writes the final model without training again)" in text, text
    assert not (run_dir / "final").exists() and not list(run_dir.glob(".tmp-final-*"))  # no torn copy left
    rows = (run_dir / "metrics.jsonl").read_text()
    code, text = cli_output([*argv, "--resume", "auto"])
    assert code == 0, text
    assert (run_dir / "metrics.jsonl").read_text() == rows  # nothing trained again
    _loadable(run_dir / "final")
    _loadable(user.out)


@pytest.mark.slow
def test_a_final_checkpoint_that_fails_still_saves_the_final_model_and_names_the_last_checkpoint(user, monkeypatch):
    from grpo.run.checkpoint import files as ckpt

    write_folder = ckpt._write_folder

    def full_at_the_end(tmp, final, files, meta):  # the tensors are written, the rest does not fit
        if meta["step"] == 3:
            assert (tmp / ckpt.TENSORS).is_file()
            _full()
        return write_folder(tmp, final, files, meta)

    monkeypatch.setattr(ckpt, "_write_folder", full_at_the_end)
    code, text = cli_output(["--config", str(user.config), *SMALL, "--max_steps", "3", "--save_strategy", "steps",
                             "--save_steps", "2"])
    run_dir = user.out / "grpo-dual"
    assert code == 0 and "warning: the final checkpoint could not be written" in text, text
    assert (f"The last complete checkpoint is {run_dir / 'checkpoints' / 'step_000002'}: free space, then resume "
            "with:\n  python grpo_train.py --config " in text), text
    assert "--resume auto\n(it trains on from there)" in text, text
    assert not list((run_dir / "checkpoints").glob(".tmp-*"))  # the partial copy's space went back
    _loadable(run_dir / "final")


def test_a_rule_between_a_flag_and_a_value_from_the_file_names_the_flag_and_nothing_else():
    from grpo import config as C
    from grpo.config.command_line import blamed

    clash = C.field_error("rollout.max_trajectory_tokens", 8, "use 0 (no budget) or at least max_new_tokens=100")
    err = blamed(clash, ["rollout.max_new_tokens=100"], {})
    assert err.field == "rollout.max_new_tokens" and "set rollout.max_trajectory_tokens too" in str(err), err
    other = C.field_error("rollout.top_p", 2.0, "a rule that mentions top_k=3")  # `k=` inside top_k: not rollout.k
    assert blamed(other, ["rollout.k=8"], {}) is other
    assert blamed(clash, ["rollout.max_trajectory_tokens=8"], {}) is clash  # the flag's own field: as it is
