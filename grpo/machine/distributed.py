"""The processes of a run: one plain process, or several started by `accelerate launch` (data parallel).

Everything about processes goes through `Dist`, so the loop reads the same for one process and for many:

    prompts of a step      the GLOBAL batch (prompts_per_step × world) is drawn identically on every rank; rank r
                           takes the r-th contiguous share, so a prompt's K rollouts stay on one rank
    token count / metrics  summed over ranks (`sum`), so `token-mean` divides by the global token count
    gradients              summed once per optimizer step: DDP (prepared by accelerate) syncs on the last
                           micro-batch, `no_sync` on the others, and the loss is multiplied by world size because
                           DDP averages; per-task gradients (PCGrad / CAGrad) are summed by hand
    logging / eval / save  rank 0; a checkpoint holds every rank's RNG state

With `sharded` (train.sharding=fsdp, or an accelerate FSDP config) the model and the reference are sharded with
FSDP2 (`fully_shard` on every decoder layer, then the root; parameters, gradients and optimizer state are split
over the ranks) instead of replicated. Every forward is then a collective, so every rank runs the same number of
them: `generate(synced_gpus=True)`, evaluation on every rank (rank 0 scores), the same micro-batch count.
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

    def __init__(self, accelerator: Any = None, sharded: bool = False) -> None:
        self.accelerator = accelerator
        self.rank = int(accelerator.process_index) if accelerator is not None else 0
        self.world = int(accelerator.num_processes) if accelerator is not None else 1
        self.sharded = sharded
        self.device = accelerator.device if accelerator is not None else torch.device("cpu")
        """This process's device: accelerate's under several processes, else train.device's (`setup` sets it)."""

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

    def close(self) -> None:
        """The end of a run that every rank finished: wait for the others, then destroy the process group, so that no
        gloo worker thread outlives the interpreter (a rank that exits without this can abort with "terminate called
        without an active exception": pytorch/pytorch#190489). Only after success: after a failure some ranks may
        be inside a collective, and a collective clean-up would hang (the launcher ends them instead)."""
        if self.active and torch.distributed.is_initialized():
            torch.distributed.barrier()
            torch.distributed.destroy_process_group()

    def sum_grads(self, params: Sequence[torch.nn.Parameter]) -> None:
        """All-reduce SUM of the parameters' gradients as one flat buffer (a missing gradient counts as zero)."""
        if not self.active:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = self.sum(torch.cat([g.reshape(-1).float() for g in grads]))
        offset = 0
        for p, g in zip(params, grads, strict=True):
            n = g.numel()
            p.grad = flat[offset:offset + n].view_as(g).to(g.dtype)
            offset += n

    def no_sync(self, model: torch.nn.Module):
        """Skip the gradient all-reduce (DDP) / reduce-scatter (FSDP) for this backward: gradients accumulate
        locally and are reduced, summed, with the next synchronised backward."""
        if self.active and hasattr(model, "set_requires_gradient_sync"):
            return _fsdp_no_sync(model)
        if self.active and hasattr(model, "no_sync"):
            return model.no_sync()
        return contextlib.nullcontext()

    # ---------------------------------------------------------------------------------- sharded (FSDP2) only
    def shard(self, module: torch.nn.Module | None) -> None:
        """FSDP2 full shard: `fully_shard` every decoder layer (the model's `_no_split_modules` classes), then the
        root. Parameters become DTensors in place, so build the optimizer afterwards."""
        if module is None or not self.sharded:
            return
        from torch.distributed.fsdp import fully_shard

        layers = set(getattr(module, "_no_split_modules", None) or ())
        for sub in module.modules():
            if type(sub).__name__ in layers:
                fully_shard(sub)
        fully_shard(module)

    def reshard(self, module: torch.nn.Module | None) -> None:
        """Free the gathered weights after no-grad forwards (generate, log-prob passes). FSDP2 keeps the root's
        parameters unsharded after a forward; left so, the next training backward gives the root's parameters
        (embeddings, final norm, LM head) no gradient at all (tests/test_distributed.py catches this)."""
        if module is None or not self.sharded:
            return
        from torch.distributed.fsdp import FSDPModule

        for sub in module.modules():
            if isinstance(sub, FSDPModule):
                sub.reshard()

    def full_state(self, module: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The whole state dict on the CPU: gathered from the shards on rank 0 ({} on the other ranks) when
        sharded, else the module's own. A collective when sharded: call it on every rank."""
        if not self.sharded:
            return {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def load_full_state(self, module: torch.nn.Module, state: dict[str, torch.Tensor], strict: bool = True) -> None:
        """Load a whole (unsharded) state dict; every rank passes the same one (read from the same file)."""
        if not self.sharded:
            module.load_state_dict(state, strict=strict)
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(module, state, options=StateDictOptions(full_state_dict=True, strict=strict))

    def optimizer_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        if not self.sharded:
            return optimizer.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        return get_optimizer_state_dict(model, optimizer,
                                        options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def load_optimizer_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                             state: dict[str, Any]) -> None:
        if not self.sharded:
            optimizer.load_state_dict(state)
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))

    def local(self, params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """This rank's shard of each parameter (views: writing them writes the parameters); the tensors
        themselves when not sharded."""
        return [p.to_local() if hasattr(p, "to_local") else p for p in params]

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
        """(training model, optimizer) prepared by accelerate (DDP / FSDP / DeepSpeed per the launch config).

        Called again after SFT (new trainable parameters under LoRA): accelerate's lists of prepared objects are
        cleared first, so the previous wrappers are not kept alive.
        """
        if not self.active or self.sharded:  # sharded: `shard` already wrapped the model in place
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


@contextlib.contextmanager
def _fsdp_no_sync(model: torch.nn.Module):
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def as_float(value: Any) -> float:
    """A 0-dim tensor, DTensor (e.g. the gradient norm of sharded parameters) or number as a float."""
    if hasattr(value, "full_tensor"):
        value = value.full_tensor()
    return float(value)


def launched_world_size() -> int:
    """Processes started by the launcher (torchrun / accelerate launch set WORLD_SIZE); 1 otherwise."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def make_dist(requested_device: str, sharding: str = "auto") -> tuple[Dist, torch.device | None]:
    """A Dist for this process, and the device accelerate assigned it (None for one process: the caller picks).

    Several processes on a machine without CUDA, or with train.device=cpu, use gloo on the CPU. `sharding`:
    "fsdp", "none", or "auto" (FSDP when the accelerate config says so). accelerate itself never shards on the
    CPU, so the FSDP2 wrapping is done here, the same way on CPU and GPU.
    """
    if launched_world_size() <= 1:
        if sharding == "fsdp":
            raise ValueError("train.sharding=fsdp needs several processes: start with `accelerate launch "
                             "--config_file configs/accelerate/fsdp.yaml grpo_train.py ...`")
        return Dist(None), None
    from accelerate import Accelerator

    cpu = requested_device == "cpu" or not torch.cuda.is_available()
    fsdp_launch = os.environ.get("ACCELERATE_USE_FSDP", "").lower() in ("true", "1")
    if fsdp_launch:  # accelerate would wrap at prepare(); the trainer shards itself (see Dist.shard)
        os.environ["ACCELERATE_USE_FSDP"] = "false"
    accelerator = Accelerator(cpu=cpu)
    name = "FSDP" if fsdp_launch else str(getattr(accelerator.distributed_type, "value",
                                                  accelerator.distributed_type))
    check_strategy(name)
    sharded = sharding == "fsdp" or (sharding == "auto" and name.upper().endswith("FSDP"))
    return Dist(accelerator, sharded=sharded), accelerator.device


SUPPORTED_STRATEGIES = ("NO", "MULTI_GPU", "MULTI_CPU", "FSDP")
"""Data parallel with whole-model replicas (DDP), or FSDP2 sharding. DeepSpeed needs engine-managed backward and
steps: not built yet (docs/SCALING.md)."""


def check_strategy(distributed_type: str) -> None:
    """Refuse, before any work, an accelerate strategy the trainer does not support (DeepSpeed, ...)."""
    name = distributed_type.upper().removeprefix("DISTRIBUTEDTYPE.")
    if name not in SUPPORTED_STRATEGIES:
        raise ValueError(f"accelerate distributed_type {name} is not supported yet: use data parallel "
                         "(configs/accelerate/multi_gpu.yaml) or FSDP (configs/accelerate/fsdp.yaml). For a model "
                         "that does not fit one card, also consider LoRA / QLoRA and model.gradient_checkpointing="
                         "true (docs/MEMORY.md); DeepSpeed ZeRO is planned, see docs/SCALING.md")


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
            value = (argv[i + 1] if a == flag and i + 1 < len(argv) else a.split("=", 1)[1]
                     if a.startswith(flag + "=") else None)
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
