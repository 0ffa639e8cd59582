"""The GPU check's goals (benchmarks/gpu_check.py): each goal of the fast-on-the-card work read from the parts'
figures, the goals table and the headline summary printed at the end of a run."""

from __future__ import annotations

from typing import Any, Callable


def _get(report: dict[str, Any], *path: Any) -> Any:
    """report[path...] or None where a part did not run, failed, or lacks the figure."""
    node: Any = report["parts"]
    if node.get(path[0], {}).get("status") != "ok":
        return None
    for key in path:
        if not isinstance(node, (dict, list)):
            return None
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            return None
    return node


def _case_d(report: dict[str, Any]) -> dict[str, Any] | None:
    cases = _get(report, "d", "cases") or []
    return next((c for c in cases if c.get("status") == "ok"), None)


def _rest_ratio(report: dict[str, Any]) -> float | None:
    ours, trl = (_get(report, "b", "vs_trl", label, "phase_s", "rest") for label in ("ours-default", "trl"))
    return ours / trl if ours is not None and trl else None


def _compiled_and_captured(report: dict[str, Any]) -> tuple[str, bool | None]:
    counts = _get(report, "b", "decode", "graph", "counts")
    if not counts:
        return "not measured", None
    text = ", ".join(f"{k} {v}" for k, v in counts.items())
    return text, counts.get("compiles", 0) >= 1 and counts.get("captures", 0) >= 1 and not counts.get("fallbacks")


GOALS: list[tuple[str, Callable[[dict[str, Any]], tuple[str, bool | None]]]] = [
    ("a. every engine's fp32 tokens are generate's", lambda r: ("not measured", None) if not _get(r, "a", "passes")
     else (", ".join(f"{k} {'yes' if v else 'no'}" for k, v in _get(r, "a", "passes").items()),
           all(_get(r, "a", "passes").values()))),
    ("b. the decoding step compiled and captured, no fallback", _compiled_and_captured),
    ("b. TRL's time per step over ours (default path) >= 2", lambda r: _at_least(
        _get(r, "b", "vs_trl", "ours-default", "trl_time_over_ours"), 2.0, "{:.2f}x")),
    ("b. decode <= 5x the floor (0.5B shape, graph engine)", lambda r: _at_most(
        _get(r, "b", "decode", "graph", "x_floor"), 5.0, "{:.1f}x")),
    ("b. kept cycles within 1.3x (ours, default path)", lambda r: _at_most(
        _get(r, "b", "vs_trl", "ours-default", "cycle_spread"), 1.3, "{:.2f} (TRL " + (
            f"{_get(r, 'b', 'vs_trl', 'trl', 'cycle_spread'):.2f})" if _get(r, "b", "vs_trl", "trl", "cycle_spread")
            else "n/a)"))),
    ("b. grading + reference + update <= TRL's", lambda r: _at_most(_rest_ratio(r), 1.0, "{:.2f}x TRL's")),
    ("b. peak memory <= 0.7x TRL's", lambda r: _at_most(
        _get(r, "b", "vs_trl", "ours-default", "peak_memory_over_trl"), 0.7, "{:.2f}x")),
    ("d. decode <= 3x the floor (8B LoRA shape)", lambda r: _at_most(
        (_case_d(r) or {}).get("decode_x_floor"), 3.0, "{:.1f}x")),
    ("d. 8B estimate within 10 % (never under by more than 5 %)", lambda r: _estimate_goal(_case_d(r))),
    ("e. the demo's verdict GREEN", lambda r: ("not measured", None) if _get(r, "e", "verdict") is None else (
        _get(r, "e", "verdict").split(":")[0], _get(r, "e", "verdict") == "GREEN")),
]
"""The goals a GPU session checks (the fast-on-the-card issue's list), each read from the parts' figures: (what, a
function of the report giving (the figure, pass / miss / None = not measured))."""


def _at_most(value: float | None, bound: float, fmt: str) -> tuple[str, bool | None]:
    return ("not measured", None) if value is None else (fmt.format(value), value <= bound)


def _at_least(value: float | None, bound: float, fmt: str) -> tuple[str, bool | None]:
    return ("not measured", None) if value is None else (fmt.format(value), value >= bound)


def _estimate_goal(case: dict[str, Any] | None) -> tuple[str, bool | None]:
    """The estimate against the measured peak (reserved + context, as gpu_memory.py reports): within 10 %, and an
    estimate under the truth (an out-of-memory crash on the user's card) by at most 5 %."""
    error = None if case is None else case.get("error_pct")
    if error is None:
        return "not measured", None
    return f"{error:+.1f} %", -5.0 <= error <= 10.0


def goals(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Each goal with its figure and "pass", "miss" or "not measured"."""
    out = []
    for goal, read in GOALS:
        figure, ok = read(report)
        out.append({"goal": goal, "figure": figure, "status": "not measured" if ok is None else
                    ("pass" if ok else "miss")})
    return out


def goals_table(report: dict[str, Any]) -> str:
    """The goals table: the card, torch and the commit, then one row per goal."""
    m = report["machine"]
    rows = goals(report)
    width = max(len(r["goal"]) for r in rows)
    head = (f"goals on {m['device']}, torch {m['torch']}, commit {m.get('commit')}, {m['date']}"
            + (" (the CPU: the machinery runs; the goals are the GPU's)" if report["cpu"] else ""))
    fig = max(len("figure"), *(len(r["figure"]) for r in rows))
    lines = [head, f"{'goal':<{width}}  {'figure':<{fig}}  status", "-" * (width + fig + 16)]
    lines += [f"{r['goal']:<{width}}  {r['figure']:<{fig}}  {r['status']}" for r in rows]
    return "\n".join(lines)


def summary(report: dict[str, Any]) -> str:
    """The headline figures, one line each."""
    lines = [f"gpu_check on {report['machine']['device']} ({report['machine']['date']})"]
    parts = report["parts"]
    a = parts.get("a", {})
    if a.get("status") == "ok":
        lines.append(f"a. engines that pass (generate's tokens in fp32; bf16 log-probs within bf16's own rounding): "
                     f"{a['passes']}; graph step vs forward in bf16: max |Δ log-prob| "
                     f"{a['bfloat16']['graph_logprob_vs_forward']['max_abs']:.4f} (bf16 vs fp32 forward: "
                     f"{a['bf16_forward_vs_fp32']['max_abs']:.4f}); LoRA fold in bf16: "
                     f"{a['fold_lora_bf16']['max_abs_logprob_diff']:.4f}")
    b = parts.get("b", {})
    if b.get("status") == "ok":
        lines.append("b. decode ms/step (x floor): " + ", ".join(
            f"{e} {d['ms_per_step']:.2f} ({d['x_floor']:.1f}x)" for e, d in b["decode"].items()))
        lines.append("   TRL s/step / ours: " + ", ".join(
            f"{label} {r['trl_time_over_ours']:.2f}x (spread {r['cycle_spread']:.2f})"
            for label, r in b["vs_trl"].items() if label != "trl" and r.get("cycle_spread"))
            + f"; TRL's spread {b['vs_trl']['trl'].get('cycle_spread') or float('nan'):.2f}")
        lines.append("   phases, median s per kept cycle: " + "; ".join(
            f"{label} " + ", ".join(f"{k} {v:.3f}" for k, v in r.get("phase_s", {}).items())
            for label, r in b["vs_trl"].items()))
    e = parts.get("e", {})
    if e.get("status") == "ok":
        lines.append(f"e. demo verdict: {e['verdict']}")
    lines.append("parts: " + ", ".join(f"{n} {r['status']}" for n, r in parts.items()))
    return "\n".join(lines + ["", goals_table(report)])
