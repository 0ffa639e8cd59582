"""Training health inside the step: the guard the loop calls around every optimizer step.

The update (grpo/phases/update.update_passes) skips an optimizer step whose gradient norm is not finite or above
train.skip_grad_norm; `WeightGuard` restores the last good weights when a step leaves a non-finite parameter, and stops
with `TrainingUnstable` after `max_consecutive` bad steps in a row, saying what to change. Formula: grad norm = ||g||_2
over all trainable parameters, as returned by torch.nn.utils.clip_grad_norm_.

The checks over the metric history (findings, verdict, the online `Doctor`) live in grpo/run/doctor/.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Iterable, Mapping

if TYPE_CHECKING:
    import torch

# torch is imported inside WeightGuard only: this module is imported by tools that read a jsonl file.


# ---------------------------------------------------------------------------------------------------------------
# Step-level guard (called inside the training loop)
# ---------------------------------------------------------------------------------------------------------------


class TrainingUnstable(RuntimeError):
    """Too many bad optimizer steps in a row; the message says what to change."""


def bad_step_reason(skipped: bool, restored: bool, grad_norm_max: float, skip_grad_norm: float) -> str:
    """What made an RL step bad, for `WeightGuard.record`: a skipped optimizer step (its largest pre-clip gradient
    norm `grad_norm_max` was non-finite or above `skip_grad_norm`, train.skip_grad_norm) and / or weights that went
    non-finite after a step and were restored. "" for a good step."""
    reasons = []
    if skipped:
        reasons.append(f"non-finite gradient norm ({grad_norm_max})" if not math.isfinite(grad_norm_max) else
                       f"gradient norm {grad_norm_max:.4g} above train.skip_grad_norm={skip_grad_norm:g} (skipped)")
    if restored:
        reasons.append("non-finite weights (restored)")
    return "; ".join(reasons)


ON_DEVICE_SNAPSHOT_BYTES = 512 * 2**20
"""Up to this size (a LoRA adapter) the last good copy stays on the GPU. A full fine-tuned model's copy goes to pinned
CPU memory instead: it lowers the GPU peak by the copy's size for a few ms more per step (measured on an H100:
benchmarks/NOTES.md, the row of this constant)."""


def snapshot_device(total_bytes: int, param_device):
    """Where WeightGuard's "auto" keeps the last good copy: with the parameters when they are on the CPU or total at
    most ON_DEVICE_SNAPSHOT_BYTES, else on the CPU (pinned there, so the copy stays asynchronous)."""
    on_accelerator = getattr(param_device, "type", str(param_device)) != "cpu"
    return param_device if (not on_accelerator or total_bytes <= ON_DEVICE_SNAPSHOT_BYTES) else "cpu"


class WeightGuard:
    """Keeps a copy of the trainable parameters to restore after a step that leaves them non-finite.

    Use (grpo/run/step_owners.py's Updater):
        restored = guard.restore_if_bad()     # after each optimizer step taken: snapshot if finite, else restore
        metrics |= guard.record(skipped=skipped, restored=restored, reason=bad_step_reason(...))   # once per RL step
    Under LoRA the trainable parameters are the adapters, so the snapshot is small. `device="cpu"` keeps it off
    the accelerator; pass the parameters' device for speed when memory allows.
    """

    def __init__(self, params: Iterable[torch.Tensor], max_consecutive: int = 3,
                 device: str | torch.device | None = "auto") -> None:
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("WeightGuard got no trainable parameters; pass [p for p in model.parameters() "
                             "if p.requires_grad] after the adapter is attached")
        if max_consecutive < 1:
            raise ValueError(f"WeightGuard max_consecutive={max_consecutive}; must be >= 1")
        self.max_consecutive = max_consecutive
        self.device = device
        self.skipped_total = 0
        self.restored_total = 0
        self.consecutive_bad = 0
        self._copy = self._buffers(device)
        self.snapshot()

    def _buffers(self, device) -> list[torch.Tensor]:
        """Snapshot buffers, allocated once. "auto": on the parameters' device when they total at most
        ON_DEVICE_SNAPSHOT_BYTES (LoRA adapters), else in pinned CPU memory so the copy is asynchronous."""
        import torch

        total = sum(p.numel() * p.element_size() for p in self.params)
        on_cuda = self.params[0].is_cuda
        if device == "auto":
            device = snapshot_device(total, self.params[0].device)
        device = torch.device(device) if device is not None else self.params[0].device
        pin = on_cuda and device.type == "cpu"
        return [torch.empty(p.shape, dtype=p.dtype, device=device, pin_memory=pin) for p in self.params]

    def snapshot(self) -> None:
        """Copy the current trainable parameters (the last known-good weights)."""
        for buf, p in zip(self._copy, self.params, strict=True):  # into the same buffers every time: no allocation
            buf.copy_(p.detach(), non_blocking=True)  # stream-ordered: a later restore sees this copy

    def all_finite(self) -> bool:
        """True when no trainable parameter holds NaN or inf (one sync with the device).

        First each parameter's fp32 sum: a NaN or ±inf anywhere makes its sum non-finite, and a sum reads the tensor
        once without writing a mask (far faster than isfinite + all: `python -m benchmarks.real_model_parts`, its
        timings in benchmarks/RESULTS.md). A finite sum of every tensor means all finite;
        otherwise the element-wise check decides, since a sum of finite values can overflow."""
        import torch

        with torch.no_grad():
            sums = torch.stack([p.sum(dtype=torch.float32) for p in self.params])
            if bool(torch.isfinite(sums).all()):
                return True
            return bool(torch.stack([torch.isfinite(p).all() for p in self.params]).all())

    def restore(self) -> None:
        """Write the last snapshot back into the parameters, in place (the optimizer keeps its references)."""
        import torch

        with torch.no_grad():
            for p, saved in zip(self.params, self._copy, strict=True):
                p.copy_(saved.to(p.device))

    def restore_if_bad(self) -> bool:
        """After an optimizer step: restore and return True if weights went non-finite, else snapshot, False."""
        if self.all_finite():
            self.snapshot()
            return False
        self.restore()
        return True

    def record(self, skipped: bool = False, restored: bool = False, reason: str = "") -> dict[str, float]:
        """Count this step; raise TrainingUnstable after `max_consecutive` bad steps in a row. Returns metrics."""
        bad = skipped or restored
        self.skipped_total += int(skipped)
        self.restored_total += int(restored)
        self.consecutive_bad = self.consecutive_bad + 1 if bad else 0
        if self.consecutive_bad >= self.max_consecutive:
            raise TrainingUnstable(
                f"{self.consecutive_bad} consecutive bad optimizer steps (last: {reason or 'unknown'}); "
                f"{self.skipped_total} skipped and {self.restored_total} restored in total "
                f"(train.max_consecutive_bad={self.max_consecutive}). Fix: lower the learning rate (train.lr), lower "
                "train.max_grad_norm (or train.skip_grad_norm for norms it calls exploding), or raise the KL "
                "coefficient β (kl.<task>.beta); check the rewards and log-probs for NaN.")
        return {
            "health/skipped": float(skipped),
            "health/restored": float(restored),
            "health/skipped_total": float(self.skipped_total),
            "health/restored_total": float(self.restored_total),
            "health/consecutive_bad": float(self.consecutive_bad),
        }

    def state_dict(self) -> dict[str, int]:
        """Counters to save with a checkpoint (the snapshot itself is the checkpoint's weights)."""
        return {"skipped_total": self.skipped_total, "restored_total": self.restored_total,
                "consecutive_bad": self.consecutive_bad}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Restore the counters saved by `state_dict`."""
        self.skipped_total = int(state["skipped_total"])
        self.restored_total = int(state["restored_total"])
        self.consecutive_bad = int(state["consecutive_bad"])
