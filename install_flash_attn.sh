#!/usr/bin/env bash
# Install FlashAttention-2 (the flash-attn package) matched to this machine's GPU, torch, CUDA and Python.
#
#   ./install_flash_attn.sh              # detect, install (prebuilt wheel when one matches, else a RAM-limited build), verify
#   ./install_flash_attn.sh --dry-run    # print the plan only
#   ./install_flash_attn.sh --python .venv/bin/python
#
# Why the care: flash-attn's setup.py first downloads a prebuilt wheel named after torch/CUDA/Python/C++ ABI
# (flash_attn-<ver>+cu12torch2.4cxx11abiFALSE-cp311-cp311-linux_x86_64.whl); when none matches it compiles ~70 CUDA
# files, and each nvcc job can take ~4 GB of RAM, so an unlimited `ninja` build runs a machine out of memory.
# FlashAttention-2 needs an NVIDIA GPU of compute capability >= 8.0 (Ampere: A100, A10, RTX 30xx; Ada: L4, RTX 40xx;
# Hopper: H100). Without it the trainer is fine: model.attn_implementation=auto falls back to PyTorch SDPA.
#
# Detection can be faked for tests (no GPU, torch or network needed):
#   FAKE_COMPUTE_CAP=8.0|none  FAKE_TORCH_VERSION=2.4.0|none  FAKE_CUDA_VERSION=12.1|none  FAKE_PYTHON=3.11
#   FAKE_RAM_GB=32  FAKE_CXX11_ABI=FALSE  FAKE_NVCC=present|missing
set -euo pipefail

GB_PER_COMPILE_JOB=4        # peak RAM of one nvcc job on flash-attn's kernels (flash-attn README: MAX_JOBS advice)
MIN_MAJOR_CC=8              # FlashAttention-2 kernels are sm80+ only
FALLBACK="The trainer does not need it: model.attn_implementation=auto uses PyTorch SDPA (same memory class, a bit slower)."

DRY_RUN=0
PY=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) DRY_RUN=1; shift ;;
    --python) PY="${2:?--python needs a path}"; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "install_flash_attn.sh: unknown argument '$1' (use --dry-run, --python PATH)" >&2; exit 2 ;;
  esac
done
if [[ -z "$PY" ]]; then
  if [[ -n "${VIRTUAL_ENV:-}" ]]; then PY="$VIRTUAL_ENV/bin/python"
  elif command -v python >/dev/null 2>&1; then PY=python
  else PY=python3; fi
fi

refuse() { echo "REFUSED: $1" >&2; echo "$FALLBACK" >&2; exit 1; }
torch_query() { "$PY" -c "import torch; $1" 2>/dev/null || true; }

# ---- compute capability: fake, else nvidia-smi, else torch
if [[ -n "${FAKE_COMPUTE_CAP:-}" ]]; then
  CC="$FAKE_COMPUTE_CAP"
elif command -v nvidia-smi >/dev/null 2>&1 && CC="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d ' ')" && [[ -n "$CC" ]]; then
  :
else
  CC="$(torch_query 'print("%d.%d" % torch.cuda.get_device_capability(0) if torch.cuda.is_available() else "none")')"
fi
[[ -z "$CC" || "$CC" == "none" ]] && refuse "no NVIDIA GPU detected (nvidia-smi found no device and torch.cuda.is_available() is False). FlashAttention-2 runs on NVIDIA GPUs only; nothing to install here."
CC_MAJOR="${CC%%.*}"
CC_MINOR="${CC#*.}"
if (( CC_MAJOR < MIN_MAJOR_CC )); then
  refuse "GPU compute capability $CC < 8.0: FlashAttention-2 needs Ampere or newer (A100, A10, RTX 30xx/40xx, L4, H100); V100 (7.0) and T4 (7.5) are not supported."
fi

# ---- torch, CUDA, Python, C++ ABI
TORCH_VERSION="${FAKE_TORCH_VERSION:-$(torch_query 'print(torch.__version__)')}"
[[ -z "$TORCH_VERSION" || "$TORCH_VERSION" == "none" ]] && refuse "torch is not importable with $PY: install the CUDA build of torch first (https://pytorch.org/get-started/locally/)."
TORCH_VERSION="${TORCH_VERSION%%+*}"                       # 2.4.0+cu121 -> 2.4.0
TORCH_MM="$(echo "$TORCH_VERSION" | cut -d. -f1,2)"         # 2.4
CUDA_VERSION="${FAKE_CUDA_VERSION:-$(torch_query 'print(torch.version.cuda)')}"
[[ -z "$CUDA_VERSION" || "$CUDA_VERSION" == "None" || "$CUDA_VERSION" == "none" ]] && refuse "torch $TORCH_VERSION is a CPU-only build (torch.version.cuda is None): install the CUDA build of torch first."
CUDA_MAJOR="${CUDA_VERSION%%.*}"
PY_VERSION="${FAKE_PYTHON:-$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')}"
PY_TAG="cp${PY_VERSION/./}"
CXX11_ABI="${FAKE_CXX11_ABI:-$(torch_query 'print(str(torch._C._GLIBCXX_USE_CXX11_ABI).upper())')}"
CXX11_ABI="${CXX11_ABI:-FALSE}"

# ---- RAM-limited build settings
if [[ -n "${FAKE_RAM_GB:-}" ]]; then RAM_GB="$FAKE_RAM_GB"
else RAM_GB=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 1024 )); fi
JOBS=$(( RAM_GB / GB_PER_COMPILE_JOB )); (( JOBS < 1 )) && JOBS=1
MAX_JOBS="${MAX_JOBS:-$JOBS}"
case "$CC_MAJOR" in 8) FA_ARCH=80 ;; 9) FA_ARCH=90 ;; 10) FA_ARCH=100 ;; *) FA_ARCH="${CC_MAJOR}0" ;; esac
if [[ -n "${FAKE_NVCC:-}" ]]; then NVCC="$FAKE_NVCC"
elif command -v nvcc >/dev/null 2>&1 || [[ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]]; then NVCC=present
else NVCC=missing; fi

FA_VERSION="${FLASH_ATTN_VERSION:-<latest>}"
WHEEL="flash_attn-${FA_VERSION}+cu${CUDA_MAJOR}torch${TORCH_MM}cxx11abi${CXX11_ABI}-${PY_TAG}-${PY_TAG}-linux_$(uname -m).whl"
PKG="flash-attn${FLASH_ATTN_VERSION:+==$FLASH_ATTN_VERSION}"

echo "GPU compute capability: $CC (sm_${CC_MAJOR}${CC_MINOR})"
echo "torch $TORCH_VERSION, CUDA $CUDA_VERSION, Python $PY_VERSION ($PY_TAG), C++11 ABI $CXX11_ABI, python: $PY"
echo "expected prebuilt wheel: $WHEEL"
echo "plan 1: pip install $PKG --no-build-isolation (setup.py downloads that wheel from the GitHub release when it exists)"
echo "plan 2: if no wheel matches, pip builds from source with: MAX_JOBS=$MAX_JOBS (RAM ${RAM_GB} GB / ${GB_PER_COMPILE_JOB} GB per nvcc job) TORCH_CUDA_ARCH_LIST=$CC FLASH_ATTN_CUDA_ARCHS=$FA_ARCH NVCC_THREADS=2"
[[ "$NVCC" == "missing" ]] && echo "warning: nvcc not found (set CUDA_HOME to a CUDA toolkit): only a prebuilt wheel can install; a source build would fail."
echo "verify: $PY -c 'import flash_attn, flash_attn_2_cuda'"
if (( DRY_RUN )); then
  echo "dry run: nothing installed."
  exit 0
fi

"$PY" -m pip install --upgrade packaging ninja wheel psutil
if ! MAX_JOBS="$MAX_JOBS" TORCH_CUDA_ARCH_LIST="$CC" FLASH_ATTN_CUDA_ARCHS="$FA_ARCH" NVCC_THREADS=2 \
     "$PY" -m pip install "$PKG" --no-build-isolation; then
  echo "FAILED: pip could not install $PKG (see the log above)." >&2
  echo "$FALLBACK" >&2
  exit 1
fi
if ! "$PY" -c 'import flash_attn, flash_attn_2_cuda; print("flash-attn", flash_attn.__version__, "imports fine")'; then
  echo "FAILED: flash-attn installed but does not import (usually a wheel built for another torch/CUDA: rerun after 'pip uninstall -y flash-attn')." >&2
  echo "$FALLBACK" >&2
  exit 1
fi
echo "done: model.attn_implementation=auto will now pick flash_attention_2 on this GPU (bf16/fp16)."
