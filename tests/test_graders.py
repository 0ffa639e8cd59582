"""Graders of every kind: per-row and TRL-style batched functions (TRL's own doc examples, unchanged), file-path
imports, reward models built in code, the preflight that runs before the model loads, and the range contract."""

from __future__ import annotations

import math
import sys
import textwrap

import pytest
import torch

from grpo.core.advantages import group_advantages
from grpo.core.plumbing import FILE_MODULE_PREFIX
from grpo.core.rule_graders import GRADERS, bbq_rule, format_reward, token_f1
from grpo.core.step_types import Rollout, Sample
from grpo.grading.graders import (
    GraderError,
    builtin_graders,
    extra_logger,
    grader_kind,
    preflight,
    resolve_grader,
    resolve_graders,
    trl_inputs,
)
from grpo.grading.reward_models import RewardModelSpec, normalize_scores
from grpo.grading.scoring import RewardSpec, score_rollouts

pytestmark = pytest.mark.usefixtures("one_thread")

# TRL's documentation, copied unchanged (docs/source/grpo_trainer.md, "Using a custom reward function", and the
# quick start's length reward). Example 1.1 and Example 3 share the name reward_func, so each file holds one.
TRL_DOCS_STANDARD = '''
import asyncio

def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]

def reward_func(completions, **kwargs):
    """Reward function that assigns higher scores to longer completions (in terms of character count)."""
    return [float(len(completion)) for completion in completions]

async def async_reward_func(prompts, completions, **kwargs):
    # Simulate an I/O-bound call (e.g., HTTP request, database lookup)
    await asyncio.sleep(0.01)
    # Simple toy reward: 1.0 if the completion is non-empty, else 0.0
    return [1.0 if completion else 0.0 for completion in completions]
'''
TRL_DOCS_REFERENCE = r'''
import re

def reward_func(completions, ground_truth, **kwargs):
    # Regular expression to capture content inside \boxed{}
    matches = [re.search(r"\\boxed\{(.*?)\}", completion) for completion in completions]
    contents = [match.group(1) if match else "" for match in matches]
    # Reward 1 if the content is the same as the ground truth, 0 otherwise
    return [1.0 if c == gt else 0.0 for c, gt in zip(contents, ground_truth)]
'''
TRL_DOCS_CONVERSATIONAL = '''
import re

def format_reward_func(completions, **kwargs):
    """Reward function that checks if the completion has a specific format."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content) for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]
'''


def sample(task="t", prompt="The sky is", gold=None, conversational=False, target=None, sid="s0"):
    messages = ({"role": "user", "content": prompt},) if isinstance(prompt, str) else tuple(prompt)
    return Sample(task=task, id=sid, messages=messages, gold=dict(gold or {}), target=target,
                  conversational=conversational)


def rollout(s, text, ids=(1, 2)):
    return Rollout(sample=s, prompt_ids=(7,), completion_ids=tuple(ids), text=text, stopped=True, truncated=False)


def write(path, source):
    path.write_text(textwrap.dedent(source))
    return path


def test_grader_kind_from_the_signature():
    class PerRow:
        def __call__(self, completion, gold):
            return 1.0

    assert [grader_kind(f) for f in (bbq_rule, token_f1, PerRow(), lambda c, g, **kw: 0.0)] == ["row"] * 4
    assert grader_kind(lambda completions, **kw: []) == "batched"
    assert grader_kind(lambda prompts, completions, completion_ids: []) == "batched"
    assert grader_kind(lambda **kwargs: []) == "batched"
    with pytest.raises(GraderError, match=r"signature \(a, b, c\) fits neither a per-row grader"):
        grader_kind(lambda a, b, c: 0.0)


def test_trl_reward_functions_copied_from_the_docs_run_unchanged(tmp_path):
    standard = write(tmp_path / "docs_standard.py", TRL_DOCS_STANDARD)
    reference = write(tmp_path / "docs_reference.py", TRL_DOCS_REFERENCE)
    conversational = write(tmp_path / "docs_conv.py", TRL_DOCS_CONVERSATIONAL)
    sky = sample("sky", "The sky is")
    sun = sample("sky", "The sun is", sid="s1")
    maths = [sample("math", "Problem: Solve the equation $2x + 3 = 7$. Solution:", {"ground_truth": "2"}),
             sample("math", "Problem: Solve the equation $3x - 5 = 10$.", {"ground_truth": "5"}, sid="m1")]
    chat = sample("chat", [{"role": "user", "content": "What is the result of (1 + 2) * 4?"}], conversational=True)
    rollouts = [rollout(sky, " blue."), rollout(sun, " in the sky."),
                rollout(maths[0], r" The solution is \boxed{2}."), rollout(maths[1], r" The solution is \boxed{6}."),
                rollout(chat, "<think>The sum of 1 and 2 is 3, which we multiply by 4 to get 12.</think>"
                              "<answer>(1 + 2) * 4 = 12</answer>"),
                rollout(chat, "The sum of 3 and 1 is 4, which we multiply by 2 to get 8. So (3 + 1) * 2 = 8.")]
    specs = {"sky": RewardSpec("sky", ((f"{standard}:reward_len", 1.0), (f"{standard}:reward_func", 3.0),
                                       (f"{standard}:async_reward_func", 1.0))),
             "math": RewardSpec("math", ((f"{reference}:reward_func", 1.0),)),
             "chat": RewardSpec("chat", ((f"{conversational}:format_reward_func", 1.0),))}
    scored, metrics = score_rollouts(rollouts, specs, graders=preflight(specs, {
        "sky": [sky], "math": maths, "chat": [chat]}))
    # sky: " blue." has 6 characters, " in the sky." 12: (1·(-|20-6|) + 3·6 + 1·1) / 5 and (1·(-8) + 3·12 + 1) / 5.
    assert [s.reward for s in scored] == [pytest.approx(5 / 5), pytest.approx(29 / 5), 1.0, 0.0, 1.0, 0.0]
    # by TRL's function names, no path; two files' reward_func told apart (math's comes first, tasks sorted)
    assert scored[0].parts == {"reward_len": -14.0, "reward_func_2": 6.0, "async_reward_func": 1.0}
    assert metrics == {f"scoring/{t}/{m}": 0.0 for t in ("chat", "math", "sky") for m in ("failed", "fallback")}


@pytest.mark.slow  # importing TRL's trainer takes ~10 s on a loaded 2-core machine; the call itself is instant
def test_batched_functions_get_exactly_what_trl_passes():
    """The keyword arguments equal those of TRL's own GRPOTrainer._calculate_rewards on the same rows."""
    trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer")
    from types import SimpleNamespace

    def capture(seen):
        def reward(prompts, completions, completion_ids, **kwargs):
            seen.update(prompts=prompts, completions=completions, completion_ids=completion_ids, **kwargs)
            return [0.0] * len(prompts)
        return reward

    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    cases = {  # the dataset row as TRL holds it -> our Sample of that row
        False: ({"prompt": "2+2?", "ground_truth": "4", "task": "math"},
                sample("math", "2+2?", {"ground_truth": "4"})),
        True: ({"prompt": chat, "ground_truth": "4", "task": "math"},
               sample("math", chat, {"ground_truth": "4"}, conversational=True)),
    }
    for conversational, (row, ours) in cases.items():
        texts = ["4", "five"]
        trl_completions = [[{"role": "assistant", "content": t}] for t in texts] if conversational else texts
        theirs: dict = {}
        fake = SimpleNamespace(accelerator=SimpleNamespace(device="cpu", is_main_process=True),
                               reward_funcs=[capture(theirs)], reward_processing_classes=[None],
                               reward_func_names=["capture"], state=SimpleNamespace(global_step=0),
                               args=SimpleNamespace(report_to=[]), _log_completion_extra=None, _log_metric=None,
                               environments=None)
        trl_grpo.GRPOTrainer._calculate_rewards(fake, [row, row], [row["prompt"]] * 2, trl_completions,
                                                [[19], [20, 21]])
        for trl_only in ("trainer_state", "log_extra", "log_metric"):
            theirs.pop(trl_only)
        mine: dict = {}
        preflight({"math": RewardSpec("math", (("capture", 1.0),))}, {"math": [ours]},
                  callables={"capture": capture(mine)})
        assert trl_inputs([rollout(ours, "4", [19]), rollout(ours, "five", [20, 21])], conversational) == theirs


def test_a_reward_model_built_in_code_scores_a_batch_and_its_scores_reach_the_advantages(tmp_path):
    from transformers import LlamaForCausalLM, LlamaForSequenceClassification

    from grpo.models.modeling import build_tiny_tokenizer, tiny_model_config

    tok = build_tiny_tokenizer(["The sky is blue.", "Answer: 4", "What is 2+2?"], vocab_size=300)
    config = tiny_model_config(len(tok), hidden=32, layers=1, heads=2, kv_heads=1)
    config.num_labels, config.pad_token_id = 1, tok.pad_token_id
    torch.manual_seed(0)
    LlamaForSequenceClassification(config).save_pretrained(tmp_path / "rm")
    tok.save_pretrained(tmp_path / "rm")
    s = sample("t", "What is 2+2?")
    rollouts = [rollout(s, t) for t in ("Answer: 4", "Answer: 5 or maybe 4, it is hard to say", "4", "blue")]
    models = {"rm": RewardModelSpec(path=str(tmp_path / "rm"), batch_size=3),  # batches of 3 and 1: padding
              "rm_sigmoid": RewardModelSpec(path=str(tmp_path / "rm"), normalize="sigmoid", shift=0.1, scale=2.0),
              "rm_short": RewardModelSpec(path=str(tmp_path / "rm"), max_length=6)}
    specs = {"t": RewardSpec("t", (("rm", 1.0),)), "u": RewardSpec("u", (("rm_sigmoid", 1.0),)),
             "v": RewardSpec("v", (("rm_short", 1.0),))}
    graders = preflight(specs, {t: [s] for t in specs}, reward_models=models, device="cpu")
    # By hand: each completion alone, through the tokenizer's chat template, the score at its last token.
    reference = LlamaForSequenceClassification.from_pretrained(tmp_path / "rm").eval()

    def alone(text, keep=None):
        chat = tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"},
                                        {"role": "assistant", "content": text}], tokenize=False)
        ids = tok(chat, add_special_tokens=False)["input_ids"][-(keep or 10**6):]
        with torch.no_grad():
            return reference(input_ids=torch.tensor([ids])).logits[0, 0].item()

    raw = [alone(r.text) for r in rollouts]
    scored, _ = score_rollouts(rollouts, specs, graders=graders)
    assert [x.reward for x in scored] == pytest.approx(raw, abs=1e-5)
    assert len(set(raw)) == 4  # different texts, different scores: the test can tell them apart
    squashed, _ = score_rollouts([rollout(sample("u", "What is 2+2?"), r.text) for r in rollouts], specs,
                                 graders=graders)
    assert [x.reward for x in squashed] == pytest.approx([1 / (1 + math.exp(-(r - 0.1) / 2.0)) for r in raw],
                                                         abs=1e-5)
    cut, _ = score_rollouts([rollout(sample("v", "What is 2+2?"), r.text) for r in rollouts], specs, graders=graders)
    assert [x.reward for x in cut] == pytest.approx([alone(r.text, keep=6) for r in rollouts], abs=1e-5)
    # The rewards reach the advantages: one group of 4, (r - mean) / std.
    advantages_B, _ = group_advantages(torch.tensor([x.reward for x in scored]), 4)
    raw_B = torch.tensor(raw)
    assert torch.allclose(advantages_B, (raw_B - raw_B.mean()) / (raw_B.std() + 1e-6), atol=1e-4)  # eps 1e-6
    # A causal LM folder is not a reward model: its score head would be random.
    LlamaForCausalLM(tiny_model_config(len(tok), hidden=32, layers=1, heads=2, kv_heads=1)).save_pretrained(
        tmp_path / "lm")
    tok.save_pretrained(tmp_path / "lm")
    with pytest.raises(GraderError, match=r"grader '.*lm': reward model: .*lm has no trained weights for "
                                          r"\['score.weight'\]"):
        resolve_grader(str(tmp_path / "lm"))


def test_normalize_scores_by_hand():
    logits_BC = torch.tensor([[2.0, -1.0], [0.0, 0.0]])
    assert normalize_scores(logits_BC, "none").tolist() == [2.0, 0.0]
    assert normalize_scores(logits_BC, "affine", shift=1.0, scale=2.0).tolist() == [0.5, -0.5]
    # σ(0.5) = 0.6224593, σ(-0.5) = 0.3775407
    assert normalize_scores(logits_BC, "sigmoid", shift=1.0, scale=2.0).tolist() == pytest.approx(
        [0.6224593, 0.3775407], abs=1e-7)
    # softmax column 1: e^-1 / (e^2 + e^-1) = 1 / (e^3 + 1) = 0.0474259; equal logits: 0.5
    assert normalize_scores(logits_BC, "softmax", label=1).tolist() == pytest.approx([0.0474259, 0.5], abs=1e-7)
    with pytest.raises(ValueError, match=r"label=2 does not index the logits of shape \(2, 2\)"):
        normalize_scores(logits_BC, "none", label=2)
    with pytest.raises(ValueError, match=r"`reward_models.rm.scale` = 0.0 is invalid: use a number > 0"):
        RewardModelSpec(path="x", normalize="sigmoid", scale=0.0).validate("reward_models.rm")


def test_a_grader_loads_from_a_file_path_without_touching_sys_path(tmp_path):
    folder = tmp_path / "my project"
    folder.mkdir()
    path = write(folder / "rewards.py", '''
        from dataclasses import dataclass

        @dataclass
        class Rubric:  # a dataclass needs its module in sys.modules while the file runs
            word: str

        def says_blue(completion, gold):
            return float(Rubric(gold["word"]).word in completion)
    ''')
    before = list(sys.path)
    grader = resolve_grader(f"{path}:says_blue")
    assert sys.path == before and grader.kind == "row"
    assert grader.fn.__module__.startswith(FILE_MODULE_PREFIX + "rewards_")  # cannot shadow another `rewards`
    assert resolve_grader(f"{path}:says_blue").fn is grader.fn  # imported once
    s = sample(gold={"word": "blue"})
    assert grader.grade([rollout(s, "blue"), rollout(s, "red")]) == [1.0, 0.0]
    write(folder / "broken.py", "import no_such_module_here\n")
    with pytest.raises(GraderError, match=r"grader '.*broken.py:f': importing .*broken.py raised "
                                          r"ModuleNotFoundError: No module named 'no_such_module_here'"):
        resolve_grader(f"{folder / 'broken.py'}:f")
    with pytest.raises(GraderError, match=r"file .*nope.py not found"):
        resolve_grader(f"{folder / 'nope.py'}:f")


def test_resolve_grader_by_name_module_path_and_errors():
    assert set(GRADERS) >= {"bbq_rule", "halueval_rule", "format"}
    assert resolve_grader("format").fn is format_reward and resolve_grader("format").bounds == (0.0, 1.0)
    assert resolve_grader("grpo.core.rule_graders:token_f1").fn is token_f1
    with pytest.raises(GraderError, match="grader 'nope': not a known grader: use a built-in"):
        resolve_grader("nope")
    with pytest.raises(GraderError, match=r"cannot import module 'no_such_pkg.mod'.*give a file path"):
        resolve_grader("no_such_pkg.mod:f")
    with pytest.raises(GraderError, match="has no callable 'missing'"):
        resolve_grader("grpo.core.rule_graders:missing")


def test_a_misspelt_reward_function_name_gets_a_did_you_mean(tmp_path):
    """A reward term naming a function its module lacks (a file path, a module path, TRL's import path), or a name
    that is no grader, gets the closest function or grader (a misspelt flag got one; a misspelt function did not)."""
    path = write(tmp_path / "rewards.py", '''
        import math
        from os.path import join

        def reward_len(completions, **kwargs):
            return [-abs(20 - len(c)) for c in completions]
        ''')
    with pytest.raises(GraderError, match=r"has no callable 'reward_lenn' \(did you mean `reward_len`\?\)"):
        resolve_grader(f"{path}:reward_lenn")
    with pytest.raises(GraderError, match=r"has no callable 'token_f2' \(did you mean `token_f1`\?\)"):
        resolve_grader("grpo.core.rule_graders:token_f2")
    with pytest.raises(GraderError) as err:  # what the module imports is not offered: `join` is os.path's
        resolve_grader(f"{path}:joinn")
    assert "did you mean" not in str(err.value)
    with pytest.raises(GraderError, match=r"grader 'bbq_rul': not a known grader \(did you mean `bbq_rule`\?\)"):
        resolve_grader("bbq_rul")
    with pytest.raises(GraderError, match=r"did you mean `my_reward`\?"):
        resolve_grader("my_rewrd", callables={"my_reward": lambda completion, gold: 1.0})
    assert set(builtin_graders()) == set(GRADERS) | {"llm_judge"} and all(builtin_graders().values())


def test_a_broken_grader_fails_the_preflight_naming_the_task_and_the_grader(tmp_path):
    path = write(tmp_path / "bad.py", '''
        def raises(completion, gold):
            return 1.0 / 0.0

        def nan(completion, gold):
            return float("nan")

        def text(completion, gold):
            return "high"

        def short(completions, **kwargs):
            return [1.0]

        def scalar(completions, **kwargs):
            return 0.5

        def trl_docs_example_1(completions_ids, **kwargs):
            return [float(len(ids)) for ids in completions_ids]

        def three(a, b, c):
            return 0.0

        def fine(completions, **kwargs):
            return [-0.5 for _ in completions]
    ''')
    specs = {"qa": RewardSpec("qa", ((f"{path}:raises", 1.0), ("format", 1.0), (f"{path}:nan", 1.0))),
             "chat": RewardSpec("chat", ((f"{path}:text", 1.0), (f"{path}:short", 1.0), (f"{path}:scalar", 1.0),
                                         (f"{path}:trl_docs_example_1", 1.0), (f"{path}:three", 1.0),
                                         ("no_such.module:f", 1.0), ("llm_judge", 1.0))),
             "ok": RewardSpec("ok", ((f"{path}:fine", 1.0),)),
             "typo": RewardSpec("typo", (("format", 1.0),))}
    rows = {"qa": [sample("qa", gold={"format": "answer"}, target="Answer: blue", sid="q7")],
            "chat": [sample("chat", target="hi", sid="c1")], "ok": [sample("ok")]}
    with pytest.raises(GraderError) as caught:
        preflight(specs, rows)
    lines = str(caught.value).splitlines()
    assert lines[0] == "reward preflight failed (nothing was trained):"
    expected = [
        rf"task 'chat', grader '{path}:three': its signature \(a, b, c\) fits neither",
        r"task 'chat', grader 'no_such.module:f': cannot import module 'no_such.module'",
        rf"task 'qa', grader '{path}:raises' on row 'q7': raised ZeroDivisionError: float division by zero",
        rf"task 'qa', grader '{path}:nan' on row 'q7': it returned nan; return a finite float, or None",
        rf"task 'chat', grader '{path}:text' on row 'c1': it returned 'high' \(str\); return a float",
        rf"task 'chat', grader '{path}:short' on row 'c1': it returned 1 values for 2 completions",
        rf"task 'chat', grader '{path}:scalar' on row 'c1': it returned a float for 2 completions",
        rf"task 'chat', grader '{path}:trl_docs_example_1' on row 'c1': it needs argument\(s\) \['completions_ids'\] "
        r"that are not passed \(completions_ids: nothing: TRL passes `completion_ids`",
        r"task 'chat', grader 'llm_judge': no judge is configured \(set judge.base_url\)",
        r"task 'typo': no rows to try its graders on \(is the task name right\?\)",
    ]
    for pattern in expected:
        assert sum(bool(__import__("re").match(r"  - " + pattern, line)) for line in lines) == 1, pattern
    assert len(lines) == 1 + len(expected)  # format and fine are not reported
    good = preflight({"ok": specs["ok"]}, rows)
    assert good[f"{path}:fine"].grade([rollout(rows["ok"][0], "x")]) == [-0.5]  # any finite float is a reward


def test_values_are_checked_when_scoring_and_failures_name_task_and_grader():
    calls = []

    def sometimes(completion, gold):
        calls.append(completion)
        return None if completion == "?" else -3.5  # None: cannot grade; negative rewards are fine

    def explodes(completions, **kwargs):
        raise RuntimeError("grader service down")

    s = sample("t", gold={"format": "answer"})
    specs = {"t": RewardSpec("t", (("mine", 1.0), ("format", 3.0)))}
    graders = resolve_graders(specs, callables={"mine": sometimes})
    scored, metrics = score_rollouts([rollout(s, "Answer: x"), rollout(s, "?")], specs, graders=graders)
    assert [x.reward for x in scored] == [(-3.5 + 3 * 1.0) / 4, None] and metrics["scoring/t/failed"] == 1.0
    assert calls == ["Answer: x", "?"]
    with pytest.raises(GraderError, match=r"task 't', grader 'boom' raised RuntimeError: grader service down"):
        score_rollouts([rollout(s, "x")], {"t": RewardSpec("t", (("boom", 1.0),))},
                       graders=resolve_graders({"t": RewardSpec("t", (("boom", 1.0),))}, callables={"boom": explodes}))
    out_of_range = resolve_graders(specs, callables={"mine": sometimes})
    out_of_range["format"] = out_of_range["format"].__class__("format", "rule", lambda c, g: 1.5, (0.0, 1.0))
    with pytest.raises(GraderError,
                       match=r"task 't', grader 'format': it returned 1.5, outside its range \[0.0, 1.0\]"):
        score_rollouts([rollout(s, "x")], specs, graders=out_of_range)


def test_a_weight_that_is_no_number_is_named_as_such_not_as_a_missing_file(tmp_path):
    """parse_reward_spec keeps 'file.py:fn:abc' whole (abc is no weight); it read as the file 'file.py:fn', not
    found, or the module 'format', not importable. The message names the weight."""
    path = write(tmp_path / "rewards.py", '''
        def fine(completion, gold):
            return 1.0
    ''')
    with pytest.raises(GraderError, match=rf"grader '{path}:fine:abc': 'abc' is not a number: a reward term is "
                                          rf"grader:weight, e.g. '{path}:fine:1.0'"):
        resolve_grader(f"{path}:fine:abc")
    with pytest.raises(GraderError, match=r"grader 'format:high': 'high' is not a number.* e.g. 'format:1.0'"):
        resolve_grader("format:high")
    with pytest.raises(GraderError, match=r"'x' is not a number.* e.g. 'grpo.core.rule_graders:token_f1:1.0'"):
        resolve_grader("grpo.core.rule_graders:token_f1:x")
    with pytest.raises(GraderError, match=r"file .*nope.py not found"):  # a missing file is still named
        resolve_grader(f"{tmp_path / 'nope.py'}:fine")
    assert resolve_grader(f"{path}:fine").kind == "row"


def test_a_rewards_entry_for_no_task_of_the_run_is_an_error_naming_it():
    """rewards.<task> with a misspelt task: the task it meant would train on its defaults while the entry is ignored;
    the entries presets carry for the built-in tasks may stay in a run of your own tasks."""
    from grpo import config as C
    from grpo.run.assembly.reward_setup import reward_specs

    with pytest.raises(C.ConfigError, match=r"config field `rewards.reveiws` names no task of this run \(its tasks: "
                                            r"reviews\)") as err:
        reward_specs("none", {"reveiws": "format:1.0", "reviews": "format:1.0"}, ["reviews"], custom=["reviews"])
    assert err.value.field == "rewards.reveiws"
    specs = reward_specs("none", {"fairness": "bbq_rule:1.0", "reviews": "format:1.0"}, ["reviews"], custom=["reviews"])
    assert list(specs) == ["reviews"]


def test_a_kl_entry_for_no_task_of_the_run_is_an_error_naming_it():
    """kl.fairnes.beta=0.5 is an error naming the entry: ignored, a misspelt entry leaves fairness training on
    kl.default."""
    from grpo import config as C
    from grpo.run.assembly.reward_setup import check_task_entries

    with pytest.raises(C.ConfigError, match=r"config field `kl.fairnes` names no task of this run \(its tasks: "
                                            r"fairness, hallucination\)") as err:
        check_task_entries(["default", "fairnes"], ["fairness", "hallucination"])
    assert err.value.field == "kl.fairnes"
    check_task_entries(["default", "fairness", "hallucination"], ["reviews"])  # presets' entries for built-in tasks
    check_task_entries(["default", "reviews"], ["reviews"])


def test_log_extra_fills_one_column_per_completion_and_drops_the_preflights_values():
    """`log_extra` puts value i into row i; without rows (the preflight's calls, extra=None) it drops the values
    instead of pairing them with nothing."""
    rows: list[dict] = [{}, {}]
    extra_logger(rows, "f")("length", [3, 5])
    assert rows == [{"length": 3}, {"length": 5}]
    extra_logger(None, "f")("length", [3, 5])  # no rows to fill, and no error
    with pytest.raises(GraderError, match=r"got 1 values for 2 completions"):
        extra_logger(rows, "f")("length", [3])
