"""force_update.sh: refuses on a dirty tree, fast-forwards only, and RUNS each bug class's regression tests.

Every test works in a fresh git repository made from a copy of the current working tree (tracked and untracked,
not ignored files), so it sees the files as they are now and never touches this checkout. The git-flow tests use a
stand-in interpreter that records its arguments (fast); the pass/fail tests run the real pytest on the `kl` class.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = "force_update.sh"
FAST_CLASS = "kl"  # pure tensor tests: the quickest class to run for real
PATCHED_TEST = ("tests/test_losses.py", "test_kl_estimators_hand_values")

pytestmark = pytest.mark.skipif(shutil.which("git") is None or shutil.which("bash") is None,
                                reason="needs git and bash")


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def commit_all(repo: Path, message: str) -> None:
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", message)


def make_repo(dest: Path) -> Path:
    """A new repository holding the current working tree's files (tracked + untracked, not ignored), committed."""
    listed = git(ROOT, "ls-files", "-co", "--exclude-standard", "-z").split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file():  # a tracked file deleted in the working tree is listed but absent
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    git(dest, "init", "-q")
    commit_all(dest, "snapshot")
    return dest


def fake_python(folder: Path) -> Path:
    """Stands in for the interpreter: imports succeed, `-m pytest ...` passes and logs its arguments."""
    exe = folder / "fake-python"
    exe.write_text('#!/usr/bin/env bash\n[ "$1" = "-m" ] && echo "$@" >> "$(dirname "$0")/pytest-calls.txt"\nexit 0\n')
    exe.chmod(0o755)
    return exe


def run_script(repo: Path, *args: str, python: Path | str = sys.executable) -> subprocess.CompletedProcess:
    env = {**os.environ, "FORCE_UPDATE_PYTHON": str(python)}
    env.pop("FORCE_UPDATE_ONLY", None)
    env.pop("FORCE_UPDATE_PYTEST_ARGS", None)
    return subprocess.run(["bash", str(repo / SCRIPT), *args], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=300)


def listed_classes(repo: Path) -> dict[str, list[str]]:
    out = run_script(repo, "--list")
    assert out.returncode == 0, out.stderr
    rows = [line.split("\t") for line in out.stdout.splitlines() if line.strip()]
    return {cls: tests.split() for cls, _what, tests in rows}


def test_every_named_regression_test_exists():
    """The script's table must stay true: each file::name it runs is defined in that file."""
    classes = listed_classes(ROOT)
    assert {"backward-twice", "accumulation", "kl", "sampling", "masks", "nan-guard"} <= set(classes)
    for cls, nodes in classes.items():
        for node in nodes:
            path, name = node.split("::")
            text = (ROOT / path).read_text() if (ROOT / path).exists() else ""
            assert re.search(rf"^\s*def {name}\(", text, re.M), f"{cls}: {node} does not exist"


def test_clean_tree_passes_and_a_broken_regression_test_fails(tmp_path):
    repo = make_repo(tmp_path / "repo")
    ok = run_script(repo, "--no-fetch", "--only", FAST_CLASS)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert re.search(rf"^✅ {FAST_CLASS}: ", ok.stdout, re.M)
    assert "summary: ✅ all 1 bug class(es) verified" in ok.stdout
    assert "❌" not in ok.stdout

    # The fix "regresses": one of the class's tests now fails. The script must notice by running it.
    path, name = PATCHED_TEST
    source = (repo / path).read_text()
    patched, n = re.subn(rf"^(def {name}\(.*?\):\n)", r'\1    assert False, "injected regression"\n', source,
                         count=1, flags=re.M | re.S)
    assert n == 1, f"could not find {name} in {path}"
    (repo / path).write_text(patched)
    commit_all(repo, "break a regression test")
    bad = run_script(repo, "--no-fetch", "--only", FAST_CLASS)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert re.search(rf"^❌ {FAST_CLASS}: FAILED", bad.stdout, re.M)
    assert "injected regression" in bad.stdout  # the pytest tail is shown
    assert "summary: ❌ 1 of 1 bug class(es) failed" in bad.stdout


def test_missing_test_is_reported_without_running_anything(tmp_path):
    repo = make_repo(tmp_path / "repo")
    path, name = PATCHED_TEST
    (repo / path).write_text((repo / path).read_text().replace(f"def {name}(", f"def renamed_{name}("))
    commit_all(repo, "rename")
    fake = fake_python(tmp_path)
    out = run_script(repo, "--no-fetch", "--only", FAST_CLASS, python=fake)
    assert out.returncode == 1
    assert f"❌ {FAST_CLASS}: test not found: {path}::{name}" in out.stdout
    assert not (tmp_path / "pytest-calls.txt").exists()


def test_dirty_tree_is_refused_and_left_untouched(tmp_path):
    repo = make_repo(tmp_path / "repo")
    readme = repo / "README.md"
    edited = readme.read_text() + "\nmy local edit\n"
    readme.write_text(edited)
    fake = fake_python(tmp_path)
    out = run_script(repo, python=fake)
    assert out.returncode == 3, out.stdout + out.stderr
    assert "refusing to update" in out.stdout and "README.md" in out.stdout
    assert readme.read_text() == edited  # nothing stashed, reset or cleaned
    assert git(repo, "stash", "list") == ""
    assert not (tmp_path / "pytest-calls.txt").exists()  # stopped before the checks


def origin_and_clone(tmp_path):
    """An upstream repo and a clone of it, both under tmp_path."""
    origin = make_repo(tmp_path / "origin")
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(origin), str(clone))
    return origin, clone


def test_fast_forwards_to_upstream_then_runs_the_checks(tmp_path):
    origin, clone = origin_and_clone(tmp_path)
    (origin / "NEW_FILE.txt").write_text("upstream change\n")
    commit_all(origin, "upstream moves on")
    fake = fake_python(tmp_path)
    out = run_script(clone, "--only", f"{FAST_CLASS},nan-guard", python=fake)
    assert git(clone, "rev-parse", "HEAD") == git(origin, "rev-parse", "HEAD")  # fast-forwarded
    assert (clone / "NEW_FILE.txt").exists()
    assert "fast-forwarded" in out.stdout
    calls = (tmp_path / "pytest-calls.txt").read_text().splitlines()
    assert len(calls) == 2 and "tests/test_losses.py::test_kl_estimators_hand_values" in calls[0]
    assert "tests/test_trainer.py::test_nan_gradient_is_skipped" in calls[1]
    assert out.returncode == 0 and "summary: ✅ all 2 bug class(es) verified" in out.stdout


def test_diverged_branch_is_not_merged(tmp_path):
    origin, clone = origin_and_clone(tmp_path)
    (origin / "A.txt").write_text("a\n")
    commit_all(origin, "upstream commit")
    (clone / "B.txt").write_text("b\n")
    commit_all(clone, "local commit")
    local_head = git(clone, "rev-parse", "HEAD")
    out = run_script(clone, python=fake_python(tmp_path))
    assert out.returncode == 4 and "diverged" in out.stderr
    assert git(clone, "rev-parse", "HEAD") == local_head and not (clone / "A.txt").exists()


def test_no_upstream_is_said_and_the_checks_still_run(tmp_path):
    repo = make_repo(tmp_path / "repo")  # `git init` repo: no remote, no upstream
    out = run_script(repo, "--only", FAST_CLASS, python=fake_python(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no upstream branch is configured" in out.stdout
    assert (tmp_path / "pytest-calls.txt").read_text().count("pytest") == 1


def test_usage_errors(tmp_path):
    out = run_script(ROOT, "--only", "no-such-class")
    assert out.returncode == 2 and "unknown bug class 'no-such-class'" in out.stderr
    assert run_script(ROOT, "--frobnicate").returncode == 2
