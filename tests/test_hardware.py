"""Precision / attention selection with faked capabilities, and the live readers with a fake NVML."""

import re
import sys
import types

import pytest

from grpo.machine.hardware import (
    choose_attention,
    choose_precision,
    detect_capabilities,
    nvml_report,
    torch_allocator_report,
)


# -------------------------------------------------------------------------------------------------- precision
@pytest.mark.parametrize("cuda,bf16,expected", [
    (True, True, ("bfloat16", False)),     # A100 / H100
    (True, False, ("float16", True)),      # V100 / T4: fp16 with a GradScaler
    (False, False, ("float32", False)),    # CPU
])
def test_auto_precision(cuda, bf16, expected):
    dtype, scaler, reason = choose_precision("auto", cuda, bf16)
    assert (dtype, scaler) == expected
    assert reason.startswith("auto:")


def test_auto_precision_full_finetune_on_old_gpu_is_fp32():
    # GradScaler cannot unscale fp16 params' grads and no fp32 master copy is kept
    assert choose_precision("auto", True, False, full_finetune=True)[:2] == ("float32", False)


def test_explicit_precisions():
    assert choose_precision("bfloat16", True, True)[:2] == ("bfloat16", False)
    assert choose_precision("bfloat16", False, False)[:2] == ("bfloat16", False)   # CPU: slow but works
    assert choose_precision("float16", True, True)[:2] == ("float16", True)
    assert choose_precision("float32", True, True)[:2] == ("float32", False)
    assert choose_precision("float32", False, False)[:2] == ("float32", False)


@pytest.mark.parametrize("args,kwargs,match", [
    (("bfloat16", True, False), {}, "no bf16 support.*model.dtype=float16"),
    (("float16", False, False), {}, "needs a CUDA GPU.*float32"),
    (("float16", True, True), {"full_finetune": True}, "GradScaler cannot unscale.*model.lora=true"),
    (("fp8", True, True), {}, "unknown"),
])
def test_impossible_precisions_say_the_fix(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        choose_precision(*args, **kwargs)


# -------------------------------------------------------------------------------------------------- attention
def test_auto_attention_picks_flash_only_when_everything_allows():
    assert choose_attention("auto", True, (8, 0), "bfloat16")[0] == "flash_attention_2"
    assert choose_attention("auto", True, (9, 0), "float16")[0] == "flash_attention_2"
    impl, why = choose_attention("auto", False, (8, 0), "bfloat16")
    assert impl == "sdpa" and "does not import" in why
    impl, why = choose_attention("auto", True, (7, 5), "float16")
    assert impl == "sdpa" and "7.5 < 8.0" in why
    impl, why = choose_attention("auto", True, (8, 0), "float32")
    assert impl == "sdpa" and "float32" in why
    impl, why = choose_attention("auto", True, None, "float32")
    assert impl == "sdpa" and "no CUDA GPU" in why
    assert choose_attention("auto", False, None, "float32", sdpa_available=False)[0] == "eager"


def test_explicit_attention():
    assert choose_attention("sdpa", False, None, "float32")[0] == "sdpa"
    assert choose_attention("eager", False, None, "float32")[0] == "eager"
    assert choose_attention("flash_attention_2", True, (8, 6), "bfloat16")[0] == "flash_attention_2"


@pytest.mark.parametrize("args,match", [
    (("flash_attention_2", False, (8, 0), "bfloat16"), "does not import.*install_flash_attn.sh.*sdpa"),
    (("flash_attention_2", True, (7, 0), "float16"), "7.0 < 8.0.*install_flash_attn.sh"),
    (("flash_attention_2", True, None, "float32"), "no CUDA GPU"),
    (("flash_attention_2", True, (8, 0), "float32"), "not fp16/bf16"),
    (("sdpa", False, None, "float32", False), "torch < 2.0.*eager"),
    (("flash3", False, None, "float32"), "unknown"),
])
def test_impossible_attention_says_the_fix(args, match):
    with pytest.raises(ValueError, match=match):
        choose_attention(*args)


# -------------------------------------------------------------------------------------------------- detection
def test_detect_capabilities_without_gpu():
    torch = pytest.importorskip("torch")
    caps = detect_capabilities()
    assert caps["torch_version"] == torch.__version__
    assert caps["sdpa_available"] is True
    if not torch.cuda.is_available():
        assert caps["cuda_available"] is False and caps["compute_capability"] is None
        assert caps["bf16_supported"] is False and caps["device_count"] == 0


def test_allocator_report_never_initialises_cuda():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available() and torch.cuda.is_initialized():   # on a GPU host an earlier test initialised it
        assert "torch allocator of pid" in torch_allocator_report() and "peak allocated" in torch_allocator_report()
        return
    assert "has not initialised CUDA" in torch_allocator_report()
    assert not torch.cuda.is_initialized()


# -------------------------------------------------------------------------------------------------- fake NVML
class _NVMLError(Exception):
    pass


def _fake_pynvml(procs, init_error=None):
    mib = 2**20
    m = types.SimpleNamespace(NVMLError=_NVMLError)
    m.nvmlInit = lambda: (_ for _ in ()).throw(init_error) if init_error else None
    m.nvmlShutdown = lambda: None
    m.nvmlSystemGetDriverVersion = lambda: b"550.54.15"
    m.nvmlDeviceGetCount = lambda: 1
    m.nvmlDeviceGetHandleByIndex = lambda i: f"h{i}"
    m.nvmlDeviceGetName = lambda h: "NVIDIA A100-SXM4-40GB"
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=40960 * mib, used=18432 * mib,
                                                                 free=22528 * mib)
    m.nvmlDeviceGetComputeRunningProcesses = lambda h: procs
    m.nvmlDeviceGetGraphicsRunningProcesses = lambda h: []
    names = {4242: b"python grpo_train.py"}

    def name(pid):
        if pid not in names:
            raise _NVMLError("Not Found")
        return names[pid]
    m.nvmlSystemGetProcessName = name
    return m


def test_nvml_report_lists_every_gpu_and_process():
    mib = 2**20
    procs = [types.SimpleNamespace(pid=4242, usedGpuMemory=17000 * mib),
             types.SimpleNamespace(pid=99999999, usedGpuMemory=None)]
    found, text = nvml_report(_fake_pynvml(procs))
    assert found
    assert "GPU 0 NVIDIA A100-SXM4-40GB: total 40,960 MiB, used 18,432 MiB, free 22,528 MiB" in text
    assert re.search(r"pid\s+4242\s+17,000 MiB\s+python grpo_train.py", text)
    assert "pid 99999999" in text and "hidden by the driver" in text


def test_nvml_report_without_driver_or_module(monkeypatch):
    found, text = nvml_report(_fake_pynvml([], init_error=_NVMLError("Driver Not Loaded")))
    assert not found and "No NVIDIA driver/GPU reachable" in text and "Driver Not Loaded" in text
    monkeypatch.setitem(sys.modules, "pynvml", None)   # makes `import pynvml` raise ImportError
    found, text = nvml_report()
    assert not found and "pip install nvidia-ml-py" in text
