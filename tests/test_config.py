"""Config: presets, overrides, validation messages that name the field and the fix, the CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from grpo import config as C
from grpo.config.command_line import split_argv
from grpo.config.presets import PRESETS
from grpo.core.losses import POLICY_LOSSES
from grpo.run.assembly.config_check import check_config

ROOT = Path(__file__).resolve().parents[1]


def test_presets_load_and_derive():
    cfg = C.load_config("llama3-8b-dual")
    assert cfg.model.lora and cfg.model.lora_r == 8 and cfg.model.lora_alpha == 16
    assert cfg.model.lora_target_modules == C.LLAMA_LORA_TARGETS and cfg.model.gradient_checkpointing
    assert (cfg.rollout.k, cfg.rollout.max_new_tokens, cfg.rollout.temperature, cfg.rollout.top_k,
            cfg.rollout.top_p) == (4, 96, 0.5, 30, 0.85)
    assert cfg.train.prompts_per_micro_step == 2 and cfg.train.grad_accum == 2
    assert cfg.seqs_per_step == 2 * 4 * 2 and cfg.micro_batch_seqs == 8 and cfg.prompts_per_step == 4
    assert cfg.kl_for("fairness").beta == 0.10 and cfg.kl_for("hallucination").beta == 0.30
    assert (cfg.kl_for("hallucination").band_low, cfg.kl_for("hallucination").band_high) == (0.08, 0.15)
    for name in PRESETS:
        C.load_config(name)


def test_overrides_parse_types():
    cfg = C.load_config("demo", ["rollout.k=8", "loss.dual_clip=3", "model.lora=yes",
                                 "model.lora_target_modules=q_proj,v_proj", "kl.fairness.beta=0.2"])
    assert cfg.rollout.k == 8 and cfg.loss.dual_clip == 3.0 and cfg.model.lora is True
    assert cfg.model.lora_target_modules == ["q_proj", "v_proj"] and cfg.kl_for("fairness").beta == 0.2
    assert cfg.kl_for("other_task") == cfg.kl["default"]


def test_argv_forms():
    overrides, rest = split_argv(["--rollout.k", "8", "--set", "loss.mu=2", "--model", "x",
                                  "--judge.base-url=http://h/v1", "--set", "seed=3", "--print-config"])
    assert overrides == ["rollout.k=8", "loss.mu=2", "model.name=x", "judge.base-url=http://h/v1", "train.seed=3"]
    assert rest == ["--print-config"]
    cfg = C.load_config("demo", overrides)
    assert cfg.model.name == "x" and cfg.judge.base_url == "http://h/v1" and cfg.loss.mu == 2 and cfg.train.seed == 3


@pytest.mark.parametrize("override,needle", [
    ("rollout.k=1", "rollout.k"),
    ("rollout.kk=3", "rollout.kk"),
    ("loss.policy_loss=ppo", str(sorted(POLICY_LOSSES))),  # every registered loss, listed
    ("loss.agg_mode=mean", "loss.agg_mode"),
    ("rollout.top_p=0", "rollout.top_p"),
    ("train.lr=abc", "train.lr"),
    ("model.load_in_4bit=true", "model.lora=true"),
    ("kl.default.band_low=0.7", "kl.default.band_low"),
    ("multi.combine=mgda", "multi.combine"),
    ("judge.base_url=localhost:8000", "judge.base_url"),
    ("nosection.x=1", "nosection"),
])
def test_bad_values_are_rejected_with_the_field_named(override, needle):
    with pytest.raises(C.ConfigError) as err:
        check_config(C.load_config("demo", [override]))
    assert needle in str(err.value)


def test_unknown_preset():
    with pytest.raises(C.ConfigError, match="unknown preset"):
        C.load_config("nope")


def test_config_json_round_trip():
    cfg = C.load_config("llama3-8b-dual", ["rollout.k=6"])
    again = C.from_dict(C.to_dict(cfg))
    assert again == cfg


def _cli(*args):
    return subprocess.run([sys.executable, "grpo_train.py", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_cli_help_print_config_and_errors():
    out = _cli("--help-all")
    assert out.returncode == 0
    for field in ("--rollout.k", "--loss.policy_loss", "--kl.<task>.band_high", "--judge.base_url",
                  "--multi.combine", "--checkpoint.resume", "--sft.max_examples"):
        assert field in out.stdout
    out = _cli("--preset", "llama3-8b-dual", "--rollout.k", "8", "--print-config")
    assert out.returncode == 0 and '"k": 8' in out.stdout and "Meta-Llama-3-8B-Instruct" in out.stdout
    out = _cli("--rollout.temperature", "-1", "--print-config")
    assert out.returncode == 2 and "rollout.temperature" in out.stderr and "Traceback" not in out.stderr


def test_a_band_controller_with_up_1_is_refused_at_the_command_line_naming_the_field(capsys):
    """Regression: config allowed kl.<task>.up >= 1 while BandKL demands up > 1, so `up=1` passed the config check
    and failed later in grpo/core/kl_control.py with a bare ValueError. The rule lives once, in the controller."""
    import grpo_train

    assert grpo_train.cli(["--set", "kl.default.up=1", "--print-config"]) == 2  # demo: band controller
    err = capsys.readouterr().err
    assert "kl.default.up" in err and "> 1" in err and "Traceback" not in err


def test_every_registry_name_is_accepted_and_nothing_else():
    """The config accepts exactly the names each registry holds (grpo/run/assembly/config_check.py REGISTRY_FIELDS)."""
    import dataclasses

    from grpo.core.kl_control import KL_CONTROLLERS, controller_from_config
    from grpo.run.assembly.config_check import REGISTRY_FIELDS

    for dotted, names in REGISTRY_FIELDS.items():
        section, name = dotted.split(".")
        for value in names:
            if dotted == "rollout.engine" and value == "lean":
                continue  # valid with the default dynamic cache; checked below with it
            fields = {name: value}
            if dotted == "loss.policy_loss" and POLICY_LOSSES[value].agg_mode:  # valid with the aggregation it needs
                fields["agg_mode"] = POLICY_LOSSES[value].agg_mode
            cfg = C.Config(**{section: type(getattr(C.Config(), section))(**fields)})
            assert check_config(cfg) is cfg
        with pytest.raises(C.ConfigError) as err:
            check_config(C.Config(**{section: type(getattr(C.Config(), section))(**{name: "no-such-name"})}))
        assert err.value.field == dotted and all(repr(v) in str(err.value) for v in sorted(names))
    check_config(C.Config(rollout=C.RolloutConfig(engine="lean")))
    for kind in KL_CONTROLLERS:  # every controller the config accepts can be built from a config section
        section = dataclasses.replace(C.TaskKLConfig(), controller=kind)
        check_config(C.Config(kl={"default": section}))
        assert type(controller_from_config(section)) is KL_CONTROLLERS[kind]
