"""Host syncs and aten ops per phase of one RL step, counted on the CPU.

    python -m benchmarks.host_syncs [--new 32] [--engine graph]

A host sync is an op that brings a value from the device to the host: `.item()` / `float(t)` / `int(t)` / `bool(t)`
(aten `_local_scalar_dense`), ops whose output shape depends on the data (`nonzero`, `masked_select`, `unique`),
`equal`, `is_nonzero`, and `Tensor.tolist()` / `.numpy()` / `.cpu()` (which copy to the host without an aten op on
the CPU, so they are counted by wrapping those methods). On a GPU each one waits for the launch queue to drain. The
counts are the same on the CPU as on CUDA when the loop takes its CUDA settings (`cuda_cadence`: the decoding loops
read "rows still running" every SYNC_EVERY steps, as they do on an accelerator). Each sync is attributed to the
innermost call site in the project (grpo/, grpo_train.py), or to the library that made it.

The workload is vs_trl.py's --quick one (a tiny Llama, 2 prompts × K 4 × 2 micro-steps, forced full-length
completions, β > 0): tests/test_host_syncs.py holds each phase to a budget.
"""

from __future__ import annotations

import collections
import contextlib
import sys
import traceback
from pathlib import Path
from typing import Any, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
SYNC_OPS = frozenset({"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2", "unique_consecutive",
                      "equal", "is_nonzero"})
HOST_COPIES = ("tolist", "numpy", "cpu")
PHASES = (("generate", "generation", "generate"), ("reward", "rewarder", "score"),
          ("advantages", "rewarder", "advantages"), ("old_logps", "updater", "batch"),
          ("ref_logps", "updater", "reference_logps"), ("update", "updater", "update"))
"""(phase, owner attribute of the Run, method): the phases of grpo_train.rl_step."""


def call_site() -> str:
    """'path:function' of the innermost frame in the project, else of the innermost library frame outside torch."""
    frames = [f for f in traceback.extract_stack()[:-1] if f.filename != __file__]
    mine = [f for f in frames if f.filename.startswith(str(ROOT)) and "/.venv/" not in f.filename]
    if mine:
        f = mine[-1]
        return f"{Path(f.filename).relative_to(ROOT)}:{f.name}"
    other = [f for f in frames if "/torch/" not in f.filename]
    f = other[-1] if other else frames[-1]
    return f"{f.filename.split('site-packages/')[-1]}:{f.name}"


class SyncCounter(TorchDispatchMode):
    """Counts aten ops, and host syncs by call site, while active."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0
        self.syncs: collections.Counter[str] = collections.Counter()
        self._saved: dict[str, Any] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        if func.overloadpacket.__name__ in SYNC_OPS:
            self.syncs[f"{call_site()} ({func.overloadpacket.__name__})"] += 1
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        for name in HOST_COPIES:
            original = getattr(torch.Tensor, name)
            self._saved[name] = original

            def wrapped(tensor, *args, _original=original, _name=name, **kwargs):
                self.syncs[f"{call_site()} ({_name})"] += 1
                return _original(tensor, *args, **kwargs)

            setattr(torch.Tensor, name, wrapped)
        return super().__enter__()

    def __exit__(self, *exc):
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)
        return super().__exit__(*exc)

    @property
    def total(self) -> int:
        return sum(self.syncs.values())


@contextlib.contextmanager
def cuda_cadence() -> Iterator[None]:
    """The decoding loops' accelerator settings on the CPU: "rows still running" read every few steps, not every
    step (the CPU reads it every step because a read costs nothing there)."""
    import grpo.decoding.decode as lean
    import grpo.decoding.graph_decode as graph

    saved = lean._sync_every, graph.sync_every
    lean._sync_every = lambda device: 8
    graph.sync_every = lambda device: graph.SYNC_EVERY
    try:
        yield
    finally:
        lean._sync_every, graph.sync_every = saved


def count_step(run: Any, step: int) -> dict[str, SyncCounter]:
    """Run grpo_train.rl_step(run, step) with every phase counted: {phase: its counter}."""
    import grpo_train

    counters: dict[str, SyncCounter] = {}
    restore = []
    for phase, owner_name, method in PHASES:
        owner = getattr(run, owner_name)
        shipped = getattr(owner, method)

        def counted(*args, _shipped=shipped, _phase=phase, **kwargs):
            with SyncCounter() as counter:
                out = _shipped(*args, **kwargs)
            counters[_phase] = counter
            return out

        setattr(owner, method, counted)
        restore.append((owner, method))
    try:
        with cuda_cadence():
            grpo_train.rl_step(run, step)
    finally:
        for owner, method in restore:
            delattr(owner, method)  # the instance attribute goes; the class's method shows through again
    return counters


def quick_run(work: Path, new_tokens: int = 32, engine: str = "graph"):
    """grpo_train.setup of vs_trl.py's --quick workload (tiny Llama, fp32) in `work`, with rollout.engine=`engine`."""
    import grpo_train
    from benchmarks import common, vs_trl

    spec = vs_trl.scenario("grpo", dict(vs_trl.PRESETS["quick"]["base"], max_new_tokens=new_tokens, cycles=4,
                                        warmup_cycles=1))
    model_dir = work / "model"
    common.build_and_save_model(common.SHAPES["tiny"], model_dir, seed=0, dtype_name="float32")
    cfg = vs_trl._our_config(spec, str(model_dir), str(work / "run"))
    cfg.rollout.engine = engine
    return grpo_train.setup(cfg), spec


def table(counters: dict[str, SyncCounter]) -> str:
    lines = [f"{'phase':10s} {'aten ops':>9s} {'host syncs':>10s}  where"]
    for phase, counter in counters.items():
        lines.append(f"{phase:10s} {counter.ops:9d} {counter.total:10d}  "
                     + ", ".join(f"{site} x{n}" for site, n in counter.syncs.most_common()))
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    import argparse
    import tempfile

    p = argparse.ArgumentParser(prog="python -m benchmarks.host_syncs", description=__doc__.split("\n\n")[0])
    p.add_argument("--new", type=int, default=32, help="forced completion tokens")
    p.add_argument("--engine", default="graph", help="rollout.engine (auto | lean | graph | hf)")
    args = p.parse_args(argv)
    import grpo_train

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        run, spec = quick_run(Path(tmp), args.new, args.engine)
        for step in (1, 2):  # warm: the first steps build what later steps reuse
            grpo_train.rl_step(run, step)
        counters = count_step(run, 3)
    print(f"workload: tiny llama, {spec.prompts_per_cycle} prompts x K {spec.k}, {args.new} forced tokens, "
          f"grad_accum {spec.grad_accum}, engine {args.engine}, the CUDA cadence")
    print(table(counters))
    generate = counters.get("generate")
    if generate is not None:
        print(f"aten ops per decode step: {generate.ops / args.new:.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
