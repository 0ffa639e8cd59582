"""scripts/results_table.py: the demo's results table (docs/RESULTS.md) comes from real runs.

The fast tests check the script's rows against a run folder worked out by hand and that docs/RESULTS.md's table has the
script's format. The slow one runs the demo for seeds 0-2 (about a minute each on 2 CPU cores) and checks that the
committed table holds the rewards the committed code produces (within two held-out prompts: other CPUs'
float kernels may flip a greedy answer); the wall-time column differs from run
to run and is only checked for its format. Regenerate the table with `python -m scripts.results_table --write`.
"""

from __future__ import annotations

import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import ROOT
from conftest import load_script as _load

RT = _load("scripts/results_table.py")


def fake_run(folder, seed, evals, seconds):
    folder.mkdir(parents=True)
    (folder / "eval.json").write_text(json.dumps(evals))
    (folder / "config.json").write_text(json.dumps({"train": {"seed": seed}}))
    (folder / "report.json").write_text(json.dumps({"summary": {"host_peak_gb": 1.234}}))
    os.utime(folder / "config.json", (1_000, 1_000))
    os.utime(folder / "report.json", (1_000 + seconds, 1_000 + seconds))
    return folder


def test_rows_from_a_run_folder(tmp_path):
    evals = {"before_sft": {"halu": 0.0, "fair": 0.25}, "after_sft": {"halu": 0.5, "fair": 0.515625},
             "step_20": {"halu": 0.75, "fair": 0.5}, "after_rl": {"halu": 1.0, "fair": 0.46875}}
    rows = RT.table_rows(fake_run(tmp_path / "r", 7, evals, 48.4))
    # tasks sorted; gain = after RL - after SFT; the time (report.json - config.json mtime) and the report's peak host
    # memory on the first row only
    assert rows == ["| 7 | fair | 0.250 | 0.516 | 0.469 | -0.047 | 48 s | 1.23 GB |",
                    "| 7 | halu | 0.000 | 0.500 | 1.000 | +0.500 | | |"]
    (tmp_path / "r" / "report.json").write_text("{}")  # a run that predates the figure
    os.utime(tmp_path / "r" / "report.json", (1_000 + 48.4, 1_000 + 48.4))
    assert RT.table_rows(tmp_path / "r")[0].endswith("| 48 s | - |")
    with pytest.raises(ValueError, match=r"no \['after_rl'\] phase"):
        RT.table_rows(fake_run(tmp_path / "unfinished", 7, {"before_sft": {}, "after_sft": {}}, 1))


def test_the_docs_table_has_the_scripts_format():
    text = RT.doc_table(RT.TABLE_DOC.read_text())
    lines = text.splitlines()
    assert lines[:2] == [RT.HEADER, RT.RULE]
    assert [row[:2] for row in RT.rewards_only(text)] == [[str(s), t] for s in RT.SEEDS
                                                          for t in ("fairness", "hallucination")]
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        before, sft, rl, gain = (float(c) for c in cells[2:6])
        assert abs(gain - (rl - sft)) <= 0.0011  # after RL - after SFT (each cell rounded on its own)
        assert RT.TIME_CELL.match(cells[6]), f"time cell {cells[6]!r}"
        assert RT.MEMORY_CELL.match(cells[7]), f"memory cell {cells[7]!r}"


def test_the_demo_table_stands_in_one_place_that_write_targets():
    """The demo's table stands in docs/RESULTS.md alone (the README leads a user in one screen); a copy in the
    README would drift from the one --write rewrites. (The README's table of the tool preset has the same
    columns and other tasks.)"""
    assert RT.TABLE_DOC == ROOT / "docs" / "RESULTS.md" and RT.HEADER in RT.TABLE_DOC.read_text().splitlines()
    readme = (ROOT / "README.md").read_text()
    assert not any(f"| {seed} | {task} |" in readme for seed in RT.SEEDS for task in ("fairness", "hallucination"))


TOOLS_RUNS = ROOT / "docs" / "runs" / "smollm2-tools"
"""The kept records of `python grpo_train.py --preset smollm2-tools --seed N`, N = 0, 1, 2."""


def test_the_readme_tools_table_is_the_kept_runs_of_the_committed_preset():
    """README's table of `--preset smollm2-tools` holds the rewards `scripts/results_table.py --runs` reads from the
    kept run folders, and those runs are of the preset as committed (a changed preset without a rerun fails here)."""
    from grpo import config as C

    runs = [TOOLS_RUNS / f"seed{seed}" for seed in RT.SEEDS]
    readme = (ROOT / "README.md").read_text().splitlines()
    start = readme.index(RT.HEADER)
    end = next(i for i in range(start, len(readme) + 1) if i == len(readme) or not readme[i].startswith("|"))
    committed = "\n".join(readme[start:end])
    assert RT.rewards_only(committed) == RT.rewards_only(RT.table(runs))
    for line in committed.splitlines()[2::2]:  # each seed's first row carries the run's wall time
        seconds = int(line.strip("|").split("|")[6].strip().removesuffix(" s"))
        assert seconds <= 30 * 60, f"{line}: the issue's budget is 30 min a run on 2 CPU cores"
    for seed, run in zip(RT.SEEDS, runs, strict=True):
        kept = json.loads((run / "config.json").read_text())
        now = C.to_dict(C.load_config("smollm2-tools", [f"train.seed={seed}", f"train.run_name=seed{seed}",
                                                         f"train.output_dir={kept['train']['output_dir']}"]))
        assert without_newer_defaults(json.loads(json.dumps(now)), kept, C.to_dict(C.Config())) == kept, (
            f"{run}: not a run of the committed preset; rerun it")


def without_newer_defaults(now: dict, kept: dict, defaults: dict) -> dict:
    """`now` less the fields the kept config.json predates that are at their default (e.g.
    checkpoint.final_model_dir): a field added later and left at its default cannot have changed the kept run."""
    out = {}
    for key, value in now.items():
        if key not in kept:
            if key in defaults and json.loads(json.dumps(defaults[key])) == value:
                continue
            out[key] = value
        elif isinstance(value, dict) and isinstance(kept[key], dict):
            out[key] = without_newer_defaults(value, kept[key], defaults.get(key) if isinstance(defaults.get(key),
                                                                                                dict) else {})
        else:
            out[key] = value
    return out


def test_rewards_differ_allows_two_prompts_and_no_more():
    row = "| 0 | a | 0.000 | {} | 1.000 | +0.500 | 5 s | 1.00 GB |"
    table = lambda cell: RT.HEADER + "\n" + RT.RULE + "\n" + row.format(cell)  # noqa: E731
    assert RT.rewards_differ(table("0.500"), table("0.531")) == []  # 2/64 = 0.03125
    assert RT.rewards_differ(table("0.500"), table("0.547")) == ["seed 0 a: ['0.000', '0.500', '1.000', '+0.500'] vs "
                                                                 "['0.000', '0.547', '1.000', '+0.500']"]


def test_write_replaces_only_the_table():
    text = ("intro\n\n" + RT.HEADER + "\n" + RT.RULE
            + "\n| 0 | a | 0.000 | 0.100 | 0.200 | +0.100 | 5 s | 1.00 GB |\n\nafter\n")
    new = RT.HEADER + "\n" + RT.RULE + "\n| 0 | a | 0.000 | 0.100 | 0.900 | +0.800 | 6 s | 1.10 GB |"
    assert RT.replace_table(text, new) == "intro\n\n" + new + "\n\nafter\n"


def demo_runs(out: Path) -> list[Path]:
    """`python grpo_train.py --seed N` for N = 0, 1, 2 into `out`, by the script's own runner. The three go at once,
    each in its own process and folder with the thread count the script gives it: a run's numbers depend on its seed
    and its thread count, not on what else the machine runs, and a tiny model's run keeps less than two cores busy,
    so together they end sooner than one after another."""
    with ThreadPoolExecutor(len(RT.SEEDS)) as pool:
        return list(pool.map(lambda seed: RT.run_demo(seed, out), RT.SEEDS))


@pytest.mark.slow
def test_the_docs_table_is_what_the_committed_code_produces(tmp_path):
    """The demo for seeds 0, 1, 2 (`demo_runs`): every reward cell of the committed table is what they produce."""
    runs = demo_runs(tmp_path)
    produced = RT.table(runs)
    committed = RT.doc_table(RT.TABLE_DOC.read_text())
    assert not RT.rewards_differ(produced, committed), (
        "docs/RESULTS.md's demo table is not what the code produces; regenerate it with "
        f"`{sys.executable} -m scripts.results_table --write`. Produced:\n{produced}")


def test_part_rows_average_each_grader_per_phase(tmp_path):
    folder = fake_run(tmp_path / "r", 3, {}, 1)
    (folder / "evals").mkdir()
    rows = {"before_sft": [("fair", {"bbq_rule": 0.0, "format": 0.0}), ("fair", {"bbq_rule": 1.0, "format": 0.0})],
            "after_sft": [("fair", {"bbq_rule": 1.0, "format": 0.5}), ("fair", {"bbq_rule": None, "format": 1.0})]}
    for phase, kept in rows.items():
        (folder / "evals" / f"{phase}.jsonl").write_text(
            "".join(json.dumps({"task": t, "parts": parts}) + "\n" for t, parts in kept))
    # phases present only; a None part is left out of its mean (bbq_rule after SFT: 1.0 from one row)
    assert RT.part_rows(folder) == ["| 3 | fair | bbq_rule | 0.500 | 1.000 |", "| 3 | fair | format | 0.000 | 0.750 |"]


def test_a_field_newer_than_the_kept_config_counts_only_off_its_default():
    kept = {"checkpoint": {"every": 0}}
    defaults = {"checkpoint": {"every": 0, "final_model_dir": ""}}
    assert without_newer_defaults({"checkpoint": {"every": 0, "final_model_dir": ""}}, kept, defaults) == kept
    assert without_newer_defaults({"checkpoint": {"every": 0, "final_model_dir": "out"}}, kept, defaults) != kept
