"""Tools and multi-turn rollouts: the model replies, a tool call is parsed from its reply (grpo/core/tool_calls.py),
the function runs, its result is appended as a tool message rendered by the chat template, and the model replies
again, until a reply without a call, `rollout.max_tool_turns` rounds of calls, or `rollout.max_trajectory_tokens`.

    trajectory ids = prompt | reply_1 | tool suffix_1 | reply_2 | ... | reply_n     (one sequence, as sampled)
    model mask     =   -    |  1 … 1  |    0 … 0      |  1 … 1  | ... |  1 … 1
    tool suffix    = the ids `apply_chat_template` adds for the tool message(s) after an assistant turn that ends
                     with the end-of-turn token (TRL 1.16 `_get_tool_suffix_ids`: a dummy conversation rendered with
                     and without the tool messages; the difference after its last EOS)

Each turn continues the exact ids so far (the engine `decoder` of grpo/phases/generate.py picks: same processors,
sampler), so the ids that are scored in training are the ids that were sampled and rendered; nothing is re-tokenised.
The K trajectories of a prompt stay rows i·K … i·K + K − 1, one group.

Safety: tools come only from the run's code or config (`rollout.tools`, `train(tools=...)`), never from a data row; a
call runs in a daemon thread with `rollout.tool_timeout_s` (a call that overruns is abandoned: Python cannot kill a
thread, so a tool that may hang forever should time itself out too); an exception, a timeout, a malformed call or an
unknown tool becomes an error message to the model and a counted failure, never a crash; a result is turned into
text (str, else JSON) and cut to `rollout.max_tool_result_tokens` tokens; nothing a tool returns is executed.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

from grpo.config import ConfigError, RolloutConfig
from grpo.core.plumbing import UserCodeError, import_callable
from grpo.core.step_types import Rollout, Sample
from grpo.core.tool_calls import (
    DEFAULT_FORMAT,
    CallFormat,
    ToolCall,
    Trajectory,
    parse_tool_calls,
    tool_instructions,
    tool_metrics,
)
from grpo.decoding.sampling import splitmix64_int
from grpo.models.tokens import SYSTEM_JOIN, _ids_from_template, _with_system, encode_prompt, stop_token_id
from grpo.phases.environments import Environments, ToolError, callable_spec, resolve_environment, tool_schema
from grpo.phases.generate import SamplingPlan, _seeded, cut_completion, decoder, rollout_metrics

CUT_MARK = " …[cut]"
"""Appended to a tool result cut to rollout.max_tool_result_tokens, so the model can tell a cut result from a whole
one."""
INVALID_TOOL = "invalid"
"""The name malformed calls and calls of unknown tools are counted (and answered) under."""


@dataclass(frozen=True)
class Tool:
    """A function the model may call, described to it by its JSON schema."""

    name: str
    fn: Callable[..., Any] = field(repr=False)
    schema: dict[str, Any] = field(repr=False)
    """OpenAI-style {"type": "function", "function": {"name", "description", "parameters"}}."""


def resolve_tools(specs: Sequence[str | Callable[..., Any]], callables: Mapping[str, Callable[..., Any]] | None = None,
                  field_name: str = "rollout.tools") -> list[Tool]:
    """Tools from "package.module:function" / "path/to/file.py:function" strings (imported as reward functions are),
    names of `callables` (functions handed to `train(tools=...)`) or functions. ConfigError names `field_name`."""
    tools: list[Tool] = []
    for spec in specs:
        try:
            if callable(spec):
                fn = spec
            elif callables and spec in callables:
                fn = callables[spec]
            elif ":" in spec:
                fn = import_callable(spec)
            else:
                raise ToolError("write 'package.module:function' or 'path/to/file.py:function' (or pass the "
                                "function itself: train(tools=[fn]))")
            schema = tool_schema(fn)
            tool = Tool(name=schema["function"]["name"], fn=fn, schema=schema)
        except (UserCodeError, ToolError) as err:
            raise ConfigError(f"config field `{field_name}`: tool {spec!r}: {err}", field=field_name) from err
        if any(t.name == tool.name for t in tools):
            raise ConfigError(f"config field `{field_name}`: two tools are named {tool.name!r}; rename one",
                              field=field_name)
        tools.append(tool)
    return tools


def tool_specs(tools: Sequence[str | Callable[..., Any]]) -> tuple[list[str], dict[str, Callable[..., Any]]]:
    """`train(tools=[...])`'s entries as rollout.tools strings and the functions they name, each as `callable_spec`
    names it (a function without a name is `tool_<i>`)."""
    specs: list[str] = []
    callables: dict[str, Callable[..., Any]] = {}
    for entry in tools:
        spec, named = callable_spec(entry, f"tool_{len(specs)}")
        specs.append(spec)
        callables.update(named)
    return specs, callables


def call_with_timeout(fn: Callable[..., Any], arguments: Mapping[str, Any], timeout_s: float) -> tuple[Any, str | None]:
    """(value, None) or (None, what went wrong): the call runs in a daemon thread, awaited when it is a coroutine
    function; an exception or more than `timeout_s` seconds is an error string, never raised."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            value = fn(**arguments)
            box["value"] = asyncio.run(value) if inspect.iscoroutine(value) else value
        except Exception as err:  # whatever the tool raises is the model's error message, counted
            box["error"] = f"raised {type(err).__name__}: {err}"

    thread = threading.Thread(target=target, name=f"tool-{getattr(fn, '__name__', 'call')}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        return None, f"timed out after {timeout_s:g} s"
    if "error" in box:
        return None, box["error"]
    if "value" not in box:
        return None, "ended without a result"
    return box["value"], None


def result_text(value: Any) -> str:
    """A tool's return value as the text of its message: a str as it is, anything else as JSON (repr when it has
    no JSON form). Only ever turned into text: nothing a tool returns is run or imported."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(value)


def literal_ids(tokenizer, text: str) -> list[int]:
    """`text`'s ids as plain text: no piece of it becomes an added or special token, so a tool result that reads
    "<|im_end|>", the EOS or "<tool_call>" is those characters to the model, never an end of turn or a call marker.
    A fast tokenizer runs its normaliser, pre-tokeniser and model (the added-token matching is what is skipped: on
    text without added tokens the ids are the ordinary ones); another splits its special tokens."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return [int(i) for i in tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]]
    normalized = backend.normalizer.normalize_str(text) if backend.normalizer is not None else text
    pieces = (backend.pre_tokenizer.pre_tokenize_str(normalized) if backend.pre_tokenizer is not None
              else [(normalized, None)])
    return [token.id for piece, _ in pieces for token in backend.model.tokenize(piece)]


def cut_to_tokens(tokenizer, text: str, budget: int) -> tuple[str, bool]:
    """(text, cut): `text` cut to its first `budget` tokens (as plain text, `literal_ids`), plus CUT_MARK, when it
    is longer."""
    ids = literal_ids(tokenizer, text)
    if len(ids) <= budget:
        return text, False
    return tokenizer.decode(ids[:budget]) + CUT_MARK, True


LITERAL_MARK = "\ue000{}\ue001"
"""Stands in for a tool result while the chat template renders it (Unicode private-use characters: no template or
vocabulary gives them a meaning); the result's own ids (`literal_ids`) go where it stands."""


def _literal_render(tokenizer, messages: Sequence[Mapping[str, Any]], contents: Sequence[str]) -> list[int]:
    """The ids of `messages` (a dummy turn, then tool messages) rendered with the generation prompt, each tool
    message's content tokenized as plain text and the template's own text as `apply_chat_template` tokenizes it."""
    n_before = len(messages) - len(contents)
    marks = [LITERAL_MARK.format(i) for i in range(len(contents))]
    marked = [dict(m) for m in messages[:n_before]] + [{**m, "content": mark}
                                                        for m, mark in zip(messages[n_before:], marks, strict=True)]
    text = tokenizer.apply_chat_template(marked, add_generation_prompt=True, tokenize=False)
    ids: list[int] = []
    for mark, content in zip(marks, contents, strict=True):
        if text.count(mark) != 1:
            raise ToolError(f"the chat template of {type(tokenizer).__name__} does not render a tool message's "
                            "content as it is (it leaves it out, changes or repeats it), so the model would not see a "
                            "tool result as it is; use a template that writes the tool message's content unchanged")
        before, text = text.split(mark)
        ids += tokenizer(before, add_special_tokens=False)["input_ids"] + literal_ids(tokenizer, content)
    return ids + tokenizer(text, add_special_tokens=False)["input_ids"]


def tool_suffix_ids(tokenizer, tool_messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """The ids the chat template appends for `tool_messages` after an assistant turn, up to and including the next
    assistant generation prompt (TRL 1.16 `GRPOTrainer._get_tool_suffix_ids`, the same method): a dummy
    conversation is rendered without and with them, the first cut after its last EOS. A result whose text the
    tokenizer would read as an added or special token (an EOS, "<|im_end|>", a call marker) keeps its literal ids
    (`literal_ids`; TRL tokenizes it as the template's own text, so a tool could end the turn or fake a call)."""
    calls = [{"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}]
    dummy = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": calls}]
    prefix = _ids_from_template(tokenizer.apply_chat_template(dummy, add_generation_prompt=False, tokenize=True))
    contents = [str(m["content"]) for m in tool_messages]
    if all(literal_ids(tokenizer, c) == list(tokenizer(c, add_special_tokens=False)["input_ids"]) for c in contents):
        full = _ids_from_template(tokenizer.apply_chat_template(dummy + [dict(m) for m in tool_messages],
                                                                add_generation_prompt=True, tokenize=True))
    else:
        full = _literal_render(tokenizer, dummy + [dict(m) for m in tool_messages], contents)
    eos = [i for i, t in enumerate(prefix) if t == tokenizer.eos_token_id]
    if eos:
        prefix = prefix[:eos[-1] + 1]
    if full[:len(prefix)] != prefix:
        raise ToolError(f"the chat template of {type(tokenizer).__name__} renders the turns before a tool message "
                        "differently once it follows, so its tokens cannot be appended to a trajectory; use a "
                        "prefix-preserving template")
    return full[len(prefix):]


def renders_tools(tokenizer, schemas: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the chat template shows the tools it is given (Qwen2.5, Llama 3.1, ...): then the prompt is
    rendered with `tools=` and the model sees its own format; otherwise the tools are described in the system turn."""
    hi = [{"role": "user", "content": "hi"}]
    try:
        text = tokenizer.apply_chat_template(hi, tools=list(schemas), tokenize=False, add_generation_prompt=True)
    except Exception:  # a template that refuses `tools` renders none (jinja2 errors have no common base here)
        return False
    return (all(s["function"]["name"] in text for s in schemas) and
            text != tokenizer.apply_chat_template(hi, tokenize=False, add_generation_prompt=True))


PROBE_CALL = {"name": "probe_tool", "arguments": {"probe_argument": 7}}
"""The call `template_call_format` has the template render, to read its call format."""


def template_call_format(tokenizer, schemas: Sequence[Mapping[str, Any]]) -> CallFormat | None:
    """The call format of a chat template that renders tools, read from how it writes an assistant turn holding
    PROBE_CALL: the line before the call's JSON is `open`, the line after it (up to the turn's end, which a plain
    reply shows) `close` (the lines only: Qwen3 puts an empty think block before its `<tool_call>`); a list around
    the JSON (Mistral) belongs to the calls. None when the template renders no such turn or writes the call in
    something other than JSON (Qwen3.5's XML, Gemma 4's own syntax): grpo-dual cannot read those replies."""
    user = [{"role": "user", "content": "hi"}]
    call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": PROBE_CALL}]}
    plain = {"role": "assistant", "content": "PLAIN_REPLY"}
    try:
        base, with_call, with_plain = (
            tokenizer.apply_chat_template(messages, tools=list(schemas), tokenize=False, add_generation_prompt=gen)
            for messages, gen in ((user, True), (user + [call], False), (user + [plain], False)))
    except Exception:  # the template's own error (jinja2's have no common base here): no format of its own
        return None
    if not (with_call.startswith(base) and with_plain.startswith(base)) or "PLAIN_REPLY" not in with_plain:
        return None
    turn, end = with_call[len(base):], with_plain[len(base):].split("PLAIN_REPLY", 1)[1]
    if end and turn.endswith(end):
        turn = turn[:-len(end)]
    json_decoder = json.JSONDecoder()
    for start in (i for i, ch in enumerate(turn) if ch in "{["):
        try:
            data, stop = json_decoder.raw_decode(turn, start)
        except json.JSONDecodeError:
            continue
        found = data[0] if isinstance(data, list) and len(data) == 1 else data
        if (isinstance(found, dict) and found.get("name") == PROBE_CALL["name"] and
                PROBE_CALL["arguments"] in (found.get("arguments"), found.get("parameters"))):
            before, after = turn[:start].strip().splitlines(), turn[stop:].strip().splitlines()
            return CallFormat(before[-1].strip() if before else "", after[0].strip() if after else "")
    return None


@dataclass
class ToolBox:
    """The run's tools and their limits, with what the chat template needs: built once at set-up (`build_toolbox`)."""

    tools: list[Tool]
    timeout_s: float
    max_result_tokens: int
    native: bool = False
    """The chat template renders the tools itself (`renders_tools`) and writes calls in a JSON format of its own
    (`template_call_format`): prompts are rendered with `tools=`, replies read in that format."""
    environment: Environments | None = None
    """rollout.environment_factory: one instance per trajectory, its public methods tools too
    (grpo/phases/environments.py)."""
    call_format: CallFormat = DEFAULT_FORMAT
    """How replies write calls: the template's own when it renders tools (`template_call_format`), else the
    default the tool instructions teach."""

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tools] + (self.environment.methods if self.environment else [])

    @property
    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema for t in self.tools] + (self.environment.schemas if self.environment else [])

    @property
    def system_prompt(self) -> str | None:
        """The tool instructions a prompt gets as its system turn (None when the template shows the tools): SFT
        examples are rendered with it, so the warm-up sees the prompts the rollouts see."""
        return None if self.native else tool_instructions(self.schemas)

    def encode_prompt(self, tokenizer, messages: Sequence[Mapping[str, str]], system_prompt: str | None = None,
                      ) -> list[int]:
        """The prompt's ids with the tools shown: by the template (`native`) or in the system turn."""
        if self.native:
            out = tokenizer.apply_chat_template(_with_system(messages, system_prompt), tools=self.schemas,
                                                add_generation_prompt=True, tokenize=True)
            return _ids_from_template(out)
        text = tool_instructions(self.schemas)
        return encode_prompt(tokenizer, messages, text + SYSTEM_JOIN + system_prompt if system_prompt else text)

    def run(self, tokenizer, call: ToolCall, env: Any = None) -> tuple[str, str, bool]:
        """(name it is counted under, message content, failed) for one parsed call; never raises. `env`: the
        trajectory's environment, whose method runs when the call names one."""
        label = call.name if call.name in self.names else INVALID_TOOL
        if call.error is not None:
            content, failed = f"error: {call.error}", True
        else:
            own = [t.fn for t in self.tools if t.name == call.name]
            fn = own[0] if own else getattr(env, call.name)
            value, error = call_with_timeout(fn, call.arguments, self.timeout_s)
            content, failed = (f"error: {call.name} {error}", True) if error else (result_text(value), False)
        return label, cut_to_tokens(tokenizer, content, self.max_result_tokens)[0], failed


def build_toolbox(rollout: RolloutConfig, tokenizer, callables: Mapping[str, Callable[..., Any]] | None = None,
                  environments: Environments | None = None) -> ToolBox | None:
    """The run's ToolBox from rollout.tools and rollout.environment_factory (None when neither is set; `environments`:
    the latter already built), checked against the tokenizer: its chat template must render a tool message after an
    assistant turn (ToolError otherwise, before any rollout)."""
    if not rollout.tools and not rollout.environment_factory:
        return None
    tools = resolve_tools(rollout.tools, callables)
    if environments is None:
        environments = resolve_environment(rollout.environment_factory, callables, [t.name for t in tools])
    names = [t.name for t in tools] + (environments.methods if environments else [])
    if not names:
        raise ToolError(f"environment {environments.name} offers no tools (no public method besides reset and "
                        "get_reward) and rollout.tools names none; give the environment a method the model may call")
    try:
        for probe in ("0", tokenizer.eos_token or ""):  # a result as the template writes it, and one kept literal
            tool_suffix_ids(tokenizer, [{"role": "tool", "name": names[0], "content": probe}])
    except ToolError:
        raise
    except Exception as err:  # the template's own error (jinja2 TemplateError, a raise_exception of the template)
        raise ToolError(f"config field `rollout.tools`: the chat template of {type(tokenizer).__name__} cannot "
                        f"render a tool message ({err}); tools need a template with a `tool` role") from err
    box = ToolBox(tools, rollout.tool_timeout_s, rollout.max_tool_result_tokens, environment=environments)
    # a template that shows the tools and writes calls in JSON its own way: its prompt, and replies read that way; one
    # whose calls are not JSON (or that shows no tools) gets the tools described in the system turn, the default format
    fmt = template_call_format(tokenizer, box.schemas) if renders_tools(tokenizer, box.schemas) else None
    if fmt is not None:
        box.native, box.call_format = True, fmt
    return box


def turn_keys(keys: Sequence[int] | None, turn: int) -> list[int] | None:
    """Per-completion sampling keys of a turn: the rollout's own keys for the first reply (so it is what a
    single-turn rollout would sample), a key derived from (key, turn) for each later one."""
    if keys is None:
        return None
    return list(keys) if turn == 0 else [splitmix64_int(int(k) ^ splitmix64_int(turn)) for k in keys]


def tool_rollouts(model, tokenizer, samples: Sequence[Sample], rollout: RolloutConfig,
                  stop_ids: Sequence[int] | None = None, *, tools: ToolBox, system_prompt: str | None = None,
                  plan: SamplingPlan = SamplingPlan(),
                  synced_gpus: bool = False) -> tuple[list[Rollout], dict[str, float]]:
    """`generate_rollouts` with tool turns: `plan.k(rollout)` trajectories per sample, sampled (row keys: the first
    reply's are `plan.row_keys`, later ones derived per turn) or, `plan.greedy`, one greedy trajectory per sample as
    `greedy_complete`.
    Returns Rollouts whose completion is the whole trajectory (`model_mask`, `messages`, `tool_use` set; `text` is the
    last reply) and the rollout/ metrics plus tools/ (grpo.core.tool_calls.tool_metrics)."""
    if synced_gpus:
        raise ValueError("rollout.tools under FSDP sharding: the processes would decode different numbers of turns; "
                         "use train.sharding=none")
    if not samples:
        raise ValueError("tool_rollouts: no samples given")
    k, row_keys = plan.k(rollout), plan.row_keys
    stop_ids = [int(i) for i in stop_ids or ()] or [stop_token_id(tokenizer)]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_ids[0]
    envs: list[Any] = [None] * (len(samples) * k)
    if tools.environment is not None:  # one environment per trajectory, reset on its row: the prompt may differ
        envs = tools.environment.instances(len(envs))
        repeated = [tools.encode_prompt(tokenizer, tools.environment.reset(env, samples[i // k]), system_prompt)
                    for i, env in enumerate(envs)]
    else:
        prompts = [tools.encode_prompt(tokenizer, s.messages, system_prompt) for s in samples]
        repeated = [p for p in prompts for _ in range(k)]
    if row_keys is not None and len(row_keys) != len(repeated):
        raise ValueError(f"tool_rollouts: {len(row_keys)} row keys for {len(repeated)} completions")
    trajs = [Trajectory() for _ in repeated]
    stopped = [False] * len(trajs)
    last = [""] * len(trajs)
    rows_fixed: torch.Tensor | int = 0
    decode_with = decoder(model, rollout, plan.greedy, synced_gpus)
    with _seeded(plan.generator_seed, next(model.parameters()).device):
        for turn in range(rollout.max_tool_turns + 1):
            active = [i for i, t in enumerate(trajs) if not t.done]
            if not active:
                break
            keys = turn_keys(None if row_keys is None else [row_keys[i] for i in active], turn)
            raw, fixed = decode_with(model, [repeated[i] + trajs[i].ids for i in active], rollout, stop_ids, pad_id,
                                     greedy=plan.greedy, row_keys=keys)
            rows_fixed = rows_fixed + fixed
            for i, new in zip(active, raw, strict=True):
                stopped[i], last[i] = _take_turn(trajs[i], new, turn, tokenizer, rollout, tools, stop_ids, envs[i])
    rollouts = [Rollout(sample=samples[i // k], prompt_ids=tuple(p), completion_ids=tuple(t.ids), text=last[i],
                        stopped=stopped[i], truncated=not stopped[i], model_mask=tuple(t.model_mask),
                        messages=tuple(t.messages), tool_use=t.use(), environment=envs[i])
                for i, (p, t) in enumerate(zip(repeated, trajs, strict=True))]
    metrics = rollout_metrics(rollouts)
    metrics.update(tool_metrics([r.tool_use for r in rollouts], tools.names))
    metrics["rollout/nonfinite_logit_rows"] = float(rows_fixed)
    return rollouts, metrics


def _take_turn(traj: Trajectory, new: Sequence[int], turn: int, tokenizer, rollout: RolloutConfig, tools: ToolBox,
               stop_ids: Sequence[int], env: Any = None) -> tuple[bool, str]:
    """Append one sampled reply to `traj`, then its tool messages when it calls tools and a limit allows; marks the
    trajectory done when it ends. Returns (the reply stopped on a stop token, the reply's text)."""
    ids, stopped = cut_completion(new, stop_ids)
    budget = rollout.max_trajectory_tokens
    if budget and len(traj.ids) + len(ids) > budget:  # the trajectory's token budget cuts this reply
        ids, stopped, traj.cut_by_limit = ids[:budget - len(traj.ids)], False, True
    text = tokenizer.decode(ids, skip_special_tokens=True)
    # a template's own markers may be special tokens (Mistral's [TOOL_CALLS]): read with them, the stop id cut
    seen = (text if tools.call_format == DEFAULT_FORMAT else
            tokenizer.decode(ids[:-1] if stopped else ids, skip_special_tokens=False))
    calls = parse_tool_calls(seen, tools.names, tools.call_format) if stopped else []
    traj.add_reply(ids, text, calls)
    if not calls:  # a final answer, or a reply cut by max_new_tokens / the budget
        traj.done = True
        return stopped, text
    if turn == rollout.max_tool_turns:  # it calls again, but no round of calls is left: counted, not run
        traj.count((c.name if c.name in tools.names else INVALID_TOOL, None, False) for c in calls)
        traj.unrun += len(calls)
        traj.cut_by_limit = traj.done = True
        return stopped, text
    results = [tools.run(tokenizer, c, env) for c in calls]
    suffix = tool_suffix_ids(tokenizer, [{"role": "tool", "name": name, "content": content}
                                         for name, content, _ in results])
    if budget and len(traj.ids) + len(suffix) >= budget:  # no room for the results and a reply: end here (as TRL)
        traj.count(results)
        traj.cut_by_limit = traj.done = True
        return stopped, text
    traj.add_tool_messages(suffix, results)
    return stopped, text
