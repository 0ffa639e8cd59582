"""This process before its run: the seeds, torch's thread count and the banner's CPU line (`prepare_process`), the
run's processes and this one's device (`processes`, `choose_device`), the relaunch of `accelerate launch --cpu`."""

from __future__ import annotations

import random

import numpy as np
import torch

from grpo import config as C
from grpo.machine.distributed import Dist, make_dist, relaunch_on_cpu, requested_cpu_processes
from grpo.machine.host_resources import SPINNING, cpu_share, openmp_note, thread_count


def choose_device(requested: str) -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"train.device={requested!r} but no CUDA GPU is visible: use train.device=cpu or auto")
    return torch.device(requested)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def prepare_process(threads_setting: int) -> str:
    """This process's torch thread count (train.threads: the cores it may use, not the machine's; setting it also
    pins MKL's count) and transformers' progress bars off (one progress display per phase is ours). Returns the
    banner's CPU line (how OpenMP waits only where it costs something or the user set it:
    grpo/machine/host_resources.py)."""
    threads, why = thread_count(threads_setting, torch.get_num_threads(), cpu_share())
    if threads != torch.get_num_threads():
        torch.set_num_threads(threads)
    # transformers is imported when the first model is built, not when this module is (--help stays fast)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    waits = openmp_note()
    if waits == SPINNING:  # a cost with a fix: a line of its own, not a clause
        return f"CPU: {threads} torch thread(s) ({why})\n{waits}"
    return f"CPU: {threads} torch thread(s) ({why})" + (f"; {waits}" if waits else "")


def processes(train: C.TrainConfig) -> Dist:
    """The run's processes (one, or those `accelerate launch` started; FSDP2 with train.sharding) and this one's
    device (train.device)."""
    dist, dist_device = make_dist(train.device, train.sharding)
    dist.device = dist_device or choose_device(train.device)
    return dist


def relaunch_if_asked(argv: list[str]) -> None:
    """`accelerate launch --cpu --num_processes N` started only this process: start the N (returns only with one)."""
    n_processes = requested_cpu_processes()  # reads the launcher's command line once
    if n_processes > 1:
        relaunch_on_cpu(n_processes, argv[0], argv[1:])
