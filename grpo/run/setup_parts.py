"""Building a run's parts from config sections: device, data, policy, rewards, judge, trackers, stop tokens, the
optimizer and its companions, and the run-wide decisions taken once (prompt sharing, sampling streams, sharding).

The entry point hands each function one config section (or plain values); nothing here reads a global.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pickle
import random
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import torch

from grpo import config as C
from grpo.config import ConfigError
from grpo.core.gradient_surgery import ConflictMonitor
from grpo.core.step_types import Sample
from grpo.data.json_rows import DataFileError
from grpo.models.distributed import Dist
from grpo.models.logprobs import shared_prompt_blocker, shares_by_size
from grpo.models.modeling import Policy
from grpo.phases.update import TaskGradientSurgery, adamw


def choose_device(requested: str) -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"train.device={requested!r} but no CUDA GPU is visible: use train.device=cpu or auto")
    return torch.device(requested)


@dataclass(frozen=True)
class RunSamples:
    """A run's rows: every row in load order (the built-in tokenizer's corpus), and the train / held-out split."""

    every: list[Sample]
    train: list[Sample]
    heldout: list[Sample]


def load_samples(data, seed: int, tasks: Mapping[str, Any] | None = None, *, announce: bool = True) -> RunSamples:
    """The rows of the built-in source `data.source` (demo | dual | none | a file, folder or Hub id whose rows name
    their task), split by the stable hash of their ids, plus each `tasks.<task>` source (grpo/data/sources.py: its own
    held-out rows, or the same hash split). `data` is the DataConfig section, `tasks` Config.tasks.

    A task name given by both (tasks.fairness beside data.source=demo) is a ConfigError naming tasks.<task>.
    `announce`: print the notes and warnings on the rows (False on every process of a run but the first: each loads
    the same rows and would print the same lines)."""
    from grpo.data.loading import split_heldout_samples
    from grpo.data.sources import TaskSource, load_source_samples, load_sources
    from grpo.models.tokens import raw_prompts

    tasks = dict(tasks or {})
    if data.source in ("demo", "dual"):
        builtin = _builtin_samples(data, seed, announce)
    elif data.source == "none":
        builtin = []
    else:  # one source whose rows name their tasks: the `task` column (the original JSONL task file)
        builtin, _ = load_source_samples("", TaskSource(path=data.source, task_field="task"), data.system_prompt)
    train, heldout = split_heldout_samples(builtin, data.heldout_fraction)
    if data.bbq_ambiguous_share:
        train = _thinned_bbq(train, data, seed, announce)
    clash = sorted({s.task for s in builtin} & set(tasks))
    if clash:
        raise ConfigError(f"config field `tasks.{clash[0]}` names a task that data.source={data.source!r} already "
                          f"has: give your task another name, or set data.source=none to train only yours",
                          field=f"tasks.{clash[0]}")
    every = list(builtin)
    if tasks:
        loaded = load_sources(tasks, data.heldout_fraction, system_prompt=data.system_prompt)
        train, heldout = train + loaded.train, heldout + loaded.heldout
        every += loaded.train + loaded.heldout
    repeats = duplicate_report(every)
    for line in repeats if announce else ():
        print(f"warning: {line}", file=sys.stderr)
    if not train:
        why = f" ({'; '.join(repeats)}: the split hashes ids, so rows sharing an id land on one side)" if repeats else ""
        raise ValueError(f"data.source={data.source!r} and tasks {sorted(tasks)} gave no training rows{why}")
    if data.prompt_format == "trl":  # TRL's standard-form prompts: the text as it is, no chat template
        every, train, heldout = raw_prompts(every), raw_prompts(train), raw_prompts(heldout)
    return RunSamples(every=every, train=train, heldout=heldout)


def _thinned_bbq(train: list[Sample], data, seed: int, announce: bool) -> list[Sample]:
    """The training rows with BBQ's thinned to data.bbq_ambiguous_share ambiguous contexts, and one line saying so
    (with `announce`); a ConfigError when there are no BBQ training rows to thin."""
    from grpo.data.bbq import CONDITIONS, bbq_condition, with_ambiguous_share

    def conditions(rows: list[Sample]) -> dict[str, int]:
        counts = Counter(bbq_condition(s) for s in rows)
        return {c: counts[c] for c in CONDITIONS}

    before = conditions(train)
    if not sum(before.values()):
        raise ConfigError(f"config field `data.bbq_ambiguous_share` = {data.bbq_ambiguous_share} is set but "
                          f"data.source={data.source!r} has no BBQ training rows; set it with data.source=dual, or "
                          "leave it at 0", field="data.bbq_ambiguous_share")
    kept = with_ambiguous_share(train, data.bbq_ambiguous_share, seed)
    after = conditions(kept)
    if announce:
        print(f"data.bbq_ambiguous_share={data.bbq_ambiguous_share}: BBQ training rows {before['ambig']} ambiguous + "
              f"{before['disambig']} disambiguated -> {after['ambig']} + {after['disambig']}")
    return kept


def duplicate_report(samples: Iterable[Sample], show: int = 3) -> list[str]:
    """One line per task whose rows repeat: how many rows copy an earlier row exactly (same id, prompt and gold), how
    many ids more than one row uses, and the first `show` offenders with their counts. [] when nothing repeats."""
    by_task: dict[str, dict[str, list[Sample]]] = {}
    for s in samples:
        by_task.setdefault(s.task, {}).setdefault(s.id, []).append(s)
    lines = []
    for task, ids in sorted(by_task.items()):
        shared = {i: rows for i, rows in ids.items() if len(rows) > 1}
        if not shared:
            continue
        copies = sum(len(rows) - len({repr((r.messages, r.gold, r.target)) for r in rows}) for rows in shared.values())
        first = ", ".join(f"{i!r} x{len(rows)}" for i, rows in list(shared.items())[:show])
        n_rows = sum(map(len, ids.values()))
        lines.append(f"task {task!r}: {len(shared)} id(s) used by more than one row, {copies} of its {n_rows} rows "
                     f"exact duplicates of an earlier row (first: {first})")
    return lines


def _builtin_samples(data, seed: int, announce: bool = True) -> list[Sample]:
    """The demo's synthetic rows, or BBQ + HaluEval from data.data_dir."""
    from grpo.data.halueval import RECOGNITION
    from grpo.data.loading import DataSpec, load_task

    if data.source == "demo":
        from grpo.data.demo_tasks import make_demo_samples

        return _with_system(make_demo_samples(data.demo_size, seed=seed), data.system_prompt)
    system = data.system_prompt or None
    root = Path(data.data_dir)
    if not (root / "bbq").is_dir():  # every task data.source=dual names must have rows
        raise DataFileError(f"data.source=dual: {root / 'bbq'} does not exist (data.data_dir={str(root)!r}): point "
                            "data.data_dir at the folder with bbq/<Category>.jsonl and halueval/<subset>_data.json")
    specs = [DataSpec(kind="bbq", path=str(root / "bbq"), categories=tuple(data.bbq_categories),
                      n_per_category=data.bbq_per_category, seed=seed, system_prompt=system,
                      shuffle_options=data.shuffle_options)]
    if data.halueval_subsets and not (root / "halueval").is_dir():
        raise DataFileError(f"data.source=dual: {root / 'halueval'} does not exist, so the hallucination task has no "
                            f"rows (data.halueval_subsets={data.halueval_subsets}); add the folder, or set "
                            "data.halueval_subsets= (empty) to train fairness alone")
    paths = {subset: root / "halueval" / f"{RECOGNITION.get(subset, subset)}_data.json"  # "qa_recognition" reads qa
             for subset in data.halueval_subsets}
    missing = [path for path in paths.values() if not path.exists()]
    if data.halueval_subsets and len(missing) == len(data.halueval_subsets):
        raise DataFileError(f"data.source=dual: none of data.halueval_subsets={data.halueval_subsets} is present: "
                            f"{', '.join(map(str, missing))} do not exist; name a subset whose file is there, or set "
                            "data.halueval_subsets= (empty) to train fairness alone")
    for subset, path in paths.items():
        if path in missing:
            if announce:
                print(f"note: HaluEval subset {subset!r} skipped: {path} does not exist", file=sys.stderr)
            continue
        specs.append(DataSpec(kind="halueval", path=str(path), subset=subset, limit=data.halueval_per_subset,
                              max_doc_chars=data.max_document_chars, system_prompt=system, seed=seed))
    samples: list[Sample] = []
    for spec in specs:
        samples += load_task(spec)[0]
    return samples


def _with_system(samples: list[Sample], system_prompt: str) -> list[Sample]:
    if not system_prompt:
        return samples
    from dataclasses import replace

    return [replace(s, messages=({"role": "system", "content": system_prompt},) + tuple(s.messages))
            for s in samples]


def model_load_error(name: str, error: BaseException) -> ConfigError:
    """The ConfigError for a model.name that does not load (a missing path, a file that is no model folder, a hub id
    with no network, a pickle): the name and the loader's first line, no traceback."""
    from grpo.data.dataset_dicts import offline_message
    from grpo.data.tables import looks_like_hub_id

    first = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
    path = Path(name).expanduser()
    hub_id = looks_like_hub_id(name) and not path.exists() and type(error).__name__ != "HubCacheError"
    offline = offline_message(name, "model.name", "model") if hub_id else None  # (an unusable cache: named below)
    if type(error).__name__ == "NoMatchingPeftModuleError" or first.startswith("Target modules"):  # peft's
        return ConfigError(f"config field `model.lora_target_modules` is invalid: {first} (model {name!r}); name "
                           "modules the model has (TRL's lora_target_modules sets this field)",
                           field="model.lora_target_modules")
    if offline is not None:  # transformers says only that it could not connect
        return ConfigError(f"config field `model.name` = {name!r} cannot be loaded: {offline.split(': ', 1)[1]}",
                           field="model.name")
    why = (f"{path} does not exist" if name.startswith(("/", ".", "~")) and not path.exists()
           else f"{path} is a file, not a model folder (config.json, weights as safetensors)" if path.is_file()
           else f"{type(error).__name__}: {first}")
    return ConfigError(f"config field `model.name` = {name!r} cannot be loaded: {why}; give builtin:tiny, a packaged "
                       "model name, a local model folder or a hub id", field="model.name")


def policy_from_config(model_cfg, device: torch.device, corpus: Iterable[str], seed: int,
                       loaded: tuple[Any, Any] | None = None):
    """Load the policy named by the model section, with precision and attention chosen for this machine; or, with
    `loaded` = (model, tokenizer) handed in from Python, train that model (in place, in its own dtype and attention)
    with the section's LoRA, checkpointing and compile settings."""
    from grpo.models.hardware import choose_attention, choose_precision, detect_capabilities
    from grpo.models.modeling import load_policy, policy_from_model, ready_for_batches

    on_cuda = device.type == "cuda"
    if loaded is not None:
        model, tokenizer = loaded
        ready_for_batches(model, tokenizer)
        dtype = next(model.parameters()).dtype
        use_scaler = dtype == torch.float16  # as choose_precision decides for fp16 weights: loss scaling
        policy = policy_from_model(model, tokenizer, model_cfg, seed=seed)
    else:
        caps = detect_capabilities()
        dtype, use_scaler, dtype_why = choose_precision(model_cfg.dtype, on_cuda,
                                                        bool(caps.get("bf16_supported")) and on_cuda,
                                                        full_finetune=not model_cfg.lora)
        attn, attn_why = choose_attention(model_cfg.attn_implementation, bool(caps.get("flash_attn_importable")),
                                          caps.get("compute_capability") if on_cuda else None, dtype)
        if os.environ.get("RANK", "0") == "0":  # one line per run, not per data-parallel process
            print(f"precision: {dtype} ({dtype_why}); attention: {attn} ({attn_why})")
        try:
            policy = load_policy(model_cfg, dtype=dtype, attn_implementation=attn, seed=seed, tiny_corpus=list(corpus))
        except (OSError, ValueError, ImportError, pickle.UnpicklingError, EOFError) as e:
            raise model_load_error(model_cfg.name, e) from None
    policy.grad_scaler = torch.amp.GradScaler("cuda") if use_scaler and on_cuda else None
    if model_cfg.compile:
        # In place (parameter names unchanged, so checkpoints stay compatible); dynamic shapes because every
        # step has other prompt and completion lengths. Off by default: not yet measured to pay.
        policy.model.compile(dynamic=True)
        print("model.compile: the model forward is compiled with torch.compile(dynamic=True)")
    if not model_cfg.load_in_4bit:
        policy.model.to(device)
        if policy.ref_model is not None:
            policy.ref_model.to(device)
    return policy


def parse_reward_spec(task: str, text: str) -> tuple[list[tuple[str, float]], str | None]:
    """"grader:w,module:fn:w|fallback" -> ([(grader, w), ...], fallback). A term without :w has weight 1."""
    body, _, fallback = text.partition("|")
    terms = []
    for part in (p.strip() for p in body.split(",") if p.strip()):
        name, _, weight = part.rpartition(":")
        try:
            terms.append((name, float(weight)) if name else (part, 1.0))
        except ValueError:
            terms.append((part, 1.0))
    if not terms:
        raise ConfigError(f"config field `rewards.{task}` = {text!r} is invalid: give grader:weight terms, e.g. "
                          "bbq_rule:1.0,format:0.2", field=f"rewards.{task}")
    return terms, (fallback.strip() or None)


BUILTIN_TASKS = ("fairness", "hallucination")
"""The built-in sources' task names (demo, dual), whose kl.<task> / rewards.<task> entries presets carry: they may
stay in a run that trains only your own tasks."""


def check_task_entries(kl_tasks: Iterable[str], tasks: list[str]) -> None:
    """A kl.<task> entry naming no task of the run (besides kl.default and the built-in tasks) is a ConfigError
    naming it: a misspelt task (kl.fairnes) would leave the real task on kl.default, silently."""
    unknown = sorted(set(kl_tasks) - {"default", *BUILTIN_TASKS} - set(tasks))
    if unknown:
        raise ConfigError(f"config field `kl.{unknown[0]}` names no task of this run (its tasks: {', '.join(tasks)}): "
                          "fix the task's name or drop the entry", field=f"kl.{unknown[0]}")


def reward_specs(source: str, rewards: Mapping[str, str], tasks: list[str],
                 custom: Iterable[str] = (), aggregation: str = "mean") -> dict[str, Any]:
    """A RewardSpec per task: its rewards.<task> entry, else the built-in source's default terms (the demo's
    graders; BBQ's and HaluEval's for tasks named fairness / hallucination). `custom`: the tasks.<task> names,
    which have no default: a custom task without rewards.<task> is a ConfigError naming that field.
    `aggregation`: loss.reward_aggregation, how each task's terms make its reward."""
    from grpo.data.demo_tasks import DEMO_REWARDS
    from grpo.grading.scoring import RewardSpec

    defaults = DEMO_REWARDS if source == "demo" else {"fairness": "bbq_rule:1.0,format:0.2",
                                                      "hallucination": "halueval_rule:1.0,format:0.2"}
    custom = set(custom)
    # a misspelt task name would otherwise leave that task on its defaults, silently; the built-in tasks' entries
    # that presets carry (fairness, hallucination) may stay when the run trains only your own tasks
    unknown = sorted(set(rewards) - set(tasks) - set(DEMO_REWARDS) - set(BUILTIN_TASKS))
    if unknown:
        raise ConfigError(f"config field `rewards.{unknown[0]}` names no task of this run (its tasks: "
                          f"{', '.join(tasks)}): fix the task's name or drop the entry", field=f"rewards.{unknown[0]}")
    specs = {}
    for task in tasks:
        text = rewards.get(task) or (None if task in custom else defaults.get(task))
        if text is None:
            raise ConfigError(f"task {task!r} has no reward terms: add rewards.{task}=grader:weight, e.g. "
                              f"--set rewards.{task}=path/to/rewards.py:my_reward:1.0 (docs/CUSTOM_TASKS.md "
                              f"lists the built-in graders)", field=f"rewards.{task}")
        terms, fallback = parse_reward_spec(task, text)
        try:
            specs[task] = RewardSpec(task=task, terms=tuple(terms), fallback=fallback, aggregation=aggregation)
        except ValueError as err:  # a weight <= 0, the judge as its own fallback
            raise ConfigError(f"config field `rewards.{task}` = {text!r} is invalid: {err}",
                              field=f"rewards.{task}") from None
    return specs


def build_trackers(train_cfg, run_dir: Path):
    from grpo.run.tracking import make_trackers

    return make_trackers(run_dir, tensorboard=train_cfg.tensorboard, wandb_project=train_cfg.wandb_project or None)


def stop_token_ids(rollout_cfg, tokenizer) -> tuple[int, ...]:
    """The ids that end a rollout: the tokenizer's end-of-turn / EOS token, then each of rollout.stop_strings
    (each must be one token of the tokenizer), without repeats."""
    from grpo.models.tokens import stop_token_id

    stops = [stop_token_id(tokenizer)]
    for text in rollout_cfg.stop_strings:
        ids = tokenizer.convert_tokens_to_ids(text)
        if ids is None or ids == tokenizer.unk_token_id:
            encoded = tokenizer.encode(text, add_special_tokens=False)
            if len(encoded) != 1:
                raise ValueError(f"rollout.stop_strings entry {text!r} is {len(encoded)} tokens; each stop must be "
                                 "exactly one token of the tokenizer")
            ids = encoded[0]
        stops.append(int(ids))
    return tuple(dict.fromkeys(stops))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def shares_prompts(cfg: C.Config, train_model: torch.nn.Module, dist: Dist) -> bool:
    """Whether the forward passes encode each prompt once for its K completions (model.shared_prompt_forward),
    decided once: what blocks it (grpo/models/logprobs.shared_prompt_blocker) does not change during a run."""
    mode = cfg.model.shared_prompt_forward
    if mode == "off":
        return False
    why = shared_prompt_blocker(train_model, training=True)
    if why is not None:
        if mode == "on":
            raise C.ConfigError(f"model.shared_prompt_forward=on cannot apply here: {why}. Use auto (it turns "
                                "itself off) or off", field="model.shared_prompt_forward")
        if dist.is_main:
            print(f"model.shared_prompt_forward=auto: off for this run ({why}); every row encodes its own prompt")
        return False
    return shares_by_size(mode, sum(p.numel() for p in train_model.parameters()))


def check_sharding(cfg: C.Config, policy: Policy, dist: Dist) -> None:
    """What FSDP sharding supports: full fine-tuning in bf16 / fp32 with the summed loss."""
    problems = [why for bad, why in [
        (cfg.model.lora or cfg.model.load_in_4bit, "LoRA / QLoRA (model.lora=false: sharding is for full fine-tuning; "
                                                   "an adapter fits every process, use train.sharding=none)"),
        (cfg.multi.combine != "sum", "per-task gradient surgery (multi.combine=sum)"),
        (policy.grad_scaler is not None, "fp16 loss scaling (model.dtype=bfloat16 or float32)"),
        (cfg.sft.steps > 0 and cfg.sft.batch_size % dist.world != 0,
         f"an SFT batch that does not split evenly over {dist.world} processes (sft.batch_size)")] if bad]
    if problems:
        raise C.ConfigError("train.sharding=fsdp does not support " + "; ".join(problems), field="train.sharding")


def choose_graph_memory(cfg: C.Config, policy: Policy, device: torch.device, announce: bool) -> None:
    """What the graph engine may hold on a GPU, decided once from the memory estimate and recorded on the model's
    graph step (grpo/models/graph_decode.py): rollout.fold_lora=auto folds LoRA for the rollouts where the copy leaves
    the step's peak where it is (`lora_fold_choice`; on / off need no decision, the CPU folds: host memory, nothing to
    estimate), and the decoding buffers kept between rollouts are what the step's peak phase leaves free
    (`graph_cache_choice`). Printed once."""
    from grpo.models.graph_decode import graph_step_for
    from grpo.phases.generate import choose_engine
    from grpo.run.memory_inputs import graph_cache_choice, lora_fold_choice

    if device.type != "cuda" or choose_engine(policy.model, cfg.rollout.engine, cfg.rollout.cache_implementation,
                                              cfg.train.sharding == "fsdp") != "graph":
        return
    graph = graph_step_for(policy.model)
    capability = torch.cuda.get_device_capability(device)
    graph.keep_bytes, kept = graph_cache_choice(cfg, capability)
    if announce:
        print(f"graph engine: decoding buffers {kept}")
    if policy.is_lora and cfg.rollout.fold_lora == "auto":
        fold, why = lora_fold_choice(cfg, capability)
        graph.fold_auto = fold
        if announce:
            print(f"rollout.fold_lora=auto: {'folded' if fold else 'not folded'} for rollouts ({why})")


def per_completion_sampling(rollout: C.RolloutConfig, dist: Dist) -> bool:
    """Whether rollouts draw from per-completion streams (rollout.sampling_rng; auto = when several processes)."""
    mode = rollout.sampling_rng
    return mode == "per_completion" or (mode == "auto" and dist.active)


def check_precision(multi: C.MultiConfig, policy: Policy) -> None:
    """multi.combine other than sum needs bf16 or fp32 weights: the per-task gradients are not loss-scaled."""
    if policy.grad_scaler is not None and multi.combine != "sum":
        raise C.ConfigError(f"multi.combine={multi.combine!r} needs bf16 or fp32 weights: the per-task gradients are "
                            "not loss-scaled, so fp16 (this GPU has no bf16) would under- or overflow; use "
                            "multi.combine=sum or model.dtype=float32", field="multi.combine")


def build_surgery(cfg: C.Config, params: list[torch.nn.Parameter], tasks: list[str]):
    """PCGrad / CAGrad over per-task gradients when multi.combine asks for it (and there are several tasks)."""
    if cfg.multi.combine == "sum" or len(tasks) < 2:
        return None
    monitor = ConflictMonitor(mode=cfg.multi.switch, threshold=cfg.multi.threshold, patience=cfg.multi.patience,
                              release=cfg.multi.release)
    return TaskGradientSurgery(params, tasks, cfg.multi.combine, cfg.multi.cagrad_c, monitor,
                               policy_only=cfg.multi.policy_only, seed=cfg.train.seed)


def parse_task_mix(text: str) -> dict[str, float] | None:
    """"a:1,b:2" -> {"a": 1.0, "b": 2.0}; empty -> None (equal shares)."""
    if not text:
        return None
    pairs = (p.split(":") for p in text.split(","))
    try:
        return {task.strip(): float(w) for task, w in pairs}
    except ValueError:
        raise C.ConfigError(f"config field `data.task_mix` = {text!r} is invalid: weights must be numbers") from None


def build_optimizer(train: C.TrainConfig, params: list[torch.nn.Parameter], total_updates: int):
    """AdamW over the trainable parameters, with train.lr_scheduler over the RL phase's `total_updates` optimizer
    steps after its warm-up (warmup_steps, or warmup_ratio of the steps)."""
    optimizer = adamw(params, lr=train.lr, weight_decay=train.weight_decay)
    warmup = train.warmup_steps or math.ceil(total_updates * train.warmup_ratio)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda n: lr_factor(n, train.lr_scheduler, warmup, total_updates))
    return optimizer, scheduler


def epoch_steps(n_prompts: int, prompts_per_step: int, epochs: float) -> int:
    """RL steps of `epochs` passes over `n_prompts` training prompts, `prompts_per_step` a step: TRL's count
    (transformers' Trainer over GRPO's RepeatSampler, which drops the last incomplete batch of an epoch)."""
    return math.ceil(epochs * (n_prompts // prompts_per_step))


def with_epochs(cfg: C.Config, train: Mapping[str, list], world: int, announce: bool) -> C.Config:
    """`cfg` with what counts epochs resolved over the loaded training rows: train.max_steps from train.num_epochs
    (unchanged when num_epochs is 0), checkpoint.every from checkpoint.every_epoch and train.eval_every from
    train.eval_every_epoch (the RL steps of an epoch: TRL's epoch ends, whatever decides the run's length); a
    ConfigError when an epoch holds no whole step."""
    n_prompts, per_step = sum(len(rows) for rows in train.values()), cfg.prompts_per_step * world
    per_epoch = n_prompts // per_step
    if cfg.checkpoint.every_epoch or cfg.train.eval_every_epoch:
        flag = "checkpoint.every_epoch" if cfg.checkpoint.every_epoch else "train.eval_every_epoch"
        if per_epoch < 1:
            raise C.ConfigError(f"{flag}=true: {n_prompts} training prompts hold no whole RL step of {per_step} "
                                "prompts; lower the batch or give more rows", field=flag)
        if cfg.checkpoint.every_epoch:
            cfg = dataclasses.replace(cfg, checkpoint=dataclasses.replace(cfg.checkpoint, every=per_epoch))
        if cfg.train.eval_every_epoch:
            cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, eval_every=per_epoch))
        if announce:
            print(f"an epoch is {per_epoch} RL steps ({n_prompts} training prompts, {per_step} a step): "
                  + ", ".join(f"{name}={per_epoch}" for name, on in (("checkpoint.every", cfg.checkpoint.every_epoch),
                                                                   ("train.eval_every", cfg.train.eval_every_epoch))
                              if on))
    if not cfg.train.num_epochs:
        return cfg
    steps = epoch_steps(n_prompts, per_step, cfg.train.num_epochs)
    if steps < 1:
        raise C.ConfigError(f"train.num_epochs={cfg.train.num_epochs}: {n_prompts} training prompts hold no whole RL "
                            f"step of {per_step} prompts; lower the batch or give more rows", field="train.num_epochs")
    if announce:
        from grpo.run.vocabulary import in_user_terms

        print(in_user_terms(f"train.num_epochs={cfg.train.num_epochs:g}: {n_prompts} training prompts, {per_step} a "
                            f"step, {n_prompts // per_step} steps an epoch -> {steps} RL steps ({steps * cfg.loss.mu} "
                            "optimizer steps)", C.to_dict(cfg)))
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, max_steps=steps))


def lr_factor(n: int, schedule: str, warmup: int, total: int) -> float:
    """The learning rate of optimizer step n (0-based) as a share of train.lr: transformers' get_scheduler formulas
    (get_constant_schedule_with_warmup, get_linear_schedule_with_warmup, get_cosine_schedule_with_warmup with half a
    cycle), so TRL's, under any of C.LR_SCHEDULERS."""
    if n < warmup:
        return n / max(1, warmup)
    if schedule == "constant":
        return 1.0
    if schedule == "linear":
        return max(0.0, (total - n) / max(1, total - warmup))
    progress = (n - warmup) / max(1, total - warmup)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))


def prompt_token_limit(max_prompt_tokens: int, max_new_tokens: int, positions: int | None) -> tuple[int, str]:
    """(the longest prompt kept, why when it is below data.max_prompt_tokens): a prompt and its completion must fit
    the model's positions (config.max_position_embeddings; None = no limit known). A completion alone that does not
    fit is a ConfigError naming rollout.max_new_tokens."""
    if not positions or max_prompt_tokens + max_new_tokens <= positions:
        return max_prompt_tokens, ""
    if max_new_tokens >= positions:
        raise ConfigError(f"config field `rollout.max_new_tokens` = {max_new_tokens} is invalid: the model has "
                          f"{positions} positions (config.max_position_embeddings), which must hold the prompt and "
                          "the completion; use fewer new tokens", field="rollout.max_new_tokens")
    limit = positions - max_new_tokens
    return limit, (f"data.max_prompt_tokens={max_prompt_tokens} lowered to {limit}: the model's {positions} "
                   f"positions hold the prompt and rollout.max_new_tokens={max_new_tokens}")


def prompt_tokens(tokenizer, sample: Sample) -> int:
    """The length of `sample`'s prompt as rollouts encode it (grpo/models/tokens.encode_prompt); a row the chat
    template refuses (an unknown role) is a DataFileError naming its file and line or row, not jinja2's
    TemplateError."""
    from grpo.models.tokens import TemplateError, encode_prompt

    try:
        return len(encode_prompt(tokenizer, sample.messages))
    except TemplateError as err:
        unit = "line" if "line" in sample.meta else "row"
        where = f"{sample.meta.get('source', 'task ' + repr(sample.task))} {unit} {sample.meta.get(unit, '?')}"
        raise DataFileError(f"{where} (task {sample.task!r}, roles {[m['role'] for m in sample.messages]}): the "
                            f"model's chat template refuses its messages: {err}") from None


def drop_long_prompts(rows: Mapping[str, list[Sample]], tokenizer, limit: int, what: str,
                      why: str = "", announce: bool = True) -> dict[str, list[Sample]]:
    """`rows` by task without the prompts longer than `limit` tokens after the chat template (the way rollouts
    encode them: grpo/models/tokens.encode_prompt); one line per task that lost rows, with the count (`announce`)."""
    kept: dict[str, list[Sample]] = {}
    for task, samples in rows.items():
        kept[task] = [s for s in samples if prompt_tokens(tokenizer, s) <= limit]
        dropped = len(samples) - len(kept[task])
        if dropped and announce:
            print(f"data.max_prompt_tokens: {dropped} of {len(samples)} {what} prompts of task {task!r} are longer "
                  f"than {limit} tokens and are dropped" + (f" ({why})" if why else ""))
        if samples and not kept[task]:
            raise ConfigError(f"config field `data.max_prompt_tokens` = {limit} is invalid: every {what} prompt of "
                              f"task {task!r} is longer{f' ({why})' if why else ''}; raise it (a longest prompt: "
                              f"{max(prompt_tokens(tokenizer, s) for s in samples)} tokens) or "
                              "shorten the prompts", field="data.max_prompt_tokens")
    return kept


def fit_prompts(train: Mapping[str, list[Sample]], heldout: Mapping[str, list[Sample]], policy: Policy,
                data: C.DataConfig, rollout: C.RolloutConfig, announce: bool = True) -> tuple[dict, dict]:
    """Train and held-out rows without the prompts over data.max_prompt_tokens (lowered, with a message, where the
    model's positions cannot hold it plus rollout.max_new_tokens); the held-out rows that fit are then capped at
    data.eval_size per task (so a long prompt gives its place to the next held-out row, not an empty slot) and shown
    by `evaluated_rows`. `announce`: print what was dropped (see `load_samples`)."""
    positions = getattr(policy.model.config, "max_position_embeddings", None)
    limit, why = prompt_token_limit(data.max_prompt_tokens, rollout.max_new_tokens, positions)
    kept = drop_long_prompts(heldout, policy.tokenizer, limit, "held-out", why, announce)
    return (drop_long_prompts(train, policy.tokenizer, limit, "training", why, announce),
            {task: evaluated_rows(rows, data) for task, rows in kept.items()})


def evaluated_rows(rows: list[Sample], data: C.DataConfig) -> list[Sample]:
    """A task's held-out rows as every evaluation shows them: the first data.eval_size, BBQ rows with shuffled options
    re-shown with the right option at each letter equally often (grpo/data/bbq.balanced_heldout)."""
    from grpo.data.bbq import balanced_heldout

    return balanced_heldout(rows[:data.eval_size])


def group_by_task(train_list: list[Sample], held_list: list[Sample], data: C.DataConfig,
                  cap: bool = True) -> tuple[dict, dict]:
    """Train and held-out samples by task (grpo/run/setup_parts.load_samples split them); held-out capped at
    data.eval_size per task unless `cap` is False (grpo_train.setup caps after `fit_prompts` dropped the long ones)."""
    train: dict[str, list[Sample]] = {}
    heldout: dict[str, list[Sample]] = {}
    for s in train_list:
        train.setdefault(s.task, []).append(s)
    for s in held_list:
        heldout.setdefault(s.task, []).append(s)
    return train, ({task: evaluated_rows(rows, data) for task, rows in heldout.items()} if cap else heldout)
