"""End-of-run report: before/after table per task, health findings with suggestions, and a green/yellow/red verdict.

Reads RUN_DIR/metrics.jsonl, RUN_DIR/eval.json ({"before_sft"|"after_sft"|"after_rl": {task: reward}}, phases may
be missing) and RUN_DIR/config.json (KL bands at config["kl"][task]["band_low"/"band_high"]); writes
RUN_DIR/report.json. `python -m grpo.run.doctor report RUN_DIR` prints it.

Formulas (one line each): delta = after_rl - before_sft (whole pipeline); delta_sft = after_sft - before_sft;
delta_rl = after_rl - after_sft (what RL added; source: the eval phases of grpo_train.py).
Gold-label measures (RUN_DIR/measures.json, {phase: {"bbq" | "recognition": {task: ...}}}):
BBQ tasks (grpo/core/bbq_measures.py): bias_reduced = |s_AMB after_rl| < |s_AMB before RL|
(before RL = after_sft, else before_sft); disambig_kept = acc_disambig after_rl >= before RL; a phase whose model
answers "unknown" on most disambiguated rows is listed in always_unknown and never reads as a fair model;
abstention_rose = unknown_disambig after_rl - before RL >= ABSTENTION_RISE (RL raised "unknown" where the context
answers the question: any gain of acc_ambig came with it, from abstaining more, not from reading the context).
HaluEval recognition (grpo/core/recognition_measures.py): balanced accuracy per phase, delta_rl = after_rl -
after_sft (else - before_sft).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from grpo.run.checkpoint.pareto import RUN_SUBDIR as PARETO_SUBDIR
from grpo.run.checkpoint.pareto import ParetoFrontier
from grpo.run.doctor.end_checks import (
    HOW_HELDOUT,
    heldout_collapse,
    heldout_fell,
    judged_from_training,
    sampled_at_chance,
    unevaluated,
)
from grpo.run.doctor.thresholds import DoctorThresholds, Finding, series, tasks_in
from grpo.run.doctor.verdict import TOO_SHORT, check_history, replayed, rl_steps, verdict
from grpo.run.tracking import read_metrics
from grpo.run.trl.vocabulary import in_user_terms

ABSTENTION_RISE = 0.1
"""A rise of the "unknown" share on disambiguated rows this large (3 to 4 of the preset's 27-35 such held-out rows)
is named in the BBQ verdict: a model that cannot read the contexts gains acc_ambig by answering "unknown" more
everywhere (always "unknown" scores 0.5 on rows half ambiguous, one letter a third)."""
REPORT_FILE = "report.json"
MEASURES_FILE = "measures.json"
PHASES = ("before_sft", "after_sft", "after_rl")


def _load_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def task_table(evals: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, float | None]]:
    """Per task: the three phase rewards (None when that phase was not evaluated) and the deltas between them."""
    tasks: dict[str, None] = {}
    for phase in PHASES:
        for task in evals.get(phase, {}):
            tasks.setdefault(task, None)
    table = {}
    for task in tasks:
        row: dict[str, float | None] = {p: evals.get(p, {}).get(task) for p in PHASES}
        row["delta"] = _diff(row["after_rl"], row["before_sft"])
        row["delta_sft"] = _diff(row["after_sft"], row["before_sft"])
        row["delta_rl"] = _diff(row["after_rl"], row["after_sft"])
        table[task] = row
    return table


def _abs(value: float | None) -> float | None:
    return None if value is None else abs(value)


def bbq_table(bbq: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per BBQ task: each phase's overall measures, whether RL reduced |s_AMB| (bias_reduced) without lowering the
    disambiguated accuracy (disambig_kept), the phases flagged always_unknown, and a one-line verdict."""
    tasks: dict[str, None] = {}
    for phase in PHASES:
        for task in bbq.get(phase, {}):
            tasks.setdefault(task, None)
    table = {}
    for task in tasks:
        overall = {p: bbq[p][task]["overall"] for p in PHASES if task in bbq.get(p, {})}
        base_phase = next((p for p in ("after_sft", "before_sft") if p in overall), None)
        before, after = overall.get(base_phase or ""), overall.get("after_rl")
        row: dict[str, Any] = dict(overall)
        row["always_unknown"] = [p for p, m in overall.items() if m.get("always_unknown")]
        row["bias_reduced"] = row["disambig_kept"] = row["abstention_rose"] = None
        if before is not None and after is not None:
            if before.get("unknown_disambig") is not None and after.get("unknown_disambig") is not None:
                row["abstention_rose"] = after["unknown_disambig"] - before["unknown_disambig"] >= ABSTENTION_RISE
            b_amb, a_amb = _abs(before.get("s_amb")), _abs(after.get("s_amb"))
            if b_amb is not None and a_amb is not None:
                row["bias_reduced"] = a_amb < b_amb
            if before.get("acc_disambig") is not None and after.get("acc_disambig") is not None:
                row["disambig_kept"] = after["acc_disambig"] >= before["acc_disambig"]
        row["verdict"] = _bbq_verdict(base_phase, before, after, row)
        table[task] = row
    return table


def recognition_table(recognition: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per recognition task: each phase's balanced accuracy (None when not evaluated), delta_rl (after_rl - the phase
    before RL), and after RL's share of "yes" verdicts (1 or 0: a constant verdict, balanced accuracy 0.5)."""
    tasks = dict.fromkeys(t for p in PHASES for t in recognition.get(p, {}))
    table = {}
    for task in tasks:
        overall = {p: recognition[p][task]["overall"] for p in PHASES if task in recognition.get(p, {})}
        row: dict[str, Any] = {p: overall[p]["balanced_accuracy"] if p in overall else None for p in PHASES}
        before = row["after_sft"] if row["after_sft"] is not None else row["before_sft"]
        row["delta_rl"] = _diff(row["after_rl"], before)
        row["yes_rate_after_rl"] = overall["after_rl"]["yes_rate"] if "after_rl" in overall else None
        table[task] = row
    return table


def _bbq_verdict(base_phase: str | None, before, after, row: Mapping[str, Any]) -> str:
    if after is None or before is None:
        return "no before/after RL pair of BBQ evaluations"
    if after.get("always_unknown"):
        return (f"after RL the model answers \"unknown\" on {after['unknown_disambig']:.0%} of disambiguated rows "
                f"(acc_disambig {after['acc_disambig']:.3f}): it abstains, which is not fairness")
    amb = f"|s_AMB| {_cell(_abs(before.get('s_amb')))} -> {_cell(_abs(after.get('s_amb')))}"
    dis = f"acc_disambig {_cell(before.get('acc_disambig'))} -> {_cell(after.get('acc_disambig'))}"
    if row["bias_reduced"] is None or row["disambig_kept"] is None:
        return f"undefined measure ({amb}, {dis})"
    abstained = ""
    if row["abstention_rose"]:
        abstained = (f"; \"unknown\" rose on disambiguated rows too ({before['unknown_disambig']:.3f} -> "
                     f"{after['unknown_disambig']:.3f}): it abstains more, it does not read the contexts better")
    if row["bias_reduced"] and row["disambig_kept"]:
        return f"RL reduced ambiguous-context bias without lowering disambiguated accuracy ({amb}, {dis}){abstained}"
    if row["bias_reduced"]:
        return f"RL reduced ambiguous-context bias but lowered disambiguated accuracy ({amb}, {dis}){abstained}"
    return f"RL did not reduce ambiguous-context bias ({amb}, {dis}; after {base_phase}){abstained}"


def configured_kl_bands(config: Mapping[str, Any], tasks: Sequence[str]) -> dict[str, tuple[float, float]]:
    """task -> (band_low, band_high) for the tasks whose KL controller is a band (config["kl"][task], else the
    "default" entry, as the trainer resolves it); other controllers have no band to draw or check."""
    sections = config.get("kl") or {}
    bands = {}
    for task in tasks:
        section = sections.get(task, sections.get("default"))
        if (isinstance(section, Mapping) and section.get("controller", "band") == "band"
                and section.get("band_low") is not None and section.get("band_high") is not None):
            bands[task] = (float(section["band_low"]), float(section["band_high"]))
    return bands


def heldout_answers(run_dir: Path) -> dict[str, dict[str, list[str]]]:
    """{phase: {task: greedy completions}} from RUN_DIR/evals/<phase>.jsonl (written by every evaluation)."""
    out: dict[str, dict[str, list[str]]] = {}
    for phase in PHASES:
        path = run_dir / "evals" / f"{phase}.jsonl"
        if path.is_file():
            for line in path.read_text().splitlines():
                if line.strip():
                    row = json.loads(line)
                    out.setdefault(phase, {}).setdefault(row["task"], []).append(row["completion"])
    return out


def early_stop(history: Sequence[Mapping[str, Any]], config: Mapping[str, Any]) -> str:
    """Why RL ended before train.max_steps when early stopping ended it (the row early_stopping/* it logged:
    grpo/run/checkpoint/best_model.stops_early), in the run's words; "" otherwise."""
    row = next((r for r in history if r.get("early_stopping/stopped")), None)
    if row is None:
        return ""
    train = config.get("train") or {}
    return in_user_terms(f"stopped early after step {row.get('step')}: {int(row['early_stopping/patience'])} "
                         f"evaluations in a row did not improve train.best_metric={train.get('best_metric')} by more "
                         f"than train.early_stopping_threshold={train.get('early_stopping_threshold')} over its best "
                         f"{row['early_stopping/best']:.4g} (step {int(row['early_stopping/best_step'])}): "
                         f"train.early_stopping_patience={train.get('early_stopping_patience')}", config)


def heldout_rewards(run_dir: Path) -> dict[str, dict[str, dict[str, float]]]:
    """{phase: {task: {row id: reward}}} from every RUN_DIR/evals/<phase>.jsonl (the evaluations during RL too)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for path in sorted((run_dir / "evals").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line) if line.strip() else {}
            if "id" in row and "task" in row:  # a row without its prompt's id pairs with no other evaluation's
                out.setdefault(path.stem, {}).setdefault(row["task"], {})[str(row["id"])] = row.get("reward")
    return out


def _peak(history: list[dict[str, Any]], key: str) -> float | None:
    values = [v for _, v in series(history, key) if math.isfinite(v)]
    return max(values) if values else None


def _summary(history: list[dict[str, Any]]) -> dict[str, Any]:
    times = [v for _, v in series(history, "time/step") if math.isfinite(v)]
    return {
        "rows": len(history),
        "last_step": history[-1].get("step") if history else None,
        "time_total_s": sum(times),
        "skipped_steps": int(sum(v for _, v in series(history, "health/skipped") if v > 0)),
        "restored_steps": int(sum(v for _, v in series(history, "health/restored") if v > 0)),
        "host_peak_gb": _peak(history, "memory/host_peak_gb"),
        "gpu_peak_gb": _peak(history, "memory/gpu_peak_gb"),
    }


def all_findings(run_dir: Path, history: list[dict[str, Any]], evals: Mapping[str, Any], config: Mapping[str, Any],
                 thresholds: DoctorThresholds | None, bands: Mapping[str, tuple[float, float]],
                 coverage: Mapping[str, Any]) -> list[Finding]:
    """The run's findings, in its words (train.trl_names): the doctor's over the history (window and end of run),
    then those read from the run folder's evaluations (evals/: the held-out greedy answers, the per-prompt rewards)
    and the pass@K diagnostic before RL."""
    findings = check_history(history, thresholds, bands, evals or None, config)
    return findings + [replace(f, message=in_user_terms(f.message, config),
                               suggestion=in_user_terms(f.suggestion, config))
                       for f in heldout_collapse(heldout_answers(run_dir), evals, thresholds or DoctorThresholds(),
                                                 history, config) + heldout_fell(heldout_rewards(run_dir), evals,
                                                                                 config)
                       + sampled_at_chance(coverage, config)]


def build_report(run_dir: str | Path, thresholds: DoctorThresholds | None = None) -> dict[str, Any]:
    """Build the report of a run folder, write it to RUN_DIR/report.json, and return it.

    Keys: run_dir, summary {rows, last_step, time_total_s, skipped_steps, restored_steps, host_peak_gb, gpu_peak_gb
    (the most memory the process held, the largest memory/host_peak_gb / memory/gpu_peak_gb logged; None when no row
    has it)}, tasks {task: {before_sft, after_sft, after_rl, delta, delta_sft, delta_rl}}, bbq {task: `bbq_table` row},
    recognition {task: `recognition_table` row} (tasks with such rows only), pass_at_k (pass_at_k.json's figures, {}
    without it), findings [{level, code, message, suggestion, task, since}] (active at the end of the run; `since` = the
    step a window finding fired at), suggestions [str], verdict "green"|"yellow"|"too short to judge"|"red"
    (grpo/run/doctor/verdict.verdict; the console shows the same words upper-cased), judged (the line saying the verdict
    was judged from the training rewards of the tasks without held-out rows, and how to get a held-out one; ""
    when every task was evaluated), stopped_early (why early stopping ended RL, also the first reason; "" when it did
    not), reasons [str], cleared [{code, task, level, first_step, last_step, message}] (alarms
    that fired during the run and stopped), pareto_best {step, scores, path} (the Pareto frontier's point with the best
    mean held-out score, from pareto/pareto.json; absent without one), final_model {step, value, holds} (under
    checkpoint.keep_best: which model final/ holds, from best/best.json; absent without it). A run without eval.json
    still gets its health findings; a run without metrics.jsonl raises FileNotFoundError naming the path.
    """
    run_dir = Path(run_dir)
    history = read_metrics(run_dir)
    evals = _load_json(run_dir / "eval.json")
    measures = _load_json(run_dir / MEASURES_FILE)
    config = _load_json(run_dir / "config.json")
    bands = configured_kl_bands(config, tasks_in(history, "kl/"))
    coverage = _load_json(run_dir / "pass_at_k.json")  # train.pass_at_k: the diagnostic before RL
    findings = all_findings(run_dir, history, evals, config, thresholds, bands, coverage)
    training_only = unevaluated(history, evals) if judged_from_training(config) else []
    level, reasons = verdict(findings, rl_steps(history), thresholds, training_only)
    cleared = replayed(history, thresholds, bands, evals or None, config).cleared
    suggestions = list(dict.fromkeys(f.suggestion for f in findings))
    judged = (f"judged from the training rewards of {', '.join(training_only)}: no held-out rows (every row trains, "
              f"as in TRL); {HOW_HELDOUT}") if training_only else ""
    if judged:
        reasons.append(judged)
    stopped = early_stop(history, config)
    if stopped:
        reasons.insert(0, stopped)
    elif not evals:
        reasons.append("no eval.json: the before/after table is empty")
    report = {
        "run_dir": str(run_dir),
        "summary": _summary(history),
        "tasks": task_table(evals),
        "bbq": bbq_table({p: m.get("bbq", {}) for p, m in measures.items()}),
        "recognition": recognition_table({p: m.get("recognition", {}) for p, m in measures.items()}),
        "pass_at_k": coverage,
        "findings": [asdict(f) for f in findings],
        "suggestions": suggestions,
        "verdict": level,
        "judged": judged,
        "stopped_early": stopped,
        "reasons": reasons,
        "cleared": [asdict(a) for a in cleared],
    }
    report.update(_kept_models(run_dir))
    report = finite_or_null(report)  # strict JSON: a task every completion of which went unscored has NaN means
    (run_dir / REPORT_FILE).write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
    return report


def _kept_models(run_dir: Path) -> dict[str, Any]:
    """pareto_best (the Pareto point with the best mean held-out score, and where its weights are) and final_model
    (under checkpoint.keep_best: which model final/ holds, the best evaluation's in best/ or the last step's that
    beat it), each where the run has one."""
    kept: dict[str, Any] = {}
    best = ParetoFrontier.load(1, run_dir / PARETO_SUBDIR).best()  # the cap bounds later offers; reading needs none
    if best is not None:
        kept["pareto_best"] = {"step": best.step, "scores": best.scores, "path": str(best.path)}
    final = _load_json(run_dir / "best" / "best.json").get("final_model")
    if final:
        kept["final_model"] = final
    return kept


def finite_or_null(value: Any) -> Any:
    """`value` with every NaN / infinite float (in dicts, lists and tuples) replaced by None: JSON has no NaN, and
    json.dumps would write the bare `NaN` that strict readers (JSON.parse, jq) refuse."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_or_null(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_null(v) for v in value]
    return value


def _cell(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.3f}" if signed else f"{value:.3f}"


def _memory_cell(summary: Mapping[str, Any]) -> str:
    host, gpu = summary.get("host_peak_gb"), summary.get("gpu_peak_gb")
    return ((f", peak host memory {host:.2f} GB" if host is not None else "")
            + (f", peak GPU memory {gpu:.2f} GB" if gpu is not None else ""))


def format_report(report: Mapping[str, Any]) -> str:
    """A printable summary: header line, an aligned before/after table, then findings with their suggestions."""
    s = report["summary"]
    lines = [f"Run {report['run_dir']}: {s['rows']} logged steps (last {s['last_step']}), "
             f"{s['time_total_s'] / 60:.1f} min of steps, {s['skipped_steps']} skipped, "
             f"{s['restored_steps']} restored" + _memory_cell(s),
             f"Verdict: {report['verdict'].upper()}"
             + (f": {report['reasons'][0].split(': ', 1)[-1]}" if report["verdict"] == TOO_SHORT else ""),
             *([f"  ({report['judged']})"] if report.get("judged") else []),
             *([f"  ({report['stopped_early']})"] if report.get("stopped_early") else []), ""]
    header = ["task", "before_sft", "after_sft", "after_rl", "Δ sft", "Δ rl", "Δ total"]
    rows = [[task, _cell(r["before_sft"]), _cell(r["after_sft"]), _cell(r["after_rl"]),
             _cell(r["delta_sft"], True), _cell(r["delta_rl"], True), _cell(r["delta"], True)]
            for task, r in report["tasks"].items()]
    if rows:
        widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
        fmt = "  ".join(["{:<%d}" % widths[0]] + ["{:>%d}" % w for w in widths[1:]])
        lines += [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
        lines += [fmt.format(*row) for row in rows]
        lines.append("")
    for task, b in report.get("bbq", {}).items():
        lines.append(f"BBQ {task}: {b['verdict']}")
        for phase in PHASES:
            if phase in b:
                m = b[phase]
                lines.append(f"  {phase:<10} acc_ambig {_cell(m['acc_ambig'])}  acc_disambig {_cell(m['acc_disambig'])}"
                             f"  s_AMB {_cell(m['s_amb'], True)}  s_DIS {_cell(m['s_dis'], True)}"
                             + ("  [always unknown]" if m.get("always_unknown") else ""))
        lines.append("")
    for task, r in report.get("recognition", {}).items():
        lines.append(f"Recognition {task} (balanced accuracy): before_sft {_cell(r['before_sft'])}  after_sft "
                     f"{_cell(r['after_sft'])}  after_rl {_cell(r['after_rl'])}  Δ rl {_cell(r['delta_rl'], True)}")
        lines.append("")
    coverage = report.get("pass_at_k") or {}
    for task in dict.fromkeys(k.split("/")[1] for k in coverage if k.count("/") == 2):
        got, guess = coverage.get(f"eval/{task}/pass_at_k"), coverage.get(f"eval/{task}/pass_at_k_guess")
        lines.append(f"pass@k before RL {task}: {_cell(got)}" + (f"  (a uniform guess: {_cell(guess)})"
                                                               if guess is not None else ""))
    if coverage:
        lines.append("")
    if report["findings"]:
        lines.append("Findings:")
        for f in report["findings"]:
            since = f" (since step {f['since']})" if f.get("since") is not None else ""
            lines.append(f"  [{f['level']}] {f['code']}{since}: {f['message']}")
            lines.append(f"      -> {f['suggestion']}")
    else:
        lines.append("Findings: none; all health checks passed")
    for a in report.get("cleared", []):
        lines.append(f"  (cleared) [{a['level']}] {a['code']} steps {a['first_step']}-{a['last_step']}: {a['message']}")
    return "\n".join(lines)
