"""GPU memory: what is used now (live), or what a config will need (estimate). Installed with the package as the
command `grpo-check-gpu-memory`; in a checkout `python check_gpu_memory.py` runs the same (pyproject.toml,
[project.scripts]).

    grpo-check-gpu-memory                                        # every GPU, every process, this process's allocator
    grpo-check-gpu-memory --estimate --preset llama3-8b-dual --gpu a100-40
    python check_gpu_memory.py --estimate --preset llama3-8b-dual --gpu-mem 24 --set model.load_in_4bit=true
    grpo-check-gpu-memory --estimate --config examples/trl_grpo/grpo.yaml  # a config file, TRL's too (from a checkout)
    grpo-check-gpu-memory --estimate --model_name_or_path Qwen/Qwen2.5-0.5B --dataset_name trl-lib/DeepMath-103K \\
        --reward_funcs accuracy_reward --per_device_train_batch_size 8 --gpu l4-24   # TRL's flags, as `trl grpo`'s
    grpo-check-gpu-memory --estimate --preset smollm2-demo       # the project's packaged model, no network needed

The config is built as the trainer builds it (grpo/config/command_line.py, grpo/run/trl/command_line.py): --preset,
--config (grpo-dual's sections or TRL's fields), TRL's flags, --section.field / --set overrides; a TRL command line is
read as for a run on a GPU, its dataset not read (the rows do not change the estimate). --gpu-mem must be a finite
number of GiB of a real card (from MIN_GPU_GIB): a tool meant to prevent out-of-memory crashes says FITS only against a
real card. A model folder's config.json is counted as it is stored: every expert of a mixture (num_local_experts,
num_experts, n_routed_experts), weights saved quantized (GPTQ / AWQ bits, bitsandbytes); a quantization it cannot count
is refused.

Inside a training process call `report_live()` (it never creates a CUDA context of its own).
The estimate comes from grpo/machine/memory_estimate.py (pure arithmetic; see its docstring for every formula and the
phase model).
"""

from __future__ import annotations

import sys
from typing import Any

from grpo.machine.memory_estimate import GIB, cheapest_fixes, estimate, format_table

NO_GPU_LINE = "No CUDA GPU visible (torch.cuda.is_available() is False); nothing to report."
GPUS: dict[str, tuple[float, tuple[int, int]]] = {
    # name: (memory in GiB as nvidia-smi reports the total, compute capability)
    "a100-40": (40536 / 1024, (8, 0)),
    "a100-80": (81920 / 1024, (8, 0)),
    "h100-80": (81559 / 1024, (9, 0)),
    "l4-24": (23034 / 1024, (8, 9)),
    "rtx4090-24": (24564 / 1024, (8, 9)),
    "v100-32": (32768 / 1024, (7, 0)),
    "t4-16": (15360 / 1024, (7, 5)),
}
MIN_GPU_GIB = 1.0
"""The smallest --gpu-mem taken (GiB): below any card that trains a model; a smaller number is a typo (MiB, bytes)."""
MAX_GPU_GIB = 1e5
"""The largest --gpu-mem taken (GiB): far above any card or node; a bigger number is a typo (1e400 is infinite)."""


def gpu_gib(text: str) -> float:
    """--gpu-mem's value: a finite number of GiB in [MIN_GPU_GIB, MAX_GPU_GIB] (argparse's type; its error names the
    option)."""
    import argparse
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of GiB, e.g. 24") from None
    if not math.isfinite(value) or not MIN_GPU_GIB <= value <= MAX_GPU_GIB:
        raise argparse.ArgumentTypeError(f"{text} GiB is not a GPU's memory: give the card's memory in GiB, from "
                                         f"{MIN_GPU_GIB:g} to {MAX_GPU_GIB:g}, e.g. 24")
    return value


def report_live() -> str:
    """The live report: NVML view of all GPUs and processes + this process's torch allocator, or NO_GPU_LINE."""
    import torch

    from grpo.machine.hardware import live_gpu_report, nvml_report

    if torch.cuda.is_available():
        return live_gpu_report()
    found, text = nvml_report()
    if found:
        return ("torch.cuda.is_available() is False (a CPU build of torch, or CUDA_VISIBLE_DEVICES hides the GPUs), "
                "but NVML sees:\n" + text)
    return NO_GPU_LINE


def estimate_report(cfg: Any, gpu: str | None, gpu_mem: float | None) -> str:
    """The estimate table for `cfg` on the named card (or `gpu_mem` GiB) and, if it does not fit, the 3 cheapest
    fixes."""
    from grpo.run.assembly.memory_inputs import inputs_from_config  # imports torch: not for --help or the live report

    gpu_gb, cc = (gpu_mem, (8, 0)) if gpu_mem is not None else GPUS[gpu or "a100-40"]
    x = inputs_from_config(cfg, cc)
    est = estimate(x)
    card = (f"{gpu_mem:g} GiB (--gpu-mem)" if gpu_mem is not None
            else f"{gpu or 'a100-40'} ({gpu_gb:.1f} GiB, cc {cc[0]}.{cc[1]})")
    head = (f"ESTIMATE for {x.shape.name} on {card}: {x.weight_dtype}"
            f"{' + 4-bit nf4' if x.load_in_4bit else ''}, "
            f"{'LoRA r=' + str(x.lora_r) if x.lora else 'full fine-tuning'}, "
            f"grad checkpointing {'on' if x.grad_checkpointing else 'off'}, micro-batch {x.micro_batch_seqs} seqs, "
            f"generation {x.gen_batch_seqs} seqs, prompt {x.prompt_len} + {x.new_tokens} new tokens, μ={x.mu}, "
            f"reference pass {'on' if x.ref_pass else 'off'}")
    lines = [head, "", format_table(est, gpu_gb)]
    if est.peak_bytes > gpu_gb * GIB:
        fixes = cheapest_fixes(x, gpu_gb, n=3)
        lines.append("cheapest changes that fit:" if fixes else "no combination of up to 3 changes fits this card")
        lines += [f"  {i}. {f}" for i, f in enumerate(fixes, 1)]
    return "\n".join(lines)


def check_gpu_memory(argv: list[str] | None = None) -> int:
    """The command line (`argv`: the arguments, default sys.argv[1:]); returns the exit status."""
    import argparse

    from grpo.config import ConfigError
    from grpo.config.command_line import WrappedHelp, split_argv

    overrides, rest = split_argv(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=WrappedHelp,
                                     epilog="Config overrides: --set section.field=value (repeatable) or "
                                            "--section.field VALUE; TRL's flags (--model_name_or_path, "
                                            "--per_device_train_batch_size, ...) as grpo-dual's command line reads "
                                            "them (docs/TRL.md).")
    parser.add_argument("--estimate", action="store_true", help="predict peak memory of a config instead of live use")
    parser.add_argument("--preset", default=None, help="config preset, e.g. llama3-8b-dual (default: demo)")
    parser.add_argument("--config", metavar="FILE", default="",
                        help="a YAML or JSON config file: grpo-dual's sections or TRL's fields, as grpo-dual reads it")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--gpu", choices=sorted(GPUS), default=None, metavar="CARD",
                       help=f"target card: {', '.join(sorted(GPUS))} (default a100-40)")
    group.add_argument("--gpu-mem", type=gpu_gib, default=None,
                       help=f"target memory in GiB, from {MIN_GPU_GIB:g} (bf16-capable GPU assumed)")
    try:
        theirs, rest = _trl_flags().take(rest, {"estimate", "preset", "config", "gpu", "gpu-mem", "help"})
    except ConfigError as err:
        print(f"check_gpu_memory: {err}", file=sys.stderr)
        return 2
    args = parser.parse_args(rest)
    if not args.estimate:
        if overrides or args.preset or args.gpu or args.gpu_mem is not None or args.config or theirs:
            parser.error("--preset/--config/--gpu/--gpu-mem/--set and config flags need --estimate")
        print(report_live())
        return 0
    try:
        report = estimate_report(estimated_config(args.preset, args.config, theirs, overrides), args.gpu, args.gpu_mem)
    except (ConfigError, ValueError) as err:  # ConfigError is a ValueError; both name the field and the fix
        print(f"check_gpu_memory: {err}", file=sys.stderr)
        return 2
    print(report)
    return 0


def _trl_flags() -> Any:
    from grpo.run.trl.command_line import trl_flags

    return trl_flags()


def estimated_config(preset: str | None, config_file: str, theirs: dict[str, Any], overrides: list[str]) -> Any:
    """The Config a run of this command line would train with, read as the trainer reads it (a TRL command line as
    for a run on a GPU, its rows not read: grpo/run/trl/rows.py: estimating), checked against the registries."""
    from grpo.config import load_config
    from grpo.run.assembly.config_check import check_config
    from grpo.run.trl.command_line import read_config_file
    from grpo.run.trl.rows import estimating

    tree: dict[str, Any] = {}
    if config_file or theirs:
        with estimating():
            tree = read_config_file(config_file, theirs)
    return check_config(load_config(preset or tree.get("preset"), overrides, tree))
