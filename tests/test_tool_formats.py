"""Native tool-call formats: a chat template that renders tools describes them itself (no grpo-dual instructions in the
prompt) and its own call format is what replies are read in: Hermes / Qwen2.5's `<tool_call>` blocks, Llama 3.1's bare
JSON with "parameters", Mistral's `[TOOL_CALLS][...]`. Templates written here in jinja, on the tiny tokenizer (no
downloads); a template that renders no tools keeps the documented default."""

from __future__ import annotations

import pytest

from grpo.config import RolloutConfig
from grpo.core.step_types import Sample
from grpo.core.tool_calls import DEFAULT_FORMAT, CallFormat, parse_tool_calls
from grpo.models.modeling import build_tiny_model, build_tiny_tokenizer
from grpo.phases import tools as T
from grpo.phases.generate import GREEDY

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


XML = HERMES.replace("{{ {'name': c['function']['name'], 'arguments': c['function']['arguments']} | tojson }}",
                     "<function={{ c['function']['name'] }}>{% for k, v in c['function']['arguments'].items() %}"
                     "<parameter={{ k }}>{{ v }}</parameter>{% endfor %}</function>")
THINK = HERMES.replace("{{ m['content'] }}{% for c in", "{% if m.get('tool_calls') %}<think>\n\n</think>\n\n"
                                                      "{% endif %}{{ m['content'] }}{% for c in")


def test_a_think_block_before_the_call_is_not_part_of_the_format():
    tok = tokenizer(THINK)
    assert T.template_call_format(tok, [T.tool_schema(calculator)]) == CallFormat("<tool_call>", "</tool_call>")


def test_a_template_whose_calls_are_not_json_gets_the_default_format_described_in_the_system_turn():
    """Qwen3.5 writes calls as XML, Gemma 4 in its own syntax: replies in them cannot be read, so the tools are
    described with the default format, which replies are then read in."""
    tok = tokenizer(XML)
    assert T.renders_tools(tok, [T.tool_schema(calculator)]) and T.template_call_format(tok, [
        T.tool_schema(calculator)]) is None
    box = T.build_toolbox(RolloutConfig(tools=["tests.test_tool_formats:calculator"]), tok)
    assert not box.native and box.call_format == DEFAULT_FORMAT
    assert "You can call these tools" in tok.decode(box.encode_prompt(tok, [{"role": "user", "content": "hi"}]))


TRL_TEMPLATES = {"qwen2_5": CallFormat("<tool_call>", "</tool_call>"), "llama3_1": CallFormat("", ""),
                 "qwen3_instruct_2507": CallFormat("<tool_call>", "</tool_call>"), "gemma4": None, "qwen3_6": None}
"""TRL 1.16's own copies of real chat templates (trl/chat_templates/*.jinja, installed with TRL): the format read from
each, None where its calls are not JSON."""


@pytest.mark.parametrize("name", sorted(TRL_TEMPLATES))
def test_the_formats_of_real_templates_shipped_with_trl(name):
    trl = pytest.importorskip("trl")
    from pathlib import Path

    path = Path(trl.__file__).parent / "chat_templates" / f"{name}.jinja"
    if not path.is_file():
        pytest.skip(f"this TRL has no {path.name}")
    tok = tokenizer(path.read_text())
    schemas = [T.tool_schema(calculator)]
    assert T.renders_tools(tok, schemas)
    assert T.template_call_format(tok, schemas) == TRL_TEMPLATES[name]


def test_a_template_that_leaves_the_tool_result_out_is_refused():
    tok = tokenizer(TURNS.replace("RESULT", ""))
    with pytest.raises(T.ToolError, match="leaves it out"):
        T.build_toolbox(RolloutConfig(tools=["tests.test_tool_formats:calculator"]), tok)


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

    monkeypatch.setattr(T, "decoder", lambda *a, **k: fake)
    sample = Sample(task="calc", id="0", messages=({"role": "user", "content": "What is 12*3?"},))
    [r], _ = T.tool_rollouts(model, tok, [sample], RolloutConfig(max_new_tokens=64), tools=box, plan=GREEDY)
    assert [m["role"] for m in r.messages] == ["assistant", "tool", "assistant"] and r.messages[1]["content"] == "36"
    assert r.messages[0]["tool_calls"][0]["function"] == {"name": "calculator", "arguments": {"expression": "12*3"}}
    assert (r.tool_use.n_calls, r.tool_use.n_failures, r.text) == (1, 0, "the answer is 36")


def test_the_warm_up_renders_its_prompts_as_the_rollouts_do_with_a_template_that_shows_tools(tmp_path, monkeypatch):
    """The warm-up's prompt ids are the rollouts' (the template shows the tools), not the prompt without them."""
    import grpo_train as G

    tok = tokenizer(HERMES)
    model = build_tiny_model(tok, seed=4, hidden=32, layers=1, heads=2, kv_heads=1)
    rows = [{"prompt": f"What is 12*{i}?", "target": CallFormat("<tool_call>", "</tool_call>").write(
        "calculator", {"expression": f"12*{i}"}), "answer": str(12 * i)} for i in range(1, 13)]
    seen = []
    real = G.sft_examples
    monkeypatch.setattr(G, "sft_examples", lambda *a, **kw: seen.append(real(*a, **kw)) or seen[-1])

    def exact(completions, answer, **kwargs):
        # the final reply's text
        return [float(c.strip().endswith(a)) for c, a in zip(completions, answer, strict=True)]

    run = G.train(["model.tiny_hidden=32"], tasks={"calc": rows}, rewards={"calc": [exact]}, tools=[calculator],
                  model=(model, tok), sft={"steps": 1, "batch_size": 2},
                  train={"max_steps": 1, "prompts_per_micro_step": 1, "eval_every": 0, "tensorboard": False,
                         "sample_every": 0, "output_dir": str(tmp_path), "run_name": "w"},
                  rollout={"k": 2, "max_new_tokens": 4}, data={"eval_size": 2})
    box = T.build_toolbox(run.cfg.rollout, tok, {"calculator": calculator})
    assert box.native and seen and seen[0]
    prompts = {tuple(p) for p, _ in seen[0]}
    assert prompts <= {tuple(box.encode_prompt(tok, [{"role": "user", "content": r["prompt"]}])) for r in rows}
    assert all("<tools>" in tok.decode(list(p)) for p in prompts)
