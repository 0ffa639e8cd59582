"""Fuzzing the two doors user input comes through: config overrides on the command line and rows of a JSONL task.

Properties:
  * every list of `--section.field value` overrides ends in exit 0 (a config; `--print-config`) or exit 2 with a
    message naming the field at fault (one override) or one of the fields given (several) — never a traceback;
  * every JSONL file gives samples (each pointing back at its file and line), skipped rows warned as `<file>:<line>:`,
    or an error naming the file — never another exception.
Inputs the fuzzers found breaking a property are kept as ordinary cases in FOUND, each with its fix named, so every
run checks them, not only the runs whose draws happen to hit them; the generators produce their kinds too (a field
used as a section, a value that is a flag, rows nested past the decoder's limit, a byte-order mark).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import string
import typing
import warnings
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import grpo_train as G
from grpo import config as C
from grpo.config.building import _field_types
from grpo.data.sources import TaskSource, load_source_samples

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: a tiny model gains nothing from threads

RESERVED = ("task", "id", "prompt", "messages", "target", "meta", "gold")
"""The column names the generic row format gives a meaning (grpo/data/generic.py, grpo/data/sources.TaskSource)."""


def load_jsonl_tasks(path):
    """A JSONL file whose rows name their own task, through the one loader of custom data (grpo/data/sources.py)."""
    samples, metrics = load_source_samples("", TaskSource(path=str(path), task_field="task"))
    return SimpleNamespace(samples=samples, skipped=int(metrics.get("data/all/skipped", 0)))

FUZZ = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
"""Deterministic (derandomize) and small: each config case parses argv and builds the --help text, ~0.1 s."""

def config_fields() -> list[str]:
    out = []
    for section, cls in typing.get_type_hints(C.Config).items():
        if section == "preset":
            continue
        if section == "kl":
            out += [f"kl.{task}.{f}" for task in ("fairness", "default") for f in _field_types(C.TaskKLConfig)]
        elif section == "rewards":
            out += ["rewards.fairness", "rewards.qa"]
        elif section in C.DICT_SECTIONS:  # tasks.<task>, reward_models.<name>
            out += [f"{section}.qa.{f}" for f in _field_types(C.DICT_SECTIONS[section])]
        else:
            out += [f"{section}.{f}" for f in _field_types(cls)]
    return out


FIELDS = config_fields()
SECTIONS = sorted(s for s in typing.get_type_hints(C.Config) if s not in ("preset", "kl", "rewards", *C.DICT_SECTIONS))
VALUES = ["0", "1", "-1", "2", "8", "0.5", "1e-5", "-0", "1_000", "1e309", "inf", "-inf", "nan", "99999999999999999999",
          "true", "false", "yes", "", " ", "none", "abc", "a,b", "demo", "dual", "cpu", "cuda:0", "auto", "fsdp",
          "/nonexistent", "http://127.0.0.1:9/v1", "bbq_rule:1.0", "x:y:z", "fairness:1,hallucination:2", "k3+",
          "band", "token-mean", "pcgrad", "--max-steps", "１"]
values = st.one_of(st.sampled_from(VALUES), st.integers(-10**6, 10**6).map(str),
                   st.floats(allow_nan=True, allow_infinity=True).map(repr),
                   st.text(st.characters(blacklist_categories=("Cs",)), max_size=8))
typo_fields = st.builds(lambda s, f: f"{s}.{f}", st.sampled_from(SECTIONS),
                        st.text(string.ascii_lowercase + "_", min_size=1, max_size=6))
deeper_fields = st.builds(lambda f, x: f"{f}.{x}", st.sampled_from(FIELDS), st.sampled_from(["x", "beta", "k"]))
"""A field used as if it were a section (`rollout.k.x`), or a task-less kl entry (`kl.fairness` + `.beta`)."""
overrides = st.lists(st.tuples(st.one_of(st.sampled_from(FIELDS), typo_fields, deeper_fields), values),
                     min_size=1, max_size=3)


def run_cli(argv: list[str]) -> tuple[int, str]:
    """Exit status and stderr of `grpo_train.cli(argv)`, in-process; argparse's own exit is a failure here."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = G.cli(argv)
        except SystemExit as e:  # argparse gave up: its message names no config field
            code = -1 if e.code in (0, None) else 100 + int(e.code)
    return code, err.getvalue()


def assert_config_or_named_error(pairs: list[tuple[str, str]]) -> None:
    argv = [x for field, value in pairs for x in (f"--{field}", value)]
    assert_argv_config_or_named_error(argv, [f for f, _ in pairs])


def assert_argv_config_or_named_error(argv: list[str], fields: list[str]) -> None:
    """`argv + --print-config` exits 0, or 2 naming the one field (`fields` of one) or one of several."""
    code, err = run_cli(argv + ["--print-config"])
    assert "Traceback" not in err, err
    if code == 0:
        return
    assert code == 2, f"{argv}: exit {code}: {err}"
    keyed = [".".join(f.split(".")[:2]) + "." for f in fields if f.split(".")[0] in C.DICT_SECTIONS]
    if keyed:  # a field of a new tasks.<task> / reward_models.<name> section: the section's own missing field
        named = any(f"`{k}" in err for k in keyed) or any(f in err for f in fields)  # (its path) may be at fault
    elif len(fields) == 1:
        named = f"`{fields[0]}`" in err or f"'{fields[0]}'" in err
    else:
        named = any(f in err for f in fields)
    assert named, f"{argv}: the message names none of {fields}: {err}"


@FUZZ
@given(overrides)
def test_config_overrides_end_in_a_config_or_an_error_naming_the_field(pairs):
    assert_config_or_named_error(pairs)


# ------------------------------------------------------------------------------------------------------ data rows
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(allow_nan=False),
                         st.text(max_size=10))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                                 st.dictionaries(st.text(max_size=5), inner,
                                                                                 max_size=3)),
                           max_leaves=8)
row_keys = st.sampled_from(list(RESERVED) + ["answer", "label_letter", "extra"])
messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant"]),
                                           "content": st.text(max_size=10)}), max_size=2)
rows = (st.dictionaries(row_keys, st.one_of(json_values, messages), max_size=5)
        .map(json.dumps))
deep_rows = st.integers(60, 1200).map(lambda n: '{"task": "t", "prompt": "x", "g": ' + "[" * n + "]" * n + "}")
"""Rows nested around the reader's MAX_DEPTH and past the decoder's recursion limit (~1000)."""
lines = st.lists(st.one_of(rows, rows, json_values.map(json.dumps), deep_rows, st.text(st.characters(
    blacklist_categories=("Cs", "Zl", "Zp", "Cc")), max_size=20)), min_size=1, max_size=6)
BOM = "\ufeff"


def assert_samples_or_named_error(path, texts: list[str], bom: bool = False) -> None:
    path.write_text((BOM if bom else "") + "\n".join(texts) + "\n", encoding="utf-8")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = load_jsonl_tasks(path)
    except (ValueError, FileNotFoundError) as e:
        assert str(path) in str(e), f"the error does not name the file: {e}"
        return
    for message in (str(w.message) for w in caught):
        assert message.startswith(f"{path}:"), message
    n_lines = len(texts)
    for sample in result.samples:
        assert sample.meta["source"] == str(path) and 1 <= sample.meta["line"] <= n_lines, sample.meta
        assert sample.messages and all(isinstance(m["content"], str) for m in sample.messages)
    assert result.skipped == 0 or caught, "rows were skipped without a warning"


@FUZZ
@given(lines, st.booleans())
def test_jsonl_rows_give_samples_or_errors_naming_file_and_line(tmp_path_factory, texts, bom):
    assert_samples_or_named_error(tmp_path_factory.mktemp("rows") / "task.jsonl", texts, bom)


# ----------------------------------------------------------------------------- what the fuzzers found, as fixed cases
def _bom(tmp):
    """A UTF-8 byte-order mark (what Windows editors write) makes the first row invalid JSON, which would be skipped:
    the reader drops the mark (utf-8-sig)."""
    path = tmp / "bom.jsonl"
    path.write_bytes('\ufeff{"task": "t", "prompt": "x"}\n{"task": "t", "prompt": "y"}\n'.encode("utf-8"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no row skipped: no warning
        samples = load_jsonl_tasks(path).samples
    assert [s.messages[-1]["content"] for s in samples] == ["x", "y"]


def _deep(tmp):
    """A row nested 1000 deep, which raises RecursionError in the decoder, is a skipped row naming file and line,
    and the rows around it load."""
    path = tmp / "deep.jsonl"
    rows = ['{"task": "t", "prompt": "a"}', '{"task": "t", "prompt": "x", "g": ' + "[" * 1000 + "]" * 1000 + "}",
            '{"task": "t", "prompt": "b"}']
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        samples = load_jsonl_tasks(path.write_text("\n".join(rows)) and path).samples
    assert [s.meta["line"] for s in samples] == [1, 3]
    assert [str(w.message) for w in caught] == [f"{path}:2: skipped bad row: nested too deeply to parse (more than "
                                                "Python's recursion limit, near character 29)"]


def _not_utf8(tmp):
    """A file in another encoding is an error naming file and line, not a bare UnicodeDecodeError naming no
    file."""
    path = tmp / "latin1.jsonl"
    path.write_bytes('{"task": "t", "prompt": "a"}\n{"task": "t", "prompt": "caf\u00e9"}\n'.encode("latin-1"))
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:2: not UTF-8 text \(byte 0xe9"):
        load_jsonl_tasks(path)


def _from_dict_types(tmp):
    """config.json values of the wrong JSON type are each an error naming the field; unchecked, they go into the
    dataclasses (rollout.k = 2.5 accepted, a list for an int a TypeError)."""
    for section, field, value in (("rollout", "k", 2.5), ("rollout", "k", [3]), ("train", "lr", float("inf")),
                                  ("train", "tensorboard", 1), ("model", "lora_target_modules", "q_proj"),
                                  ("rollout", "k", {"x": 3})):
        if isinstance(value, str):  # a string is parsed as on the command line: a one-item list is fine
            assert C.from_dict({section: {field: value}}).model.lora_target_modules == ["q_proj"]
            continue
        with pytest.raises(C.ConfigError) as err:
            C.from_dict({section: {field: value}})
        assert f"`{section}.{field}`" in str(err.value), err.value


def assert_refused(argv: list[str], field: str, says: str) -> None:
    """`argv` exits 2 with a message naming `field` in backticks and saying `says`."""
    code, err = run_cli(argv + ["--print-config"])
    assert code == 2 and f"`{field}`" in err and says in err and "Traceback" not in err, (code, err)


FOUND = [
    pytest.param(lambda tmp: assert_config_or_named_error([("rollout.k.x", "3")]),
                 id="rollout.k.x=3 (was a TypeError traceback in config.from_dict)"),
    pytest.param(lambda tmp: assert_argv_config_or_named_error(["--rollout.k", "--max-steps", "5"], ["rollout.k"]),
                 id="--rollout.k --max-steps 5 (was argparse: unrecognized arguments: 5)"),
    pytest.param(lambda tmp: assert_argv_config_or_named_error(["--rollout.k", "3", "--rollout.k.x", "4"],
                                                               ["rollout.k.x"]),
                 id="rollout.k=3 then rollout.k.x=4 (was an AttributeError in config._override_tree)"),
    pytest.param(lambda tmp: assert_argv_config_or_named_error(["--rollout", "3"], ["rollout"]),
                 id="--rollout 3 (was argparse: unrecognized arguments)"),
    pytest.param(lambda tmp: assert_refused(["--kl.fairness", "3"], "kl.fairness", "is a section, not a value"),
                 id="--kl.fairness 3 (was 'unknown config field kl.fairness.3')"),
    pytest.param(lambda tmp: assert_refused(["--rewards.qa.x", "1"], "rewards.qa", "['rewards.qa.x']"),
                 id="--rewards.qa.x 1 (was accepted as the reward spec \"{'x': '1'}\")"),
    pytest.param(lambda tmp: assert_samples_or_named_error(tmp / "deep.jsonl", ['{"task": "t", "prompt": "x", "g": '
                                                                               + "[" * 1000 + "]" * 1000 + "}"]),
                 id="a row nested 1000 deep, alone (was a RecursionError from grpo/data/json_rows.py)"),
    pytest.param(_deep, id="a row nested 1000 deep between good rows"),
    pytest.param(_bom, id="a UTF-8 BOM (cost the first row)"),
    pytest.param(_not_utf8, id="a file that is not UTF-8 (was a bare UnicodeDecodeError)"),
    pytest.param(_from_dict_types, id="config.json values of the wrong type"),
]


@pytest.mark.parametrize("case", FOUND)
def test_inputs_the_fuzzers_found(case, tmp_path):
    case(tmp_path)
