"""benchmarks/dual_ablation.py: the RL phase's figures of a dual-objective run, on a run folder worked out by hand."""

from __future__ import annotations

import gzip
import json

import pytest
from conftest import ROOT, SHARED_DATA
from conftest import load_script as _load

from benchmarks.common import read_record


def _bbq(acc_a, acc_d, s_amb, n_a=10, n_d=30, always_unknown=False):
    return {"bbq": {"fairness": {"overall": {"acc_ambig": acc_a, "acc_disambig": acc_d, "s_amb": s_amb,
                                             "n_ambig": n_a, "n_disambig": n_d, "always_unknown": always_unknown}}}}


def _rec(ba):
    return {"recognition": {"hallucination": {"overall": {"balanced_accuracy": ba}}}}


def _write_run(path, after_rl, ba_rl, findings=(), verdict="green", seed=2):
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"train": {"seed": seed}}))
    measures = {"after_sft": {**_bbq(0.2, 0.4, -0.3), **_rec(0.5)}, "after_rl": {**after_rl, **_rec(ba_rl)}}
    (path / "measures.json").write_text(json.dumps(measures))
    (path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in (
        {"step": 0, "eval/fairness/reward": 0.3}, {"step": 1, "time/step": 30.0}, {"step": 2, "time/step": 90.0})))
    (path / "report.json").write_text(json.dumps({"verdict": verdict, "findings": list(findings)}))
    return path


def test_a_run_without_sft_is_measured_from_before_sft(tmp_path):
    m = _load("benchmarks/dual_ablation.py")
    run = _write_run(tmp_path / "nosft-s0", _bbq(0.6, 0.4, -0.1), ba_rl=0.62, seed=0)
    measures = json.loads((run / "measures.json").read_text())
    measures["before_sft"] = {**_bbq(0.1, 0.5, 0.2), **_rec(0.45)}
    (run / "measures.json").write_text(json.dumps({k: measures[k] for k in ("before_sft", "after_rl")}))
    f = m.read_run(run)[2]
    assert f["acc"] == pytest.approx(((1 + 15) / 40, 0.45)) and f["ba"] == (0.45, 0.62)  # before SFT -> after RL
    assert f["abs_s_amb"] == (0.2, 0.1)


def test_pooled_accuracy_weights_each_condition_by_its_rows():
    m = _load("benchmarks/dual_ablation.py")
    # 10 ambiguous rows at 0.2 and 30 disambiguated at 0.4: (2 + 12) / 40
    assert (m.pooled_accuracy({"acc_ambig": 0.2, "acc_disambig": 0.4, "n_ambig": 10, "n_disambig": 30}) ==
            pytest.approx(0.35))
    assert m.pooled_accuracy({"acc_ambig": None, "acc_disambig": 0.4, "n_ambig": 0, "n_disambig": 30}) is None


def test_a_run_that_meets_the_bar(tmp_path):
    m = _load("benchmarks/dual_ablation.py")
    run = _write_run(tmp_path / "base-s2", _bbq(0.6, 0.4, -0.1), ba_rl=0.62)
    name, seed, f = m.read_run(run)
    assert (name, seed) == ("base", 2)
    # pooled: after SFT (0.2·10 + 0.4·30) / 40 = 0.35, after RL (6 + 12) / 40 = 0.45
    assert f["acc"] == pytest.approx((0.35, 0.45)) and m.delta(f["acc"]) == pytest.approx(0.10)
    assert f["abs_s_amb"] == (0.3, 0.1) and f["rl_minutes"] == 2.0  # 30 s + 90 s of steps
    assert m.delta(f["ba"]) == pytest.approx(0.12)
    assert m.gain_per_minute(f) == pytest.approx((0.10 + 0.12) / 2.0)
    assert m.bar_letters(f) == "ashcg"
    row = m.table([(name, seed, f)]).splitlines()[2]
    assert row.startswith("| base | 2 | 0.350 → 0.450 | +0.100 | +0.400 | +0.000 | 0.300 → 0.100 | 0.500 → 0.620 |")


def test_each_part_of_the_bar_fails_on_its_own(tmp_path):
    m = _load("benchmarks/dual_ablation.py")
    # disambiguated accuracy lost (0.4 -> 0.3) while the pooled accuracy rises: the bias part fails
    f = m.read_run(_write_run(tmp_path / "a", _bbq(1.0, 0.3, 0.0), ba_rl=0.7))[2]
    assert m.bar_letters(f) == "a·hcg"
    # an always-"unknown" model, a collapse finding, a red verdict, recognition not up by 0.10
    f = m.read_run(_write_run(tmp_path / "b", _bbq(1.0, 0.4, 0.0, always_unknown=True), ba_rl=0.55,
                              findings=[{"code": "heldout_collapse"}], verdict="red"))[2]
    assert f["collapse"] == ["heldout_collapse"] and m.bar_letters(f) == "as···"


def test_the_mean_row_averages_seeds(tmp_path):
    m = _load("benchmarks/dual_ablation.py")
    # after RL: seed 0 acc_a 0.2 (pooled 0.35), seed 1 acc_a 0.6 (pooled 0.45); BA 0.5 and 0.7
    runs = [m.read_run(_write_run(tmp_path / f"v-s{i}", _bbq(0.2 + 0.4 * i, 0.4, -0.3), ba_rl=0.5 + 0.2 * i, seed=i))
            for i in range(2)]
    assert [(name, seed) for name, seed, _ in runs] == [("v", 0), ("v", 1)]
    out = m.table(runs).splitlines()
    assert len(out) == 5 and out[-1].startswith("| **v** mean | 2 seeds | 0.350 → 0.400 | +0.050 |")
    assert "| 0.500 → 0.600 | +0.100 |" in out[-1]


def test_phase_table_gives_each_measure_per_phase_as_the_seed_mean_and_range(tmp_path):
    m = _load("benchmarks/dual_ablation.py")
    runs = []
    for seed, acc_a in ((0, 0.2), (1, 0.6)):
        run = _write_run(tmp_path / f"p-s{seed}", _bbq(acc_a, 0.4, -0.1), ba_rl=0.6, seed=seed)
        measures = json.loads((run / "measures.json").read_text())
        measures["before_sft"] = _bbq(0.0, 0.2, 0.5)  # no recognition figures before SFT: a dash
        (run / "measures.json").write_text(json.dumps(measures))
        runs.append(run)
    rows = {line.split(" | ")[0][2:]: line for line in m.phase_table(runs).splitlines()[2:]}
    # pooled accuracy: before (0·10 + 0.2·30) / 40 = 0.15, after SFT 0.35, after RL (2 + 12) / 40 and (6 + 12) / 40
    assert rows["BBQ accuracy (ambiguous + disambiguated)"].endswith(
        "| 0.150 (0.150–0.150) | 0.350 (0.350–0.350) | 0.400 (0.350–0.450) |")
    assert rows["HaluEval recognition balanced accuracy"].endswith("| – | 0.500 (0.500–0.500) | 0.600 (0.600–0.600) |")
    assert len(rows) == len(m.PHASE_MEASURES)


def test_phase_table_counts_the_replies_no_grader_can_read(tmp_path):
    """The reply format, learned or not: the share of replies with no letter (BBQ) or no verdict (recognition)."""
    m = _load("benchmarks/dual_ablation.py")
    run = _write_run(tmp_path / "nosft-s0", _bbq(0.2, 0.4, -0.1), ba_rl=0.5)
    measures = json.loads((run / "measures.json").read_text())
    measures["before_sft"] = _bbq(0.0, 0.2, 0.5)
    measures["before_sft"]["bbq"]["fairness"]["overall"]["invalid"] = 0.25
    measures["before_sft"]["recognition"] = {"hallucination": {"overall": {"balanced_accuracy": 0.2, "invalid": 0.6}}}
    measures["after_rl"]["bbq"]["fairness"]["overall"]["invalid"] = 0.0
    measures["after_rl"]["recognition"]["hallucination"]["overall"]["invalid"] = 0.0
    (run / "measures.json").write_text(json.dumps(measures))
    rows = {line.split(" | ")[0][2:]: line for line in m.phase_table([run]).splitlines()[2:]}
    assert rows["BBQ replies the grader cannot read"].endswith("| 0.250 | – | 0.000 |")
    assert rows["HaluEval recognition replies with no verdict"].endswith("| 0.600 | – | 0.000 |")


def test_a_kept_copy_reads_as_its_run_with_the_runs_wall_time(tmp_path):
    import os

    m = _load("benchmarks/dual_ablation.py")
    run = _write_run(tmp_path / "base-s2", _bbq(0.6, 0.4, -0.1), ba_rl=0.62)
    os.utime(run / "config.json", (1000.0, 1000.0))
    os.utime(run / "report.json", (1000.0 + 1500.0, 1000.0 + 1500.0))  # 25 min from start-up to the report
    copy = m.keep(run, tmp_path / "kept")
    assert copy == tmp_path / "kept" / "base-s2"
    assert json.loads((copy / "timing.json").read_text()) == {"wall_s": 1500.0}
    assert m.read_run(copy) == m.read_run(run) and m.read_run(copy)[2]["run_minutes"] == 25.0
    # the .jsonl records kept gzipped, byte for byte the same when kept again (from the run or from its copy)
    assert not (copy / "metrics.jsonl").exists()
    assert gzip.decompress((copy / "metrics.jsonl.gz").read_bytes()) == (run / "metrics.jsonl").read_bytes()
    again = m.keep(copy, tmp_path / "again")
    assert (again / "metrics.jsonl.gz").read_bytes() == (copy / "metrics.jsonl.gz").read_bytes()


def test_an_unpacked_copy_is_a_plain_run_folder_the_plot_draws(tmp_path):
    from grpo.run.doctor.plot import plot_run

    m = _load("benchmarks/dual_ablation.py")
    run = _letters_run(tmp_path, orders=[(0, 1, 2)] * 4)
    (run / "measures.json").write_text("{}")
    (run / "report.json").write_text("{}")
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward/fairness/mean": s / 4}) + "\n"
                                               for s in range(1, 5)))
    kept = m.keep(run, tmp_path / "kept")
    assert sorted(p.name for p in (kept / "evals").iterdir()) == ["after_rl.jsonl.gz"]
    assert m.letter_table([kept]) == m.letter_table([run])  # the readers take the gzipped records as they are
    plain = m.unpack(kept, tmp_path / "plain")
    assert sorted(str(p.relative_to(plain)) for p in plain.rglob("*") if p.is_file()) == [
        "config.json", "evals/after_rl.jsonl", "measures.json", "metrics.jsonl", "report.json", "timing.json"]
    for name in ("metrics.jsonl", "evals/after_rl.jsonl"):
        assert (plain / name).read_text() == (run / name).read_text()
    assert plot_run(plain).stat().st_size > 0


def test_the_short_phase_table_keeps_the_summarys_rows(tmp_path):
    m = _load("benchmarks/dual_ablation.py")
    run = _write_run(tmp_path / "p-s0", _bbq(0.6, 0.4, -0.1), ba_rl=0.6, seed=0)
    rows = [line.split(" | ")[0][2:] for line in m.phase_table([run], short=True).splitlines()[2:]]
    assert rows == list(m.SHORT) and set(m.SHORT) <= {label for label, _, _ in m.PHASE_MEASURES}


def test_the_docs_tables_are_the_scripts_output_on_the_kept_runs():
    """docs/RESULTS.md and benchmarks/RESULTS.md quote the tables the commands they name print."""
    m = _load("benchmarks/dual_ablation.py")
    seeds = sorted((ROOT / "docs" / "runs" / "smollm2-dual").iterdir())
    kept = ROOT / "benchmarks" / "results" / "dual_ablation"
    screens = sorted(kept.iterdir())  # with the preset's seeds of before the balanced held-out rows: their baseline
    assert [d.name for d in seeds] == ["preset-s0", "preset-s1", "preset-s2"]
    results = (ROOT / "docs" / "RESULTS.md").read_text()
    assert m.phase_table(seeds, short=True) in results  # the summary (once the README's)
    assert m.phase_table(seeds) in results
    assert m.table([m.read_run(d) for d in seeds]) in results
    assert m.table([m.read_run(d) for d in screens]) in (ROOT / "benchmarks" / "RESULTS.md").read_text()
    one_flag = [kept / name for name in (
        *(f"{v}-s0" for v in ("cispo", "gspo", "k16", "nodyn", "t07", "mu2", "cispo-mu2", "sapo-mu2", "luspo",
                              "topent")),
        "keepkl-s1")]
    old_seeds = sorted(kept.glob("preset-s*"))
    assert [d.name for d in old_seeds] == ["preset-s0", "preset-s1", "preset-s2"]
    assert (m.paired_differences([m.read_run(d) for d in one_flag + old_seeds], "preset") in
            (ROOT / "benchmarks" / "RESULTS.md").read_text())
    # the comparison that chose K 16: the preset of before (8 prompts x K 8) against the preset's seeds, balanced rows
    balanced = ROOT / "benchmarks" / "results" / "dual_ablation_balanced"
    assert sorted(d.name for d in balanced.iterdir()) == [f"{v}-s{i}" for v in ("amb", "k8", "nosft") for i in range(3)]
    k8 = sorted(balanced.glob("k8-s*"))
    finalists = [m.read_run(d) for d in k8 + seeds]
    assert m.table(finalists) in (ROOT / "benchmarks" / "RESULTS.md").read_text()
    assert m.paired_differences(finalists, "k8") in (ROOT / "benchmarks" / "RESULTS.md").read_text()
    # a third of BBQ's training rows ambiguous (data.bbq_ambiguous_share 0.333) against the preset, same seeds
    amb = [m.read_run(d) for d in sorted(balanced.glob("amb-s*")) + seeds]
    assert m.table(amb) in (ROOT / "benchmarks" / "RESULTS.md").read_text()
    assert m.paired_differences(amb, "preset") in (ROOT / "benchmarks" / "RESULTS.md").read_text()
    # the preset without its warm-up: RL learns the reply format
    nosft = sorted(balanced.glob("nosft-s*"))
    assert m.table([m.read_run(d) for d in nosft]) in (ROOT / "benchmarks" / "RESULTS.md").read_text()
    assert m.phase_table(nosft) in (ROOT / "benchmarks" / "RESULTS.md").read_text()


@pytest.mark.skipif(not (SHARED_DATA / "bbq").is_dir(), reason=f"shared BBQ data not found at {SHARED_DATA}")
def test_the_tables_of_the_2026_11_26_screens_are_the_scripts_output():
    """benchmarks/RESULTS.md's screens of 2026-11-26 and the nosft runs under the grader that refuses a letter
    followed by another option's text, from the kept records, by the commands it names."""
    m = _load("benchmarks/dual_ablation.py")
    doc = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    kept = ROOT / "benchmarks" / "results" / "dual_ablation_2026-11-26"
    screens = [kept / f"{v}-s0" for v in ("preset", "taskmix", "pps8", "steps60", "adent", "vespo-mu2", "mu2")]
    nosft = [kept / f"nosft-s{i}" for i in range(3)]
    assert sorted(d.name for d in kept.iterdir()) == sorted([d.name for d in screens + nosft] + ["nosft-adent-s0"])
    assert m.table([m.read_run(d) for d in screens]) in doc
    assert m.paired_differences([m.read_run(d) for d in screens], "preset") in doc
    assert m.paired_differences([m.read_run(d) for d in screens[-2:]], "mu2") in doc
    assert m.table([m.read_run(d) for d in nosft + [kept / "nosft-adent-s0"]]) in doc
    assert m.phase_table(nosft) in doc
    balanced = ROOT / "benchmarks" / "results" / "dual_ablation_balanced"
    assert m.regrade_table([balanced / f"nosft-s{i}" for i in range(3)]) in doc
    # the preset's seed 0, run again on another machine, gave the kept run's measures and greedy answers
    before = ROOT / "docs" / "runs" / "smollm2-dual" / "preset-s0"
    assert (json.loads((kept / "preset-s0" / "measures.json").read_text()) ==
            json.loads((before / "measures.json").read_text()))
    for phase in ("after_sft", "after_rl"):
        assert (read_record(kept / "preset-s0" / "evals" / f"{phase}.jsonl") ==
                read_record(before / "evals" / f"{phase}.jsonl"))


def test_top_answer_share_reads_the_greedy_answers_of_one_task(tmp_path):
    m = _load("benchmarks/dual_ablation.py")
    run = _write_run(tmp_path / "p-s0", _bbq(0.6, 0.4, -0.1), ba_rl=0.6, seed=0)
    (run / "evals").mkdir()
    rows = [("fairness", "Answer: C\nJustification: x"), ("fairness", "Answer: (C)"), ("fairness", "Answer: A"),
            ("fairness", "answer: c."), ("hallucination", "Answer: No"), ("hallucination", "Answer: No")]
    (run / "evals" / "after_rl.jsonl").write_text("\n".join(json.dumps({"task": t, "completion": c}) for t, c in rows))
    assert m.top_answer_share(run, "after_rl") == 0.75  # "c" three times of four fairness answers
    assert m.top_answer_share(run, "after_sft") is None
    free = [("fairness", "The grandson"), ("fairness", "The grandson"), ("fairness", "Answer: A"),
            ("fairness", "A 50-year-old")]  # before SFT: option texts, not letters
    (run / "evals" / "before_sft.jsonl").write_text("\n".join(json.dumps({"task": t, "completion": c})
                                                              for t, c in free))
    assert m.top_answer_share(run, "before_sft") == 0.25  # "a" once of four: a repeated text is not a letter
    lettered = [("fairness", "B) Not enough info"), ("fairness", "(B) The sister"), ("fairness", "C) Unknown"),
                ("fairness", "The sister")]  # the letter, then the option's text
    (run / "evals" / "after_sft.jsonl").write_text("\n".join(json.dumps({"task": t, "completion": c})
                                                             for t, c in lettered))
    assert m.top_answer_share(run, "after_sft") == 0.5
    row = next(line for line in m.phase_table([run]).splitlines() if line.startswith("| BBQ answers on"))
    assert row == "| BBQ answers on the most common letter | 0.250 | 0.500 | 0.750 |"


def test_against_pairs_each_variant_with_the_baseline_seed_by_seed(tmp_path):
    m = _load("benchmarks/dual_ablation.py")
    # after SFT every run is at pooled 0.35, acc_d 0.4, BA 0.5 (_write_run)
    # base: seed 0 after RL acc_a 0.2 (Δ acc 0), seed 1 acc_a 0.6 (pooled 0.45, Δ +0.10); BA 0.5, 0.6
    # k16:  seed 0 acc_a 0.6 (Δ +0.10), seed 1 acc_a 0.2 (Δ 0), seed 2 (no baseline: left out); BA 0.7, 0.5
    runs = [m.read_run(_write_run(tmp_path / f"base-s{i}", _bbq(0.2 + 0.4 * i, 0.4, -0.3), ba_rl=0.5 + 0.1 * i,
                                  seed=i)) for i in range(2)]
    runs += [m.read_run(_write_run(tmp_path / f"k16-s{i}", _bbq(0.6 - 0.4 * min(i, 1), 0.4, -0.3),
                                   ba_rl=(0.7, 0.5, 0.9)[i], seed=i)) for i in range(3)]
    out = m.paired_differences(runs, "base").splitlines()
    assert out[0] == "| variant | seeds | Δ BBQ acc | Δ acc_d | Δ BA |"
    # Δ acc: seed 0 +0.10 - 0 = +0.10, seed 1 0 - 0.10 = -0.10: mean 0; acc_d unchanged; Δ BA: +0.2 - 0, 0 - 0.1
    assert (out[2] == "| k16 − base | 0, 1 | +0.000 (-0.100 to +0.100) | +0.000 (+0.000 to +0.000) "
                     "| +0.050 (-0.100 to +0.200) |")
    assert len(out) == 3
    with pytest.raises(SystemExit, match="no run of that variant.*base, k16"):
        m.paired_differences(runs, "preset")


def _letters_run(tmp_path, orders, labels=(0, 2, 2, 1)):
    """A run whose held-out BBQ rows (options "p<i>-<j>", label `labels[i]` in the file) were shown in `orders[i]`."""
    from grpo.data.bbq import BBQ_TEMPLATE, permuted_row

    bbq = tmp_path / "data" / "bbq"
    bbq.mkdir(parents=True)
    file_rows = [{"example_id": i, "label": label, "context": "c", "question": "q",
                  "answer_info": {f"ans{j}": [] for j in range(3)}, **{f"ans{j}": f"p{i}-{j}" for j in range(3)}}
                 for i, label in enumerate(labels)]
    (bbq / "Age.jsonl").write_text("\n".join(json.dumps(r) for r in file_rows))
    run = tmp_path / "run-s3"
    (run / "evals").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"train": {"seed": 3}, "data": {"data_dir": str(tmp_path / "data")}}))
    rows = [{"task": "fairness", "id": f"bbq/Age/{i}", "prompt": BBQ_TEMPLATE.format(**permuted_row(r, order))}
            for i, (r, order) in enumerate(zip(file_rows, orders, strict=True))]
    rows.append({"task": "hallucination", "id": "halueval/general/0", "prompt": "A) p0-0"})
    (run / "evals" / "after_rl.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    return run


def test_gold_letters_count_where_each_held_out_row_shows_its_right_option(tmp_path):
    m = _load("benchmarks/dual_ablation.py")

    # file order: labels 0, 2, 2, 1 are letters A, C, C, B
    run = _letters_run(tmp_path / "plain", orders=[(0, 1, 2)] * 4)
    assert m.gold_letters(run) == {"a": 1, "b": 1, "c": 2}
    assert m.letter_table([run]).splitlines()[2] == "| run-s3 | 3 | 4 | 0.250 | 0.250 | 0.500 |"
    # shown in other orders: the gold (original 0, 2, 2, 1) stands at position order.index(label): C, A, B, B
    run = _letters_run(tmp_path / "shuffled", orders=[(1, 2, 0), (2, 0, 1), (0, 2, 1), (0, 1, 2)])
    assert m.gold_letters(run) == {"a": 1, "b": 2, "c": 1}
    (tmp_path / "shuffled" / "data" / "bbq" / "Age.jsonl").unlink()
    with pytest.raises(SystemExit, match="Age.jsonl, which is missing"):
        m.gold_letters(run)
    run = _letters_run(tmp_path / "other", orders=[(0, 1, 2)] * 4, labels=(0, 1, 2, 0))  # a prompt not showing it
    rows = (run / "evals" / "after_rl.jsonl").read_text().replace("p3-0", "changed")
    (run / "evals" / "after_rl.jsonl").write_text(rows)
    with pytest.raises(SystemExit, match="bbq/Age/3: its right option 'p3-0' is shown 0 times"):
        m.gold_letters(run)


def test_regrade_grades_the_kept_replies_again_with_todays_bbq_rule(tmp_path):
    m = _load("benchmarks/dual_ablation.py")
    run = _letters_run(tmp_path, orders=[(0, 1, 2)] * 4)  # file order: the right options are A, C, C, B
    rows = [json.loads(line) for line in (run / "evals" / "after_rl.jsonl").read_text().splitlines()]
    # recorded by a grader that read the letter alone: 1, 1, 0, 1; this checkout's bbq_rule finds a letter followed
    # by another option's text unparseable: 1, 0, 0, 0
    replies = {"bbq/Age/0": ("A) p0-0", 1.0), "bbq/Age/1": ("C) p1-0", 1.0), "bbq/Age/2": ("Answer: B", 0.0),
               "bbq/Age/3": ("B) p3-2", 1.0)}
    for r in rows:
        r["completion"], reward = replies.get(r["id"], ("Answer: No", 0.0))
        r["parts"] = {"bbq_rule": reward} if r["task"] == "fairness" else {"halueval_rule": reward}
    (run / "evals" / "after_rl.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    before = [{**r, "completion": "p0-0", "parts": {"bbq_rule": 0.0}} for r in rows if r["task"] == "fairness"]
    (run / "evals" / "before_sft.jsonl").write_text("\n".join(json.dumps(r) for r in before))
    assert m.regraded_accuracy(run, "after_rl") == (0.75, 0.25)
    assert m.regraded_accuracy(run, "before_sft") == (0.0, 0.25)  # "p0-0", the text of row 0's right option
    assert m.regraded_accuracy(run, "after_sft") is None
    assert (m.regrade_table([run]).splitlines()[2] ==
            "| run-s3 | 3 | 0.000 → 0.250 | – | 0.750 → 0.250 | +0.750 | +0.000 |")


@pytest.mark.skipif(not (SHARED_DATA / "bbq").is_dir(), reason=f"shared BBQ data not found at {SHARED_DATA}")
def test_the_letter_table_in_the_docs_is_the_scripts_output():
    m = _load("benchmarks/dual_ablation.py")
    before = sorted((ROOT / "benchmarks" / "results" / "dual_ablation").glob("preset-s*"))  # independent orders
    assert m.letter_table(before) in (ROOT / "benchmarks" / "RESULTS.md").read_text()
    balanced = m.letter_table(sorted((ROOT / "docs" / "runs" / "smollm2-dual").iterdir()))
    assert balanced in (ROOT / "docs" / "RESULTS.md").read_text()
    for line in balanced.splitlines()[2:]:  # 64 rows, each condition ± 1 at a letter: 20 to 23 of them
        assert all(20 <= round(float(x) * 64) <= 23 for x in line.strip("| ").split(" | ")[3:]), line
