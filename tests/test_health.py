"""grpo.health: each post-hoc check fires on crafted metrics and stays quiet on healthy ones; the step guard."""

import math

import pytest
import torch

from grpo.health import (Finding, HealthThresholds, TrainingUnstable, WeightGuard, check, grad_norm_ok,
                         verdict)

BANDS = {"fairness": (0.01, 0.08)}
STEPS = 30


def healthy(steps: int = STEPS) -> list[dict]:
    """A run with every metric well inside the default thresholds."""
    rows = []
    for s in range(steps):
        row = {
            "step": s, "phase": "rl",
            "reward/fairness/mean": 0.4 + 0.01 * s,
            "kl/fairness": 0.04,
            "beta/fairness": 0.04,
            "entropy/fairness": 1.0,
            "rollout/fairness/truncated": 0.05,
            "adv/frac_zero_std": 0.2,
            "judge/calls": 32.0,
            "judge/failures": 0.0,
            "health/grad_norm": 0.9,
            "health/skipped": 0.0,
            "health/restored": 0.0,
        }
        if s % 10 == 0 or s == steps - 1:
            row["eval/fairness/reward"] = 0.5 + 0.005 * s
        rows.append(row)
    return rows


def codes(findings: list[Finding]) -> dict[str, str]:
    return {f.code: f.level for f in findings}


def set_last(rows: list[dict], key: str, value: float, n: int) -> list[dict]:
    for row in rows[-n:]:
        row[key] = value
    return rows


def test_healthy_run_has_no_findings_and_is_green():
    findings = check(healthy(), HealthThresholds(), BANDS)
    assert findings == []
    assert verdict(findings) == ("green", ["all health checks passed"])


def test_kl_above_band_for_patience_steps_is_flagged_and_one_less_is_not():
    th = HealthThresholds(kl_band_patience=20)
    rows = set_last(healthy(), "kl/fairness", 0.12, 20)
    found = [f for f in check(rows, th, BANDS) if f.code == "kl_out_of_band"]
    assert len(found) == 1 and found[0].level == "yellow"
    assert "above" in found[0].message and "20 steps from step 10" in found[0].message
    rows = set_last(healthy(), "kl/fairness", 0.12, 19)
    assert "kl_out_of_band" not in codes(check(rows, th, BANDS))
    # no band for the task -> no KL check at all
    assert "kl_out_of_band" not in codes(check(set_last(healthy(), "kl/fairness", 0.12, 30), th, None))


def test_kl_below_band_counts_only_consecutive_steps():
    rows = healthy()
    for row in rows[:25]:
        row["kl/fairness"] = 0.001
    rows[12]["kl/fairness"] = 0.04  # one step back in the band breaks the run: 12 + 12 < 20 each
    assert "kl_out_of_band" not in codes(check(rows, HealthThresholds(), BANDS))
    rows[12]["kl/fairness"] = 0.001
    found = [f for f in check(rows, HealthThresholds(), BANDS) if f.code == "kl_out_of_band"]
    assert "below" in found[0].message and "25 steps" in found[0].message


def test_entropy_below_floor_is_red_and_a_large_drop_is_yellow():
    # last 10 steps at 0.03 nats < floor 0.05
    assert codes(check(set_last(healthy(), "entropy/fairness", 0.03, 10), HealthThresholds(), BANDS)) == {
        "entropy_collapse": "red"}
    # 1.0 -> 0.15 is an 85% drop > 80%
    assert codes(check(set_last(healthy(), "entropy/fairness", 0.15, 10), HealthThresholds(), BANDS)) == {
        "entropy_drop": "yellow"}
    # 1.0 -> 0.3 is a 70% drop: fine
    assert check(set_last(healthy(), "entropy/fairness", 0.3, 10), HealthThresholds(), BANDS) == []


def test_truncation_zero_std_and_judge_failure_rates():
    th = HealthThresholds()
    assert codes(check(set_last(healthy(), "rollout/fairness/truncated", 0.3, 10), th, BANDS)) == {
        "truncation": "yellow"}
    assert codes(check(set_last(healthy(), "adv/frac_zero_std", 0.6, 10), th, BANDS)) == {"zero_std_groups": "yellow"}
    # 2 failures of 32 calls per step = 6.25% > 5%; 1 of 32 = 3.1% is fine
    assert codes(check(set_last(healthy(), "judge/failures", 2.0, 10), th, BANDS)) == {"judge_failures": "yellow"}
    assert check(set_last(healthy(), "judge/failures", 1.0, 10), th, BANDS) == []


def test_skipped_steps_red_and_a_single_restore_yellow():
    rows = healthy()
    for s in (3, 9, 15, 21):  # 4 of 30 = 13% > 10%
        rows[s]["health/skipped"] = 1.0
    assert codes(check(rows, HealthThresholds(), BANDS)) == {"skipped_steps": "red"}
    rows = healthy()
    rows[5]["health/skipped"] = 1.0  # 1 of 30 = 3%: fine
    assert check(rows, HealthThresholds(), BANDS) == []
    rows[7]["health/restored"] = 1.0
    assert codes(check(rows, HealthThresholds(), BANDS)) == {"restored_weights": "yellow"}


def test_non_finite_metric_is_red_and_names_key_and_step():
    rows = healthy()
    rows[7]["loss/total"] = math.nan
    found = check(rows, HealthThresholds(), BANDS)
    assert codes(found) == {"non_finite": "red"}
    assert "loss/total (step 7)" in found[0].message


def test_reward_not_improving_from_eval_json_and_from_history():
    th = HealthThresholds()
    evals = {"before_sft": {"fairness": 0.3}, "after_sft": {"fairness": 0.5}, "after_rl": {"fairness": 0.4}}
    assert codes(check(healthy(), th, BANDS, evals)) == {"reward_regressed": "red"}  # 0.4 - 0.5 = -0.1 < -0.05
    evals["after_rl"]["fairness"] = 0.5
    assert codes(check(healthy(), th, BANDS, evals)) == {"reward_flat": "yellow"}
    evals["after_rl"]["fairness"] = 0.52
    assert check(healthy(), th, BANDS, evals) == []
    # without eval.json: first vs last eval/<task>/reward in the history
    rows = healthy()
    rows[-1]["eval/fairness/reward"] = rows[0]["eval/fairness/reward"] - 0.02
    assert codes(check(rows, th, BANDS)) == {"reward_flat": "yellow"}


def test_verdict_levels_and_order():
    y = Finding("yellow", "truncation", "t", "s")
    r = Finding("red", "non_finite", "n", "s")
    assert verdict([y]) == ("yellow", ["[yellow] truncation: t"])
    assert verdict([y, r]) == ("red", ["[red] non_finite: n", "[yellow] truncation: t"])


def test_grad_norm_ok():
    assert grad_norm_ok(float("inf"), 10.0)[0] is False
    ok, reason = grad_norm_ok(float("nan"), None)
    assert ok is False and "nan" in reason
    ok, reason = grad_norm_ok(5.0, 2.0)
    assert ok is False and "max_norm_skip" in reason
    assert grad_norm_ok(torch.tensor(1.5), 2.0) == (True, "")
    assert grad_norm_ok(1e6, None) == (True, "")


def test_weight_guard_restores_after_nan_in_place():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    guard = WeightGuard(model.parameters(), max_consecutive=3)
    good = model.weight.detach().clone()
    ptr = model.weight.data_ptr()
    with torch.no_grad():
        model.weight[0, 1] = math.nan
    assert guard.all_finite() is False
    assert guard.restore_if_bad() is True
    assert torch.equal(model.weight, good) and model.weight.data_ptr() == ptr  # optimizer keeps its reference
    assert guard.all_finite() is True
    metrics = guard.record(restored=True, reason="non-finite weights")
    assert metrics == {"health/skipped": 0.0, "health/restored": 1.0, "health/skipped_total": 0.0,
                       "health/restored_total": 1.0, "health/consecutive_bad": 1.0}


def test_weight_guard_snapshot_follows_good_steps():
    model = torch.nn.Linear(2, 1, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    guard = WeightGuard(model.parameters())
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 2.0]]))
    guard.snapshot()
    model(torch.tensor([[1.0, 1.0]])).sum().backward()  # grad = [1, 1]
    opt.step()  # w = [1, 2] - 0.5 * [1, 1] = [0.5, 1.5]
    assert guard.restore_if_bad() is False  # finite: the new weights become the snapshot
    with torch.no_grad():
        model.weight.fill_(math.inf)
    guard.restore_if_bad()
    assert model.weight.tolist() == [[0.5, 1.5]]


def test_weight_guard_raises_after_k_consecutive_bad_steps_and_good_step_resets():
    guard = WeightGuard([torch.nn.Parameter(torch.zeros(2))], max_consecutive=3)
    guard.record(skipped=True)
    guard.record(skipped=True)
    assert guard.record()["health/consecutive_bad"] == 0.0  # a good step resets the streak
    guard.record(skipped=True)
    guard.record(restored=True)
    with pytest.raises(TrainingUnstable, match="3 consecutive bad optimizer steps") as err:
        guard.record(skipped=True, reason="gradient norm is nan")
    assert "learning rate" in str(err.value) and "max_grad_norm" in str(err.value) and "β" in str(err.value)
    assert guard.state_dict() == {"skipped_total": 4, "restored_total": 1, "consecutive_bad": 3}


def test_weight_guard_rejects_no_trainable_params():
    with pytest.raises(ValueError, match="no trainable parameters"):
        WeightGuard([torch.zeros(2)])


def test_weight_guard_auto_keeps_a_full_model_copy_off_the_gpu():
    from grpo.health import ON_DEVICE_SNAPSHOT_BYTES, snapshot_device

    gpu = torch.device("cuda", 0)
    assert snapshot_device(ON_DEVICE_SNAPSHOT_BYTES, gpu) == gpu  # a LoRA adapter stays on the GPU
    assert snapshot_device(988 * 2**20, gpu) == "cpu"  # Qwen2.5-0.5B full fine-tuning (bf16) goes to pinned CPU
    assert snapshot_device(10 * 2**30, torch.device("cpu")) == torch.device("cpu")


def test_weight_guard_restores_from_a_cpu_snapshot_in_place():
    """The snapshot on another device than the weights (here: forced to the CPU) restores them all the same."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2, dtype=torch.bfloat16)
    guard = WeightGuard(model.parameters(), device="cpu")
    assert all(b.device.type == "cpu" for b in guard._copy)
    good = [p.detach().clone() for p in model.parameters()]
    ptr = model.weight.data_ptr()
    with torch.no_grad():
        model.weight.fill_(math.nan)
        model.bias[0] = math.inf
    assert guard.restore_if_bad() is True
    assert all(torch.equal(p, g) for p, g in zip(model.parameters(), good)) and model.weight.data_ptr() == ptr
