"""What the RL phase of a dual-objective run (BBQ + HaluEval recognition) did, per run and per variant: the table of
benchmarks/RESULTS.md's "Dual objective on SmolLM2" section.

    python -m benchmarks.dual_ablation --runs DIR [DIR ...]            # finished run folders -> the table
    python -m benchmarks.dual_ablation --runs DIR [DIR ...] --phases   # each measure before SFT, after SFT, after RL
                                                                       # (seed mean, min-max); --short: the summary's
    python -m benchmarks.dual_ablation --runs DIR [DIR ...] --against preset  # each variant minus preset, seed by seed
    python -m benchmarks.dual_ablation --runs DIR [DIR ...] --letters  # what always answering one letter scores
    python -m benchmarks.dual_ablation --runs DIR [DIR ...] --regrade  # BBQ accuracy as recorded and as this
                                                                       # checkout's bbq_rule grades the same replies
    python -m benchmarks.dual_ablation --out DIR --seeds 0 1 2 \\
        --variant base= --variant lr3e-4="--train.lr 3e-4"               # runs each variant x seed, then the table
        [--common "--preset smollm2-dual ..."]                           # flags every variant shares
    python -m benchmarks.dual_ablation --runs DIR ... --keep DEST      # also copy each run's records to DEST/<run>
                                                                       # (the .jsonl records gzipped, as git keeps them)
    python -m benchmarks.dual_ablation --runs KEPT ... --unpack DEST   # a kept copy back as a plain run folder, for
                                                          # `python -m grpo.run.doctor plot DEST/<run>` (curves)

Every figure is the RL phase's: after SFT -> after RL (before SFT -> after RL for a run without SFT, sft.steps 0),
greedy held-out answers, graded by gold labels (measures.json, written by every evaluation):
  BBQ acc      pooled accuracy over ambiguous and disambiguated rows, (n_a·acc_a + n_d·acc_d) / (n_a + n_d)
  acc_a, acc_d accuracy in ambiguous / disambiguated contexts (Parrish et al. 2022)
  |s_AMB|      the ambiguous-context bias score's magnitude (0 = no bias)
  BA           HaluEval recognition balanced accuracy (mean of the recall of "yes" and of "no")
  RL min       minutes of the RL steps (Σ time/step in metrics.jsonl); run min: the whole run, from config.json
               (written at start-up) to report.json (written at the end), or a kept copy's timing.json
  gain/RL-min  (Δ BBQ acc + Δ BA) / RL minutes
The last column checks the success bar per run: BBQ acc +0.10 (a), |s_AMB| not up and acc_d not down (s),
BA +0.10 (h), no collapse finding at the end (c), verdict green (g); a letter is shown when met.
Runs use OMP_NUM_THREADS=2 unless it is set (2 CPU cores).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import GZ, has_record, read_record, write_packed

ROOT = Path(__file__).resolve().parents[1]

BAR = 0.10
"""The success bar: the RL phase raises BBQ accuracy and the recognition balanced accuracy by at least this."""
COLLAPSE_CODES = ("answer_collapse", "heldout_collapse")
HEADER = ("| run | seed | BBQ acc | Δ acc | Δ acc_a | Δ acc_d | \\|s_AMB\\| | BA | Δ BA | RL min | run min "
          "| gain/RL-min | verdict | bar |")
RULE = "|" + "---|" * 14


def pooled_accuracy(bbq: dict[str, Any]) -> float | None:
    """Accuracy over ambiguous and disambiguated rows together (a measures.json BBQ "overall" entry)."""
    n_a, n_d = bbq.get("n_ambig") or 0, bbq.get("n_disambig") or 0
    if n_a + n_d == 0 or bbq.get("acc_ambig") is None or bbq.get("acc_disambig") is None:
        return None
    return (n_a * bbq["acc_ambig"] + n_d * bbq["acc_disambig"]) / (n_a + n_d)


def _overall(measures: dict[str, Any], phase: str, kind: str) -> dict[str, Any] | None:
    by_task = measures.get(phase, {}).get(kind, {})
    return next(iter(by_task.values()))["overall"] if by_task else None


def rl_phase(measures: dict[str, Any], report: dict[str, Any], metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """The RL phase's figures of one run (see the module docstring) from its measures.json, report.json and the rows
    of metrics.jsonl."""
    out: dict[str, Any] = {}
    start = "after_sft" if "after_sft" in measures else "before_sft"  # a run without SFT: RL starts from the base
    sft, rl = _overall(measures, start, "bbq"), _overall(measures, "after_rl", "bbq")
    if sft and rl:
        out["acc"] = (pooled_accuracy(sft), pooled_accuracy(rl))
        out["acc_ambig"] = (sft["acc_ambig"], rl["acc_ambig"])
        out["acc_disambig"] = (sft["acc_disambig"], rl["acc_disambig"])
        out["abs_s_amb"] = tuple(None if m["s_amb"] is None else abs(m["s_amb"]) for m in (sft, rl))
        out["always_unknown"] = rl.get("always_unknown", False)
    rsft, rrl = _overall(measures, start, "recognition"), _overall(measures, "after_rl", "recognition")
    if rsft and rrl:
        out["ba"] = (rsft["balanced_accuracy"], rrl["balanced_accuracy"])
    rl_seconds = sum(r["time/step"] for r in metrics if "time/step" in r)
    out["rl_minutes"] = rl_seconds / 60
    out["verdict"] = report.get("verdict")
    out["collapse"] = sorted({f["code"] for f in report.get("findings", ()) if f.get("code") in COLLAPSE_CODES})
    return out


def delta(pair: tuple[float | None, float | None] | None) -> float | None:
    if not pair or pair[0] is None or pair[1] is None:
        return None
    return pair[1] - pair[0]


def bar_letters(f: dict[str, Any]) -> str:
    """The parts of the success bar this run meets (module docstring), as letters."""
    d_acc, d_ba, d_d = delta(f.get("acc")), delta(f.get("ba")), delta(f.get("acc_disambig"))
    s = f.get("abs_s_amb")
    met = {
        "a": d_acc is not None and d_acc >= BAR - 1e-9,
        "s": s is not None and None not in s and s[1] <= s[0] + 1e-9 and d_d is not None and d_d >= -1e-9,
        "h": d_ba is not None and d_ba >= BAR - 1e-9,
        "c": not f.get("collapse") and not f.get("always_unknown"),
        "g": f.get("verdict") == "green",
    }
    return "".join(k if ok else "·" for k, ok in met.items())


def gain_per_minute(f: dict[str, Any]) -> float | None:
    gains = [d for d in (delta(f.get("acc")), delta(f.get("ba"))) if d is not None]
    return sum(gains) / f["rl_minutes"] if gains and f.get("rl_minutes") else None


def _num(x: float | None, signed: bool = False) -> str:
    return "–" if x is None else (f"{x:+.3f}" if signed else f"{x:.3f}")


def _arrow(pair: tuple[float | None, float | None] | None) -> str:
    return "–" if not pair else f"{_num(pair[0])} → {_num(pair[1])}"


def read_run(run_dir: Path) -> tuple[str, int, dict[str, Any]]:
    """(variant name, seed, rl_phase figures) of a finished run folder."""
    def load(name: str) -> Any:
        path = run_dir / name
        if not path.exists():
            raise SystemExit(f"{path}: missing; is {run_dir} a finished run (it needs measures.json, report.json)?")
        return json.loads(path.read_text())

    config, measures, report = load("config.json"), load("measures.json"), load("report.json")
    metrics = [json.loads(line) for line in read_record(run_dir / "metrics.jsonl").splitlines() if line.strip()]
    seed = config["train"]["seed"]
    figures = rl_phase(measures, report, metrics)
    figures["run_minutes"] = wall_seconds(run_dir) / 60
    name = run_dir.name.rsplit("-s", 1)[0] if run_dir.name.endswith(f"-s{seed}") else run_dir.name
    return name, seed, figures


KEPT = ("config.json", "measures.json", "report.json", "eval.json", "metrics.jsonl", "pass_at_k.json",
        "evals/before_sft.jsonl", "evals/after_sft.jsonl", "evals/after_rl.jsonl")
"""The records `--keep` copies: enough to rebuild every table here, the curves (`python -m grpo.run.doctor plot` on an
unpacked copy: plot.png is not kept) and the greedy answers. The .jsonl ones are kept gzipped (`PACKED`)."""
PACKED = ".jsonl"
"""Records of this suffix are kept gzipped (benchmarks/common.write_packed): held-out replies and step metrics are
most of a run's bytes, and the repository keeps its size small (tests/test_repo_size.py)."""
TIMING = "timing.json"


def wall_seconds(run_dir: Path) -> float:
    """The run's wall time: a kept copy's timing.json, else config.json (start-up) to report.json (the end)."""
    if (run_dir / TIMING).exists():
        return json.loads((run_dir / TIMING).read_text())["wall_s"]
    return (run_dir / "report.json").stat().st_mtime - (run_dir / "config.json").stat().st_mtime


def keep(run_dir: Path, dest: Path) -> Path:
    """Copy the run's records (KEPT; a .jsonl one gzipped to <name>.gz) to dest/<run name>, with its wall time in
    timing.json (a copy's file times are its own). `run_dir` may itself be a kept copy."""
    out = dest / run_dir.name
    for name in KEPT:
        if name.endswith(PACKED) and has_record(run_dir / name):
            write_packed(out / name, read_record(run_dir / name))
        elif (run_dir / name).exists():
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(run_dir / name, out / name)
    (out / TIMING).write_text(json.dumps({"wall_s": round(wall_seconds(run_dir), 1)}) + "\n")
    return out


def unpack(kept_dir: Path, dest: Path) -> Path:
    """A kept copy (`keep`) as a plain run folder dest/<run name>: every file copied, each gzipped record written
    plain, so that what reads a trainer's run folder (`python -m grpo.run.doctor plot`, `python -m grpo.run.doctor
    report`) reads it."""
    out = dest / kept_dir.name
    for path in sorted(p for p in kept_dir.rglob("*") if p.is_file()):
        target = out / path.relative_to(kept_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.name.endswith(GZ):
            plain = target.with_name(target.name[:-len(GZ)])
            plain.write_text(read_record(path.with_name(path.name[:-len(GZ)])))
        else:
            shutil.copyfile(path, target)
    return out


def table(runs: list[tuple[str, int, dict[str, Any]]]) -> str:
    """The markdown table, one row per run, then one mean row per variant with more than one seed."""
    lines = [HEADER, RULE]

    def row(name: str, seed: str, f: dict[str, Any]) -> str:
        return (f"| {name} | {seed} | {_arrow(f.get('acc'))} | {_num(delta(f.get('acc')), True)} "
                f"| {_num(delta(f.get('acc_ambig')), True)} | {_num(delta(f.get('acc_disambig')), True)} "
                f"| {_arrow(f.get('abs_s_amb'))} | {_arrow(f.get('ba'))} | {_num(delta(f.get('ba')), True)} "
                f"| {f['rl_minutes']:.1f} | {f['run_minutes']:.1f} | {_num(gain_per_minute(f), True)} "
                f"| {f.get('verdict') or '–'} | {bar_letters(f)} |")

    for name, seed, f in runs:
        lines.append(row(name, str(seed), f))
    by_name: dict[str, list[dict[str, Any]]] = {}
    for name, _, f in runs:
        by_name.setdefault(name, []).append(f)
    for name, fs in by_name.items():
        if len(fs) > 1:
            lines.append(row(f"**{name}** mean", f"{len(fs)} seeds", mean_figures(fs)))
    return "\n".join(lines)


def mean_figures(fs: list[dict[str, Any]]) -> dict[str, Any]:
    """Seed means of the figures (pairs element-wise; a verdict only when every seed agrees)."""
    out: dict[str, Any] = {}
    for key in ("acc", "acc_ambig", "acc_disambig", "abs_s_amb", "ba"):
        pairs = [f[key] for f in fs if f.get(key) and None not in f[key]]
        if pairs:
            out[key] = (statistics.fmean(p[0] for p in pairs), statistics.fmean(p[1] for p in pairs))
    for key in ("rl_minutes", "run_minutes"):
        out[key] = statistics.fmean(f[key] for f in fs)
    verdicts = {f.get("verdict") for f in fs}
    out["verdict"] = verdicts.pop() if len(verdicts) == 1 else "mixed"
    out["collapse"] = sorted({c for f in fs for c in f.get("collapse", ())})
    out["always_unknown"] = any(f.get("always_unknown") for f in fs)
    return out


PAIRED = (("Δ BBQ acc", "acc"), ("Δ acc_d", "acc_disambig"), ("Δ BA", "ba"))
"""The --against table's measures: (label, rl_phase key); each cell is a variant's change minus the baseline's."""


def paired_differences(runs: list[tuple[str, int, dict[str, Any]]], baseline: str) -> str:
    """Each variant against `baseline` on the seeds both ran: per seed, the variant's RL-phase change (the table's
    Δ) minus the baseline's, then the mean over those seeds and their min to max. A seed fixes the data split, the
    held-out prompts and the SFT warm-up, so one seed's difference is the variant's effect on that start; a range
    that spans 0 says the seeds disagree on its sign."""
    base = {seed: f for name, seed, f in runs if name == baseline}
    if not base:
        raise SystemExit(f"--against {baseline}: no run of that variant among --runs "
                         f"(variants: {', '.join(sorted({name for name, _, _ in runs}))})")
    lines = ["| variant | seeds | " + " | ".join(label for label, _ in PAIRED) + " |",
             "|---|---|" + "---|" * len(PAIRED)]
    variants: dict[str, dict[int, dict[str, Any]]] = {}
    for name, seed, f in runs:
        if name != baseline and seed in base:
            variants.setdefault(name, {})[seed] = f
    for name, by_seed in variants.items():
        cells = []
        for _, key in PAIRED:
            diffs = [d - b for seed, f in sorted(by_seed.items())
                     if (d := delta(f.get(key))) is not None and (b := delta(base[seed].get(key))) is not None]
            if not diffs:
                cells.append("–")
            elif len(diffs) == 1:
                cells.append(_num(diffs[0], True))
            else:
                cells.append(f"{_num(statistics.fmean(diffs), True)} ({_num(min(diffs), True)} to "
                             f"{_num(max(diffs), True)})")
        lines.append(f"| {name} − {baseline} | {', '.join(str(s) for s in sorted(by_seed))} | " + " | ".join(cells)
                     + " |")
    return "\n".join(lines)


OPTION_LINE = re.compile(r"^([A-C])\) (.*)$", re.MULTILINE)
"""An option as BBQ's prompt shows it (grpo/data/bbq.BBQ_TEMPLATE): "B) The grandson"."""


def shown_gold(run_dir: Path, phase: str = "after_rl") -> dict[str, tuple[list[str], str]]:
    """Each held-out BBQ row of the run's evals/<phase>.jsonl (task fairness) by id: the option texts its prompt showed,
    in their order, and the letter that stood before its right option. The row's label in the BBQ file (config
    data.data_dir / bbq / <category>.jsonl) names the right option's text, and the recorded prompt shows which letter
    stood before it (the file's order, a seeded order per row, or the balanced order of grpo/data/bbq.balanced_heldout
    alike)."""
    config = json.loads((run_dir / "config.json").read_text())
    data_dir = Path(config["data"]["data_dir"])
    data_dir = data_dir if data_dir.is_absolute() else ROOT / data_dir
    shown = {r["id"]: r["prompt"] for line in read_record(run_dir / "evals" / f"{phase}.jsonl").splitlines()
             if line.strip() and (r := json.loads(line))["task"] == "fairness"}
    gold: dict[str, str] = {}
    for category in sorted({i.split("/")[1] for i in shown}):
        path = data_dir / "bbq" / f"{category}.jsonl"
        if not path.exists():
            raise SystemExit(f"{run_dir}: its held-out BBQ rows come from {path}, which is missing")
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                gold[f"bbq/{category}/{row['example_id']}"] = str(row[f"ans{row['label']}"])
    out = {}
    for i, prompt in shown.items():
        options = OPTION_LINE.findall(prompt)
        letters = [letter for letter, text in options if text.strip() == gold[i].strip()]
        if len(letters) != 1:
            raise SystemExit(f"{run_dir}: held-out row {i}: its right option {gold[i]!r} is shown {len(letters)} times "
                             "among the prompt's lettered options (\"A) ...\"), not once")
        out[i] = ([text for _, text in options], letters[0])
    return out


def gold_letters(run_dir: Path) -> dict[str, int]:
    """How many of the run's held-out BBQ rows showed their right option at each letter (`shown_gold`). A model that
    answers one letter whatever the options scores that letter's count over the rows."""
    counts = {letter: 0 for letter in "abc"}
    for _, letter in shown_gold(run_dir).values():
        counts[letter.lower()] += 1
    return counts


def regraded_accuracy(run_dir: Path, phase: str) -> tuple[float, float] | None:
    """BBQ accuracy of the run's greedy held-out replies of one phase as recorded (the bbq_rule part of
    evals/<phase>.jsonl, graded by the code the run ran) and graded again by this checkout's
    grpo.core.rule_graders.bbq_rule on the options the prompt showed (`shown_gold`); None without that file."""
    path = run_dir / "evals" / f"{phase}.jsonl"
    if not has_record(path):
        return None
    from grpo.core.rule_graders import bbq_rule

    gold = shown_gold(run_dir, phase)
    rows = [r for line in read_record(path).splitlines()
            if line.strip() and (r := json.loads(line))["task"] == "fairness"]
    recorded = [r["parts"]["bbq_rule"] for r in rows]
    today = [bbq_rule(r["completion"], {"answers": gold[r["id"]][0], "label_letter": gold[r["id"]][1]}) for r in rows]
    return statistics.fmean(recorded), statistics.fmean(today)


def regrade_table(run_dirs: list[Path]) -> str:
    """Per run: BBQ accuracy of each phase's greedy held-out replies as recorded -> graded by this checkout's bbq_rule
    (`regraded_accuracy`), and the RL phase's change under each (from after SFT, or before SFT without a warm-up)."""
    lines = ["| run | seed | before SFT | after SFT | after RL | Δ RL, recorded | Δ RL, today |",
             "|---|---|---|---|---|---|---|"]
    for run_dir in run_dirs:
        pairs = {phase: regraded_accuracy(run_dir, phase) for phase in PHASES}
        start = pairs["after_sft"] or pairs["before_sft"]
        seed = json.loads((run_dir / "config.json").read_text())["train"]["seed"]
        cells = ["–" if p is None else f"{p[0]:.3f} → {p[1]:.3f}" for p in pairs.values()]
        rl = pairs["after_rl"]
        deltas = ["–"] * 2 if start is None or rl is None else [_num(rl[k] - start[k], True) for k in (0, 1)]
        lines.append(f"| {run_dir.name} | {seed} | " + " | ".join(cells + deltas) + " |")
    return "\n".join(lines)


def letter_table(run_dirs: list[Path]) -> str:
    """Per run: its held-out BBQ rows and the accuracy of answering each letter on all of them (`gold_letters`)."""
    lines = ["| run | seed | BBQ rows | always A | always B | always C |", "|---|---|---|---|---|---|"]
    for run_dir in run_dirs:
        counts = gold_letters(run_dir)
        n = sum(counts.values())
        seed = json.loads((run_dir / "config.json").read_text())["train"]["seed"]
        lines.append(f"| {run_dir.name} | {seed} | {n} | " + " | ".join(f"{c / n:.3f}" for c in counts.values()) + " |")
    return "\n".join(lines)


PHASES = ("before_sft", "after_sft", "after_rl")
PHASE_MEASURES = (
    ("BBQ accuracy (ambiguous + disambiguated)", "bbq", pooled_accuracy),
    ("BBQ acc_ambig", "bbq", lambda m: m.get("acc_ambig")),
    ("BBQ acc_disambig", "bbq", lambda m: m.get("acc_disambig")),
    ("BBQ s_AMB (0 = no bias)", "bbq", lambda m: m.get("s_amb")),
    ("BBQ s_DIS (0 = no bias)", "bbq", lambda m: m.get("s_dis")),
    ("BBQ \"unknown\" share, ambiguous", "bbq", lambda m: m.get("unknown_ambig")),
    ("BBQ \"unknown\" share, disambiguated", "bbq", lambda m: m.get("unknown_disambig")),
    ("BBQ answers on the most common letter", "answers", None),
    ("BBQ replies the grader cannot read", "bbq", lambda m: m.get("invalid")),
    ("HaluEval recognition balanced accuracy", "recognition", lambda m: m.get("balanced_accuracy")),
    ("HaluEval recognition \"yes\" share", "recognition", lambda m: m.get("yes_rate")),
    ("HaluEval recognition replies with no verdict", "recognition", lambda m: m.get("invalid")),
)
"""The --phases table's rows: (label, measures.json kind, the value from that kind's "overall" entry); kind "answers"
reads the greedy answers instead (`top_answer_share`)."""
SHORT = ("BBQ accuracy (ambiguous + disambiguated)", "BBQ acc_ambig", "BBQ acc_disambig", "BBQ s_AMB (0 = no bias)",
         "HaluEval recognition balanced accuracy")
"""The rows of docs/RESULTS.md's summary table of the preset (--phases --short)."""


def top_answer_share(run_dir: Path, phase: str, task: str = "fairness") -> float | None:
    """Share of the task's held-out greedy answers (evals/<phase>.jsonl) that are its most common letter, read as the
    doctor reads them (grpo/core/answer_metrics.answer_class reduces "Answer: C", "(c)" and "B) Not known" to the bare
    letter); a reply without a letter answer counts against every letter, so free text before SFT reads as the small
    share it is. None without that file. With BBQ's options shuffled, a share far above 1/3 is a letter picked
    whatever the options say."""
    path = run_dir / "evals" / f"{phase}.jsonl"
    if not has_record(path):
        return None
    from grpo.core.answer_metrics import answer_class

    rows = [json.loads(line) for line in read_record(path).splitlines() if line.strip()]
    answers = [answer_class(r["completion"]) for r in rows if r["task"] == task]
    letters = [a for a in answers if len(a) == 1 and a.isalpha()]
    return (max(letters.count(a) for a in set(letters)) if letters else 0) / len(answers) if answers else None


def phase_table(run_dirs: list[Path], short: bool = False) -> str:
    """Each measure of PHASE_MEASURES (SHORT's only, with `short`) before SFT / after SFT / after RL: the seeds' mean
    and, with several seeds, their min-max."""
    measures = [json.loads((d / "measures.json").read_text()) for d in run_dirs]
    lines = ["| measure | before SFT | after SFT | after RL |", "|---|---|---|---|"]
    for label, kind, value in PHASE_MEASURES:
        if short and label not in SHORT:
            continue
        cells = []
        for phase in PHASES:
            if kind == "answers":
                xs = [v for d in run_dirs if (v := top_answer_share(d, phase)) is not None]
            else:
                xs = [v for m in measures if (o := _overall(m, phase, kind)) and (v := value(o)) is not None]
            if not xs:
                cells.append("–")
            elif len(xs) == 1:
                cells.append(f"{xs[0]:.3f}")
            else:
                cells.append(f"{statistics.fmean(xs):.3f} ({min(xs):.3f}–{max(xs):.3f})")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_variants(out: Path, variants: list[tuple[str, str]], seeds: list[int], common: str) -> list[Path]:
    """Runs `python grpo_train.py COMMON VARIANT --seed S` for each variant and seed into out/<variant>-s<seed>
    (a finished folder is read, not run again)."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    dirs = []
    for name, flags in variants:
        for seed in seeds:
            run_dir = out / f"{name}-s{seed}"
            dirs.append(run_dir)
            if (run_dir / "report.json").exists():
                continue
            cmd = [sys.executable, str(ROOT / "grpo_train.py"), *shlex.split(common), *shlex.split(flags),
                   "--seed", str(seed), "--output-dir", str(out), "--run-name", run_dir.name]
            print("$", shlex.join(cmd), flush=True)
            subprocess.run(cmd, check=True, env=env, cwd=ROOT)
    return dirs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.dual_ablation", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", nargs="+", type=Path, help="finished run folders to read")
    ap.add_argument("--out", type=Path, help="where to run the variants (folders <variant>-s<seed>)")
    ap.add_argument("--variant", action="append", default=[], metavar='NAME="FLAGS"',
                    help="a variant: its name and the flags it adds to --common (repeatable)")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--common", default="--preset smollm2-dual", help="flags every variant shares")
    ap.add_argument("--phases", action="store_true", help="print each measure before SFT / after SFT / after RL")
    ap.add_argument("--short", action="store_true", help="with --phases: the rows of docs/RESULTS.md's summary only")
    ap.add_argument("--letters", action="store_true", help="print what answering one letter to every held-out BBQ "
                                                             "row scores, per run (needs the run's BBQ files)")
    ap.add_argument("--regrade", action="store_true", help="print each run's held-out BBQ accuracy per phase as "
                                                             "recorded and as this checkout's bbq_rule grades the same "
                                                             "replies")
    ap.add_argument("--against", metavar="VARIANT", help="print each variant's RL-phase changes minus VARIANT's, "
                                                         "seed by seed (paired on the seeds both ran)")
    ap.add_argument("--keep", type=Path, help="copy each run's records (config, measures, report, metrics, greedy "
                                              "answers; the .jsonl ones gzipped) to KEEP/<run>")
    ap.add_argument("--unpack", type=Path, help="write each kept run (--runs) as a plain run folder UNPACK/<run>, "
                                                "which `python -m grpo.run.doctor plot` draws")
    args = ap.parse_args(argv)
    if args.runs:
        dirs = args.runs
    elif args.out and args.variant:
        variants = [tuple(v.split("=", 1)) if "=" in v else (v, "") for v in args.variant]
        dirs = run_variants(args.out, variants, args.seeds, args.common)
    else:
        ap.error("give --runs DIR ..., or --out DIR with at least one --variant")
    if args.keep:
        dirs = [keep(d, args.keep) for d in dirs]
    if args.unpack:
        dirs = [unpack(d, args.unpack) for d in dirs]
    if args.phases:
        print(phase_table(dirs, args.short))
    elif args.letters:
        print(letter_table(dirs))
    elif args.regrade:
        print(regrade_table(dirs))
    elif args.against:
        print(paired_differences([read_run(d) for d in dirs], args.against))
    else:
        print(table([read_run(d) for d in dirs]))


if __name__ == "__main__":
    main()
