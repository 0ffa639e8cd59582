"""Pareto frontier: dominance, capping by crowding, real checkpoint folders in sync with pareto.json, safety."""

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from grpo.run.checkpoint.pareto import ParetoFrontier, crowding_distances, dominates, scalarize_scores


def saver(value):
    def save_fn(path):
        save_file({"w": torch.full((2,), float(value))}, str(path / "model.safetensors"))

    return save_fn


def on_disk(root):
    return sorted(p.name for p in root.iterdir() if p.name.startswith("step_"))


def test_dominates():
    assert dominates({"a": 1.0, "b": 2.0}, {"a": 1.0, "b": 1.0})
    assert not dominates({"a": 1.0, "b": 1.0}, {"a": 1.0, "b": 1.0})  # equal: no strict improvement
    assert not dominates({"a": 2.0, "b": 0.0}, {"a": 1.0, "b": 1.0})  # a trade-off
    assert dominates((3, 3, 3), (3, 2, 3)) and not dominates((3, 2, 3), (3, 3, 3))
    with pytest.raises(ValueError, match="keys differ"):
        dominates({"a": 1.0}, {"b": 1.0})


def test_crowding_and_scalarisation_by_hand():
    pts = [{"a": 0.0, "b": 1.0}, {"a": 0.1, "b": 0.9}, {"a": 0.5, "b": 0.5}, {"a": 1.0, "b": 0.0}]
    # middle points: a-gaps (0.5 − 0)/1 and (1 − 0.1)/1, b-gaps the same by symmetry → 1.0 and 1.8
    dist = crowding_distances(pts)
    assert dist[0] == dist[3] == math.inf
    assert dist[1] == pytest.approx(1.0) and dist[2] == pytest.approx(1.8)
    assert scalarize_scores({"a": 0.2, "b": 0.6}, "mean") == pytest.approx(0.4)
    assert scalarize_scores({"a": 0.2, "b": 0.6}, "min") == pytest.approx(0.2)
    assert scalarize_scores({"a": 0.2, "b": 0.6}, {"a": 3.0, "b": 1.0}) == pytest.approx(1.2)


def test_offer_keeps_folders_and_index_in_sync(tmp_path):
    root = tmp_path / "pareto"
    sentinel = tmp_path / "keep_me.txt"
    sentinel.write_text("outside root_dir")
    fr = ParetoFrontier(cap=3, root_dir=root)
    assert fr.offer(10, {"fair": 0.2, "hall": 0.2}, saver(10))
    assert fr.offer(20, {"fair": 0.5, "hall": 0.1}, saver(20))  # trade-off with step 10: both kept
    assert not fr.offer(30, {"fair": 0.1, "hall": 0.1}, saver(30))  # dominated by step 10
    assert "dominated" in fr.last_reason and not (root / "step_000030").exists()
    assert not fr.offer(35, {"fair": 0.2, "hall": 0.2}, saver(35))  # equal to step 10
    assert not fr.offer(40, {"fair": float("nan"), "hall": 0.9}, saver(40))
    assert "non-finite" in fr.last_reason
    assert on_disk(root) == ["step_000010", "step_000020"]
    assert fr.offer(50, {"fair": 0.3, "hall": 0.3}, saver(50))  # dominates step 10 → its folder goes
    assert on_disk(root) == ["step_000020", "step_000050"]
    index = json.loads((root / "pareto.json").read_text())
    assert [(p["step"], p["path"]) for p in index["points"]] == [(20, "step_000020"), (50, "step_000050")]
    assert index["points"][1]["scores"] == {"fair": 0.3, "hall": 0.3}
    for p in index["points"]:  # every listed folder holds the checkpoint its save_fn wrote
        assert load_file(str(root / p["path"] / "model.safetensors"))["w"][0].item() == p["step"]
    assert sentinel.read_text() == "outside root_dir"
    assert not list(root.glob(".*.tmp"))  # the atomic write left no temporary file


def test_a_report_rebuilt_from_the_run_folder_names_the_best_pareto_point(tmp_path):
    # the report of `python -m grpo.run.doctor report RUN` (no Run object) says which checkpoint is best, as finish()
    # does
    import shutil

    from grpo.run.doctor.report import build_report

    run_dir = tmp_path / "run"
    shutil.copytree(Path(__file__).resolve().parent / "fixtures" / "run_demo", run_dir,
                    ignore=shutil.ignore_patterns("*.png", "report.json", "*.py"))
    assert "pareto_best" not in build_report(run_dir)  # no frontier: no key
    fr = ParetoFrontier(cap=3, root_dir=run_dir / "pareto")
    fr.offer(10, {"fair": 0.2, "hall": 0.6}, saver(10))  # mean 0.4
    fr.offer(20, {"fair": 0.5, "hall": 0.2}, saver(20))  # mean 0.35: kept (a trade-off), not the best
    assert build_report(run_dir)["pareto_best"] == {"step": 10, "scores": {"fair": 0.2, "hall": 0.6},
                                                    "path": str((run_dir / "pareto" / "step_000010").resolve())}
    assert json.loads((run_dir / "report.json").read_text())["pareto_best"]["step"] == 10


def test_cap_drops_least_crowded_and_its_folder(tmp_path):
    fr = ParetoFrontier(cap=3, root_dir=tmp_path)
    for step, (a, b) in [(1, (0.0, 1.0)), (2, (1.0, 0.0)), (3, (0.3, 0.7))]:
        assert fr.offer(step, {"a": a, "b": b}, saver(step))
    # + (0.6, 0.5): crowding of step 3 = (.6 − 0) + (1 − .5) = 1.1, of the new point = (1 − .3) + (.7 − 0) = 1.4
    # (ranges are 1) → step 3 is dropped with its folder
    assert fr.offer(4, {"a": 0.6, "b": 0.5}, saver(4))
    assert on_disk(tmp_path) == ["step_000001", "step_000002", "step_000004"]
    # + (0.45, 0.62): new = (.6 − 0) + (1 − .5) = 1.1, step 4 = (1 − .45) + (.62 − 0) = 1.17 → refused unsaved
    assert not fr.offer(5, {"a": 0.45, "b": 0.62}, saver(5))
    assert "cap" in fr.last_reason and not (tmp_path / "step_000005").exists()
    assert [p.step for p in fr.points] == [1, 2, 4]

    fr2 = ParetoFrontier(cap=2, root_dir=tmp_path / "cap2", scalarize="mean")
    assert fr2.offer(1, {"a": 0.0, "b": 1.0}, saver(1))
    assert fr2.offer(2, {"a": 0.6, "b": 0.6}, saver(2))
    # cap = 2: (1.0, 0.0) makes step 2 the only interior point, crowding (1 − 0) + (1 − 0) = 2 < ∞ → dropped
    assert fr2.offer(3, {"a": 1.0, "b": 0.0}, saver(3))
    assert [p.step for p in fr2.points] == [1, 3] and on_disk(tmp_path / "cap2") == ["step_000001", "step_000003"]
    # cap = 1: both points are extremes (∞); the lower mean score goes: 0.5 < 0.55, so the old one is replaced
    fr1 = ParetoFrontier(cap=1, root_dir=tmp_path / "cap1")
    assert fr1.offer(1, {"a": 0.0, "b": 1.0}, saver(1))
    assert fr1.offer(2, {"a": 0.5, "b": 0.6}, saver(2))
    assert on_disk(tmp_path / "cap1") == ["step_000002"]
    assert not fr1.offer(3, {"a": 0.9, "b": 0.0}, saver(3))  # mean 0.45 < 0.55: refused


def test_best_by_scalarisation(tmp_path):
    fr = ParetoFrontier(cap=5, root_dir=tmp_path, scalarize="mean")
    assert fr.best() is None
    fr.offer(1, {"a": 0.9, "b": 0.1}, saver(1))  # mean .5, min .1, 3a+b = 2.8
    fr.offer(2, {"a": 0.4, "b": 0.4}, saver(2))  # mean .4, min .4, 3a+b = 1.6
    fr.offer(3, {"a": 0.1, "b": 0.95}, saver(3))  # mean .525, min .1, 3a+b = 1.25
    assert fr.best().step == 3
    assert fr.best("min").step == 2
    assert fr.best({"a": 3.0, "b": 1.0}).step == 1
    assert fr.best().path == (tmp_path / "step_000003").resolve()
    with pytest.raises(ValueError, match="miss keys"):
        fr.best({"a": 1.0})


def test_resume_from_index_and_orphans(tmp_path):
    fr = ParetoFrontier(cap=4, root_dir=tmp_path)
    fr.offer(1, {"a": 0.0, "b": 1.0}, saver(1))
    fr.offer(2, {"a": 1.0, "b": 0.0}, saver(2))
    orphan = tmp_path / "step_000007"  # a crash after save_fn, before the index was written
    orphan.mkdir()
    (orphan / ".pareto_point").write_text("7\n")
    foreign = tmp_path / "step_000008"  # not ours: no marker
    foreign.mkdir()
    again = ParetoFrontier.load(cap=4, root_dir=tmp_path)
    assert again.state_dict() == fr.state_dict()
    assert again.remove_orphans() == [orphan] and foreign.exists()
    assert again.offer(3, {"a": 1.0, "b": 1.0}, saver(3))  # dominates both
    assert on_disk(tmp_path) == ["step_000003", "step_000008"]
    with pytest.raises(ValueError, match="no .pareto_point marker"):
        again.offer(8, {"a": 2.0, "b": 2.0}, saver(8))  # would overwrite the foreign folder: refused


def test_never_deletes_outside_root(tmp_path):
    root = tmp_path / "pareto"
    outside = tmp_path / "step_000001"  # looks like a step folder, but is not inside root_dir
    outside.mkdir()
    (outside / ".pareto_point").write_text("1\n")
    fr = ParetoFrontier(cap=3, root_dir=root)
    bad = {"cap": 3, "points": [{"step": 1, "scores": {"a": 0.0}, "path": "../step_000001"}]}
    with pytest.raises(ValueError, match="refusing"):
        fr.load_state_dict(bad)
    with pytest.raises(ValueError, match="refusing"):
        fr._remove_dir(tmp_path)
    assert outside.exists()


def test_failed_save_leaves_nothing(tmp_path):
    fr = ParetoFrontier(cap=3, root_dir=tmp_path)

    def broken(path):
        (path / "half.bin").write_bytes(b"x")
        raise OSError("disk full")

    with pytest.raises(OSError):
        fr.offer(1, {"a": 1.0}, broken)
    assert fr.points == [] and on_disk(tmp_path) == []
    with pytest.raises(RuntimeError, match="wrote nothing"):
        fr.offer(2, {"a": 1.0}, lambda path: None)
    assert on_disk(tmp_path) == []


def test_empty_scores_are_refused_with_a_clear_error(tmp_path):
    """A task with no held-out rows evaluates to {}: refused when offered, since accepted it makes best() divide by
    zero later."""
    fr = ParetoFrontier(cap=3, root_dir=tmp_path)
    with pytest.raises(ValueError, match="step 3 has no scores: no task had held-out rows"):
        fr.offer(3, {}, saver(3))
    assert fr.points == [] and on_disk(tmp_path) == [] and fr.best() is None
    with pytest.raises(ValueError, match="no scores to scalarise"):
        scalarize_scores({}, "mean")


def test_every_task_needs_training_and_heldout_rows():
    from grpo.run.checkpoint.pareto import require_heldout_rows

    require_heldout_rows({"a": [1, 2, 3], "b": [1]}, {"a": [4], "b": [2]}, 0.2)  # fine: no error
    with pytest.raises(ValueError) as err:
        require_heldout_rows({"qa": [1, 2, 3], "b": [1]}, {"b": [2], "c": [1, 2]}, 0.2)
    message = str(err.value)
    assert "task 'qa' has 3 rows and none held out" in message and "data.heldout_fraction=0.2" in message
    assert "about 5 per held-out row" in message
    assert "task 'c' has all its 2 rows held out and none to train on" in message and "'b'" not in message


def test_a_kill_while_a_dominated_point_is_deleted_leaves_nothing_behind(tmp_path, monkeypatch):
    """A kill inside the deletion of a dominated point: an rmtree killed after the marker and before the weights
    leaves a step folder that is not the frontier's and stays forever. Deleting goes through a rename, and the
    resumed frontier's `remove_orphans` sweeps what the kill left."""
    import grpo.run.checkpoint.pareto as P

    fr = ParetoFrontier(cap=4, root_dir=tmp_path)
    fr.offer(1, {"a": 0.0, "b": 0.0}, saver(1))
    real_rmtree = P.shutil.rmtree

    def killed_midway(path, ignore_errors=False):  # the marker goes first, then the process dies
        (Path(path) / ".pareto_point").unlink()
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(P.shutil, "rmtree", killed_midway)
    with pytest.raises(KeyboardInterrupt):
        fr.offer(2, {"a": 1.0, "b": 1.0}, saver(2))  # dominates step 1, whose deletion is killed
    monkeypatch.setattr(P.shutil, "rmtree", real_rmtree)
    assert on_disk(tmp_path) == ["step_000002"]  # no marker-less step_000001 left looking like a foreign folder
    again = ParetoFrontier.load(cap=4, root_dir=tmp_path)  # the index of before the kill: step 1 only
    again.remove_orphans()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".removing-")]
