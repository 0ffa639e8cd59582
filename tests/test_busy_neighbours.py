"""benchmarks/busy_neighbours.py: it starts the neighbours it says, stops every one of them, and computes the ratios
it prints (a quick command stands in for the demo; the measurement itself is a benchmark, not a test)."""

from __future__ import annotations

import os
import sys

from conftest import load_script

BN = load_script("benchmarks/busy_neighbours.py")


def test_each_load_runs_beside_that_many_spinning_neighbours_and_none_is_left(tmp_path, monkeypatch):
    started: list = []
    real = BN.start_neighbours

    def recording(n, cpus):
        procs = real(n, cpus)
        started.append(procs)
        return procs

    monkeypatch.setattr(BN, "start_neighbours", recording)
    code = "import os; assert os.sched_getaffinity(0) == {0}"  # the trainer is pinned as asked
    monkeypatch.setattr(BN, "trainer_command", lambda args, out, name: [sys.executable, "-c", code])
    result = BN.main(["--repeats", "1", "--cpus", "0", "--json", str(tmp_path / "out.json")])
    assert [len(p) for p in started] == [0, 1, 2]
    assert all(p.returncode is not None for procs in started for p in procs)  # killed and waited for
    assert set(result) == {0, 1, 2} and result[0]["wall_ratio"] == 1.0
    assert all(m["wall"] > 0 for m in result.values())


def test_the_summary_is_the_median_over_repeats_divided_by_idle():
    runs = {0: [{"wall": 10.0, "steps": 5.0}, {"wall": 12.0, "steps": 6.0}, {"wall": 11.0, "steps": 7.0}],
            1: [{"wall": 20.0, "steps": 12.0}, {"wall": 30.0, "steps": 12.0}, {"wall": 22.0, "steps": 12.0}],
            2: [{"wall": 40.0, "steps": 24.0}]}
    s = BN.summary(runs)
    assert s[1] == {"wall": 22.0, "steps": 12.0, "wall_ratio": 2.0, "steps_ratio": 2.0}
    assert s[2]["wall_ratio"] == 40.0 / 11.0
    text = BN.table(s)
    assert "| 1 | 22.0 | 2.00x | 12.0 | 2.00x | <= 2.5x: met |" in text
    assert "| 2 | 40.0 | 3.64x | 24.0 | 4.00x | <= 3.5x: MISSED |" in text


def test_a_failing_trainer_stops_its_neighbours_and_says_why(tmp_path, monkeypatch):
    before = set(os.listdir("/proc"))
    monkeypatch.setattr(BN, "trainer_command", lambda args, out, name: [sys.executable, "-c", "raise SystemExit(3)"])
    try:
        BN.run_once(tmp_path, [], 2, None, tmp_path)
    except RuntimeError as err:
        assert "exit status 3" in str(err)
    else:
        raise AssertionError("a failing trainer must raise")
    spinning = [p for p in set(os.listdir("/proc")) - before if p.isdigit()
                and BN.SPIN in open(f"/proc/{p}/cmdline", "rb").read().decode(errors="replace").replace("\0", " ")]
    assert spinning == []
