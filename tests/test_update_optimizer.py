"""grpo/phases/update.adamw: the fused AdamW kernel where it applies, the same update as torch's per-tensor loop."""

from __future__ import annotations

import torch

from grpo.phases.update import adamw


def _params(seed: int) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(5, 3, generator=g)), torch.nn.Parameter(torch.randn(7, generator=g))]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)
    return params


def test_cpu_parameters_get_the_fused_kernel_and_its_steps_equal_the_per_tensor_loop():
    fused, looped = _params(0), _params(0)
    a = adamw(fused, lr=0.1, weight_decay=0.01)
    b = torch.optim.AdamW(looped, lr=0.1, weight_decay=0.01, foreach=False)
    assert a.defaults["fused"] is True and not b.defaults["fused"]
    for _ in range(3):
        a.step(), b.step()
        for p, q in zip(fused, looped, strict=True):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)
            p.grad, q.grad = p.grad * -0.5, q.grad * -0.5  # a different gradient for the next step
    # the state has the same entries, so a checkpoint from either loads into the other
    assert a.state_dict()["state"][0].keys() == b.state_dict()["state"][0].keys()
    b.load_state_dict(a.state_dict())


def test_parameters_without_a_fused_kernel_keep_torchs_default():
    meta = [torch.nn.Parameter(torch.empty(3, device="meta"))]
    assert not adamw(meta, lr=0.1, weight_decay=0.0).defaults["fused"]
