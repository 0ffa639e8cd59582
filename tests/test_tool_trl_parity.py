"""TRL 1.16's max_tool_calling_iterations means what rollout.max_tool_turns means: the same number of tool rounds run
and replies sampled for a model that calls on every reply, counted in TRL's own GRPOTrainer._tool_call_loop and in
grpo-dual's tool_rollouts; max_completion_length bounds a trajectory as TRL's does."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from grpo.config import ConfigError, RolloutConfig
from grpo.core.step_types import Sample
from grpo.core.tool_calls import tool_metrics
from grpo.models.modeling import build_tiny_model, build_tiny_tokenizer
from grpo.phases import tools as T
from grpo.phases.generate import GREEDY
from grpo.run.trl.log_keys import tool_frequencies
from grpo.run.trl.translation import translate
from tests.trainer_helpers import call_text

trl = pytest.importorskip("trl")
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

RUNS: list[str] = []


def ping(x: int) -> str:
    """Answer pong.

    Args:
        x: Anything.
    """
    RUNS.append("ping")
    return "pong"


CALL = {"type": "function", "function": {"name": "ping", "arguments": {"x": 1}}}


def trl_rounds(iterations: int | None, cap: int = 50) -> tuple[int, int, float]:
    """(tool runs, replies, tools/call_frequency) of TRL's own loop for one trajectory whose every reply calls ping;
    `cap`: replies after which the stub model stops calling (TRL's unlimited loop needs an end)."""
    from trl.trainer import grpo_trainer

    replies = [1]  # the first reply, sampled before the loop

    def generate(ids, images, fields, num_generations, has_tool_images):
        replies.append(1)
        return [[7] for _ in ids], None

    def parse(tokenizer, ids, prefix=None, tools=None):
        return {"role": "assistant", "content": "", **({"tool_calls": [CALL]} if len(replies) < cap else {})}

    config = trl.GRPOConfig(output_dir="/tmp/unused", max_tool_calling_iterations=iterations, use_cpu=True)
    stub = SimpleNamespace(  # what GRPOTrainer.__init__ sets from the config (None: sys.maxsize)
        max_tool_calling_iterations=(config.max_tool_calling_iterations
                                     if config.max_tool_calling_iterations is not None else sys.maxsize),
        _sync_tool_dicts=[{"ping": ping}], _async_tool_dicts=[{}], _get_tool_suffix_ids=lambda msgs: [9, 9],
        use_vllm=False, model=SimpleNamespace(config=SimpleNamespace(max_position_embeddings=10**6)), _is_vlm=False,
        max_completion_length=10**6, tools=[ping], environment_factories=None, _tokenizer=None,
        _generate_single_turn=generate)
    RUNS.clear()
    original = grpo_trainer.parse_response
    grpo_trainer.parse_response = parse
    try:
        counted = grpo_trainer.GRPOTrainer._tool_call_loop(
            stub, prompts=[[{"role": "user", "content": "go"}]], prompt_ids=[[1, 2]], completion_ids=[[7]],
            completions=[[{"role": "assistant", "content": "", "tool_calls": [CALL]}]], logprobs=None, images=None,
            multimodal_fields=None)
    finally:
        grpo_trainer.parse_response = original
    return len(RUNS), len(replies), counted[4] / 1  # TRL's tool_call_count over its one completion


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer(["pong", call_text("ping", {"x": 1})], vocab_size=300)


@pytest.fixture(scope="module")
def model(tok):
    return build_tiny_model(tok, seed=1, hidden=32, layers=1, heads=2, kv_heads=1)


def our_rounds(tok, model, monkeypatch, max_tool_turns: int, cap: int = 50) -> tuple[int, int, float]:
    """(tool runs, replies, TRL's tools/call_frequency) of grpo-dual's tool_rollouts, as trl_rounds."""
    call = tok(call_text("ping", {"x": 1}), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    answer = tok("pong", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    replies = []

    def fake(model, rows, rollout, stop_ids, pad_id, *, greedy, row_keys=None, synced_gpus=False):
        replies.append(1)
        return [call if len(replies) < cap else answer for _ in rows], 0

    monkeypatch.setattr(T, "decoder", lambda *a, **k: fake)
    box = T.ToolBox(T.resolve_tools([ping]), timeout_s=5.0, max_result_tokens=16)
    RUNS.clear()
    out = T.tool_rollouts(model, tok, [Sample(task="t", id="0", messages=({"role": "user", "content": "go"},))],
                          RolloutConfig(max_new_tokens=64, max_tool_turns=max_tool_turns), tools=box, plan=GREEDY)
    frequency = tool_frequencies(tool_metrics([r.tool_use for r in out[0]]))["tools/call_frequency"]
    return len(RUNS), len(replies), frequency


@pytest.mark.parametrize("iterations", [1, 2, 3])
def test_max_tool_calling_iterations_runs_as_many_rounds_as_trls_loop(iterations, tok, model, monkeypatch):
    ours = translate({"max_tool_calling_iterations": iterations}).tree["rollout"]["max_tool_turns"]
    rounds = (iterations, iterations + 1, iterations)  # the last reply's call is not run, nor counted by TRL
    assert our_rounds(tok, model, monkeypatch, ours) == trl_rounds(iterations) == rounds


def test_unset_max_tool_calling_iterations_leaves_the_budget_to_end_the_trajectory(tok, model, monkeypatch):
    tree = translate({"max_completion_length": 40}).tree["rollout"]
    assert tree["max_trajectory_tokens"] == tree["max_new_tokens"] == 40  # TRL's budget of the whole trajectory
    assert tree["max_tool_turns"] == 40  # each round takes >= 1 token of it: the budget binds first
    assert our_rounds(tok, model, monkeypatch, tree["max_tool_turns"], cap=6) == trl_rounds(None, cap=6) == (5, 6, 5)
    with pytest.raises(ConfigError, match="max_tool_calling_iterations") as err:
        translate({"max_tool_calling_iterations": 0})
    assert err.value.field == "max_tool_calling_iterations"
