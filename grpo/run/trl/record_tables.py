"""The tables of the three records `trl grpo` reads besides GRPOConfig (TRL 1.16's trl/scripts/grpo.py):
GRPOScriptArguments (the dataset and the reward functions), ModelConfig (the model and LoRA) and DatasetMixtureConfig
(`datasets:`), each row with its converter (grpo/run/trl/rows.py: Row, the machinery every table shares).

GRPOConfig's table is grpo/run/trl/config_table.py's (TABLE); docs/TRL.md shows all four (`python -m
grpo.run.trl.docs > docs/TRL.md`). The command line that reads them is grpo/run/trl/command_line.py.

A TRL command line's dataset is read here, once, with `datasets` as TRL's script reads it (grpo/data/dataset_dicts.py)
and written as JSON lines under $GRPO_DUAL_CACHE/datasets (grpo/run/trl/row_files.py), as `train(tasks={...: rows})`
writes rows in memory: the run's config.json names exactly the rows it trained on.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any, Callable, Mapping

from grpo import config as C
from grpo.data.dataset_dicts import MIXTURE_KEYS, check_hub, load_mixture, load_named
from grpo.data.generic import CHAT_ROLES
from grpo.data.tables import DataSourceError, looks_like_hub_id
from grpo.grading import trl_rewards
from grpo.run.trl.row_files import write_rows
from grpo.run.trl.rows import ESTIMATING, Row, _name, _noted, _only, _part_of, _set, bind, error, note, on_cpu

# ----------------------------------------------------------------------------------------- the dataset
TRL_RUN_TASK = "trl"
"""The task a TRL command line's dataset becomes when its name gives none (a mixture, a name that is no word)."""


def task_name(dataset: str) -> str:
    """The task of a dataset: its file or folder name without the suffix ("data/gsm8k.jsonl" -> "gsm8k"), as a
    word; TRL_RUN_TASK when that leaves nothing (metrics are reward/<task>/...)."""
    stem = Path(str(dataset).rstrip("/")).name
    for suffix in (".jsonl", ".json", ".csv", ".tsv", ".parquet", ".arrow"):
        stem = stem.removesuffix(suffix)
    word = re.sub(r"[^\w-]+", "_", stem).strip("_-")
    return word if word and word != "default" else TRL_RUN_TASK  # kl.default is every task's fallback entry


def _choose_splits(splits: Mapping[str, list], fields: Mapping[str, Any], where: str) -> tuple[list, list | None]:
    """(training rows, held-out rows or None) of the splits, by dataset_train_split and dataset_test_split."""
    train, test = str(fields["dataset_train_split"]), str(fields["dataset_test_split"])
    if train not in splits:
        raise error("GRPOScriptArguments", "dataset_train_split", train,
                    f"{where} has the splits {sorted(splits)}: name one of them")
    if test in splits:
        return splits[train], splits[test]
    if test != "test":  # set on purpose: a name that is not there is a mistake, not TRL's default left alone
        raise error("GRPOScriptArguments", "dataset_test_split", test,
                    f"{where} has the splits {sorted(splits)}: name one of them, or leave it at 'test' (none: "
                    "every row trains, as in TRL, and the verdict is judged from the training rewards)")
    return splits[train], None


def _check_rows(rows: tuple[list, list | None], fields: Mapping[str, Any], shown: str) -> None:
    """TRL's contract of a GRPO dataset, checked on the user's rows (the message names the dataset the user gave,
    its split and row, not the copy written under the cache): a `prompt` column, and chat messages of known roles."""
    record, field = (("DatasetMixtureConfig", "datasets") if shown.startswith("the mixture") else
                     ("GRPOScriptArguments", "dataset_name"))
    splits = {str(fields["dataset_train_split"]): rows[0], str(fields["dataset_test_split"]): rows[1] or []}
    for split, table in splits.items():
        if table and not any("prompt" in row for row in table):
            columns = sorted({key for row in table[:100] for key in row})
            raise C.ConfigError(f"{record}.{field}: the rows of {shown} (split {split!r}) have no `prompt` column "
                                f"(its columns: {columns}); TRL's GRPO reads each prompt from `prompt` (a text, or a "
                                "list of chat messages): name the column so", field=field)
        for number, row in enumerate(table, 1):
            prompt = row.get("prompt")
            for i, message in enumerate(prompt if isinstance(prompt, list) else []):
                role = message.get("role") if isinstance(message, Mapping) else None
                if role not in CHAT_ROLES:
                    raise C.ConfigError(f"{record}.{field}: {shown}, split {split!r}, row {number}: message {i + 1} "
                                        f"of its prompt has the role {role!r}; chat templates know "
                                        f"{', '.join(CHAT_ROLES[:4])} (and some {', '.join(CHAT_ROLES[4:])})",
                                        field=field)


def _write_task(out: dict, task: str, rows: tuple[list, list | None], fields: Mapping[str, Any], where: str) -> None:
    """tasks.<task>: the training rows and the held-out rows (or none) written once (grpo/run/trl/row_files.py)."""
    train, heldout = rows
    if not train:
        raise error("GRPOScriptArguments", "dataset_train_split", fields["dataset_train_split"],
                    f"the split of {where} has no rows")
    folder = write_rows(train, heldout, where=where)
    _set(out, f"tasks.{task}", {"path": str(folder / "train.jsonl"),
                                **({"heldout": str(folder / "heldout.jsonl")} if heldout is not None else {})})


def _loaded(load: Callable[[], dict[str, list]]) -> dict[str, list]:
    try:
        return load()
    except DataSourceError as err:  # the data layer names the TRL field; the command line reports ConfigErrors
        raise C.ConfigError(str(err), field=str(err).split("=", 1)[0].split(":", 1)[0].split("[", 1)[0]) from None


def _dataset(value: Any, fields: Mapping[str, Any], out: dict, notes: list) -> None:
    if fields["datasets"]:  # TRL: `datasets` wins, dataset_name is ignored with a warning
        if value:
            note(notes, "GRPOScriptArguments", "dataset_name", value, "not applied: `datasets` is given, and TRL "
                 "reads it instead of dataset_name too")
        return
    if not value:
        return
    name = str(value)
    if ESTIMATING.get():  # the rows do not change the estimate: the task is named, nothing is read
        _set(out, f"tasks.{task_name(name)}", {"path": name})
        return
    splits = _loaded(lambda: load_named(name, fields["dataset_config"], "dataset_name"))
    rows = _choose_splits(splits, fields, f"dataset_name={name!r}")
    _check_rows(rows, fields, f"dataset_name={name!r}")
    _write_task(out, task_name(name), rows, fields, "dataset_name")


def _mixture(value: Any, fields: Mapping[str, Any], out: dict, notes: list) -> None:
    if not value:
        return
    if not isinstance(value, list) or not all(isinstance(e, Mapping) for e in value):
        raise error("DatasetMixtureConfig", "datasets", value, "give a list of datasets, each a table with a `path` "
                    f"(and optionally {', '.join(MIXTURE_KEYS[1:])})")
    for i, entry in enumerate(value):
        unknown = sorted(set(entry) - set(MIXTURE_KEYS))
        if unknown:
            raise C.ConfigError(f"DatasetMixtureConfig.datasets[{i}] has no field(s) {unknown}"
                                f"{C.did_you_mean(unknown, MIXTURE_KEYS)}: a dataset has {list(MIXTURE_KEYS)}",
                                field="datasets")
        if not entry.get("path"):
            raise error("DatasetMixtureConfig", "datasets", entry, f"datasets[{i}] needs a `path`")
    if ESTIMATING.get():  # as for dataset_name
        _set(out, f"tasks.{TRL_RUN_TASK}", {"path": str(value[0]["path"])})
        return
    size = fields["test_split_size"]
    splits = _loaded(lambda: load_mixture(value, None if size is None else float(size), int(fields["seed"]),
                                          "datasets"))
    rows = _choose_splits(splits, fields, "the mixture of `datasets`")
    _check_rows(rows, fields, "the mixture of `datasets`")
    _write_task(out, task_name(value[0]["path"]) if len(value) == 1 else TRL_RUN_TASK, rows, fields, "datasets")


# ----------------------------------------------------------------------------------------- the rewards
REWARD_MODEL = "reward_model"
"""The reward_models.<name> entry of reward_model_name_or_path."""


def _import_term(ref: str) -> str:
    """TRL's import path "my_lib.rewards.custom_reward" as grpo-dual's "my_lib.rewards:custom_reward". TRL imports it
    with the working folder first on sys.path: a module file there that is not importable otherwise is named by its
    path ("path/my_lib/rewards.py:custom_reward"), so sys.path stays as it is."""
    module, _, function = ref.rpartition(".")
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that is not there
        found = False
    here = Path.cwd() / (module.replace(".", "/") + ".py")
    return f"{here}:{function}" if not found and here.is_file() else f"{module}:{function}"


def reward_term(name: str) -> str:
    """The rewards.<task> term of one reward_funcs entry: TRL's registry name, an import path, or grpo-dual's own
    'module:function' / 'path/file.py:function'. ConfigError naming reward_funcs for a name that is none of them,
    or a registry reward whose packages are missing (with the pip command)."""
    if name in trl_rewards.SCRIPT_REWARDS:
        how = trl_rewards.missing(name)
        if how is not None:
            raise error("GRPOScriptArguments", "reward_funcs", name, f"TRL's {name} needs packages that are not "
                        f"installed here: {how}")
        return trl_rewards.term(name)
    if ":" in name:
        return name
    if "." in name and not name.endswith(".py"):
        return _import_term(name)
    raise error("GRPOScriptArguments", "reward_funcs", name,
                f"expected one of TRL's {sorted(trl_rewards.SCRIPT_REWARDS)}"
                f"{C.did_you_mean([name], trl_rewards.SCRIPT_REWARDS)}, an import path 'my_lib.rewards.custom_reward' "
                "or 'path/to/file.py:function'")


def _rewards(value: Any, fields: Mapping[str, Any], out: dict, notes: list) -> None:
    funcs = [value] if isinstance(value, str) else list(value or [])
    model = fields["reward_model_name_or_path"]
    if not funcs and not model or ESTIMATING.get():  # (the reward functions take no GPU memory of the policy's)
        return
    tasks = sorted(out.get("tasks", {}))
    if not tasks:
        raise error("GRPOScriptArguments", "reward_funcs" if funcs else "reward_model_name_or_path", value or model,
                    "reward functions score the rows of dataset_name (or `datasets`): give one, or name the graders "
                    "of your tasks.<task> with rewards.<task>=grader:weight")
    terms = [reward_term(str(f)) for f in funcs]
    if model:
        path = str(model)
        if not Path(path).expanduser().exists():
            if not looks_like_hub_id(path):
                raise error("GRPOScriptArguments", "reward_model_name_or_path", path,
                            "no such folder: give a folder written by save_pretrained (a sequence-classification "
                            "model) or a Hub id")
            try:
                check_hub(path, "reward_model_name_or_path", "model")
            except DataSourceError as err:
                raise C.ConfigError(str(err), field="reward_model_name_or_path") from None
        _set(out, f"reward_models.{REWARD_MODEL}", {"path": path})
        terms.insert(0, REWARD_MODEL)  # TRL's script puts the reward model first
    weights = fields["reward_weights"]
    if weights is not None:
        if len(weights) != len(terms):
            raise error("GRPOConfig", "reward_weights", weights, f"{len(weights)} weights for {len(terms)} reward "
                        "functions (reward_model_name_or_path first, then reward_funcs): give one weight each")
        terms = [f"{t}:{float(w)!r}" for t, w in zip(terms, weights, strict=True)]
    for task in tasks:
        _set(out, f"rewards.{task}", ",".join(terms))


SCRIPT_TABLE: tuple[Row, ...] = (
    Row("dataset_name", "tasks.<task>.path, tasks.<task>.heldout", None,
        "the training rows, read with `datasets` as TRL's script reads it: a data file (.jsonl / .json / .csv / .tsv "
        "/ .parquet / .arrow, by its builder), a save_to_disk folder, a folder of data files (its splits from the file "
        "names: train.jsonl, test.jsonl, ...; a dataset script only where the installed `datasets` still runs them), "
        "or a Hub id (offline: refused, with the fix). Written once under $GRPO_DUAL_CACHE/datasets (the run's "
        "config.json names that file). The task is named after the file or folder (data/gsm8k.jsonl: gsm8k)",
        _dataset),
    Row("dataset_config", "", None, "the dataset's configuration (datasets' `name`)", _part_of("dataset_name")),
    Row("dataset_train_split", "tasks.<task>.path", "train", "the split trained on", _part_of("dataset_name")),
    Row("dataset_test_split", "tasks.<task>.heldout", "test",
        "the held-out rows of grpo-dual's evaluations (before and after training, every eval_steps); without that "
        "split every row trains, as in TRL, and the verdict is judged from the training rewards (data.heldout_fraction "
        "> 0 holds out a share of the rows instead); a split named on purpose must exist", _part_of("dataset_name")),
    Row("dataset_streaming", "", False, "false only", _only(False, "the rows are read into memory once")),
    Row("ignore_bias_buffers", "", False, "named in a note when true",
        _noted("TRL's GRPO script does not read it either (a DDP workaround of its DPO script)")),
    Row("reward_model_name_or_path", "reward_models.reward_model, rewards.<task>", None,
        "a sequence-classification reward model (a folder; a Hub id offline is refused, with the fix): its logit 0 on "
        "the prompt and completion, the first reward term, as in TRL", _part_of("reward_funcs")),
    Row("reward_funcs", "rewards.<task>", None,
        "the reward terms, in order, weighed by reward_weights: TRL's registry names "
        f"({', '.join(trl_rewards.SCRIPT_REWARDS)}: grpo/grading/trl_rewards.py, TRL's own functions where TRL is "
        "installed; accuracy_reward and reasoning_accuracy_reward need TRL and math-verify, refused with the pip "
        "command without them), an import path 'my_lib.rewards.custom_reward' (TRL's: a module file in the working "
        "folder too), or grpo-dual's 'module:function' / 'path/to/file.py:function'", _rewards),
)
"""GRPOScriptArguments (TRL 1.16's trl/scripts/grpo.py, with ScriptArguments' fields) in the order of docs/TRL.md."""
bind(SCRIPT_TABLE, "GRPOScriptArguments")


# ----------------------------------------------------------------------------------------- the model
LORA_DEFAULT_ARCHITECTURES = {"builtin:tiny": "llama"}
"""model.name values whose architecture is known without a folder (the packaged models: grpo/models/pretrained.py's
CATALOG, all Llama-shaped, are added by `model_architecture`)."""
ALL_LINEAR = {"llama": ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"],
              "mistral": ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"],
              "qwen2": ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"],
              "qwen3": ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]}
"""peft's "all-linear" (every linear layer but the output head) for the architectures it is spelled out for here."""


def _model_config(name: str) -> dict[str, Any] | None:
    """The config.json of a local model folder, else None."""
    path = Path(name).expanduser() / "config.json"
    return json.loads(path.read_text()) if path.is_file() else None


def model_architecture(name: str) -> str | None:
    """The model_type of model.name `name` (config.json's; builtin:tiny and the packaged models are llama), or
    None when it cannot be read here (a Hub id)."""
    from grpo.models.pretrained import catalog_entry

    if name in LORA_DEFAULT_ARCHITECTURES or catalog_entry(name) is not None:
        return LORA_DEFAULT_ARCHITECTURES.get(name, "llama")
    config = _model_config(name)
    return None if config is None else config.get("model_type")


def _model_name(value: Any, fields: Mapping[str, Any], out: dict, notes: list) -> None:
    if value is None:
        return
    name = str(value)
    from grpo.models.pretrained import catalog_entry

    local = Path(name).expanduser()
    if (not local.exists() and catalog_entry(name) is None and not name.startswith(("builtin:", "random:")) and
            not ESTIMATING.get()):  # an estimate reads a Hub id's shape from the bundled table
        if not looks_like_hub_id(name):
            raise error("ModelConfig", "model_name_or_path", name, "no such folder: give a model folder, a packaged "
                        "model (smollm2-135m-instruct) or a Hub id")
        try:
            check_hub(name, "model_name_or_path", "model")
        except DataSourceError as err:
            raise C.ConfigError(f"{err}; or a packaged model that needs no network: smollm2-135m-instruct",
                                field="model_name_or_path") from None
    _set(out, "model.name", name)


def _checkpoint_dtype(name: str) -> str | None:
    """The dtype a model folder's weights are stored in (config.json's dtype / torch_dtype); float32 for builtin:tiny
    and the packaged models (converted to float32); None when it cannot be read here."""
    from grpo.models.pretrained import catalog_entry

    if name.startswith("builtin:") or catalog_entry(name) is not None:
        return "float32"
    config = _model_config(name) or {}
    dtype = config.get("dtype", config.get("torch_dtype"))
    return str(dtype).removeprefix("torch.") if dtype in ("bfloat16", "float16", "float32") else None


def _dtype(value: Any, fields: Mapping[str, Any], out: dict, notes: list) -> None:
    init = fields["model_init_kwargs"] or {}
    if isinstance(init, Mapping) and ("dtype" in init or "torch_dtype" in init):
        return  # TRL's script: GRPOConfig.model_init_kwargs over ModelConfig's dtype (its row set model.dtype)
    name = str(_name(value) if value is not None else "auto").removeprefix("torch.")
    if name not in ("auto", "bfloat16", "float16", "float32"):
        raise error("ModelConfig", "dtype", value, "use auto, bfloat16, float16 or float32")
    if name == "auto":
        model = fields["model_name_or_path"]
        stored = _checkpoint_dtype(str(model)) if model is not None else None
        if stored is None:
            note(notes, "ModelConfig", "dtype", value, "the checkpoint's stored dtype cannot be read here: grpo-dual's "
                 "model.dtype=auto applies (bfloat16 on GPUs that have it, else float16; float32 on the CPU)")
        name = stored or "auto"
    _set(out, "model.dtype", name)
    bf16 = (not fields["fp16"]) if fields["bf16"] is None else bool(fields["bf16"])  # GRPOConfig's __post_init__
    if fields["fp16"] and not on_cpu(fields):  # (on the CPU GRPOConfig's row named it already)
        note(notes, "GRPOConfig", "fp16", True, f"TRL autocasts the forward to float16 over ModelConfig.dtype={name} "
             f"weights; grpo-dual has no autocast and computes in {name} here (dtype float16 gives float16 weights)")
    elif name == "float32" and bf16 and not on_cpu(fields):
        note(notes, "GRPOConfig", "bf16", True, "TRL autocasts the forward to bfloat16 over ModelConfig.dtype="
             "float32 weights; grpo-dual has no autocast and computes in float32 here (dtype bfloat16 gives "
             "bfloat16 weights)")


def _attention(value: Any, fields: Mapping[str, Any], out: dict, notes: list) -> None:
    if value is None:
        return
    if value not in ("eager", "sdpa", "flash_attention_2"):
        raise error("ModelConfig", "attn_implementation", value, "grpo-dual runs eager, sdpa or flash_attention_2: "
                    "use one of them, or leave it unset")
    _set(out, "model.attn_implementation", str(value))


def _lora_targets(value: Any, fields: Mapping[str, Any], out: dict, notes: list) -> None:
    names = [value] if isinstance(value, str) else None if value is None else [str(v) for v in value]
    model = fields["model_name_or_path"]
    if names is None or names == ["all-linear"]:
        kind = model_architecture(str(model)) if model is not None else None
        if names is None:
            from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as PEFT_DEFAULTS

            names = PEFT_DEFAULTS.get(kind) if kind else None
            what = "peft's default modules for the model's architecture"
        else:
            names = ALL_LINEAR.get(kind) if kind else None
            what = "peft's all-linear"
        if names is None and fields["use_peft"] and ESTIMATING.get():  # a Hub id's bundled shape is Llama-style
            names = ["q_proj", "v_proj"]
            note(notes, "ModelConfig", "lora_target_modules", value, f"the estimate assumes q_proj, v_proj ({what} "
                 "cannot be told here)")
        if names is None:
            if not fields["use_peft"]:
                return
            raise error("ModelConfig", "lora_target_modules", value, f"{what} cannot be told here (model "
                        f"{model!r}, architecture {kind!r}): name the modules, e.g. q_proj v_proj")
    _set(out, "model.lora_target_modules", sorted(names))


def _use_peft(value: Any, fields: Mapping[str, Any], out: dict, notes: list) -> None:
    _set(out, "model.lora", bool(value))


def _nested_quant(value: Any, fields: Mapping[str, Any], out: dict, notes: list) -> None:
    if fields["load_in_4bit"] and not value:
        note(notes, "ModelConfig", "use_bnb_nested_quant", value, "grpo-dual's 4-bit weights nest the quantization "
             "(bitsandbytes double quantization, about 0.4 bits a weight less)")


MODEL_TABLE: tuple[Row, ...] = (
    Row("model_name_or_path", "model.name", None, "a model folder, a packaged model (smollm2-135m-instruct: "
        "grpo/models/pretrained.py), builtin:tiny, or a Hub id (offline: refused, with the fix)", _model_name),
    Row("model_revision", "", "main", "main only", _only("main", "a model is loaded as its folder or Hub id holds "
                                                          "it; download that revision into a folder")),
    Row("dtype", "model.dtype", "float32", "the weights' dtype, as TRL's script passes it to from_pretrained (over "
        "GRPOConfig.bf16's; GRPOConfig.model_init_kwargs' dtype over it); auto: the checkpoint's stored dtype",
        _dtype),
    Row("attn_implementation", "model.attn_implementation", None, "eager, sdpa or flash_attention_2; unset: "
        "model.attn_implementation=auto (flash_attention_2 where installed and supported, else sdpa, transformers' "
        "own default)", _attention),
    Row("use_peft", "model.lora", False, "train a LoRA adapter", _use_peft),
    Row("lora_r", "model.lora_r", 16, "copied"),
    Row("lora_alpha", "model.lora_alpha", 32, "copied"),
    Row("lora_dropout", "model.lora_dropout", 0.05, "copied"),
    Row("lora_target_modules", "model.lora_target_modules", None, "the modules; unset: peft's default for the model's "
        "architecture (q_proj, v_proj for Llama, Mistral, Qwen); all-linear: every linear layer but the output head "
        "(Llama, Mistral, Qwen2, Qwen3)", _lora_targets),
    Row("lora_target_parameters", "", None, "unset only", _only(None, "LoRA adapts modules here, not parameters")),
    Row("lora_modules_to_save", "", None, "unset only", _only(None, "only the adapter is trained (the reference "
                                                                  "is the same weights with it disabled)")),
    Row("lora_task_type", "", "CAUSAL_LM", "CAUSAL_LM only", _only("CAUSAL_LM", "grpo-dual trains causal LMs")),
    Row("use_rslora", "", False, "false only", _only(False, "the adapter is scaled by lora_alpha / r")),
    Row("use_dora", "", False, "false only", _only(False, "DoRA is not implemented")),
    Row("load_in_8bit", "", False, "false only", _only(False, "grpo-dual quantizes to 4 bits only: use "
                                                            "load_in_4bit (with use_peft)")),
    Row("load_in_4bit", "model.load_in_4bit", False, "QLoRA: 4-bit nf4 weights under the adapter (CUDA, "
        "bitsandbytes; needs use_peft)"),
    Row("bnb_4bit_quant_type", "", "nf4", "nf4 only", _only("nf4", "the 4-bit weights are nf4")),
    Row("use_bnb_nested_quant", "", False, "the 4-bit weights' quantization is always nested here: false is named "
        "in a note under load_in_4bit", _nested_quant),
    Row("bnb_4bit_quant_storage", "", None, "unset only", _only(None, "the 4-bit weights are stored as bitsandbytes "
                                                                 "stores them by default")),
)
"""ModelConfig (TRL 1.16's trl/trainer/model_config.py) in the order of docs/TRL.md. Applied whole, its defaults
included, when a TRL command line gives any of its fields; else the model section is grpo-dual's."""
bind(MODEL_TABLE, "ModelConfig")


MIXTURE_TABLE: tuple[Row, ...] = (
    Row("datasets", "tasks.<task>.path, tasks.<task>.heldout", [],
        "a mixture, read as TRL's get_dataset reads it (each entry's path, name, data_dir, data_files, split, "
        "columns and fraction; concatenated) and written as dataset_name is; over dataset_name when both are given, "
        "as in TRL (a note); the task is the one dataset's name, or trl", _mixture),
    Row("streaming", "", False, "false only", _only(False, "the rows are read into memory once")),
    Row("test_split_size", "tasks.<task>.heldout", None, "a test split of this share (or count) of the mixture, the "
        "held-out rows; split with GRPOConfig.seed (TRL's split is unseeded)", _part_of("datasets")),
)
"""DatasetMixtureConfig (TRL 1.16's trl/scripts/utils.py) in the order of docs/TRL.md."""
bind(MIXTURE_TABLE, "DatasetMixtureConfig")

RECORDS: dict[str, tuple[Row, ...]] = {"GRPOScriptArguments": SCRIPT_TABLE, "ModelConfig": MODEL_TABLE,
                                       "DatasetMixtureConfig": MIXTURE_TABLE}
"""The records `trl grpo` reads besides GRPOConfig, each with its table."""
