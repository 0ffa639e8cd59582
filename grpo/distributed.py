"""The processes of a run: one plain process, or several started by `accelerate launch` (data parallel).

Everything about processes goes through `Dist`, so the loop reads the same for one process and for many:

    prompts of a step      the GLOBAL batch (prompts_per_step × world) is drawn identically on every rank; rank r
                           takes the r-th contiguous share, so a prompt's K rollouts stay on one rank
    token count / metrics  summed over ranks (`sum`), so `token-mean` divides by the global token count
    gradients              summed once per optimizer step: DDP (prepared by accelerate) syncs on the last
                           micro-batch, `no_sync` on the others, and the loss is multiplied by world size because
                           DDP averages; per-task gradients (PCGrad / CAGrad) are summed by hand
    logging / eval / save  rank 0; a checkpoint holds every rank's RNG state

With one process every collective is the identity and no Accelerator is built.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any, NoReturn, Sequence

import torch


class Dist:
    """Rank, world size and the few collectives the trainer needs (torch.distributed under accelerate)."""

    def __init__(self, accelerator: Any = None) -> None:
        self.accelerator = accelerator
        self.rank = int(accelerator.process_index) if accelerator is not None else 0
        self.world = int(accelerator.num_processes) if accelerator is not None else 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    def share(self, n: int) -> slice:
        """Rank r's contiguous share of n items (n must divide evenly: every rank does the same work)."""
        if n % self.world:
            raise ValueError(f"{n} items cannot be split evenly over {self.world} processes")
        per = n // self.world
        return slice(self.rank * per, (self.rank + 1) * per)

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """In-place all-reduce SUM (identity for one process); returns t."""
        if self.active:
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.SUM)
        return t

    def reduce(self, t: torch.Tensor, op: str) -> torch.Tensor:
        """In-place all-reduce with op "sum", "max" or "min"."""
        if self.active:
            ops = {"sum": torch.distributed.ReduceOp.SUM, "max": torch.distributed.ReduceOp.MAX,
                   "min": torch.distributed.ReduceOp.MIN}
            torch.distributed.all_reduce(t, op=ops[op])
        return t

    def sum_numbers(self, values: Sequence[float]) -> list[float]:
        """Sum a list of Python numbers over ranks (float64)."""
        if not self.active:
            return [float(v) for v in values]
        return self.sum(torch.tensor(list(values), dtype=torch.float64, device=self.device)).tolist()

    def any(self, flag: bool) -> bool:
        """True on every rank when any rank says True (e.g. a stop request that reached only some ranks)."""
        return bool(self.sum_numbers([float(flag)])[0] > 0)

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order, on every rank (pickled)."""
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.world
        torch.distributed.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank."""
        if not self.active:
            return obj
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.active:
            torch.distributed.barrier()

    def sum_grads(self, params: Sequence[torch.nn.Parameter]) -> None:
        """All-reduce SUM of the parameters' gradients as one flat buffer (a missing gradient counts as zero)."""
        if not self.active:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = self.sum(torch.cat([g.reshape(-1).float() for g in grads]))
        offset = 0
        for p, g in zip(params, grads):
            n = g.numel()
            p.grad = flat[offset:offset + n].view_as(g).to(g.dtype)
            offset += n

    @property
    def device(self) -> torch.device:
        return self.accelerator.device if self.accelerator is not None else torch.device("cpu")

    def no_sync(self, model: torch.nn.Module):
        """Skip DDP's gradient all-reduce for this backward (gradients accumulate locally)."""
        if self.active and hasattr(model, "no_sync"):
            return model.no_sync()
        return contextlib.nullcontext()

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
        """(training model, optimizer) prepared by accelerate (DDP / FSDP / DeepSpeed per the launch config).

        Called again after SFT (new trainable parameters under LoRA): accelerate's lists of prepared objects are
        cleared first, so the previous wrappers are not kept alive.
        """
        if not self.active:
            return model, optimizer
        acc = self.accelerator
        acc._models.clear()
        acc._optimizers.clear()
        return acc.prepare(model, optimizer)

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return self.accelerator.unwrap_model(model) if self.active else model


def rank_rng_state(state: dict[str, Any], dist: Dist) -> dict[str, Any]:
    """This rank's saved RNG state; a checkpoint from another number of processes gives each rank rank 0's state
    re-seeded per rank (rollouts then differ from the interrupted run's, which a warning says)."""
    saved = state.get("rng_ranks") or [state["rng"]]
    if len(saved) == dist.world:
        return saved[dist.rank]
    if dist.is_main:
        import warnings

        warnings.warn(f"the checkpoint was written by {len(saved)} process(es), this run has {dist.world}: the "
                      "random state cannot continue exactly (sampling with rollout.sampling_rng=per_completion "
                      "does not depend on it)", stacklevel=2)
    if dist.rank == 0:
        return saved[0]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1_000_003 * dist.rank + int(state["step"]))
        return {**saved[0], "torch": torch.get_rng_state()}


def launched_world_size() -> int:
    """Processes started by the launcher (torchrun / accelerate launch set WORLD_SIZE); 1 otherwise."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def make_dist(requested_device: str) -> tuple[Dist, torch.device | None]:
    """A Dist for this process, and the device accelerate assigned it (None for one process: the caller picks).

    Several processes on a machine without CUDA, or with train.device=cpu, use gloo on the CPU.
    """
    if launched_world_size() <= 1:
        return Dist(None), None
    from accelerate import Accelerator

    cpu = requested_device == "cpu" or not torch.cuda.is_available()
    accelerator = Accelerator(cpu=cpu)
    check_strategy(str(getattr(accelerator.distributed_type, "value", accelerator.distributed_type)))
    return Dist(accelerator), accelerator.device


SUPPORTED_STRATEGIES = ("NO", "MULTI_GPU", "MULTI_CPU")
"""Data parallel with whole-model replicas (DDP). Sharded strategies need gathered weights for `generate`, a
sharded weight guard, per-shard task gradients and engine-managed backward: not built yet (docs/SCALING.md)."""


def check_strategy(distributed_type: str) -> None:
    """Refuse, before any work, an accelerate strategy the trainer does not support (FSDP, DeepSpeed, ...)."""
    name = distributed_type.upper().removeprefix("DISTRIBUTEDTYPE.")
    if name not in SUPPORTED_STRATEGIES:
        raise ValueError(f"accelerate distributed_type {name} is not supported yet: grpo-dual runs data parallel "
                         "with a whole model per process (DDP: configs/accelerate/multi_gpu.yaml). For a model that "
                         "does not fit one card use LoRA / QLoRA and model.gradient_checkpointing=true "
                         "(MEMORY_OPTIMIZATION.md); FSDP and DeepSpeed ZeRO are planned, see docs/SCALING.md")


def requested_cpu_processes() -> int:
    """N when this process was started by `accelerate launch --cpu --num_processes N`, else 0.

    accelerate's `--cpu` launcher starts ONE process unless MPI is configured (it then expects mpirun), so the
    requested count is read from the launcher's command line.
    """
    if os.environ.get("ACCELERATE_USE_CPU", "").lower() not in ("true", "1") or "WORLD_SIZE" in os.environ:
        return 0
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return 0
    return num_processes_from_launch(argv)


def num_processes_from_launch(argv: Sequence[str]) -> int:
    """--num_processes of an `accelerate launch` command line (0 when it is not one or names no count)."""
    if "launch" not in argv or not any(Path(a).name == "accelerate" or a.endswith("accelerate") for a in argv):
        return 0
    for i, a in enumerate(argv):
        for flag in ("--num_processes", "--num-processes"):
            value = argv[i + 1] if a == flag and i + 1 < len(argv) else a.split("=", 1)[1] \
                if a.startswith(flag + "=") else None
            if value is not None:
                return int(value) if value.isdigit() else 0
    return 0


def relaunch_on_cpu(n: int, script: str, args: Sequence[str]) -> NoReturn:
    """Replace this process with `torchrun --nproc_per_node n script args` (gloo on the CPU). Never returns."""
    print(f"accelerate launch --cpu starts one process; starting {n} CPU processes with torchrun instead "
          "(gloo backend)", file=sys.stderr, flush=True)
    env = dict(os.environ, ACCELERATE_USE_CPU="true")
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}", script, *args]
    os.execve(sys.executable, argv, env)
