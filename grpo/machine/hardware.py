"""Precision and attention selection (pure, testable with faked capabilities) and live GPU readers (NVML, torch).

Rules (one line each, with the source):
- bf16 needs compute capability ≥ 8.0 (Ampere): `torch.cuda.is_bf16_supported()`          (NVIDIA Ampere whitepaper)
- fp16 training scales the loss so small grads do not flush to zero: `torch.amp.GradScaler`   (arXiv 1710.03740)
- GradScaler refuses to unscale fp16 *parameter* grads: fp16 works under LoRA (fp32 adapters) but full fine-tuning in
  fp16 would need fp32 master weights, which this trainer does not keep                   (torch/amp/grad_scaler.py)
- FlashAttention-2 needs cc ≥ 8.0 and fp16/bf16 inputs                           (Dao 2023, arXiv 2307.08691; README)

What we rely on for mixed precision under LoRA: peft ≥ 0.12 `get_peft_model(..., autocast_adapter_dtype=True)` (the
default, checked in peft 0.21 `tuners_utils.cast_adapter_dtype`) upcasts the LoRA A/B weights of a bf16/fp16 base to
fp32. So the trainable parameters, their grads and the AdamW states are fp32 while the frozen base stays in 16 bits, and
peft casts each adapted layer's input to fp32 before lora_A (`_cast_input_dtype`): adapter math and updates run in fp32.
Do not pass `autocast_adapter_dtype=False`: bf16 adapters would take AdamW updates in bf16 (8 mantissa bits) and tiny
updates of r×d matrices round away.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

PRECISIONS = ("auto", "bfloat16", "float16", "float32")
ATTENTIONS = ("auto", "flash_attention_2", "sdpa", "eager")
FLASH_MIN_CC = (8, 0)
"""FlashAttention-2 kernels are built for sm80+ (A100, A10, RTX 30xx/40xx, L4, H100)."""
BF16_MIN_CC = (8, 0)
MIB = 2**20
FLASH_FIX = ("run ./install_flash_attn.sh (it picks or builds a matching wheel), or set "
             "model.attn_implementation=sdpa (PyTorch's fused attention: same memory class, a little slower)")


def choose_precision(requested: str, cuda_available: bool, bf16_supported: bool,
                     full_finetune: bool = False) -> tuple[str, bool, str]:
    """(dtype_name, use_grad_scaler, reason) for `requested` on this hardware; ValueError for an impossible request.

    auto: bf16 on a GPU that supports it, fp16 + GradScaler on an older GPU, fp32 on CPU.
    """
    if requested not in PRECISIONS:
        raise ValueError(f"model.dtype={requested!r} is unknown: use one of {list(PRECISIONS)}")
    if requested == "float32":
        return "float32", False, "float32 requested: full precision, 2× the weight memory of bf16"
    if requested == "bfloat16":
        if cuda_available and not bf16_supported:
            raise ValueError("model.dtype=bfloat16 but this GPU has no bf16 support (needs compute capability >= 8.0, "
                             "Ampere or newer): set model.dtype=float16 (trained with a GradScaler) or "
                             "model.dtype=auto")
        where = "GPU supports bf16" if cuda_available else "CPU: bf16 works but is slow; use it for tests only"
        return "bfloat16", False, f"bfloat16 requested; {where}"
    if requested == "float16":
        if not cuda_available:
            raise ValueError("model.dtype=float16 needs a CUDA GPU (fp16 training relies on a CUDA GradScaler): "
                             "on CPU use model.dtype=float32 (or auto)")
        _check_fp16_full_ft(full_finetune)
        return "float16", True, "float16 requested: loss scaled by a GradScaler so small grads do not underflow"
    if not cuda_available:
        return "float32", False, "auto: no CUDA GPU, so float32 (CPU half precision is slow and fp16 lacks a scaler)"
    if bf16_supported:
        return "bfloat16", False, "auto: GPU supports bf16 (fp32 range, no loss scaling needed)"
    if full_finetune:
        return "float32", False, ("auto: GPU lacks bf16 and full fine-tuning in fp16 needs fp32 master weights, "
                                  "so float32 (use LoRA to train in fp16 on this GPU)")
    return "float16", True, "auto: GPU lacks bf16 (compute capability < 8.0), so float16 with a GradScaler"


def _check_fp16_full_ft(full_finetune: bool) -> None:
    if full_finetune:
        raise ValueError("model.dtype=float16 with full fine-tuning: GradScaler cannot unscale fp16 parameters' grads "
                         "and this trainer keeps no fp32 master copy; set model.lora=true, or model.dtype=float32 "
                         "(or bfloat16 on an Ampere+ GPU)")


def choose_attention(requested: str, flash_attn_importable: bool, compute_capability: tuple[int, int] | None,
                     dtype_name: str, sdpa_available: bool = True) -> tuple[str, str]:
    """(attn_implementation for from_pretrained, reason); ValueError naming the fix for an impossible request.

    auto: flash_attention_2 when flash_attn imports, the GPU has cc ≥ 8.0 and dtype is fp16/bf16; else sdpa; else
    eager.
    """
    if requested not in ATTENTIONS:
        raise ValueError(f"model.attn_implementation={requested!r} is unknown: use one of {list(ATTENTIONS)}")
    half = dtype_name in ("float16", "bfloat16")
    why_not_flash = _flash_blocker(flash_attn_importable, compute_capability, half, dtype_name)
    if requested == "flash_attention_2":
        if why_not_flash:
            raise ValueError(f"model.attn_implementation=flash_attention_2 but {why_not_flash}: {FLASH_FIX}")
        return "flash_attention_2", "flash_attention_2 requested and supported"
    if requested == "eager":
        return "eager", "eager requested (materialises the S×S attention matrix: most memory)"
    if requested == "sdpa":
        if not sdpa_available:
            raise ValueError("model.attn_implementation=sdpa but torch.nn.functional.scaled_dot_product_attention is "
                             "missing (torch < 2.0): upgrade torch, or set model.attn_implementation=eager")
        return "sdpa", "sdpa requested"
    if not why_not_flash:
        return "flash_attention_2", f"auto: flash_attn imports, GPU cc {compute_capability} ≥ 8.0, dtype {dtype_name}"
    if sdpa_available:
        return "sdpa", f"auto: sdpa because {why_not_flash}"
    return "eager", f"auto: eager because {why_not_flash} and torch lacks scaled_dot_product_attention"


def _flash_blocker(importable: bool, cc: tuple[int, int] | None, half: bool, dtype_name: str) -> str:
    """Why FlashAttention-2 cannot run here, or "" when it can."""
    if cc is None:
        return "there is no CUDA GPU (FlashAttention-2 is CUDA only)"
    if tuple(cc) < FLASH_MIN_CC:
        return f"the GPU has compute capability {cc[0]}.{cc[1]} < 8.0 (FlashAttention-2 needs Ampere or newer)"
    if not importable:
        return "the flash_attn package does not import"
    if not half:
        return f"dtype {dtype_name} is not fp16/bf16 (FlashAttention-2 kernels take half precision only)"
    return ""


def detect_capabilities() -> dict[str, Any]:
    """What this machine offers, read from torch.cuda (no GPU needed; never initialises more than device queries).

    Keys: cuda_available, device_count, device_name, compute_capability (tuple | None), bf16_supported, sdpa_available,
    flash_attn_importable, flash_attn_version, torch_version, cuda_version.
    """
    import torch

    cuda = torch.cuda.is_available()
    cc = tuple(torch.cuda.get_device_capability(0)) if cuda else None
    flash_ok, flash_version = _try_import_flash_attn()
    return {
        "cuda_available": cuda,
        "device_count": torch.cuda.device_count() if cuda else 0,
        "device_name": torch.cuda.get_device_name(0) if cuda else None,
        "compute_capability": cc,
        "bf16_supported": bool(cuda and torch.cuda.is_bf16_supported()),
        "sdpa_available": hasattr(torch.nn.functional, "scaled_dot_product_attention"),
        "flash_attn_importable": flash_ok,
        "flash_attn_version": flash_version,
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
    }


def _try_import_flash_attn() -> tuple[bool, str | None]:
    """(importable, version): an installed wheel built for another torch fails with ImportError/OSError (bad ABI)."""
    try:
        module = importlib.import_module("flash_attn")
    except (ImportError, OSError, RuntimeError):
        return False, None
    return True, getattr(module, "__version__", "unknown")


# ------------------------------------------------------------------------------------------------ live readers
def nvml_report(pynvml: Any = None) -> tuple[bool, str]:
    """(found a GPU, text): every GPU's total/used/free memory and every process on it, via NVML.

    NVML comes from `pip install nvidia-ml-py` (module `pynvml`), imported here lazily; tests pass a fake module.
    """
    if pynvml is None:
        try:
            pynvml = importlib.import_module("pynvml")
        except ImportError:
            return False, "NVML unavailable: pynvml is not installed (pip install nvidia-ml-py); no per-process use."
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        return False, f"No NVIDIA driver/GPU reachable through NVML ({err})."
    try:
        count = pynvml.nvmlDeviceGetCount()
        lines = [f"NVIDIA driver {_text(pynvml.nvmlSystemGetDriverVersion())}, {count} GPU(s)"]
        for i in range(count):
            lines += _device_lines(pynvml, i)
        return count > 0, "\n".join(lines)
    finally:
        pynvml.nvmlShutdown()


def _device_lines(pynvml: Any, index: int) -> list[str]:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
    lines = [f"GPU {index} {_text(pynvml.nvmlDeviceGetName(handle))}: total {mem.total / MIB:,.0f} MiB, "
             f"used {mem.used / MIB:,.0f} MiB, free {mem.free / MIB:,.0f} MiB"]
    procs = {}
    for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        try:
            for p in getattr(pynvml, getter)(handle):
                procs[p.pid] = p.usedGpuMemory
        except pynvml.NVMLError as err:
            lines.append(f"  ({getter} failed: {err})")
    if not procs:
        lines.append("  no processes")
    for pid, used in sorted(procs.items()):
        amount = "n/a (hidden by the driver, e.g. in a container)" if used is None else f"{used / MIB:,.0f} MiB"
        lines.append(f"  pid {pid:>7} {amount:>12}  {_process_name(pynvml, pid)}")
    return lines


def _process_name(pynvml: Any, pid: int) -> str:
    try:
        return _text(pynvml.nvmlSystemGetProcessName(pid))
    except pynvml.NVMLError:
        pass
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip() or "?"
    except OSError:
        return "? (process in another namespace)"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def torch_allocator_report() -> str:
    """This process's torch allocator stats per device, if it already uses CUDA (never creates a context)."""
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return "this process has not initialised CUDA: no torch allocator stats"
    lines = [f"torch allocator of pid {os.getpid()}:"]
    for i in range(torch.cuda.device_count()):
        lines.append(f"  cuda:{i} allocated {torch.cuda.memory_allocated(i) / MIB:,.0f} MiB, reserved "
                     f"{torch.cuda.memory_reserved(i) / MIB:,.0f} MiB, peak allocated "
                     f"{torch.cuda.max_memory_allocated(i) / MIB:,.0f} MiB")
    return "\n".join(lines)


def live_gpu_report() -> str:
    """NVML view of every GPU and process plus, inside a training process, its own torch allocator stats."""
    return nvml_report()[1] + "\n" + torch_allocator_report()
