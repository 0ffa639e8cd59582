"""A TRL script as it is: TRL 1.16's own GRPOTrainer scripts run with one import line changed
(`from grpo_train import GRPOTrainer`), each beside TRL's GRPOTrainer on the same script, tiny model, CPU: the same
global_step, TRL's log_history keys (ours may add), output_dir and checkpoint-N loadable the same way; transformers'
callbacks and EarlyStoppingCallback; the keywords checked before anything is written."""

from __future__ import annotations

import copy
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import torch

pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

from grpo import config as C  # noqa: E402

TRL_IMPORT = "from trl import GRPOConfig, GRPOTrainer"
OUR_IMPORT = "from trl import GRPOConfig\nfrom grpo_train import GRPOTrainer"

HEADER = f'''
{TRL_IMPORT}
from datasets import Dataset

def reward_len(completions, **kwargs):
    return [-abs(20 - len(str(c))) for c in completions]
'''
ARGS = ("output_dir='out', max_steps=2, per_device_train_batch_size=4, num_generations=4, max_completion_length=6, "
        "use_cpu=True, report_to='none', logging_steps=1, save_steps=1, seed=0")

SCRIPTS = {
    # TRL's quickstart (its docs' GRPO example), on the tiny model and a short run
    "quickstart": HEADER + f'''
dataset = Dataset.from_list([{{"prompt": f"Describe the number {{i}}."}} for i in range(16)])
training_args = GRPOConfig({ARGS})
trainer = GRPOTrainer(model=MODEL, reward_funcs=reward_len, args=training_args, train_dataset=dataset)
trainer.train()
''',
    # two reward functions weighed by reward_weights, conversational prompts
    "two_rewards_conversational": HEADER + f'''
def reward_short(completions, **kwargs):
    return [-float(len(c[0]["content"])) for c in completions]

def reward_chat(completions, **kwargs):
    return [1.0 if c[0]["role"] == "assistant" else 0.0 for c in completions]

dataset = Dataset.from_list([{{"prompt": [{{"role": "user", "content": f"Describe the number {{i}}."}}]}}
                             for i in range(16)])
training_args = GRPOConfig({ARGS}, reward_weights=[1.0, 0.5])
trainer = GRPOTrainer(model=MODEL, reward_funcs=[reward_short, reward_chat], args=training_args,
                      train_dataset=dataset)
trainer.train()
''',
    # peft's default LoraConfig: no target_modules, peft's default for the architecture
    "peft_default": HEADER + f'''
from peft import LoraConfig

dataset = Dataset.from_list([{{"prompt": f"Describe the number {{i}}."}} for i in range(16)])
training_args = GRPOConfig({ARGS})
trainer = GRPOTrainer(model=MODEL, reward_funcs=reward_len, args=training_args, train_dataset=dataset,
                      peft_config=LoraConfig(r=8, lora_alpha=16, task_type="CAUSAL_LM"))
trainer.train()
''',
    # an eval split, load_best_model_at_end, EarlyStoppingCallback and a custom TrainerCallback
    "early_stopping": HEADER + '''
from transformers import EarlyStoppingCallback, TrainerCallback

def constant(completions, **kwargs):  # never improves: patience 1 stops after the second evaluation
    return [1.0 for c in completions]

class Events(TrainerCallback):
    def __init__(self):
        self.seen = []
    def on_train_begin(self, args, state, control, **kwargs):
        self.seen.append("train_begin")
    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.seen.append(("evaluate", state.global_step, round(metrics["eval_reward"], 4)))
    def on_save(self, args, state, control, **kwargs):
        self.seen.append(("save", state.global_step))
    def on_train_end(self, args, state, control, **kwargs):
        self.seen.append("train_end")

events = Events()
train = Dataset.from_list([{"prompt": f"Describe the number {i}."} for i in range(16)])
test = Dataset.from_list([{"prompt": f"Name the number {i}."} for i in range(4)])
training_args = GRPOConfig(output_dir="out", max_steps=6, per_device_train_batch_size=4, num_generations=4,
                           max_completion_length=4, use_cpu=True, report_to="none", logging_steps=1, seed=0,
                           eval_strategy="steps", eval_steps=1, save_steps=1, load_best_model_at_end=True,
                           metric_for_best_model="reward", per_device_eval_batch_size=4)
trainer = GRPOTrainer(model=MODEL, reward_funcs=constant, args=training_args, train_dataset=train,
                      eval_dataset=test, callbacks=[EarlyStoppingCallback(early_stopping_patience=1), events])
trainer.train()
''',
}


@pytest.fixture(scope="module", autouse=True)
def no_plot():
    """Our runs here leave plot.png out: no assertion of this module reads it (tests/test_plot.py and the demo's
    tests do), and matplotlib's layout of it costs more than the rest of a 2-step tiny run."""
    import grpo_train

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(grpo_train.doctor, "plot_run", lambda run_dir: None)
        yield


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    """A tiny Llama and its tokenizer saved as a model folder, the kind a TRL script names."""
    from transformers import LlamaForCausalLM

    from grpo.models.modeling import build_tiny_tokenizer, tiny_model_config

    folder = tmp_path_factory.mktemp("tiny") / "model"
    tok = build_tiny_tokenizer([f"Describe the number {i}." for i in range(50)] + ["Name the number 3."],
                               vocab_size=300)
    torch.manual_seed(0)
    LlamaForCausalLM(tiny_model_config(len(tok), hidden=32, layers=1, heads=2, kv_heads=1)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def run_script(script: str, folder: Path, model: Path, ours: bool, namespace: dict | None = None) -> dict:
    """The script run in `folder` (TRL's, or ours with the import line changed), `namespace` its given names beside
    MODEL: its namespace."""
    text = script.replace(TRL_IMPORT, OUR_IMPORT) if ours else script
    assert (OUR_IMPORT in text) == ours
    folder.mkdir(parents=True)
    here = os.getcwd()
    os.chdir(folder)
    try:
        namespace = {**(namespace or {}), "MODEL": str(model), "__name__": "__main__"}
        exec(compile(text, f"<{'ours' if ours else 'trl'} script>", "exec"), namespace)
        return namespace
    finally:
        os.chdir(here)


def zero(completions, **kwargs):
    return [0.0] * len(completions)


def train_keys(trainer) -> set[str]:
    return {k for row in trainer.state.log_history if "loss" in row for k in row}


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_DUAL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path


@dataclass
class SideBySide:
    """One script run twice in `root`: by TRL's own GRPOTrainer (root/trl) and by ours (root/ours), their namespaces."""

    root: Path
    theirs: dict
    ours: dict


def side_by_side(script: str, root: Path, model: Path, namespace: Callable[[], dict] | None = None) -> SideBySide:
    """`script` run by both trainers, TRL's first; `namespace` makes each side's given names afresh (a loaded model
    is trained in place, so each side gets its own)."""
    given = namespace or dict
    return SideBySide(root, run_script(script, root / "trl", model, ours=False, namespace=given()),
                      run_script(script, root / "ours", model, ours=True, namespace=given()))


def assert_runs_alike(runs: SideBySide, steps: int) -> None:
    """What a TRL user reads of a run is the same on both sides: global_step, TRL's log_history keys (ours may add),
    output_dir's checkpoint-1..steps folders, each loadable with from_pretrained (AutoPeftModelForCausalLM for an
    adapter) with its tokenizer."""
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoModelForCausalLM, AutoTokenizer

    theirs, ours = runs.theirs["trainer"], runs.ours["trainer"]
    assert ours.state.global_step == theirs.state.global_step == steps
    missing = train_keys(theirs) - train_keys(ours)
    assert not missing, f"TRL's log_history keys missing from ours: {sorted(missing)}"
    reward_keys = {k for k in train_keys(theirs) if k.startswith("rewards/")}
    assert reward_keys and reward_keys <= train_keys(ours)
    points = [f"checkpoint-{n}" for n in range(1, steps + 1)]
    for side in ("trl", "ours"):
        out = runs.root / side / "out"
        assert sorted(p.name for p in out.glob("checkpoint-*")) == points, side
        for folder in [out / p for p in points]:
            adapter = (folder / "adapter_config.json").is_file()
            assert adapter == ((runs.root / "trl" / "out" / folder.name / "adapter_config.json").is_file()), folder
            loader = AutoPeftModelForCausalLM if adapter else AutoModelForCausalLM
            assert loader.from_pretrained(folder) is not None and AutoTokenizer.from_pretrained(folder) is not None


@pytest.mark.parametrize("name", ["quickstart", "two_rewards_conversational", "peft_default"])
def test_a_trl_script_runs_with_only_the_import_changed_beside_trls_own(name, tiny_folder, isolated):
    from transformers import AutoTokenizer

    runs = side_by_side(SCRIPTS[name], isolated, tiny_folder)
    assert_runs_alike(runs, steps=2)
    theirs, ours = runs.theirs["trainer"], runs.ours["trainer"]
    ours.save_model(str(isolated / "saved"))  # TRL's trainer.save_model(dir): the model, tokenizer and card
    card = (isolated / "saved" / "README.md").read_text()
    assert "More Information Needed" not in card and "GRPO" in card
    assert AutoTokenizer.from_pretrained(isolated / "saved") is not None
    if name == "peft_default":  # peft's default modules for a Llama, as TRL's own trainer takes them
        assert (isolated / "ours" / "out" / "checkpoint-1" / "adapter_config.json").is_file()
        assert (sorted(ours.model.peft_config["default"].target_modules)
                == sorted(theirs.model.peft_config["default"].target_modules) == ["q_proj", "v_proj"])


def test_early_stopping_and_a_custom_callback_see_what_trls_trainer_shows_them(tiny_folder, isolated):
    runs = side_by_side(SCRIPTS["early_stopping"], isolated, tiny_folder)
    theirs, ours = runs.theirs, runs.ours
    # a constant reward never improves: patience 1 stops both after the second evaluation, at the same step
    assert_runs_alike(runs, steps=2)
    assert [e for e in ours["events"].seen if e[0] != "save"] == [e for e in theirs["events"].seen if e[0] != "save"]
    assert ours["events"].seen[0] == "train_begin" and ours["events"].seen[-1] == "train_end"
    assert ("save", 1) in ours["events"].seen and ("save", 2) in ours["events"].seen
    assert ours["trainer"].state.best_metric == pytest.approx(theirs["trainer"].state.best_metric) == 1.0
    assert Path(ours["trainer"].state.best_model_checkpoint).name == "checkpoint-1"
    assert {"eval_reward", "epoch", "step"} <= {k for r in ours["trainer"].state.log_history if "eval_reward" in r
                                                for k in r}


def test_a_callback_that_raises_stops_the_run_with_its_name_and_the_checkpoint_stays(tiny_folder, isolated):
    from transformers import TrainerCallback

    from grpo.run.trl import GRPOConfig
    from grpo_train import CallbackError, GRPOTrainer

    class Broken(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                raise ZeroDivisionError("my bug")

    rows = datasets.Dataset.from_list([{"prompt": f"Describe the number {i}."} for i in range(8)])
    out = isolated / "out"
    args = GRPOConfig(output_dir=str(out), max_steps=3, per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=4, use_cpu=True, save_steps=1, report_to="none")
    trainer = GRPOTrainer(model=str(tiny_folder), reward_funcs=zero, args=args, train_dataset=rows, callbacks=[Broken])
    with pytest.raises(CallbackError, match=r"callback Broken\.on_step_end raised ZeroDivisionError: my bug"):
        trainer.train()
    assert (out / "grpo-dual" / "checkpoints" / "step_000001" / "manifest.json").is_file()
    again = GRPOTrainer(model=str(tiny_folder), reward_funcs=zero, args=args, train_dataset=rows)
    again.train(resume_from_checkpoint=True)  # the same run goes on from its last checkpoint
    assert again.state.global_step == 3
    # TRL's way: a checkpoint-N folder of output_dir (the exact-resume state it stands for)
    third = GRPOTrainer(model=str(tiny_folder), reward_funcs=zero, args=args, train_dataset=rows)
    out_rows = third.train(resume_from_checkpoint=str(out / "checkpoint-1"))
    assert out_rows.global_step == 3
    # step 1's row kept from before; steps 2-3 are one logging window (logging_steps 10), logged at the last step
    assert [r["step"] for r in third.state.log_history if "loss" in r] == [1, 3]


def test_train_takes_callbacks_and_grpo_configs_of_ours_without_trl(tiny_folder, isolated):
    from transformers import TrainerCallback

    from grpo_train import GRPOConfig, train

    seen = []

    class Stop(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            seen.append((state.global_step, "reward/t/mean" in logs))
            if state.global_step == 2:
                control.should_training_stop = True

    rows = [{"prompt": f"Describe the number {i}."} for i in range(8)]
    args = GRPOConfig(output_dir=str(isolated / "out"), max_steps=5, per_device_train_batch_size=4,
                      num_generations=4, max_completion_length=4, use_cpu=True, logging_steps=1)
    run = train(tasks={"t": rows}, rewards={"t": [lambda completions, **kw: [0.0] * len(completions)]},
                model=str(tiny_folder), args=args, callbacks=[Stop()])
    assert run.progress.step == 2 and [s for s, step_row in seen if step_row] == [1, 2]
    assert seen[-1] == (2, False)  # the train_runtime row at the end, as Trainer.train logs it


# ------------------------------------------------------------------------------------ keywords, before any work
def _trainer(**kw):
    from grpo_train import GRPOTrainer

    base = {"model": "builtin:tiny", "reward_funcs": lambda completions, **k: [0.0] * len(completions),
            "train_dataset": datasets.Dataset.from_list([{"prompt": "hi"}] * 4)}
    return GRPOTrainer(**{**base, **kw})


@pytest.mark.parametrize("keyword, value, says", [
    ("model", 3, "a model's name or folder"),
    ("reward_funcs", [3], "a reward function, a reward model's name or folder"),
    ("reward_funcs", [], "no reward function"),
    ("train_dataset", 3, "a datasets Dataset"),
    ("eval_dataset", 3, "a Dataset or a dict of Datasets"),
    ("callbacks", ["x"], "TrainerCallback"),
    ("tools", "calc", "a list of functions"),
    ("optimizers", (torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1), None), "optimizers=(None, None)"),
    ("rollout_func", lambda prompts, trainer: {}, "tools=[...] or environment_factory"),
    ("reward_processing_classes", [None, None], "one per function"),
    ("args", 3, "a GRPOConfig or a dict"),
    ("processing_class", 3, "a tokenizer"),
    ("peft_config", {"r": 8}, "a peft LoraConfig"),
    ("quantization_config", "4bit", "a transformers BitsAndBytesConfig"),
    ("environment_factory", 3, "a class or function that makes an environment"),
])
def test_each_keyword_of_a_wrong_type_is_named_with_what_trl_accepts(keyword, value, says, isolated, monkeypatch):
    monkeypatch.chdir(isolated)
    with pytest.raises(C.ConfigError, match=re.escape(says)) as err:
        _trainer(**{keyword: value})
    assert err.value.field == keyword or keyword == "args"
    assert sorted(p.name for p in isolated.iterdir()) == []  # nothing written: no folder, no row files


def test_the_trainer_table_is_trls_constructor_and_our_class_has_its_methods():
    """docs/TRL.md's GRPOTrainer table (grpo/run/trl/trainer_table.py) lists TRL 1.16's keywords in its order, our
    GRPOTrainer takes exactly those, and every method the table names is there."""
    import inspect

    import trl

    from grpo.run.trl.trainer_table import TRAINER, TRAINER_KEYWORDS
    from grpo_train import GRPOTrainer

    def keywords(cls):
        return tuple(p.name for p in inspect.signature(cls.__init__).parameters.values()
                     if p.name != "self" and p.kind is not p.VAR_KEYWORD)

    assert keywords(trl.GRPOTrainer) == keywords(GRPOTrainer) == TRAINER_KEYWORDS
    methods = [m.strip() for name, kind, _ in TRAINER if kind == "method" for m in name.split("(")[0].split("/")]
    assert methods and all(callable(getattr(GRPOTrainer, m)) for m in methods), methods


def test_an_unknown_keyword_gets_did_you_mean_and_train_names_the_trainer(isolated, monkeypatch):
    from grpo_train import train

    monkeypatch.chdir(isolated)
    with pytest.raises(C.ConfigError, match=r"no keyword\(s\) \['reward_fns'\] \(did you mean `reward_funcs`\?\)"):
        _trainer(reward_fns=[len])
    with pytest.raises(C.ConfigError, match=r"train\(reward_funcs=\.\.\.\) is a keyword of GRPOTrainer.*"
                                            r"rewards=\{task: \[functions\]\}"):
        train(reward_funcs=[len])
    with pytest.raises(C.ConfigError, match=r"train\(train_dataset=\.\.\.\).*tasks=\{task: dataset\}"):
        train(train_dataset=[{"prompt": "x"}])
    with pytest.raises(C.ConfigError, match=r"train\(\) has no keyword 'rolout' \(did you mean `rollout`\?\)"):
        train(rolout={"k": 2})
    assert sorted(p.name for p in isolated.iterdir()) == []


def test_push_to_hub_without_a_hub_names_what_would_go_where(tiny_folder, isolated, monkeypatch):
    monkeypatch.chdir(isolated)
    trainer = _trainer(model=str(tiny_folder), args={"output_dir": str(isolated / "mine"), "use_cpu": True})
    with pytest.raises(RuntimeError, match=r"it would push .*mine \(no files yet\) to the Hub repo 'mine'"):
        trainer.push_to_hub()


# ------------------------------------------------------------------------------------ tools, a reward model
TOOL_CALL = {"name": "multiply", "arguments": {"a": 2, "b": 3}}
"""The one call the tool-calling model makes."""


@pytest.fixture(scope="module")
def calling_model():
    """(tokenizer, model) for TRL's tool loop and ours. The tokenizer is a tiny BPE one with TRL's own Qwen2.5 chat
    template, which renders tools and from which TRL parses calls (trl.chat_template_utils.add_response_schema knows
    it; supports_tool_calling and is_chat_template_prefix_preserving hold), `<|im_end|>` its end of turn. A random
    model never writes a call, so the model is a bigram one: its blocks add nothing (o_proj and down_proj zero), the
    next token is read from the last one's embedding, and the generation prompt's last token leads to the call (one
    added token holding `<tool_call>...</tool_call>`), the call to `<|im_end|>`: every assistant turn is that call."""
    from trl.chat_template_utils import qwen2_5_chat_template

    from grpo.models.modeling import build_tiny_model, build_tiny_tokenizer

    def multiply(a: int, b: int) -> int:  # the docs' tool, rendered into the prompts the BPE merges are learnt from
        """Multiply two integers.

        Args:
            a: The first factor.
            b: The second factor.
        """
        return a * b

    def prompt(tok, a=123, b=456, **kw):
        return tok.apply_chat_template([{"role": "user", "content": f"What is {a} * {b}?"}], tools=[multiply],
                                       add_generation_prompt=True, **kw)

    plain = build_tiny_tokenizer(["x"], vocab_size=300)
    plain.chat_template = qwen2_5_chat_template
    tok = build_tiny_tokenizer([prompt(plain, a, b, tokenize=False) for a, b in zip(range(123, 147), range(456, 480),
                                                                                  strict=True)], vocab_size=1000)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    call = f"<tool_call>\n{json.dumps(TOOL_CALL)}\n</tool_call>"
    tok.add_tokens([call])
    tok.eos_token, tok.chat_template = "<|im_end|>", qwen2_5_chat_template
    model = build_tiny_model(tok, seed=3, hidden=32, layers=1, heads=2, kv_heads=1, max_positions=1024)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embed, head = model.model.embed_tokens.weight, model.lm_head.weight
        last = prompt(tok, tokenize=True, return_dict=False)[-1]
        for before, after in ((last, tok.convert_tokens_to_ids(call)), (tok.convert_tokens_to_ids(call),
                                                                        tok.eos_token_id)):
            head[after] = 10 * embed[before] / embed[before].norm()
    return tok, model


def test_the_docs_tools_script_runs_beside_trls_own_with_only_the_import_changed(calling_model, isolated):
    """docs/CUSTOM_TASKS.md section 6's TRL script (a loaded model and tokenizer, tools=[multiply]) run by TRL's
    GRPOTrainer and by ours with the import line changed; only the model is a tiny one that calls the tool on every
    turn and the GRPOConfig a 2-step CPU run of 4 completions a step with one tool round
    (max_tool_calling_iterations=1): both run the tool once per completion, the same steps, keys and checkpoints."""
    tokenizer, model = calling_model
    text = (Path(__file__).resolve().parents[1] / "docs" / "CUSTOM_TASKS.md").read_text()
    script = next(b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "tools=[multiply]" in b
                  and "GRPOTrainer(" in b)
    assert TRL_IMPORT in script and "GRPOConfig(num_generations=8)" in script
    script = script.replace("GRPOConfig(num_generations=8)", "GRPOConfig(num_generations=4, output_dir='out', "
                            "per_device_train_batch_size=4, max_steps=2, max_completion_length=48, "
                            "max_tool_calling_iterations=1, use_cpu=True, report_to='none', logging_steps=1, "
                            "save_steps=1, seed=0)")
    runs = side_by_side(script, isolated, Path("unused"),
                        lambda: {"model": copy.deepcopy(model), "tokenizer": copy.deepcopy(tokenizer)})
    assert_runs_alike(runs, steps=2)
    for side in (runs.theirs, runs.ours):
        assert side["trainer"].model is side["model"]  # a loaded model is trained in place
        rows = [r for r in side["trainer"].state.log_history if "loss" in r]
        assert [(r["tools/call_frequency"], r["tools/failure_frequency"]) for r in rows] == [(1.0, 0.0)] * 2
    assert runs.ours["trainer"].run.generation.toolbox.names == ["multiply"]


def test_a_reward_model_by_folder_and_loaded_is_named_and_scored_as_trls(tiny_folder, isolated):
    from transformers import AutoTokenizer, LlamaForSequenceClassification

    from grpo.models.modeling import tiny_model_config
    from grpo.run.trainer import model_reward

    tok = AutoTokenizer.from_pretrained(tiny_folder)
    config = tiny_model_config(len(tok), hidden=32, layers=1, heads=2, kv_heads=1)
    config.num_labels, config.pad_token_id = 1, tok.pad_token_id
    torch.manual_seed(0)
    rm_folder = isolated / "my-rm"
    LlamaForSequenceClassification(config).save_pretrained(rm_folder)
    tok.save_pretrained(rm_folder)
    rm = LlamaForSequenceClassification.from_pretrained(rm_folder)
    reward = model_reward(rm, tok)
    assert reward.__name__ == "my-rm"  # TRL's name: the last part of the model's id
    prompts, completions = ["Describe the number 1.", "Describe the number 22."], [" one", " twenty two, it is"]
    batch = tok(text=[p + c for p, c in zip(prompts, completions, strict=True)], return_tensors="pt", padding=True,
                padding_side="right", add_special_tokens=False)
    with torch.no_grad():  # TRL's GRPOTrainer._calculate_rewards for a model, by hand
        by_hand = rm(**batch).logits[:, 0].tolist()
    assert reward(prompts=prompts, completions=completions) == pytest.approx(by_hand, abs=1e-6)
    # TRL's quickstart with the reward model's folder beside its function: the same run on both sides
    script = SCRIPTS["quickstart"].replace("reward_funcs=reward_len", f"reward_funcs=[reward_len, {str(rm_folder)!r}]")
    runs = side_by_side(script, isolated, tiny_folder)
    assert_runs_alike(runs, steps=2)
    for side in (runs.theirs, runs.ours):
        assert {"rewards/my-rm/mean", "rewards/reward_len/mean"} <= train_keys(side["trainer"])
