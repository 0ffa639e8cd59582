"""Reliability of inputs: an input that would give a traceback, be accepted and then ignored or mangled, or stop
with a vague message ends in one line naming the setting or file, before the model loads where a check can know.
In-process `grpo_train.cli` runs of the tiny model (tests/test_reliability.py's settings)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo import config as C
from grpo.run.assembly.config_check import check_config
from tests.trainer_helpers import TINY_CLI as TINY
from tests.trainer_helpers import cli_output

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*argv: str) -> tuple[int, str]:
    """(exit status, stderr + stdout) of `grpo_train.py argv` in this process."""
    return cli_output(list(argv))


def refused(out: Path, *argv: str) -> str:
    """The one message of a start refused with exit status 2 before the model loaded (no run folder written)."""
    code, text = run_cli(*TINY, "--train.output_dir", str(out), "--run-name", "r", *argv)
    assert code == 2, text
    assert "Traceback" not in text and "precision:" not in text, text  # "precision: ..." is printed as the model loads
    assert not (out / "r").exists(), sorted(p.name for p in (out / "r").iterdir())
    return text


# -------------------------------------------------------------------------------------- what would give a traceback
@pytest.mark.parametrize("content,suffix", [(bytes(range(256)) * 4, ".yaml"), (b"\xff\xfe{\x00}\x00", ".json"),
                                            ("train:\n  seed: 1\n".encode("utf-16"), ".yaml")])
def test_a_config_file_that_is_not_utf8_text_is_refused_naming_it(tmp_path, content, suffix):
    path = tmp_path / f"binary{suffix}"
    path.write_bytes(content)
    code, text = run_cli("--config", str(path), "--print-config")
    assert code == 2 and "Traceback" not in text, text
    assert str(path) in text and "not a UTF-8 text file" in text, text


def test_a_config_file_with_a_byte_order_mark_is_read(tmp_path):
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"train": {"seed": 7}}).encode())
    code, text = run_cli("--config", str(path), "--print-config")
    assert code == 0, text
    assert json.loads(text)["train"]["seed"] == 7


def test_wandb_project_without_wandb_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError, as when it is not installed
    text = refused(tmp_path, "--train.wandb_project", "my-project")
    assert "train.wandb_project" in text and "pip install wandb" in text, text


def test_the_wandb_tracker_itself_names_the_field_and_the_install(tmp_path, monkeypatch):
    """The tracker, built after the model (grpo/run/tracking.py), raises an error the entry points report (an
    ImportError, one of USER_ERRORS) and not a RuntimeError traceback."""
    from grpo.run.exits import USER_ERRORS
    from grpo.run.tracking import WandbTracker

    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(USER_ERRORS) as err:
        WandbTracker("my-project", tmp_path)
    assert "train.wandb_project" in str(err.value) and "pip install wandb" in str(err.value)


def test_judge_cache_path_naming_a_folder_is_refused_before_the_model_loads(tmp_path):
    folder = tmp_path / "cache_dir"
    folder.mkdir()
    text = refused(tmp_path, "--judge.base_url", "http://127.0.0.1:9/v1", "--judge.cache_path", str(folder))
    assert "judge.cache_path" in text and "folder" in text, text


@pytest.mark.parametrize("kind", ["folder", "not sqlite"])
def test_the_judge_cache_names_a_path_it_cannot_use(tmp_path, kind):
    """Python callers (Judge built directly) get an OSError naming the path and the field, not sqlite3's
    'unable to open database file'."""
    from grpo.grading.judge import JudgeCache

    path = tmp_path / "cache"
    path.mkdir() if kind == "folder" else path.write_text("not a database, " * 100)
    with pytest.raises(OSError) as err:
        JudgeCache(path)
    assert "judge.cache_path" in str(err.value) and str(path) in str(err.value)


def _tiny_model_folder(folder: Path) -> Path:
    from grpo.models.modeling import build_tiny_model, build_tiny_tokenizer

    tok = build_tiny_tokenizer(["the answer is yes", "the answer is no"] * 5, vocab_size=300)
    build_tiny_model(tok, seed=0, hidden=32, layers=1, heads=2, kv_heads=1).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_a_truncated_model_safetensors_is_named_as_damaged(tmp_path):
    from grpo.models.modeling import DamagedWeightsError, load_policy

    folder = _tiny_model_folder(tmp_path / "model")
    weights = folder / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    with pytest.raises(DamagedWeightsError) as err:
        load_policy(C.ModelConfig(name=str(folder)))
    assert str(weights) in str(err.value) and "damaged or incomplete" in str(err.value)
    code, text = run_cli(*TINY, "--train.output_dir", str(tmp_path / "runs"), "--run-name", "r",
                         "--model.name", str(folder))
    assert code == 2 and "Traceback" not in text, text
    assert "model.safetensors" in text and "damaged or incomplete" in text, text


def test_an_intact_model_folder_still_loads(tmp_path):
    from grpo.models.modeling import load_policy

    folder = _tiny_model_folder(tmp_path / "model")
    assert load_policy(C.ModelConfig(name=str(folder))).model is not None


# ------------------------------------------------------------------------------- accepted, then ignored or mangled
@pytest.mark.parametrize("field,value", [
    ("data.max_document_chars", "-5"),
    ("rollout.presence_penalty", "-1e300"),
    ("rollout.frequency_penalty", "1e300"),
    ("rollout.repetition_penalty", "1e-300"),
    ("rollout.temperature", "1e-300"),
])
def test_a_value_that_breaks_sampling_or_the_data_is_refused_naming_it(field, value):
    code, text = run_cli(f"--{field}", value, "--print-config")
    assert code == 2 and f"config field `{field}`" in text, text


@pytest.mark.parametrize("name", ["a\nb", "run\t1", "bell\x07", "nul\x00x", "esc\x1b[31m", "a/b"])
def test_a_run_name_with_a_control_character_or_separator_is_refused(name):
    with pytest.raises(C.ConfigError) as err:
        C.load_config("demo", [f"train.run_name={name}"])
    assert err.value.field == "train.run_name"


@pytest.mark.parametrize("template", ["{row.__class__}", "{row[0]}", "Q: {q.__init__.__globals__}", "{q!r}",
                                      "{q:>10}", "{q:{q.__class__}}", "{0}", "{}"])
def test_a_template_that_reaches_into_objects_is_refused_at_config_load(template):
    with pytest.raises(C.ConfigError) as err:
        C.load_config("custom", ["tasks.qa.path=qa.jsonl", f"tasks.qa.template={template}"])
    assert err.value.field == "tasks.qa.template"
    assert "placeholder" in str(err.value), str(err.value)


def test_templates_are_filled_by_plain_substitution_only():
    from grpo.config.templates import TemplateError, fill, placeholders
    from grpo.data.row_fields import TemplateFieldError, fill_template

    row = {"q": "What is 2+2?", "n": 3, "items": [1, 2]}
    assert fill_template("Q: {q} ({n}) {items} {{literal}}", row, "t") == "Q: What is 2+2? (3) [1, 2] {literal}"
    for template in ("{q.__class__}", "{items[0]}", "{q!r}", "{n:>5}"):
        with pytest.raises(TemplateFieldError) as err:  # a configuration error, never a skipped row
            fill_template(template, row, "tasks.qa.template")
        assert "tasks.qa.template" in str(err.value) and template in str(err.value), str(err.value)
    assert placeholders("{a} and {b} and {a}", "t") == ["a", "b", "a"]
    with pytest.raises(TemplateError):
        fill("{a", {"a": 1}, "t")


def test_a_custom_task_template_with_attribute_access_stops_the_data_load(tmp_path):
    """A TaskSourceConfig built in Python skips the config's check until the data load, which refuses it too."""
    from grpo.data.sources import load_source_samples

    rows = tmp_path / "qa.jsonl"
    rows.write_text("".join(json.dumps({"q": f"question {i}", "id": str(i)}) + "\n" for i in range(4)))
    source = C.TaskSourceConfig(path=str(rows), template="{q.__class__.__name__}")
    with pytest.raises(ValueError) as err:
        load_source_samples("qa", source)
    assert "template" in str(err.value) and "{q.__class__.__name__}" in str(err.value), str(err.value)


def test_a_rubric_with_attribute_access_is_refused_when_loaded(tmp_path):
    from grpo.grading.rubrics import load_rubric

    (tmp_path / "qa.txt").write_text("# rubric: qa 1\nGrade {response} against {gold.__class__}.\n")
    with pytest.raises(ValueError) as err:
        load_rubric("qa", tmp_path)
    assert "{gold.__class__}" in str(err.value), str(err.value)


# ------------------------------------------------------------------------------------- named, not vaguely refused
def test_a_seed_above_numpy_and_torch_range_from_a_config_file_is_refused(tmp_path):
    path = tmp_path / "seed.json"
    path.write_text(json.dumps({"train": {"seed": 2**70}}))
    code, text = run_cli("--config", str(path), "--print-config")
    assert code == 2 and "config field `train.seed`" in text and str(C.MAX_SEED) in text, text


@pytest.mark.parametrize("seed", [str(2**64), "9" * 400, str(2**32)])  # 2**32: past numpy's seeds
def test_a_huge_seed_on_the_command_line_is_refused_naming_train_seed(seed):
    code, text = run_cli("--train.seed", seed, "--print-config")
    assert code == 2 and "config field `train.seed`" in text, text


def test_the_largest_accepted_seed_seeds_every_generator():
    from grpo.run.assembly.process import seed_everything

    assert C.load_config("demo", [f"train.seed={C.MAX_SEED}"]).train.seed == C.MAX_SEED
    seed_everything(C.MAX_SEED)  # numpy's np.random.seed refuses MAX_SEED + 1


@pytest.mark.parametrize("argv,field", [
    (["--sft.lr", "1e300"], "sft.lr"),
    (["--train.lr", "1e300"], "train.lr"),
    (["--train.lr", "2"], "train.lr"),
    (["--kl.default.controller", "fixed", "--kl.default.beta", "1e300"], "kl.default.beta"),
    (["--kl.fairness.beta", "1e300"], "kl.fairness.beta"),
    (["--loss.entropy_coef", "1e300"], "loss.entropy_coef"),
    (["--train.weight_decay", "1e300"], "train.weight_decay"),
])
def test_a_coefficient_that_can_only_make_nan_weights_is_refused_naming_it(argv, field):
    code, text = run_cli(*argv, "--print-config")
    assert code == 2 and f"config field `{field}`" in text, text


@pytest.mark.parametrize("overrides", [
    ["train.lr=1", "sft.lr=1", "loss.entropy_coef=1000", "kl.default.beta=0.5", "train.weight_decay=0.99"],
    ["rollout.temperature=1e-20", "rollout.repetition_penalty=1e-4", "rollout.presence_penalty=-10000",
     "rollout.frequency_penalty=10000", "data.max_document_chars=0", f"train.seed={2**32 - 1}"],
])
def test_values_at_the_bounds_are_accepted(overrides):
    check_config(C.load_config("demo", overrides))


# ----------------------------------------------------------------------- the bounds protect what they say they do
def test_the_logit_bound_is_the_samplers_replacement_for_inf():
    from grpo.decoding.decode import NEGINF_LOGIT, POSINF_LOGIT

    assert POSINF_LOGIT == C.LOGIT_BOUND == -NEGINF_LOGIT == C.MAX_LOGIT_PENALTY


def test_sampling_at_every_bound_at_once_stays_finite_and_1e300_did_not():
    """Logits at ±LOGIT_BOUND through the sampler's own processors at the most extreme accepted settings, a million
    completion tokens counted: finite, and a valid distribution; values past the config's bounds (1e-300, -1e300)
    are not."""
    from grpo.decoding.decode import CompletionPenaltyProcessor, sampling_processors

    V, P, N = 16, 2, 64
    # half the tokens repeated
    ids_BL = torch.cat([torch.zeros(1, P, dtype=torch.long), torch.arange(N).remainder(V // 2)[None]], dim=1)
    logits_BV = torch.linspace(-C.LOGIT_BOUND, C.LOGIT_BOUND, V)[None].float()

    def scores(temperature, repetition, presence, frequency, tokens=1e6):
        out = logits_BV.clone()
        penalties = CompletionPenaltyProcessor(P, presence, frequency * tokens / N)  # as if each repeat counted 1e6/N
        section = C.RolloutConfig(top_k=0, top_p=1.0, min_p=0.0, min_new_tokens=0)
        # set after construction, past its checks: the values the config refuses are probed here too
        section.temperature, section.repetition_penalty = temperature, repetition
        for proc in sampling_processors(section, do_sample=True, prompt_len=P, mask_BP=torch.ones(1, P), stop_ids=[0],
                                        extra=[penalties]):
            out = proc(ids_BL, out)
        return out

    for repetition in (1 / C.MAX_REPETITION_PENALTY, C.MAX_REPETITION_PENALTY):
        for sign in (1, -1):
            out = scores(C.MIN_TEMPERATURE, repetition, sign * C.MAX_LOGIT_PENALTY, sign * C.MAX_LOGIT_PENALTY)
            assert torch.isfinite(out).all(), (repetition, sign, out)
            assert torch.isfinite(torch.softmax(out, dim=-1)).all()
    assert not torch.isfinite(scores(1e-300, 1.0, 0.0, 0.0)).all()  # 1e-300 is 0 in fp32: logits / 0
    assert torch.isnan(scores(1.0, 1.0, -1e300, 0.0)).any()  # -1e300 is -inf in fp32; -inf x 0 (unwritten) NaN


def test_log_probs_and_their_gradient_stay_finite_at_the_smallest_temperature():
    from grpo.core.kernels import token_logprobs

    logits_BTV = (torch.linspace(-C.LOGIT_BOUND, C.LOGIT_BOUND, 8).repeat(1, 3, 1)).requires_grad_()
    logps_BT = token_logprobs(logits_BTV, torch.tensor([[0, 3, 7]]), temperature=C.MIN_TEMPERATURE)
    logps_BT.sum().backward()
    assert torch.isfinite(logps_BT).all() and torch.isfinite(logits_BTV.grad).all()


def test_a_rollout_of_the_tiny_model_at_every_sampling_bound_runs():
    from grpo.core.step_types import Sample
    from grpo.models.modeling import build_tiny_model, build_tiny_tokenizer
    from grpo.phases.generate import SamplingPlan, generate_rollouts

    tok = build_tiny_tokenizer(["the answer is yes", "the answer is no"] * 5, vocab_size=300)
    model = build_tiny_model(tok, seed=0, hidden=32, layers=1, heads=2, kv_heads=1)
    samples = [Sample(id="a", task="t", messages=({"role": "user", "content": "the answer is"},), gold={})]
    rollout = C.RolloutConfig(k=2, max_new_tokens=6, temperature=C.MIN_TEMPERATURE,
                              repetition_penalty=1 / C.MAX_REPETITION_PENALTY,
                              presence_penalty=-C.MAX_LOGIT_PENALTY, frequency_penalty=-C.MAX_LOGIT_PENALTY)
    rollouts, metrics = generate_rollouts(model, tok, samples, rollout, plan=SamplingPlan(generator_seed=0))
    assert len(rollouts) == 2 and metrics["rollout/nonfinite_logit_rows"] == 0


def test_an_adamw_step_at_the_bounds_keeps_the_weights_finite():
    from grpo.phases.update import adamw

    weight = torch.nn.Parameter(torch.full((4,), 0.05))
    optimizer = adamw([weight], lr=C.MAX_LR, weight_decay=0.99)
    weight.grad = torch.full((4,), 1e30)
    optimizer.step()
    assert torch.isfinite(weight).all() and weight.abs().max() < 2


# ------------------------------------------------------------------------------------------- HOME and the caches
def _a_file(tmp_path: Path) -> Path:
    """A plain file: a cache "under" it cannot be made, whoever runs the test (root ignores read-only folders)."""
    path = tmp_path / "not_a_folder"
    path.write_text("")
    return path


def _catalog_model() -> str:
    from grpo.models.pretrained import CATALOG, locate_source

    name = sorted(CATALOG)[0]
    try:
        locate_source(name, CATALOG[name])
    except ValueError:
        pytest.skip(f"the package of the packaged model {name} is not installed")
    return name


def test_an_unwritable_model_cache_is_refused_before_the_data_naming_the_variable(tmp_path, monkeypatch):
    from grpo.models.pretrained import CACHE_ENV, check_model_name

    name = _catalog_model()
    monkeypatch.setenv(CACHE_ENV, str(_a_file(tmp_path)))
    with pytest.raises(C.ConfigError) as err:
        check_model_name(name)
    assert err.value.field == "model.name" and CACHE_ENV in str(err.value), str(err.value)
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("HOME", str(_a_file(tmp_path)))
    with pytest.raises(C.ConfigError) as err:
        check_model_name(name)
    assert CACHE_ENV in str(err.value) and "HOME=" in str(err.value), str(err.value)


def test_no_home_folder_names_the_cache_variable(monkeypatch):
    import pwd

    from grpo.models.pretrained import CACHE_ENV, ModelCacheError, cache_root

    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: (_ for _ in ()).throw(KeyError(uid)))  # no passwd entry
    with pytest.raises(ModelCacheError) as err:
        cache_root()
    assert CACHE_ENV in str(err.value) and "HOME" in str(err.value)


def test_an_unusable_hugging_face_cache_names_hf_home(tmp_path):
    """A hub id with HF_HOME under a plain file (as a read-only or missing HOME leaves it): one line naming HF_HOME,
    not "NotADirectoryError: .../token". A subprocess: huggingface_hub reads HF_HOME once, at import."""
    env = {**os.environ, "HF_HOME": str(_a_file(tmp_path) / "hf"), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "grpo_train.py"), *TINY, "--train.output_dir",
                           str(tmp_path / "runs"), "--run-name", "r", "--model.name", "someone/some-model"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "HF_HOME" in proc.stderr and "Hugging Face cache" in proc.stderr, proc.stderr


def test_a_csv_task_under_an_unusable_datasets_cache_names_the_variable(tmp_path, monkeypatch):
    """datasets writes every CSV it reads into its cache ($HF_HOME/datasets, by default under HOME): a HOME that is
    missing or read-only named that cache and HF_HOME, not "PermissionError: '/sys/.cache'"."""
    import datasets

    from grpo.data.sources import load_source_samples

    rows = tmp_path / "rows.csv"
    rows.write_text("prompt,answer\n" + "".join(f"question {i},{i}\n" for i in range(6)))
    home = _a_file(tmp_path)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", home / ".cache" / "huggingface" / "datasets")
    with pytest.raises(ValueError) as err:
        load_source_samples("t", C.TaskSourceConfig(path=str(rows)))
    text = str(err.value)
    assert "datasets cache" in text and "HF_HOME" in text and "$HOME" in text and str(rows) in text, text


@pytest.mark.parametrize("where", ["inside", "the folder", "a parent"])
def test_cache_error_names_a_file_error_on_the_cache_or_its_parents(tmp_path, monkeypatch, where):
    from grpo.core.plumbing import cache_error

    cache = tmp_path / "home" / ".cache" / "huggingface"
    path = {"inside": cache / "token", "the folder": cache, "a parent": tmp_path / "home"}[where]
    monkeypatch.setenv("HF_HOME", str(cache))
    text = cache_error(FileNotFoundError(2, "No such file or directory", str(path)), cache, "the cache")
    assert text is not None and str(cache) in text and "$HF_HOME" in text and "set HF_HOME" in text, text
    assert cache_error(FileNotFoundError(2, "No such file", str(tmp_path / "data.csv")), cache, "the cache") is None
    assert cache_error(FileNotFoundError(2, "No such file", "/"), cache, "the cache") is None
