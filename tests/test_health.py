"""grpo.health: the step guard (grad_norm_ok, WeightGuard). The checks over the metric history are in test_doctor.py."""

import math

import pytest
import torch

from grpo.health import TrainingUnstable, WeightGuard, grad_norm_ok


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
