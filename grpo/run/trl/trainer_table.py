"""TRL 1.16's GRPOTrainer in grpo-dual's terms: TRAINER, every keyword, method and attribute a TRL script uses and
what it does here (`grpo_train.GRPOTrainer`, grpo/run/trainer.py). docs/TRL.md's "GRPOTrainer" section is generated
from it (`python -m grpo.run.trl.docs`), and tests/test_grpo_trainer.py holds the class to it."""

from __future__ import annotations

TRAINER_TEXT = """
model | keyword | a model's name (a Hub id offline is refused with the fix; `smollm2-135m-instruct`, the packaged
    model), a model folder, or a loaded PreTrainedModel / PeftModel (trained in place; its tokenizer is
    `processing_class`, else loaded from its name)
reward_funcs | keyword | a function, a reward model's name or folder, a loaded sequence-classification model, or a
    list of them; functions get TRL's keywords; a loaded model scores prompt + completion as TRL's does; weighed by
    `args.reward_weights`; logged as `rewards/<name>/mean|std`
args | keyword | TRL's `GRPOConfig` (or `grpo_train.GRPOConfig`, TRL's fields and defaults without TRL installed, or
    a dict): the whole configuration (tables below); unset: TRL's default, output_dir `<model name>-GRPO`
train_dataset | keyword | a Dataset (or DatasetDict, list of dicts) in TRL's standard or conversational form: one
    task, named after the dataset (`trl` when it has no name)
eval_dataset | keyword | a Dataset, or a dict of Datasets (their rows together): the held-out rows of every
    evaluation (eval_strategy, and grpo-dual's before and after training)
processing_class | keyword | the tokenizer of a loaded model
reward_processing_classes | keyword | one tokenizer per reward function (None for a function), for reward models
callbacks | keyword | transformers TrainerCallbacks (objects or classes), told of each event below with (args,
    state, control); a callback that raises stops the run with its name, the checkpoints kept
optimizers | keyword | (None, None) only: the optimizer and schedule come from the GRPOConfig
quantization_config | keyword | BitsAndBytesConfig(load_in_4bit=True) (nf4) only: model.load_in_4bit
peft_config | keyword | a peft LoraConfig: r, lora_alpha, lora_dropout, target_modules (unset: peft's default for
    the architecture, as TRL)
tools | keyword | functions the model may call in multi-turn rollouts (rollout.tools)
rollout_func | keyword | refused: grpo-dual generates the rollouts itself (use tools or environment_factory)
environment_factory | keyword | a stateful task's environment class (rollout.environment_factory)
train(resume_from_checkpoint=None) | method | the run (train()'s: one run folder, output_dir/grpo-dual/, the doctor,
    the report, the evaluations); True: from the last complete checkpoint, a path: TRL's checkpoint-N or the run's
    checkpoints/step_N; returns TrainOutput(global_step, training_loss, metrics)
evaluate() | method | the held-out greedy evaluation now: eval_reward (mean over tasks), eval_reward/<task>, epoch;
    logged, on_evaluate
save_model(output_dir=None) | method | the model (or adapter), tokenizer and model card into output_dir
    (args.output_dir)
log(logs) | method | a row of state.log_history, on_log, and metrics.jsonl while training
push_to_hub() | method | output_dir to the Hub repo args.hub_model_id (else output_dir's name); without a reachable
    Hub, an error naming what it would push where
add_callback / pop_callback / remove_callback | method | as transformers' Trainer (an object or a class)
state | attribute | transformers' TrainerState: global_step (TRL's optimizer steps: RL steps x num_iterations),
    epoch, max_steps, log_history (a row every logging_steps, the window's mean as TRL's, with TRL's keys; each
    evaluation's eval_* row; the train_* row at the end), best_metric, best_global_step, best_model_checkpoint
model | attribute | the policy being trained (a PeftModel under LoRA); the model loads when first needed
processing_class | attribute | the tokenizer
args | attribute | the GRPOConfig given (or TRL's default one)
events | attribute | on_init_end, on_train_begin, on_epoch_begin, on_step_begin, on_step_end, on_log, on_evaluate,
    on_save, on_epoch_end, on_train_end; control.should_training_stop, should_save and should_evaluate are honoured
    (EarlyStoppingCallback works as in transformers); the optimizer-level events (on_substep_end,
    on_pre_optimizer_step, on_optimizer_step) are not sent
"""
"""TRAINER as text, one row a keyword, method or attribute: `name | kind | what it does here`, its text going on in
the indented lines below it."""


def parse_rows(text: str) -> tuple[tuple[str, str, str], ...]:
    """(name, kind, what) per row of TRAINER_TEXT; an indented line goes on with the row above it."""
    rows: list[list[str]] = []
    for line in text.strip("\n").splitlines():
        if line.startswith(" "):
            rows[-1][2] += " " + line.strip()
        else:
            name, kind, what = line.split(" | ", 2)
            rows.append([name, kind, what])
    return tuple((name, kind, what) for name, kind, what in rows)


TRAINER: tuple[tuple[str, str, str], ...] = parse_rows(TRAINER_TEXT)
"""(name, kind, what it does here): every keyword (TRL's order), method and attribute of GRPOTrainer."""

TRAINER_KEYWORDS = tuple(name for name, kind, _ in TRAINER if kind == "keyword")
"""TRL 1.16's GRPOTrainer.__init__ keywords, in its order."""


def trainer_section() -> list[str]:
    """docs/TRL.md's GRPOTrainer section."""
    lines = ["## GRPOTrainer", "",
             "A TRL script runs with its import changed: `from grpo_train import GRPOConfig, GRPOTrainer` in place of "
             "`from trl import GRPOConfig, GRPOTrainer` (or TRL's GRPOConfig kept, with `use_cpu=True` on a CPU as TRL "
             "requires). `grpo_train.train(..., callbacks=[...])` takes the same callbacks. A keyword of the wrong "
             "type, or one TRL does not have (with a \"did you mean\"), stops the script before anything is written.",
             "", "| name | kind | what it does here |", "|---|---|---|"]
    lines += [f"| `{name}` | {kind} | {what} |" for name, kind, what in TRAINER]
    return lines
