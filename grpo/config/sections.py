"""The typed `Config` of grpo-dual: its sections (model, data, rollout, loss, kl.<task>, train, sft, judge, multi,
checkpoint, tasks.<task>, reward_models.<name>), the checks across sections and the derived values; with the run's own
sections (`train`, `sft`, `judge`, `checkpoint`), a docstring under every field (--help reads them from the source of
each class's module) and their checks.

Standard library only, the bottom layer: grpo modules may import it, it imports nothing of theirs. The config in parts:
`ConfigError`, `_check` and the bounds are grpo/config/checks.py's; the model, data, tasks.<task> and
reward_models.<name> sections grpo/config/input_sections.py's; rollout, loss, kl.<task> and multi
grpo/config/algorithm_sections.py's.
Validation happens in `__post_init__`; every error is a `ConfigError` that names the field, the bad value and the fix.
Names that a registry implements (loss names, controllers, engines, ...) are checked against that registry by
grpo/run/assembly/config_check.py, which the entry points run right after `load_config`. Building a Config from presets,
overrides and files, and writing it back, is grpo/config/__init__.py's (which re-exports every name of these modules).
Only the entry point sees the whole Config; each module receives its section or plain values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from grpo.config.algorithm_sections import LossConfig, MultiConfig, RolloutConfig, TaskKLConfig
from grpo.config.checks import (
    JUDGE_RATE_MAX_STEP_S,
    MAX_LOSS_WEIGHT,
    MAX_LR,
    MAX_SEED,
    _check,
    _env_name,
    _inside_folder,
    _one_of,
)
from grpo.config.input_sections import DataConfig, ModelConfig, RewardModelConfig, TaskSourceConfig

LR_SCHEDULERS = ("constant", "linear", "cosine")
"""train.lr_scheduler values (grpo/run/step_owners.lr_factor computes each)."""


@dataclass
class TrainConfig:
    max_steps: int = 60
    """RL steps (rollout batches)."""
    num_epochs: float = 0.0
    """> 0: the RL phase runs this many passes over the training prompts instead of max_steps (TRL's
    num_train_epochs): RL steps = ceil(num_epochs x (training prompts // prompts a step over every process)), counted
    when the rows are loaded. 0 = max_steps decides."""
    lr: float = 1e-5
    """AdamW learning rate of the RL phase (the peak of lr_scheduler; at most 1, MAX_LR)."""
    lr_scheduler: str = "constant"
    """constant | linear (to 0 at the last optimizer step) | cosine (half a cosine to 0), each after the warm-up
    (warmup_steps or warmup_ratio): transformers' get_scheduler formulas (TRL's lr_scheduler_type; its
    constant_with_warmup is constant here), over the RL phase's optimizer steps (max_steps x loss.mu)."""
    weight_decay: float = 0.0
    """AdamW weight decay (lr x weight_decay < 1: each step multiplies every weight by 1 - lr x weight_decay)."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up: optimizer step n (0-based) of the first warmup_steps runs at lr x n/warmup_steps
    (transformers' formula, so TRL's; the first step at 0)."""
    warmup_ratio: float = 0.0
    """The warm-up as a share of the RL phase's optimizer steps: ceil(share x steps) (TRL's warmup_steps < 1).
    Give warmup_steps or warmup_ratio, not both."""
    prompts_per_micro_step: int = 2
    """Prompts per micro-batch; a micro-batch holds prompts_per_micro_step x k sequences."""
    micro_batch_size: int = 0
    """Sequences per micro-batch of the update and of the log-prob passes, when a prompt's group may span
    micro-batches (TRL's per_device_train_batch_size counts completions); the optimizer step is the same as on the
    whole batch. 0 = prompts_per_micro_step x rollout.k."""
    grad_accum: int = 1
    """Micro-batches per optimizer step. Prompts per RL step = prompts_per_micro_step x grad_accum."""
    split_groups: bool = False
    """Under several processes: the step's prompts_per_micro_step x grad_accum prompts are the batch of ALL processes
    together, and their x rollout.k completions (prompt-major) are split contiguously over the processes, so a group
    may span processes (TRL's per_device_train_batch_size x gradient_accumulation_steps not a multiple of
    num_generations). Each completion draws from its own stream: the split changes nothing it samples. false = each
    process draws and generates prompts_per_micro_step x grad_accum prompts of its own."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this value."""
    skip_grad_norm: float = 1000.0
    """Health guard: skip the optimizer step when the (pre-clip) grad norm is non-finite or above this."""
    max_consecutive_bad: int = 5
    """Health guard: stop with a message after this many skipped/restored steps in a row."""
    reward_timeout_s: float = 300.0
    """Per-call time limit of a user reward function (rewards.<task> terms naming a module:function, a
    file.py:function or a Python callable; built-in graders and reward models have none): each call runs on a worker
    thread of its own, and one that has not returned after this many seconds stops the run (exit 1; 2 in the
    preflight) naming the function and the task. A thread cannot be killed: the hung call is abandoned, not
    stopped."""
    seed: int = 0
    """Seeds python, numpy and torch (0 to 2**32 - 1: numpy's range, MAX_SEED)."""
    device: str = "auto"
    """auto | cpu | cuda | cuda:N."""
    threads: int = 0
    """torch's intra-op CPU threads. 0 = the whole cores this process may use: its CPU affinity mask, capped by its
    cgroup CPU quota (a container's --cpus) rounded down, not the machine's core count; a lower count set before the
    run (OMP_NUM_THREADS, torch.set_num_threads) is kept. The start of the run prints the count and why
    (grpo/machine/host_resources.py)."""
    sharding: str = "auto"
    """Under several processes: none (every process holds the whole model, DDP) | fsdp (FSDP2 full shard of the
    model and the reference over the processes; full fine-tuning, multi.combine=sum) | auto (fsdp when the
    accelerate config says FSDP, else none). See docs/SCALING.md."""
    eval_every: int = 20
    """Held-out evaluation every N RL steps (and before SFT, after SFT and at the end). 0 = only those."""
    eval_every_epoch: bool = False
    """True: evaluate at the end of each pass over the training prompts instead of every eval_every steps (TRL's
    eval_strategy=epoch): set-up sets eval_every to the RL steps of an epoch (training prompts // prompts a step over
    every process) once the rows are loaded."""
    best_metric: str = "reward"
    """The metric that ranks a run's held-out evaluations, for checkpoint.keep_best and early stopping (TRL's
    metric_for_best_model): reward = the mean held-out reward over the tasks | reward/<task> = one task's."""
    greater_is_better: bool = True
    """Whether a larger best_metric is the better one (TRL's greater_is_better)."""
    early_stopping_patience: int = 0
    """Stop RL after this many held-out evaluations in a row (every eval_every steps) that do not beat the best
    best_metric so far by more than early_stopping_threshold, as transformers' EarlyStoppingCallback; then the
    after-RL evaluation, the final checkpoint and the report, whose verdict names the stop. 0 = off. Needs
    evaluations during RL (eval_every or eval_every_epoch)."""
    early_stopping_threshold: float = 0.0
    """How much an evaluation must beat the best so far by to count as an improvement (EarlyStoppingCallback's
    early_stopping_threshold); the best itself moves with any improvement, as in transformers."""
    log_every: int = 1
    """Console line every N steps (metrics.jsonl always gets every step)."""
    sample_every: int = 10
    """Write sampled completions to samples/ every N steps."""
    doctor: str = "warn"
    """What the run doctor (grpo/run/doctor/: health checks over a moving window of the step metrics) does when a red
    finding is active after an RL step. It always prints each finding when it fires and logs doctor/<code> every step.
    warn = go on | stop = end RL after that step (then the after-RL evaluation, final checkpoint and report as usual) |
    restore = the same, after loading the weights of the best Pareto point so far (best mean held-out score over the
    evaluations every train.eval_every steps, which it needs; before the first one the weights stay)."""
    output_dir: str = "runs"
    """Runs are written to output_dir/run_name."""
    run_name: str = ""
    """Folder name of the run; empty = <preset>-<timestamp>."""
    tensorboard: bool = True
    """Write TensorBoard scalars to the run folder."""
    wandb_project: str = ""
    """Log to Weights & Biases under this project (needs `pip install wandb`). Empty = off."""
    overwrite: bool = False
    """A fresh run into a run folder that is not empty deletes its contents first (else it stops); --overwrite."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling (arXiv 2503.14476, §3.2): groups whose K rewards are all equal (no advantage, no policy
    gradient) are dropped and more prompts are sampled until the step has its prompts_per_step groups with signal,
    judged on the graders' rewards before rollout.overlong_buffer's penalty (DAPO's filter on accuracy, verl's
    filter_groups.metric=acc: equal rewards with different lengths are dropped),
    or dynamic_sampling_max_rounds extra rounds ran (then the step trains on the groups it found; grpo/core/dapo.py).
    The reward and answer metrics describe the step's own prompts (the first round); rollout/<task>/dynamic_kept_groups
    counts what each task trained on. A task whose groups all get one reward (collapsed, or solved) keeps none: that
    step it gets no policy gradient and no KL term (the doctor's zero_std_groups says so; see
    dynamic_sampling_keep_kl). One process only."""
    dynamic_sampling_max_rounds: int = 3
    """Dynamic sampling: the most extra generation rounds (each of prompts_per_step prompts) in one RL step."""
    dynamic_sampling_keep_kl: bool = False
    """Dynamic sampling: a task that kept no group this step trains on its first-round groups with advantage 0, so
    its KL term (and the KL controller, and kl/<task>) still acts while its policy term stays 0. Off: DAPO's (and
    verl's) plain drop. Counted as rollout/dynamic_kl_only_groups."""
    pass_at_k: int = 0
    """Before RL (after the SFT evaluation), the pass@K diagnostic: per task, the unbiased pass@k (Chen et al. 2021)
    of the held-out prompts from pass_at_k_samples sampled completions each, logged as eval/<task>/pass_at_k (and
    eval/<task>/pass_at_1) and written to pass_at_k.json; for multiple-choice tasks (BBQ, HaluEval recognition) also
    a uniform guess's figures (eval/<task>/pass_at_k_guess), and the report's sampled_at_chance finding when the
    policy's pass@k is no higher. 0 = off. One process only."""
    pass_at_k_samples: int = 16
    """pass@K diagnostic: completions sampled per held-out prompt (n >= pass_at_k)."""
    pass_threshold: float = 1.0
    """pass@K diagnostic: a completion is right when its reward is >= this."""
    trl_names: dict[str, str] = field(default_factory=dict)
    """The TRL field or flag behind each grpo-dual field a TRL config set as it is (rollout.k: --num_generations for
    a `trl grpo` command line or file, num_generations for a GRPOConfig): the run's advice (the doctor's findings,
    the verdict's next step, errors) names that, ours in brackets. Filled by the TRL translation, less the fields set
    by grpo-dual's own flags or sections; {} for a run configured in grpo-dual's fields."""

    def __post_init__(self) -> None:
        for f in ("max_steps", "prompts_per_micro_step", "grad_accum", "max_consecutive_bad", "log_every"):
            _check(getattr(self, f) >= 1, f"train.{f}", getattr(self, f), "use a positive integer")
        _check(0 < self.lr <= MAX_LR, "train.lr", self.lr,
               f"use a learning rate in (0, {MAX_LR:g}], e.g. 1e-5: AdamW moves every weight by about lr a step")
        _check(self.num_epochs >= 0, "train.num_epochs", self.num_epochs, "use a number of passes > 0, or 0 (off)")
        _one_of("train.lr_scheduler", self.lr_scheduler, LR_SCHEDULERS)
        _check(0 <= self.warmup_ratio < 1, "train.warmup_ratio", self.warmup_ratio, "use a share in [0, 1)")
        _check(not (self.warmup_ratio and self.warmup_steps), "train.warmup_ratio", self.warmup_ratio,
               f"train.warmup_steps={self.warmup_steps} is set too: give one of the two")
        _check(self.micro_batch_size >= 0, "train.micro_batch_size", self.micro_batch_size,
               "use a number of sequences >= 1, or 0 (prompts_per_micro_step x rollout.k)")
        _check(self.weight_decay >= 0, "train.weight_decay", self.weight_decay, "use a value >= 0 (0 = off)")
        _check(self.lr * self.weight_decay < 1, "train.weight_decay", self.weight_decay,
               f"AdamW multiplies every weight by 1 - lr x weight_decay each step, which train.lr={self.lr:g} makes "
               f"<= 0 (zeroed or flipped weights): use a decay below 1 / lr = {1 / self.lr:g}; 0 to 0.1 is common")
        _check(0 <= self.seed <= MAX_SEED, "train.seed", self.seed,
               f"use an integer in [0, {MAX_SEED}] (2**32 - 1: numpy's seed range, the narrowest of numpy, torch "
               "and Python)")
        _check(not self.run_name or _inside_folder(self.run_name), "train.run_name", self.run_name,
               "use a plain folder name (no path separators, no '..', not absolute, no control characters such as "
               "a newline): runs stay inside train.output_dir")
        _check(self.max_grad_norm > 0, "train.max_grad_norm", self.max_grad_norm, "use a value > 0, e.g. 1.0")
        _check(self.skip_grad_norm > 0, "train.skip_grad_norm", self.skip_grad_norm, "use a value > 0")
        _check(self.reward_timeout_s > 0, "train.reward_timeout_s", self.reward_timeout_s,
               "use a number of seconds > 0, e.g. 300")
        for f in ("warmup_steps", "eval_every", "sample_every", "dynamic_sampling_max_rounds", "pass_at_k",
                  "early_stopping_patience"):
            _check(getattr(self, f) >= 0, f"train.{f}", getattr(self, f), "use an integer >= 0 (0 = off)")
        task = self.best_metric.removeprefix("reward/")
        _check(self.best_metric == "reward" or (self.best_metric.startswith("reward/") and task and "/" not in task),
               "train.best_metric", self.best_metric, "use reward (the mean held-out reward over the tasks) or "
               "reward/<task> (one task's): the held-out evaluation's metrics")
        _check(self.early_stopping_threshold >= 0, "train.early_stopping_threshold", self.early_stopping_threshold,
               "use a margin >= 0 (0: any improvement counts)")
        _check(not self.early_stopping_patience or self.eval_every or self.eval_every_epoch,
               "train.early_stopping_patience", self.early_stopping_patience,
               "it counts held-out evaluations during RL, which train.eval_every=0 turns off: set train.eval_every "
               "(e.g. 20) too, or leave it at 0")
        _check(self.early_stopping_patience or not self.early_stopping_threshold, "train.early_stopping_threshold",
               self.early_stopping_threshold, "it is the margin early stopping counts by, and "
               "train.early_stopping_patience=0 turns early stopping off: set the patience too, or leave it at 0")
        _check(self.dynamic_sampling or not self.dynamic_sampling_keep_kl, "train.dynamic_sampling_keep_kl",
               self.dynamic_sampling_keep_kl, "it applies to dynamic sampling only: set train.dynamic_sampling=true "
               "too, or leave it off")
        _check(self.pass_at_k_samples >= max(1, self.pass_at_k), "train.pass_at_k_samples", self.pass_at_k_samples,
               f"use at least pass_at_k = {self.pass_at_k} samples per prompt")
        _check(self.threads >= 0, "train.threads", self.threads, "use a number of threads >= 1, or 0 (the cores "
               "this process may use)")
        _check(self.device == "auto" or self.device == "cpu" or self.device.startswith("cuda"), "train.device",
               self.device, "use auto, cpu, cuda or cuda:N")
        _one_of("train.sharding", self.sharding, ("auto", "none", "fsdp"))
        _one_of("train.doctor", self.doctor, ("warn", "stop", "restore"))
        _check(not (self.doctor == "restore" and self.eval_every == 0 and not self.eval_every_epoch), "train.doctor",
               self.doctor,
               "restore loads the best Pareto point, and points are the held-out evaluations during RL, which "
               "train.eval_every=0 turns off: set train.eval_every (e.g. 20) or use train.doctor=stop")


@dataclass
class SFTConfig:
    steps: int = 0
    """SFT warm-up optimizer steps before RL (0 = no warm-up)."""
    lr: float = 1e-4
    """SFT learning rate (at most 1, MAX_LR)."""
    batch_size: int = 8
    """SFT examples per optimizer step."""
    max_examples: int = 0
    """Use only N training samples with a reference completion for SFT (0 = all), chosen round-robin over
    (task, answer) classes: a few demonstrations teach the format, RL with rewards on every prompt does the rest."""
    max_target_tokens: int = 0
    """Cut each reference completion to its first N tokens (0 = whole); a cut one ends without the end-of-turn token,
    as a rollout that reaches rollout.max_new_tokens does. HaluEval general's references (ChatGPT answers, median
    ~500 characters) would otherwise cost minutes per SFT step on a CPU and teach lengths RL never samples."""

    def __post_init__(self) -> None:
        _check(self.steps >= 0, "sft.steps", self.steps, "use an integer >= 0")
        _check(self.max_examples >= 0, "sft.max_examples", self.max_examples, "use 0 (all) or a positive count")
        _check(self.max_target_tokens >= 0, "sft.max_target_tokens", self.max_target_tokens,
               "use 0 (whole targets) or a positive token count")
        _check(0 < self.lr <= MAX_LR, "sft.lr", self.lr,
               f"use a learning rate in (0, {MAX_LR:g}], e.g. 1e-4: AdamW moves every weight by about lr a step")
        _check(self.batch_size >= 1, "sft.batch_size", self.batch_size, "use a positive integer")


@dataclass
class JudgeConfig:
    base_url: str = ""
    """OpenAI-compatible endpoint (OpenAI, vLLM, Ollama, LiteLLM ...), e.g. http://127.0.0.1:8000/v1. Empty = no
    judge."""
    model: str = "gpt-4o-mini"
    """Judge model name sent to the server."""
    api_key_env: str = "OPENAI_API_KEY"
    """Name of the environment variable holding the API key (the key itself is never stored or logged); "" = none."""
    kind: str = "openai"
    """openai (any OpenAI-compatible server) | anthropic (needs `pip install anthropic`)."""
    fallback_base_url: str = ""
    """Optional second judge tried when the first fails (same kind and key variable). Empty = none."""
    fallback_model: str = ""
    """Model name of the second judge."""
    calibration_a: float = 1.0
    """Linear calibration of judge scores: a * score + b, clipped to [0, 1]."""
    calibration_b: float = 0.0
    """See calibration_a."""
    timeout_s: float = 20.0
    """Per-call timeout."""
    max_retries: int = 3
    """Retries per call (exponential backoff, honours Retry-After)."""
    rate_limit_per_s: float = 8.0
    """Global request rate limit across all worker threads."""
    num_workers: int = 8
    """Judge calls in flight at once (thread pool)."""
    cache_path: str = ""
    """SQLite cache of real judge answers; empty = <run folder>/judge_cache.sqlite."""
    max_fallback_share: float = 0.5
    """With a fallback grader (`llm_judge:1.0|bbq_rule`): the run stops (exit 1) when more than this share of a
    step's rewards of one task came from the fallback; reward/<task>/fallback_share logs the share every step.
    1 = never stop."""

    def __post_init__(self) -> None:
        for f in ("timeout_s", "rate_limit_per_s"):
            _check(getattr(self, f) > 0, f"judge.{f}", getattr(self, f), "use a value > 0")
        _check(self.max_retries >= 0, "judge.max_retries", self.max_retries, "use an integer >= 0 (0 = no retry)")
        _check(self.num_workers >= 1, "judge.num_workers", self.num_workers, "use a positive integer")
        for name in ("base_url", "fallback_base_url"):
            url = getattr(self, name)
            _check(not url or url.startswith(("http://", "https://")), f"judge.{name}", url,
                   "use an http(s) URL such as http://127.0.0.1:8000/v1")
        _one_of("judge.kind", self.kind, ("openai", "anthropic"))
        _check(not self.api_key_env or _env_name(self.api_key_env), "judge.api_key_env",
               "<hidden: it looks like a key, not a variable name>",
               "give the NAME of the environment variable that holds the key (e.g. OPENAI_API_KEY), never the "
               "key itself; the value is not printed")
        _check(0.0 <= self.max_fallback_share <= 1.0, "judge.max_fallback_share", self.max_fallback_share,
               "use a share in [0, 1] (1 = never stop)")


@dataclass
class CheckpointConfig:
    every: int = 0
    """Save a checkpoint every N RL steps (0 = only at the end and on interruption)."""
    every_epoch: bool = False
    """True: save a checkpoint at the end of each pass over the training prompts instead of every `every` steps
    (TRL's save_strategy=epoch): set-up sets `every` to the RL steps of an epoch (training prompts // prompts a step
    over every process) once the rows are loaded."""
    keep_last: int = 2
    """Checkpoints kept per run (older ones are deleted); 0 = keep every one (TRL's save_total_limit=None)."""
    resume: str = ""
    """"" = fresh run | auto = newest complete checkpoint of the run folder | a checkpoint or run folder path."""
    trust_pickle: bool = False
    """Load checkpoints of the old format (state.pt, reference.pt: Python pickles, which can run code when
    loaded). Only for checkpoints you wrote yourself; the next checkpoint is written in the safe format."""
    final_model_dir: str = ""
    """Also save the final model (or LoRA adapter) and its tokenizer into this folder, loadable with
    from_pretrained(folder) as after TRL's trainer.save_model(folder); "" = only <run folder>/final. A TRL config's
    output_dir sets it (grpo/run/trl/config_rules.py). A folder holding what no run wrote there (the model being
    trained, a dataset, another run's files) is refused before the model loads; the files a run wrote are listed in
    its .grpo-dual-final."""
    accept_changes: bool = False
    """Resume although the config, a data file, a task's rows or a reward function's source differ from the
    checkpoint's: each change is printed and recorded in the run folder's accepted_changes.jsonl. Off: such a resume
    stops before the model loads, naming every change. --accept-changes."""
    keep_best: bool = False
    """The final model (final/, and final_model_dir) is the one of the best held-out evaluation of RL by
    train.best_metric (the evaluations every train.eval_every steps and the last step's), not the last step's, as
    transformers' load_best_model_at_end (TRL's): a later evaluation replaces the best only when strictly better.
    The best's weights are kept in the run folder's best/ as it is evaluated. Needs evaluations during RL
    (train.eval_every or train.eval_every_epoch)."""

    def __post_init__(self) -> None:
        _check(self.every >= 0, "checkpoint.every", self.every, "use an integer >= 0 (0 = only at the end)")
        _check(bool(self.resume) or not self.accept_changes, "checkpoint.accept_changes", self.accept_changes,
               "it applies to a resume: give --resume too, or leave it off")
        _check(self.keep_last >= 0, "checkpoint.keep_last", self.keep_last, "use a positive integer, or 0 (keep all)")


@dataclass
class Config:
    preset: str = "demo"
    """Name of the preset this config started from (informational)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    kl: dict[str, TaskKLConfig] = field(default_factory=lambda: {"default": TaskKLConfig()})
    """Per-task KL control, keyed by task name; "default" applies to tasks without an entry."""
    rewards: dict[str, str] = field(default_factory=dict)
    """Per-task reward terms "grader:weight,grader:weight[|fallback]"; a grader is a built-in name, llm_judge, a
    reward_models name or folder, "package.module:function" or "path/to/file.py:function" (docs/CUSTOM_TASKS.md)."""
    tasks: dict[str, TaskSourceConfig] = field(default_factory=dict)
    """Your own tasks by name: where each task's rows come from and how their columns map (docs/CUSTOM_TASKS.md)."""
    reward_models: dict[str, RewardModelConfig] = field(default_factory=dict)
    """Reward models by name, for the reward terms that name them."""
    train: TrainConfig = field(default_factory=TrainConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    multi: MultiConfig = field(default_factory=MultiConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)

    def __post_init__(self) -> None:
        _check("default" in self.kl, "kl", sorted(self.kl), "keep a `default` entry for tasks without their own")
        for task, section in self.kl.items():  # the controllers' own rules: grpo/run/assembly/config_check.py
            for f in ("beta", "beta_max"):
                _check(getattr(section, f) <= MAX_LOSS_WEIGHT, f"kl.{task}.{f}", getattr(section, f),
                       f"use a KL coefficient <= {MAX_LOSS_WEIGHT:g} (0.001 to 0.1 is common): above it the KL term "
                       "outweighs every reward and its gradient heads for overflow")
        _check(not self.checkpoint.keep_best or self.train.eval_every or self.train.eval_every_epoch,
               "checkpoint.keep_best", self.checkpoint.keep_best, "it keeps the best held-out evaluation during RL, "
               "which train.eval_every=0 turns off: set train.eval_every (e.g. 20) too, or leave it off")
        _check(not (self.train.overwrite and self.checkpoint.resume), "train.overwrite", self.train.overwrite,
               f"--overwrite starts the run over (deleting its folder's contents) and --resume "
               f"{self.checkpoint.resume} continues it: give one of them")
        for task, spec in self.rewards.items():
            _check(bool(spec.strip()), f"rewards.{task}", spec, "give at least one grader:weight term")
        for task, source in self.tasks.items():
            source.validate(f"tasks.{task}")
        for name, model in self.reward_models.items():
            model.validate(f"reward_models.{name}")
        if self.judge.base_url:  # the rate limit alone must let one step's judge calls finish
            wait_s = self.seqs_per_step / self.judge.rate_limit_per_s
            _check(wait_s <= JUDGE_RATE_MAX_STEP_S, "judge.rate_limit_per_s", self.judge.rate_limit_per_s,
                   f"at this rate one RL step's {self.seqs_per_step} completions (train.prompts_per_micro_step x "
                   f"train.grad_accum x rollout.k) wait {wait_s:.3g} s for the judge's rate limit alone, over the "
                   f"{JUDGE_RATE_MAX_STEP_S:g} s allowed (JUDGE_RATE_MAX_STEP_S); use at least "
                   f"{self.seqs_per_step / JUDGE_RATE_MAX_STEP_S:.3g} requests per second")

    # ----- derived values: computed here, in one place -----
    @property
    def prompts_per_step(self) -> int:
        """Prompts sampled per RL step and PROCESS (all generated in one batched call); a run on N processes
        trains on N times as many per optimizer step."""
        return self.train.prompts_per_micro_step * self.train.grad_accum

    @property
    def micro_batch_seqs(self) -> int:
        """Sequences per micro-batch of the update: train.micro_batch_size, else prompts_per_micro_step x k."""
        return self.train.micro_batch_size or self.train.prompts_per_micro_step * self.rollout.k

    @property
    def seqs_per_step(self) -> int:
        """Completions per RL step: the effective batch of one optimizer step."""
        return self.prompts_per_step * self.rollout.k

    @property
    def total_updates(self) -> int:
        """Optimizer steps of the RL phase."""
        return self.train.max_steps * self.loss.mu

    @property
    def kl_enabled(self) -> bool:
        """True when any task has a KL term (then the reference pass runs)."""
        return any(c.beta > 0 for c in self.kl.values())

    def kl_for(self, task: str) -> TaskKLConfig:
        return self.kl.get(task, self.kl["default"])
