"""The host a run gets (grpo/machine/host_resources.py): the CPU share from the affinity mask and the cgroup quota (v1
and v2, read from crafted trees), torch's thread count from train.threads, the OpenMP wait policy, the memory
readers."""

from __future__ import annotations

import sys

import pytest

from grpo.machine import host_resources
from grpo.machine.host_resources import CpuShare, cgroup_cpu_quota, host_memory, quiet_openmp, thread_count


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_cgroup_v2_quota_is_read_along_the_path_and_the_smallest_wins(tmp_path):
    write(tmp_path / "proc", "0::/a/b\n")
    write(tmp_path / "cg" / "a" / "b" / "cpu.max", "max 100000\n")
    write(tmp_path / "cg" / "a" / "cpu.max", "150000 100000\n")  # the parent's quota holds its children too
    write(tmp_path / "cg" / "cpu.max", "400000 100000\n")
    assert cgroup_cpu_quota(tmp_path / "proc", tmp_path / "cg") == 1.5


def test_no_quota_reads_as_none(tmp_path):
    write(tmp_path / "proc", "0::/\n")
    write(tmp_path / "cg" / "cpu.max", "max 100000\n")
    assert cgroup_cpu_quota(tmp_path / "proc", tmp_path / "cg") is None
    assert cgroup_cpu_quota(tmp_path / "missing", tmp_path / "cg") is None
    write(tmp_path / "v1", "4:cpu,cpuacct:/\n")
    write(tmp_path / "cg1" / "cpu,cpuacct" / "cpu.cfs_quota_us", "-1\n")  # v1's "no quota"
    write(tmp_path / "cg1" / "cpu,cpuacct" / "cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_quota(tmp_path / "v1", tmp_path / "cg1") is None


def test_a_cgroup_v1_quota_is_read_from_the_cpu_controller(tmp_path):
    write(tmp_path / "proc", "9:memory:/x\n4:cpu,cpuacct:/docker/abc\n0::/\n")
    folder = tmp_path / "cg" / "cpu,cpuacct" / "docker" / "abc"
    write(folder / "cpu.cfs_quota_us", "50000\n")
    write(folder / "cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_quota(tmp_path / "proc", tmp_path / "cg") == 0.5


def test_inside_a_cgroup_namespace_the_mount_root_is_the_group(tmp_path):
    """A container sees its own group as / in /proc/self/cgroup; the host's path need not exist under the mount."""
    write(tmp_path / "proc", "0::/kubepods/pod1/c1\n")
    write(tmp_path / "cg" / "cpu.max", "200000 100000\n")
    assert cgroup_cpu_quota(tmp_path / "proc", tmp_path / "cg") == 2.0


def test_cores_are_the_affinity_capped_by_the_quota_rounded_down_at_least_one():
    assert CpuShare(8).cores == 8
    assert CpuShare(8, 2.0).cores == 2
    assert CpuShare(8, 1.5).cores == 1  # a second thread would be throttled half of every period
    assert CpuShare(8, 0.5).cores == 1
    assert CpuShare(2, 16.0).cores == 2
    assert "2 CPU(s) in its affinity mask, no cgroup CPU quota" == CpuShare(2).describe()


def test_train_threads_zero_takes_the_cores_and_keeps_a_lower_count_set_before():
    share = CpuShare(4, 2.0)
    assert thread_count(0, 4, share) == (2, "train.threads=0: 4 CPU(s) in its affinity mask, a cgroup CPU quota of 2")
    n, why = thread_count(0, 1, share)  # OMP_NUM_THREADS=1, or a test's torch.set_num_threads(1)
    assert n == 1 and "as set before the run" in why
    assert thread_count(2, 1, share) == (2, "train.threads=2")
    n, why = thread_count(3, 1, share)  # more than the quota's cores: it runs, and says so
    assert n == 3 and "more than the 2 whole core(s) this process may keep busy" in why and "oversubscribe" in why


@pytest.mark.parametrize("threads", [5, 64, 100_000, 10**30])
def test_train_threads_over_the_cpus_of_the_process_is_refused_naming_the_field(threads):
    from grpo.config import ConfigError

    with pytest.raises(ConfigError) as err:  # 100000 failed in the reward preflight, 10**30 with OverflowError
        thread_count(threads, 1, CpuShare(4, 2.0))
    assert err.value.field == "train.threads" and "may use 4 CPU(s)" in str(err.value) and "at most 2" in str(err.value)


def test_openmp_is_asked_to_sleep_after_a_short_spin_unless_the_environment_says_how_it_waits(monkeypatch):
    """Asked in time: nothing to say (the banner said it on every run). The user's own setting: named. Torch loaded
    first: a line of its own with what spinning was measured to cost and the fix (it was a trailing clause without
    one, which a TRL script's user, whose imports put trl first, did not act on). The process's own note is this
    test's alone: left as SPINNING, every later run in the session logged host/openmp_spinning (the demo regression
    test saw a metrics row it did not record, when it ran after this one)."""
    monkeypatch.setattr(host_resources, "_openmp", {})
    env = {}
    note = quiet_openmp(env, loaded=False)
    assert env == {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "1000"} and note == ""
    for name, value in (("OMP_WAIT_POLICY", "ACTIVE"), ("GOMP_SPINCOUNT", "300000")):  # either: the user's choice
        env = {name: value}
        assert quiet_openmp(env, loaded=False) == f"OpenMP waits as {name}={value} says" and env == {name: value}
    env = {}
    note = quiet_openmp(env, loaded=True)  # torch came first: only child processes get it, and the line says so
    assert env == {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "1000"}
    assert note == host_resources.SPINNING and "spin" in note
    assert "import grpo_train before trl / torch" in note and "export OMP_WAIT_POLICY=PASSIVE" in note  # the fix
    results = (host_resources.Path(__file__).parents[1] / "benchmarks" / "RESULTS.md").read_text()
    assert '"Import order"' in note and "## Import order" in results  # the measurement the line cites


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_trainer_started_from_the_command_line_asks_before_torch_loads_openmp():
    import subprocess

    code = ("import os, grpo_train; from grpo.machine.host_resources import openmp_note; "
            "print(os.environ['OMP_WAIT_POLICY'], os.environ['GOMP_SPINCOUNT'], openmp_note())")
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run([sys.executable, "-c", code], cwd=host_resources.Path(__file__).parents[1], env=env,
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "PASSIVE 1000", out  # asked before torch loaded: the banner has nothing to say of it


def test_host_memory_reads_the_resident_set_and_its_peak(tmp_path):
    write(tmp_path / "status", "Name:\tpython\nVmHWM:\t 3145728 kB\nVmRSS:\t 1048576 kB\nThreads:\t4\n")
    assert host_memory(tmp_path / "status") == {"memory/host_rss_gb": 1.0, "memory/host_peak_gb": 3.0}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_memory_metrics_on_the_cpu_are_the_host_ones():
    import torch

    metrics = host_resources.memory_metrics(torch.device("cpu"))
    assert set(metrics) == {"memory/host_rss_gb", "memory/host_peak_gb"}
    assert 0 < metrics["memory/host_rss_gb"] <= metrics["memory/host_peak_gb"]


@pytest.mark.skipif(not sys.platform.startswith("linux") or host_resources._libc() is None
                    or getattr(host_resources._libc(), "mallinfo2", None) is None, reason="glibc 2.33+ only")
def test_freed_memory_is_handed_back_only_when_there_is_enough_of_it():
    """300 MB of 100 KB blocks (below glibc's mmap threshold: they live in its heap) freed under one block still held
    at the top, so glibc cannot shrink the heap by itself: the resident set stays until `release_freed_memory`. In a
    fresh interpreter: the test session's own heap holds what earlier tests freed, at times more than TRIM_FROM_BYTES,
    and then the first check failed (the test passed alone and failed in the full run)."""
    import subprocess

    script = """
from grpo.machine import host_resources
blocks = [bytearray(100_000) for _ in range(3000)]
last = bytearray(100_000)  # pins the top of the heap
del blocks
held = host_resources.host_memory()["memory/host_rss_gb"]
kept = not host_resources.release_freed_memory()  # below TRIM_FROM_BYTES (512 MB) free: kept, to be reused
trimmed = host_resources.release_freed_memory(at_least=2**26)
print(kept, trimmed, held - host_resources.host_memory()["memory/host_rss_gb"])
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    kept, trimmed, handed_back_gb = done.stdout.split()
    assert kept == "True" and trimmed == "True"
    assert float(handed_back_gb) > 0.2


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_trl_script_importing_trl_first_gets_the_banner_line_and_the_doctors_finding_with_the_fix():
    """TRL's order (`from trl import ...`, then grpo_train) loads torch and libgomp before `quiet_openmp`: detected
    from the process's own mappings, said on a line of its own, and logged for the report's openmp_spinning finding;
    grpo_train first is not. No timing."""
    import subprocess

    from grpo.run.doctor.end_checks import whole_run
    from grpo.run.doctor.thresholds import DoctorThresholds

    code = ("{first}; import grpo_train; from grpo.machine.host_resources import openmp_spins; "
            "from grpo.run.assembly.process import prepare_process; print(openmp_spins()); print(prepare_process(1))")
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    root = host_resources.Path(__file__).parents[1]
    trl_first, ours_first = (subprocess.run([sys.executable, "-c", code.format(first=first)], cwd=root, env=env,
                                            capture_output=True, text=True, check=True).stdout.splitlines()
                             for first in ("from trl import GRPOConfig, GRPOTrainer", "import grpo_train"))
    assert trl_first[0] == "True" and trl_first[1].startswith("CPU: 1 torch thread(s)")
    assert trl_first[2] == host_resources.SPINNING  # its own line, with the fix
    assert ours_first[0] == "False" and len(ours_first) == 2 and "spin" not in ours_first[1]
    found = whole_run([{"step": 0, "host/openmp_spinning": 1.0}], DoctorThresholds(), {}, set())
    assert [(f.level, f.code) for f in found] == [("yellow", "openmp_spinning")]
    assert "export OMP_WAIT_POLICY=PASSIVE" in found[0].suggestion and "import grpo_train before" in found[0].suggestion
    assert not whole_run([{"step": 0}], DoctorThresholds(), {}, set())
