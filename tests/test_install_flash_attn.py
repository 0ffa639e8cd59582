"""install_flash_attn.sh --dry-run: detection and the plan, with faked GPU / torch / CUDA / RAM (no GPU needed)."""

import os
import shutil
import subprocess

import pytest
from conftest import ROOT

SCRIPT = ROOT / "install_flash_attn.sh"
A100_TORCH24 = {"FAKE_COMPUTE_CAP": "8.0", "FAKE_TORCH_VERSION": "2.4.0+cu121", "FAKE_CUDA_VERSION": "12.1",
                "FAKE_RAM_GB": "32", "FAKE_PYTHON": "3.11", "FAKE_CXX11_ABI": "FALSE", "FAKE_NVCC": "present"}

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")


def run(fakes, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_") and k != "MAX_JOBS"}
    env.update(fakes)
    return subprocess.run(["bash", str(SCRIPT), "--dry-run", *args], capture_output=True, text=True, env=env,
                          timeout=60)


def test_a100_plan():
    out = run(A100_TORCH24)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "GPU compute capability: 8.0 (sm_80)" in lines
    assert any(line.startswith("torch 2.4.0, CUDA 12.1, Python 3.11 (cp311), C++11 ABI FALSE") for line in lines)
    assert "+cu12torch2.4cxx11abiFALSE-cp311-cp311-linux_" in out.stdout
    assert "pip install flash-attn --no-build-isolation" in out.stdout
    assert "MAX_JOBS=8 (RAM 32 GB / 4 GB per nvcc job)" in out.stdout   # 32 / 4 = 8
    assert "TORCH_CUDA_ARCH_LIST=8.0" in out.stdout and "FLASH_ATTN_CUDA_ARCHS=80" in out.stdout
    assert "dry run: nothing installed." in out.stdout


def test_small_ram_and_ada_gpu():
    out = run({**A100_TORCH24, "FAKE_COMPUTE_CAP": "8.9", "FAKE_RAM_GB": "3", "FAKE_NVCC": "missing"})
    assert out.returncode == 0, out.stderr
    assert "MAX_JOBS=1 " in out.stdout                                   # 3 // 4 = 0 → at least 1
    assert "TORCH_CUDA_ARCH_LIST=8.9" in out.stdout and "FLASH_ATTN_CUDA_ARCHS=80" in out.stdout
    assert "nvcc not found" in out.stdout


def test_hopper_arch():
    out = run({**A100_TORCH24, "FAKE_COMPUTE_CAP": "9.0", "FAKE_RAM_GB": "128"})
    assert "TORCH_CUDA_ARCH_LIST=9.0" in out.stdout and "FLASH_ATTN_CUDA_ARCHS=90" in out.stdout
    assert "MAX_JOBS=32 " in out.stdout


def test_refuses_turing():
    out = run({**A100_TORCH24, "FAKE_COMPUTE_CAP": "7.5"})
    assert out.returncode == 1
    assert "REFUSED: GPU compute capability 7.5 < 8.0" in out.stderr
    assert "SDPA" in out.stderr                                          # says how the trainer falls back
    assert "plan 1" not in out.stdout


def test_refuses_without_gpu():
    out = run({**A100_TORCH24, "FAKE_COMPUTE_CAP": "none"})
    assert out.returncode == 1
    assert "REFUSED: no NVIDIA GPU detected" in out.stderr and "SDPA" in out.stderr


def test_refuses_cpu_torch():
    out = run({**A100_TORCH24, "FAKE_CUDA_VERSION": "none"})
    assert out.returncode == 1 and "CPU-only build" in out.stderr
