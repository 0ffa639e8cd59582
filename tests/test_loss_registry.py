"""One registration per loss: `register_policy_loss` in grpo/core/losses.py holds a loss's name, function,
ratio, hyper-parameters with their defaults, rules and docs; the config check, --help, the update and TRL's loss_type
read it there. A loss registered here, in the test, and nowhere else validates, is listed in --help and trains."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import torch

import grpo_train
from grpo import config as C
from grpo.core.losses import POLICY_LOSSES, above, register_policy_loss
from grpo.run.assembly.config_check import check_config, check_loss_params
from grpo.run.trl.translation import translate
from tests.trainer_helpers import TINY_CLI, cli_output

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: a tiny model gains nothing from threads

NAME = "test_scaled"


@pytest.fixture
def scaled_loss():
    """The one place the test loss exists: GRPO's unclipped token surrogate times `scale`, reporting `scale`."""

    @register_policy_loss(NAME, ratio="token", doc="GRPO's unclipped token loss times a scale (a test's loss)",
                          params={"scale": ("what the token loss is multiplied by", above(0))},
                          metrics=("loss/test_scale", "loss/test_ratio_mean"))
    def loss_fn(logps_BT, old_logps_BT, advantages_B, mask_BT, scale: float = 2.0):
        ratio_BT = torch.exp(logps_BT - old_logps_BT.detach())
        loss_BT = -scale * ratio_BT * advantages_B.unsqueeze(-1).to(logps_BT.dtype) * mask_BT
        ratio_mean = (ratio_BT.detach() * mask_BT).sum() / mask_BT.sum()
        return loss_BT, {"loss/test_scale": torch.tensor(scale), "loss/test_ratio_mean": ratio_mean}

    yield loss_fn
    POLICY_LOSSES.unregister(NAME)


def test_a_loss_registered_in_one_place_validates(scaled_loss):
    cfg = check_config(C.load_config("demo", [f"loss.policy_loss={NAME}", "loss.params.scale=3"]))
    assert cfg.loss.params == {"scale": 3.0}
    check_config(C.load_config("demo", [f"loss.policy_loss={NAME}"]))  # the default from the signature
    with pytest.raises(C.ConfigError) as err:
        check_config(C.load_config("demo", [f"loss.policy_loss={NAME}", "loss.params.scale=0"]))
    assert err.value.field == "loss.params.scale" and "must be > 0" in str(err.value)
    with pytest.raises(C.ConfigError) as err:  # its parameter under another loss
        check_config(C.load_config("demo", ["loss.params.scale=3"]))
    assert err.value.field == "loss.params.scale" and f"it is {NAME}'s" in str(err.value)


def test_a_loss_registered_in_one_place_is_listed_in_help(scaled_loss, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # a line each, as the assertions read them (the help wraps to the terminal)
    std = io.StringIO()
    with contextlib.redirect_stdout(std), pytest.raises(SystemExit) as done:
        grpo_train.cli(["--help-all"])
    assert done.value.code == 0
    text = std.getvalue()
    assert f"  {NAME} (token ratio): GRPO's unclipped token loss times a scale (a test's loss)" in text
    assert "    --loss.params.scale (float, default 2.0, > 0): what the token loss is multiplied by" in text
    for name, spec in POLICY_LOSSES.items():  # every loss, with each of its own parameters
        assert f"  {name} ({spec.ratio} ratio): " in text
        assert all(f"--loss.params.{p.name} (" in text for p in spec.params)


def test_a_loss_registered_in_one_place_trains(scaled_loss, tmp_path):
    """One RL step of two update passes (loss.mu 2) with the test loss: its parameter from the command line reaches
    its function, and its metrics are logged, averaged over both passes as the loss registered them (the first pass
    is on-policy, ratio exactly 1: that pass's value alone would be 1.0)."""
    varied = [f"--rewards.{task}=tests.trainer_helpers:length_reward:1.0" for task in ("fairness", "hallucination")]
    code, out = cli_output(TINY_CLI + varied + ["--rollout.max_new_tokens", "8", "--output-dir", str(tmp_path),
                                                "--run-name", "r", "--loss.policy_loss", NAME,
                                                "--loss.params.scale", "3", "--loss.mu", "2"])
    assert code == 0, out
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    step = [r for r in rows if "loss/test_scale" in r]
    assert step and step[-1]["loss/test_scale"] == 3.0 and step[-1]["health/skipped"] == 0.0
    assert step[-1]["adv/std"] > 0 and step[-1]["loss/test_ratio_mean"] != 1.0


def test_a_wrong_parameter_is_refused_naming_the_field_and_the_valid_ones():
    code, out = cli_output(["--loss.policy_loss", "sapo", "--loss.params.sapo_temperatur_pos", "1.1"])
    assert code == 2
    assert "config field `loss.params.sapo_temperatur_pos` = 1.1 is invalid" in out
    assert "did you mean `loss.params.sapo_temperature_pos`?" in out
    assert "its parameters: loss.params.sapo_temperature_pos, loss.params.sapo_temperature_neg" in out
    with pytest.raises(C.ConfigError) as err:  # a clipped loss: its parameters are the loss section's clip fields
        check_config(C.load_config("demo", ["loss.params.cispo_max_ratio=5"]))
    assert err.value.field == "loss.params.cispo_max_ratio"
    assert "it is cispo's" in str(err.value) and "loss.clip_low, loss.clip_high, loss.dual_clip" in str(err.value)
    with pytest.raises(C.ConfigError) as err:
        check_config(C.load_config("demo", ["loss.policy_loss=vespo", "loss.params.vespo_lambda_neg=-0.5"]))
    assert err.value.field == "loss.params.vespo_lambda_neg" and "must be >= 0 (default 2.0)" in str(err.value)


def test_the_spelling_before_loss_params_names_the_new_one():
    """`loss.cispo_max_ratio`, a loss section field in configs written before the registry, is refused naming where
    it went."""
    code, out = cli_output(["--loss.policy_loss", "cispo", "--loss.cispo_max_ratio", "3"])
    assert code == 2 and "did you mean `loss.params.cispo_max_ratio`?" in out
    with pytest.raises(C.ConfigError) as err:
        C.from_dict({"loss": {"policy_loss": "cispo", "cispo_max_ratio": 3.0}})
    assert err.value.field == "loss.cispo_max_ratio" and "`loss.params.cispo_max_ratio`" in str(err.value)
    with pytest.raises(C.ConfigError) as err:  # a typo of a field still gets the field
        C.load_config("demo", ["loss.clip_hihg=0.3"])
    assert "did you mean `loss.clip_high`?" in str(err.value) and "params" not in str(err.value).split(":")[0]


@pytest.mark.parametrize("spelling",
                         [["--loss.params.cispo_max_ratio", "3"], ["--set", "loss.params.cispo_max_ratio=3"],
                                      ["--loss.params", "cispo_max_ratio=3"], ["--loss.params=cispo_max_ratio=3"]])
def test_every_spelling_of_a_loss_parameter(spelling, tmp_path):
    code, out = cli_output(["--loss.policy_loss", "cispo", *spelling, "--print-config"])
    assert code == 0, out
    assert json.loads(out[out.index("{"):])["loss"]["params"] == {"cispo_max_ratio": 3.0}


def test_a_config_file_and_config_json_carry_loss_params(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("preset: demo\nloss:\n  policy_loss: vespo\n  params:\n    vespo_k_pos: 1.5\n")
    code, out = cli_output(["--config", str(path), "--print-config"])
    assert code == 0, out
    tree = json.loads(out[out.index("{"):])
    assert tree["loss"]["params"] == {"vespo_k_pos": 1.5}
    assert C.from_dict(tree).loss.params == {"vespo_k_pos": 1.5}  # config.json round trip


def test_trl_loss_parameters_go_to_loss_params_under_their_loss_type():
    sapo = translate({"loss_type": "sapo", "sapo_temperature_pos": 2.0})
    assert sapo.tree["loss"]["params"] == {"sapo_temperature_pos": 2.0, "sapo_temperature_neg": 1.05}
    check_loss_params(C.from_dict(C.config_tree("custom", [], sapo.tree)).loss)
    cispo = translate({"loss_type": "cispo", "epsilon_high": 4.0})
    assert cispo.tree["loss"]["params"] == {"cispo_max_ratio": 4.0}
    check_loss_params(C.from_dict(C.config_tree("custom", [], cispo.tree)).loss)
    dapo = translate({"loss_type": "dapo", "vespo_k_pos": 1.0})  # TRL reads it only under vespo: a note
    assert "params" not in dapo.tree["loss"]
    assert any("vespo_k_pos" in note and "loss_type vespo" in note for note in dapo.notes)
    check_loss_params(C.from_dict(C.config_tree("custom", [], dapo.tree)).loss)


def test_registration_refuses_what_the_registry_could_not_describe():
    def loss_fn(logps_BT, old_logps_BT, advantages_B, mask_BT, scale: float = 1.0):
        return logps_BT, {}

    with pytest.raises(ValueError, match=r"undescribed \['scale'\]"):  # a parameter without doc and rule
        register_policy_loss("test_bad", ratio="token", doc="x")(loss_fn)
    with pytest.raises(ValueError, match="not taken"):
        register_policy_loss("test_bad", ratio="token", doc="x", params={"scale": ("s", above(0)),
                                                                          "shift": ("t", above(0))})(loss_fn)
    with pytest.raises(ValueError, match=r"without a float default \['scale'\]"):  # loss.params holds floats
        register_policy_loss("test_bad", ratio="token", doc="x", params={"scale": ("s", above(0))})(
            lambda logps_BT, old_logps_BT, advantages_B, mask_BT, scale=1: (logps_BT, {}))
    with pytest.raises(ValueError, match="registered already"):
        register_policy_loss("grpo", ratio="token", doc="x", params={"scale": ("s", above(0))})(loss_fn)
    with pytest.raises(ValueError, match="ratio 'tokens'"):
        register_policy_loss("test_bad", ratio="tokens", doc="x", params={"scale": ("s", above(0))})(loss_fn)
    assert "test_bad" not in POLICY_LOSSES


def test_a_checkpoint_from_before_the_registry_resumes():
    """A config.json written when the loss parameters were loss section fields (loss.cispo_max_ratio ...) is the
    same config as this checkout's with those values left to their registered defaults; a changed value is still a
    change."""
    from grpo.run.checkpoint.files import config_differences
    from grpo.run.checkpoint.save_resume import config_defaults

    cfg = C.load_config("demo", ["loss.policy_loss=cispo"])
    saved = C.to_dict(cfg)
    del saved["loss"]["params"]
    saved["loss"].update(cispo_max_ratio=5.0, sapo_temperature_pos=1.0, sapo_temperature_neg=1.05, vespo_k_pos=2.0,
                         vespo_lambda_pos=3.0, vespo_k_neg=3.0, vespo_lambda_neg=2.0)
    assert config_differences(saved, C.to_dict(cfg), config_defaults(cfg)) == []
    now = C.load_config("demo", ["loss.policy_loss=cispo", "loss.params.cispo_max_ratio=4"])
    assert config_differences(saved, C.to_dict(now), config_defaults(now)) == [
        "loss.params.cispo_max_ratio: checkpoint 5.0 vs now 4.0"]
