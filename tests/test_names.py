"""No local name shadows a public one: inside a function of the package or an entry point, no parameter,
assignment, loop or `with` target, comprehension variable or nested def takes the name of a public function or class
the same module defines or imports. Read from the source; the check itself is tested on crafted modules."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = {("grpo/config/checks.py", "ConfigError.__init__", "field")}
"""(file, function, name) kept on purpose: `ConfigError(..., field=...)` is the error's public keyword (and its
`.field` attribute), and nothing inside that __init__ calls dataclasses.field."""


def public_names(tree: ast.Module) -> set[str]:
    """The public functions and classes a module defines, and the public names it imports, at module level."""
    names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            names |= {a.asname or a.name for a in node.names}
    return {n for n in names if not n.startswith("_") and n != "*"}


def bound_names(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """Every name `fn` binds: its parameters, stored names and nested defs (its nested functions' too)."""
    a = fn.args
    out = {arg.arg for arg in a.posonlyargs + a.args + a.kwonlyargs + [v for v in (a.vararg, a.kwarg) if v]}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node is not fn:
            out.add(node.name)
    return out


def shadows(source: str, where: str) -> list[str]:
    """"file:line function: name" for every local name of a function that is a public name of its module."""
    tree = ast.parse(source)
    public = public_names(tree)
    found = []

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                qual = f"{prefix}{node.name}"
                found.extend(f"{where}:{node.lineno} {qual}: {name}" for name in sorted(bound_names(node) & public)
                             if (where, qual, name) not in ALLOWED)

    visit(tree.body, "")
    return found


def sources() -> list[Path]:
    return sorted((ROOT / "grpo").rglob("*.py")) + [ROOT / "grpo_train.py", ROOT / "check_gpu_memory.py"]


def test_no_local_name_shadows_a_public_one():
    found = [s for path in sources() for s in shadows(path.read_text(), str(path.relative_to(ROOT)))]
    assert not found, found


def test_the_check_sees_parameters_assignments_loops_and_imports():
    source = ("from os.path import join\n\ndef train(cfg):\n    pass\n\nclass Run:\n    def go(self, train):\n"
              "        pass\n\ndef setup(cfg):\n    for join in []:\n        pass\n    train = 1\n"
              "    return [x for x in ()]\n\ndef fine(cfg):\n    return train(cfg), join('a', 'b')\n")
    assert shadows(source, "m.py") == ["m.py:7 Run.go: train", "m.py:10 setup: join", "m.py:10 setup: train"]
