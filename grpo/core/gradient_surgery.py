"""Multi-objective gradient handling: combine per-task gradients with sum, PCGrad or CAGrad.

Pure functions over flat gradient vectors (one 1-D tensor of D floats per task, stacked as `grads_ND`,
N = number of tasks); no model, optimizer or I/O inside the math. Formulas and sources:

    sum     d = Σ_i g_i                                         (= ∇ of the summed multi-task loss)
    pcgrad  g_i ← g_i − (g_i·g_j / ‖g_j‖²) g_j  if g_i·g_j < 0, j over the others in random order; d = Σ g_i
            (Yu et al. 2020, "Gradient Surgery for Multi-Task Learning", Alg. 1; g_j is the ORIGINAL gradient)
    cagrad  w* = argmin_{w∈Δ} g_w·g0 + √φ‖g_w‖,  g_w = Σ_i w_i g_i,  g0 = mean_i g_i,  φ = c²‖g0‖²
            (Liu et al. 2021, "Conflict-Averse Gradient Descent for Multi-task Learning", Eq. 4, the dual)
    cagrad  d = (g0 + (√φ / ‖g_w*‖) g_w*) · N / (1 + c²)        (Alg. 1; the official code divides by 1 + c²,
            its default `rescale=1`; × N is this module's scale convention, see below)

Scale convention: every method returns an update on the scale of `sum`. PCGrad sums the projected gradients, so
with no conflict it equals `sum` exactly. CAGrad works on the mean g0, so its result is multiplied by N; with
c = 0 it equals `sum` exactly (the 1 + c² division of the official code is kept with `cagrad_rescale=True`).

Randomness: PCGrad visits the other tasks in an order drawn with `torch.randperm(generator=...)` per task; pass
a `torch.Generator` for a reproducible order (without one, torch's global RNG is used). With two tasks the
order does not matter.

Memory: per-task gradients cost N × (trainable parameter count) floats. For LoRA (a few M parameters) that is
tens of MB; for full fine-tuning of an 8B model it is 2 × 32 GB in fp32 for two tasks -- use LoRA or `sum`.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable, Sequence

import torch

from grpo.core.registry import Registry

EPS_NORM = 1e-20
"""Below this squared norm a gradient counts as zero (no projection onto it, no direction for CAGrad)."""
CAGRAD_MAX_ITERS = 2000
"""Projected-gradient iterations for the CAGrad weights when N > 2 (N = 2 has an exact closed form)."""
CAGRAD_TOL = 1e-12
"""Stop the CAGrad weight iterations once the objective (on the normalised Gram matrix) moves less than this."""
SQRT_EPS = 1e-18
"""Keeps √(w·Gw) differentiable at g_w = 0 on the normalised Gram matrix (entries ≤ 1)."""
SURGERY_METHODS: Registry[Callable[..., tuple[torch.Tensor, dict[str, float]]]] = Registry("multi.combine",
                                                                                   "gradient combination")
"""How per-task gradients combine, by name (multi.combine): each takes (grads_ND, labels, c, generator, rescale)
and gives (the combined gradient, its metrics)."""


def task_labels(n_tasks: int, names: Sequence[str] | None) -> list[str]:
    """Metric labels for the tasks: `names` when given (checked against `n_tasks`), else "0", "1", ..."""
    if names is None:
        return [str(i) for i in range(n_tasks)]
    if len(names) != n_tasks:
        raise ValueError(
            f"multi: got {len(names)} task names {list(names)} for {n_tasks} gradients; pass one name per task"
        )
    return list(names)


def _stack(grads: Sequence[torch.Tensor] | torch.Tensor) -> torch.Tensor:
    """[N, D] float tensor (at least fp32) from a list of 1-D gradients or an [N, D] tensor."""
    grads_ND = grads if isinstance(grads, torch.Tensor) else torch.stack(list(grads))
    if grads_ND.dim() != 2 or grads_ND.shape[0] < 1:
        raise ValueError(f"multi: expected N 1-D gradients or an [N, D] tensor, got shape {tuple(grads_ND.shape)}")
    if grads_ND.dtype not in (torch.float32, torch.float64):
        grads_ND = grads_ND.float()  # dot products of bf16 vectors of millions of entries lose too much
    return grads_ND


def gradient_stats(
    grads: Sequence[torch.Tensor] | torch.Tensor, names: Sequence[str] | None = None
) -> dict[str, float]:
    """Norms and pairwise cosines of task gradients.

    Keys: `multi/norm/<i>`, `multi/cos/<i>__<j>` (i < j; `<i>_<j>` without names), `multi/cos_min` (N ≥ 2 only)
    and `multi/conflict` (1.0 if any cosine < 0). A zero gradient has cosine 0 with every other one.
    """
    grads_ND = _stack(grads)
    labels = task_labels(grads_ND.shape[0], names)
    sep = "__" if names is not None else "_"
    gram_NN = (grads_ND @ grads_ND.T).double()
    norms_N = gram_NN.diagonal().clamp(min=0).sqrt()
    metrics = {f"multi/norm/{labels[i]}": float(norms_N[i]) for i in range(len(labels))}
    cosines = []
    for i in range(len(labels)):
        for j in range(i + 1, len(labels)):
            denom = float(norms_N[i] * norms_N[j])
            cos = float(gram_NN[i, j]) / denom if denom * denom > EPS_NORM else 0.0
            metrics[f"multi/cos/{labels[i]}{sep}{labels[j]}"] = cos
            cosines.append(cos)
    if cosines:
        metrics["multi/cos_min"] = min(cosines)
    metrics["multi/conflict"] = float(any(c < 0 for c in cosines))
    return metrics


def pcgrad(grads_ND: torch.Tensor, generator: torch.Generator | None = None) -> tuple[torch.Tensor, int]:
    """PCGrad (Yu et al. 2020, Alg. 1): project each g_i off every ORIGINAL g_j it conflicts with; sum them.

    Returns (d_D, number of projections made). The other tasks are visited in the order of
    `torch.randperm(N, generator=generator)` drawn once per task i (i itself skipped).
    """
    n_tasks = grads_ND.shape[0]
    sq_norms_N = (grads_ND * grads_ND).sum(dim=1)
    combined_D = torch.zeros_like(grads_ND[0])
    projections = 0
    for i in range(n_tasks):
        g_i = grads_ND[i].clone()
        order = torch.randperm(n_tasks, generator=generator).tolist()
        for j in order:
            if j == i or float(sq_norms_N[j]) <= EPS_NORM:
                continue
            dot = torch.dot(g_i, grads_ND[j])
            if float(dot) < 0:
                g_i = g_i - (dot / sq_norms_N[j]) * grads_ND[j]
                projections += 1
        combined_D += g_i
    return combined_D, projections


def _project_simplex(v_N: torch.Tensor) -> torch.Tensor:
    """Euclidean projection onto the probability simplex (Duchi et al. 2008, Fig. 1)."""
    u_N, _ = torch.sort(v_N, descending=True)
    css_N = u_N.cumsum(0) - 1.0
    k_N = torch.arange(1, v_N.numel() + 1, dtype=v_N.dtype)
    rho = int((u_N - css_N / k_N > 0).nonzero().max())
    theta = css_N[rho] / (rho + 1)
    return (v_N - theta).clamp(min=0)


def cagrad_objective(w_N: torch.Tensor, gram_NN: torch.Tensor, c: float) -> torch.Tensor:
    """F(w) = g_w·g0 + c‖g0‖·‖g_w‖ written on the Gram matrix G (g0 = mean, so g_w·g0 = wᵀG1/N)."""
    g0_norm = gram_NN.mean().clamp(min=0).sqrt()  # ‖g0‖² = 1ᵀG1 / N²
    quad = (w_N @ gram_NN @ w_N).clamp(min=0)
    return w_N @ gram_NN.mean(dim=1) + c * g0_norm * (quad + SQRT_EPS).sqrt()


def _cagrad_weights_two(gram_NN: torch.Tensor, c: float) -> torch.Tensor:
    """Exact minimiser for N = 2, w = (t, 1 − t): F is convex in t, so its minimum is at t ∈ {0, 1} or at a
    root of F'(t) = 0, i.e. of s²(2At + B)² = 4k²(At² + Bt + C) with q(t) = At² + Bt + C = ‖g_w‖²."""
    g11, g12, g22 = float(gram_NN[0, 0]), float(gram_NN[0, 1]), float(gram_NN[1, 1])
    s = c * math.sqrt(max((g11 + 2 * g12 + g22) / 4, 0.0))
    a_q, b_q, c_q = g11 - 2 * g12 + g22, 2 * g12 - 2 * g22, g22
    k = (g11 + g12) / 2 - (g12 + g22) / 2
    qa = 4 * s * s * a_q * a_q - 4 * k * k * a_q
    qb = 4 * s * s * a_q * b_q - 4 * k * k * b_q
    qc = s * s * b_q * b_q - 4 * k * k * c_q
    candidates = [0.0, 1.0]
    if abs(qa) > 1e-15:
        disc = qb * qb - 4 * qa * qc
        if disc >= 0:
            candidates += [(-qb + math.sqrt(disc)) / (2 * qa), (-qb - math.sqrt(disc)) / (2 * qa)]
    elif abs(qb) > 1e-15:
        candidates.append(-qc / qb)
    ws = [torch.tensor([t, 1.0 - t], dtype=gram_NN.dtype) for t in candidates if 0.0 <= t <= 1.0]
    values = [float(cagrad_objective(w, gram_NN, c)) for w in ws]
    return ws[values.index(min(values))]


def _cagrad_weights(gram_NN: torch.Tensor, c: float) -> torch.Tensor:
    """w* on the simplex minimising `cagrad_objective`: closed form for N = 2, projected gradient with
    backtracking otherwise (F is convex). G is normalised by its largest diagonal entry first: F scales
    linearly with G, so w* is unchanged and the tolerances become scale-free."""
    n_tasks = gram_NN.shape[0]
    scale = float(gram_NN.diagonal().max())
    if n_tasks == 1 or scale <= EPS_NORM:
        return torch.full((n_tasks,), 1.0 / n_tasks, dtype=gram_NN.dtype)
    gram_NN = gram_NN / scale
    if n_tasks == 2:
        return _cagrad_weights_two(gram_NN, c)
    s = c * float(gram_NN.mean().clamp(min=0).sqrt())
    b_N = gram_NN.mean(dim=1)
    w_N = torch.full((n_tasks,), 1.0 / n_tasks, dtype=gram_NN.dtype)
    value, lr = float(cagrad_objective(w_N, gram_NN, c)), 1.0
    for _ in range(CAGRAD_MAX_ITERS):
        gw_N = gram_NN @ w_N
        grad_N = b_N + s * gw_N / (w_N @ gw_N + SQRT_EPS).clamp(min=SQRT_EPS).sqrt()  # ∇F(w)
        while True:
            cand_N = _project_simplex(w_N - lr * grad_N)
            cand_value = float(cagrad_objective(cand_N, gram_NN, c))
            if cand_value <= value or lr < 1e-12:
                break
            lr /= 2
        moved = value - cand_value
        w_N, value, lr = cand_N, cand_value, lr * 2
        if 0 <= moved < CAGRAD_TOL:
            break
    return w_N


def cagrad(grads_ND: torch.Tensor, c: float = 0.5, rescale: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """CAGrad (Liu et al. 2021, Alg. 1) on the scale of `sum`. Returns (d_D, w_N).

    d = (g0 + c‖g0‖/‖g_w‖ · g_w) · N, divided by 1 + c² when `rescale` (the official default, `rescale=1`).
    """
    if not 0.0 <= c < 1.0:
        raise ValueError(f"multi.cagrad: c must be in [0, 1), got {c}; the paper uses 0.2 - 0.8")
    n_tasks = grads_ND.shape[0]
    gram_NN = (grads_ND @ grads_ND.T).double().cpu()  # N×N: the weight solve runs on CPU in fp64
    w_N = _cagrad_weights(gram_NN, c)
    g0_D = grads_ND.mean(dim=0)
    g0_norm = float(gram_NN.mean().clamp(min=0).sqrt())
    gw_D = (w_N.to(device=grads_ND.device, dtype=grads_ND.dtype)[:, None] * grads_ND).sum(dim=0)
    gw_norm = float(gw_D.norm())
    lam = c * g0_norm / gw_norm if gw_norm * gw_norm > EPS_NORM else 0.0
    d_D = (g0_D + lam * gw_D) * n_tasks
    if rescale:
        d_D = d_D / (1.0 + c * c)
    return d_D, w_N


@SURGERY_METHODS.register("sum", "the plain sum of the task gradients (no surgery)")
def _sum(grads_ND: torch.Tensor, labels: list[str], c: float, generator: torch.Generator | None,
         rescale: bool) -> tuple[torch.Tensor, dict[str, float]]:
    """The plain sum of the task gradients (no surgery)."""
    return grads_ND.sum(dim=0), {}


@SURGERY_METHODS.register("pcgrad", "each task gradient loses its component along every other it conflicts with")
def _pcgrad(grads_ND: torch.Tensor, labels: list[str], c: float, generator: torch.Generator | None,
            rescale: bool) -> tuple[torch.Tensor, dict[str, float]]:
    """PCGrad: each task gradient loses its component along every other it conflicts with (random task order)."""
    combined_D, projections = pcgrad(grads_ND, generator)
    return combined_D, {"multi/pcgrad/projections": float(projections)}


@SURGERY_METHODS.register("cagrad",
                          "the average gradient moved towards the least-improved task, within radius multi.cagrad_c")
def _cagrad(grads_ND: torch.Tensor, labels: list[str], c: float, generator: torch.Generator | None,
            rescale: bool) -> tuple[torch.Tensor, dict[str, float]]:
    """CAGrad: the average gradient moved towards the least-improved task, within radius c."""
    combined_D, w_N = cagrad(grads_ND, c, rescale)
    return combined_D, {f"multi/cagrad_w/{labels[i]}": float(w_N[i]) for i in range(len(labels))}


def apply_surgery(
    grads: Sequence[torch.Tensor] | torch.Tensor,
    method: str = "sum",
    c: float = 0.5,
    generator: torch.Generator | None = None,
    names: Sequence[str] | None = None,
    extra: torch.Tensor | None = None,
    cagrad_rescale: bool = True,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Combine per-task gradients into one update on the scale of their sum.

    grads: N 1-D tensors of D floats, or an [N, D] tensor (policy-reward gradient of each task).
    method: "sum" | "pcgrad" | "cagrad"; c: CAGrad's radius in [0, 1); generator: PCGrad's task order.
    extra: a D vector added AFTER the surgery, untouched (e.g. the KL + entropy gradient of the step).
    Returns (d_D in fp32 or fp64, metrics): `gradient_stats` keys, `multi/pcgrad/projections` (pcgrad),
    `multi/cagrad_w/<i>` (cagrad), `multi/combined_norm`, `multi/nonfinite`. A non-finite gradient skips the
    surgery (the plain sum is returned, so the health check sees the NaN) and sets `multi/nonfinite` = 1.
    """
    method_fn = SURGERY_METHODS.get(method)
    grads_ND = _stack(grads)
    labels = task_labels(grads_ND.shape[0], names)
    finite = bool(torch.isfinite(grads_ND).all())
    metrics = gradient_stats(grads_ND, names) if finite else {}
    metrics["multi/nonfinite"] = float(not finite)
    combined_D, more = (method_fn if finite else SURGERY_METHODS["sum"])(grads_ND, labels, c, generator, cagrad_rescale)
    metrics.update(more)
    if extra is not None:
        if extra.shape != combined_D.shape:
            raise ValueError(
                f"multi.combine: extra has shape {tuple(extra.shape)}, gradients {tuple(combined_D.shape)}"
            )
        combined_D = combined_D + extra.to(combined_D.dtype)
    metrics["multi/combined_norm"] = float(combined_D.norm())
    return combined_D, metrics


class ConflictMonitor:
    """Decides per step whether gradient surgery is on, from the (minimum pairwise) task-gradient cosine.

    mode "always" / "never" fix the answer. In "auto", surgery switches ON after `patience` consecutive steps
    with cosine < threshold and OFF after `release` consecutive steps with cosine ≥ threshold, so one noisy
    step neither trips nor releases it. A NaN cosine (e.g. one task) carries no information: nothing changes.
    """

    def __init__(self, mode: str = "auto", threshold: float = 0.0, patience: int = 3, release: int = 3) -> None:
        if mode not in ("always", "never", "auto"):
            raise ValueError(f"ConflictMonitor: mode must be 'always', 'never' or 'auto', got {mode!r}")
        if patience < 1 or release < 1:
            raise ValueError(f"ConflictMonitor: patience ({patience}) and release ({release}) must be ≥ 1")
        self.mode, self.threshold, self.patience, self.release = mode, threshold, patience, release
        self.active = mode == "always"
        self.below = 0  # consecutive steps with cosine < threshold
        self.above = 0  # consecutive steps with cosine ≥ threshold

    def update(self, cos: float) -> bool:
        """Feed this step's cosine; returns whether surgery is active for this step."""
        if self.mode != "auto" or math.isnan(cos):
            return self.active
        if cos < self.threshold:
            self.below, self.above = self.below + 1, 0
        else:
            self.below, self.above = 0, self.above + 1
        if not self.active and self.below >= self.patience:
            self.active = True
        elif self.active and self.above >= self.release:
            self.active = False
        return self.active

    def metrics(self) -> dict[str, float]:
        return {"multi/active": float(self.active), "multi/conflict_streak": float(self.below)}

    def state_dict(self) -> dict[str, object]:
        return {"mode": self.mode, "active": self.active, "below": self.below, "above": self.above}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore the counters; the configuration (mode, threshold, patience, release) stays the constructor's."""
        self.active = bool(state["active"]) if self.mode == "auto" else self.mode == "always"
        self.below, self.above = int(state["below"]), int(state["above"])  # type: ignore[arg-type]


def trainable(params: Iterable[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
    """The parameters that require grad, in order: the fixed layout of every flat gradient."""
    return [p for p in params if p.requires_grad]


def flat_grad(params: Iterable[torch.nn.Parameter], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Concatenate `.grad` of the parameters that require grad (zeros where `.grad` is None) into one D vector."""
    parts = [
        p.grad.detach().reshape(-1).to(dtype)
        if p.grad is not None
        else torch.zeros(p.numel(), dtype=dtype, device=p.device)
        for p in trainable(params)
    ]
    if not parts:
        raise ValueError("multi.flat_grad: no parameter requires grad; nothing to flatten")
    return torch.cat(parts)


def assign_flat_grad(params: Iterable[torch.nn.Parameter], flat_D: torch.Tensor) -> None:
    """Write a D vector back into `.grad` of the parameters that require grad (same layout as `flat_grad`)."""
    ps = trainable(params)
    total = sum(p.numel() for p in ps)
    if flat_D.dim() != 1 or flat_D.numel() != total:
        raise ValueError(f"multi.assign_flat_grad: vector of shape {tuple(flat_D.shape)} for {total} trainable values")
    offset = 0
    for p in ps:
        chunk = flat_D[offset : offset + p.numel()].view_as(p).to(device=p.device, dtype=p.dtype)
        p.grad = chunk.clone()
        offset += p.numel()


class TaskGradAccumulator:
    """Sums per-task flat gradients over the micro-batches of one optimizer step into an [N, D] buffer.

    Memory: N × D floats of `dtype` (fp32: 4 bytes each) -- ~2 × 4 × 10M = 80 MB for two tasks under LoRA,
    2 × 32 GB for full fine-tuning of an 8B model. Pattern per micro-batch and task t:
    `loss_t.backward(retain_graph=...)` then `acc.capture(t)` (adds the params' .grad to row t, clears .grad).
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], n_tasks: int, dtype: torch.dtype = torch.float32) -> None:
        self.params = trainable(params)
        if not self.params or n_tasks < 1:
            raise ValueError(f"TaskGradAccumulator: need trainable parameters and n_tasks ≥ 1 (got {n_tasks})")
        self.numel = sum(p.numel() for p in self.params)
        self.grads_ND = torch.zeros(n_tasks, self.numel, dtype=dtype, device=self.params[0].device)
        self.counts_N = [0] * n_tasks

    def add(self, task_index: int, flat_D: torch.Tensor) -> None:
        if flat_D.shape != (self.numel,):
            raise ValueError(f"TaskGradAccumulator.add: expected a vector of {self.numel}, got {tuple(flat_D.shape)}")
        self.grads_ND[task_index] += flat_D.to(self.grads_ND.dtype)
        self.counts_N[task_index] += 1

    def capture(self, task_index: int) -> None:
        """Add the parameters' current .grad to task `task_index`, then set .grad to None for the next task."""
        self.add(task_index, flat_grad(self.params, self.grads_ND.dtype))
        for p in self.params:
            p.grad = None

    def stack(self) -> torch.Tensor:
        """The [N, D] per-task gradients summed so far (the buffer itself; `reset` zeroes it)."""
        return self.grads_ND

    def reset(self) -> None:
        self.grads_ND.zero_()
        self.counts_N = [0] * len(self.counts_N)

    @property
    def nbytes(self) -> int:
        return self.grads_ND.numel() * self.grads_ND.element_size()
