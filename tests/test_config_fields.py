"""Every config check names the field at fault: one bad value per check, and meta-tests that every check in the code
(the `_check` / `_one_of` call sites of every grpo/config module, the registry fields of
grpo/run/assembly/config_check.py, every rule of the KL controllers) has its row here. A new check without a row fails
`test_every_*`."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import math
import re
import sys
import typing
from pathlib import Path
from typing import Any

import pytest

import grpo.config
from grpo import config as C
from grpo.config import checks
from grpo.core.kl_control import CONFIG_FIELDS, NOT_CONFIGURED, RULES, controller_args, controller_problem
from grpo.core.losses import AGG_MODES, POLICY_LOSSES
from grpo.run.assembly.config_check import REGISTRY_FIELDS, check_config

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = Path(grpo.config.__file__).parent
BAND, ADAPTIVE, FIXED = ({"kl.default.controller": kind} for kind in ("band", "adaptive", "fixed"))
CISPO, SAPO = ({"loss.policy_loss": name} for name in ("cispo", "sapo"))


def breaking(rule) -> float:
    """A value a registered loss parameter's Rule refuses: the first of a few candidates, the bound itself first."""
    candidates = (0.0, -1.0, 1.0, -1e6, 1e6)
    value = next((v for v in candidates if not rule.holds(v)), None)
    assert value is not None, f"no value of {candidates} breaks the rule {rule.says!r}: add one that does"
    return value


def chosen(name: str) -> dict[str, Any]:
    """The overrides that choose the registered loss `name`: itself, and the aggregation it needs if any."""
    spec = POLICY_LOSSES[name]
    return {"loss.policy_loss": name, **({"loss.agg_mode": spec.agg_mode} if spec.agg_mode else {})}


LOSS_ROWS: list[tuple[str, Any, dict[str, Any]]] = [
    *((f"loss.params.{p.name}", breaking(p.rule), chosen(name))
      for name, spec in POLICY_LOSSES.items() for p in spec.params),
    *(("loss.agg_mode", next(m for m in AGG_MODES if m != spec.agg_mode), chosen(name))
      for name, spec in POLICY_LOSSES.items() if spec.agg_mode)]
"""Read from the loss registry (grpo/core/losses.py POLICY_LOSSES), so a loss registered there needs no row here: each
loss's own parameters, each at a value its rule refuses, under that loss; another aggregation than the one a loss
needs."""

SECRET = "sk-proj-Abc123SECRETvalue0987654321xyz"
"""What a pasted API key looks like (not a real one)."""

BAD: list[tuple[str, Any, dict[str, Any]]] = [
    # (dotted field, a bad value, other overrides it needs) -- on top of the demo preset
    ("model.dtype", "float8", {}),
    ("model.attn_implementation", "flash3", {}),
    ("model.lora_r", 0, {}),
    ("model.shared_prompt_forward", "yes", {}),
    ("model.lora_dropout", 1.0, {}),
    ("model.load_in_4bit", True, {}),
    ("model.lora_target_modules", [], {"model.lora": True}),
    ("model.tiny_hidden", 0, {}),
    ("model.tiny_hidden", 130, {}),  # not divisible by tiny_heads
    ("model.tiny_layers", 0, {}),
    ("model.tiny_heads", 0, {}),
    ("model.tiny_vocab", 0, {}),
    ("model.tiny_vocab", 1, {}),  # below the tokenizer's 256 bytes + 6 specials
    ("model.tiny_vocab", C.TINY_MIN_VOCAB - 1, {}),
    ("model.lora_alpha", -16, {}),
    ("model.lora_alpha", 0, {}),
    ("data.task_mix", "fairness=1", {}),
    ("data.heldout_fraction", 1.0, {}),
    ("data.bbq_ambiguous_share", 1.0, {}),
    ("data.bbq_per_category", 0, {}),
    ("data.halueval_per_subset", 0, {}),
    ("data.demo_size", 0, {}),
    ("data.eval_size", 0, {}),
    ("data.max_prompt_tokens", 0, {}),
    ("data.prompt_format", "raw", {}),
    ("rollout.k", 1, {}),
    ("rollout.max_new_tokens", 0, {}),
    ("rollout.min_new_tokens", 200, {}),
    ("rollout.temperature", 0.0, {}),
    ("rollout.top_k", -1, {}),
    ("rollout.top_p", 0.0, {}),
    ("rollout.min_p", 1.0, {}),
    ("rollout.repetition_penalty", 0.0, {}),
    ("rollout.sampling_rng", "thread", {}),
    ("rollout.fold_lora", "yes", {}),
    ("rollout.engine", "graph", {"rollout.cache_implementation": "static"}),
    ("rollout.engine", "lean", {"rollout.cache_implementation": "static"}),
    ("rollout.engine", "vllm", {}),
    ("rollout.cache_implementation", "paged", {}),
    ("rollout.overlong_buffer", 6, {}),  # above the demo's max_new_tokens = 5
    ("rollout.overlong_penalty_factor", 0.0, {}),
    ("rollout.tools", ["m:f", "m:f"], {}),
    ("rollout.max_tool_turns", 0, {}),
    ("rollout.tool_timeout_s", 0.0, {}),
    ("rollout.max_tool_result_tokens", 0, {}),
    ("rollout.max_trajectory_tokens", 2, {}),  # below the demo's max_new_tokens = 5
    ("loss.policy_loss", "ppo", {}),
    ("loss.agg_mode", "mean", {}),
    ("loss.kl_estimator", "k4", {}),
    ("loss.adv_scale", "z", {}),
    ("loss.reward_aggregation", "max", {}),
    ("loss.clip_low", 0.0, {}),
    ("loss.clip_high", 0.0, {}),
    ("loss.dual_clip", 1.0, {}),
    ("loss.mu", 0, {}),
    ("loss.entropy_coef", -0.1, {}),
    ("loss.adv_clip", 0.0, {}),
    ("loss.adv_clip", -1.0, {}),
    ("loss.top_entropy_quantile", 0.0, {}),
    ("loss.multi_objective_aggregation", "gdpo", {}),
    ("loss.entropy_target", 0.0, {}),
    ("loss.entropy_coef_delta", 0.0, {}),
    ("loss.entropy_coef_min", 0.5, {"loss.entropy_target": 0.2}),  # above entropy_coef = 0
    # loss.params as config_check reads it, whichever the loss (each loss's own rules: LOSS_ROWS)
    ("loss.params.cispo_max_ratio", 5.0, {}),  # cispo's, not grpo's
    ("loss.params.sapo_temperatur_pos", 1.0, SAPO),  # a typo
    ("loss.params.clip_low", 0.1, {}),  # loss.clip_low itself
    ("loss.params.cispo_max_ratio", math.inf, CISPO),
    ("loss.params", "cispo_max_ratio", CISPO),  # not name=value
    ("train.max_steps", 0, {}),
    ("train.prompts_per_micro_step", 0, {}),
    ("train.grad_accum", 0, {}),
    ("train.max_consecutive_bad", 0, {}),
    ("train.log_every", 0, {}),
    ("train.lr", 0.0, {}),
    ("train.weight_decay", -5.0, {}),
    ("train.seed", -1, {}),
    ("train.run_name", "../escape", {}),
    ("train.run_name", "a/b", {}),
    ("train.run_name", "/tmp/abs", {}),
    ("train.run_name", "..", {}),
    ("train.run_name", "a\\b", {}),
    ("train.lr", "abc", {}),  # not a number
    ("train.max_grad_norm", 0.0, {}),
    ("train.skip_grad_norm", 0.0, {}),
    ("train.reward_timeout_s", 0.0, {}),
    ("train.warmup_steps", -1, {}),
    ("train.warmup_ratio", 1.0, {}),
    ("train.warmup_ratio", 0.1, {"train.warmup_steps": 5}),  # both given
    ("train.num_epochs", -1.0, {}),
    ("train.lr_scheduler", "polynomial", {}),
    ("train.micro_batch_size", -1, {}),
    ("train.eval_every", -1, {}),
    ("train.sample_every", -1, {}),
    ("train.dynamic_sampling_max_rounds", -1, {}),
    ("train.pass_at_k", -1, {}),
    ("train.pass_at_k_samples", 4, {"train.pass_at_k": 8}),
    ("train.dynamic_sampling_keep_kl", True, {}),  # without train.dynamic_sampling
    ("train.device", "tpu", {}),
    ("train.threads", -1, {}),
    ("train.sharding", "zero3", {}),
    ("train.doctor", "panic", {}),
    ("train.doctor", "restore", {"train.eval_every": 0}),  # no Pareto point to restore during RL
    ("train.tensorboard", "maybe", {}),  # not a boolean
    ("sft.steps", -1, {}),
    ("sft.max_examples", -1, {}),
    ("sft.max_target_tokens", -1, {}),
    ("sft.lr", 0.0, {}),
    ("sft.batch_size", 0, {}),
    ("judge.timeout_s", 0.0, {}),
    ("judge.rate_limit_per_s", 0.0, {}),
    ("judge.rate_limit_per_s", 1e-9, {"judge.base_url": "http://127.0.0.1:9/v1"}),  # a step would wait 1e11 s
    ("judge.max_retries", -1, {}),
    ("judge.num_workers", 0, {}),
    ("judge.base_url", "localhost:8000", {}),
    ("judge.fallback_base_url", "ftp://host", {}),
    ("judge.kind", "gemini", {}),
    ("judge.api_key_env", SECRET, {}),
    ("judge.max_fallback_share", 1.5, {}),
    ("judge.max_fallback_share", -0.1, {}),
    ("multi.combine", "mgda", {}),
    ("multi.switch", "never", {}),
    ("multi.cagrad_c", 1.0, {}),
    ("multi.patience", 0, {}),
    ("multi.release", 0, {}),
    ("multi.pareto_cap", 0, {}),
    ("checkpoint.every", -1, {}),
    ("checkpoint.keep_last", -1, {}),
    ("checkpoint.keep_best", True, {"train.eval_every": 0}),  # no evaluation during RL to keep the best of
    ("train.best_metric", "loss", {}),
    ("train.best_metric", "reward/", {}),
    ("train.early_stopping_patience", -1, {}),
    ("train.early_stopping_patience", 3, {"train.eval_every": 0}),  # no evaluation to count
    ("train.early_stopping_threshold", -0.1, {}),
    ("checkpoint.accept_changes", True, {}),  # without checkpoint.resume
    ("train.overwrite", True, {"checkpoint.resume": "auto"}),
    ("kl", {"fairness": C.TaskKLConfig()}, {}),  # no `default` entry
    ("rewards.fairness", "  ", {}),
    # your own tasks (tasks.<task>) and reward models (reward_models.<name>), checked under their own names
    ("data.source", "none", {}),  # and no tasks.<task>: nothing to train
    ("tasks.qa.path", "", {"tasks.qa.path": "a.csv"}),
    ("tasks.qa.data_files", ["a.csv"], {"tasks.qa.path": "a.csv"}),
    ("tasks.qa.split", " ", {"tasks.qa.path": "a.csv"}),
    ("tasks.qa.prompt_field", "", {"tasks.qa.path": "a.csv"}),
    ("tasks.qa.messages_field", "", {"tasks.qa.path": "a.csv"}),
    ("tasks.qa.target_field", "", {"tasks.qa.path": "a.csv"}),
    ("tasks.qa.id_field", "", {"tasks.qa.path": "a.csv"}),
    ("tasks.qa.limit", -1, {"tasks.qa.path": "a.csv"}),
    ("tasks.qa.template", "{}", {"tasks.qa.path": "a.csv"}),
    ("tasks.qa.template", "{a", {"tasks.qa.path": "a.csv"}),
    ("reward_models.rm.path", "", {"reward_models.rm.path": "rm"}),
    ("reward_models.rm.max_length", 0, {"reward_models.rm.path": "rm"}),
    ("reward_models.rm.batch_size", 0, {"reward_models.rm.path": "rm"}),
    ("reward_models.rm.label", -1, {"reward_models.rm.path": "rm"}),
    ("reward_models.rm.shift", float("inf"), {"reward_models.rm.path": "rm"}),
    ("reward_models.rm.scale", 0.0, {"reward_models.rm.path": "rm"}),
    ("reward_models.rm.normalize", "tanh", {"reward_models.rm.path": "rm"}),
    ("reward_models.rm.dtype", "int8", {"reward_models.rm.path": "rm"}),
    ("kl.default.controller", "pid", {}),
    # the KL controllers' rules (grpo/core/kl_control.py RULES), under the controller that has them
    ("kl.default.beta", 0.0, BAND),
    ("kl.default.band_high", 0.0, BAND),
    ("kl.default.beta_min", 0.0, BAND),
    ("kl.default.beta_max", 0.0, BAND),
    ("kl.default.window", 0, BAND),
    ("kl.default.band_low", -0.1, BAND),
    ("kl.default.up", 1.0, BAND),
    ("kl.default.down", 1.0, BAND),
    ("kl.default.beta_min", 0.6, BAND),  # above beta_max = 0.5
    ("kl.default.beta", 0.9, BAND),  # outside [beta_min, beta_max]
    ("kl.default.window", 2.5, BAND),  # not a whole number of updates
    ("kl.default.beta", 0.0, ADAPTIVE),
    ("kl.default.target", 0.0, ADAPTIVE),
    ("kl.default.horizon", 0, ADAPTIVE),
    ("kl.default.beta", -1.0, FIXED),
]

# Bounds that keep sampling, the losses and the weights finite (grpo/config/checks.py MIN_TEMPERATURE ... MAX_SEED),
# and a template filled by plain substitution only (grpo/config/templates.py): each passes its type check, and would
# be mangled or overflow downstream if accepted
BOUNDS: list[tuple[str, Any, dict[str, Any]]] = [
    ("data.max_document_chars", -5, {}),
    ("rollout.temperature", 1e-300, {}),
    ("rollout.repetition_penalty", 1e-300, {}),
    ("rollout.repetition_penalty", 1e300, {}),
    ("rollout.presence_penalty", -1e300, {}),
    ("rollout.frequency_penalty", 1e5, {}),
    ("loss.entropy_coef", 1e300, {}),
    ("train.lr", 1e300, {}),
    ("train.weight_decay", 1e300, {}),  # 1 - lr x weight_decay < 0: every weight flipped each step
    ("train.seed", 2**70, {}),
    ("train.seed", C.MAX_SEED + 1, {}),  # numpy's np.random.seed refuses it
    ("train.run_name", "a\nb", {}),
    ("train.run_name", "tab\there", {}),
    ("sft.lr", 1e300, {}),
    ("kl.default.beta", 1e300, FIXED),
    ("kl.default.beta_max", 1e300, FIXED),
    ("kl.fairness.beta", 1e300, {}),
    ("tasks.qa.template", "{row.__class__}", {"tasks.qa.path": "a.csv"}),
    ("tasks.qa.template", "{row[0]}", {"tasks.qa.path": "a.csv"}),
    ("tasks.qa.template", "{a!r}", {"tasks.qa.path": "a.csv"}),
    ("tasks.qa.template", "{a:{b.__class__}}", {"tasks.qa.path": "a.csv"}),
]
BAD += BOUNDS
BAD += LOSS_ROWS


def float_fields() -> list[str]:
    """Every float field (plain or optional) of every section, kl.<task> under `kl.default` (loss.params' values:
    their own row)."""
    out = []
    for section, cls in typing.get_type_hints(C.Config).items():
        cls = C.TaskKLConfig if section == "kl" else cls
        if dataclasses.is_dataclass(cls):
            where = "kl.default" if section == "kl" else section
            out += [f"{where}.{name}" for name, hint in typing.get_type_hints(cls).items()
                    if hint is float or (float in typing.get_args(hint) and typing.get_origin(hint) is not dict)]
    return out


# inf and nan are refused for every float field, whichever way they come in (building._finite), also for the KL fields
# the task's controller does not read (the fixed controller ignores target / band_high / up / beta_max)
NON_FINITE = [(name, (math.inf, -math.inf, math.nan)[i % 3], FIXED if name.startswith("kl.") else {})
              for i, name in enumerate(float_fields())]
BAD += NON_FINITE
def build(dotted: str, value: Any, extra: dict[str, Any]) -> C.Config:
    """The demo config with `extra` and then `dotted = value`, checked as an entry point checks it."""
    if "." not in dotted:  # a whole Config field (the kl table): the dataclass itself
        return check_config(dataclasses.replace(C.load_config("demo"), **{dotted: value}))
    d = C.to_dict(C.load_config("demo", [f"{k}={v}" for k, v in extra.items()]))
    *path, last = dotted.split(".")
    node = d
    for part in path:
        node = node.setdefault(part, {})
    node[last] = value
    return check_config(C.from_dict(d))


@pytest.mark.parametrize("dotted,value,extra", BAD, ids=[f"{f}={v!r}" for f, v, _ in BAD])
def test_a_bad_value_is_reported_under_its_own_field(dotted, value, extra):
    with pytest.raises(C.ConfigError) as err:
        build(dotted, value, extra)
    assert err.value.field == dotted, str(err.value)
    assert str(err.value).startswith(f"config field `{dotted}` = "), str(err.value)


def test_every_check_in_config_py_has_a_row(monkeypatch):
    """Every `_check` / `_one_of` call site of the config layer (sections.py and its parts, building.py: every
    grpo/config module that calls them) runs while the rows are built, and every field name a
    check reports has a row."""
    modules = [importlib.import_module("grpo.config" if path.stem == "__init__" else f"grpo.config.{path.stem}")
               for path in sorted(CONFIG_DIR.glob("*.py")) if re.search(r"\b_(check|one_of)\(", path.read_text())]
    assert {"checks", "input_sections", "algorithm_sections", "sections", "building"} <= {m.__name__.split(".")[-1]
                                                                           for m in modules}
    sites: set[tuple[str, int]] = set()  # (file name, line)
    for module in modules:
        path = Path(module.__file__)
        tree = ast.parse(path.read_text())
        inner = {n.lineno for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "_one_of"
                 for n in ast.walk(f) if isinstance(n, ast.Call)}
        sites |= {(path.name, n.lineno) for n in ast.walk(tree) if isinstance(n, ast.Call)
                  and isinstance(n.func, ast.Name) and n.func.id in ("_check", "_one_of") and n.lineno not in inner}
    assert len(sites) > 40
    seen: dict[tuple[str, int], set[str]] = {}
    real = checks._check

    def recording(ok, name, value, fix):
        caller = sys._getframe(1)
        if caller.f_code.co_name == "_one_of":
            caller = caller.f_back
        seen.setdefault((Path(caller.f_code.co_filename).name, caller.f_lineno), set()).add(name)
        return real(ok, name, value, fix)

    for module in modules:  # each module calls the _check of its own globals
        monkeypatch.setattr(module, "_check", recording)
    for dotted, value, extra in BAD:
        try:
            build(dotted, value, extra)
        except C.ConfigError:
            pass
    assert not sites - set(seen), f"config checks at (file, line) {sorted(sites - set(seen))} never ran: add rows"
    fields = {f for f, _, _ in BAD}
    unlisted = {name for names in seen.values() for name in names} - fields
    assert not unlisted, f"fields checked in grpo/config/ without a row: {sorted(unlisted)}"


def test_every_registry_field_has_a_row():
    fields = {f for f, _, _ in BAD}
    assert set(REGISTRY_FIELDS) | {"kl.default.controller"} <= fields


def test_every_loss_parameter_takes_its_default_and_has_a_row_its_rule_refuses():
    """Each registered loss's own parameters (grpo/core/losses.py register_policy_loss), set to their registered
    default under their loss, pass the config check; each has a row under that loss whose value its rule refuses
    (test_a_bad_value_is_reported_under_its_own_field runs the rows)."""
    every = {(f"loss.params.{p.name}", name) for name, spec in POLICY_LOSSES.items() for p in spec.params}
    assert len(every) >= 7  # cispo 1, sapo 2, vespo 4: the registry is read, not an empty list
    for dotted, name in every:
        assert build(dotted, POLICY_LOSSES[name].param(dotted.split(".")[-1]).default, chosen(name))
    rows = {(dotted, extra["loss.policy_loss"]) for dotted, value, extra in BAD if dotted.startswith("loss.params.")
            and extra.get("loss.policy_loss") in POLICY_LOSSES and (spec := POLICY_LOSSES[extra["loss.policy_loss"]])
            and (param := spec.param(dotted.split(".")[-1])) and not param.rule.holds(value)}
    assert every <= rows, f"loss parameters without a row: {sorted(every - rows)}"


def test_every_controller_rule_has_a_row():
    """Each rule of each KL controller on an argument the config sets is the one a row breaks."""
    broken = set()
    for dotted, value, extra in BAD:
        # refused before any controller rule (building._finite, bounds)
        if (dotted, value, extra) in NON_FINITE + BOUNDS:
            continue
        if dotted.startswith("kl.default.") and dotted != "kl.default.controller":
            section = dataclasses.replace(C.TaskKLConfig(), **C.to_dict(C.load_config("demo"))["kl"]["default"])
            section = dataclasses.replace(section, controller=extra["kl.default.controller"],
                                          **{dotted.split(".")[-1]: value})
            kind, kwargs = controller_args(section)
            argument, fix = controller_problem(kind, **kwargs)
            broken.add((kind, argument, fix))
    every = {(kind, argument, fix) for kind, rules in RULES.items() for argument, _, fix in rules
             if argument not in NOT_CONFIGURED}
    assert not every - broken, f"controller rules without a row: {sorted(every - broken)}"
    assert set(CONFIG_FIELDS.values()) <= {f.name for f in dataclasses.fields(C.TaskKLConfig)}


def test_the_rows_start_from_a_valid_config():
    """The meta-tests are not vacuous: without the bad value every row's config passes every check."""
    for _, _, extra in BAD:
        if "rollout.cache_implementation" not in extra:  # that row's extra is only valid with its engine value
            check_config(C.load_config("demo", [f"{k}={v}" for k, v in extra.items()]))


def test_tiny_min_vocab_is_what_the_builtin_tokenizer_needs():
    """C.TINY_MIN_VOCAB (stdlib-only settings cannot import the tokenizer) is the size the tokenizer takes when asked
    for fewer tokens, and exactly that size is accepted."""
    from grpo.models.modeling import build_tiny_tokenizer

    assert len(build_tiny_tokenizer(vocab_size=1)) == C.TINY_MIN_VOCAB
    assert C.load_config("demo", [f"model.tiny_vocab={C.TINY_MIN_VOCAB}"]).model.tiny_vocab == C.TINY_MIN_VOCAB



@pytest.mark.parametrize("value", [SECRET, "sk_live_abcdef", "AIzaSyD3xAmPlEkEy0000111122223333444",
                                   "my key", "Bearer abc.def"])
def test_a_key_pasted_into_api_key_env_is_refused_without_being_printed(value):
    with pytest.raises(C.ConfigError) as err:
        C.load_config("demo", [f"judge.api_key_env={value}"])
    assert err.value.field == "judge.api_key_env"
    assert value not in str(err.value) and "sk-" not in str(err.value), str(err.value)


@pytest.mark.parametrize("value", ["", "OPENAI_API_KEY", "GRPO_TEST_JUDGE_KEY", "my_judge_key"])
def test_variable_names_are_accepted_in_api_key_env(value):
    assert C.load_config("demo", [f"judge.api_key_env={value}"]).judge.api_key_env == value


@pytest.mark.parametrize("name", ["run-1", "demo-20260101", "a.b", "..x"])
def test_plain_run_names_are_accepted(name):
    assert C.load_config("demo", [f"train.run_name={name}"]).train.run_name == name
