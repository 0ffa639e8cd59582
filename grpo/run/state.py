"""The record of one training run: what `grpo_train.setup` builds and every phase advances.

Built by `setup` (the fields after `heldout` are filled in there, from the config and the policy); `sft_phase`,
`rl_step`, the evaluations and checkpoints read and advance it. Only the entry point and the run layer see it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from grpo.config import settings as C
from grpo.run.doctor import Doctor
from grpo.core.entropy_control import AdaptiveEntropyCoef
from grpo.core.health import WeightGuard
from grpo.core.kl_control import Controller
from grpo.core.records import Sample
from grpo.run.doctor_checks import Finding
from grpo.data.batching import TaskBalancedSampler
from grpo.grading.graders import Grader
from grpo.grading.judge import Judge
from grpo.grading.scoring import RewardSpec
from grpo.models.distributed import Dist
from grpo.models.modeling import Policy
from grpo.phases.tools import ToolBox
from grpo.phases.update import TaskGradientSurgery
from grpo.run.pareto import ParetoFrontier
from grpo.run.tracking import Tracker


@dataclass
class Run:
    """Everything a training run holds. Built by `setup` (the fields after `heldout` are filled in there, from the
    config and the policy), advanced by `sft_phase` and `rl_step`."""

    cfg: C.Config
    run_dir: Path
    """output_dir/run_name: metrics, samples, evaluations, checkpoints, the final model."""
    device: torch.device
    dist: Dist
    """The processes of the run (grpo/models/distributed.py); one process unless started by `accelerate launch`."""
    policy: Policy
    train: dict[str, list[Sample]]
    """Training samples per task."""
    heldout: dict[str, list[Sample]]
    """Held-out samples per task (at most data.eval_size each)."""
    sampler: TaskBalancedSampler = field(init=False)
    controllers: dict[str, Controller] = field(init=False)
    """The β controller of each task (kl.<task>, else kl.default)."""
    entropy_control: AdaptiveEntropyCoef | None = field(init=False, default=None)
    """The adaptive entropy coefficient (loss.entropy_target), or None for the fixed loss.entropy_coef."""
    specs: dict[str, RewardSpec] = field(init=False)
    """The reward terms of each task (rewards.<task>, else the source's defaults)."""
    graders: dict[str, Grader] = field(init=False)
    """Every reward term's grader by name, resolved and tried on a real row by `grpo.grading.graders.preflight` before the
    model loaded (a reward model is loaded there, once)."""
    judge: Judge | None = field(init=False)
    """The LLM judge (judge.base_url), or None for rule graders only."""
    tracker: Tracker = field(init=False)
    """Where metrics go: metrics.jsonl / csv, TensorBoard, W&B on rank 0; nowhere on the other ranks."""
    stop_ids: tuple[int, ...] = field(init=False)
    """Token ids that end a completion: the end-of-turn / EOS token and rollout.stop_strings, resolved once."""
    micro_batch_seqs: int = field(init=False)
    """Sequences per forward of every pass (old log-probs, reference, training): cfg.micro_batch_seqs, halved
    after a CUDA out-of-memory retry (`update_with_oom_retry`)."""
    optimizer: torch.optim.Optimizer = field(init=False)
    scheduler: torch.optim.lr_scheduler.LambdaLR = field(init=False)
    guard: WeightGuard = field(init=False)
    """Skipped / restored steps; replaces non-finite weights by the last good copy."""
    surgery: TaskGradientSurgery | None = field(init=False)
    """Per-task gradient combination (PCGrad / CAGrad), or None for the plain summed loss."""
    train_model: torch.nn.Module = field(init=False)
    """The model the update runs through: the policy's model, or accelerate's DDP / FSDP wrapper of it."""
    frontier: ParetoFrontier = field(init=False)
    """Pareto frontier of per-task held-out scores, with a saved adapter/model per point."""
    toolbox: ToolBox | None = None
    """The tools of multi-turn rollouts (rollout.tools, train(tools=...); grpo/phases/tools.py), built at set-up
    against the tokenizer's chat template; None = single-turn rollouts."""
    share_prompts: bool = False
    """Forward passes encode each prompt once for its K completions (see `shares_prompts`)."""
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
    scores, HaluEval recognition's balanced accuracy; grpo/phases/evaluate.record_measures), in measures.json."""
    counters: dict[str, float] = field(default_factory=dict)
    """Running totals the step metrics are differences of (judge counters), and the guard's restore flag."""
    doctor: Doctor | None = None
    """The run doctor on rank 0 (grpo/run/doctor.py): the health checks over a moving window of the RL step metrics,
    started by `start_doctor` (by the first `rl_step` when `main` did not, e.g. in a notebook); None on other ranks."""
    alarms: list[Finding] = field(default_factory=list)
    """The doctor's findings that fired at the last RL step (rank 0); `main` prints them."""
    report: dict[str, Any] = field(default_factory=dict)
    """The before/after report (report.json) once `finish` ran; `train(...)` fills it in."""
    inputs: dict[str, Any] = field(default_factory=dict)
    """Fingerprints of the data files, task rows and reward functions the run started with (grpo/run/fingerprints.py;
    rank 0), saved with every checkpoint: a resume names what changed."""
    resume_from: Path | None = None
    """The checkpoint `setup` checked against this run's config and inputs (checkpoint.resume), which `main` loads."""

    def __post_init__(self) -> None:
        self.micro_batch_seqs = self.cfg.micro_batch_seqs

    @property
    def tasks(self) -> list[str]:
        """Task names, sorted: the order of task indices in batches, β vectors and metrics."""
        return sorted(self.train)

    @property
    def tokenizer(self):
        return self.policy.tokenizer
