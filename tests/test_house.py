"""The house a newcomer walks, read from the source: every module a step imports has its line in
docs/DESIGN.md's table; no module of the package runs past 600 lines and no function past 60; `Run` holds at
most 12 fields; a public name names one thing; from `rl_step` to the line that draws a token is three calls; the
newcomer's questions in DESIGN.md point at the lines that answer them; every registered policy loss is a def of its
own, no closure; the entry point imports the wings of grpo/run/ through their faces, as namespaces (at most 20 names
from the project), and the wings load in one order. Each check is also run on a crafted case."""

from __future__ import annotations

import ast
import dataclasses
import functools
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
    """lean: rl_step -> Generation.generate -> generate_rollouts -> decode, whose loop calls the one sampler
    `next_token`; graph: the same down to decode_graph, whose loop runs the step that samples (GraphStep.sample)."""
    assert hops_to("grpo.decoding.decode.next_token", "lean", tmp_path / "lean", monkeypatch) == [
        "generate", "generate_rollouts", "decode"]
    assert hops_to("grpo.decoding.graph_decode.next_token", "graph", tmp_path / "graph", monkeypatch)[:3] == [
        "generate", "generate_rollouts", "decode_graph"]


# ---------------------------------------------------------------------------------------------- one sampler
SAMPLER = "next_token"
SAMPLER_CALLERS = {"lean": ("grpo/decoding/decode.py", "decode"),
                   "graph": ("grpo/decoding/graph_decode.py", "GraphStep.sample"),
                   "hf": ("grpo/phases/generate.py", "decode_hf")}
"""Where each engine of rollout.engine draws its tokens: the function that calls `next_token`, itself or through a
logits processor whose __call__ does (generate's)."""
SANITISER = ("grpo/decoding/next_token.py", "sanitised")
SANITISER_MARKS = {"nan_to_num", "NAN_LOGIT", "POSINF_LOGIT", "NEGINF_LOGIT"}
"""What the logit sanitiser is made of: a function of the decoding code (grpo/decoding/, grpo/phases/) that calls
nan_to_num or reads one of its replacement values writes a sanitiser."""


def functions_of(source: str) -> dict[str, ast.FunctionDef]:
    """Every function and method of a module by its qualified name (`Class.method`)."""
    out: dict[str, ast.FunctionDef] = {}

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out[f"{prefix}{node.name}"] = node
                visit(node.body, f"{prefix}{node.name}.")

    visit(ast.parse(source).body, "")
    return out


def called_names(fn: ast.AST) -> set[str]:
    """The names `fn` calls (`f(...)`, `x.f(...)`: f) and reads (`NAN_LOGIT`, `torch.nan_to_num`: the last part)."""
    out = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
    return out


def sampler_problems(sources: dict[str, str], callers: dict[str, tuple[str, str]]) -> list[str]:
    """`next_token` defined anywhere but once; an engine whose sampling function calls neither `next_token` nor a
    class of the package whose __call__ does; the sanitiser's marks in any function of the decoding code but
    SANITISER."""
    functions = {(path, name): fn for path, text in sources.items() for name, fn in functions_of(text).items()}
    defined = sorted(f"{path}:{name}" for path, name in functions if name.rsplit(".", 1)[-1] == SAMPLER)
    out = [] if len(defined) == 1 else [f"{SAMPLER} defined {len(defined)} times: {defined}"]
    sampling_classes = {name.rsplit(".", 1)[0] for (_, name), fn in functions.items()
                        if name.endswith(".__call__") and SAMPLER in called_names(fn)}
    for engine, (path, name) in sorted(callers.items()):
        fn = functions.get((path, name))
        if fn is None:
            out.append(f"{engine}: no {name} in {path}")
        elif not ({SAMPLER} | sampling_classes) & called_names(fn):
            out.append(f"{engine}: {path}:{name} does not draw through {SAMPLER}")
    out += sorted(f"the sanitiser written again in {path}:{name}" for (path, name), fn in functions.items()
                  if path.startswith(("grpo/decoding/", "grpo/phases/")) and (path, name) != SANITISER
                  and SANITISER_MARKS & called_names(fn))
    return out


def test_every_engine_draws_through_the_one_sampler_and_the_sanitiser_is_written_once():
    from grpo.phases.generate import ENGINES

    assert set(ENGINES) - {"auto"} == set(SAMPLER_CALLERS)  # every engine has its line
    sources = {str(p.relative_to(ROOT)): p.read_text() for p in (ROOT / "grpo").rglob("*.py")}
    assert not sampler_problems(sources, SAMPLER_CALLERS)


def test_the_sampler_check_sees_a_second_sampler_an_engine_around_it_and_a_second_sanitiser():
    good = {"grpo/decoding/next_token.py": ("NAN_LOGIT = -1e4\n"
                                            "def sanitised(s):\n    return s.nan_to_num(nan=NAN_LOGIT)\n"
                                            "def next_token(s):\n    return sanitised(s)\n"
                                            "class Processor:\n    def __call__(self, ids, s):\n"
                                            "        return next_token(s)\n"),
            "grpo/decoding/decode.py": "def decode(s):\n    return next_token(s)\n",
            "grpo/phases/generate.py": "def decode_hf(s):\n    return generate(logits_processor=[Processor()])\n"}
    callers = {"lean": ("grpo/decoding/decode.py", "decode"), "hf": ("grpo/phases/generate.py", "decode_hf")}
    assert sampler_problems(good, callers) == []
    twice = {**good, "grpo/decoding/graph_decode.py": ("class GraphStep:\n    def sample(self, s):\n"
                                                       "        return torch.nan_to_num(s).argmax(-1)\n"
                                                       "def next_token(s):\n    return s\n")}
    assert sampler_problems(twice, {**callers, "graph": ("grpo/decoding/graph_decode.py", "GraphStep.sample")}) == [
        "next_token defined 2 times: ['grpo/decoding/graph_decode.py:next_token', "
        "'grpo/decoding/next_token.py:next_token']",
        "graph: grpo/decoding/graph_decode.py:GraphStep.sample does not draw through next_token",
        "the sanitiser written again in grpo/decoding/graph_decode.py:GraphStep.sample"]
    own = {**good, "grpo/phases/generate.py": "def decode_hf(s):\n    return generate(s, do_sample=True)\n"}
    assert sampler_problems(own, callers) == ["hf: grpo/phases/generate.py:decode_hf does not draw through next_token"]
    assert sampler_problems(good, {"lean": ("grpo/decoding/decode.py", "gone")}) == [
        "lean: no gone in grpo/decoding/decode.py"]


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
        "update", "update_passes", "_backward", "micro_batch_terms", "grpo_loss", "_clipped_policy_loss"]


def closure_losses(registry) -> list[str]:
    """Registered policy losses whose function is not a plain module-level def of its own name: a closure or a
    lambda (`<locals>` in its qualified name), a partial or a renamed function (the module does not hold it under
    its `__name__`), or a function registered under two names."""
    out, seen = [], {}
    for name, spec in registry.items():
        fn = spec.fn
        qualname, fn_name = getattr(fn, "__qualname__", ""), getattr(fn, "__name__", "")
        module = sys.modules.get(getattr(fn, "__module__", ""))
        if "<locals>" in qualname or qualname != fn_name or getattr(module, fn_name, None) is not fn:
            out.append(f"{name}: {qualname or repr(fn)} is not a module-level def")
        elif fn_name in seen:
            out.append(f"{name}: {fn_name} is {seen[fn_name]}'s function too")
        seen.setdefault(fn_name, name)
    return out


def test_every_registered_policy_loss_is_a_def_of_its_own():
    from grpo.core.losses import POLICY_LOSSES

    assert not closure_losses(POLICY_LOSSES)


def test_the_loss_check_sees_a_closure_a_partial_and_a_shared_function():
    from grpo.core import losses

    def factory():
        def loss_fn(logps_BT, old_logps_BT, advantages_B, mask_BT):
            return logps_BT, {}
        return loss_fn

    spec = losses.POLICY_LOSSES["grpo"]
    crafted = {"closure": dataclasses.replace(spec, fn=factory()),
               "partial": dataclasses.replace(spec, fn=functools.partial(losses.grpo_loss, clip_low=0.1)),
               "grpo": spec, "twin": spec}
    assert closure_losses(crafted) == [
        "closure: test_the_loss_check_sees_a_closure_a_partial_and_a_shared_function.<locals>.factory.<locals>."
        "loss_fn is not a module-level def", f"partial: {crafted['partial'].fn!r} is not a module-level def",
        "twin: grpo_loss is grpo's function too"]


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
run ends early, train()'s config, TRL's GRPOTrainer surface (its keywords, callbacks and state). The step's owners
are built by the assembly and reached through the Run."""
BEFORE_TORCH = {"grpo.machine.host_resources", "grpo.models.third_party"}
"""What the entry point calls before torch loads (OpenMP's wait policy, warning filters)."""
MAX_ENTRY_MODULES = 13
MAX_ENTRY_NAMES = 20
"""Names the entry point takes from the project: the wings are read as namespaces (`checkpoint.save_checkpoint`),
as the config is (`C.Config`), so a reader of grpo_train.py sees where each call goes."""


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


def as_namespaces(imports: list[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
    """`from grpo.run import checkpoint, doctor` as ("grpo.run.checkpoint", []), ("grpo.run.doctor", []): a module
    imported whole, read as a namespace; other imports as they are."""
    out: list[tuple[str, list[str]]] = []
    for module, names in imports:
        whole = [n for n in names if module.startswith("grpo") and path_of(f"{module}.{n}") is not None]
        out += [(f"{module}.{n}", []) for n in whole]
        if len(whole) < len(names) or not names:
            out.append((module, [n for n in names if n not in whole]))
    return out


def entry_point_names(imports: list[tuple[str, list[str]]]) -> int:
    """How many names the entry point takes from the project: each name a `from` import binds, 1 for a module."""
    return sum(len(names) or 1 for module, names in imports if module.startswith("grpo") or module == "grpo_train")


def entry_point_problems(imports: list[tuple[str, list[str]]]) -> list[str]:
    """What the entry point imports besides the faces: the wings', the phases', the config's, and the `__all__` of
    each of the loop's modules and of what runs before torch; a name outside its face's `__all__`; more than
    MAX_ENTRY_MODULES project modules; more than MAX_ENTRY_NAMES names from the project."""
    out, modules = [], set()
    names_taken = entry_point_names(imports)
    for module, names in as_namespaces(imports):
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
    if names_taken > MAX_ENTRY_NAMES:
        out.append(f"{names_taken} names imported from the project (at most {MAX_ENTRY_NAMES}): import a wing as a "
                   "namespace (`from grpo.run import checkpoint`) and call `checkpoint.save_checkpoint(...)`")
    return out


def test_the_entry_point_imports_the_wings_faces():
    imports = top_level_imports((ROOT / "grpo_train.py").read_text(), "grpo_train")
    assert not entry_point_problems(imports)
    assert {m for m, _ in as_namespaces(imports)} >= set(WINGS)  # every wing is reached through its face
    assert entry_point_names(imports) <= MAX_ENTRY_NAMES


def test_the_entry_point_check_counts_the_names_taken_from_the_project():
    """A wing read as a namespace is one name; the same wing's functions imported one by one are one name each."""
    assert as_namespaces([("grpo.run", ["checkpoint", "doctor"]), ("grpo", ["config"]), ("torch", [])]) == [
        ("grpo.run.checkpoint", []), ("grpo.run.doctor", []), ("grpo.config", []), ("torch", [])]
    one_by_one = [("grpo.run.checkpoint", face_names("grpo.run.checkpoint")[:MAX_ENTRY_NAMES + 1])]
    assert len(one_by_one[0][1]) == MAX_ENTRY_NAMES + 1
    assert entry_point_problems(one_by_one) == [
        f"{MAX_ENTRY_NAMES + 1} names imported from the project (at most {MAX_ENTRY_NAMES}): import a wing as a "
        "namespace (`from grpo.run import checkpoint`) and call `checkpoint.save_checkpoint(...)`"]
    assert not entry_point_problems([("grpo.run", ["checkpoint", "doctor", "assembly", "trl"])])


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


# ------------------------------------------------------------------------------------------ benchmarks/ and scripts/
TOOL_FOLDERS = ("benchmarks", "scripts")
"""The repository's tools, run as modules (`python -m benchmarks.gpu_check`): held to the package's sizes, not to its
face rules."""


def tool_files(root: Path) -> list[Path]:
    """Every module of the tools' folders under `root`."""
    return [p for folder in TOOL_FOLDERS for p in sorted((root / folder).rglob("*.py"))]


def oversized(files: list[Path], root: Path) -> list[str]:
    """'path (n lines)' for each module over MAX_MODULE_LINES, 'path:line name (n lines)' for each function over
    MAX_LINES."""
    found = []
    for p in files:
        source, where = p.read_text(), str(p.relative_to(root))
        if (n := len(source.splitlines())) > MAX_MODULE_LINES:
            found.append(f"{where} ({n} lines)")
        found += long_functions(source, where)
    return found


def test_benchmarks_and_scripts_are_within_the_package_sizes():
    files = tool_files(ROOT)
    assert ROOT / "benchmarks" / "gpu_check.py" in files and ROOT / "scripts" / "reliability_probe.py" in files
    found = oversized(files, ROOT)
    assert not found, f"split these as grpo/'s modules are (600 lines a module, 60 a function): {found}"


def test_the_tool_size_check_finds_a_long_module_and_a_long_function(tmp_path):
    crafted = {"benchmarks/long.py": "x = 1\n" * (MAX_MODULE_LINES + 1),
               "scripts/deep/long_main.py": "def main():\n" + "    x = 1\n" * MAX_LINES + "    return x\n",
               # at the limits: a 600-line module whose function runs 60 lines
               "benchmarks/fits.py": "x = 1\n" * (MAX_MODULE_LINES - MAX_LINES) + "def f():\n"
                                     + "    x = 1\n" * (MAX_LINES - 1),
               "grpo/elsewhere.py": "x = 1\n" * (MAX_MODULE_LINES + 1)}  # not a tool: the package's own test
    for rel, text in crafted.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert oversized(tool_files(tmp_path), tmp_path) == [f"benchmarks/long.py ({MAX_MODULE_LINES + 1} lines)",
                                                         f"scripts/deep/long_main.py:1 main ({MAX_LINES + 2} lines)"]


def sys_path_edits(source: str, where: str) -> list[str]:
    """'file:line' for each statement of `source` that changes the import path: a method called on sys.path (insert,
    append, ...), sys.path or a slice of it assigned or added to, `from sys import path`, or site.addsitedir. Reading
    it (`x in sys.path`, `list(sys.path)`) is no edit."""
    def is_sys_path(node: ast.AST) -> bool:
        node = node.value if isinstance(node, ast.Subscript) else node
        return (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
                and node.value.id == "sys")

    found = []
    for n in ast.walk(ast.parse(source)):
        edits = (
            isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and (is_sys_path(n.func.value) and n.func.attr != "index" and n.func.attr != "count"
                 or n.func.attr == "addsitedir" and isinstance(n.func.value, ast.Name) and n.func.value.id == "site"))
        edits |= isinstance(n, ast.Assign) and any(is_sys_path(t) for t in n.targets)
        edits |= isinstance(n, (ast.AugAssign, ast.AnnAssign)) and is_sys_path(n.target)
        edits |= isinstance(n, ast.ImportFrom) and n.module == "sys" and any(a.name == "path" for a in n.names)
        if edits:
            found.append(f"{where}:{n.lineno}")
    return found


def test_no_sys_path_edits_in_the_package_benchmarks_or_scripts():
    """README installs the checkout; the tools run as modules from its root: nothing edits the import path."""
    files = sorted((ROOT / "grpo").rglob("*.py")) + [ROOT / "grpo_train.py"] + tool_files(ROOT)
    found = [f for p in files for f in sys_path_edits(p.read_text(), str(p.relative_to(ROOT)))]
    assert not found, f"run the tool as a module (`python -m benchmarks.x`) instead of editing sys.path: {found}"


def test_the_sys_path_check_finds_each_way_of_editing_it(tmp_path):
    edits = ["sys.path.insert(0, str(ROOT))", "sys.path.append('..')", "sys.path[:0] = ['..']",
             "sys.path += ['..']", "sys.path = ['..']", "from sys import path", "site.addsitedir('..')",
             "sys.path.extend(['..'])"]
    reads = ["if str(ROOT) not in sys.path:\n    pass", "before = list(sys.path)", "'sys.path.insert(0, ROOT)'",
             "i = sys.path.index('..')", "path.insert(0, 'x')  # a local list named path"]
    (tmp_path / "scripts").mkdir()
    for i, line in enumerate(edits + reads):
        (tmp_path / "scripts" / f"m{i:02d}.py").write_text(f"import site\nimport sys\n{line}\n")
    found = [f for p in tool_files(tmp_path) for f in sys_path_edits(p.read_text(), p.name)]
    assert found == [f"m{i:02d}.py:3" for i in range(len(edits))]
