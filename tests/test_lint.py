"""The linter in the test command: `ruff check` over the whole tree, with pyproject.toml's rules (pycodestyle,
pyflakes, bugbear, import order; 120 columns), finds nothing; and no Python file of the package, the entry point, the
benchmarks, the scripts or the tests continues a line with a backslash (a parenthesis shows where an expression ends,
and tools that read a file function by function stop at the first backslash). Each check also runs on a crafted case
that fails."""

from __future__ import annotations

import importlib.util
import io
import subprocess
import sys
import tokenize
from itertools import pairwise
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ("grpo", "grpo_train.py", "benchmarks", "scripts", "tests")
"""Where a backslash continuation is refused (paths under the repository root)."""
SKIPPED_FOLDERS = {".venv", "build", "runs", "__pycache__"}
INSTALL = "pip install -r requirements/dev.txt"
NO_BREAK = {tokenize.NEWLINE, tokenize.NL}
"""A token after which the next one may start on a later line without a backslash."""


# ------------------------------------------------------------------------------------------------------------- ruff
def ruff_command() -> list[str]:
    """ruff installed beside this interpreter (a virtual environment's bin/), else `python -m ruff`. ruff is pinned in
    requirements/dev.txt: a missing one fails the test (a linter that is skipped checks nothing)."""
    beside = Path(sys.executable).with_name("ruff")
    if beside.is_file():
        return [str(beside)]
    if importlib.util.find_spec("ruff") is not None:
        return [sys.executable, "-m", "ruff"]
    pytest.fail(f"ruff is not installed for {sys.executable}: {INSTALL} (it pins the linter's version)")


def ruff_findings(paths: list[str], cwd: Path, config: Path | None = None) -> list[str]:
    """`ruff check` on `paths` from `cwd` (its pyproject.toml, or `config`): one line per finding, [] when clean."""
    command = [*ruff_command(), "check", "--no-cache", "--output-format", "concise", "--quiet"]
    if config is not None:
        command += ["--config", str(config)]
    done = subprocess.run([*command, *paths], cwd=cwd, capture_output=True, text=True, timeout=300)
    if done.returncode not in (0, 1):  # 2: ruff itself failed (a bad config, a file it cannot read)
        pytest.fail(f"`{' '.join(command)}` failed ({done.returncode}):\n{done.stderr}")
    return [line for line in done.stdout.splitlines() if line.strip()]


def test_ruff_finds_nothing_in_the_tree():
    findings = ruff_findings(["."], ROOT)
    assert not findings, (f"ruff check found {len(findings)} problems (`ruff check --fix` sorts imports; wrap long "
                          "lines in parentheses; zip(..., strict=True) where the lengths must match):\n"
                          + "\n".join(findings))


def test_ruff_reports_a_crafted_file(tmp_path):
    """The same command, with the repository's config, on a file that breaks one rule of each family: every one is
    reported, so a clean tree means the rules ran."""
    (tmp_path / "bad.py").write_text("import sys\nimport os\n\n\n"
                                     "def pairs(a, b):\n"
                                     "    return list(zip(a, b))\n\n\n"
                                     f"TEXT = '{'x' * 130}'\n")
    findings = ruff_findings(["bad.py"], tmp_path, config=ROOT / "pyproject.toml")
    codes = {line.split()[1] for line in findings}
    assert {"I001", "F401", "B905", "E501"} <= codes, findings


# ------------------------------------------------------------------------------------ backslash continuations
def backslash_continuations(source: str) -> list[int]:
    """The lines of `source` that end in a backslash continuation: a line break with no NL or NEWLINE token between
    two tokens (a backslash inside a string or a comment is not one)."""
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    return [a.end[0] for a, b in pairwise(tokens) if b.start[0] > a.end[0] and a.type not in NO_BREAK]


def python_files(root: Path, checked: tuple[str, ...] = CHECKED) -> list[Path]:
    """The .py files under `root` at the `checked` paths (a file or a folder), virtual environments and build
    outputs left out."""
    out: list[Path] = []
    for name in checked:
        path = root / name
        found = [path] if path.is_file() else sorted(path.rglob("*.py"))
        out += [p for p in found if not SKIPPED_FOLDERS & set(p.relative_to(root).parts)]
    return out


def continued_lines(root: Path, checked: tuple[str, ...] = CHECKED) -> list[str]:
    """'path:line' for every backslash continuation in the checked files."""
    out = []
    for path in python_files(root, checked):
        try:
            lines = backslash_continuations(path.read_text(encoding="utf-8"))
        except (tokenize.TokenError, SyntaxError) as err:
            pytest.fail(f"{path.relative_to(root)} does not tokenize: {err}")
        out += [f"{path.relative_to(root).as_posix()}:{line}" for line in lines]
    return out


def test_no_backslash_continuations():
    found = continued_lines(ROOT)
    assert not found, (f"{len(found)} backslash line continuations (put the expression in parentheses):\n"
                       + "\n".join(found))


def test_the_backslash_check_finds_a_crafted_continuation(tmp_path):
    """A continued assignment and a continued condition are found, at the line that ends in the backslash; a
    backslash at the end of a string's line, in a comment, or escaped in a string, and lines broken inside
    parentheses, are not continuations."""
    source = ('x = 1 + \\\n'            # line 1: a continuation
              '    2\n'
              'TEXT = """a \\\n'         # line 3: inside a string
              'b"""\n'
              'PATH = "C:\\\\"\n'         # line 5: an escaped backslash ends the string
              '# a comment \\\n'          # line 6: a comment
              'y = (1 +\n'
              '     2)\n'
              'if x and \\\n'            # line 9: a continuation
              '        y:\n'
              '    pass\n')
    assert backslash_continuations(source) == [1, 9]
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "bad.py").write_text(source)
    (tmp_path / "pkg" / "good.py").write_text("y = (1 +\n     2)\n")
    (tmp_path / "pkg" / ".venv").mkdir()
    (tmp_path / "pkg" / ".venv" / "site.py").write_text(source)  # not ours: left out
    (tmp_path / "entry.py").write_text(source)
    assert continued_lines(tmp_path, ("pkg", "entry.py")) == ["pkg/bad.py:1", "pkg/bad.py:9", "entry.py:1",
                                                              "entry.py:9"]
