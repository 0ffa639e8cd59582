"""The house a newcomer walks, read from the source: every module a step imports has its line in
docs/DESIGN.md's table; no function of grpo/phases, grpo/run or the entry point runs past 60 lines; `Run` holds at
most 12 fields; a public name names one thing; from `rl_step` to the line that draws a token is three calls; the
newcomer's questions in DESIGN.md point at the lines that answer them. Each check is also run on a crafted case."""

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
    text = "| module | line |\n|---|---|\n| `grpo_train.py` | x |\n| `grpo/run/record.py`, `grpo/grading/rubrics/` | y |\n"
    assert table_paths(text) == {"grpo_train.py", "grpo/run/record.py", "grpo/grading/rubrics/"}
    assert missing_from_table({"grpo_train", "grpo.run.record", "grpo.run.tracking", "grpo.run"},
                              table_paths(text)) == ["grpo/run/tracking.py"]


# ---------------------------------------------------------------------------------------------- function sizes
def long_functions(source: str, where: str, limit: int = MAX_LINES) -> list[str]:
    """'file:line name (n lines)' for every function or method of `source` longer than `limit` lines."""
    return [f"{where}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)" for n in ast.walk(ast.parse(source))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > limit]


def test_no_function_on_the_steps_path_is_over_60_lines():
    files = sorted((ROOT / "grpo" / "phases").glob("*.py")) + sorted((ROOT / "grpo" / "run").glob("*.py")) + [
        ROOT / "grpo_train.py", ROOT / "grpo" / "models" / "decode.py", ROOT / "grpo" / "models" / "graph_decode.py"]
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
def definitions(files: list[Path]) -> dict[str, list[str]]:
    """Public top-level function and class name -> the modules (file stems with their folder) that define it."""
    out: dict[str, list[str]] = {}
    for p in files:
        for n in ast.parse(p.read_text()).body:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not n.name.startswith("_"):
                out.setdefault(n.name, []).append(str(p.relative_to(ROOT)))
    return out


def _key(name: str) -> str:
    return name.lower().replace("_", "")


def name_clashes(defined: dict[str, list[str]], modules: list[str]) -> list[str]:
    """A public name defined by two modules; a public name that is also the name of a module (case and underscores
    aside) other than the one that defines it (`Scoring` in step_owners.py beside grading/scoring.py)."""
    out = [f"{name} is defined in {where}" for name, where in sorted(defined.items()) if len(where) > 1]
    stems = {}
    for m in modules:
        stems.setdefault(_key(Path(m).stem), []).append(m)
    for name, where in sorted(defined.items()):
        named_after = [m for m in stems.get(_key(name), []) if m not in where]
        if named_after:
            out.append(f"{name} ({', '.join(where)}) has the name of the module {', '.join(named_after)}")
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
    assert hops_to("grpo.models.decode.draw", "lean", tmp_path / "lean", monkeypatch) == [
        "generate", "generate_rollouts", "decode"]
    assert hops_to("grpo.models.graph_decode.keyed_choice", "graph", tmp_path / "graph", monkeypatch)[:3] == [
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


# ---------------------------------------------------------------------------------------------- the faces
FACES = {"the run doctor": ("grpo.run.doctor", tuple(f"grpo.run.doctor.{m}" for m in (
             "verdict", "thresholds", "window_checks", "end_checks", "in_run", "report", "plot"))),
         "TRL's translation": ("grpo.run.trl_cli", ("grpo.run.trl_config", "grpo.run.trl_rows"))}
"""Each: (its face, the modules behind it)."""
MAX_FACE_NAMES = 8
"""A face holds what the loop needs of its wing (the doctor's: its four uses inside a run, the report and the plot)."""


def names_imported(source: str) -> dict[str, set[str]]:
    """Module -> the names `from module import ...` takes from it, anywhere in `source`."""
    out: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.setdefault(node.module, set()).update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            for a in node.names:
                out.setdefault(a.name, set()).add("*")
    return out


def face_breaches(source: str, face: str, behind: tuple[str, ...], public: list[str]) -> list[str]:
    """What `source` takes from behind a face, or from the face beyond its `__all__`."""
    taken = names_imported(source)
    out = [f"{m}: {sorted(taken[m])}" for m in behind if m in taken]
    out += [f"{face}.{n}" for n in sorted(taken.get(face, set()) - set(public))]
    return out


def test_the_loop_sees_the_doctor_and_the_trl_translation_through_one_small_face_each():
    import importlib

    for what, (face, behind) in FACES.items():
        public = importlib.import_module(face).__all__
        assert len(public) <= MAX_FACE_NAMES, (what, public)
        for reader in (ROOT / "grpo_train.py", ROOT / "grpo" / "run" / "api.py"):
            assert not face_breaches(reader.read_text(), face, behind, public), (what, reader.name)


def test_the_face_check_sees_what_goes_behind_or_beyond():
    source = "from a.face import ok, extra\nfrom a.inner import secret\n"
    assert face_breaches(source, "a.face", ("a.inner",), ["ok"]) == ["a.inner: ['secret']", "a.face.extra"]


# ---------------------------------------------------------------------------------------------- one registry pattern
def test_every_choice_by_name_is_one_kind_of_registry():
    """Every config field chosen by name reads a `Registry` (grpo/core/registry.py) named after that field: the
    config check, the errors (the field and the valid names) and --help come from it. Rule graders and KL controllers
    too (checked per task)."""
    from grpo.core.kl_control import KL_CONTROLLERS
    from grpo.core.losses import POLICY_LOSSES
    from grpo.core.registry import Registry
    from grpo.core.rule_graders import GRADERS
    from grpo.run.config_check import REGISTRY_FIELDS, registries_help

    for dotted, registry in REGISTRY_FIELDS.items():
        assert isinstance(registry, Registry) and registry.field == dotted, dotted
        with pytest.raises(ValueError, match=re.escape(dotted) + r".*use one of \["):
            registry.get("no such name")
        assert all(registry.docs[name] for name in registry), dotted  # every name says what it is in --help
    assert isinstance(KL_CONTROLLERS, Registry) and isinstance(GRADERS, Registry) and isinstance(POLICY_LOSSES, Registry)
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
