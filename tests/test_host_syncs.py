"""Host syncs per phase of one RL step (benchmarks/host_syncs.py), counted on the CPU with the loop's CUDA settings:
each phase keeps its numbers on the device and reads them back a few times per optimizer step, not per token or per
micro-batch metric. A regression (an `.item()` in a loop, a per-step read in decoding) fails its phase's budget."""

import math

import pytest

from tests.conftest import load_script

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
host_syncs = load_script("benchmarks/host_syncs.py")
NEW = 32

HOST_SIDE = {
    "grpo/grading/scoring.py:_mean_std": "a float64 tensor built from the graders' Python floats, on the CPU in every "
                                         "run: reading it waits for no device",
}
"""Call sites whose reads are of host tensors on any machine (they only look like syncs on the CPU)."""


def budgets(new_tokens: int) -> dict[str, int]:
    """The most device reads each phase may make (2-prompt micro-steps x 2, K 4, μ 1, β > 0), and why."""
    from grpo.decoding.graph_decode import SYNC_EVERY

    mask_check = 2  # transformers' sdpa mask builder asks whether a padding mask can be dropped: two reads a forward
    return {
        # prefill mask check; one "still running?" read per SYNC_EVERY tokens; the new ids and the sanitiser count
        "generate": mask_check + math.ceil((new_tokens - 1) / SYNC_EVERY) + 2,
        "reward": 0,
        "advantages": 0,
        "old_logps": 0,  # μ = 1 without dropout: the training pass's own log-probs are the old ones
        # row lengths for the micro-batch partition (twice: the rows, then the batches) and one forward's mask check
        "ref_logps": 2 + mask_check,
        # the step's token count, the row lengths, one forward's mask check, the gradient norm (a step is skipped on
        # a non-finite one), the weight guard's finiteness check, the pass's metrics in one read
        "update": 1 + 1 + mask_check + 1 + 1 + 1,
    }


def test_each_phase_of_an_rl_step_reads_the_device_within_its_budget(tmp_path):
    import grpo_train

    run, _ = host_syncs.quick_run(tmp_path, NEW, engine="graph")
    for step in (1, 2):
        grpo_train.rl_step(run, step)
    counters = host_syncs.count_step(run, 3)
    assert set(counters) == {phase for phase, _, _ in host_syncs.PHASES}
    report = host_syncs.table(counters)
    for phase, budget in budgets(NEW).items():
        device = sum(n for site, n in counters[phase].syncs.items() if site.split(" (")[0] not in HOST_SIDE)
        assert device <= budget, f"{phase}: {device} device reads, budget {budget}\n{report}"
    assert counters["generate"].ops > NEW * 50  # the counter saw the decoding steps


def test_the_counter_sees_every_kind_of_read():
    """`.item()`, bool(), nonzero and the copies to the host that make no aten op on the CPU (tolist, numpy, cpu)."""
    import torch

    x = torch.arange(4.0)
    with host_syncs.SyncCounter() as counter:
        x.sum().item()
        bool(x.any())
        x.nonzero()
        x.tolist()
        x.numpy()
        x.cpu()
        y = x * 2  # not a read
    assert counter.total == 6 and counter.ops >= 5 and y.shape == x.shape
    assert all(site.startswith("tests/test_host_syncs.py:test_the_counter_sees_every_kind_of_read")
               for site in counter.syncs)


def test_the_phase_timer_adds_up_to_the_step():
    """StepTimer (grpo/run/tracking.py): each phase is the time since the previous one ended, so they add up to
    time/step; on the CPU the host clock (on CUDA, events on the stream, read once at the end)."""
    import time

    from grpo.run.tracking import StepTimer

    timer = StepTimer()
    with timer("generate"):
        time.sleep(0.02)
    time.sleep(0.01)  # between phases: charged to the next one
    with timer("update"):
        time.sleep(0.01)
    m = timer.metrics()
    assert set(m) == {"time/generate", "time/update", "time/step"}
    assert m["time/generate"] >= 0.02 and m["time/update"] >= 0.02
    assert m["time/generate"] + m["time/update"] == pytest.approx(m["time/step"], abs=1e-9)
    assert not StepTimer(torch_device("cpu")).cuda


def torch_device(kind):
    import torch

    return torch.device(kind)
