"""The host a run's process gets: the CPU it may use and torch's threads sized to it, an OpenMP that sleeps instead of
spinning while it waits, and host / GPU memory readings, with the allocator's freed memory handed back to the system.

Why: on a machine shared with other work, the CPU a process may use is its affinity mask and its cgroup CPU quota (a
container's `--cpus`), not `os.cpu_count()`; and libgomp's threads spin for milliseconds on a core between two
parallel regions, which a busy neighbour then has to share with them (`benchmarks/busy_neighbours.py` measures it).
On the host memory: glibc keeps the memory a finished phase freed in its heaps, so a run's resident set stays at its
largest phase's until something hands it back (`release_freed_memory`).

Standard library only at import (torch is imported inside the GPU readers): `grpo_train` imports this module before
torch, so that `quiet_openmp` sets the wait before torch loads libgomp, which reads it once, at load."""

from __future__ import annotations

import ctypes
import functools
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, MutableMapping

__all__ = ["memory_metrics", "quiet_openmp"]
"""The names the entry point takes from this module, its face (tests/test_house.py); the rest serve the package."""

GB = 2**30
"""The memory/ metrics count GiB (2^30 bytes), as `free -g` and /proc's kB (KiB) do."""
OPENMP_WAIT = {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "1000"}
"""How a run asks OpenMP's idle threads to wait: sleep in the kernel after a short spin, instead of spinning ~3 ms
(libgomp's default, 300000 spins) on a core that a busy neighbour then shares with them. libgomp (torch's Linux
wheels) takes GOMP_SPINCOUNT over the policy: 1000 spins, the count it uses itself when it has more threads than
CPUs; other runtimes take the policy. PASSIVE alone (no spin) costs an idle run a wake-up per parallel region; the
short spin keeps the idle time and the gain beside busy processes (`benchmarks/busy_neighbours.py`; the figures are
in benchmarks/RESULTS.md, "Beside busy neighbours")."""

_openmp: dict[str, str] = {}
"""What `quiet_openmp` found, for `openmp_note` (process state, as the environment variable is)."""


def libgomp_loaded(maps: str = "/proc/self/maps") -> bool:
    """Whether this process has loaded an OpenMP runtime already (libgomp / libiomp / libomp mapped); where /proc is
    missing, whether torch is imported (it loads one)."""
    try:
        text = Path(maps).read_text()
    except OSError:
        return "torch" in sys.modules
    return any(name in text for name in ("libgomp", "libiomp", "libomp"))


def _named(environ: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={environ[k]}" for k in OPENMP_WAIT if environ.get(k))


SPINNING = ("OpenMP: its threads spin while they wait, because torch was imported before grpo_train (a TRL script's "
            "`from trl import ...` first does it), and this process can no longer ask them to sleep; beside busy "
            "processes the run takes about twice as long (benchmarks/RESULTS.md, \"Import order\"). Fix: import "
            "grpo_train before trl / torch, or `export OMP_WAIT_POLICY=PASSIVE` before starting python")
"""The banner's line (its own, after the CPU line) when torch loaded OpenMP before `quiet_openmp` could ask: libgomp
reads its wait policy once, when it loads, and exports no way to change it later; the run's report repeats it as the
doctor's openmp_spinning finding."""


def quiet_openmp(environ: MutableMapping[str, str] = os.environ, loaded: bool | None = None) -> str:
    """Ask OpenMP's idle threads to sleep after a short spin (OPENMP_WAIT), unless the environment already says how
    they wait (OMP_WAIT_POLICY or GOMP_SPINCOUNT). Returns what the banner says of it, `openmp_note`'s line: nothing
    when the wait is ours (nothing for the user to do), the user's own setting, or SPINNING. Effective only before
    the OpenMP runtime loads (before `import torch`), which reads them once; after, they reach child processes only."""
    loaded = libgomp_loaded() if loaded is None else loaded
    if own := _named(environ):
        note = f"OpenMP waits as {own} says"
    else:
        environ.update(OPENMP_WAIT)
        note = SPINNING if loaded else ""
    _openmp["note"] = note
    return note


def openmp_spins() -> bool:
    """Whether this process's OpenMP threads spin while they wait: torch loaded OpenMP before `quiet_openmp` asked
    and the environment says nothing of the wait (the run logs host/openmp_spinning for the doctor)."""
    return openmp_note() == SPINNING


def openmp_note() -> str:
    """What the banner says of OpenMP's wait in this process, as `quiet_openmp` left it ("" when it asked in time;
    when nothing called it, the user's setting or SPINNING)."""
    own = _named(os.environ)
    if "note" in _openmp:
        return _openmp["note"]
    return f"OpenMP waits as {own} says" if own else SPINNING


# ------------------------------------------------------------------------------------------------ the CPU share
def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _along(base: Path, path: str) -> list[Path]:
    """`base`/`path` and each of its parents up to `base` (a quota anywhere above a group applies to it too); the
    folders that exist. Inside a container's cgroup namespace `path` is "/" and `base` is the container's group."""
    parts = [p for p in path.split("/") if p]
    return [d for d in (base.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)) if d.is_dir()]


def _v2_quota(folder: Path) -> float | None:
    text = _read(folder / "cpu.max")  # "max 100000" (none) or "150000 100000": quota and period in µs
    if not text or text.split()[0] == "max":
        return None
    quota, period = (text.split() + ["100000"])[:2]
    return int(quota) / int(period) if int(period) > 0 else None


def _v1_quota(folder: Path) -> float | None:
    quota, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
    if quota is None or period is None or int(quota) <= 0 or int(period) <= 0:  # -1: no quota
        return None
    return int(quota) / int(period)


def cgroup_cpu_quota(proc_cgroup: str | Path = "/proc/self/cgroup", root: str | Path = "/sys/fs/cgroup"
                     ) -> float | None:
    """The CPUs this process's cgroups allow it (quota / period), the smallest along its cgroup path; None when no
    quota applies or none can be read. cgroup v2 (`0::/path`, `cpu.max`) and v1 (the `cpu` controller's
    `cpu.cfs_quota_us` / `cpu.cfs_period_us`, mounted at root/cpu or root/cpu,cpuacct)."""
    text = _read(Path(proc_cgroup))
    root = Path(root)
    quotas: list[float] = []
    for line in (text or "").splitlines():
        hierarchy, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if hierarchy == "0" and not controllers:
            quotas += [q for d in _along(root, path) if (q := _v2_quota(d)) is not None]
        elif "cpu" in controllers.split(","):
            for mount in dict.fromkeys((root / controllers, root / "cpu", root / "cpu,cpuacct")):
                quotas += [q for d in _along(mount, path) if (q := _v1_quota(d)) is not None]
    return min(quotas) if quotas else None


@dataclass(frozen=True)
class CpuShare:
    """The CPU this process may use: the CPUs of its affinity mask, and its cgroup quota in CPUs (None = none)."""

    affinity: int
    quota: float | None = None

    @property
    def cores(self) -> int:
        """Whole cores it may keep busy: the affinity mask's CPUs, at most the quota rounded down (a thread more than
        the quota is throttled: all its threads stop until the next period), at least 1."""
        quota = self.affinity if self.quota is None else max(1, math.floor(self.quota + 1e-9))
        return max(1, min(self.affinity, quota))

    def describe(self) -> str:
        quota = "no cgroup CPU quota" if self.quota is None else f"a cgroup CPU quota of {self.quota:g}"
        return f"{self.affinity} CPU(s) in its affinity mask, {quota}"


def cpu_share() -> CpuShare:
    """This process's CpuShare: `os.sched_getaffinity` (os.cpu_count where it is missing) and `cgroup_cpu_quota`."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows: no affinity call
        affinity = os.cpu_count() or 1
    return CpuShare(affinity, cgroup_cpu_quota())


def thread_count(requested: int, current: int, share: CpuShare) -> tuple[int, str]:
    """(torch's intra-op threads, why) for train.threads = `requested`: that number when > 0 (more than the CPUs of
    the process's affinity mask is a ConfigError: such threads only wait for each other, and far more fail to start
    or overflow; more than its whole cores is said in `why`: they oversubscribe them); 0 = the process's whole cores
    (`CpuShare.cores`), kept at `current` (torch's count now) when that is lower, as OMP_NUM_THREADS or an earlier
    torch.set_num_threads made it."""
    if requested > share.affinity:
        from grpo.config import field_error

        raise field_error("train.threads", requested, f"this process may use {share.affinity} CPU(s) "
                          f"({share.describe()}): use at most {share.cores}, or 0 (the cores it may use)")
    if requested > share.cores:
        return requested, (f"train.threads={requested}, more than the {share.cores} whole core(s) this process may "
                           f"keep busy ({share.describe()}): its threads oversubscribe them")
    if requested > 0:
        return requested, f"train.threads={requested}"
    cores = share.cores
    if current < cores:
        return current, f"as set before the run (OMP_NUM_THREADS or torch.set_num_threads), below {cores} cores"
    return cores, f"train.threads=0: {share.describe()}"


# ------------------------------------------------------------------------------------------------ memory
def host_memory(status: str | Path = "/proc/self/status") -> dict[str, float]:
    """memory/host_rss_gb (this process's resident memory now, VmRSS) and memory/host_peak_gb (the most it held since
    it started, VmHWM), in GiB, from /proc on Linux; elsewhere the peak alone (getrusage's ru_maxrss)."""
    text = _read(Path(status))
    fields = {}
    for line in (text or "").splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM") and rest.split():
            fields[key] = int(rest.split()[0]) * 1024 / GB  # kB
    if "VmRSS" in fields:
        return {"memory/host_rss_gb": fields["VmRSS"], "memory/host_peak_gb": fields.get("VmHWM", fields["VmRSS"])}
    try:
        import resource
    except ImportError:  # Windows
        return {}
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"memory/host_peak_gb": peak / (GB if sys.platform == "darwin" else GB / 1024)}  # bytes on macOS, else KiB


def gpu_memory(device: Any) -> dict[str, float]:
    """memory/gpu_allocated_gb and memory/gpu_reserved_gb (torch's allocator now) and memory/gpu_peak_gb (the most
    allocated since the process started) of `device`, in GiB; {} unless it is a CUDA device already in use."""
    if getattr(device, "type", None) != "cuda":
        return {}
    import torch

    if not torch.cuda.is_initialized():
        return {}
    return {"memory/gpu_allocated_gb": torch.cuda.memory_allocated(device) / GB,
            "memory/gpu_reserved_gb": torch.cuda.memory_reserved(device) / GB,
            "memory/gpu_peak_gb": torch.cuda.max_memory_allocated(device) / GB}


@functools.cache
def _libc() -> Any:
    """The C library's symbols, looked up once (every logged row asks)."""
    try:
        return ctypes.CDLL(None)  # the symbols this process has: glibc's, where it is the C library
    except OSError:
        return None


class _MallInfo2(ctypes.Structure):
    """glibc's `struct mallinfo2` (2.33+): byte counts of all its arenas."""

    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


TRIM_FROM_BYTES = 512 * 2**20
"""Free memory glibc must hold before `release_freed_memory` hands it back. What is handed back is faulted in again
(zeroed pages) when the next step allocates it: the demo frees part of its memory every step, and handing that
back every step cost it more than it saved; `--preset smollm2-tools` kept gigabytes free after its warm-up and after
an RL step before its micro-batches shrank (benchmarks/RESULTS.md, "Beside busy neighbours", says why; the sizes:
docs/RESULTS.md, "Figures behind constants")."""


def release_freed_memory(at_least: int = TRIM_FROM_BYTES) -> bool:
    """Hand the memory glibc holds freed back to the system (`malloc_trim(0)`: the free pages inside its heaps too,
    not only at their top) when it holds `at_least` bytes free. Without it a run's resident set stays near its
    largest phase's: `--preset smollm2-tools` held 5.8 GB after its SFT warm-up and 6.8 GB after an RL step, 1.0 GB
    once trimmed. Returns whether it trimmed (never without glibc: musl, macOS, Windows)."""
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None) if libc is not None else None
    info = getattr(libc, "mallinfo2", None) if libc is not None else None
    if trim is None:
        return False
    if info is not None:
        info.restype = _MallInfo2
        if info().fordblks < at_least:
            return False
    trim(0)
    return True


def memory_metrics(device: Any) -> dict[str, float]:
    """The memory/ metrics of a logged row: glibc's free memory handed back first when it holds TRIM_FROM_BYTES
    (`release_freed_memory`), so that memory/host_rss_gb is near what the process uses, not what a past phase left in
    its allocator; then `host_memory` and `gpu_memory`."""
    release_freed_memory()
    return {**host_memory(), **gpu_memory(device)}
