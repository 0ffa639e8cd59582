"""The layering of docs/DESIGN.md, read from the source (module-level imports, no import is executed): config.py
is the bottom layer, the chunked kernels have one home, decoding does not reach the training forward, and no entry
point imports another."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENTRY_POINTS = {"grpo_train", "check_gpu_memory"}


def module_path(name: str) -> Path:
    return ROOT / (name.replace(".", "/") + ".py")


def imports(name: str, top_level_only: bool = True) -> set[str]:
    """Project modules `name` imports (module level only unless told otherwise; function-local imports run late)."""
    tree = ast.parse(module_path(name).read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if module_path(m).is_file()}


def reachable(name: str) -> set[str]:
    """Every project module `name` pulls in at import time, transitively."""
    seen, todo = set(), [name]
    while todo:
        for dep in imports(todo.pop()) - seen:
            seen.add(dep)
            todo.append(dep)
    return seen


def test_config_is_the_bottom_layer():
    """config.py (and the presets / command-line modules beside it) import no grpo module and no torch."""
    for name in ("config", "presets", "command_line"):
        tree = ast.parse(module_path(name).read_text())
        names = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module} | \
            {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert not {n for n in names if n.split(".")[0] in ("grpo", "torch", "transformers")}, (name, names)


def test_decoding_does_not_import_the_training_forward():
    assert "grpo.logprobs" not in reachable("grpo.decode") | reachable("grpo.steppers")
    assert "grpo.model_calls" in reachable("grpo.decode")  # what both share lives below them


def test_the_chunked_autograd_kernels_have_one_home():
    """Every torch.autograd.Function of the package is in grpo/kernels.py; the losses and the training forward use
    them from there."""
    homes = {}
    for path in sorted((ROOT / "grpo").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(ast.unparse(b).endswith("autograd.Function") for b in node.bases):
                homes[node.name] = path.name
    assert homes and set(homes.values()) == {"kernels.py"}, homes
    assert "grpo.kernels" in imports("grpo.logprobs")


def test_no_entry_point_imports_another():
    for name in ENTRY_POINTS:
        assert not imports(name, top_level_only=False) & (ENTRY_POINTS - {name}), name
    assert not any(imports(m.stem if m.parent == ROOT else f"grpo.{m.stem}", top_level_only=False) & ENTRY_POINTS
                   for m in [*(ROOT / "grpo").glob("*.py"), ROOT / "config.py"])
