"""The step guard: update_passes's skip of a bad gradient norm, grpo.core.weight_guard's WeightGuard. The checks over
the metric history are in test_doctor.py."""

import math

import pytest
import torch

from grpo.core.weight_guard import TrainingUnstable, WeightGuard, bad_step_reason

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: a tiny model gains nothing from threads


def _one_update(monkeypatch, skip_grad_norm, scale=1.0):
    """One update_passes of a single weight w (log-probs w·base; the forward replaced), its metrics and w after it."""
    from grpo.config import LossConfig
    from grpo.core.step_types import TrainBatch
    from grpo.phases import update

    w = torch.nn.Parameter(torch.tensor(1.0))
    base_BT = torch.tensor([[-1.0, -2.0], [-0.5, -1.5]])
    monkeypatch.setattr(update, "completion_logprobs", lambda *a, **k: (w * scale * base_BT, torch.zeros(2, 2)))
    batch = TrainBatch(input_ids_BL=torch.ones(2, 3, dtype=torch.long), attention_mask_BL=torch.ones(2, 3,
                       dtype=torch.long), completion_mask_BT=torch.ones(2, 2), prompt_len=1,
                       task_ids_B=torch.zeros(2, dtype=torch.long), advantages_B=torch.tensor([1.0, -1.0]),
                       old_logps_BT=None, ref_logps_BT=None)
    learner = update.Learner(torch.nn.Module(), torch.optim.SGD([w], lr=0.1), [w])
    metrics = update.update_passes(learner, batch, torch.tensor([0.0]), LossConfig(), ["t"],
                                update.StepSettings(micro_batch_seqs=2, temperature=1.0, max_grad_norm=1e9,
                                                    skip_grad_norm=skip_grad_norm))
    return metrics, float(w.detach())


def test_a_step_is_skipped_when_the_gradient_norm_is_non_finite_or_above_train_skip_grad_norm(monkeypatch):
    """update_passes's guard: the optimizer step is taken at a gradient norm at or below train.skip_grad_norm and
    skipped (weights untouched, counted) above it or when the norm is NaN / inf."""
    metrics, moved = _one_update(monkeypatch, 1e9)
    norm = metrics["health/grad_norm"]
    assert norm > 0 and moved != 1.0 and metrics["health/skipped"] == 0.0
    metrics, moved = _one_update(monkeypatch, norm * 1.01)
    assert metrics["health/skipped"] == 0.0 and moved != 1.0
    metrics, kept = _one_update(monkeypatch, norm * 0.99)
    assert metrics["health/skipped"] == 1.0 and metrics["health/skipped_passes"] == 1.0 and kept == 1.0
    for scale in (float("nan"), float("inf")):
        metrics, kept = _one_update(monkeypatch, 1e9, scale)
        assert metrics["health/skipped"] == 1.0 and kept == 1.0, scale


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


def test_weight_guard_all_finite_is_exact_where_a_sum_overflows_or_infinities_cancel():
    w = torch.nn.Parameter(torch.tensor([3e38, 3e38, -1.0]))  # finite, but the fp32 sum overflows to inf
    h = torch.nn.Parameter(torch.tensor([1.0, 2.0], dtype=torch.float16))
    guard = WeightGuard([w, h], max_consecutive=3)
    assert guard.all_finite() is True
    for bad in ([math.inf, -math.inf, 0.0], [math.nan, 0.0, 0.0], [-math.inf, 1.0, 1.0]):
        with torch.no_grad():
            w.copy_(torch.tensor(bad))
        assert guard.all_finite() is False, bad
    with torch.no_grad():
        w.copy_(torch.tensor([1.0, 1.0, 1.0]))
        h[1] = math.inf
    assert guard.all_finite() is False


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
    message = str(err.value)
    assert "(train.max_consecutive_bad=3)" in message and "lower the learning rate (train.lr)" in message
    assert "train.max_grad_norm (or train.skip_grad_norm" in message and "β (kl.<task>.beta)" in message
    assert guard.state_dict() == {"skipped_total": 4, "restored_total": 1, "consecutive_bad": 3}


def test_weight_guard_rejects_no_trainable_params():
    with pytest.raises(ValueError, match="no trainable parameters"):
        WeightGuard([torch.zeros(2)])


def test_weight_guard_auto_keeps_a_full_model_copy_off_the_gpu():
    from grpo.core.weight_guard import ON_DEVICE_SNAPSHOT_BYTES, snapshot_device

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
    assert all(torch.equal(p, g) for p, g in zip(model.parameters(), good, strict=True))
    assert model.weight.data_ptr() == ptr


def test_bad_step_reason_says_what_happened_and_names_the_field():
    """Regression: one reason, "non-finite or exploding gradient norm", for every bad step misreports a step whose
    norm is 0 and whose weights go non-finite (train.lr = inf); the reason says which happened and names the field
    (train.skip_grad_norm)."""
    assert bad_step_reason(False, False, 0.5, 1000.0) == ""
    assert bad_step_reason(True, False, math.nan, 1000.0) == "non-finite gradient norm (nan)"
    assert bad_step_reason(True, False, math.inf, 1000.0) == "non-finite gradient norm (inf)"
    assert (bad_step_reason(True, False, 1234.5, 1000.0)
            == "gradient norm 1234 above train.skip_grad_norm=1000 (skipped)")
    assert bad_step_reason(False, True, 0.0, 1000.0) == "non-finite weights (restored)"
    assert bad_step_reason(True, True, 2e3, 1e3) == ("gradient norm 2000 above train.skip_grad_norm=1000 (skipped); "
                                                      "non-finite weights (restored)")


def test_a_step_that_leaves_non_finite_weights_is_reported_as_such(tmp_path):
    """An infinite learning rate (which the config refuses, so it is set on the optimizer here) gives a finite
    gradient norm and NaN weights; the guard restores them and the stop message says so."""
    import grpo_train as G
    from tests.trainer_helpers import fast_config

    run = G.setup(fast_config(tmp_path, "train.max_consecutive_bad=1"))
    run.updater.scheduler.base_lrs = [math.inf for _ in run.updater.scheduler.base_lrs]
    for group in run.updater.optimizer.param_groups:
        group["lr"] = math.inf
    good = [p.detach().clone() for p in run.policy.trainable_parameters()]
    with pytest.raises(TrainingUnstable, match=r"^1 consecutive bad optimizer steps \(last: non-finite weights "
                                               r"\(restored\)\); 0 skipped and 1 restored in total"):
        G.rl_step(run, 1)
    assert all(torch.equal(p, g) for p, g in zip(run.policy.trainable_parameters(), good, strict=True))
