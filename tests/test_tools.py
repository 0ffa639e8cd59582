"""Tools, the pure parts and the runner: tool-call parsing (one call, several, malformed JSON, an unknown tool),
schemas from a function's signature and docstring, the runner's timeout / exception / result budget, the trajectory
record and its model-token mask, the tool metrics, and the tool message's token ids against TRL 1.16's own method."""

from __future__ import annotations

import json
import time
import types

import pytest

from grpo.config import ConfigError, RolloutConfig
from grpo.core.tool_calls import (
    CALL_CLOSE,
    CALL_OPEN,
    ToolCall,
    ToolUse,
    Trajectory,
    parse_tool_calls,
    tool_instructions,
    tool_metrics,
)
from grpo.models.modeling import build_tiny_tokenizer
from grpo.phases.tools import (
    CUT_MARK,
    INVALID_TOOL,
    ToolBox,
    ToolError,
    build_toolbox,
    call_with_timeout,
    resolve_tools,
    result_text,
    tool_schema,
    tool_specs,
    tool_suffix_ids,
)
from tests.trainer_helpers import call_text

KNOWN = {"calculator", "lookup"}


def calculator(expression: str) -> str:
    """Evaluate a product of two integers.

    Args:
        expression: Two integers joined by '*', e.g. "123*456".
    """
    a, b = expression.split("*")
    return str(int(a) * int(b))


def sleepy(seconds: float) -> str:
    """Sleep, then answer.

    Args:
        seconds: How long to sleep.
    """
    time.sleep(seconds)
    return "awake"


def broken(x: int) -> int:
    """Always raises.

    Args:
        x: Anything.
    """
    return x // 0


def records(n: int) -> list:
    """A long result.

    Args:
        n: How many records.
    """
    return [{"id": i, "text": "a fairly long record"} for i in range(n)]


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer(["the product is 56088", call_text("calculator", {"expression": "123*456"})],
                                vocab_size=300)


# ----------------------------------------------------------------------------------------------------------- parsing
def test_one_call_is_parsed_with_its_arguments():
    text = f'Let me compute. {CALL_OPEN}{{"name": "calculator", "arguments": {{"expression": "12*34"}}}}{CALL_CLOSE}'
    assert parse_tool_calls(text, KNOWN) == [ToolCall("calculator", {"expression": "12*34"})]
    assert parse_tool_calls(call_text("calculator", {"expression": "1*2"}), KNOWN) == [
        ToolCall("calculator", {"expression": "1*2"})]
    # whitespace and newlines inside the block (Qwen's template writes them), arguments given as a JSON string
    text = f'{CALL_OPEN}\n{{"name": "lookup", "arguments": "{{\\"key\\": \\"x\\"}}"}}\n{CALL_CLOSE}'
    assert parse_tool_calls(text, KNOWN) == [ToolCall("lookup", {"key": "x"})]


def test_several_calls_are_parsed_in_order():
    text = (call_text("lookup", {"key": "a"}) + " and " + call_text("calculator", {"expression": "2*3"}) + "\n"
            + call_text("lookup", {"key": "b"}))
    assert [(c.name, c.arguments) for c in parse_tool_calls(text, KNOWN)] == [
        ("lookup", {"key": "a"}), ("calculator", {"expression": "2*3"}), ("lookup", {"key": "b"})]


def test_a_reply_without_a_call_is_an_answer():
    assert parse_tool_calls("The product is 56088.", KNOWN) == []
    assert parse_tool_calls("", KNOWN) == []


@pytest.mark.parametrize("body,name,error", [
    ('{"name": "calculator", "arguments": {"expression": "1*2"}', "", "not valid JSON"),  # a brace missing
    ("calculator(1*2)", "", "not valid JSON"),
    ('{"arguments": {"expression": "1*2"}}', "", 'no "name"'),
    ('["calculator"]', "", 'no "name"'),
    ('{"name": "calculator", "arguments": [1, 2]}', "calculator", "must be a JSON object"),
    ('{"name": "rm_rf", "arguments": {}}', "rm_rf", "unknown tool 'rm_rf'; the tools are: calculator, lookup"),
])
def test_a_malformed_call_or_an_unknown_tool_is_an_error_for_the_model(body, name, error):
    [call] = parse_tool_calls(f"{CALL_OPEN}{body}{CALL_CLOSE}", KNOWN)
    assert call.name == name and call.error is not None and error in call.error


def test_a_call_left_open_is_malformed_not_an_answer():
    calls = parse_tool_calls(call_text("lookup", {"key": "a"}) + f' {CALL_OPEN}{{"name": "calc', KNOWN)
    assert calls[0] == ToolCall("lookup", {"key": "a"})
    assert calls[1].error is not None and "not closed" in calls[1].error


# ----------------------------------------------------------------------------------------------------------- schemas
def test_the_schema_is_transformers_get_json_schema_of_the_function():
    from transformers.utils import get_json_schema

    schema = tool_schema(calculator)
    assert schema == get_json_schema(calculator)
    assert schema["function"]["name"] == "calculator"
    assert schema["function"]["parameters"]["properties"]["expression"]["type"] == "string"
    assert schema["function"]["parameters"]["required"] == ["expression"]
    assert "calculator" in tool_instructions([schema]) and CALL_OPEN in tool_instructions([schema])


def test_a_function_without_a_docstring_is_refused_with_the_fix():
    def bare(x: int) -> int:
        return x

    with pytest.raises(ToolError, match="docstring"):
        tool_schema(bare)


def test_tools_and_environment_factories_are_named_by_one_rule():
    """train(tools=...) and train(environment_factory=...) name what they are handed alike: a string as it is, an
    importable function or class as "module:name", anything else by its name (or the fallback) with itself handed in."""
    from grpo.phases.environments import factory_spec

    def local(expression: str) -> str:
        return expression

    class Nameless:
        def __call__(self):
            return None

    nameless = Nameless()
    assert tool_specs(["pkg.mod:fn", calculator, local, nameless]) == (
        ["pkg.mod:fn", f"{__name__}:calculator", "local", "tool_3"], {"local": local, "tool_3": nameless})
    assert factory_spec("pkg.mod:Env") == ("pkg.mod:Env", {})
    assert factory_spec(calculator) == (f"{__name__}:calculator", {})
    assert factory_spec(local) == ("local", {"local": local})
    assert factory_spec(nameless) == ("Nameless", {"Nameless": nameless})


def test_tools_resolve_from_module_and_file_specs_and_bad_specs_name_the_field(tmp_path):
    [tool] = resolve_tools(["tests.test_tools:calculator"])
    assert tool.name == "calculator" and tool.fn(expression="2*3") == "6"
    path = tmp_path / "my_tools.py"
    path.write_text('def add(a: int, b: int) -> int:\n    """Add.\n\n    Args:\n        a: One.\n        b: Two.\n'
                    '    """\n    return a + b\n')
    [tool] = resolve_tools([f"{path}:add"])
    assert tool.fn(a=2, b=3) == 5
    [tool] = resolve_tools(["calc"], callables={"calc": calculator})  # train(tools=[fn]) enters them by name
    assert tool.name == "calculator"
    for bad, why in [("tests.test_tools:nothing", "no callable"), ("no_colon", "package.module:function"),
                     (f"{tmp_path}/absent.py:f", "not found")]:
        with pytest.raises(ConfigError, match=why) as err:
            resolve_tools([bad])
        assert err.value.field == "rollout.tools"
    with pytest.raises(ConfigError, match="two tools are named 'calculator'"):
        resolve_tools([calculator, "tests.test_tools:calculator"])


def test_the_config_refuses_bad_tool_settings():
    assert RolloutConfig(tools=["a:b", "c:d"]).tools == ["a:b", "c:d"]
    for kwargs, name in [({"tools": ["a:b", "a:b"]}, "rollout.tools"), ({"tools": [""]}, "rollout.tools"),
                         ({"max_tool_turns": 0}, "rollout.max_tool_turns"),
                         ({"tool_timeout_s": -1.0}, "rollout.tool_timeout_s"),
                         ({"max_tool_result_tokens": 0}, "rollout.max_tool_result_tokens"),
                         ({"max_new_tokens": 16, "max_trajectory_tokens": 8}, "rollout.max_trajectory_tokens")]:
        with pytest.raises(ConfigError) as err:
            RolloutConfig(**kwargs)
        assert err.value.field == name


# ------------------------------------------------------------------------------------------------------------ runner
def test_a_tool_that_overruns_its_timeout_is_an_error_not_a_hang():
    start = time.perf_counter()
    value, error = call_with_timeout(sleepy, {"seconds": 5.0}, 0.2)
    assert value is None and error == "timed out after 0.2 s"
    assert time.perf_counter() - start < 2.0
    assert call_with_timeout(sleepy, {"seconds": 0.0}, 5.0) == ("awake", None)


def test_a_raising_tool_or_bad_arguments_are_errors_not_crashes():
    assert call_with_timeout(broken, {"x": 1}, 5.0) == (None, "raised ZeroDivisionError: integer division or modulo "
                                                              "by zero")
    value, error = call_with_timeout(calculator, {"expr": "1*2"}, 5.0)  # a wrong argument name
    assert value is None and error.startswith("raised TypeError")

    async def later(x: int) -> int:
        """Async.

        Args:
            x: A number.
        """
        return x + 1

    assert call_with_timeout(later, {"x": 1}, 5.0) == (2, None)


def test_the_toolbox_answers_every_call_and_counts_failures(tok):
    box = ToolBox(resolve_tools([calculator, broken, sleepy, records]), timeout_s=0.2, max_result_tokens=64)
    assert box.run(tok, ToolCall("calculator", {"expression": "123*456"})) == ("calculator", "56088", False)
    name, content, failed = box.run(tok, ToolCall("broken", {"x": 1}))
    assert (name, failed) == ("broken", True) and content.startswith("error: broken raised ZeroDivisionError")
    name, content, failed = box.run(tok, ToolCall("sleepy", {"seconds": 3.0}))
    assert (name, failed) == ("sleepy", True) and "timed out after 0.2 s" in content
    [bad] = parse_tool_calls(call_text("os.system", {"command": "touch x"}), box.names)
    name, content, failed = box.run(tok, bad)  # a name the model made up is never looked up anywhere
    assert (name, failed) == (INVALID_TOOL, True) and "unknown tool 'os.system'" in content
    # a long result is cut to the token budget and says so; a non-string result is JSON, never evaluated
    name, content, failed = box.run(tok, ToolCall("records", {"n": 50}))
    assert not failed and content.endswith(CUT_MARK)
    assert len(tok(content[:-len(CUT_MARK)], add_special_tokens=False)["input_ids"]) <= 64
    assert json.dumps(records(50)).startswith(content[:-len(CUT_MARK)])
    assert result_text({"a": [1, 2]}) == '{"a": [1, 2]}' and result_text("__import__('os')") == "__import__('os')"


def test_a_template_without_a_tool_role_is_refused_before_any_rollout(tok):
    plain = build_tiny_tokenizer(["x"], vocab_size=300)
    plain.chat_template = ("{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tools') }}"
                           "{% endif %}{{ m['content'] }}<|end|>{% endfor %}")
    with pytest.raises(ToolError, match="cannot render a tool message"):
        build_toolbox(RolloutConfig(tools=["tests.test_tools:calculator"]), plain)
    assert build_toolbox(RolloutConfig(), tok) is None  # no tools: single-turn rollouts, nothing is built
    box = build_toolbox(RolloutConfig(tools=["tests.test_tools:calculator"]), tok)
    assert box.names == ["calculator"] and not box.native  # the tiny template shows no tools: the system turn does
    ids = box.encode_prompt(tok, [{"role": "user", "content": "123*456?"}])
    assert tok.decode(ids).startswith("<|system|>You can call these tools:") and "calculator" in tok.decode(ids)


# -------------------------------------------------------------------------------------------------- trajectory record
def test_the_model_mask_marks_exactly_the_models_own_tokens():
    t = Trajectory()
    t.add_reply([5, 6, 7], "call", [ToolCall("calculator", {"expression": "1*2"})])
    t.add_tool_messages([8, 9], [("calculator", "2", False)])
    t.add_reply([10, 11], "2", [])
    assert t.ids == [5, 6, 7, 8, 9, 10, 11] and t.model_mask == [1, 1, 1, 0, 0, 1, 1]
    assert [m["role"] for m in t.messages] == ["assistant", "tool", "assistant"]
    assert t.messages[0]["tool_calls"] == [{"type": "function", "function": {"name": "calculator",
                                                                             "arguments": {"expression": "1*2"}}}]
    assert t.use() == ToolUse(calls=(("calculator", 1),), failures=(("calculator", 0),), turns=2)


def test_tool_metrics_by_hand():
    uses = [ToolUse(calls=(("calculator", 2),), failures=(("calculator", 1),), turns=3),
            ToolUse(calls=(("calculator", 1), (INVALID_TOOL, 1)), failures=((INVALID_TOOL, 1),), turns=2,
                    cut_by_limit=True, unrun=1),
            ToolUse(turns=1), ToolUse(turns=1)]
    m = tool_metrics(uses, ["calculator", "lookup"])
    assert m["tools/calls_per_rollout"] == 4 / 4 and m["tools/failure_rate"] == 2 / 4
    assert m["tools/turns"] == 7 / 4 and m["tools/cut_by_limit"] == 1 / 4 and m["tools/unrun_per_rollout"] == 1 / 4
    assert m["tools/calculator/calls_per_rollout"] == 3 / 4 and m["tools/calculator/failure_rate"] == 1 / 3
    assert m["tools/lookup/calls_per_rollout"] == 0.0 and m["tools/lookup/failure_rate"] == 0.0  # logged uncalled
    assert m["tools/invalid/calls_per_rollout"] == 1 / 4 and m["tools/invalid/failure_rate"] == 1.0


# ------------------------------------------------------------------------------------------------------- TRL parity
def test_the_tool_message_ids_are_trls_on_the_same_template(tok):
    """TRL 1.16 `GRPOTrainer._get_tool_suffix_ids`, called on a stand-in trainer holding only what it reads."""
    trl = pytest.importorskip("trl.trainer.grpo_trainer")
    trainer = types.SimpleNamespace(processing_class=tok, _tokenizer=tok, chat_template=None, chat_template_kwargs={},
                                    _is_vlm=False)
    for messages in ([{"role": "tool", "name": "calculator", "content": "56088"}],
                     [{"role": "tool", "name": "calculator", "content": "6"},
                      {"role": "tool", "name": "lookup", "content": "error: unknown key"}]):
        ours = tool_suffix_ids(tok, messages)
        assert ours == trl.GRPOTrainer._get_tool_suffix_ids(trainer, messages)
        assert tok.decode(ours).endswith("<|end|><|assistant|>") and messages[-1]["content"] in tok.decode(ours)
