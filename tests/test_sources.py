"""Task sources: every form (JSONL, CSV, Parquet, save_to_disk, folders, builders) gives the same Samples; column
mapping; several tasks in one run; user and hash held-out splits; errors that name the field, the file and the row."""

from __future__ import annotations

import csv
import json
import time
import warnings

import pytest

datasets = pytest.importorskip("datasets")

from grpo.data.heldout_split import stable_hash01  # noqa: E402
from grpo.data.sources import DataSourceError, TaskSource, load_source_samples, load_sources  # noqa: E402
from grpo.data.tables import HUB_PROBE_TIMEOUT_S  # noqa: E402

ROWS = [
    {"id": f"r{i}", "prompt": f"Repeat the word {w}.", "answer": w, "target": f"Answer: {w}"}
    for i, w in enumerate(["apple", "007", "1e3", "river", "stone", "cloud"])
]  # "007" and "1e3" would change if any form inferred numbers from text


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path, monkeypatch):
    """datasets caches what it reads; keep the cache of each test in its own folder."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    datasets.disable_progress_bars()


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_csv(path, rows):
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def content(samples):
    """What a Sample says, without where it was read from (meta holds the file and line)."""
    return [(s.task, s.id, s.messages, s.gold, s.target, s.conversational) for s in samples]


def test_every_form_gives_the_same_samples(tmp_path):
    jsonl = write_jsonl(tmp_path / "t.jsonl", ROWS)
    table = datasets.Dataset.from_list(ROWS)
    table.to_parquet(str(tmp_path / "t.parquet"))
    table.save_to_disk(str(tmp_path / "saved"))
    folder = tmp_path / "parts"
    folder.mkdir()
    write_jsonl(folder / "a.jsonl", ROWS[:2])
    write_csv(folder / "b.csv", ROWS[2:4])
    datasets.Dataset.from_list(ROWS[4:]).to_parquet(str(folder / "c.parquet"))
    (folder / ".hidden.jsonl").write_text("not data\n")  # hidden files are not data files
    forms = {
        "jsonl": TaskSource(path=str(jsonl)),
        "csv": TaskSource(path=str(write_csv(tmp_path / "t.csv", ROWS))),
        "parquet": TaskSource(path=str(tmp_path / "t.parquet")),
        "save_to_disk": TaskSource(path=str(tmp_path / "saved")),
        "folder": TaskSource(path=str(folder)),
        "builder": TaskSource(builder="json", data_files=[str(jsonl)]),
    }
    got = {form: load_source_samples("echo", source)[0] for form, source in forms.items()}
    expected = [("echo", r["id"], ({"role": "user", "content": r["prompt"]},), {"answer": r["answer"],
                 "target": r["target"]}, r["target"], False) for r in ROWS]
    for form, samples in got.items():
        assert content(samples) == expected, form
    assert got["jsonl"][2].meta == {"source": str(jsonl), "line": 3}
    assert got["csv"][2].meta == {"source": str(tmp_path / "t.csv"), "row": 3}  # data row 3 = line 4 of the CSV
    assert [s.meta["source"] for s in got["folder"]] == [str(folder / n) for n in ("a.jsonl",) * 2 + (
        "b.csv",) * 2 + ("c.parquet",) * 2]


def test_column_mapping_template_and_messages(tmp_path):
    rows = [{"uid": "q1", "question": "2+3", "solution": "5", "level": "easy", "note": None},
            {"uid": "q2", "question": "4*4", "solution": "16", "level": "hard", "note": "x"}]
    path = write_jsonl(tmp_path / "math.jsonl", rows)
    mapped = TaskSource(path=str(path), prompt_field="question", target_field="solution",
                        id_field="uid", gold_fields=["solution", "level"])
    samples, metrics = load_source_samples("math", mapped, system_prompt="Be brief.")
    assert content(samples) == [
        ("math", "q1", ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3"}),
         {"solution": "5", "level": "easy"}, "5", False),
        ("math", "q2", ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "4*4"}),
         {"solution": "16", "level": "hard"}, "16", False)]
    assert metrics == {"data/math/rows": 2.0, "data/math/skipped": 0.0}
    templated, _ = load_source_samples("math", TaskSource(path=str(path), template="Compute {question} ({level})."))
    assert templated[1].messages == ({"role": "user", "content": "Compute 4*4 (hard)."},)
    assert templated[0].gold == {"uid": "q1", "question": "2+3", "solution": "5", "level": "easy"}  # None left out
    # Messages: a list in JSON and Parquet, JSON text in a CSV cell, or (TRL's conversational datasets) a list
    # held in the prompt column itself.
    chat = [{"role": "system", "content": "Count."}, {"role": "user", "content": "1, 2, ?"}]
    conv_rows = [{"messages": chat, "answer": "3"}]
    csv_rows = [{"messages": json.dumps(chat), "answer": "3"}]
    trl_rows = [{"prompt": chat, "answer": "3"}]
    forms = [write_jsonl(tmp_path / "c.jsonl", conv_rows), write_csv(tmp_path / "c.csv", csv_rows),
             write_jsonl(tmp_path / "trl.jsonl", trl_rows)]
    datasets.Dataset.from_list(conv_rows).to_parquet(str(tmp_path / "c.parquet"))
    forms.append(tmp_path / "c.parquet")
    for path in forms:
        (sample,), _ = load_source_samples("count", TaskSource(path=str(path)))
        assert (sample.messages, sample.gold, sample.conversational) == (tuple(chat), {"answer": "3"}, True), path


def test_several_sources_with_their_task_names_and_the_hash_split(tmp_path):
    add = [{"id": f"a{i}", "prompt": f"{i}+1", "answer": str(i + 1)} for i in range(40)]
    copy = [{"id": f"c{i}", "prompt": f"copy {i}", "answer": str(i)} for i in range(40)]
    sources = {"add": TaskSource(path=str(write_jsonl(tmp_path / "add.jsonl", add))),
               "copy": TaskSource(path=str(write_csv(tmp_path / "copy.csv", copy)))}
    loaded = load_sources(sources, heldout_fraction=0.25, salt="s")
    held = {r["id"] for r in add + copy if stable_hash01(r["id"], "s") < 0.25}  # the rule, by hand
    assert {s.id for s in loaded.heldout} == held and {s.id for s in loaded.train} == {
        r["id"] for r in add + copy} - held
    assert {s.task for s in loaded.train if s.id.startswith("a")} == {"add"}
    assert {s.task for s in loaded.train if s.id.startswith("c")} == {"copy"}
    n_add = sum(i.startswith("a") for i in held)
    assert loaded.metrics == {"data/add/skipped": 0.0, "data/copy/skipped": 0.0,
                              "data/add/rows": 40.0 - n_add, "data/add/heldout": float(n_add),
                              "data/copy/rows": 40.0 - (len(held) - n_add),
                              "data/copy/heldout": float(len(held) - n_add)}
    # One file, the rows naming their task: the same split (a row's side depends only on its id).
    mixed = write_jsonl(tmp_path / "mixed.jsonl", [{**r, "kind": "add"} for r in add] + [
        {**r, "kind": "copy"} for r in copy])
    one = load_sources({"": TaskSource(task_field="kind", path=str(mixed))}, heldout_fraction=0.25, salt="s")
    assert content(one.heldout) == content(loaded.heldout) and content(one.train) == content(loaded.train)


def test_a_held_out_split_given_by_the_user(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", ROWS[:4])
    test = write_csv(tmp_path / "test.csv", ROWS[4:])
    loaded = load_sources({"echo": TaskSource(path=str(train), heldout=str(test))}, heldout_fraction=0.5)
    assert [s.id for s in loaded.train] == ["r0", "r1", "r2", "r3"] and [s.id for s in loaded.heldout] == ["r4", "r5"]
    assert loaded.heldout[0].meta == {"source": str(test), "row": 1}
    # A split name of a save_to_disk DatasetDict.
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS[:4]),
                          "test": datasets.Dataset.from_list(ROWS[4:])}).save_to_disk(str(tmp_path / "dd"))
    by_split = load_sources({"echo": TaskSource(path=str(tmp_path / "dd"), heldout="test")}, 0.5)
    assert content(by_split.train) == content(loaded.train) and content(by_split.heldout) == content(loaded.heldout)
    with pytest.raises(DataSourceError, match=r"tasks.echo.heldout: 'test' is not an existing file or folder, and "
                                              r".*train.jsonl' has no named splits"):
        load_sources({"echo": TaskSource(path=str(train), heldout="test")}, 0.5)
    with pytest.raises(DataSourceError, match=r"tasks.echo: .*dd has splits \['test', 'train'\], not 'dev'"):
        load_sources({"echo": TaskSource(path=str(tmp_path / "dd"), split="dev")}, 0.5)
    with pytest.warns(UserWarning, match=r"tasks.echo: 1 held-out row ids also appear in the training rows"):
        load_sources({"echo": TaskSource(path=str(train), heldout=str(write_jsonl(
            tmp_path / "leak.jsonl", ROWS[3:])))}, 0.5)


def test_bad_rows_and_missing_columns_name_the_file_row_and_field(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"prompt": "ok", "answer": "1"}\n\n{"prompt": "", "answer": "2"}\n{"prompt": "x", '
                    '"messages": [{"role": "assistant", "content": "the answer"}]}\nnot json\n')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        samples, metrics = load_source_samples("t", TaskSource(path=str(path)))
    messages = [str(w.message) for w in caught]
    assert len(samples) == 1 and metrics["data/t/skipped"] == 3.0
    assert f"{path}:3: skipped bad row: neither column 'messages' nor 'prompt' holds a prompt" in messages[1]
    assert f"{path}:4: skipped bad row: column 'messages' ends with an assistant turn" in messages[2]
    assert messages[0].startswith(f"{path}:5: skipped bad row: invalid JSON")  # found while reading, warned first
    table = write_csv(tmp_path / "t.csv", [{"question": "a", "answer": "1"}, {"question": "", "answer": "2"}])
    with pytest.raises(DataSourceError, match=rf"tasks.t.prompt_field: no column 'prompt' \(nor 'messages'\) to "
                                              rf"take prompts from; the columns of {table} are \['answer', "
                                              r"'question'\]: set prompt_field"):
        load_source_samples("t", TaskSource(path=str(table)))
    with pytest.warns(UserWarning, match=rf"{table} row 2: skipped bad row: neither column 'messages' nor "
                                         "'question' holds a prompt"):
        load_source_samples("t", TaskSource(path=str(table), prompt_field="question"))
    with pytest.raises(DataSourceError, match=r"tasks.t.gold_fields: no column 'solution'"):
        load_source_samples("t", TaskSource(path=str(table), prompt_field="question", gold_fields=["solution"]))
    with pytest.raises(DataSourceError, match=rf"tasks.t.template: {table} row 1: .*uses \{{q\}}, but rows only "
                                              r"have the fields \['answer', 'question'\]"):
        load_source_samples("t", TaskSource(path=str(table), template="{q}"))
    with pytest.raises(DataSourceError, match=rf"tasks.t: no usable row in {table}; first problem: {table} row 1"):
        load_source_samples("t", TaskSource(path=str(table), messages_field="answer"))


def test_unreadable_sources_and_bad_settings_are_named(tmp_path, monkeypatch):
    with pytest.raises(DataSourceError, match=r"tasks.t: 'nope.jsonl' does not exist"):
        load_source_samples("t", TaskSource(path="nope.jsonl"))
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(DataSourceError, match=r"holds no data files \(.jsonl, .json, .csv"):
        load_source_samples("t", TaskSource(path=str(tmp_path)))
    with pytest.raises(DataSourceError, match=r"notes.txt has suffix '.txt'; data files are"):
        load_source_samples("t", TaskSource(builder="", path=str(tmp_path / "notes.txt")))
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1 not really")
    with pytest.raises(DataSourceError, match=rf"tasks.t: {broken} cannot be read as 'parquet'"):
        load_source_samples("t", TaskSource(path=str(broken)))
    # A Hub id with no network: an error at once that says what to do, not ~25 s of retries.
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens, refused at once
    start = time.monotonic()
    with pytest.raises(DataSourceError, match=r"tasks.t: 'someone/tiny-set' is not a local file or folder, and the "
                                              r"Hugging Face Hub \(http://127.0.0.1:9\) cannot be reached.*"
                                              r"save_to_disk\(folder\)"):
        load_source_samples("t", TaskSource(path="someone/tiny-set"))
    assert time.monotonic() - start < HUB_PROBE_TIMEOUT_S
    for bad, match in [({"limit": -1}, r"`tasks.t.limit` = -1 is invalid: use 0"),
                       ({"template": "{}"}, r"`tasks.t.template` = '\{\}' is invalid: name every placeholder"),
                       ({"template": "{a"}, r"`tasks.t.template` = '\{a' is invalid: .*double literal braces"),
                       ({"data_files": ["a.csv"]}, r"`tasks.t.data_files` = \['a.csv'\] is invalid: data_files are "
                                                   r"read by a builder"),
                       ({"path": ""}, r"`tasks.t.path` = '' is invalid: give a file, a folder or a Hub id")]:
        source = TaskSource(path="x.jsonl")
        for name, value in bad.items():
            setattr(source, name, value)
        with pytest.raises(ValueError, match=match):
            source.validate("tasks.t")  # as the config does for each tasks.<task> entry
    with pytest.raises(ValueError, match=r"`tasks.t.limit` = -1 is invalid"):
        load_source_samples("t", TaskSource(path="x.jsonl", limit=-1))  # built by hand: checked before any read


def test_the_custom_tasks_doc_example_loads_and_its_reward_agrees_with_its_targets():
    """docs/CUSTOM_TASKS.md's Python example runs as written, on the example's two 60-row tasks."""
    import re
    from pathlib import Path

    from grpo.core.step_types import Rollout

    root = Path(__file__).resolve().parents[1]
    blocks = re.findall(r"```python\n(.*?)```", (root / "docs" / "CUSTOM_TASKS.md").read_text(), re.S)
    block = next(b for b in blocks if "loaded =" in b)  # the loading example, wherever later sections put theirs
    namespace: dict = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)  # the doc's paths are relative to the repository
        exec(compile(block, "docs/CUSTOM_TASKS.md", "exec"), namespace)
    loaded, graders = namespace["loaded"], namespace["graders"]
    for task in ("reviews", "colors"):
        assert loaded.metrics[f"data/{task}/rows"] + loaded.metrics[f"data/{task}/heldout"] == 60
    (grader,) = graders.values()
    samples = loaded.train + loaded.heldout
    rollouts = [Rollout(sample=s, prompt_ids=(), completion_ids=(), text=s.target, stopped=True, truncated=False)
                for s in samples]
    assert grader.grade(rollouts) == [1.0] * 120  # every target earns the full reward
    wrong = [Rollout(sample=s, prompt_ids=(), completion_ids=(), text="Answer: purple", stopped=True,
                     truncated=False) for s in samples]
    assert grader.grade(wrong) == [0.0] * 120
