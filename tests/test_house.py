"""The house a newcomer walks, read from the source: every module a step imports has its line in
docs/DESIGN.md's table; no module of the package runs past 600 lines and no function past 60; `Run` holds at
most 12 fields; a public name names one thing; from `rl_step` to the line that draws a token is three calls; the
newcomer's questions in DESIGN.md point at the lines that answer them; the entry point imports the wings of grpo/run/
through their faces, and the wings load in one order. Each check is also run on a crafted case."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "DESIGN.md"
MAX_LINES = 60
MAX_RUN_FIELDS = 12


# ---------------------------------------------------------------------------------------------- the module table
def module_of(path: Path) -> str:
    """'grpo.run.record' for grpo/run/record.py, 'grpo_train' for grpo_train.py."""
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def path_of(module: str) -> Path | None:
    """The file of a project module, or None for a module outside the project."""
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imported(source: str, module: str) -> set[str]:
    """The project modules `source` (the text of `module`) imports, anywhere in it: `from a.b import c` counts a.b.c
    when that is a module, else a.b."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolved against the importing package
                base = module.split(".")[:-node.level] + ([node.module] if node.module else [])
                stem = ".".join(base)
            else:
                stem = node.module or ""
            names = [f"{stem}.{a.name}" if path_of(f"{stem}.{a.name}") else stem for a in node.names]
        else:
            continue
        found |= {n for n in names if n.split(".")[0] in ("grpo", "grpo_train") and path_of(n)}
    return found


def closure(start: str) -> set[str]:
    """Every project module `start` imports, directly or not (its packages' __init__ included)."""
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # a package runs its __init__ first
        todo += sorted(imported(path_of(module).read_text(), module))
    return seen


def table_paths(text: str) -> set[str]:
    """The files the module table of DESIGN.md names in its first column (| `grpo/x/y.py`, `...` | ... |)."""
    paths = set()
    for line in text.splitlines():
        cells = line.split("|")
        if line.startswith("| `") and len(cells) > 2:
            paths |= set(re.findall(r"`([\w/]+\.py|[\w/]+/)`", cells[1]))
    return paths


def missing_from_table(modules: set[str], paths: set[str]) -> list[str]:
    """The modules (as file paths) that the table lists neither by file nor by folder (a package: `grpo/x/y/`)."""
    out = []
    for module in sorted(modules):
        rel = str(path_of(module).relative_to(ROOT))
        if rel.endswith("__init__.py") and rel != "grpo/grading/rubrics/__init__.py":
            continue  # a package's __init__ is its folder, which the layers section describes
        if rel not in paths and not any(p.endswith("/") and rel.startswith(p) for p in paths):
            out.append(rel)
    return out


def test_every_module_a_step_imports_is_in_designs_module_table():
    step = closure("grpo_train")
    missing = missing_from_table(step, table_paths(DESIGN.read_text()))
    assert not missing, f"docs/DESIGN.md's module table lacks {missing}"
    assert "grpo.phases.tools" in step and "grpo.core.tool_calls" in step  # the closure follows every import


def test_the_table_check_reads_files_and_folders():
    text = ("| module | line |\n|---|---|\n| `grpo_train.py` | x |\n"
            "| `grpo/run/record.py`, `grpo/grading/rubrics/` | y |\n")
    assert table_paths(text) == {"grpo_train.py", "grpo/run/record.py", "grpo/grading/rubrics/"}
    assert missing_from_table({"grpo_train", "grpo.run.record", "grpo.run.tracking", "grpo.run"},
                              table_paths(text)) == ["grpo/run/tracking.py"]


# ---------------------------------------------------------------------------------------------- function sizes
def long_functions(source: str, where: str, limit: int = MAX_LINES) -> list[str]:
    """'file:line name (n lines)' for every function or method of `source` longer than `limit` lines."""
    return [f"{where}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)" for n in ast.walk(ast.parse(source))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > limit]


def test_no_function_of_the_package_is_over_60_lines():
    files = sorted((ROOT / "grpo").rglob("*.py")) + [ROOT / "grpo_train.py"]
    found = [f for p in files for f in long_functions(p.read_text(), str(p.relative_to(ROOT)))]
    assert not found, found


def test_the_size_check_counts_a_function_from_def_to_its_last_line():
    source = "def short():\n    return 1\n\n\ndef long():\n" + "    x = 1\n" * 60 + "    return x\n"
    assert long_functions(source, "m.py") == ["m.py:5 long (62 lines)"]


# ---------------------------------------------------------------------------------------------- the Run record
def test_run_holds_at_most_12_fields():
    from grpo.run.record import Run

    names = [f.name for f in dataclasses.fields(Run)]
    assert len(names) <= MAX_RUN_FIELDS, names


# ---------------------------------------------------------------------------------------------- names
def definitions(files: list[Path], root: Path = ROOT) -> dict[str, list[str]]:
    """Public top-level function, class and type-alias name -> the modules (file stems with their folder) that define
    it. A type alias is a capitalised, not all-capitals name assigned at module level (`Row = tuple[int, dict]`,
    `Row: TypeAlias = ...`, `type Row = ...`): all-capitals names are constants, `T = TypeVar("T")` among them."""
    out: dict[str, list[str]] = {}
    for p in files:
        for n in ast.parse(p.read_text()).body:
            for name in defined_names(n):
                if not name.startswith("_"):
                    out.setdefault(name, []).append(str(p.relative_to(root)))
    return out


def defined_names(node: ast.stmt) -> list[str]:
    """The names a module-level statement defines as a function, a class or a type alias."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if sys.version_info >= (3, 12) and isinstance(node, ast.TypeAlias):
        return [node.name.id]
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
    return [t.id for t in targets if isinstance(t, ast.Name) and t.id[:1].isupper() and not t.id.isupper()]


def _key(name: str) -> str:
    return name.lower().replace("_", "")


def name_clashes(defined: dict[str, list[str]], modules: list[str]) -> list[str]:
    """A public name defined by two modules; a public name that is also the name of a module (case and underscores
    aside) other than the one that defines it (`Scoring` in step_owners.py beside grading/scoring.py); two public
    names that differ only in case (`Draw` beside `draw`)."""
    out = [f"{name} is defined in {where}" for name, where in sorted(defined.items()) if len(where) > 1]
    stems = {}
    for m in modules:
        stems.setdefault(_key(Path(m).stem), []).append(m)
    for name, where in sorted(defined.items()):
        named_after = [m for m in stems.get(_key(name), []) if m not in where]
        if named_after:
            out.append(f"{name} ({', '.join(where)}) has the name of the module {', '.join(named_after)}")
    spellings: dict[str, list[str]] = {}
    for name in sorted(defined):
        spellings.setdefault(name.lower(), []).append(name)
    for names in spellings.values():
        if len(names) > 1:
            out.append(" and ".join(f"{n} ({', '.join(defined[n])})" for n in names) + " differ only in case")
    return out


def owner_method_clashes(owners: list[type], functions: set[str]) -> list[str]:
    """A public method of a step owner that has the name of a public function of the package or the entry point
    (`Updater.train` beside `grpo_train.train`)."""
    return [f"{cls.__name__}.{name}" for cls in owners for name, _ in inspect.getmembers(cls, inspect.isfunction)
            if not name.startswith("_") and name in functions]


def package_files() -> list[Path]:
    return sorted((ROOT / "grpo").rglob("*.py")) + [ROOT / "grpo_train.py"]


def test_a_public_name_names_one_thing():
    from grpo.run.step_owners import Generation, Rewarder, Updater

    files = package_files()
    defined = definitions(files)
    # a package's face and its `python -m` entry: no name is read as theirs (`main` is not __main__.py's)
    modules = [str(p.relative_to(ROOT)) for p in files if p.name not in ("__init__.py", "__main__.py")]
    assert not name_clashes(defined, modules)
    functions = {name for name, where in defined.items() if name[0].islower()}
    assert not owner_method_clashes([Generation, Rewarder, Updater], functions)


def test_the_name_checks_see_twins_module_names_and_owner_methods():
    defined = {"decode": ["a/decode.py", "b/codec.py"], "Scoring": ["run/owners.py"], "Judge": ["g/judge.py"]}
    assert name_clashes(defined, ["a/decode.py", "b/codec.py", "g/scoring.py", "g/judge.py"]) == [
        "decode is defined in ['a/decode.py', 'b/codec.py']",
        "Scoring (run/owners.py) has the name of the module g/scoring.py"]

    class Updater:
        def train(self): ...

        def update(self): ...

    assert owner_method_clashes([Updater], {"train", "setup"}) == ["Updater.train"]


def test_the_name_checks_see_type_aliases_and_names_that_differ_only_in_case(tmp_path):
    files = {"data/bbq.py": "Row = tuple[int, dict]\nMAX_ROWS = 3\nT = 1\n_Private = int\n",
             "run/rows.py": "class Row:\n    pass\n", "phases/generate.py": "class Draw:\n    pass\n",
             "models/sampling.py": "from typing import TypeAlias\nKeys: TypeAlias = list[int]\ndef draw(): ...\n"}
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    defined = definitions(sorted(tmp_path.rglob("*.py")), tmp_path)
    assert defined == {"Row": ["data/bbq.py", "run/rows.py"], "Draw": ["phases/generate.py"],
                       "Keys": ["models/sampling.py"], "draw": ["models/sampling.py"]}
    assert name_clashes(defined, []) == [
        "Row is defined in ['data/bbq.py', 'run/rows.py']",
        "Draw (phases/generate.py) and draw (models/sampling.py) differ only in case"]


# ---------------------------------------------------------------------------------------------- the rollout path
def hops_to(target: str, engine: str, tmp_path: Path, monkeypatch) -> list[str]:
    """The functions called from `rl_step` down to the one named `target`, in a real step of the tiny model with
    rollout.engine=`engine`."""
    import grpo_train as G
    from tests.trainer_helpers import fast_config

    stacks = []
    module, name = target.rsplit(".", 1)
    mod = __import__(module, fromlist=[name])
    real = getattr(mod, name)

    def spy(*args, **kwargs):
        if not stacks:  # the first call is enough: every call comes down the same way
            names, frame = [], sys._getframe(1)
            while frame is not None and frame.f_code.co_name != "rl_step":
                names.append(frame.f_code.co_name)
                frame = frame.f_back
            if frame is not None:
                stacks.append(names[::-1])
        return real(*args, **kwargs)

    monkeypatch.setattr(mod, name, spy)
    run = G.setup(fast_config(tmp_path, f"rollout.engine={engine}", "train.max_steps=1"))
    G.rl_step(run, 1)
    run.tracker.close()
    assert stacks, f"{target} was not called below rl_step"
    return stacks[0]


def test_a_token_is_drawn_three_calls_below_rl_step(tmp_path, monkeypatch):
    """lean: rl_step -> Generation.generate -> generate_rollouts -> decode, whose loop calls the sampler `draw`;
    graph: the same down to decode_graph, whose loop runs the step that samples (GraphStep.sample)."""
    assert hops_to("grpo.decoding.decode.draw", "lean", tmp_path / "lean", monkeypatch) == [
        "generate", "generate_rollouts", "decode"]
    assert hops_to("grpo.decoding.graph_decode.keyed_choice", "graph", tmp_path / "graph", monkeypatch)[:3] == [
        "generate", "generate_rollouts", "decode_graph"]


def calls_below_rl_step(code, tmp_path: Path, *overrides: str) -> list[str]:
    """The functions between `rl_step` and the first call of `code` (a function's __code__), however it is reached
    (a bound partial, a closure), in a real step of the tiny model."""
    import grpo_train as G
    from tests.trainer_helpers import fast_config

    run = G.setup(fast_config(tmp_path, "train.max_steps=1", *overrides))
    stacks: list[list[str]] = []

    def profiler(frame, event, arg):
        if event == "call" and frame.f_code is code and not stacks:
            names = []
            while frame is not None and frame.f_code.co_name != "rl_step":
                names.append(frame.f_code.co_name)
                frame = frame.f_back
            if frame is not None:
                stacks.append(names[::-1])

    sys.setprofile(profiler)
    try:
        G.rl_step(run, 1)
    finally:
        sys.setprofile(None)
        run.tracker.close()
    assert stacks, f"{code.co_name} was not called below rl_step"
    return stacks[0]


def test_the_grpo_clip_is_six_calls_below_rl_step(tmp_path):
    """rl_step -> Updater.update -> update_passes -> _backward -> micro_batch_terms (through the step's bound
    partial) -> the registered clipped loss, bound once per step with the loss section's clip -> the clamp's function.
    The out-of-memory retry is inline in Updater.update, not a layer of its own."""
    from grpo.core import losses

    assert calls_below_rl_step(losses._clipped_policy_loss.__code__, tmp_path) == [
        "update", "update_passes", "_backward", "micro_batch_terms", "loss_fn", "_clipped_policy_loss"]


# ---------------------------------------------------------------------------------------------- the questions
QUESTION_REF = re.compile(r"`(?P<path>[\w/]+\.py)` `(?P<symbol>[\w.]+)`(?: \(`(?P<text>[^`]+)`\))?")
QUESTIONS = ("GRPO clip", "GSPO ratio", "group normalisation", "sampled", "add a loss", "add a reward function",
             "judge retry", "KL coefficient adapt")


def symbol_source(path: Path, symbol: str) -> str | None:
    """The source of `symbol` (a function, class or assigned name; `Class.method` for a method) in the Python file
    `path`, or None when it is not defined there."""
    text = path.read_text()
    body = ast.parse(text).body
    node = None
    def defines(n: ast.stmt, name: str) -> bool:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return n.name == name
        targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
        return any(isinstance(t, ast.Name) and t.id == name for t in targets)

    for part in symbol.split("."):
        node = next((n for n in body if defines(n, part)), None)
        if node is None:
            return None
        body = getattr(node, "body", [])
    return ast.get_source_segment(text, node)


def wrong_refs(text: str) -> list[str]:
    """Each `path` `symbol` (`text`) of the questions section whose file lacks the symbol, or whose symbol's source
    lacks the text."""
    section = text.split("## A newcomer's questions", 1)[1].split("\n## ", 1)[0]
    refs = list(QUESTION_REF.finditer(section))
    out = [] if refs else ["no `path` `symbol` reference found"]
    for m in refs:
        path = ROOT / m["path"]
        source = symbol_source(path, m["symbol"]) if path.is_file() else None
        if source is None or (m["text"] and m["text"] not in source):
            out.append(m.group(0))
    return out


def test_the_newcomers_questions_point_at_the_symbols_that_answer_them():
    text = DESIGN.read_text()
    section = text.split("## A newcomer's questions", 1)[1].split("\n## ", 1)[0]
    for question in QUESTIONS:
        assert question in section, question
    assert len(QUESTION_REF.findall(section)) >= len(QUESTIONS)
    assert not wrong_refs(text)


def test_the_reference_check_resolves_symbols_and_their_text():
    good = ("## A newcomer's questions\n- x: `tests/test_house.py` `wrong_refs` (`QUESTION_REF.finditer`), "
            "`grpo/core/kl_control.py` `BandKL.update`, `tests/test_house.py` `QUESTIONS`\n")
    assert wrong_refs(good) == []
    for bad in ("`tests/test_house.py` `nowhere_here`", "`tests/test_house.py` `wrong_refs` (`not in it`)",
                "`grpo/core/kl_control.py` `BandKL.nothing`", "`grpo/none.py` `x`"):
        assert len(wrong_refs(f"## A newcomer's questions\n- x: {bad}\n")) == 1, bad
    with pytest.raises(IndexError):
        wrong_refs("no section")


# ---------------------------------------------------------------------------------------------- one registry pattern
def test_every_choice_by_name_is_one_kind_of_registry():
    """Every config field chosen by name reads a `Registry` (grpo/core/registry.py) named after that field: the
    config check, the errors (the field and the valid names) and --help come from it. Rule graders and KL controllers
    too (checked per task)."""
    from grpo.core.kl_control import KL_CONTROLLERS
    from grpo.core.losses import POLICY_LOSSES
    from grpo.core.registry import Registry
    from grpo.core.rule_graders import GRADERS
    from grpo.run.assembly.config_check import REGISTRY_FIELDS, registries_help

    for dotted, registry in REGISTRY_FIELDS.items():
        assert isinstance(registry, Registry) and registry.field == dotted, dotted
        with pytest.raises(ValueError, match=re.escape(dotted) + r".*use one of \["):
            registry.get("no such name")
        assert all(registry.docs[name] for name in registry), dotted  # every name says what it is in --help
    assert all(isinstance(r, Registry) for r in (KL_CONTROLLERS, GRADERS, POLICY_LOSSES))
    assert "loss.policy_loss" in REGISTRY_FIELDS and REGISTRY_FIELDS["loss.policy_loss"] is POLICY_LOSSES
    text = registries_help()
    assert all(f"{dotted} (" in text for dotted in REGISTRY_FIELDS if dotted != "loss.policy_loss")


def test_a_registry_refuses_a_name_twice_and_decorates():
    from grpo.core.registry import Registry

    names = Registry("x.choice", "thing")

    @names.register("a", "the first")
    def first():
        """Docstring."""

    names.register("b", value=None)  # None is a value one can register ("auto" has no code of its own)
    assert list(names) == ["a", "b"] and names.get("a") is first and names.get("b") is None
    with pytest.raises(ValueError, match="registered already"):
        names.register("a", value=1)
    assert names.unregister("b") is None and list(names) == ["a"]


# ---------------------------------------------------------------------------------------------- wings and faces
WINGS = ("grpo.run.trl", "grpo.run.checkpoint", "grpo.run.doctor", "grpo.run.assembly")
"""grpo/run/'s sub-packages, each behind its face (its __init__.py: imports and __all__)."""
FACES = (*WINGS, "grpo.phases", "grpo.config")
LOOP_MODULES = {"grpo.run.record", "grpo.run.tracking", "grpo.run.exits", "grpo.run.api", "grpo.run.trainer"}
"""The loop's own modules at grpo/run/'s top: the Run record, tracking (metrics, progress, the step's timer), how a
run ends early, train()'s config, TRL's GRPOTrainer surface (its keywords, callbacks and state). The step's owners are
built by the assembly and reached through the Run."""
BEFORE_TORCH = {"grpo.machine.host_resources", "grpo.models.third_party"}
"""What the entry point calls before torch loads (OpenMP's wait policy, warning filters)."""
MAX_ENTRY_MODULES = 13


def top_level_imports(source: str, module: str) -> list[tuple[str, list[str]]]:
    """(module imported from, names) for each import the module runs when it is imported: its body's, not a
    function's and not one under `if TYPE_CHECKING:`. `from a import b` is ("a", ["b"]), relative imports resolved."""
    out: list[tuple[str, list[str]]] = []

    def visit(body: list[ast.stmt]) -> None:
        for n in body:
            if isinstance(n, ast.Import):
                out.extend((a.name, []) for a in n.names)
            elif isinstance(n, ast.ImportFrom):
                stem = (".".join(module.split(".")[:-n.level] + ([n.module] if n.module else [])) if n.level
                        else n.module)
                out.append((stem, [a.name for a in n.names]))
            elif isinstance(n, ast.If) and "TYPE_CHECKING" not in ast.unparse(n.test):
                visit(n.body)
                visit(n.orelse)
            elif isinstance(n, (ast.Try, ast.With)):
                visit(n.body)

    visit(ast.parse(source).body)
    return out


def face_names(package: str) -> list[str] | None:
    """A package's `__all__` (its face, in its __init__.py) or a module's, or None when it has none."""
    for n in ast.parse(path_of(package).read_text()).body:
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets):
            return list(ast.literal_eval(n.value))
    return None


def entry_point_problems(imports: list[tuple[str, list[str]]]) -> list[str]:
    """What the entry point imports besides the faces: the wings', the phases', the config's, and the `__all__` of
    each of the loop's modules and of what runs before torch; a name outside its face's `__all__`; more than
    MAX_ENTRY_MODULES project modules."""
    out, modules = [], set()
    for module, names in imports:
        if module == "grpo" and names == ["config"]:  # `from grpo import config as C`: the package itself
            module, names = "grpo.config", []
        if not module.startswith("grpo"):
            continue
        modules.add(module)
        if module not in {*FACES, *LOOP_MODULES, *BEFORE_TORCH}:
            out.append(f"{module} is neither a wing's face nor one of the loop's modules")
            continue
        exported = face_names(module)
        if exported is None:
            out.append(f"{module} has no __all__")
        out += [f"{module}.{n} is not in its face's __all__" for n in names if n not in (exported or [])]
    if len(modules) > MAX_ENTRY_MODULES:
        out.append(f"{len(modules)} project modules imported (at most {MAX_ENTRY_MODULES}): {sorted(modules)}")
    return out


def test_the_entry_point_imports_the_wings_faces():
    imports = top_level_imports((ROOT / "grpo_train.py").read_text(), "grpo_train")
    assert not entry_point_problems(imports)
    assert {m for m, _ in imports} >= set(WINGS)  # every wing is reached through its face


def test_the_entry_point_check_names_what_goes_round_a_face():
    imports = [("grpo.run.doctor", ["plot_run"]), ("grpo.run.doctor.plot", ["plot_run"]),
               ("grpo.run.assembly", ["no_such_name"]), ("grpo.run.api", ["deep_merge"]), ("torch", [])]
    assert entry_point_problems(imports) == ["grpo.run.doctor.plot is neither a wing's face nor one of the loop's "
                                             "modules", "grpo.run.assembly.no_such_name is not in its face's __all__",
                                             "grpo.run.api.deep_merge is not in its face's __all__"]


def face_problems(package: str, text: str | None = None, modules: set[str] | None = None) -> list[str]:
    """A face holds a docstring, imports from its own package's modules and `__all__`, nothing else; `__all__`
    lists exactly the names it imports, none of them the name of one of its modules (the name would hide the module:
    `grpo.phases.evaluate` a function, and a test's monkeypatch of the module's names would fail). `text` and
    `modules` (its modules' names) default to the package's own."""
    text = path_of(package).read_text() if text is None else text
    if modules is None:
        modules = {p.stem for p in path_of(package).parent.glob("*.py")}
    body = ast.parse(text).body
    out, imported, exported = [], [], None
    for n in body[1:] if body and isinstance(body[0], ast.Expr) else body:
        if isinstance(n, ast.ImportFrom):
            imported += [a.asname or a.name for a in n.names]
        elif isinstance(n, ast.Assign) and [t.id for t in n.targets if isinstance(t, ast.Name)] == ["__all__"]:
            exported = list(ast.literal_eval(n.value))
        else:
            out.append(f"{package}: line {n.lineno} is neither an import nor __all__")
    out += [f"{package}.{n} hides its module {n}.py" for n in imported if n in modules]
    if exported is None:
        out.append(f"{package} has no __all__")
    elif sorted(exported) != sorted(imported):
        out.append(f"{package}: __all__ {sorted(set(exported) ^ set(imported))} differ from its imports")
    return out


def test_the_face_check_names_code_a_missing_name_and_a_hidden_module():
    text = '"""A wing."""\nfrom w.evaluate import evaluate, part\nX = 1\n__all__ = ["evaluate"]\n'
    assert face_problems("w", text, {"evaluate", "__init__"}) == [
        "w: line 3 is neither an import nor __all__", "w.evaluate hides its module evaluate.py",
        "w: __all__ ['part'] differ from its imports"]


def test_every_face_holds_only_its_imports_and_their_names():
    found = [p for face in FACES for p in face_problems(face)]
    assert not found, found


def wing_of(module: str) -> str:
    """grpo.run.doctor for grpo.run.doctor.report (a wing's module), the module itself elsewhere."""
    parts = module.split(".")
    return ".".join(parts[:3]) if parts[:2] == ["grpo", "run"] and len(parts) > 3 else module


def wing_edges(modules: list[str]) -> dict[str, set[str]]:
    """Which wing or top-level run module imports which, when it is imported (not inside a function, not for types
    only): the order eager faces load in."""
    edges: dict[str, set[str]] = {}
    for module in modules:
        for target, names in top_level_imports(path_of(module).read_text(), module):
            for t in [f"{target}.{n}" if path_of(f"{target}.{n}") else target for n in names] or [target]:
                if t.startswith("grpo.run.") and wing_of(t) != wing_of(module):
                    edges.setdefault(wing_of(module), set()).add(wing_of(t))
    return edges


def a_cycle(edges: dict[str, set[str]]) -> list[str]:
    """One cycle of the graph as a path (first node repeated at its end), or [] when there is none."""
    state: dict[str, int] = {}
    path: list[str] = []

    def walk(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := walk(nxt)):
                return found
        state[node] = 2
        path.pop()
        return []

    for node in sorted(edges):
        if node not in state and (found := walk(node)):
            return found
    return []


def face_users(modules: list[str]) -> list[str]:
    """Modules of the package that import a name through a wing's face instead of from the module that holds it."""
    return [f"{m} imports {t}.{n}" for m in modules for t, names in top_level_imports(path_of(m).read_text(), m)
            for n in names if t in WINGS and not path_of(f"{t}.{n}") and not m.startswith(t)]


def test_the_wings_load_in_one_order_and_import_modules_not_faces():
    modules = [module_of(p) for p in sorted((ROOT / "grpo").rglob("*.py"))]
    assert not a_cycle(wing_edges(modules))
    assert not face_users(modules)
    assert wing_edges(["grpo.run.assembly.owners"])["grpo.run.assembly"] >= {"grpo.run.step_owners"}


def test_the_cycle_check_finds_a_cycle_through_three_wings():
    assert a_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert a_cycle({"a": {"b"}, "b": {"c"}, "d": {"a", "c"}}) == []
    assert wing_of("grpo.run.doctor.report") == "grpo.run.doctor" and wing_of("grpo.run.record") == "grpo.run.record"


# ---------------------------------------------------------------------------------------------- module sizes
MAX_MODULE_LINES = 600


def test_no_module_of_the_package_is_over_600_lines():
    files = sorted((ROOT / "grpo").rglob("*.py")) + [ROOT / "grpo_train.py"]
    found = [f"{p.relative_to(ROOT)} ({n} lines)" for p in files
             if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not found, found
