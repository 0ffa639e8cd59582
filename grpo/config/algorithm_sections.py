"""The config sections of the RL algorithm: sampling and tools (`rollout`), the loss (`loss`), each task's KL control
(`kl.<task>`) and multi-task gradient surgery (`multi`), a docstring under every field (--help reads them from this
file's source) and their checks.

Standard library only; `ConfigError`, `_check` and the bounds are grpo/config/checks.py's, the whole `Config`
grpo/config/sections.py's, and grpo/config/__init__.py re-exports every name (`C.RolloutConfig`, ...). Names a
registry implements (losses, aggregation modes, KL estimators, controllers, engines) are checked against it by
grpo/run/assembly/config_check.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from grpo.config.checks import (
    MAX_LOGIT_PENALTY,
    MAX_LOSS_WEIGHT,
    MAX_REPETITION_PENALTY,
    MIN_TEMPERATURE,
    _check,
    _one_of,
)
from grpo.core.clip_rules import CLIP_HIGH, CLIP_LOW, DUAL_CLIP, clip_problems


@dataclass
class RolloutConfig:
    k: int = 4
    """Completions sampled per prompt (the GRPO group size)."""
    max_new_tokens: int = 96
    """Longest completion; a completion that reaches it without a stop token is marked truncated."""
    min_new_tokens: int = 0
    """Stop tokens are suppressed until this many tokens were generated."""
    temperature: float = 1.0
    """Sampling temperature, also used to scale logits in every log-prob pass so ratios match the sampler
    (>= 1e-20, MIN_TEMPERATURE: below it the scaled logits overflow fp32; greedy decoding is top_k=1)."""
    top_k: int = 0
    """Keep the k most likely tokens (0 = off)."""
    top_p: float = 1.0
    """Nucleus sampling mass (1.0 = off)."""
    min_p: float = 0.0
    """Drop tokens below min_p x p(top token) (0 = off)."""
    repetition_penalty: float = 1.0
    """CTRL-style repetition penalty over prompt and completion (1.0 = off; in [1e-4, 1e4], MAX_REPETITION_PENALTY)."""
    presence_penalty: float = 0.0
    """OpenAI-style: subtract this from the logit of every token already in the completion (|value| <= 1e4)."""
    frequency_penalty: float = 0.0
    """OpenAI-style: subtract this x count of the token in the completion (|value| <= 1e4)."""
    stop_strings: list[str] = field(default_factory=list)
    """Extra stop tokens (each must be one token of the tokenizer); the end-of-turn/EOS token always stops."""
    cache_implementation: str = "dynamic"
    """KV cache of the RL rollouts: dynamic | static. static pads prompts to a multiple of 64 tokens and lets
    transformers compile the decoding step on CUDA, after a one-off compile (how much faster on an H100:
    benchmarks/RESULTS.md, `vs_trl.py --ours-cache static`). On CPU nothing is compiled and it is slower. Evaluation
    always uses the dynamic cache (its batch shapes vary)."""
    engine: str = "auto"
    """auto | lean | graph | hf: the decoding loop of rollouts and evaluation. lean (grpo/decoding/decode.py) samples
    exactly the tokens transformers' generate samples (same processors, same random numbers; tested token for token)
    with less Python per step, and drops finished completions from the batch. graph (grpo/decoding/graph_decode.py):
    one fixed-shape decoding step with the sampler inside, compiled and, on CUDA, captured as a CUDA graph and
    replayed per token (the Llama family; it samples with the per-row sampler of rollout.sampling_rng=per_completion,
    its keys drawn from the torch RNG when the run has none). auto = graph on CUDA where it applies, else lean unless
    the static cache, FSDP, a model that prepares its own generation inputs (Phi-3, multimodal models) or a model
    generation_config field the loop does not apply (bad_words_ids, no_repeat_ngram_size, ...) needs generate."""
    fold_lora: str = "auto"
    """auto | on | off. With the graph engine: add each LoRA layer's update into a copy of its weight for the rollout
    (one matmul per projection per token instead of three; the copy is freed after it; the training log-probs still
    run the adapter unfolded). The copy costs the adapted weights' size during rollouts: auto folds where that does
    not raise the step's estimated peak memory (check_gpu_memory.py's estimate; always on the CPU), on folds where
    the copy fits in the free memory, off never folds."""
    sampling_rng: str = "auto"
    """global | per_completion | auto. per_completion draws every completion from its own random stream keyed by
    (seed, step, prompt, k) (grpo/decoding/sampling.py), so it does not depend on the batch it was generated in: a run
    on N processes then samples exactly what the one-process run samples. auto = per_completion under several
    processes, global (torch's RNG, Hugging Face's sampler) otherwise."""
    overlong_buffer: int = 0
    """DAPO's soft overlong punishment (arXiv 2503.14476, eq. 13): L_cache, the last tokens before max_new_tokens
    (= L_max) over which a completion's reward falls linearly from 0 to -overlong_penalty_factor (grpo/core/dapo.py).
    Added to the grader reward before the advantages (reward/<task> metrics stay the graders'). 0 = off."""
    overlong_penalty_factor: float = 1.0
    """Scale of the soft overlong punishment (verl's overlong_buffer.penalty_factor); read when overlong_buffer > 0."""
    tools: list[str] = field(default_factory=list)
    """Functions the model may call in multi-turn rollouts, "package.module:function" or "path/to/file.py:function"
    (described to the model by their signature and docstring, as TRL's tools=[...]; grpo/phases/tools.py). Empty =
    single-turn rollouts. A call is `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` in the reply; its
    result comes back as a tool message and the model replies again. Only the model's own tokens are trained."""
    max_tool_turns: int = 4
    """Rounds of tool calls per trajectory (TRL's max_tool_calling_iterations); a reply that calls again after the
    last round ends the trajectory, counted in tools/cut_by_limit."""
    tool_timeout_s: float = 10.0
    """Seconds one tool call may take; a call that overruns becomes an error message to the model and a counted
    failure."""
    max_tool_result_tokens: int = 256
    """A tool result (or error message) longer than this many tokens is cut to it, marked as cut."""
    max_trajectory_tokens: int = 0
    """Token budget of a trajectory's completion (replies, tool results and template text together, as TRL's
    max_completion_length); a reply or tool result past it ends the trajectory. 0 = only the per-reply
    max_new_tokens, max_tool_turns and max_tool_result_tokens bound it."""
    environment_factory: str = ""
    """A stateful task's environment, TRL's environment_factory: "package.module:Class" or "path/to/file.py:Class"
    (or a factory function), one instance per trajectory; `reset(**row)` starts a rollout (text it returns is
    appended to the prompt), its public methods are the model's tools, reward functions get them as `environments`
    (grpo/phases/environments.py). Empty = none."""

    def __post_init__(self) -> None:
        _check(all(isinstance(t, str) and t.strip() for t in self.tools) and len(set(self.tools)) == len(self.tools),
               "rollout.tools", self.tools, "list each tool once as 'package.module:function' or "
               "'path/to/file.py:function'")
        _check(self.max_tool_turns >= 1, "rollout.max_tool_turns", self.max_tool_turns, "use a positive integer")
        _check(self.tool_timeout_s > 0, "rollout.tool_timeout_s", self.tool_timeout_s, "use a positive number of "
               "seconds, e.g. 10")
        _check(self.max_tool_result_tokens >= 1, "rollout.max_tool_result_tokens", self.max_tool_result_tokens,
               "use a positive integer")
        _check(self.max_trajectory_tokens == 0 or self.max_trajectory_tokens >= self.max_new_tokens,
               "rollout.max_trajectory_tokens", self.max_trajectory_tokens,
               f"use 0 (no budget) or at least max_new_tokens={self.max_new_tokens}")
        _check(self.k >= 2, "rollout.k", self.k, "GRPO needs at least 2 completions per prompt; use k >= 2")
        _check(self.max_new_tokens >= 1, "rollout.max_new_tokens", self.max_new_tokens, "use a positive integer")
        _check(0 <= self.min_new_tokens <= self.max_new_tokens, "rollout.min_new_tokens", self.min_new_tokens,
               f"use a value in [0, max_new_tokens={self.max_new_tokens}]")
        _check(self.temperature >= MIN_TEMPERATURE, "rollout.temperature", self.temperature,
               f"use a temperature >= {MIN_TEMPERATURE:g}: below it the logits divided by it overflow fp32 (for greedy "
               "decoding use top_k=1)")
        _check(self.top_k >= 0, "rollout.top_k", self.top_k, "use 0 (off) or a positive integer")
        _check(0.0 < self.top_p <= 1.0, "rollout.top_p", self.top_p, "use a value in (0, 1]")
        _check(0.0 <= self.min_p < 1.0, "rollout.min_p", self.min_p, "use a value in [0, 1)")
        _check(1 / MAX_REPETITION_PENALTY <= self.repetition_penalty <= MAX_REPETITION_PENALTY,
               "rollout.repetition_penalty", self.repetition_penalty,
               f"use a factor in [{1 / MAX_REPETITION_PENALTY:g}, {MAX_REPETITION_PENALTY:g}] (1.0 = off, 1.2 is "
               "common): beyond it no choice changes, only the logits overflow")
        for f in ("presence_penalty", "frequency_penalty"):
            _check(abs(getattr(self, f)) <= MAX_LOGIT_PENALTY, f"rollout.{f}", getattr(self, f),
                   f"use a value in [-{MAX_LOGIT_PENALTY:g}, {MAX_LOGIT_PENALTY:g}] (0 = off; OpenAI's range is "
                   "[-2, 2]): a penalty that large already decides every repeat, a larger one only overflows")
        _one_of("rollout.sampling_rng", self.sampling_rng, ("auto", "global", "per_completion"))
        _one_of("rollout.fold_lora", self.fold_lora, ("auto", "on", "off"))
        _check(0 <= self.overlong_buffer <= self.max_new_tokens, "rollout.overlong_buffer", self.overlong_buffer,
               f"use 0 (off) or a token count in [1, max_new_tokens={self.max_new_tokens}]")
        _check(self.overlong_penalty_factor > 0, "rollout.overlong_penalty_factor", self.overlong_penalty_factor,
               "use a value > 0, e.g. 1.0")
        _check(self.engine not in ("lean", "graph") or self.cache_implementation == "dynamic", "rollout.engine",
               self.engine,
               f"the {self.engine} engine keeps its own KV cache; with rollout.cache_implementation=static "
               "use engine=auto or hf")


def check_clip(clip_low: float, clip_high: float, dual_clip: float | None) -> None:
    """The clip's rules (grpo/core/clip_rules.py, which the clipped losses apply too), as the loss section's error:
    the first rule broken, naming its field."""
    for field_name, value, fix in clip_problems(clip_low, clip_high, dual_clip):
        _check(False, field_name, value, fix)


@dataclass
class LossConfig:
    policy_loss: str = "grpo"
    """The policy loss by name: grpo (token ratio), gspo (sequence ratio), gspo_token, luspo, cispo, sapo, vespo or
    one registered with register_policy_loss (grpo/core/losses.py); --help lists each with its parameters."""
    clip_low: float = CLIP_LOW
    """Lower clip: ratio >= 1 - clip_low (GSPO's paper uses ~3e-4 since its ratio is a per-token geometric mean).
    The clipped losses only (grpo, gspo, gspo_token, luspo)."""
    clip_high: float = CLIP_HIGH
    """Upper clip: ratio <= 1 + clip_high (DAPO clip-higher: larger than clip_low). The clipped losses only."""
    dual_clip: float | None = DUAL_CLIP
    """Cap the loss of negative-advantage tokens at -c*A (verl uses c=3). None = off. The clipped losses only."""
    params: dict[str, float] = field(default_factory=dict)
    """The policy loss's own hyper-parameters by name, e.g. loss.params.cispo_max_ratio=3 (or --loss.params
    cispo_max_ratio=3,...): only those of loss.policy_loss, each checked by the rule it was registered with; one left
    out takes its registered default. --help lists every loss's (grpo/core/losses.py register_policy_loss)."""
    agg_mode: str = "token-mean"
    """token-mean | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm (Dr.GRPO)."""
    kl_estimator: str = "k3"
    """k1 | k2 | k3 | k3+ (k3 value, k2 gradient). The KL term uses each sequence's task beta."""
    kl_importance_weight: bool = False
    """Multiply each token's KL term by the importance ratio of policy_loss (token or sequence, as the loss forms it;
    TRL's use_bias_correction_kl): 1 on-policy, so the value is the same there, but its gradient gains
    KL x grad log-ratio; off-policy (mu > 1) it weighs the KL estimate to the current policy's tokens."""
    entropy_coef: float = 0.0
    """Entropy bonus weight (0 = off; at most 1e3, MAX_LOSS_WEIGHT); with entropy_target set, the adaptive
    coefficient's start."""
    entropy_target: float | None = None
    """Adaptive entropy control (Skywork-OR1; TRL's use_adaptive_entropy; grpo/core/entropy_control.py): after each RL
    step the coefficient moves by entropy_coef_delta up while the mean token entropy (nats) is at or below this
    target, else down, and the bonus applies only while the entropy is at or below it. None = the fixed entropy_coef."""
    entropy_coef_delta: float = 0.005
    """Adaptive entropy control: the coefficient's change per RL step (TRL's default 0.005)."""
    entropy_coef_min: float = 0.0
    """Adaptive entropy control: lower bound of the coefficient."""
    entropy_coef_max: float = 1.0
    """Adaptive entropy control: upper bound of the coefficient."""
    mu: int = 1
    """Update passes (optimizer steps) per rollout batch. mu = 1 is exactly on-policy: no old-log-prob pass."""
    adv_scale: str = "group"
    """group: (r - mean)/(std + eps) | batch: divide by the batch std | none: r - mean (Dr.GRPO)."""
    adv_clip: float | None = None
    """Clamp advantages to [-c, c]. None = off."""
    reward_aggregation: str = "sum"
    """How a task's reward terms (rewards.<task>) make its reward: sum = TRL's weighted sum Σ w_i·s_i, a term whose
    function returns None left out for that completion (all None: the completion is excluded); mean = the weighted
    mean Σ w_i·s_i / Σ w_i, any None voiding the reward (rule graders in [0, 1] give a reward in [0, 1]: the built-in
    presets use it). A failed judge call voids the reward either way (or takes its fallback)."""
    multi_objective_aggregation: str = "sum_then_normalize"
    """How a task's reward terms (rewards.<task>) reach the advantages (TRL's multi_objective_aggregation):
    sum_then_normalize = the reward (loss.reward_aggregation), then group advantages | normalize_then_sum = GDPO: each
    term normalised within its group first, then the weighted sum (grpo/core/advantages.normalize_then_sum); TRL then
    scales by the batch std (loss.adv_scale=batch). reward/<task> metrics stay the reward's."""
    mask_truncated: bool = False
    """Completions that reached rollout.max_new_tokens without a stop token carry no loss (policy, KL, entropy) and
    are not counted in the step's token / sequence-length denominators (TRL's mask_truncated_completions; DAPO's
    overlong filtering). A step whose every completion is truncated takes no optimizer step."""
    top_entropy_quantile: float = 1.0
    """Train only the tokens whose entropy is in the top q share of the step's completion tokens (q in (0, 1];
    1 = every token; the 80/20 paper, arXiv 2506.01939, uses 0.2; TRL's top_entropy_quantile). The entropies come from
    one extra no-grad pass of the rollout policy before the update, so the selection is the same for every
    micro-batch split; unselected tokens keep their place in the denominators (as in TRL) and their KL term."""

    def __post_init__(self) -> None:
        check_clip(self.clip_low, self.clip_high, self.dual_clip)
        _check(self.mu >= 1, "loss.mu", self.mu, "use mu >= 1")
        _check(0 <= self.entropy_coef <= MAX_LOSS_WEIGHT, "loss.entropy_coef", self.entropy_coef,
               f"use a weight in [0, {MAX_LOSS_WEIGHT:g}] (0 = off, ~0.001 is common): above it the bonus outweighs "
               "every reward and its gradient heads for overflow")
        _check(self.adv_clip is None or self.adv_clip > 0, "loss.adv_clip", self.adv_clip,
               "use None (off) or a clamp > 0, e.g. 5")
        _check(self.entropy_target is None or self.entropy_target > 0, "loss.entropy_target", self.entropy_target,
               "use None (fixed entropy_coef) or a target entropy > 0 nats, e.g. 0.2")
        _check(self.entropy_coef_delta > 0, "loss.entropy_coef_delta", self.entropy_coef_delta, "use a value > 0")
        _check(0 <= self.entropy_coef_min <= self.entropy_coef <= self.entropy_coef_max or self.entropy_target is None,
               "loss.entropy_coef_min", self.entropy_coef_min,
               "adaptive entropy control needs entropy_coef_min <= entropy_coef <= entropy_coef_max")
        _check(0 < self.top_entropy_quantile <= 1, "loss.top_entropy_quantile", self.top_entropy_quantile,
               "use a share in (0, 1], e.g. 0.2 (1 = every token)")
        # loss.params and the agg_mode a loss needs: the loss registry's rules, applied by
        # grpo/run/assembly/config_check.py


@dataclass
class TaskKLConfig:
    controller: str = "fixed"
    """fixed | adaptive (Ziegler et al.) | band (multiply beta by up/down when the window median leaves the band)."""
    beta: float = 0.04
    """Initial KL coefficient of this task (0 disables the KL term and the reference pass for it; at most 1e3,
    MAX_LOSS_WEIGHT)."""
    target: float = 0.05
    """adaptive: target KL per token."""
    horizon: int = 100
    """adaptive: horizon in steps."""
    band_low: float = 0.02
    """band: lower edge of the KL band (per-token KL)."""
    band_high: float = 0.06
    """band: upper edge of the KL band."""
    window: int = 20
    """band: steps per decision (median of the window)."""
    up: float = 1.15
    """band: beta multiplier when KL is above the band."""
    down: float = 0.85
    """band: beta multiplier when KL is below the band."""
    beta_min: float = 0.001
    """Lower bound on beta."""
    beta_max: float = 1.0
    """Upper bound on beta (at most 1e3, MAX_LOSS_WEIGHT)."""

    # The rules on these values belong to the controllers (grpo/core/kl_control.py RULES):
    # grpo/run/assembly/config_check.py applies
    # them to each kl.<task> section with the field named, so the config cannot accept what a controller refuses.


@dataclass
class MultiConfig:
    combine: str = "sum"
    """sum (plain multi-task loss) | pcgrad (Yu et al. 2020) | cagrad (Liu et al. 2021)."""
    cagrad_c: float = 0.5
    """CAGrad conflict-aversion parameter c in [0, 1)."""
    switch: str = "always"
    """always: surgery every step | auto: only after `patience` steps with task-gradient cosine < threshold."""
    threshold: float = 0.0
    """auto: cosine below which the task gradients count as conflicting."""
    patience: int = 3
    """auto: conflicting steps in a row before surgery switches on."""
    release: int = 3
    """auto: non-conflicting steps in a row before surgery switches off."""
    policy_only: bool = True
    """Apply the surgery to the policy (reward) gradients only and add the KL/entropy gradients afterwards."""
    pareto_cap: int = 5
    """Most Pareto-frontier checkpoints kept."""

    def __post_init__(self) -> None:
        _one_of("multi.switch", self.switch, ("always", "auto"))
        _check(0 <= self.cagrad_c < 1, "multi.cagrad_c", self.cagrad_c, "use a value in [0, 1)")
        for f in ("patience", "release", "pareto_cap"):
            _check(getattr(self, f) >= 1, f"multi.{f}", getattr(self, f), "use a positive integer")
