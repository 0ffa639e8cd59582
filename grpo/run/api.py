"""`grpo_train.train(...)`'s arguments as one checked Config: a Config, a preset or dotted overrides; tasks as
tasks.<task> sections, files, or rows in memory (a datasets Dataset / DatasetDict, a pandas DataFrame, a list of
dicts); reward functions entered under names of their own; a model by name or already loaded; a peft LoraConfig.

Rows in memory are written once, as JSON lines, into a folder named by their sha256 under
$GRPO_DUAL_CACHE/datasets (else ~/.cache/grpo-dual/datasets; grpo/run/trl/row_files.py): the run's config.json then
names a file that holds exactly those rows, so the run can be resumed and repeated like one from a file.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from grpo import config as C
from grpo.config.presets import CUSTOM_PRESET
from grpo.phases.environments import factory_spec
from grpo.phases.tools import tool_specs
from grpo.run.assembly.config_check import check_config
from grpo.run.trl.row_files import write_rows
from grpo.run.trl.translation import from_trl

__all__ = ["loaded_model", "python_config", "with_tools"]
"""The names the entry point takes from this module, its face (tests/test_house.py); the rest serve the package."""

HELDOUT_SPLITS = ("test", "validation", "eval")
"""The split of a DatasetDict that becomes the held-out rows (the first present), as TRL's eval_dataset."""


def python_config(config: C.Config | str | Sequence[str] | None, tasks: Mapping[str, Any] | None,
                  rewards: Mapping[str, Any] | None, model: str | tuple[Any, Any] | None,
                  sections: Mapping[str, Mapping[str, Any]], peft_config: Any = None,
                  trl_args: Any = None, eval_dataset: Any = None) -> tuple[C.Config, dict[str, Callable[..., Any]]]:
    """`train`'s arguments as one checked Config and the reward functions by the names its rewards.<task> give
    them. `trl_args`: a GRPOConfig (or its dict), translated (grpo/run/trl/translation.py) over the preset, under
    `config`'s overrides and the sections. `eval_dataset`: held-out rows, as TRL's (`eval_rows`)."""
    trl_tree, weights = from_trl(trl_args) if trl_args is not None else ({}, None)
    overrides: list[str] = []
    if isinstance(config, C.Config):
        tree = deep_merge(C.to_dict(config), trl_tree)
    else:
        preset = config if isinstance(config, str) else (CUSTOM_PRESET if tasks else "demo")
        overrides = list(config) if config is not None and not isinstance(config, str) else []
        tree = C.config_tree(preset, overrides, trl_tree)
    if weights is not None:
        rewards = weighted(rewards, weights)
    for name, fields in sections.items():
        if not isinstance(fields, Mapping):
            raise C.ConfigError(f"train(..., {name}=...) must be a dict of the section's fields, e.g. "
                                f"train(rollout={{'k': 8}}); got {fields!r}", field=name)
        tree[name] = {**tree.get(name, {}), **fields} if isinstance(tree.get(name), dict) else fields
    evals = eval_rows(eval_dataset, list(tasks or {}))
    for task, source in (tasks or {}).items():
        tree["tasks"][task] = task_section(task, source, evals.get(task))
    callables: dict[str, Callable[..., Any]] = {}
    for task, terms in (rewards or {}).items():
        tree["rewards"][task] = reward_terms(task, terms, callables, set(tree.get("reward_models", {})))
    if isinstance(model, str):
        tree["model"]["name"] = model
    elif model is not None and not (isinstance(model, tuple) and len(model) == 2):
        raise C.ConfigError(f"train(model=...) takes a model name, a loaded model (with processing_class=its "
                            f"tokenizer) or a (model, tokenizer) pair; got {type(model).__name__}", field="model.name")
    elif model is not None:
        tree["model"]["name"] = getattr(model[0], "name_or_path", "") or f"python:{type(model[0]).__name__}"
    if peft_config is not None:
        tree["model"].update(lora_fields(peft_config))
    set_here = ({f"{name}.{key}" for name, fields in sections.items() for key in fields} |
                {o.split("=", 1)[0].strip() for o in overrides} |
                ({f"model.{key}" for key in lora_fields(peft_config)} if peft_config is not None else set()) |
                ({"model.name"} if model is not None else set()))
    names = tree.get("train", {}).get("trl_names") or {}
    tree["train"]["trl_names"] = {f: n for f, n in names.items()  # ours where ours were given
                                  if not any(f == g or f.startswith(f"{g}.") for g in set_here)}
    return check_config(C.from_dict(tree)), callables


def loaded_model(model: Any, processing_class: Any) -> Any:
    """`train`'s model and processing_class as the model argument of `python_config`: a model name, a (model,
    tokenizer) pair, or None; a loaded model without its tokenizer, or a tokenizer without a loaded model, is a
    ConfigError."""
    if processing_class is not None:
        if model is None or isinstance(model, (str, tuple)):
            raise C.ConfigError("train(processing_class=...) goes with a loaded model: model=<the model>",
                                field="model.name")
        return model, processing_class
    if model is not None and not isinstance(model, (str, tuple)):
        raise C.ConfigError(f"train(model=<a loaded {type(model).__name__}>) needs its tokenizer: pass "
                            "processing_class=tokenizer (or model=(model, tokenizer))", field="model.name")
    return model


def with_tools(cfg: C.Config, callables: dict[str, Callable[..., Any]],
               tools: Sequence[Callable[..., Any] | str] | None,
               environment_factory: Callable[[], Any] | str | None) -> tuple[C.Config, dict[str, Callable[..., Any]]]:
    """`train(tools=..., environment_factory=...)` added to rollout.tools and rollout.environment_factory: by
    "module:function" when importable, else by name, with the function handed in among the callables."""
    rollout = cfg.rollout
    if tools:
        specs, tool_fns = tool_specs(tools)
        rollout, callables = dataclasses.replace(rollout, tools=[*rollout.tools, *specs]), {**callables, **tool_fns}
    if environment_factory is not None:
        spec, env_fns = factory_spec(environment_factory)
        rollout, callables = dataclasses.replace(rollout, environment_factory=spec), {**callables, **env_fns}
    return dataclasses.replace(cfg, rollout=rollout), callables


def deep_merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `extra`'s values put in, table by table."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = (deep_merge(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), dict)
                    else value)
    return out


def weighted(rewards: Mapping[str, Any] | None, weights: list[float]) -> dict[str, Any]:
    """TRL's reward_weights applied to each task's list of reward functions (or grader names), in order."""
    out = {}
    for task, terms in (rewards or {}).items():
        items = [terms] if callable(terms) or isinstance(terms, (str, tuple)) else list(terms)
        if isinstance(terms, str) or len(items) != len(weights) or any(isinstance(i, tuple) for i in items):
            raise C.ConfigError(f"GRPOConfig.reward_weights has {len(weights)} weights: rewards[{task!r}] must be a "
                                f"list of as many reward functions (without weights of their own)",
                                field=f"rewards.{task}")
        out[task] = list(zip(items, weights, strict=True))
    if not out:
        raise C.ConfigError("GRPOConfig.reward_weights needs train(rewards={task: [functions]}) to weigh",
                            field="reward_weights")
    return out


def eval_rows(eval_dataset: Any, tasks: list[str]) -> dict[str, Any]:
    """`train(eval_dataset=...)` by task: TRL's eval_dataset (rows in memory: a Dataset, a DataFrame or a list of
    dicts) for a run of one task, or {task: rows}. ConfigError naming eval_dataset for rows of several tasks without
    their names, or a task that is not the run's."""
    if eval_dataset is None:
        return {}
    if isinstance(eval_dataset, Mapping) and not is_dataset_dict(eval_dataset):
        unknown = sorted(set(eval_dataset) - set(tasks))
        if unknown:
            raise C.ConfigError(f"train(eval_dataset={{...}}) names {unknown}, which are not tasks of train(tasks=...) "
                                f"({', '.join(tasks)}){C.did_you_mean(unknown, tasks)}", field="eval_dataset")
        return dict(eval_dataset)
    if len(tasks) != 1:
        raise C.ConfigError(f"train(eval_dataset=rows) is for a run of one task; this run has {len(tasks)} "
                            f"({', '.join(tasks)}): give eval_dataset={{task: rows, ...}}", field="eval_dataset")
    return {tasks[0]: eval_dataset}


def task_section(task: str, source: Any, eval_dataset: Any = None) -> dict[str, Any]:
    """The tasks.<task> fields for one `train(tasks=...)` entry: a path; a TaskSourceConfig or a dict of its fields
    (whose `path` may itself be rows in memory); or rows in memory (Dataset, DatasetDict, DataFrame, list of dicts).
    `eval_dataset`: the task's held-out rows in memory (TRL's eval_dataset), for a task given as rows."""
    if eval_dataset is not None:
        if (isinstance(source, (str, Path, Mapping)) and not is_dataset_dict(source) or
                dataclasses.is_dataclass(source)):
            raise C.ConfigError(f"train(eval_dataset=...) for task {task!r}, whose rows come from a file or source: "
                                f"name its held-out file as tasks.{task}.heldout instead", field="eval_dataset")
        train_rows, given = rows_in_memory(task, source)
        if given is not None:
            raise C.ConfigError(f"task {task!r} has held-out rows twice: its DatasetDict's test split and "
                                "train(eval_dataset=...); give one", field="eval_dataset")
        folder = write_rows(train_rows, rows_in_memory(task, eval_dataset)[0])
        return {"path": str(folder / "train.jsonl"), "heldout": str(folder / "heldout.jsonl")}
    if isinstance(source, (str, Path)):
        return {"path": str(source)}
    if dataclasses.is_dataclass(source) and not isinstance(source, type):
        return dataclasses.asdict(source)
    if isinstance(source, Mapping) and not is_dataset_dict(source):
        fields = dict(source)
        if fields.get("path") is not None and not isinstance(fields["path"], (str, Path)):
            fields.update(task_section(task, fields["path"]))
        return fields
    train_rows, heldout_rows = rows_in_memory(task, source)
    folder = write_rows(train_rows, heldout_rows)
    return {"path": str(folder / "train.jsonl"),
            **({"heldout": str(folder / "heldout.jsonl")} if heldout_rows is not None else {})}


def is_dataset_dict(value: Any) -> bool:
    """A datasets DatasetDict (a dict of splits) rather than a dict of tasks.<task> fields."""
    return isinstance(value, Mapping) and bool(value) and all(hasattr(v, "column_names") for v in value.values())


def rows_in_memory(task: str, data: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(train rows, held-out rows or None) of a Dataset, a DatasetDict ("train", and "test" / "validation" / "eval"
    as held-out), a pandas DataFrame or a list of dicts. Anything else is a ConfigError naming tasks.<task>."""
    where = f"tasks.{task}"
    if is_dataset_dict(data):
        if "train" not in data:
            raise C.ConfigError(f"train(tasks={{{task!r}: DatasetDict}}) has the splits {sorted(data)}; it needs a "
                                "'train' split (and optionally one of " + ", ".join(HELDOUT_SPLITS) + ")", field=where)
        held = next((data[name] for name in HELDOUT_SPLITS if name in data), None)
        return rows_in_memory(task, data["train"])[0], (None if held is None else rows_in_memory(task, held)[0])
    if hasattr(data, "column_names") and hasattr(data, "to_list"):  # datasets.Dataset
        rows = data.to_list()
    elif hasattr(data, "to_dict") and hasattr(data, "columns"):  # pandas.DataFrame
        rows = data.to_dict(orient="records")
    elif isinstance(data, (list, tuple)) and all(isinstance(r, Mapping) for r in data):
        rows = [dict(r) for r in data]
    else:
        raise C.ConfigError(f"train(tasks={{{task!r}: ...}}) takes a path, a dict of tasks.<task> fields, a "
                            f"TaskSourceConfig, a datasets Dataset / DatasetDict, a pandas DataFrame or a list of "
                            f"dicts; got {type(data).__name__}", field=where)
    if not rows:
        raise C.ConfigError(f"train(tasks={{{task!r}: ...}}): the rows given are empty", field=where)
    return rows, None


LORA_FIELDS = {"r": "lora_r", "lora_alpha": "lora_alpha", "lora_dropout": "lora_dropout",
               "target_modules": "lora_target_modules"}
"""peft LoraConfig field -> model.<field>; every other field must keep LoraConfig's default."""


def lora_fields(peft_config: Any) -> dict[str, Any]:
    """model.* fields from a peft LoraConfig (TRL's `peft_config`): r, lora_alpha, lora_dropout, target_modules; a
    field set to anything but LoraConfig's default that has no equivalent here is a ConfigError naming it."""
    if not dataclasses.is_dataclass(peft_config) or not hasattr(peft_config, "target_modules"):
        raise C.ConfigError(f"train(peft_config=...) takes a peft LoraConfig; got {type(peft_config).__name__}",
                            field="model.lora")
    defaults = type(peft_config)()
    untranslated = sorted(f.name for f in dataclasses.fields(peft_config)
                          if f.name not in LORA_FIELDS and f.name not in ("task_type", "peft_type")
                          and getattr(peft_config, f.name) != getattr(defaults, f.name))
    task_type = str(getattr(peft_config.task_type, "value", peft_config.task_type))
    if peft_config.task_type is not None and task_type != "CAUSAL_LM":
        untranslated.insert(0, f"task_type={task_type}")
    if untranslated:
        raise C.ConfigError(f"train(peft_config=...) sets {untranslated}, which grpo-dual does not translate (it "
                            f"takes {sorted(LORA_FIELDS)} as model.lora_*; leave the others at LoraConfig's "
                            "defaults)", field="model.lora")
    targets = peft_config.target_modules
    if targets is None or isinstance(targets, str):
        raise C.ConfigError(f"train(peft_config=...): target_modules={targets!r}; give the module names as a list, "
                            "e.g. ['q_proj', 'v_proj'] (model.lora_target_modules)", field="model.lora_target_modules")
    return {"lora": True, "lora_r": int(peft_config.r), "lora_alpha": peft_config.lora_alpha,
            "lora_dropout": float(peft_config.lora_dropout), "lora_target_modules": sorted(targets)}


def reward_terms(task: str, terms: Any, callables: dict[str, Callable[..., Any]], taken: set[str]) -> str:
    """A rewards.<task> entry from `train`'s rewards[task]: a spec string as it is, or a list of functions, grader
    names and (grader, weight) pairs; each function is entered in `callables` under a name of its own (its
    __name__, made unique, never a built-in grader's or a reward model's)."""
    from grpo.core.rule_graders import GRADERS
    from grpo.grading.graders import JUDGE_TERM
    from grpo.grading.scoring import callable_name

    if isinstance(terms, str):
        return terms
    out = []
    for item in [terms] if callable(terms) or isinstance(terms, tuple) else list(terms):
        grader, weight = item if isinstance(item, tuple) else (item, None)
        if callable(grader):
            base = re.sub(r"[^\w.-]", "_", callable_name(grader)) or "reward"  # TRL's name: a partial's function
            name, n = base, 1
            while (name in GRADERS or name == JUDGE_TERM or name in taken
                   or (name in callables and callables[name] is not grader)):
                n += 1
                name = f"{base}_{n}"
            callables[name] = grader
        elif isinstance(grader, str):
            name = grader
        else:
            raise C.ConfigError(f"train(rewards={{{task!r}: ...}}): {grader!r} is neither a function nor a grader "
                                "name", field=f"rewards.{task}")
        out.append(name if weight is None else f"{name}:{float(weight)!r}")
    if not out:
        raise C.ConfigError(f"train(rewards={{{task!r}: []}}): give at least one grader", field=f"rewards.{task}")
    return ",".join(out)
