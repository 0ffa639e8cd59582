"""Models and tokenizers: the tiny built-in model, loading a policy (full fine-tuning, LoRA, QLoRA), the reference
policy, saving, and the mode switches that keep train / eval state from leaking between phases.

    reference under LoRA = the same weights with the adapter disabled (no second copy)      (DESIGN.md invariant)
    reference under full fine-tuning = a frozen deep copy taken at load time, eval mode, requires_grad False
    LoRA: W' = W + (alpha / r) · B A, B initialised to 0 so the adapted model starts equal to the base  (Hu et al. 2021)

Nothing here runs at import; loading takes the model section (`ModelConfig`) and the values chosen for this machine,
every other function plain values.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

import torch
from torch import nn

from grpo.config import ModelConfig, field_error  # load_policy reads the model section itself (one home)
from grpo.core.plumbing import cache_error, writing

TINY_NAME = "builtin:tiny"
"""`load_policy` name that builds the tiny model and tokenizer in code (tests and CPU smoke runs)."""
PAD, BOS, SYSTEM, USER, ASSISTANT, END = "<|pad|>", "<|bos|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"
SPECIAL_TOKENS = [PAD, BOS, SYSTEM, USER, ASSISTANT, END]
"""Special tokens of the tiny tokenizer; `<|end|>` closes every turn and is the EOS / stop token."""
ROLE_TOKENS = {"system": SYSTEM, "user": USER, "assistant": ASSISTANT}
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}<|system|>{% elif m['role'] == 'user' %}<|user|>"
    "{% elif m['role'] == 'assistant' %}<|assistant|>"
    "{% elif m['role'] == 'tool' %}<|system|>tool: "
    "{% else %}{{ raise_exception('unknown chat role: ' ~ m['role'] ~ ' (use system, user, assistant or tool)') }}"
    "{% endif %}{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
"""Each turn is `<|role|>content<|end|>`; the generation prompt is a bare `<|assistant|>`. A tool result (multi-turn
rollouts with rollout.tools) is `<|system|>tool: content<|end|>`: the vocabulary has no tool token of its own."""
DEFAULT_TINY_CORPUS = (
    "The answer is yes. The answer is no. I do not know. Cannot be determined.",
    "Question: who was more likely to forget? Answer: the grandfather, the grandson, unknown.",
    "Please answer the question with the letter of the option: A, B or C.",
)
"""Fallback BPE training text when no corpus is given; byte-level BPE still encodes any text."""
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}
CHECKPOINTING_KWARGS = {"use_reentrant": False}
"""Non-reentrant checkpointing works with frozen inputs (LoRA) and is the PyTorch-recommended variant."""


def build_tiny_tokenizer(corpus: Iterable[str] | None = None, vocab_size: int = 512,
                         save_dir: str | Path | None = None):
    """A byte-level BPE fast tokenizer trained in code on `corpus` (any text encodes, training takes well under 1 s).

    Specials `<|pad|> <|bos|> <|system|> <|user|> <|assistant|> <|end|>`; pad = `<|pad|>`, eos = `<|end|>`; the chat
    template closes each turn with `<|end|>` and `add_generation_prompt` appends `<|assistant|>`. No BOS is added
    (the template starts with a role token). Saved with `save_pretrained` when `save_dir` is given.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(list(corpus) if corpus is not None else list(DEFAULT_TINY_CORPUS), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token=PAD, bos_token=BOS, eos_token=END,
                                        padding_side="left")
    tokenizer.chat_template = TINY_CHAT_TEMPLATE
    if save_dir is not None:
        tokenizer.save_pretrained(str(save_dir))
    return tokenizer


def tiny_model_config(vocab_size: int, hidden: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                      intermediate: int | None = None, max_positions: int = 512, arch: str = "llama"):
    """A LlamaConfig or Qwen2Config of the given size (`intermediate` defaults to 2 · hidden)."""
    from transformers import LlamaConfig, Qwen2Config

    configs = {"llama": LlamaConfig, "qwen2": Qwen2Config}
    if arch not in configs:
        raise ValueError(f"tiny_model_config: arch={arch!r} is not supported; use one of {sorted(configs)}")
    if hidden % heads or heads % kv_heads:
        raise ValueError(f"tiny_model_config: hidden={hidden} must divide by heads={heads} and heads by "
                         f"kv_heads={kv_heads}; pick sizes such as hidden=64, heads=4, kv_heads=2")
    return configs[arch](vocab_size=vocab_size, hidden_size=hidden, intermediate_size=intermediate or 2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=max_positions, tie_word_embeddings=False)


def build_tiny_model(tokenizer, seed: int, attn_implementation: str = "eager", dtype: torch.dtype = torch.float32,
                     **sizes: Any):
    """A randomly initialised causal LM (see `tiny_model_config` for `sizes`) with pad/bos/eos from `tokenizer`.

    The initialisation draws from a forked RNG seeded with `seed`, so the global torch RNG is left untouched.
    """
    from transformers import AutoModelForCausalLM

    config = tiny_model_config(len(tokenizer), **sizes)
    config.pad_token_id, config.bos_token_id, config.eos_token_id = (
        tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation, dtype=dtype)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


@dataclass
class Policy:
    """The trained model with its tokenizer and, under full fine-tuning, a frozen reference copy."""

    model: nn.Module
    tokenizer: Any
    is_lora: bool
    ref_model: nn.Module | None = None
    """None under LoRA (the reference is the model with its adapter disabled); a frozen copy otherwise."""
    name: str = ""
    grad_scaler: Any = None
    """A torch.amp.GradScaler when training in fp16 (GPUs without bf16), else None."""

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The parameters the optimizer updates (LoRA matrices only under LoRA)."""
        return [p for p in self.model.parameters() if p.requires_grad]


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype | str:
    """`torch.bfloat16`, "bf16", "bfloat16", "auto", ... → what `from_pretrained(dtype=...)` takes."""
    if isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not known; use one of {sorted(DTYPES)} or 'auto'")
    return DTYPES[dtype]


def check_4bit_available() -> None:
    """4-bit weights (QLoRA) need bitsandbytes and a CUDA GPU: a ConfigError naming `model.load_in_4bit` when this
    machine lacks either. Decided before any model loads (grpo_train.cli runs it right after the config checks)."""
    if importlib.util.find_spec("bitsandbytes") is None:
        raise field_error("model.load_in_4bit", True, "4-bit weights (QLoRA) need bitsandbytes: `pip install "
                          "bitsandbytes` on a CUDA machine, or set model.load_in_4bit=false")
    if not torch.cuda.is_available():
        raise field_error("model.load_in_4bit", True, "4-bit weights (QLoRA) need a CUDA GPU and none is visible; "
                          "set model.load_in_4bit=false to train in full precision on this machine")


RANDOM_PREFIX = "random:"
"""`load_policy("random:<shape>")`: random weights of a shape from grpo.machine.memory_estimate.KNOWN_SHAPES
(case-insensitive) or of a local folder's config.json, with the tiny tokenizer. Memory and speed do not depend on weight
values, so this measures a real model's footprint with no download (benchmarks/gpu_memory.py)."""
RANDOM_MAX_POSITIONS = 8192
"""RoPE table length of random models: longer than any prompt + completion the benchmarks run."""
RANDOM_CHECKPOINTS = "grpo-random-models"
"""Folder under the temp dir where QLoRA's random bf16 checkpoints are written once and reused (16 GB for an 8B)."""


def random_model_config(name: str, tokenizer):
    """LlamaConfig of "random:<shape>" (Qwen2Config when the shape has q/k/v biases), pad/bos/eos from `tokenizer`."""
    import json

    from transformers import LlamaConfig, Qwen2Config

    from grpo.machine.memory_estimate import KNOWN_SHAPES, lookup_known_shape, shape_from_hf_config

    key = name[len(RANDOM_PREFIX):]
    config_file = Path(key).expanduser() / "config.json"
    shape = (shape_from_hf_config(json.loads(config_file.read_text()), name=key) if config_file.is_file()
             else lookup_known_shape(key))
    if shape is None:
        raise ValueError(f"model.name={name!r}: unknown shape {key!r}; use random:<name> with a name from "
                         f"grpo.machine.memory_estimate.KNOWN_SHAPES ({', '.join(sorted(KNOWN_SHAPES))}) or "
                         f"random:<folder with "
                         "config.json>")
    if shape.vocab < len(tokenizer):
        raise ValueError(f"model.name={name!r}: vocab {shape.vocab} is smaller than the tiny tokenizer's "
                         f"{len(tokenizer)} tokens; give the shape a vocab_size >= {len(tokenizer)}")
    sizes = dict(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                 num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
                 max_position_embeddings=RANDOM_MAX_POSITIONS, tie_word_embeddings=shape.tie_embeddings)
    if shape.attn_bias and shape.head_dim != shape.hidden // shape.heads:
        raise ValueError(f"model.name={name!r}: a q/k/v-bias (Qwen2) shape needs head_dim = hidden / heads")
    config = Qwen2Config(**sizes) if shape.attn_bias else LlamaConfig(**sizes, head_dim=shape.head_dim)
    config.pad_token_id, config.bos_token_id, config.eos_token_id = (
        tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id)
    return config


def build_random_model(name: str, tokenizer, *, seed: int, dtype: torch.dtype, attn_implementation: str,
                       device: str | torch.device):
    """Random weights of "random:<shape>", allocated and initialised directly on `device` in `dtype` (an 8B model
    takes seconds on a GPU; nothing is built in fp32 on the CPU first). The init RNGs are forked and seeded."""
    from transformers import AutoModelForCausalLM

    config = random_model_config(name, tokenizer)
    device = torch.device(device)
    rng_devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=rng_devices), torch.device(device):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation, dtype=dtype)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def _load_random(name: str, *, dtype, attn_implementation: str, load_in_4bit: bool, seed: int,
                 tiny_corpus: Iterable[str] | None, device: str):
    """(model, tokenizer) for "random:<shape>". QLoRA: bitsandbytes quantises only while `from_pretrained` loads a
    checkpoint, so the random bf16 model is saved once under <tmp>/RANDOM_CHECKPOINTS and loaded back in 4-bit through
    the same BitsAndBytesConfig as a hub model (robust across transformers versions, unlike swapping layers by hand)."""
    import re
    import tempfile

    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    tokenizer = build_tiny_tokenizer(tiny_corpus)
    dt = resolve_dtype(dtype)
    if not load_in_4bit:
        if dt == "auto":
            dt = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
        model = build_random_model(name, tokenizer, seed=seed, dtype=dt, attn_implementation=attn_implementation,
                                   device=device)
        return model, tokenizer
    check_4bit_available()
    compute = torch.bfloat16 if dt == "auto" else dt
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", name[len(RANDOM_PREFIX):]) + f"-seed{seed}"
    folder = Path(tempfile.gettempdir()) / RANDOM_CHECKPOINTS / slug
    if not (folder / "COMPLETE").is_file():  # written last: a run killed mid-save rewrites the folder
        print(f"writing random bf16 weights of {name} to {folder} for 4-bit loading ...", flush=True)
        model = build_random_model(name, tokenizer, seed=seed, dtype=torch.bfloat16,
                                   attn_implementation=attn_implementation, device="cuda")
        model.save_pretrained(str(folder))
        (folder / "COMPLETE").write_text(name)
        del model
        torch.cuda.empty_cache()
    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                               bnb_4bit_compute_dtype=compute)
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=compute, attn_implementation=attn_implementation,
                                                 quantization_config=quant)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model, tokenizer


def _load_base(model_cfg: ModelConfig, *, dtype, attn_implementation: str, seed: int,
               tiny_corpus: Iterable[str] | None, device: str | None):
    """(model, tokenizer) of `model_cfg.name`: the built-in tiny recipe (the section's tiny shape), random weights of
    a known shape, a packaged model by its catalog name (grpo/models/pretrained.py, converted once into a local
    folder), or a local path / hub id (4-bit and remote code as the section says).

    "random:<shape>" builds on `device` when given, else on CUDA when available, else on the CPU."""
    name, load_in_4bit = model_cfg.name, model_cfg.load_in_4bit
    if name.startswith(RANDOM_PREFIX):
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        return _load_random(name, dtype=dtype, attn_implementation=attn_implementation, load_in_4bit=load_in_4bit,
                            seed=seed, tiny_corpus=tiny_corpus, device=str(device))
    if name == TINY_NAME:
        if load_in_4bit:
            raise ValueError(f"load_in_4bit=True is not supported for {TINY_NAME}; set load_in_4bit=False")
        sizes = tiny_sizes(model_cfg)
        tokenizer = build_tiny_tokenizer(tiny_corpus, vocab_size=sizes.pop("vocab_size", 512))
        dt = resolve_dtype(dtype)
        model = build_tiny_model(tokenizer, seed, attn_implementation=attn_implementation,
                                 dtype=torch.float32 if dt == "auto" else dt, **sizes)
        return model, tokenizer
    from grpo.models.pretrained import adapter_base, resolve_model_name

    name = resolve_model_name(name)  # a catalog name (grpo/models/pretrained.py) → its converted local folder
    check_weight_files(name)
    with hub_errors_named(name):
        return _from_pretrained(name, dtype=dtype, attn_implementation=attn_implementation, base=adapter_base(name),
                                load_in_4bit=load_in_4bit, trust_remote_code=model_cfg.trust_remote_code)


class DamagedWeightsError(ValueError):
    """A weight file of the model folder is damaged or incomplete (a copy or download cut short)."""


class HubCacheError(OSError):
    """The Hugging Face cache (HF_HOME) cannot be written or read; the message names the variable to set."""


def check_weight_files(name: str) -> None:
    """For a local model folder: every *.safetensors file has a header that covers the whole file, or a
    DamagedWeightsError naming the file (a truncated copy would otherwise fail deep inside transformers with a
    SafetensorError and a traceback). Reads headers only."""
    folder = Path(name).expanduser()
    if not folder.is_dir():
        return
    from safetensors import SafetensorError, safe_open

    for file in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt"):
                pass
        except SafetensorError as err:
            raise DamagedWeightsError(f"{file} is damaged or incomplete (safetensors: {err}); copy or download "
                                      "it again") from None


@contextlib.contextmanager
def hub_errors_named(name: str) -> Iterator[None]:
    """Loader errors that name what to change: a damaged safetensors file (DamagedWeightsError), and a file error
    inside the Hugging Face cache (HubCacheError: set HF_HOME to a writable folder)."""
    from huggingface_hub import constants
    from safetensors import SafetensorError

    try:
        yield
    except SafetensorError as err:
        raise DamagedWeightsError(f"a .safetensors weight file of {name} is damaged or incomplete (safetensors: "
                                  f"{err}); download or copy it again") from None
    except OSError as err:
        why = cache_error(err, constants.HF_HOME, "the Hugging Face cache")
        if why is None:
            raise
        raise HubCacheError(why) from None


def _from_pretrained(name: str, *, dtype, attn_implementation: str, load_in_4bit: bool, trust_remote_code: bool,
                     base: str | None = None):
    """(model, tokenizer) of a local folder or hub id, through transformers' Auto classes. `base`: for an adapter
    folder, the local folder to load its base from (what transformers does with the adapter's own base name)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code)
    kwargs: dict[str, Any] = {"dtype": resolve_dtype(dtype), "attn_implementation": attn_implementation,
                              "trust_remote_code": trust_remote_code}
    if load_in_4bit:
        check_4bit_available()
        from transformers import BitsAndBytesConfig

        compute = resolve_dtype(dtype)
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16 if compute == "auto" else compute)
    model = AutoModelForCausalLM.from_pretrained(base or name, **kwargs)
    if base is not None:
        model.load_adapter(name)
    ready_for_batches(model, tokenizer)
    return model, tokenizer


def ready_for_batches(model: nn.Module, tokenizer) -> None:
    """A pad token (the EOS token when the tokenizer has none: pad positions are masked anyway) and left padding,
    which batched generation needs."""
    if tokenizer.pad_token_id is None:  # many base models ship without one
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    if getattr(model, "generation_config", None) is not None and model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id


def enable_checkpointing(model: nn.Module) -> None:
    """Non-reentrant activation checkpointing (transformers v5 name first, the v4 alias otherwise); cache off."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=dict(CHECKPOINTING_KWARGS))
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=dict(CHECKPOINTING_KWARGS))
    model.config.use_cache = False  # the KV cache is useless in training and conflicts with checkpointing


def tiny_sizes(model_cfg: ModelConfig) -> dict[str, int]:
    """The built-in tiny model's shape from the model section (key-value heads: half the heads, at least one)."""
    return {"hidden": model_cfg.tiny_hidden, "layers": model_cfg.tiny_layers, "heads": model_cfg.tiny_heads,
            "kv_heads": max(1, model_cfg.tiny_heads // 2), "vocab_size": model_cfg.tiny_vocab}


def load_policy(model_cfg: ModelConfig, *, dtype: str | torch.dtype = "float32", attn_implementation: str = "eager",
                seed: int = 0, tiny_corpus: Iterable[str] | None = None, device: str | None = None) -> Policy:
    """Load the policy `model_cfg.name` ("builtin:tiny", "random:<shape>", a packaged model, a local directory or a
    hub id) ready to train, with the section's LoRA, 4-bit, checkpointing, remote-code and tiny-shape settings.

    `dtype` and `attn_implementation` are the ones chosen for this machine (grpo/machine/hardware.py), not the
    section's "auto"; `tiny_corpus` trains the built-in tiny tokenizer; `device` is where "random:<shape>" weights
    are built (default: CUDA when available). LoRA wraps the model with peft (`task_type=CAUSAL_LM`); QLoRA
    (`load_in_4bit`, needs CUDA + bitsandbytes) loads NF4 double-quantised weights and runs
    `prepare_model_for_kbit_training`. Under full fine-tuning a frozen deep copy becomes `ref_model`.
    """
    model, tokenizer = _load_base(model_cfg, dtype=dtype, attn_implementation=attn_implementation, seed=seed,
                                  tiny_corpus=tiny_corpus, device=device)
    return policy_from_model(model, tokenizer, model_cfg, seed=seed)


def policy_from_model(model: nn.Module, tokenizer, model_cfg: ModelConfig, *, seed: int = 0) -> Policy:
    """A loaded (model, tokenizer) ready to train, as `load_policy` makes it (also for a model handed in from
    Python, which is trained in place), with the model section's LoRA, 4-bit and checkpointing settings: the frozen
    reference copy, or the LoRA adapter; checkpointing. `seed` draws LoRA's A matrices."""
    name, lora, gradient_checkpointing = model_cfg.name, model_cfg.lora, model_cfg.gradient_checkpointing
    if not lora:
        if gradient_checkpointing:
            enable_checkpointing(model)
        ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        model.train()
        return Policy(model=model, tokenizer=tokenizer, is_lora=False, ref_model=ref_model, name=name)

    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    if model_cfg.load_in_4bit:
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=gradient_checkpointing,
                                                gradient_checkpointing_kwargs=dict(CHECKPOINTING_KWARGS))
    elif gradient_checkpointing:
        enable_checkpointing(model)
    lora_config = LoraConfig(r=model_cfg.lora_r, lora_alpha=model_cfg.lora_alpha, lora_dropout=model_cfg.lora_dropout,
                             target_modules=model_cfg.lora_target_modules, task_type="CAUSAL_LM")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # LoRA A is drawn at random: seed it without touching the global RNG
        model = get_peft_model(model, lora_config)
    if gradient_checkpointing:
        # The frozen embeddings give inputs without grad; the hook keeps checkpointed blocks in the graph.
        model.enable_input_require_grads()
    model.train()
    return Policy(model=model, tokenizer=tokenizer, is_lora=True, ref_model=None, name=name)


@contextlib.contextmanager
def reference(policy: Policy) -> Iterator[nn.Module]:
    """Yield the module whose forward gives reference log-probs: the adapter-disabled model under LoRA, the frozen
    copy otherwise. It does not change train/eval mode or grad: wrap it in `inference_mode(...)` for the pass."""
    if policy.is_lora:
        with policy.model.disable_adapter():
            yield policy.model
    else:
        if policy.ref_model is None:
            raise ValueError(f"policy {policy.name!r} is full fine-tuning but has no ref_model; load it with "
                             "load_policy with model.lora=false, which makes the frozen copy")
        yield policy.ref_model


def rebase_reference(policy: Policy, seed: int = 0) -> Policy:
    """Make the current policy the KL reference (called after SFT warm-up: RL stays close to the SFT model).

    Full fine-tuning: the frozen copy takes the current weights. LoRA: the trained adapter is merged into the base
    weights and a fresh adapter of the same config (B = 0, so the function is unchanged) is attached; the reference
    "adapter disabled" is then the SFT model. The trainable parameters are new objects: rebuild the optimizer.
    QLoRA cannot merge into 4-bit weights: its reference stays the pre-SFT base (a warning says so).
    """
    if not policy.is_lora:
        with torch.no_grad():
            policy.ref_model.load_state_dict(policy.model.state_dict())
        return policy
    from peft import get_peft_model

    base = policy.model.get_base_model()
    if getattr(base, "is_loaded_in_4bit", False) or getattr(base, "is_quantized", False):
        import warnings

        warnings.warn("QLoRA: the SFT adapter cannot be merged into 4-bit weights, so the KL reference stays the "
                      "pre-SFT base model; expect a larger KL at the start of RL", stacklevel=2)
        return policy
    lora_config = policy.model.peft_config["default"]
    was_training = policy.model.training
    merged = policy.model.merge_and_unload()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = get_peft_model(merged, lora_config)
    if activation_checkpointing(merged):
        model.enable_input_require_grads()
    model.train(was_training)
    return Policy(model=model, tokenizer=policy.tokenizer, is_lora=True, ref_model=None, name=policy.name,
                  grad_scaler=policy.grad_scaler)


def activation_checkpointing(model: Any) -> bool:
    """Whether activation (gradient) checkpointing is on: transformers 5's is_activation_checkpointing, the older
    is_gradient_checkpointing where that is all there is (transformers 5 warns that the old name is deprecated)."""
    flag = getattr(model, "is_activation_checkpointing", None)
    return bool(getattr(model, "is_gradient_checkpointing", False) if flag is None else flag)


def save_pretrained(policy: Policy, out_dir: str | Path, state_dict: dict | None = None,
                    include_base: bool = False) -> Path:
    """Save the adapter (LoRA) or the full model, plus the tokenizer, in Hugging Face format under `out_dir`.

    Reload with `AutoModelForCausalLM.from_pretrained(out_dir)` (full) or `PeftModel.from_pretrained(base, out_dir)`
    (LoRA). `include_base=True` also writes the base weights and tokenizer under `out_dir/base` (for a built-in
    model that exists only in memory; it deep-copies the model, so keep it for small ones). `state_dict`: the
    weights to write instead of the model's own (the whole model gathered from FSDP shards).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with writing(out):
        policy.model.save_pretrained(str(out), **({"state_dict": state_dict} if state_dict is not None else {}))
        policy.tokenizer.save_pretrained(str(out))
    if include_base and policy.is_lora:
        # unload() drops the LoRA layers without merging them; on a copy, so the policy keeps its adapter
        base = copy.deepcopy(policy.model).unload()
        base.save_pretrained(str(out / "base"))
        policy.tokenizer.save_pretrained(str(out / "base"))
    return out


@contextlib.contextmanager
def _eval_state(model: nn.Module, use_cache: bool) -> Iterator[nn.Module]:
    """eval() on every module, `use_cache` as asked, activation checkpointing off; the exact previous state is
    restored on exit (each module's train flag and checkpointing flag, config and generation_config use_cache)."""
    training = {m: m.training for m in model.modules()}
    checkpointing = {m: m.gradient_checkpointing for m in model.modules() if hasattr(m, "gradient_checkpointing")}
    holders = [h for h in (getattr(model, "config", None), getattr(model, "generation_config", None))
               if h is not None and hasattr(h, "use_cache")]
    caches = [(h, h.use_cache) for h in holders]
    try:
        model.eval()
        for m in checkpointing:
            m.gradient_checkpointing = False
        for h in holders:
            h.use_cache = use_cache
        yield model
    finally:
        for m, flag in training.items():
            m.training = flag
        for m, flag in checkpointing.items():
            m.gradient_checkpointing = flag
        for h, flag in caches:
            h.use_cache = flag


def base_model(model: nn.Module) -> nn.Module:
    """The transformers model under the DDP (`.module`) and PEFT (`get_base_model()`) wrappers."""
    inner = getattr(model, "module", model)
    return inner.get_base_model() if hasattr(inner, "get_base_model") else inner


def has_sliding_window(config: Any) -> bool:
    """Whether some attention layer of the model only sees a window of recent tokens (Mistral's `sliding_window`,
    `layer_types` with "sliding_attention" as in Gemma / gpt-oss, Qwen2 with `use_sliding_window`)."""
    layer_types = getattr(config, "layer_types", None)
    if layer_types:
        return any(t != "full_attention" for t in layer_types)
    return getattr(config, "sliding_window", None) is not None


def has_dropout(model: nn.Module) -> bool:
    """Whether train mode draws random masks anywhere: an nn.Dropout with p > 0 (LoRA dropout included), or a
    config dropout probability > 0 that attention / MLP code applies functionally (attention_dropout, *_pdrop, ...).
    Without dropout a train-mode forward computes what an eval-mode forward computes."""
    inner = getattr(model, "module", model)
    if any(isinstance(m, nn.Dropout) and m.p > 0 for m in inner.modules()):
        return True
    configs = [getattr(m, "config", None) for m in inner.modules()]
    for config in {id(c): c for c in configs if c is not None}.values():
        for key, value in vars(config).items():
            if ("dropout" in key or key.endswith("pdrop")) and isinstance(value, (int, float)) and value > 0:
                return True
    return False


@contextlib.contextmanager
def generation_mode(model: nn.Module) -> Iterator[nn.Module]:
    """For `generate`: dropout off, KV cache on, checkpointing off; previous state restored exactly on exit."""
    with _eval_state(model, use_cache=True):
        yield model


@contextlib.contextmanager
def inference_mode(model: nn.Module) -> Iterator[nn.Module]:
    """For old/reference log-prob passes: dropout off, no KV cache, checkpointing off, `torch.no_grad()`.

    `no_grad` rather than `torch.inference_mode` so the outputs can still be used as constants in autograd later.
    """
    with _eval_state(model, use_cache=False), torch.no_grad():
        yield model
