"""Metric tracking: one `Tracker` interface, several backends, and the console progress line.

The loop calls `tracker.log(metrics, step)` with the namespaced dicts the step functions return
(`reward/<task>/mean`, `kl/<task>`, `loss/*`, `health/*`, `time/*`, ...) and never branches on the backend:
`make_trackers` builds a `MultiTracker` of
  * `JsonlTracker`: RUN_DIR/metrics.jsonl (one JSON object per step, appended, flushed per line; the source the
    plot and the report read), RUN_DIR/metrics.csv (columns = union of keys) and RUN_DIR/samples.jsonl (text);
  * `TensorBoardTracker`: scalars under the same keys, text for samples;
  * `WandbTracker`: only when asked for, and only if `wandb` is installed.
Scalar backends skip non-numeric values (e.g. "phase"). NaN/inf are written as they are (JSON `NaN`/`Infinity`,
which Python's json reads back) so that `health.check` can see them.

Resume: `tracker.resume_at(step, rows)` forgets what the interrupted run logged after its checkpoint (rows of
metrics.jsonl beyond the first `rows`, or with a step above `step`), rewrites metrics.jsonl, metrics.csv and
samples.jsonl from what is kept, and makes TensorBoard discard the replayed steps (SummaryWriter's `purge_step`,
then the kept rows of the purged steps written again), so every derived file equals the uninterrupted run's.
"""

from __future__ import annotations

import configparser
import contextlib
import csv
import html
import importlib
import json
import math
import netrc
import os
import sys
import time
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Protocol, Sequence, TextIO

if TYPE_CHECKING:
    from grpo.core.step_types import Scored

__all__ = ["StepTimer", "format_step_line", "progress_bar", "write_samples", "write_scored"]
"""The names the entry point takes from this module, its face (tests/test_house.py); the rest serve the package."""

METRICS_FILE = "metrics.jsonl"
CSV_FILE = "metrics.csv"
SAMPLES_FILE = "samples.jsonl"
MEASURED_PREFIXES = ("time/", "memory/", "step_time")
"""Metric keys measured, not computed: read from a clock or from the allocator, they differ between two runs of the
same code (step_time: TRL's name of time/step). Every comparison of two runs (resume, the demo's regression fixture and
fingerprint, the kill/resume soak) leaves them out."""
PLAIN_PROGRESS_LINES = 10  # without a TTY, print about this many lines per phase: enough to see it move, not spam


class Tracker(Protocol):
    """Where metrics go. `step` is the RL step (or SFT step, with "phase" set in the metrics)."""

    def log(self, metrics: Mapping[str, Any], step: int) -> None: ...

    def log_text(self, key: str, text: str, step: int) -> None: ...

    def close(self) -> None: ...


def scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The numeric entries of `metrics` as floats (bools -> 0/1, 0-d tensors via float()); strings etc. dropped."""
    out = {}
    for key, value in metrics.items():
        if isinstance(value, (bool, int, float)):
            out[key] = float(value)
        elif hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
            out[key] = float(value.item())
    return out


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The rows of RUN_DIR/metrics.jsonl, in file order. Raises FileNotFoundError naming the path when missing."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: is {run_dir} a run folder written by grpo_train.py?")
    return _read_jsonl(path, torn_tail_ok=False)


def _read_jsonl(path: Path, torn_tail_ok: bool) -> list[dict[str, Any]]:
    """The JSON rows of `path`. `torn_tail_ok`: a last line without its newline that does not parse (a write cut
    by a kill) is dropped instead of raising; the rows a resume keeps are all before it anyway."""
    text = path.read_text()
    lines = text.split("\n")
    rows = []
    for lineno, line in enumerate(lines, 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                if torn_tail_ok and lineno == len(lines):  # the last piece, not ended by a newline
                    break
                raise ValueError(f"{path}:{lineno}: not a JSON object ({err}); delete or fix that line") from err
    return rows


def _write_jsonl_atomically(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, path)


class NullTracker:
    """Logs nothing (tests, dry runs)."""

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        pass

    def log_text(self, key: str, text: str, step: int) -> None:
        pass

    def close(self) -> None:
        pass

    rows_logged = 0

    def resume_at(self, step: int, rows: int | None = None) -> None:
        pass


class JsonlTracker:
    """metrics.jsonl + metrics.csv + samples.jsonl in `run_dir`. Appends to an existing metrics.jsonl (resume).

    The csv is rewritten whole when a new key appears (its header changes) and appended to otherwise, so it
    always holds every row with the union of keys as columns; rows are kept in memory for that (a few MB for
    thousands of steps).
    """

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        jsonl = self.run_dir / METRICS_FILE
        self._rows: list[dict[str, Any]] = _read_jsonl(jsonl, torn_tail_ok=True) if jsonl.is_file() else []
        self._columns: list[str] = []
        for row in self._rows:
            self._add_columns(row)
        if jsonl.is_file() and not jsonl.read_text().endswith("\n") and jsonl.stat().st_size:
            _write_jsonl_atomically(jsonl, self._rows)  # the last line was torn by a kill: drop it from the file
        self.texts: list[dict[str, Any]] = []
        """The rows of samples.jsonl kept by the last `trim`."""
        self._jsonl = jsonl.open("a")
        self._samples = (self.run_dir / SAMPLES_FILE).open("a")
        self._csv: TextIO | None = None
        self._rewrite_csv()

    @property
    def rows_logged(self) -> int:
        """Rows in metrics.jsonl; a checkpoint records it so that `resume_at` keeps exactly the rows before it."""
        return len(self._rows)

    def trim(self, step: int, rows: int | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Keep the first `rows` rows (all when None) whose step is <= `step`; rewrite metrics.jsonl, metrics.csv
        and samples.jsonl (texts of steps <= `step`) from them. Returns (kept rows, dropped rows)."""
        limit = len(self._rows) if rows is None else rows
        kept = [r for i, r in enumerate(self._rows) if i < limit and int(r.get("step", 0)) <= step]
        dropped = [r for i, r in enumerate(self._rows) if not (i < limit and int(r.get("step", 0)) <= step)]
        self.close()
        _write_jsonl_atomically(self.run_dir / METRICS_FILE, kept)
        samples_path = self.run_dir / SAMPLES_FILE
        texts = _read_jsonl(samples_path, torn_tail_ok=True) if samples_path.is_file() else []
        self.texts = [t for t in texts if int(t.get("step", 0)) <= step]
        _write_jsonl_atomically(samples_path, self.texts)
        self._rows, self._columns = kept, []
        for row in kept:
            self._add_columns(row)
        self._jsonl = (self.run_dir / METRICS_FILE).open("a")
        self._samples = samples_path.open("a")
        self._csv = None
        self._rewrite_csv()
        return kept, dropped

    def resume_at(self, step: int, rows: int | None = None) -> None:
        """See `trim` (the files are rewritten; the rows are not returned)."""
        self.trim(step, rows)

    def _add_columns(self, row: Mapping[str, Any]) -> bool:
        new = [k for k in row if k not in self._columns]
        self._columns.extend(new)
        return bool(new)

    def _rewrite_csv(self) -> None:
        if self._csv is not None:
            self._csv.close()
        self._csv = (self.run_dir / CSV_FILE).open("w", newline="")
        writer = csv.DictWriter(self._csv, fieldnames=self._columns)
        writer.writeheader()
        writer.writerows(self._rows)
        self._csv.flush()

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        row = {"step": int(step), **{k: v for k, v in metrics.items() if k != "step"}}
        row = {k: (float(v.item()) if hasattr(v, "item") else v) for k, v in row.items()}
        self._jsonl.write(json.dumps(row) + "\n")
        self._jsonl.flush()
        self._rows.append(row)
        if self._add_columns(row):
            self._rewrite_csv()
        else:
            assert self._csv is not None
            csv.DictWriter(self._csv, fieldnames=self._columns).writerow(row)
            self._csv.flush()

    def log_text(self, key: str, text: str, step: int) -> None:
        self._samples.write(json.dumps({"step": int(step), "key": key, "text": text}) + "\n")
        self._samples.flush()

    def close(self) -> None:
        for fh in (self._jsonl, self._samples, self._csv):
            if fh is not None and not fh.closed:
                fh.close()


def _wait_for_a_later_event_file_name(log_dir: str) -> None:
    """TensorBoard reads a folder's event files in the order of their names, `events.out.tfevents.<second>.<host>.
    <pid>.<n>` with n a per-process counter, so a purge written to a new file acts only on the files whose names
    sort before it. Within one second of the same process the counter decides, and 10 sorts before 9: a resume in
    the same Python process (a notebook, the tests) could replay its purge before the events it purges. Waiting
    for the next second when a file of this second exists makes the new name sort last (at most 1 s, on resume)."""
    def second_of(name: str) -> int:
        parts = name.split(".")
        return int(parts[3]) if len(parts) > 3 and parts[3].isdigit() else -1

    folder = Path(log_dir)
    names = [p.name for p in folder.glob("events.out.tfevents.*")] if folder.is_dir() else []
    now = time.time()
    if any(second_of(n) == int(now) for n in names):
        time.sleep(int(now) + 1 - now + 0.01)


class TensorBoardTracker:
    """Scalars and text to a TensorBoard event file in `log_dir` (`tensorboard --logdir RUN_DIR/tb`)."""

    def __init__(self, log_dir: str | Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # slow import; only when asked for

        self.log_dir = str(log_dir)
        _wait_for_a_later_event_file_name(self.log_dir)
        self.writer = SummaryWriter(log_dir=self.log_dir)

    def rewind(self, purge_step: int, rows: Sequence[Mapping[str, Any]] = (),
               texts: Sequence[Mapping[str, Any]] = ()) -> None:
        """Discard every event at step >= `purge_step` (those the interrupted run wrote are hidden by TensorBoard's
        purge), then write `rows` / `texts` (the kept ones at step >= `purge_step`) again."""
        from torch.utils.tensorboard import SummaryWriter

        self.writer.close()
        _wait_for_a_later_event_file_name(self.log_dir)
        self.writer = SummaryWriter(log_dir=self.log_dir, purge_step=int(purge_step))
        for row in rows:
            self.log(row, int(row["step"]))
        for text in texts:
            self.log_text(str(text["key"]), str(text["text"]), int(text["step"]))

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        for key, value in scalars(metrics).items():
            if key != "step":
                self.writer.add_scalar(key, value, global_step=int(step))

    def log_text(self, key: str, text: str, step: int) -> None:
        # TensorBoard renders text as markdown; a code block keeps the completion verbatim
        self.writer.add_text(key, "```\n" + text + "\n```", global_step=int(step))

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


WANDB_MODULE = "wandb"


WANDB_MISSING = "Weights & Biases is not installed: `pip install wandb`, or leave train.wandb_project empty"
"""What to do when train.wandb_project is set and `wandb` is missing (grpo/run/assembly/config_check.py says it up
front)."""


def wandb_installed() -> bool:
    """Whether `import wandb` works: imported, not only looked for, since a package that is found can still fail
    to import (a broken install, a missing dependency); asked only when train.wandb_project is set."""
    try:
        importlib.import_module(WANDB_MODULE)
    except ImportError:
        return False
    return True


WANDB_NO_KEY = ("Weights & Biases has no API key here, and wandb.init() would stop the run after the model loads: "
                "run `wandb login` (or set WANDB_API_KEY), or set WANDB_MODE=offline to log into the run folder "
                "(`wandb sync` uploads it later)")
"""What to do when W&B is asked for and `wandb` is installed but cannot log (config checks say it before the run)."""
WANDB_LOCAL_MODES = ("offline", "disabled", "dryrun")
"""wandb modes that need no API key (WANDB_MODE, or the settings file `wandb offline` writes)."""


def wandb_can_log(home: Path | None = None) -> bool:
    """Whether wandb.init() starts without asking for a key: a local mode (WANDB_MODE, `wandb offline`'s settings
    file in ./wandb/ or the config folder) or a key (WANDB_API_KEY, the netrc entry `wandb login` writes). Without
    either it raises a UsageError from inside the run, a traceback after the model has loaded.

    Read from the environment and the files alone: wandb.setup() or wandb.login() would start wandb's service and, on a
    machine without a network, wait on it (a check before the run must not hang it)."""
    home = home or Path.home()
    if os.environ.get("WANDB_MODE", "").lower() in WANDB_LOCAL_MODES or os.environ.get("WANDB_API_KEY"):
        return True
    config_dir = Path(os.environ.get("WANDB_CONFIG_DIR") or home / ".config" / "wandb")
    for settings in (Path("wandb") / "settings", config_dir / "settings"):
        parser = configparser.ConfigParser()
        with contextlib.suppress(OSError, configparser.Error):
            parser.read(settings)
            if parser.get("default", "mode", fallback="").lower() in WANDB_LOCAL_MODES:
                return True
    host = urllib.parse.urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or ""
    try:
        entry = netrc.netrc(os.environ.get("NETRC") or str(home / ".netrc")).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(entry and entry[2])


class WandbTracker:
    """Weights & Biases run; `wandb` must be installed and logged in (`wandb login`) or WANDB_MODE=offline."""

    def __init__(self, project: str, run_dir: str | Path, config: Mapping[str, Any] | None = None,
                 name: str | None = None) -> None:
        try:
            import wandb
        except ImportError:
            raise ImportError(f"train.wandb_project={project!r}: {WANDB_MISSING}") from None
        self._wandb = wandb
        self.run = wandb.init(project=project, dir=str(run_dir), config=dict(config or {}),
                              name=name or Path(run_dir).name)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        self.run.log({k: v for k, v in scalars(metrics).items() if k != "step"}, step=int(step))

    def log_text(self, key: str, text: str, step: int) -> None:
        self.run.log({key: self._wandb.Html(f"<pre>{html.escape(text)}</pre>")}, step=int(step))

    def close(self) -> None:
        self.run.finish()


class MultiTracker:
    """Fans every call out to several trackers, so the loop holds exactly one."""

    def __init__(self, trackers: Sequence[Tracker]) -> None:
        self.trackers = list(trackers)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        for t in self.trackers:
            t.log(metrics, step)

    def log_text(self, key: str, text: str, step: int) -> None:
        for t in self.trackers:
            t.log_text(key, text, step)

    def close(self) -> None:
        for t in self.trackers:
            t.close()

    @property
    def rows_logged(self) -> int:
        """Rows of metrics.jsonl so far (0 without a JSONL backend): store it in the checkpoint for `resume_at`."""
        return sum(t.rows_logged for t in self.trackers if isinstance(t, JsonlTracker))

    def resume_at(self, step: int, rows: int | None = None) -> None:
        """Forget what was logged after the checkpoint of `step` (which had logged `rows` rows, if known): the JSONL
        backend trims its files; TensorBoard purges from the first dropped step (at most step + 1) and writes the
        kept rows of the purged steps again. W&B starts a new run on every launch and needs nothing."""
        source = next((t for t in self.trackers if isinstance(t, JsonlTracker)), None)
        if source is None:
            return
        kept, dropped = source.trim(step, rows)
        purge = min([step + 1] + [int(r.get("step", 0)) for r in dropped])
        for t in self.trackers:
            if isinstance(t, TensorBoardTracker):
                t.rewind(purge, [r for r in kept if int(r.get("step", 0)) >= purge],
                         [x for x in source.texts if int(x.get("step", 0)) >= purge])


def make_trackers(run_dir: str | Path, tensorboard: bool = True, wandb_project: str | None = None,
                  config: Mapping[str, Any] | None = None) -> Tracker:
    """JSONL/CSV always; TensorBoard under RUN_DIR/tb when `tensorboard`; W&B when `wandb_project` is set."""
    trackers: list[Tracker] = [JsonlTracker(run_dir)]
    if tensorboard:
        trackers.append(TensorBoardTracker(Path(run_dir) / "tb"))
    if wandb_project:
        trackers.append(WandbTracker(wandb_project, run_dir, config=config))
    return MultiTracker(trackers)


# ---------------------------------------------------------------------------------------------------------------
# Console
# ---------------------------------------------------------------------------------------------------------------


def _fmt(value: Any) -> str:
    if not isinstance(value, (int, float)):
        return str(value)
    if not math.isfinite(value):
        return str(value)
    return f"{value:.3g}" if abs(value) < 1e-2 or abs(value) >= 1e3 else f"{value:.3f}"


def format_step_line(metrics: Mapping[str, Any], tasks: Sequence[str]) -> str:
    """One compact line per step for logs: step, per task reward/KL/β, loss, grad norm, step time, host memory, skips.

    e.g. `step 12 | fairness r=0.625 kl=0.031 β=0.040 | hallucination r=0.410 kl=0.052 β=0.020 | loss 0.118
    | gnorm 1.230 | 4.21s | 1.02 GB`; missing keys are left out.
    """
    parts = [f"step {metrics.get('step', '?')}"]
    for task in tasks:
        fields = [(f"reward/{task}/mean", "r"), (f"eval/{task}/reward", "eval"), (f"kl/{task}", "kl"),
                  (f"beta/{task}", "β")]
        shown = [f"{name}={_fmt(metrics[key])}" for key, name in fields if key in metrics]
        if shown:
            parts.append(f"{task} " + " ".join(shown))
    if "loss/total" in metrics:
        parts.append(f"loss {_fmt(metrics['loss/total'])}")
    if "health/grad_norm" in metrics:
        parts.append(f"gnorm {_fmt(metrics['health/grad_norm'])}")
    if "time/step" in metrics:
        parts.append(f"{float(metrics['time/step']):.2f}s")
    if "memory/host_rss_gb" in metrics:
        parts.append(f"{float(metrics['memory/host_rss_gb']):.2f} GB")
    if metrics.get("health/skipped"):
        parts.append("SKIPPED")
    if metrics.get("health/restored"):
        parts.append("RESTORED")
    return " | ".join(parts)


def _plain_progress(items: Iterable[Any], total: int | None, desc: str, stream: TextIO) -> Iterator[Any]:
    every = max(1, (total or 0) // PLAIN_PROGRESS_LINES) if total else 1
    start, done = time.perf_counter(), 0
    for done, item in enumerate(items, 1):
        yield item
        if done % every == 0 and done != total:
            print(f"{desc}: {done}/{total if total else '?'} ({time.perf_counter() - start:.1f}s)", file=stream,
                  flush=True)
    print(f"{desc}: {done}/{total if total else done} done ({time.perf_counter() - start:.1f}s)", file=stream,
          flush=True)


def progress_bar(iterable_or_total: Iterable[Any] | int, desc: str, enabled: bool = True,
             stream: TextIO | None = None) -> Iterable[Any]:
    """Iterate with one progress display per phase.

    An int means `range(n)`. On a TTY: one tqdm bar (left on screen when done). Otherwise (logs, nohup, CI):
    about PLAIN_PROGRESS_LINES plain lines `desc: i/n (t s)` and a final `done` line. `enabled=False`: silent.
    """
    items = range(iterable_or_total) if isinstance(iterable_or_total, int) else iterable_or_total
    if not enabled:
        return items
    out = stream if stream is not None else sys.stdout
    total = len(items) if hasattr(items, "__len__") else None
    if out.isatty():
        from tqdm.auto import tqdm

        return tqdm(items, desc=desc, total=total, file=out, dynamic_ncols=True)
    return _plain_progress(items, total, desc, out)


def write_scored(path: Path, scored: list[Scored]) -> None:
    """One JSON line per completion: task, id, prompt, completion, reward, its parts (per grader), provider; and for
    a multi-turn rollout with tools its messages (replies and tool results) and tool calls / failures; and `extra`,
    the columns reward functions gave TRL's `log_extra` (None where a completion got none, as in TRL's table)."""
    path.parent.mkdir(exist_ok=True)
    columns = list(dict.fromkeys(c for s in scored for c in s.extra))
    with open(path, "w") as f:
        for s in scored:
            extra = {"extra": {c: s.extra.get(c) for c in columns}} if columns else {}
            tools = {} if s.rollout.tool_use is None else {
                "messages": list(s.rollout.messages or ()), "tool_calls": s.rollout.tool_use.n_calls,
                "tool_failures": s.rollout.tool_use.n_failures}
            f.write(json.dumps({"task": s.rollout.sample.task, "id": s.rollout.sample.id,
                                "prompt": s.rollout.sample.messages[-1]["content"], "completion": s.rollout.text,
                                "reward": s.reward, "parts": s.parts, "provider": s.provider,
                                "truncated": s.rollout.truncated, **tools, **extra}) + "\n")


def write_samples(run_dir: Path, tracker: Tracker, scored: list[Scored], step: int) -> None:
    """A step's scored completions into samples/step_N.jsonl, the first 8 to the trackers as text."""
    write_scored(run_dir / "samples" / f"step_{step:06d}.jsonl", scored)
    tracker.log_text("samples", "\n\n".join(f"[{s.rollout.sample.task}] {s.rollout.text!r} -> {s.reward}"
                                             for s in scored[:8]), step)


class StepTimer:
    """`with timer("generate"): ...` records time/generate: the time since the previous phase ended (the step's
    start for the first), so the phases add up to time/step, which `metrics()` adds (up to the last phase's end).

    On CUDA the clock is the device's: a CUDA event is recorded on the stream at the step's start and at each
    phase's end, and `metrics()` waits for the last one (its one host sync) and reads the times between them. The
    host's clock would charge a phase's queued kernels to whichever later phase first waits on the queue."""

    def __init__(self, device: Any = None) -> None:
        self.cuda = device is not None and device.type == "cuda"
        self.marks: list[tuple[str, Any]] = [("", self._now())]

    def _now(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        import torch  # loaded by then: tracking itself stays importable without it (report, plot)

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        try:
            yield
        finally:
            self.marks.append((f"time/{phase}", self._now()))

    def metrics(self) -> dict[str, float]:
        if self.cuda:
            self.marks[-1][1].synchronize()
            seconds = [0.0] + [self.marks[0][1].elapsed_time(mark) / 1000 for _, mark in self.marks[1:]]
        else:
            seconds = [mark - self.marks[0][1] for _, mark in self.marks]
        times = {name: seconds[i] - seconds[i - 1] for i, (name, _) in enumerate(self.marks) if i}
        return {**times, "time/step": seconds[-1]}
