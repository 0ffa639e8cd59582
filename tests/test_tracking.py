"""grpo.run.tracking: JSONL + CSV contents, TensorBoard event files, fan-out, console line and progress."""

import csv
import io
import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch

from grpo.run.doctor.verdict import check_history
from grpo.run.tracking import (
    JsonlTracker,
    MultiTracker,
    NullTracker,
    TensorBoardTracker,
    WandbTracker,
    format_step_line,
    make_trackers,
    progress_bar,
    read_metrics,
    scalars,
)

ROOT = Path(__file__).resolve().parents[1]


def read_csv(path):
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        return reader.fieldnames, list(reader)


def test_jsonl_and_csv_hold_every_row_with_union_of_columns(tmp_path):
    t = JsonlTracker(tmp_path)
    t.log({"loss/total": 0.5, "phase": "rl"}, step=0)
    t.log({"loss/total": 0.25, "kl/fairness": 0.03}, step=1)  # new key: csv rewritten with a new column
    t.log({"loss/total": torch.tensor(0.125)}, step=2)  # 0-d tensor stored as a float
    t.log_text("samples/fairness", "The answer is (b).", step=2)
    t.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"step": 0, "loss/total": 0.5, "phase": "rl"},
        {"step": 1, "loss/total": 0.25, "kl/fairness": 0.03},
        {"step": 2, "loss/total": 0.125},
    ]
    header, rows = read_csv(tmp_path / "metrics.csv")
    assert header == ["step", "loss/total", "phase", "kl/fairness"]
    assert rows == [
        {"step": "0", "loss/total": "0.5", "phase": "rl", "kl/fairness": ""},
        {"step": "1", "loss/total": "0.25", "phase": "", "kl/fairness": "0.03"},
        {"step": "2", "loss/total": "0.125", "phase": "", "kl/fairness": ""},
    ]
    assert json.loads((tmp_path / "samples.jsonl").read_text()) == {
        "step": 2, "key": "samples/fairness", "text": "The answer is (b)."}


def test_jsonl_tracker_appends_on_resume_and_csv_keeps_old_rows(tmp_path):
    t = JsonlTracker(tmp_path)
    t.log({"a": 1.0}, step=0)
    t.close()
    t = JsonlTracker(tmp_path)
    t.log({"a": 2.0, "b": 3.0}, step=1)
    t.close()
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1]
    header, rows = read_csv(tmp_path / "metrics.csv")
    assert header == ["step", "a", "b"]
    assert [r["a"] for r in rows] == ["1.0", "2.0"]


def test_nan_round_trips_through_jsonl_so_health_sees_it(tmp_path):
    t = JsonlTracker(tmp_path)
    t.log({"loss/total": math.nan}, step=4)
    t.close()
    rows = read_metrics(tmp_path)
    assert math.isnan(rows[0]["loss/total"])
    assert [f.code for f in check_history(rows)] == ["non_finite"]


def test_read_metrics_errors_name_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="metrics.jsonl not found"):
        read_metrics(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1, "a"\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2"):
        read_metrics(tmp_path)


def test_scalars_keeps_numbers_only():
    assert scalars({"a": 1, "b": True, "c": "rl", "d": torch.tensor(2.5), "e": [1.0]}) == {
        "a": 1.0, "b": 1.0, "d": 2.5}


def test_tensorboard_event_file_holds_namespaced_scalars_and_text(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = TensorBoardTracker(tmp_path / "tb")
    tb.log({"reward/fairness/mean": 0.5, "kl/fairness": 0.02, "phase": "rl"}, step=0)
    tb.log({"reward/fairness/mean": 0.75, "kl/fairness": 0.04}, step=1)
    tb.log_text("samples/fairness", "hello", step=1)
    tb.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == ["kl/fairness", "reward/fairness/mean"]  # "phase" skipped
    assert [(e.step, e.value) for e in acc.Scalars("reward/fairness/mean")] == [(0, 0.5), (1, 0.75)]
    assert [e.value for e in acc.Scalars("kl/fairness")] == pytest.approx([0.02, 0.04])
    text = acc.Tensors("samples/fairness/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "hello" in text


def test_make_trackers_fans_out_to_jsonl_and_tensorboard(tmp_path):
    tracker = make_trackers(tmp_path, tensorboard=True, wandb_project=None)
    tracker.log({"loss/total": 1.0}, step=0)
    tracker.close()
    assert isinstance(tracker, MultiTracker) and len(tracker.trackers) == 2
    assert read_metrics(tmp_path) == [{"step": 0, "loss/total": 1.0}]
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    multi = MultiTracker([NullTracker(), NullTracker()])
    multi.log({"a": 1.0}, 0)
    multi.log_text("k", "t", 0)
    multi.close()


def test_wandb_missing_gives_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` raise ImportError
    with pytest.raises(ImportError, match="pip install wandb"):  # one of USER_ERRORS: one line, no traceback
        WandbTracker("proj", tmp_path)
    with pytest.raises(ImportError, match="wandb_project='proj'"):
        make_trackers(tmp_path / "run", tensorboard=False, wandb_project="proj")


def test_format_step_line():
    metrics = {"step": 12, "reward/fairness/mean": 0.625, "kl/fairness": 0.031, "beta/fairness": 0.04,
               "reward/hallucination/mean": 0.41, "loss/total": 0.118, "health/grad_norm": 1.23,
               "time/step": 4.214, "health/skipped": 1.0, "phase": "rl"}
    assert format_step_line(metrics, ["fairness", "hallucination"]) == (
        "step 12 | fairness r=0.625 kl=0.031 β=0.040 | hallucination r=0.410 | loss 0.118 | gnorm 1.230 | 4.21s"
        " | SKIPPED")
    assert format_step_line({"step": 0, "kl/fairness": 0.0012}, ["fairness"]) == "step 0 | fairness kl=0.0012"


def test_progress_without_tty_prints_about_ten_lines():
    out = io.StringIO()  # not a TTY
    assert list(progress_bar(20, "rollouts", stream=out)) == list(range(20))
    lines = out.getvalue().splitlines()
    # total 20 -> a line every 2 items: 2, 4, ..., 18 (9 lines), then one "done" line
    assert len(lines) == 10
    assert lines[0].startswith("rollouts: 2/20 (") and lines[-1].startswith("rollouts: 20/20 done (")


def test_progress_disabled_is_silent_and_tty_uses_one_tqdm_bar():
    out = io.StringIO()
    assert list(progress_bar([3, 4], "x", enabled=False, stream=out)) == [3, 4]
    assert out.getvalue() == ""

    class FakeTTY(io.StringIO):
        def isatty(self):
            return True

    tty = FakeTTY()
    bar = progress_bar([1, 2, 3], "train", stream=tty)
    from tqdm.std import tqdm

    assert isinstance(bar, tqdm) and list(bar) == [1, 2, 3]
    assert "train" in tty.getvalue()


# ------------------------------------------------------------------------------------------------------ resume
def _scalars_of(tb_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in sorted(acc.Tags()["scalars"])}


def _interrupted_and_uninterrupted(tmp_path, rows=None):
    """Run A logs steps 1..6 at once. Run B logs 1..5, then 'crashes' (its checkpoint was at step 3), a new process
    builds its trackers on the same folder, resumes at 3 and logs 4..6. Returns (run A folder, run B folder)."""
    def log_step(tracker, step, value):
        tracker.log({"loss/total": value, "phase": "rl"}, step)
        tracker.log_text("samples", f"text {step} {value}", step)

    a = make_trackers(tmp_path / "a", tensorboard=True)
    for step in range(1, 7):
        log_step(a, step, float(step))
    a.close()
    b = make_trackers(tmp_path / "b", tensorboard=True)
    for step in range(1, 6):
        log_step(b, step, float(step) if step <= 3 else -1.0)  # what the interrupted run logged after step 3 differs
    b.close()
    b = make_trackers(tmp_path / "b", tensorboard=True)
    b.resume_at(3, rows)
    for step in range(4, 7):
        log_step(b, step, float(step))
    b.close()
    return tmp_path / "a", tmp_path / "b"


def test_resume_at_rewrites_jsonl_csv_samples_and_tensorboard_like_an_uninterrupted_run(tmp_path):
    a, b = _interrupted_and_uninterrupted(tmp_path)
    assert read_metrics(b) == read_metrics(a) and [r["step"] for r in read_metrics(b)] == [1, 2, 3, 4, 5, 6]
    assert read_csv(b / "metrics.csv") == read_csv(a / "metrics.csv")  # step 4 and 5 once each, not twice
    assert (b / "samples.jsonl").read_text() == (a / "samples.jsonl").read_text()
    assert _scalars_of(b / "tb") == _scalars_of(a / "tb") == {
        "loss/total": [(s, float(s)) for s in range(1, 7)]}


def test_resume_at_with_a_row_count_drops_rows_of_the_checkpoint_step_logged_after_it(tmp_path):
    """The final evaluation logs eval/* at the last step after that step's checkpoint; a kill before the final
    save replays it: the row count stored in the checkpoint drops it, and TensorBoard replays the kept rows."""
    t = make_trackers(tmp_path, tensorboard=True)
    t.log({"loss/total": 1.0}, 4)
    rows = t.rows_logged  # what the checkpoint of step 4 records
    t.log({"eval/fairness/reward": 0.1}, 4)  # the evaluation that the kill interrupted
    t.close()
    t = make_trackers(tmp_path, tensorboard=True)
    t.resume_at(4, rows)
    t.log({"eval/fairness/reward": 0.5}, 4)
    t.close()
    assert read_metrics(tmp_path) == [{"step": 4, "loss/total": 1.0}, {"step": 4, "eval/fairness/reward": 0.5}]
    assert _scalars_of(tmp_path / "tb") == {"eval/fairness/reward": [(4, 0.5)], "loss/total": [(4, 1.0)]}


def test_a_resume_in_the_same_process_and_second_purges_when_the_file_counter_gains_a_digit(tmp_path, monkeypatch):
    """Event files are read in name order, `...<second>.<host>.<pid>.<n>`: within one second of one process the
    purge file `.10` sorted before `.8` and `.9` and replayed the purged events (a flaky failure of the test above
    once other tests had made 8 writers). The tracker waits for the next second instead."""
    from tensorboard.summary.writer import event_file_writer

    monkeypatch.setattr(event_file_writer, "_global_uid", event_file_writer.AtomicCounter(8))
    t = make_trackers(tmp_path, tensorboard=True)
    t.log({"loss/total": 1.0}, 4)
    rows = t.rows_logged
    t.log({"eval/fairness/reward": 0.1}, 4)
    t.close()
    t = make_trackers(tmp_path, tensorboard=True)
    t.resume_at(4, rows)
    t.log({"eval/fairness/reward": 0.5}, 4)
    t.close()
    names = sorted(p.name for p in (tmp_path / "tb").iterdir())
    assert [n.rsplit(".", 1)[1] for n in names] == ["8", "9", "10"]  # the counter did gain a digit
    assert _scalars_of(tmp_path / "tb") == {"eval/fairness/reward": [(4, 0.5)], "loss/total": [(4, 1.0)]}


def test_a_torn_last_line_is_dropped_on_resume(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "a": 1.0}\n{"step": 2, "a"')  # killed mid-write
    t = JsonlTracker(tmp_path)
    t.log({"a": 2.0}, 2)
    t.close()
    assert read_metrics(tmp_path) == [{"step": 1, "a": 1.0}, {"step": 2, "a": 2.0}]
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "a"\n{"step": 2}\n')  # not the tail: corruption
    with pytest.raises(ValueError, match=r"metrics.jsonl:1"):
        JsonlTracker(tmp_path)


# ------------------------------------------------------------------------------------------------- run folder
def test_a_fresh_run_into_a_used_run_folder_stops_with_both_ways_out(tmp_path):
    from grpo.run.checkpoint.folder import RunFolderError, prepare_run_dir

    run = tmp_path / "runs" / "r"
    assert prepare_run_dir(run, resume="", overwrite=False) == run and run.is_dir()  # created
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    (run / "checkpoints" / "step_000001").mkdir(parents=True)  # a checkpoint: the folder is no longer restartable
    with pytest.raises(RunFolderError) as err:
        prepare_run_dir(run, resume="", overwrite=False)
    assert str(run) in str(err.value) and "--resume auto" in str(err.value) and "--overwrite" in str(err.value)
    assert prepare_run_dir(run, resume="auto", overwrite=False) == run and (run / "metrics.jsonl").exists()
    assert prepare_run_dir(run, resume="", overwrite=True) == run
    # a fresh start, restartable until its checkpoint; marked as a run folder, locked by this process
    assert sorted(p.name for p in run.iterdir()) == [".grpo-dual-run", ".grpo-dual.lock", ".restartable"]
    other = tmp_path / "home"
    (other / "notes").mkdir(parents=True)
    with pytest.raises(RunFolderError, match="not a run folder this program made"):
        prepare_run_dir(other, resume="", overwrite=True)
    assert (other / "notes").is_dir()


def test_an_output_dir_that_is_a_file_or_read_only_gives_a_clear_error(tmp_path):
    import os

    from grpo.run.checkpoint.folder import RunFolderError, prepare_run_dir

    afile = tmp_path / "file.txt"
    afile.write_text("x")
    with pytest.raises(RunFolderError, match=f"{afile} is a file, but a parent of the run folder"):
        prepare_run_dir(afile / "r", resume="", overwrite=False)
    with pytest.raises(RunFolderError, match=f"{afile} is a file, but the run folder"):
        prepare_run_dir(afile, resume="", overwrite=False)
    if os.geteuid() == 0:  # root ignores permission bits: use a file system that refuses everyone (sysfs)
        read_only = Path("/sys")
        try:
            (read_only / "grpo-probe").mkdir()
            (read_only / "grpo-probe").rmdir()
            pytest.skip("running as root and /sys is writable: no read-only folder to try")
        except OSError:
            pass
    else:
        read_only = tmp_path / "ro"
        read_only.mkdir(mode=0o500)
    with pytest.raises(RunFolderError, match="cannot be created or written .* writable --output-dir"):
        prepare_run_dir(read_only / "runs" / "r", resume="", overwrite=False)


def test_wandb_can_log_with_a_key_or_an_offline_mode_and_not_without(tmp_path, monkeypatch):
    """With a HOME that holds no ~/.netrc and no settings: no key and no mode cannot log (wandb.init() would raise its
    UsageError, "No API key configured", from inside the run); WANDB_MODE=offline can, so can `wandb offline`'s
    settings file, a key in the environment, and the netrc entry `wandb login` writes. Read from files alone: the
    check never starts wandb's service (which, without a network, waits for its time-out)."""
    from grpo.run.tracking import wandb_can_log

    for name in [k for k in os.environ if k.startswith("WANDB_")] + ["NETRC"]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    assert wandb_can_log(home) is False
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert wandb_can_log(home) is True
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("WANDB_API_KEY", "a" * 40)
    assert wandb_can_log(home) is True
    monkeypatch.delenv("WANDB_API_KEY")
    (tmp_path / "wandb").mkdir()
    (tmp_path / "wandb" / "settings").write_text("[default]\nmode = offline\n")
    assert wandb_can_log(home) is True
    (tmp_path / "wandb" / "settings").write_text("[default]\nmode = online\n")
    assert wandb_can_log(home) is False
    (home / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password " + "b" * 40 + "\n")
    (home / ".netrc").chmod(0o600)
    assert wandb_can_log(home) is True
    (home / ".netrc").write_text("machine example.org\n  login user\n  password x\n")
    assert wandb_can_log(home) is False


def test_wandb_without_a_key_is_refused_before_the_run_naming_the_field_the_user_wrote(tmp_path, monkeypatch):
    """`report_to: wandb` (TRL) or train.wandb_project with wandb installed but not logged in: one line before the
    model loads, naming the field as written and both ways out (it ended in wandb's UsageError traceback)."""
    from tests.test_reliability_inputs import refused as refused_ours
    from tests.test_reliability_trl import User, refused

    pytest.importorskip("wandb")
    monkeypatch.setattr("grpo.run.tracking.wandb_can_log", lambda: False)  # read by the TRL rule at its call
    monkeypatch.setattr("grpo.run.assembly.config_check.wandb_can_log", lambda: False)
    monkeypatch.setenv("GRPO_DUAL_CACHE", str(tmp_path / "cache"))
    user = User(tmp_path / "user")
    user.config = user.write_config(report_to="wandb")
    text = refused(user)
    assert "GRPOConfig.report_to='wandb'" in text and "wandb_project" not in text, text
    assert "`wandb login`" in text and "WANDB_MODE=offline" in text and "UsageError" not in text, text
    text = refused_ours(tmp_path / "ours", "--train.wandb_project", "my-project")
    assert "`train.wandb_project` = 'my-project'" in text, text
    assert "`wandb login`" in text and "WANDB_MODE=offline" in text, text
