"""Native tool-call formats: a chat template that renders tools describes them itself (no grpo-dual instructions in the
prompt) and its own call format is what replies are read in: Hermes / Qwen2.5's `<tool_call>` blocks, Llama 3.1's bare
JSON with "parameters", Mistral's `[TOOL_CALLS][...]`. Templates written here in jinja, on the tiny tokenizer (no
downloads); a template that renders no tools keeps the documented default (issue #41)."""

from __future__ import annotations

import pytest

from grpo.config.settings import RolloutConfig
from grpo.core.records import Sample
from grpo.core.tool_calls import DEFAULT_FORMAT, CallFormat, parse_tool_calls
from grpo.models.modeling import build_tiny_model, build_tiny_tokenizer
from grpo.phases import tools as T

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

TURNS = ("{% for m in messages %}"
         "{% if m['role'] == 'assistant' %}<|assistant|>{{ m['content'] }}"
         "{% for c in m.get('tool_calls', []) %}CALL{% endfor %}<|end|>"
         "{% elif m['role'] == 'tool' %}<|user|>RESULT<|end|>"
         "{% else %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endif %}{% endfor %}"
         "{% if add_generation_prompt %}<|assistant|>{% endif %}")
HERMES = ("{% if tools %}<|system|>You may call functions.<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}"
          "</tools><|end|>{% endif %}" + TURNS
          .replace("CALL", "<tool_call>\n{{ {'name': c['function']['name'], 'arguments': c['function']['arguments']}"
                           " | tojson }}\n</tool_call>")
          .replace("RESULT", "<tool_response>\n{{ m['content'] }}\n</tool_response>"))
LLAMA = ("{% if tools %}<|system|>Functions: {% for t in tools %}{{ t | tojson }}{% endfor %} Reply with JSON "
         "{\"name\": function name, \"parameters\": arguments}.<|end|>{% endif %}" + TURNS
         .replace("CALL", "{{ '{\"name\": \"' + c['function']['name'] + '\", \"parameters\": ' }}"
                          "{{ c['function']['arguments'] | tojson }}}")
         .replace("RESULT", "ipython: {{ m['content'] }}"))
MISTRAL = (TURNS.replace("{% for c in m.get('tool_calls', []) %}CALL{% endfor %}",
                         "{% if m.get('tool_calls') %}[TOOL_CALLS]{{ m['tool_calls'] | map(attribute='function') "
                         "| list | tojson }}{% endif %}")
           .replace("RESULT", "[TOOL_RESULTS]{{ m['content'] }}[/TOOL_RESULTS]")
           .replace("{% for m in messages %}", "{% if tools %}<|system|>[AVAILABLE_TOOLS]{{ tools | tojson }}"
                                               "[/AVAILABLE_TOOLS]<|end|>{% endif %}{% for m in messages %}"))


def calculator(expression: str) -> str:
    """Multiply two integers.

    Args:
        expression: Two integers joined by '*', e.g. "12*3".
    """
    a, b = expression.split("*")
    return str(int(a) * int(b))


def tokenizer(template: str | None):
    tok = build_tiny_tokenizer(["the answer is 36", '{"name": "calculator", "parameters": {"expression": "12*3"}}'],
                               vocab_size=320)
    if template is not None:
        tok.chat_template = template
    return tok


@pytest.mark.parametrize("template,want", [
    (HERMES, CallFormat("<tool_call>", "</tool_call>")),
    (LLAMA, CallFormat("", "")),
    (MISTRAL, CallFormat("[TOOL_CALLS]", "")),
])
def test_the_call_format_is_read_from_a_template_that_renders_tools(template, want):
    tok = tokenizer(template)
    box = T.build_toolbox(RolloutConfig(tools=["tests.test_tool_formats:calculator"]), tok)
    assert box.native and box.call_format == want and box.system_prompt is None
    prompt = tok.decode(box.encode_prompt(tok, [{"role": "user", "content": "What is 12*3?"}]))
    assert '"name": "calculator"' in prompt  # the template's own description of the tool
    assert T.tool_instructions(box.schemas) not in prompt and "You can call these tools" not in prompt


def test_a_template_that_renders_no_tools_keeps_the_documented_default():
    tok = tokenizer(None)  # the tiny template: no tools
    box = T.build_toolbox(RolloutConfig(tools=["tests.test_tool_formats:calculator"]), tok)
    assert not box.native and box.call_format == DEFAULT_FORMAT
    assert "You can call these tools" in tok.decode(box.encode_prompt(tok, [{"role": "user", "content": "hi"}]))


@pytest.mark.parametrize("fmt,reply,calls", [
    (CallFormat("", ""), '{"name": "calculator", "parameters": {"expression": "1*2"}}', [("calculator", "1*2")]),
    (CallFormat("", ""), ' [{"name": "calculator", "arguments": {"expression": "3*4"}}] ', [("calculator", "3*4")]),
    (CallFormat("", ""), 'The answer is {"value": 2}', []),
    (CallFormat("", ""), '{"value": 2}', []),  # JSON without a "name" is an answer, not a call
    (CallFormat("[TOOL_CALLS]", ""), 'ok [TOOL_CALLS][{"name": "calculator", "arguments": {"expression": "5*6"}}, '
                                     '{"name": "calculator", "arguments": {"expression": "7*8"}}]',
     [("calculator", "5*6"), ("calculator", "7*8")]),
    (DEFAULT_FORMAT, '{"name": "calculator", "parameters": {"expression": "1*2"}}', []),
])
def test_each_format_parses_its_own_calls(fmt, reply, calls):
    got = parse_tool_calls(reply, ["calculator"], fmt)
    assert [(c.name, c.arguments.get("expression")) for c in got] == calls and all(c.error is None for c in got)


@pytest.mark.parametrize("template", [HERMES, LLAMA])
def test_a_rollout_reads_and_runs_a_call_in_the_templates_own_format(template, monkeypatch):
    tok = tokenizer(template)
    model = build_tiny_model(tok, seed=4, hidden=32, layers=1, heads=2, kv_heads=1)
    box = T.build_toolbox(RolloutConfig(tools=["tests.test_tool_formats:calculator"]), tok)
    call = box.call_format.write("calculator", {"expression": "12*3"})
    if not box.call_format.open:  # Llama 3.1 writes its arguments as "parameters"
        call = call.replace('"arguments"', '"parameters"')
    script = [tok(call, add_special_tokens=False)["input_ids"] + [tok.eos_token_id],
              tok("the answer is 36", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]]

    def fake(model, rows, rollout, stop_ids, pad_id, *, greedy, row_keys=None, synced_gpus=False):
        return [script.pop(0) for _ in rows], 0

    monkeypatch.setattr(T, "decode_rows", fake)
    sample = Sample(task="calc", id="0", messages=({"role": "user", "content": "What is 12*3?"},))
    [r], _ = T.tool_rollouts(model, tok, [sample], RolloutConfig(max_new_tokens=64), tools=box, greedy=True)
    assert [m["role"] for m in r.messages] == ["assistant", "tool", "assistant"] and r.messages[1]["content"] == "36"
    assert r.messages[0]["tool_calls"][0]["function"] == {"name": "calculator", "arguments": {"expression": "12*3"}}
    assert (r.tool_use.n_calls, r.tool_use.n_failures, r.text) == (1, 0, "the answer is 36")
