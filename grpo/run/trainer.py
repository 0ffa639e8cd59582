"""TRL's `GRPOTrainer` surface over one grpo-dual run (`grpo_train.GRPOTrainer`): its keywords checked before any
work and turned into `train(...)`'s, and transformers' TrainerCallback events with `(args, state, control)`.

`trainer_inputs` checks every keyword TRL 1.16's GRPOTrainer takes (its type, and whether grpo-dual honours it),
naming the keyword and what TRL accepts, and returns `train`'s keywords: one task from `train_dataset`, the reward
functions (a reward model by name, folder or object becomes a TRL-style function), the GRPOConfig. `Events` is the
callback handler `grpo_train.main` calls at each point of the run (on_train_begin, on_step_begin, on_step_end,
on_log, on_evaluate, on_save, on_train_end); it keeps transformers' `TrainerState` (global_step in TRL's optimizer
steps, log_history, best_metric) and honours `TrainerControl`'s should_training_stop / should_save /
should_evaluate. A callback that raises ends the run with a CallbackError naming it; the checkpoints stay.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from grpo import config as C
from grpo.run.api import loaded_model, python_config, with_tools
from grpo.run.trl.trainer_table import TRAINER_KEYWORDS

__all__ = ["CallbackError", "Events", "TRAINER_KEYWORDS", "callback_args", "check_train_keywords",
           "check_trainer_keywords", "evaluate_now", "push_folder", "trainer_config"]
"""The names the entry point takes from this module, its face (tests/test_house.py); the rest serve the package."""


TRAIN_KEYWORDS = ("config", "tasks", "rewards", "model", "processing_class", "peft_config", "args", "eval_dataset",
                  "tools", "environment_factory", "callbacks")
"""`grpo_train.train`'s own keywords (besides the config sections' names, each a dict of the section's fields)."""

SECTIONS = tuple(f.name for f in dataclasses.fields(C.Config) if f.name != "preset")
"""The config sections `train(<section>={...})` takes."""

TRAIN_INSTEAD = {"reward_funcs": "train() takes them as rewards={task: [functions]}; ",
                 "train_dataset": "train() takes the rows as tasks={task: dataset}; "}
"""What `train` takes instead of a GRPOTrainer keyword, where it takes it at all."""

DEFAULT_TASK = "trl"
"""The task a train_dataset without a dataset name trains as (TRL has one dataset; grpo-dual's metrics name tasks)."""


class CallbackError(RuntimeError):
    """A TrainerCallback raised: the run stopped at that point; its checkpoints are kept."""


def _wrong(keyword: str, value: Any, accepted: str) -> C.ConfigError:
    return C.ConfigError(f"GRPOTrainer({keyword}=...) takes {accepted}; got {type(value).__name__}", field=keyword)


def check_trainer_keywords(given: Mapping[str, Any]) -> None:
    """A keyword TRL's GRPOTrainer does not take: a ConfigError with a "did you mean"."""
    unknown = sorted(set(given) - set(TRAINER_KEYWORDS))
    if unknown:
        raise C.ConfigError(f"GRPOTrainer has no keyword(s) {unknown}{C.did_you_mean(unknown, TRAINER_KEYWORDS)} "
                            f"(TRL 1.16 takes {', '.join(TRAINER_KEYWORDS)})", field=unknown[0])


def check_train_keywords(sections: Mapping[str, Any]) -> None:
    """`train(**sections)`'s names: a GRPOTrainer keyword (reward_funcs=, train_dataset=, ...) named with what train()
    takes instead and the class to use; any other name that is not a config section gets a "did you mean"."""
    trainer_only = sorted(set(sections) & (set(TRAINER_KEYWORDS) - set(TRAIN_KEYWORDS)))
    if trainer_only:
        name = trainer_only[0]
        raise C.ConfigError(f"train({name}=...) is a keyword of GRPOTrainer, not of train(): "
                            f"{TRAIN_INSTEAD.get(name, '')}or call GRPOTrainer(model=..., reward_funcs=..., args=..., "
                            "train_dataset=...).train() (from grpo_train import GRPOTrainer)", field=name)
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        raise C.ConfigError(f"train() has no keyword "
                            f"{unknown[0]!r}{C.did_you_mean(unknown, [*TRAIN_KEYWORDS, *SECTIONS])}"
                            f" (its keywords: {', '.join(TRAIN_KEYWORDS)}; a config section's fields as a dict: "
                            f"{', '.join(SECTIONS)})", field=unknown[0])


def _is_model(value: Any) -> bool:
    return hasattr(value, "config") and callable(getattr(value, "forward", None))


def _model_id(model: Any) -> str:
    config = getattr(model, "config", None)
    return str(getattr(config, "_name_or_path", "") or getattr(model, "name_or_path", "") or type(model).__name__)


def model_reward(model: Any, tokenizer: Any) -> Callable[..., list[float]]:
    """A loaded sequence-classification reward model as a TRL-style reward function, scored as TRL's GRPOTrainer
    scores one: prompt + completion (through the reward tokenizer's chat template when conversational), right-padded,
    no special tokens added, logit 0. Named as TRL names it: the last part of the model's id."""
    import torch

    def reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        if isinstance(prompts[0], list):  # conversational: the whole conversation through the template
            texts = [tokenizer.apply_chat_template(p + c, tokenize=False)
                     for p, c in zip(prompts, completions, strict=True)]
        else:
            texts = [p + c for p, c in zip(prompts, completions, strict=True)]
        batch = tokenizer(text=texts, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
        device = next(model.parameters()).device
        with torch.inference_mode():
            return model(**{k: v.to(device) for k, v in batch.items()}).logits[:, 0].float().tolist()

    reward.__name__ = re.sub(r"[^\w.-]", "_", _model_id(model).rstrip("/").split("/")[-1]) or "reward_model"
    model.eval()
    return reward


def _reward_functions(reward_funcs: Any, processing: Any) -> list[Any]:
    """TRL's reward_funcs (one or a list: a function, a reward model's name / folder, a loaded reward model) as
    train(rewards=...)'s list: functions as they are, a folder by its path (grpo/grading/reward_models.py), a loaded
    model (or a folder with its own reward_processing_class) as a TRL-style function (`model_reward`)."""
    items = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    if not items:
        raise C.ConfigError("GRPOTrainer(reward_funcs=[]) has no reward function: give at least one",
                            field="reward_funcs")
    classes = (list(processing) if isinstance(processing, (list, tuple)) else [processing] * len(items)
               if processing is not None else [None] * len(items))
    if len(classes) != len(items):
        raise C.ConfigError(f"GRPOTrainer(reward_processing_classes=...) has {len(classes)} entries for "
                            f"{len(items)} reward functions: give one per function (None for a function)",
                            field="reward_processing_classes")
    out = []
    for item, tok in zip(items, classes, strict=True):
        if isinstance(item, (str, Path)) and tok is not None:
            from transformers import AutoModelForSequenceClassification

            item = AutoModelForSequenceClassification.from_pretrained(str(item), num_labels=1)
        if _is_model(item):
            if tok is None:
                from transformers import AutoTokenizer

                tok = AutoTokenizer.from_pretrained(_model_id(item))
            out.append(model_reward(item, tok))
        elif isinstance(item, (str, Path)) or callable(item):
            out.append(str(item) if isinstance(item, Path) else item)
        else:
            raise _wrong("reward_funcs", item, "a reward function, a reward model's name or folder, a loaded "
                         "reward model (AutoModelForSequenceClassification), or a list of them")
    return out


def _task_name(dataset: Any) -> str:
    info = getattr(dataset, "info", None)
    name = str(getattr(info, "dataset_name", "") or "")
    return re.sub(r"[^\w.-]", "_", name.split("/")[-1]) or DEFAULT_TASK


def _eval_rows(eval_dataset: Any) -> Any:
    """TRL's eval_dataset: a Dataset, or a dict of named Datasets (their rows together: grpo-dual evaluates one
    held-out set per task)."""
    if eval_dataset is None or not isinstance(eval_dataset, Mapping):
        return eval_dataset
    rows = []
    for name, part in eval_dataset.items():
        if not hasattr(part, "to_list"):
            raise _wrong("eval_dataset", part, f"a Dataset or a dict of Datasets (entry {name!r})")
        rows += part.to_list()
    return rows


def _check_types(kw: Mapping[str, Any]) -> None:
    """Each keyword of a type TRL takes, before any work."""
    model = kw["model"]
    if not (isinstance(model, (str, Path)) or _is_model(model)):
        raise _wrong("model", model, "a model's name or folder (str) or a loaded PreTrainedModel / PeftModel")
    if kw["train_dataset"] is None:
        raise C.ConfigError("GRPOTrainer(train_dataset=...) is required: a datasets Dataset of prompts",
                            field="train_dataset")
    if not hasattr(kw["train_dataset"], "column_names") and not isinstance(kw["train_dataset"], (list, Mapping)):
        raise _wrong("train_dataset", kw["train_dataset"], "a datasets Dataset (or a DatasetDict, a list of dicts)")
    if kw["eval_dataset"] is not None and not (hasattr(kw["eval_dataset"], "column_names")
                                               or isinstance(kw["eval_dataset"], (list, Mapping))):
        raise _wrong("eval_dataset", kw["eval_dataset"], "a Dataset or a dict of Datasets")
    if kw["callbacks"] is not None and (not isinstance(kw["callbacks"], (list, tuple)) or not all(
            hasattr(cb, "on_train_begin") for cb in kw["callbacks"])):
        raise _wrong("callbacks", kw["callbacks"], "a list of transformers TrainerCallback objects or classes")
    if kw["tools"] is not None and (not isinstance(kw["tools"], (list, tuple)) or not all(
            callable(t) or isinstance(t, str) for t in kw["tools"])):
        raise _wrong("tools", kw["tools"], "a list of functions")
    if kw["processing_class"] is not None and not callable(kw["processing_class"]):
        raise _wrong("processing_class", kw["processing_class"], "a tokenizer (PreTrainedTokenizerBase)")
    if kw["peft_config"] is not None and not hasattr(kw["peft_config"], "target_modules"):
        raise _wrong("peft_config", kw["peft_config"], "a peft LoraConfig")
    if kw["quantization_config"] is not None and not hasattr(kw["quantization_config"], "load_in_4bit"):
        raise _wrong("quantization_config", kw["quantization_config"], "a transformers BitsAndBytesConfig")
    if kw["environment_factory"] is not None and not (callable(kw["environment_factory"])
                                                      or isinstance(kw["environment_factory"], str)):
        raise _wrong("environment_factory", kw["environment_factory"], "a class or function that makes an environment")


def _refused(kw: Mapping[str, Any]) -> None:
    """The keywords grpo-dual does not honour, refused with what to use."""
    optimizers = kw["optimizers"]
    if not (isinstance(optimizers, (tuple, list)) and len(optimizers) == 2):
        raise _wrong("optimizers", optimizers, "a pair (optimizer, lr_scheduler)")
    if any(o is not None for o in optimizers):
        raise C.ConfigError("GRPOTrainer(optimizers=(...)): grpo-dual builds torch's AdamW and transformers' "
                            "schedule from the GRPOConfig (learning_rate, weight_decay, lr_scheduler_type, "
                            "warmup_steps); leave optimizers=(None, None)", field="optimizers")
    if kw["rollout_func"] is not None:
        raise C.ConfigError("GRPOTrainer(rollout_func=...) is not supported: grpo-dual generates the rollouts itself "
                            "(multi-turn with tools=[...] or environment_factory=...)", field="rollout_func")
    q = kw["quantization_config"]
    if q is not None and not (getattr(q, "load_in_4bit", False) and getattr(q, "bnb_4bit_quant_type", "nf4") == "nf4"):
        raise C.ConfigError("GRPOTrainer(quantization_config=...): grpo-dual quantizes to 4-bit nf4 only "
                            "(BitsAndBytesConfig(load_in_4bit=True), with peft_config)", field="quantization_config")


def peft_default_targets(peft_config: Any, model: Any) -> Any:
    """A LoraConfig without target_modules gets peft's default for the model's architecture, as --use_peft does."""
    if peft_config is None or getattr(peft_config, "target_modules", ()) is not None:
        return peft_config
    import dataclasses

    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as PEFT_DEFAULTS

    from grpo.run.trl.record_tables import model_architecture

    kind = (getattr(getattr(model, "config", None), "model_type", None) if _is_model(model) else
            model_architecture(str(model)))
    targets = PEFT_DEFAULTS.get(kind) if kind else None
    if not targets:
        raise C.ConfigError(f"GRPOTrainer(peft_config=LoraConfig(target_modules=None)): peft has no default modules "
                            f"for architecture {kind!r} of {model!r}: name them, e.g. target_modules=['q_proj', "
                            "'v_proj']", field="peft_config")
    return dataclasses.replace(peft_config, target_modules=list(targets))


def trainer_inputs(kw: Mapping[str, Any]) -> dict[str, Any]:
    """GRPOTrainer's keywords (all of TRAINER_KEYWORDS) as `grpo_train.train`'s: checked, nothing written."""
    _check_types(kw)
    _refused(kw)
    model, dataset = kw["model"], kw["train_dataset"]
    task = _task_name(dataset)
    args = kw["args"]
    if args is None:  # TRL's default: GRPOConfig(f"{model_name}-GRPO")
        name = str(model) if isinstance(model, (str, Path)) else _model_id(model)
        args = {"output_dir": f"{name.rstrip('/').split('/')[-1]}-GRPO"}
    loaded = model if _is_model(model) else None
    processing = kw["processing_class"]
    if loaded is not None and processing is None:
        from transformers import AutoTokenizer

        processing = AutoTokenizer.from_pretrained(_model_id(loaded))
    return {"tasks": {task: dataset}, "rewards": {task: _reward_functions(kw["reward_funcs"],
                                                                           kw["reward_processing_classes"])},
            "model": str(model) if loaded is None else loaded, "processing_class": processing if loaded is not None
            else None, "args": args, "eval_dataset": _eval_rows(kw["eval_dataset"]),
            "peft_config": peft_default_targets(kw["peft_config"], model), "tools": kw["tools"],
            "environment_factory": kw["environment_factory"],
            "model_section": {"load_in_4bit": True} if kw["quantization_config"] is not None else {}}


def trainer_config(given: Mapping[str, Any]) -> tuple[C.Config, dict[str, Callable[..., Any]], Any, Any]:
    """GRPOTrainer's keywords as (the checked Config, the reward functions and tools by name, the loaded (model,
    tokenizer) or the model's name, the args the callbacks read), through `train`'s own python_config."""
    inputs = trainer_inputs(given)
    loaded = loaded_model(inputs["model"], inputs["processing_class"])
    cfg, callables = python_config(None, inputs["tasks"], inputs["rewards"], loaded,
                                   {"model": inputs["model_section"]} if inputs["model_section"] else {},
                                   inputs["peft_config"], trl_args=inputs["args"], eval_dataset=inputs["eval_dataset"])
    cfg, callables = with_tools(cfg, callables, inputs["tools"], inputs["environment_factory"])
    args = callback_args(cfg, inputs["args"] if given["args"] is not None else None)
    if given["args"] is None:  # TRL's default GRPOConfig names its output_dir after the model
        args.output_dir = inputs["args"]["output_dir"]
    return cfg, callables, loaded, args


def callback_args(cfg: C.Config, trl_args: Any) -> Any:
    """The `args` a TrainerCallback reads: the GRPOConfig given, else one of ours (grpo/run/trl/grpo_config.py) with
    the fields callbacks read set from the run's config (output_dir, logging / eval / save steps and strategies,
    max_steps, the best model's metric)."""
    if trl_args is not None and not isinstance(trl_args, Mapping):
        return trl_args
    from grpo.run.trl.grpo_config import GRPOConfig

    mu, t = cfg.loss.mu, cfg.train
    args = GRPOConfig(**(trl_args or {}))
    if trl_args is None:
        for name, value in {"output_dir": cfg.checkpoint.final_model_dir or t.output_dir, "max_steps": t.max_steps * mu,
                            "logging_steps": t.log_every * mu, "learning_rate": t.lr, "seed": t.seed,
                            "eval_strategy": "steps" if t.eval_every else "no", "eval_steps": t.eval_every * mu,
                            "save_strategy": "steps" if cfg.checkpoint.every else "no",
                            "save_steps": cfg.checkpoint.every * mu, "load_best_model_at_end": cfg.checkpoint.keep_best,
                            "metric_for_best_model": t.best_metric, "greater_is_better": t.greater_is_better,
                            "num_generations": cfg.rollout.k}.items():
            setattr(args, name, value)
    return args


def _mean_rows(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The window's logged rows as one, as TRL averages its metrics over logging_steps: each number's mean over
    the rows that have it (NaN left out)."""
    out: dict[str, float] = {}
    for key in dict.fromkeys(k for r in rows for k in r):
        values = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float)) and not isinstance(r[key], bool)
                  and math.isfinite(float(r[key]))]
        if values:
            out[key] = sum(values) / len(values)
    return out


def eval_metrics(results: Mapping[str, float], epoch: float | None) -> dict[str, float]:
    """An evaluation's numbers as TRL's evaluate() returns them: eval_reward (the mean over tasks of the held-out
    greedy reward), eval_reward/<task>, epoch."""
    out = {"eval_reward": sum(results.values()) / len(results)}
    out.update({f"eval_reward/{t}": float(v) for t, v in results.items()})
    return {**out, **({"epoch": epoch} if epoch is not None else {})}


class Events:
    """transformers' CallbackHandler for a grpo-dual run: `callbacks` (TrainerCallback objects, or classes, made
    here) get each event with (args, state, control, model=, processing_class=, optimizer=, lr_scheduler=,
    train_dataloader=None, eval_dataloader=None, ...). `state.global_step` counts TRL's optimizer steps (RL steps x
    loss.mu); `state.log_history` gets a row every logging_steps (the window's mean, as TRL's) and each evaluation's."""

    def __init__(self, callbacks: Sequence[Any] = (), args: Any = None) -> None:
        from transformers import TrainerControl, TrainerState

        self.callbacks = [cb() if isinstance(cb, type) else cb for cb in callbacks]
        self.args = args
        self.state = TrainerState()
        self.control = TrainerControl()
        self.window: list[dict[str, Any]] = []
        self.run: Any = None
        self.started = 0.0
        self._new_best = False

    def add(self, callback: Any) -> None:
        """A callback (an object, or a class made here) added last, as Trainer.add_callback."""
        self.callbacks.append(callback() if isinstance(callback, type) else callback)

    def pop(self, callback: Any) -> Any:
        """The callback (the object, or the first of the class) removed and returned; None when absent."""
        for cb in self.callbacks:
            if cb is callback or (isinstance(callback, type) and type(cb) is callback):
                self.callbacks.remove(cb)
                return cb
        return None

    # ---------------------------------------------------------------------------------------------- the handler
    def call(self, event: str, **kwargs: Any) -> None:
        """Every callback's `event`, in order, as transformers calls it; a callback's returned control is kept."""
        if not self.callbacks:
            return
        policy = getattr(self.run, "policy", None)
        updater = getattr(self.run, "updater", None)
        extra = {"model": getattr(policy, "model", None), "processing_class": getattr(policy, "tokenizer", None),
                 "optimizer": getattr(updater, "optimizer", None), "lr_scheduler": getattr(updater, "scheduler", None),
                 "train_dataloader": None, "eval_dataloader": None}
        for cb in self.callbacks:
            try:
                result = getattr(cb, event)(self.args, self.state, self.control, **extra, **kwargs)
            except Exception as err:  # noqa: BLE001 - any error of the user's callback ends the run, named
                where = f"after step {self.run.progress.step}" if self.run is not None else "before training"
                raise CallbackError(f"callback {type(cb).__name__}.{event} raised {type(err).__name__}: {err} "
                                    f"({where}; the run stopped there, its checkpoints are kept)") from err
            if result is not None:
                self.control = result

    def begin(self, run: Any) -> None:
        """on_train_begin (and on_epoch_begin): the state set from the run (a resumed run's steps and rows)."""
        from grpo.run.tracking import read_metrics

        self.run, self.started = run, time.time()
        cfg = run.cfg
        mu = cfg.loss.mu
        s = self.state
        s.max_steps, s.global_step = cfg.train.max_steps * mu, run.progress.step * mu
        s.logging_steps, s.eval_steps = cfg.train.log_every * mu, cfg.train.eval_every * mu
        s.save_steps = cfg.checkpoint.every * mu
        s.num_train_epochs = cfg.train.num_epochs or 1
        s.is_local_process_zero = s.is_world_process_zero = run.dist.is_main
        if run.progress.step and not s.log_history and (run.run_dir / "metrics.jsonl").is_file():
            s.log_history = [r for r in read_metrics(run.run_dir) if "phase" not in r]  # the rows before the resume
        self.control._new_training()
        self.call("on_train_begin")
        self.call("on_epoch_begin")

    def step_begin(self, step: int) -> None:
        self.control._new_step()
        self.call("on_step_begin")

    def step_end(self, step: int, metrics: Mapping[str, Any]) -> None:
        """on_step_end, then on_log with the window's mean every logging_steps (and at the last step)."""
        mu = self.run.cfg.loss.mu
        self.state.global_step = step * mu
        self.state.epoch = float(metrics.get("epoch", self.state.epoch or 0.0))
        self.state.num_input_tokens_seen = int(self.state.num_input_tokens_seen or 0) + int(
            metrics.get("num_tokens", 0) or 0)
        self.call("on_step_end")
        self.window.append(dict(metrics))
        if step % self.run.cfg.train.log_every == 0 or step == self.run.cfg.train.max_steps or self.control.should_log:
            self.log(_mean_rows(self.window))

    def log(self, logs: Mapping[str, Any]) -> None:
        """A row of state.log_history (with epoch and step, as Trainer.log adds them) and on_log."""
        row = {**logs, **({"epoch": self.state.epoch} if self.state.epoch is not None else {}),
               "step": self.state.global_step}
        self.window = []
        self.state.log_history.append(row)
        self.call("on_log", logs=dict(logs))

    def evaluate(self, results: Mapping[str, float]) -> dict[str, float]:
        """An evaluation's per-task results as TRL's eval_* metrics: logged, on_evaluate, then the best metric (after
        the callbacks, as transformers does: EarlyStoppingCallback compares with the best before this one). Returns
        the metrics ({} on a rank that does not evaluate)."""
        if not results:
            return {}
        metrics = eval_metrics(results, self.state.epoch)
        self.log(metrics)
        self.call("on_evaluate", metrics=dict(metrics))
        name = getattr(self.args, "metric_for_best_model", None)
        if not name:
            return metrics
        key = name if name.startswith("eval_") else f"eval_{name}"
        value = metrics.get(key)
        if value is None:
            return metrics
        greater = getattr(self.args, "greater_is_better", None)
        greater = not key.endswith("loss") if greater is None else greater
        best = self.state.best_metric
        self._new_best = best is None or (value > best if greater else value < best)
        if self._new_best:
            self.state.best_metric, self.state.best_global_step = float(value), self.state.global_step
        return metrics

    def save(self, folder: Path | None) -> None:
        """on_save after a checkpoint; the best evaluation's checkpoint named in state.best_model_checkpoint (TRL's
        checkpoint-N when the run writes them, else the run's checkpoint)."""
        if self._new_best and self.state.best_global_step == self.state.global_step and folder is not None:
            out = Path(getattr(self.args, "output_dir", "") or "")
            trl_folder = out / f"checkpoint-{self.state.global_step}"
            self.state.best_model_checkpoint = str(trl_folder if trl_folder.is_dir() else folder)
            self._new_best = False
        self.call("on_save")

    def end(self) -> dict[str, float]:
        """on_epoch_end, the train_* row of log_history (as Trainer.train logs it), on_train_end; its numbers."""
        self.call("on_epoch_end")
        runtime = time.time() - self.started
        losses = [r["loss"] for r in self.state.log_history if isinstance(r.get("loss"), (int, float))]
        steps = max(self.state.global_step, 1)
        out = {"train_runtime": round(runtime, 4), "train_steps_per_second": round(steps / max(runtime, 1e-9), 3),
               "total_flos": 0.0, "train_loss": sum(losses) / len(losses) if losses else math.nan}
        self.log(out)
        self.call("on_train_end")
        return out



def evaluate_now(run: Any, evaluate: Callable[[Any], dict[str, float]], events: Events) -> dict[str, float]:
    """GRPOTrainer.evaluate(): `evaluate(run)` (grpo_train.evaluate_phase) as TRL's eval_* metrics, told to the
    callbacks. After train() the run's trackers are closed: the evaluation's row goes to metrics.jsonl through a
    tracker opened for it."""
    from grpo.run.tracking import JsonlTracker

    if not any(run.samples.heldout.values()):
        raise C.ConfigError("GRPOTrainer.evaluate(): no held-out rows; give GRPOTrainer(eval_dataset=...)",
                            field="eval_dataset")
    tracker, finished = run.tracker, run.progress.finished
    if finished:
        run.tracker = JsonlTracker(run.run_dir)
    try:
        return events.evaluate(evaluate(run))
    finally:
        if finished:
            run.tracker.close()
            run.tracker = tracker


def push_folder(folder: Path, repo: str | None, token: str | None, message: str | None, revision: str | None) -> Any:
    """GRPOTrainer.push_to_hub(): `folder` uploaded to the Hub repo `repo` (else the folder's name), as TRL pushes
    output_dir; without a reachable Hub (offline, no token, refused) a RuntimeError naming what would go where."""
    repo = repo or folder.resolve().name
    try:
        from huggingface_hub import HfApi

        api = HfApi(token=token)
        api.create_repo(repo, exist_ok=True)
        return api.upload_folder(repo_id=repo, folder_path=str(folder), commit_message=message, revision=revision)
    except Exception as err:  # noqa: BLE001 - offline, no token, no such repo: each named with the same fix
        files = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
        raise RuntimeError(f"push_to_hub: the Hub could not be reached or refused ({type(err).__name__}: {err}); it "
                           f"would push {folder} ({', '.join(files) or 'no files yet'}) to the Hub repo {repo!r}. "
                           f"Push from a machine with access: huggingface-cli upload {repo} {folder}") from err
