"""PCGrad / CAGrad against hand-worked answers and their defining properties; accumulation; ConflictMonitor."""

import math

import pytest
import torch

from grpo.core.gradient_surgery import (
    ConflictMonitor,
    TaskGradAccumulator,
    apply_surgery,
    assign_flat_grad,
    cagrad_objective,
    flat_grad,
    gradient_stats,
)


def t(*xs):
    return torch.tensor(xs, dtype=torch.float64)


def close(a, b, tol=1e-9):
    torch.testing.assert_close(a.double(), torch.as_tensor(b, dtype=torch.float64), atol=tol, rtol=0)


# ---- PCGrad: hand-worked cases -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "g1, g2, expected",
    [
        ((1.0, 0.0), (0.0, 2.0), (1.0, 2.0)),  # orthogonal: dot = 0, no projection
        ((1.0, 1.0), (2.0, 2.0), (3.0, 3.0)),  # aligned: no projection
        ((1.0, 0.0), (-1.0, 0.0), (0.0, 0.0)),  # opposed: g1 − (−1/1)(−1,0) = 0 and likewise g2 → 0
        # obtuse: g1·g2 = −1; g1' = (1,0) − (−1/2)(−1,1) = (.5,.5); g2' = (−1,1) − (−1/1)(1,0) = (0,1)
        ((1.0, 0.0), (-1.0, 1.0), (0.5, 1.5)),
    ],
)
def test_pcgrad_two_tasks_by_hand(g1, g2, expected):
    d, m = apply_surgery([t(*g1), t(*g2)], "pcgrad")
    close(d, expected)
    assert m["multi/conflict"] == float(g1[0] * g2[0] + g1[1] * g2[1] < 0)


def test_pcgrad_projects_on_original_gradients_three_tasks():
    # g1·g2 = g1·g3 = −1, g2·g3 = +1. Task 1 visiting (2, 3): (1,0,0)+.5 g2 = (.5,.5,0), then ·g3 = −.5 →
    # +.25 g3 = (.25,.5,.25). Visiting (3, 2): (.25,.25,.5). Tasks 2, 3 become (0,1,0), (0,0,1) in any order.
    grads = [t(1, 0, 0), t(-1, 1, 0), t(-1, 0, 1)]
    order_23, order_32 = t(0.25, 1.5, 1.25), t(0.25, 1.25, 1.5)
    seen = set()
    for seed in range(20):
        d1, _ = apply_surgery(grads, "pcgrad", generator=torch.Generator().manual_seed(seed))
        d2, _ = apply_surgery(grads, "pcgrad", generator=torch.Generator().manual_seed(seed))
        close(d1, d2, 0.0)  # same generator seed, same order, same answer
        matches = [i for i, e in enumerate((order_23, order_32)) if torch.allclose(d1, e, atol=1e-12)]
        assert len(matches) == 1, d1
        seen.add(matches[0])
    assert seen == {0, 1}  # the order really is random across seeds


def test_pcgrad_equals_sum_without_conflict():
    g = torch.rand(4, 50, dtype=torch.float64)  # all entries ≥ 0: every pair has dot ≥ 0
    d, m = apply_surgery(g, "pcgrad")
    close(d, g.sum(0))
    assert m["multi/pcgrad/projections"] == 0


# ---- CAGrad ----------------------------------------------------------------------------------------------------
def test_cagrad_hand_cases():
    c = 0.5
    # equal gradients: g_w = g for every w, d_mean = g + c‖g‖/‖g‖ g = 1.5 g; × N=2 / (1 + .25) = 2.4 g
    d, _ = apply_surgery([t(3.0, 4.0), t(3.0, 4.0)], "cagrad", c=c)
    close(d, (7.2, 9.6))
    # orthogonal unit gradients: by symmetry w = (.5,.5), g_w = g0 = (.5,.5), d_mean = 1.5 g0 → × 2 / 1.25
    d, m = apply_surgery([t(1.0, 0.0), t(0.0, 1.0)], "cagrad", c=c)
    close(d, (1.2, 1.2))
    assert m["multi/cagrad_w/0"] == pytest.approx(0.5, abs=1e-9)
    # opposed: g0 = 0 so φ = 0 and d = 0
    d, _ = apply_surgery([t(1.0, 0.0), t(-1.0, 0.0)], "cagrad", c=c)
    close(d, (0.0, 0.0))


def test_cagrad_with_c_zero_is_sum():
    g = torch.randn(3, 20, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    d, _ = apply_surgery(g, "cagrad", c=0.0)
    close(d, g.sum(0), 1e-12)


def _grid_min(gram, c, n_tasks, steps):
    if n_tasks == 2:
        s = torch.linspace(0, 1, steps + 1, dtype=torch.float64)
        ws = torch.stack([s, 1 - s], 1)
    else:
        a, b = torch.meshgrid(*(torch.linspace(0, 1, steps + 1, dtype=torch.float64),) * 2, indexing="ij")
        keep = (a + b) <= 1
        ws = torch.stack([a[keep], b[keep], 1 - a[keep] - b[keep]], 1)
    # F(w) = wᵀG1/N + c‖g0‖√(wᵀGw), vectorised over the grid (the paper's formula, not the module's code)
    g0_norm = math.sqrt(float(gram.sum()) / n_tasks**2)
    values = ws @ gram.mean(1) + c * g0_norm * torch.einsum("ki,ij,kj->k", ws, gram, ws).clamp(min=0).sqrt()
    return float(values.min())


@pytest.mark.parametrize("n_tasks, steps", [(2, 100000), (3, 400)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cagrad_weights_minimise_dual_objective(n_tasks, steps, seed):
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(n_tasks, 6, dtype=torch.float64, generator=gen)
    g[1] = -0.7 * g[0] + 0.3 * g[1]  # make a real conflict
    c = 0.5
    _, m = apply_surgery(g, "cagrad", c=c)
    w = torch.tensor([m[f"multi/cagrad_w/{i}"] for i in range(n_tasks)], dtype=torch.float64)
    assert w.min() >= 0 and float(w.sum()) == pytest.approx(1.0, abs=1e-9)
    gram = g @ g.T
    assert float(cagrad_objective(w, gram, c)) <= _grid_min(gram, c, n_tasks, steps) + 1e-9


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_cagrad_maximises_worst_task_improvement_in_ball(seed):
    """Primal (paper Eq. 3): d maximises min_i g_i·d over the ball ‖d − g0‖ ≤ c‖g0‖."""
    gen = torch.Generator().manual_seed(seed)
    n_tasks, dim, c = 2 + seed % 2, 3, 0.6
    g = torch.randn(n_tasks, dim, dtype=torch.float64, generator=gen)
    d, _ = apply_surgery(g, "cagrad", c=c)
    d_mean = d * (1 + c * c) / n_tasks  # undo the scale convention
    g0 = g.mean(0)
    radius = c * float(g0.norm())
    assert float((d_mean - g0).norm()) <= radius + 1e-9
    dirs = torch.randn(50000, dim, dtype=torch.float64, generator=gen)
    dirs = dirs / dirs.norm(dim=1, keepdim=True)
    radii = radius * torch.rand(50000, 1, dtype=torch.float64, generator=gen) ** (1 / dim)
    samples = torch.cat([g0 + radius * dirs, g0 + radii * dirs])
    best_sampled = float((samples @ g.T).min(dim=1).values.max())
    assert float((g @ d_mean).min()) >= best_sampled - 1e-9


# ---- sum == gradient of the summed loss; extra; accumulation ---------------------------------------------------
def _model_and_data(seed=0):
    gen = torch.Generator().manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    x = torch.randn(10, 4, generator=gen)
    y = torch.randn(10, 3, generator=gen)
    task = torch.tensor([0, 1, 0, 0, 1, 1, 0, 1, 1, 0])
    return model, x, y, task


def _task_loss(model, x, y, task, which, n_total):
    per_row = ((model(x) - y) ** 2).sum(-1)
    return (per_row * (task == which)).sum() / n_total  # token-mean-like: divide by the whole step's count


def test_sum_is_gradient_of_summed_loss_and_extra_is_added():
    model, x, y, task = _model_and_data()
    params = list(model.parameters())
    per_task = []
    for k in range(2):
        model.zero_grad()
        _task_loss(model, x, y, task, k, len(x)).backward()
        per_task.append(flat_grad(params))
    model.zero_grad()
    (_task_loss(model, x, y, task, 0, len(x)) + _task_loss(model, x, y, task, 1, len(x))).backward()
    full = flat_grad(params)
    d, _ = apply_surgery(per_task, "sum")
    torch.testing.assert_close(d, full)
    extra = torch.arange(full.numel(), dtype=torch.float32)
    d2, _ = apply_surgery(per_task, "pcgrad", extra=extra)
    d3, _ = apply_surgery(per_task, "pcgrad")
    torch.testing.assert_close(d2, d3 + extra)
    assign_flat_grad(params, d)
    torch.testing.assert_close(flat_grad(params), full)


@pytest.mark.parametrize("method", ["sum", "pcgrad", "cagrad"])
def test_accumulated_micro_batches_equal_full_batch(method):
    model, x, y, task = _model_and_data(1)
    params = list(model.parameters())
    acc = TaskGradAccumulator(params, n_tasks=2)
    assert acc.nbytes == 2 * 15 * 4  # N × D fp32: D = 4·3 + 3
    for rows in (slice(0, 4), slice(4, 10)):  # two micro-batches, normalised by the full count 10
        for k in range(2):
            _task_loss(model, x[rows], y[rows], task[rows], k, len(x)).backward()
            acc.capture(k)
    full = []
    for k in range(2):
        model.zero_grad()
        _task_loss(model, x, y, task, k, len(x)).backward()
        full.append(flat_grad(params))
    torch.testing.assert_close(acc.stack(), torch.stack(full))
    gen = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    d_acc, _ = apply_surgery(acc.stack(), method, generator=gen())
    d_full, _ = apply_surgery(full, method, generator=gen())
    torch.testing.assert_close(d_acc, d_full)
    acc.reset()
    assert float(acc.stack().abs().sum()) == 0.0 and acc.counts_N == [0, 0]


def test_metric_keys_with_names_and_nonfinite():
    m = gradient_stats([t(1.0, 0.0), t(-1.0, 1.0)], names=["fairness", "hallucination"])
    assert m["multi/cos/fairness__hallucination"] == pytest.approx(-1 / math.sqrt(2))
    assert m["multi/norm/hallucination"] == pytest.approx(math.sqrt(2))
    assert m["multi/conflict"] == 1.0 and m["multi/cos_min"] == pytest.approx(-1 / math.sqrt(2))
    assert "multi/cos/0_1" in gradient_stats([t(1.0, 0.0), t(0.0, 1.0)])
    d, m = apply_surgery([t(float("nan"), 0.0), t(1.0, 1.0)], "cagrad")
    assert m["multi/nonfinite"] == 1.0 and math.isnan(float(d[0]))
    with pytest.raises(ValueError, match="task names"):
        apply_surgery([t(1.0), t(2.0)], "sum", names=["a"])


# ---- ConflictMonitor -------------------------------------------------------------------------------------------
def test_conflict_monitor_patience_release_and_state():
    mon = ConflictMonitor("auto", threshold=0.0, patience=3, release=2)
    assert [mon.update(c) for c in (-0.5, 0.2, -0.1, -0.1)] == [False] * 4  # streak broken by 0.2
    assert mon.update(-0.3) is True  # third consecutive negative
    assert mon.update(0.1) is True  # one non-negative step does not release
    assert mon.update(-0.2) is True
    state = mon.state_dict()
    assert [mon.update(c) for c in (0.0, 0.4)] == [True, False]  # released after 2 steps ≥ threshold
    again = ConflictMonitor("auto", threshold=0.0, patience=3, release=2)
    again.load_state_dict(state)
    assert again.metrics()["multi/active"] == 1.0
    assert [again.update(c) for c in (0.0, 0.4)] == [True, False]
    assert again.update(float("nan")) is False and again.state_dict() == mon.state_dict()
    assert ConflictMonitor("always").update(0.9) is True
    assert ConflictMonitor("never").update(-0.9) is False
