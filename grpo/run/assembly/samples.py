"""The prompts a run trains and evaluates on: the rows loaded from the data section (`load_samples`: sources, BBQ's
thinning, duplicates named), split per task into training and held-out (`group_by_task`), prompts too long for the
model dropped (`fit_prompts`), train.num_epochs counted into steps (`with_epochs`), the task mix parsed.

The entry point hands each function one config section (or plain values); nothing here reads a global.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from grpo import config as C
from grpo.config import ConfigError
from grpo.core.step_types import Sample
from grpo.data.json_rows import DataFileError
from grpo.models.modeling import Policy


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
        why = (f" ({'; '.join(repeats)}: the split hashes ids, so rows sharing an id land on one side)" if repeats
               else "")
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


def parse_task_mix(text: str) -> dict[str, float] | None:
    """"a:1,b:2" -> {"a": 1.0, "b": 2.0}; empty -> None (equal shares)."""
    if not text:
        return None
    pairs = (p.split(":") for p in text.split(","))
    try:
        return {task.strip(): float(w) for task, w in pairs}
    except ValueError:
        raise C.ConfigError(f"config field `data.task_mix` = {text!r} is invalid: weights must be numbers") from None


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
        from grpo.run.trl.vocabulary import in_user_terms

        print(in_user_terms(f"train.num_epochs={cfg.train.num_epochs:g}: {n_prompts} training prompts, {per_step} a "
                            f"step, {n_prompts // per_step} steps an epoch -> {steps} RL steps ({steps * cfg.loss.mu} "
                            "optimizer steps)", C.to_dict(cfg)))
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, max_steps=steps))


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
    """Train and held-out samples by task (grpo/run/assembly/samples.load_samples split them); held-out capped at
    data.eval_size per task unless `cap` is False (grpo_train.setup caps after `fit_prompts` dropped the long ones)."""
    train: dict[str, list[Sample]] = {}
    heldout: dict[str, list[Sample]] = {}
    for s in train_list:
        train.setdefault(s.task, []).append(s)
    for s in held_list:
        heldout.setdefault(s.task, []).append(s)
    return train, ({task: evaluated_rows(rows, data) for task, rows in heldout.items()} if cap else heldout)
