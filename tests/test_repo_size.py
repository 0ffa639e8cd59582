"""The repository carries code and the few records its docs are checked against (STYLE.md rule 15): its tracked
files stay under a size budget, kept run records carry no plots, and their .jsonl records are kept gzipped in the
bytes `benchmarks/dual_ablation.py --keep` writes."""

from __future__ import annotations

import gzip
import subprocess

import pytest

from conftest import ROOT

BUDGET_BYTES = 10_000_000
"""The tree's tracked size (the sum of `git ls-files` file sizes) stays under this: a clone, or a copy of the tree to a
GPU machine beside the wheels a run there needs, stays light (issue #40: 36 MB before, 33.6 MB of it run records)."""
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
    assert not plots, f"plots are regenerated (`python -m grpo.run.plot RUN_DIR`), not kept: {plots}"
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
