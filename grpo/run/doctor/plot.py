"""One figure of a run: RUN_DIR/plot.png from RUN_DIR/metrics.jsonl (+ config.json KL bands, eval.json baselines).

Panels, sharing x = step: held-out reward per task (eval/<task>/reward, with the before-/after-SFT levels from
eval.json dotted), training reward per task (raw, faint, and a trailing moving average), KL per task with its band
shaded (config["kl"][task]["band_low"/"band_high"]), β per task, completion length, truncated fraction, mean
token entropy, gradient norm with the clip / skip limits and skipped / restored steps marked, the share of each
step's most common answer (with the doctor's collapse limit and its red alarms shaded), zero-std groups per task.

    python -m grpo.run.doctor plot RUN_DIR

Formula: moving average m_s = mean(x_{s-w+1..s}) over the last w = SMOOTH_WINDOW logged points (trailing, no lookahead).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from grpo.run.doctor.report import configured_kl_bands
from grpo.run.doctor.thresholds import DoctorThresholds, series, tasks_in
from grpo.run.tracking import read_metrics

PLOT_FILE = "plot.png"
SMOOTH_WINDOW = 10  # steps; rewards of one step are noisy (a batch of a few prompts), ten steps show the trend
TRUNCATION_AXIS_MIN = 0.25  # truncated-fraction axis shows at least 0..25% so a small wobble does not look huge
DPI = 110  # about 1.5k x 1.2k pixels: readable in a notebook and a PR comment alike


def _load_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _xy(history: Sequence[Mapping[str, Any]], key: str) -> tuple[list[int], list[float]]:
    points = [(s, v) for s, v in series(history, key) if math.isfinite(v)]
    return [s for s, _ in points], [v for _, v in points]


def _smooth(values: list[float], window: int) -> list[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def _empty(ax, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} logged", ha="center", va="center", transform=ax.transAxes, color="0.5")


def _panel_eval(ax, history, tasks, colors, evals) -> None:
    ax.set_title("Held-out reward (eval)")
    drew = False
    for task in tasks:
        x, y = _xy(history, f"eval/{task}/reward")
        if x:
            ax.plot(x, y, "o-", color=colors[task], label=task, markersize=4)
            drew = True
        for key, marker in (("bbq/acc_ambig", "s"), ("bbq/acc_disambig", "^"),  # gold-label measures
                            ("recognition/balanced_accuracy", "D")):
            x, y = _xy(history, f"eval/{task}/{key}")
            if x:
                ax.plot(x, y, marker + "-.", color=colors[task], label=f"{task} {key.split('/')[-1]}", markersize=4,
                        alpha=0.6)
        for phase, style in (("before_sft", ":"), ("after_sft", "--")):
            if task in evals.get(phase, {}):
                ax.axhline(evals[phase][task], color=colors[task], linestyle=style, linewidth=1, alpha=0.6)
    if not drew:
        _empty(ax, "eval/*/reward")
    elif evals:
        ax.plot([], [], ":", color="0.4", label="before SFT")
        ax.plot([], [], "--", color="0.4", label="after SFT")


def _panel_reward(ax, history, tasks, colors) -> None:
    ax.set_title(f"Training reward (mean of group; line = {SMOOTH_WINDOW}-step average)")
    for task in tasks:
        x, y = _xy(history, f"reward/{task}/mean")
        if x:
            ax.plot(x, y, color=colors[task], alpha=0.25, linewidth=1)
            ax.plot(x, _smooth(y, SMOOTH_WINDOW), color=colors[task], linewidth=2, label=task)
    if not ax.lines:
        _empty(ax, "reward/*/mean")


def _panel_kl(ax, history, tasks, colors, bands) -> None:
    ax.set_title("KL to reference (per token); band shaded")
    for task in tasks:
        x, y = _xy(history, f"kl/{task}")
        if task in bands:
            low, high = bands[task]
            ax.axhspan(low, high, color=colors[task], alpha=0.12, linewidth=0, label=f"{task} band")
            for edge in (low, high):
                ax.axhline(edge, color=colors[task], alpha=0.6, linewidth=0.8, linestyle="--")
        if x:
            ax.plot(x, y, color=colors[task], linewidth=1.5, label=task)
    if not ax.lines:
        _empty(ax, "kl/*")


def _panel_per_task(ax, history, tasks, colors, key: str, title: str, ylabel: str = "") -> None:
    """One line per task of `key.format(task=...)`."""
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    for task in tasks:
        x, y = _xy(history, key.format(task=task))
        if x:
            ax.plot(x, y, color=colors[task], linewidth=1.5, label=task)
    if not ax.lines:
        _empty(ax, key.format(task="*"))


def _panel_truncation(ax, history, tasks, colors) -> None:
    _panel_per_task(ax, history, tasks, colors, "rollout/{task}/truncated",
                    "Truncated completions (hit max_new_tokens)",
                    "fraction")
    top = max([max(line.get_ydata(), default=0.0) for line in ax.lines] + [0.0])
    limit = DoctorThresholds().truncation_max
    ax.axhline(limit, color="tab:red", linestyle=":", linewidth=1, alpha=0.7, label=f"health limit {limit:g}")
    # truncation is usually a few percent: scale to the data (with room) instead of 0..1, but never beyond 1
    ax.set_ylim(0, min(1.0, max(TRUNCATION_AXIS_MIN, 1.5 * top)))


def _panel_answers(ax, history, tasks, colors) -> None:
    """Share of each step's most common answer class per task (grpo/core/answer_metrics.py), and the doctor's collapse
    limit; the steps where the doctor had a red alarm (doctor/red > 0) shaded."""
    _panel_per_task(ax, history, tasks, colors, "rollout/{task}/top_share", "Top answer share (collapse -> 1); "
                    "red alarms shaded", "fraction")
    limit = DoctorThresholds().collapse_share
    ax.axhline(limit, color="tab:red", linestyle=":", linewidth=1, alpha=0.7, label=f"collapse limit {limit:g}")
    ax.set_ylim(0, 1.05)
    for step, value in series(history, "doctor/red"):
        if value > 0:
            ax.axvspan(step - 0.5, step + 0.5, color="tab:red", alpha=0.15, linewidth=0)


def _find_key(tree: Any, key: str) -> Any:
    """The first value under `key` anywhere in a nested config dict (section names may change), else None."""
    if isinstance(tree, dict):
        if key in tree:
            return tree[key]
        for value in tree.values():
            found = _find_key(value, key)
            if found is not None:
                return found
    return None


def _panel_grad(ax, history, config) -> None:
    ax.set_title("Gradient norm (before clipping)")
    x, y = _xy(history, "health/grad_norm")
    if not x:
        _empty(ax, "health/grad_norm")
        return
    ax.plot(x, y, color="0.25", linewidth=1.2, label="grad norm")
    if all(v > 0 for v in y):
        ax.set_yscale("log")  # one spike would flatten everything else on a linear axis
    for key, style in (("max_grad_norm", ":"), ("max_norm_skip", "--")):
        limit = _find_key(config, key)
        if isinstance(limit, (int, float)) and limit > 0:
            ax.axhline(limit, color="tab:red", linestyle=style, linewidth=1, alpha=0.7, label=f"{key} = {limit:g}")
    norm_at = dict(zip(x, y, strict=True))
    for key, marker, color, label in (("health/skipped", "x", "tab:red", "skipped step"),
                                      ("health/restored", "D", "tab:purple", "weights restored")):
        steps = [s for s, v in series(history, key) if v > 0]
        if steps:
            ax.scatter(steps, [norm_at.get(s, max(y)) for s in steps], marker=marker, color=color, s=60,
                       zorder=3, label=label)
            for s in steps:
                ax.axvline(s, color=color, alpha=0.25, linewidth=1)


def plot_run(run_dir: str | Path) -> Path:
    """Draw the run's panels into RUN_DIR/plot.png and return that path.

    Raises FileNotFoundError (naming the path) when `run_dir` or its metrics.jsonl is missing, ValueError when
    metrics.jsonl holds no rows.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run folder {run_dir} does not exist; pass the RUN_DIR a training run wrote")
    history = read_metrics(run_dir)
    if not history:
        raise ValueError(f"{run_dir / 'metrics.jsonl'} is empty: the run logged no step yet")
    config, evals = _load_json(run_dir / "config.json"), _load_json(run_dir / "eval.json")

    import matplotlib

    matplotlib.use("Agg")  # no display needed; set here, not at import, so a notebook keeps its own backend
    import matplotlib.pyplot as plt

    tasks = tasks_in(history, "reward/", "/mean")
    for task in tasks_in(history, "eval/", "/reward") + tasks_in(history, "kl/"):
        if task not in tasks:
            tasks.append(task)
    palette = plt.get_cmap("tab10").colors
    colors = {t: palette[i % len(palette)] for i, t in enumerate(tasks)}
    bands = configured_kl_bands(config, tasks)

    fig, axes = plt.subplots(5, 2, figsize=(14, 17), sharex=True)
    _panel_eval(axes[0, 0], history, tasks, colors, evals)
    _panel_reward(axes[0, 1], history, tasks, colors)
    _panel_kl(axes[1, 0], history, tasks, colors, bands)
    _panel_per_task(axes[1, 1], history, tasks, colors, "beta/{task}", "KL coefficient β")
    _panel_per_task(axes[2, 0], history, tasks, colors, "rollout/{task}/length", "Completion length", "tokens")
    _panel_truncation(axes[2, 1], history, tasks, colors)
    _panel_per_task(axes[3, 0], history, tasks, colors, "entropy/{task}", "Mean token entropy (collapse -> 0)", "nats")
    _panel_grad(axes[3, 1], history, config)
    _panel_answers(axes[4, 0], history, tasks, colors)
    _panel_per_task(axes[4, 1], history, tasks, colors, "adv/{task}/frac_zero_std", "Zero-std groups (no signal)",
                    "fraction")
    for ax in axes.flat:
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="best", framealpha=0.8)
    for ax in axes[-1]:
        ax.set_xlabel("step")
    last = history[-1].get("step", len(history) - 1)
    fig.suptitle(f"{run_dir.name}: {len(history)} logged steps (last step {last}); tasks: {', '.join(tasks)}",
                 fontsize=13)
    fig.tight_layout(rect=(0, 0, 1, 0.975))  # leave room for the suptitle
    out = run_dir / PLOT_FILE
    fig.savefig(out, dpi=DPI)
    plt.close(fig)
    return out
