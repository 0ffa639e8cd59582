"""The layering of docs/DESIGN.md, read from the source (no import is executed): grpo's sub-packages form a stack and
every import points down it or stays inside its own layer, no modules import each other in a cycle, the config layer
is standard library only, the chunked kernels have one home, decoding does not reach the training forward, and no
entry point imports another.

Every import counts, also one inside a function or under `if TYPE_CHECKING:`: a late import is still a dependency.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("core", "config", "machine", "data", "models", "decoding", "grading", "phases", "run")
"""grpo's sub-packages from the bottom up (docs/DESIGN.md): a module may import its own layer and the ones before it."""
ENTRY_POINTS = {"grpo_train", "check_gpu_memory"}
APART = {("models", "data"): "the models need only core's file plumbing (grpo/core/plumbing.py), not the tasks' rows",
         ("phases", "grading"):
             "the tools import the user's code through core (grpo/core/plumbing.py), not the graders"}
"""Layers that stand one above the other and still do not import each other: importer's layer, imported's -> why."""


def package_modules(root: Path, package: str = "grpo") -> dict[str, Path]:
    """Dotted name -> file of every module of `package` under `root` (a package is named by its __init__.py)."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imported(path: Path, known: set[str], package_of: str) -> set[str]:
    """The modules of `known` that the file at `path` imports anywhere in it (`package_of`: its own package, for
    relative imports). `from a.b import c` names a.b.c when that is a module, else a.b."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package_of.split(".")[: len(package_of.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names)
    return {m for m in found if m in known}


def import_graph(root: Path, package: str = "grpo") -> dict[str, set[str]]:
    """Module -> the package's modules it imports (its own parent packages left out: importing a.b.c runs a/__init__
    and a/b/__init__ first, which is no dependency of c's own)."""
    modules = package_modules(root, package)
    graph = {}
    for name, path in modules.items():
        own = name if path.name == "__init__.py" else name.rpartition(".")[0]
        parents = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        graph[name] = imported(path, set(modules), own) - parents - {name}
    return graph


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """"importer -> imported" for every import of a layer above the importer's, and for every module outside the
    layers (the package's own __init__ aside)."""
    bad = []
    for module, deps in sorted(graph.items()):
        if module == "grpo":
            continue
        here = layer_of(module)
        if here is None:
            bad.append(f"{module}: not in a layer {LAYERS}")
            continue
        for dep in sorted(deps):
            there = layer_of(dep)
            if there is not None and LAYERS.index(there) > LAYERS.index(here):
                bad.append(f"{module} ({here}) -> {dep} ({there})")
    return bad


def apart_imports(graph: dict[str, set[str]]) -> list[str]:
    """"importer -> imported (why)" for every import between two layers that APART keeps apart."""
    return [f"{module} -> {dep} ({APART[layer_of(module), layer_of(dep)]})" for module, deps in sorted(graph.items())
            for dep in sorted(deps) if (layer_of(module), layer_of(dep)) in APART]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


# ----------------------------------------------------------------------------------------------- the real tree
GRAPH = import_graph(ROOT)


def test_every_import_points_down_the_layers():
    assert not upward_imports(GRAPH), upward_imports(GRAPH)


def test_the_models_import_no_data_and_the_phases_no_grading():
    assert not apart_imports(GRAPH), apart_imports(GRAPH)


def test_no_modules_import_each_other_in_a_cycle():
    assert not cycles(GRAPH), cycles(GRAPH)


def test_every_module_lives_in_a_layer_and_every_layer_is_a_package():
    assert {layer_of(m) for m in GRAPH if m != "grpo"} == set(LAYERS)
    assert all((ROOT / "grpo" / layer / "__init__.py").is_file() for layer in LAYERS)
    assert [p.name for p in (ROOT / "grpo").glob("*.py")] == ["__init__.py"]


def imported_names(path: Path) -> set[str]:
    """Every module an import statement of the file names (module level, in a function, under TYPE_CHECKING)."""
    tree = ast.parse(path.read_text())
    return ({n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and not n.level} |
            {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names})


def outside_the_floor(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Core module -> what it imports besides torch, the standard library (sys.stdlib_module_names) and grpo.core."""
    out = {}
    for name, path in modules.items():
        if layer_of(name) != "core":
            continue
        outside = {n for n in imported_names(path) if n.split(".")[0] != "torch" and n.split(".")[0] not in
                   sys.stdlib_module_names and n != "grpo.core" and not n.startswith(("grpo.core.", "__future__"))}
        if outside:
            out[name] = outside
    return out


def test_core_is_a_pure_bottom_floor():
    """grpo/core (records, pure maths and the file and import plumbing) imports only torch, the standard library
    and itself: no numpy, no config, no model code. The clip's rules, which the loss section reads too, live in it
    (core/clip_rules.py), and so does the plumbing the models and the phases share (core/plumbing.py)."""
    assert not outside_the_floor(package_modules(ROOT)), outside_the_floor(package_modules(ROOT))


def test_the_config_layer_imports_no_torch():
    """The config layer (the Config, presets, the command line) imports no torch, and of the other layers only the
    torch-free modules of core (the clip's rules, the plumbing's did_you_mean): the command line and the memory
    estimate's inputs stay light."""
    modules = package_modules(ROOT)
    for name, path in modules.items():
        if layer_of(name) != "config":
            continue
        for imported in imported_names(path):
            assert imported.split(".")[0] not in ("torch", "transformers"), (name, imported)
            if imported.startswith("grpo.") and not imported.startswith("grpo.config"):
                assert layer_of(imported) == "core", (name, imported)
                heavy = {n.split(".")[0] for n in imported_names(modules[imported])} & {"torch", "transformers"}
                assert not heavy, (name, imported)


def reachable(name: str) -> set[str]:
    seen, todo = set(), [name]
    while todo:
        for dep in GRAPH.get(todo.pop(), set()) - seen:
            seen.add(dep)
            todo.append(dep)
    return seen


def test_decoding_does_not_import_the_training_forward():
    """Decoding stands on the model (loading, the calls both share) and never on the training forward (logprobs)."""
    decoding = {m for m in GRAPH if layer_of(m) == "decoding"}
    assert decoding and not {"grpo.models.logprobs"} & set().union(*(reachable(m) for m in decoding))
    assert "grpo.models.model_calls" in reachable("grpo.decoding.decode")  # what both share lives below them


def test_the_chunked_autograd_kernels_have_one_home():
    """Every torch.autograd.Function of the package is in grpo/core/kernels.py; the losses and the training forward
    use them from there."""
    homes = {}
    for path in sorted((ROOT / "grpo").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(ast.unparse(b).endswith("autograd.Function") for b in node.bases):
                homes[node.name] = str(path.relative_to(ROOT))
    assert homes and set(homes.values()) == {"grpo/core/kernels.py"}, homes
    assert "grpo.core.kernels" in GRAPH["grpo.models.logprobs"]


def test_no_entry_point_imports_another():
    tops = {name: ROOT / f"{name}.py" for name in ENTRY_POINTS}
    for name, path in tops.items():
        assert not imported(path, ENTRY_POINTS, "") - {name}, name
    for name, path in package_modules(ROOT).items():
        assert not imported(path, ENTRY_POINTS, name), f"{name} imports an entry point"


# ------------------------------------------------------------------------------- the checks catch what they should
def write_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


BASE = {"grpo/__init__.py": "", **{f"grpo/{layer}/__init__.py": "" for layer in LAYERS},
        "grpo/core/losses.py": "import math\n", "grpo/phases/update.py": "from grpo.core.losses import x\n"}


@pytest.mark.parametrize("bad", [
    {"grpo/core/losses.py": "from grpo.phases.update import update_passes\n"},
    {"grpo/core/losses.py": "def f():\n    from grpo.phases import update\n"},
    {"grpo/core/losses.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import grpo.phases.update\n"},
])
def test_an_upward_import_is_caught_wherever_it_stands(tmp_path, bad):
    write_tree(tmp_path, BASE)
    assert upward_imports(import_graph(tmp_path)) == []
    write_tree(tmp_path, bad)
    assert upward_imports(import_graph(tmp_path)) == ["grpo.core.losses (core) -> grpo.phases.update (phases)"]


def test_a_cycle_inside_one_layer_is_caught(tmp_path):
    write_tree(tmp_path, {**BASE, "grpo/core/doctor.py": "from grpo.core.symptoms import check\n",
                          "grpo/core/symptoms.py": "from grpo.core import losses\n"})
    assert cycles(import_graph(tmp_path)) == []
    write_tree(tmp_path, {"grpo/core/losses.py": "from . import doctor\n"})
    assert cycles(import_graph(tmp_path)) == [["grpo.core.doctor", "grpo.core.losses", "grpo.core.symptoms"]]


def test_a_module_outside_the_layers_is_caught(tmp_path):
    write_tree(tmp_path, {**BASE, "grpo/utils.py": "import os\n"})
    assert upward_imports(import_graph(tmp_path)) == ["grpo.utils: not in a layer " + str(LAYERS)]


def test_an_import_between_layers_kept_apart_is_caught(tmp_path):
    write_tree(tmp_path, {**BASE, "grpo/data/json_rows.py": "import json\n", "grpo/grading/graders.py": "import math\n",
                          "grpo/models/pretrained.py": "from grpo.core import losses\n",
                          "grpo/phases/tools.py": "from grpo.models import pretrained\n"})
    assert apart_imports(import_graph(tmp_path)) == []
    write_tree(tmp_path, {"grpo/models/pretrained.py": "def f():\n    from grpo.data.json_rows import sha256\n",
                          "grpo/phases/tools.py": "from grpo.grading import graders\n"})
    assert [line.split(" (")[0] for line in apart_imports(import_graph(tmp_path))] == [
        "grpo.models.pretrained -> grpo.data.json_rows", "grpo.phases.tools -> grpo.grading.graders"]
    assert upward_imports(import_graph(tmp_path)) == []  # both point down: only APART names them


def test_the_floor_check_names_numpy_config_and_data(tmp_path):
    write_tree(tmp_path,
               {**BASE, "grpo/core/plumbing.py": "import os\nimport torch.nn\nfrom grpo.core import losses\n"})
    assert outside_the_floor(package_modules(tmp_path)) == {}
    write_tree(tmp_path, {"grpo/core/plumbing.py": "import numpy as np\nfrom grpo.config import Config\n"
                                                   "def f():\n    from grpo.data import json_rows\n"})
    assert outside_the_floor(package_modules(tmp_path)) == {"grpo.core.plumbing": {"numpy", "grpo.config",
                                                                                    "grpo.data"}}
