"""The repository carries code and the few records its docs are checked against (STYLE.md rule 15): its tracked
files stay under a size budget, kept run records carry no plots, and their .jsonl records are kept gzipped in the
bytes `benchmarks/dual_ablation.py --keep` writes. Timings live in RESULTS files beside their command, never in
docstrings (they go stale)."""

from __future__ import annotations

import ast
import gzip
import re
import subprocess

import pytest
from conftest import ROOT

BUDGET_BYTES = 10_000_000
"""The tree's tracked size (the sum of `git ls-files` file sizes) stays under this: a clone, or a copy of the tree to a
GPU machine beside the wheels a run there needs, stays light (run records are what grows it: the checks below)."""
RECORD_FOLDERS = ("benchmarks/results", "docs/runs")


def tracked(*paths: str) -> list[str]:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    done = subprocess.run(["git", "ls-files", "-z", "--", *paths], cwd=ROOT, capture_output=True, text=True, check=True)
    return [name for name in done.stdout.split("\0") if name]


def test_the_tracked_tree_stays_under_its_size_budget():
    sizes = {name: (ROOT / name).stat().st_size for name in tracked() if (ROOT / name).is_file()}
    total = sum(sizes.values())
    largest = sorted(sizes.items(), key=lambda item: -item[1])[:5]
    assert total < BUDGET_BYTES, f"tracked files sum to {total:,} bytes, over {BUDGET_BYTES:,}; largest: {largest}"


def test_kept_run_records_carry_no_plots_and_no_plain_jsonl():
    names = tracked(*RECORD_FOLDERS)
    assert names, f"no tracked files under {RECORD_FOLDERS}"
    plots = [n for n in names if n.endswith(".png")]
    assert not plots, f"plots are regenerated (`python -m grpo.run.doctor plot RUN_DIR`), not kept: {plots}"
    plain = [n for n in names if n.endswith(".jsonl")]
    assert not plain, f"kept .jsonl records go gzipped (benchmarks/dual_ablation.py --keep): {plain}"


def test_gitignore_keeps_plots_of_kept_runs_out():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    paths = [f"{folder}/some-run/plot.png" for folder in RECORD_FOLDERS]
    done = subprocess.run(["git", "check-ignore", "--no-index", *paths], cwd=ROOT, capture_output=True, text=True)
    assert done.stdout.split() == paths


def test_kept_records_are_gzipped_reproducibly():
    """Each kept .jsonl.gz is the bytes `benchmarks/common.gzip_bytes` gives for its text (no name, time 0): the same
    records kept again change nothing in git."""
    from benchmarks.common import gzip_bytes

    packed = [n for n in tracked(*RECORD_FOLDERS) if n.endswith(".jsonl.gz")]
    assert packed
    differ = [n for n in packed
              if gzip_bytes(gzip.decompress((ROOT / n).read_bytes()).decode()) != (ROOT / n).read_bytes()]
    assert not differ, f"not in benchmarks/common.gzip_bytes's form: {differ[:5]}"


TIMING = re.compile(r"\b\d+\.\d+\s?(?:ms|s|min)\b"                        # a measured time: 0.63 s, 28.7 ms
                    r"|\b\d+(?:\.\d+)?\s?(?:ms|s)\s?(?:->|→)|(?:->|→)\s?\d+(?:\.\d+)?\s?(?:ms|s)\b"  # 23 -> 16 s
                    r"|\d(?:\.\d+)?\s?[×x]\s(?:faster|slower|as fast)"     # 1.32× faster
                    r"|\d\s?(?:ms|s) (?:a|per) (?:step|cycle|call)\b")       # ~0.5 ms a step
"""A benchmark timing in prose. Spans in backticks are left out (a command, or an example of a log line)."""


def timings_in_docstrings(source: str) -> list[tuple[int, str]]:
    """(line, the timing and its context) for each TIMING in a docstring of `source`: a module's, a class's, a
    function's, or the string under an assignment (an attribute's docstring)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)  # a list of statements (a lambda's or an if-expression's is one expression)
        for stmt in body if isinstance(body, list) else ():
            doc = stmt.value.value if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) else None
            if isinstance(doc, str):
                text = re.sub(r"`[^`]*`", "``", doc)
                found += [(stmt.lineno, text[max(0, m.start() - 30):m.end() + 10]) for m in TIMING.finditer(text)]
    return found


def test_no_benchmark_timings_in_the_packages_docstrings():
    found = [f"{path.relative_to(ROOT)}:{line}: {context!r}" for path in sorted((ROOT / "grpo").rglob("*.py"))
             for line, context in timings_in_docstrings(path.read_text())]
    assert not found, ("timings go stale in docstrings: move each to the RESULTS file beside the command that "
                       "measured it (benchmarks/RESULTS.md) and point there:\n" + "\n".join(found))


def test_the_timing_check_finds_the_timings_docstrings_once_held():
    """Not vacuous: real timing figures, written as a docstring would state them, are found; a command, a config
    default in whole seconds and an example log line in backticks are not."""
    held = ["generate 4.45 -> 0.75 s per step after a one-off compile", "a step takes 0.63 s looped",
            "costs 28.7 ms instead of 22.5 ms", "forward + backward 1.32× faster kept", "23 -> 16 s CPU",
            "(`create_causal_mask`, ~0.5 ms a step on the CPU)"]
    for text in held:
        assert timings_in_docstrings(f'X = 1\n"""{text}"""\n'), text
    for text in ("stops the run after 300 s", "`python -m benchmarks.real_model_parts --repeats 3`",
                 "e.g. `step 12 | gnorm 1.230 | 4.21s`"):
        assert not timings_in_docstrings(f'def f():\n    """{text}"""\n'), text
