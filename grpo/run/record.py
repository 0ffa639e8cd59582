"""The record of one training run: what `grpo_train.setup` builds and every phase advances.

Built by `setup`; `sft_phase`, `rl_step`, the evaluations and checkpoints read and advance it. Only the entry point
and the run layer see it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from grpo import config as C
from grpo.core.step_types import Sample
from grpo.machine.distributed import Dist
from grpo.models.modeling import Policy

if TYPE_CHECKING:  # the record names the wings' types; importing them would put the record above the wings
    from grpo.run.checkpoint.pareto import ParetoFrontier
    from grpo.run.doctor.thresholds import Finding
    from grpo.run.doctor.verdict import Doctor
    from grpo.run.step_owners import Generation, Rewarder, Updater
    from grpo.run.tracking import Tracker

__all__ = ["Run", "Start", "TaskSamples"]
"""The names the entry point takes from this module, its face (tests/test_house.py); the rest serve the package."""


@dataclass
class TaskSamples:
    """The run's prompts, per task."""

    training: dict[str, list[Sample]]
    """Training samples per task (what the prompt sampler draws from)."""
    heldout: dict[str, list[Sample]]
    """Held-out samples per task (at most data.eval_size each): every evaluation's prompts."""


@dataclass
class Progress:
    """Where the run is and what it has found so far: what a checkpoint saves besides the owners' state."""

    step: int = 0
    """The last finished RL step."""
    finished: bool = False
    """The final evaluation (after_rl) of this run's last step is done; the final checkpoint records it."""
    stopped_by: int = 0
    """The signal (SIGINT / SIGTERM) that stopped the RL loop after a checkpoint; 0 = not stopped. The command
    line exits 128 + it, as shells expect of an interrupted program."""
    evals: dict[str, dict[str, float]] = field(default_factory=dict)
    """Held-out reward per task under each evaluation tag (before_sft, after_sft, step_N, after_rl)."""
    measures: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Gold-label measures per evaluation tag ({tag: {"bbq" | "recognition": {task: ...}}}: BBQ's accuracies and bias
    scores, HaluEval recognition's balanced accuracy; grpo/phases/evaluation.record_measures), in measures.json."""
    frontier: ParetoFrontier | None = None
    """Pareto frontier of per-task held-out scores, with a saved adapter/model per point (set by `setup`)."""
    alarms: list[Finding] = field(default_factory=list)
    """The doctor's findings that fired at the last RL step (rank 0); `main` prints them."""
    report: dict[str, Any] = field(default_factory=dict)
    """The before/after report (report.json) once `finish` ran; `train(...)` fills it in."""


@dataclass
class Start:
    """What the run started from, fixed at set-up."""

    inputs: dict[str, Any] = field(default_factory=dict)
    """Fingerprints of the data files, task rows and reward functions (grpo/run/checkpoint/fingerprints.py; rank 0),
    saved with every checkpoint: a resume names what changed."""
    resume_from: Path | None = None
    """The checkpoint `setup` checked against this run's config and inputs (checkpoint.resume), which `main` loads."""
    host: str = ""
    """The banner's CPU line: torch's thread count and why (train.threads), how OpenMP waits
    (grpo/machine/host_resources.py)."""
    disk: str = ""
    """The banner's disk line: what the run will write and the free space (grpo/run/assembly/disk_plan.py)."""


@dataclass
class Run:
    """Everything a training run holds (at most 12 fields: tests/test_house.py). Built by `setup`, which fills in the
    fields after `samples`; advanced by `sft_phase` and `rl_step`."""

    cfg: C.Config
    run_dir: Path
    """output_dir/run_name: metrics, samples, evaluations, checkpoints, the final model."""
    dist: Dist
    """The processes of the run and this one's device (grpo/machine/distributed.py); one process unless started by
    `accelerate launch`."""
    policy: Policy
    samples: TaskSamples
    generation: Generation = field(init=False)
    """The generation side: sampler and this process's share of the prompts, stop ids, toolbox, dynamic sampling."""
    rewarder: Rewarder = field(init=False)
    """The reward side: specs, graders, judge, reward shaping, group advantages, the judge's counters."""
    updater: Updater = field(init=False)
    """The update side: optimizer, scheduler, weight guard, surgery, β / entropy controllers, micro-batching."""
    tracker: Tracker = field(init=False)
    """Where metrics go: metrics.jsonl / csv, TensorBoard, W&B on rank 0; nowhere on the other ranks."""
    progress: Progress = field(default_factory=Progress)
    start: Start = field(default_factory=Start)
    doctor: Doctor | None = None
    """The run doctor on rank 0 (grpo/run/doctor/verdict.py): the health checks over a moving window of the RL step
    metrics, started by `start_doctor` (by the first `rl_step` when `main` did not, e.g. in a notebook); None on other
    ranks."""

    @property
    def device(self) -> torch.device:
        """This process's device (`Dist.device`)."""
        return self.dist.device

    @property
    def report(self) -> dict[str, Any]:
        """The finished run's report.json (`progress.report`): what `train(...)` returns it for."""
        return self.progress.report

    @property
    def tasks(self) -> list[str]:
        """Task names, sorted: the order of task indices in batches, β vectors and metrics."""
        return sorted(self.samples.training)

    @property
    def tokenizer(self):
        return self.policy.tokenizer
