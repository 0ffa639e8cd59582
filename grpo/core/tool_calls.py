"""Tool calls in a model's reply, and the record of a multi-turn trajectory: pure text and lists, no model, no I/O.

The default call format (the one Qwen2.5 / Qwen3 / Hermes templates render, and the one the tool instructions teach a
model whose template renders no tools):

    <tool_call>{"name": "calculator", "arguments": {"expression": "123*456"}}</tool_call>

A chat template that renders tools has its own (`CallFormat`, read from how it renders an assistant's call): the
same for Qwen2.5 / Hermes, a bare JSON object for Llama 3.1, `[TOOL_CALLS][...]` for Mistral.

A reply may hold several calls; each becomes a `ToolCall`. A call that cannot be used (JSON that does not parse, no
"name", arguments that are not an object, a name that is no tool of the run, a block left open) is a `ToolCall` with
`error` set: the runner answers it with that error as the tool message and counts a failure; the trajectory goes on.

A trajectory is one token sequence: [prompt | reply 1 | tool message(s) | reply 2 | ...]. `Trajectory` concatenates
the ids exactly as they were sampled or rendered (never re-tokenised) and keeps `model_mask`: 1 on the ids the model
sampled (its replies, their stop token included), 0 on what it did not write (tool results and the chat template's
text around them). That mask becomes the batch's completion mask, so the policy loss, the KL and the entropy see
only the model's own tokens (TRL 1.16 `tool_mask`, the same layout).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Collection, Iterable, Mapping, Sequence

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
"""The default tool-call delimiters."""


@dataclass(frozen=True)
class CallFormat:
    """How a reply writes its calls: `open`, a JSON call (or a list of them), `close`. Read from a chat template that
    renders tools (grpo/phases/tools.py template_call_format): Qwen2.5 / Hermes `<tool_call>{...}</tool_call>`,
    Llama 3.1 a bare `{"name": ..., "parameters": {...}}` (open and close empty: the reply is the call), Mistral
    `[TOOL_CALLS][{...}]` (close empty: the calls run to the reply's end)."""

    open: str = CALL_OPEN
    close: str = CALL_CLOSE

    def write(self, name: str, arguments: Mapping[str, Any]) -> str:
        return f"{self.open}{json.dumps({'name': name, 'arguments': dict(arguments)})}{self.close}"


DEFAULT_FORMAT = CallFormat()
"""The documented default, taught by `tool_instructions` to a model whose template renders no tools."""


@dataclass(frozen=True)
class ToolCall:
    """One call parsed from a reply. `error` set: the call cannot run, and the model is told why."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def _calls(body: str, known: Collection[str], fmt: CallFormat) -> list[ToolCall]:
    """The calls of one block's body: a JSON object, or a list of them (Mistral's format)."""
    try:
        data = json.loads(body)
    except json.JSONDecodeError as err:
        return [ToolCall("", error=f"the tool call is not valid JSON ({err.msg} at character {err.pos}); write "
                                   f'{fmt.open}{{"name": ..., "arguments": {{...}}}}{fmt.close}')]
    items = data if isinstance(data, list) and data else [data]
    return [_one_call(item, known) for item in items]


def _one_call(data: Any, known: Collection[str]) -> ToolCall:
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return ToolCall("", error='the tool call has no "name": write {"name": "<tool>", "arguments": {...}}')
    name = data["name"]
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string (OpenAI's wire format)
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            pass
    if not isinstance(arguments, dict):
        return ToolCall(name, error=f'the "arguments" of {name!r} must be a JSON object, '
                                    f'got {type(arguments).__name__}')
    if name not in known:
        return ToolCall(name, arguments, error=f"unknown tool {name!r}; the tools are: {', '.join(sorted(known))}")
    return ToolCall(name, arguments)


def parse_tool_calls(text: str, known: Collection[str], fmt: CallFormat = DEFAULT_FORMAT) -> list[ToolCall]:
    """Every call of `text` in order (empty: the reply is a final answer). `known`: the tool names of the run;
    `fmt`: the delimiters (the default, or the chat template's own)."""
    if not fmt.open:  # the reply itself is the call (Llama 3.1): a JSON object with a "name", else an answer
        body = text.strip()
        try:
            data = json.loads(body) if body[:1] in "{[" and body else None
        except json.JSONDecodeError:
            return []
        named = (isinstance(data, dict) and "name" in data or
                 isinstance(data, list) and bool(data) and all(isinstance(d, dict) and "name" in d for d in data))
        return _calls(body, known, fmt) if named else []
    if not fmt.close:  # the calls run from the marker to the reply's end (Mistral)
        head, sep, body = text.partition(fmt.open)
        return _calls(body.strip(), known, fmt) if sep else []
    block = re.compile(re.escape(fmt.open) + r"(.*?)" + re.escape(fmt.close), re.DOTALL)
    calls = [c for m in block.finditer(text) for c in _calls(m.group(1).strip(), known, fmt)]
    if fmt.open in block.sub("", text):  # an opened call never closed (cut, or a typo): malformed, not an answer
        calls.append(ToolCall("", error=f"a {fmt.open} block is not closed with {fmt.close}"))
    return calls


def tool_instructions(schemas: Sequence[Mapping[str, Any]]) -> str:
    """The system text that describes the tools and the default call format, for a chat template that renders no
    tools (SmolLM2, the tiny model). `schemas`: OpenAI-style function schemas ({"type": "function", "function":
    {...}}), one per tool."""
    lines = "\n".join(json.dumps(s.get("function", s), sort_keys=True) for s in schemas)
    return ("You can call these tools:\n" + lines + "\nTo call one, reply with exactly "
            f'{CALL_OPEN}{{"name": <tool name>, "arguments": {{<arguments>}}}}{CALL_CLOSE} and nothing else; '
            "its result comes back in the next message. When you know the answer, reply without a tool call.")


@dataclass(frozen=True)
class ToolUse:
    """What one trajectory did with its tools."""

    calls: tuple[tuple[str, int], ...] = ()
    """(tool name, calls) per tool called; malformed calls and unknown tools count under one name (grpo/phases/tools.py
    INVALID_TOOL), so a model cannot invent metric names."""
    failures: tuple[tuple[str, int], ...] = ()
    """(tool name, failed calls): malformed, unknown, raised, timed out."""
    turns: int = 1
    """Model replies in the trajectory."""
    cut_by_limit: bool = False
    """The trajectory ended on a limit (rollout.max_tool_turns, the token budget, max_new_tokens in a reply) rather
    than on a reply without a call."""
    unrun: int = 0
    """Calls of `calls` that did not run: the last reply called again with no round of calls left (max_tool_turns)."""

    @property
    def n_calls(self) -> int:
        return sum(n for _, n in self.calls)

    @property
    def n_failures(self) -> int:
        return sum(n for _, n in self.failures)


@dataclass
class Trajectory:
    """The completion of one multi-turn rollout, built turn by turn: ids, the model-token mask, the messages."""

    ids: list[int] = field(default_factory=list)
    model_mask: list[int] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    """The completion as chat messages: {"role": "assistant", "content", "tool_calls"?} and {"role": "tool",
    "name", "content"}, what TRL passes reward functions as a conversational completion."""
    calls: Counter = field(default_factory=Counter)
    failures: Counter = field(default_factory=Counter)
    turns: int = 0
    cut_by_limit: bool = False
    unrun: int = 0
    done: bool = False

    def add_reply(self, ids: Sequence[int], text: str, calls: Sequence[ToolCall]) -> None:
        """A reply the model sampled: trained on (mask 1)."""
        self.ids += [int(i) for i in ids]
        self.model_mask += [1] * len(ids)
        self.turns += 1
        message: dict[str, Any] = {"role": "assistant", "content": text}
        usable = [c for c in calls if c.error is None]
        if usable:
            message["tool_calls"] = [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                                     for c in usable]
        self.messages.append(message)

    def add_tool_messages(self, ids: Sequence[int], results: Sequence[tuple[str, str, bool]]) -> None:
        """Rendered tool messages (template text included): not the model's, mask 0. `results`: (tool name,
        content, failed) per call."""
        self.ids += [int(i) for i in ids]
        self.model_mask += [0] * len(ids)
        self.count(results)
        self.messages += [{"role": "tool", "name": name, "content": content} for name, content, _ in results]

    def count(self, results: Iterable[tuple[str, Any, bool]]) -> None:
        """Count calls (name, _, failed) per tool; also those whose results a limit kept out of the trajectory."""
        for name, _, failed in results:
            self.calls[name] += 1
            self.failures[name] += int(failed)

    def use(self) -> ToolUse:
        return ToolUse(calls=tuple(sorted(self.calls.items())), failures=tuple(sorted(self.failures.items())),
                       turns=self.turns, cut_by_limit=self.cut_by_limit, unrun=self.unrun)


def tool_metrics(uses: Sequence[ToolUse], names: Sequence[str] = ()) -> dict[str, float]:
    """`tools/calls_per_rollout`, `tools/failure_rate` (failed / calls, 0 without calls), `tools/turns` (replies per
    rollout), `tools/cut_by_limit` (share of trajectories), `tools/unrun_per_rollout` (calls a turn limit kept from
    running: counted in calls_per_rollout, never failed), and `tools/<name>/{calls_per_rollout,failure_rate}` for
    every tool of `names` (called or not) and every other name calls were counted under (malformed / unknown)."""
    n = max(1, len(uses))
    calls: Counter = Counter()
    failures: Counter = Counter()
    for u in uses:
        calls.update(dict(u.calls))
        failures.update(dict(u.failures))
    total, failed = sum(calls.values()), sum(failures.values())
    out = {"tools/calls_per_rollout": total / n, "tools/failure_rate": failed / total if total else 0.0,
           "tools/turns": sum(u.turns for u in uses) / n, "tools/cut_by_limit": sum(u.cut_by_limit for u in uses) / n,
           "tools/unrun_per_rollout": sum(u.unrun for u in uses) / n}
    for name in sorted(set(names) | set(calls)):
        out[f"tools/{name}/calls_per_rollout"] = calls[name] / n
        out[f"tools/{name}/failure_rate"] = failures[name] / calls[name] if calls[name] else 0.0
    return out
