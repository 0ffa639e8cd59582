"""grpo.run.doctor (the Doctor and its checks) on crafted metric histories: every finding fires at the edge of its
threshold and not just inside it, the verdict's levels, and the online Doctor's firing / clearing / metrics.

The base history is a healthy 30-step run (window 10, min_steps 20): reward rising, held-out rising, entropy 1 nat,
answers rotating over three classes; each test changes one series and says by hand what the window sees.
"""

import pytest

from grpo.run.doctor.verdict import (
    ONLINE_CODES,
    Doctor,
    DoctorThresholds,
    Finding,
    check_history,
    heldout_series,
    rl_steps,
    verdict,
)

BANDS = {"fairness": (0.01, 0.08)}
STEPS = 30
TH = DoctorThresholds()
CONFIG = {"rollout": {"k": 6, "max_new_tokens": 4}, "train": {"lr": 5e-4, "max_steps": 120},
          "sft": {"steps": 35, "lr": 1e-3}, "loss": {"entropy_coef": 0.0}, "judge": {"timeout_s": 20.0}}


def healthy(steps: int = STEPS) -> list[dict]:
    """A run with every series well inside the thresholds; eval rows (as the trainer logs them) at 0, 10, 20, 30."""
    rows = [{"step": 0, "eval/fairness/reward": 0.5}]
    for s in range(1, steps + 1):
        rows.append({
            "step": s,
            "reward/fairness/mean": 0.4 + 0.01 * s,
            "kl/fairness": 0.04, "beta/fairness": 0.04, "entropy/fairness": 1.0,
            "rollout/fairness/truncated": 0.05,
            "rollout/fairness/top_answer": "abc"[s % 3], "rollout/fairness/top_share": 0.45,
            "adv/frac_zero_std": 0.2, "adv/fairness/frac_zero_std": 0.2,
            "judge/calls": 32.0, "judge/failures": 0.0,
            "loss/total": -0.02, "health/grad_norm": 0.9, "health/skipped": 0.0, "health/restored": 0.0,
        })
        if s % 10 == 0:
            rows.append({"step": s, "eval/fairness/reward": 0.5 + 0.005 * s})
    return rows


def rl(rows: list[dict]) -> list[dict]:
    return [r for r in rows if "loss/total" in r]


def set_last(rows: list[dict], key: str, value, n: int) -> list[dict]:
    for row in rl(rows)[-n:]:
        row[key] = value
    return rows


def codes(findings: list[Finding]) -> dict[str, str]:
    return {f.code: f.level for f in findings}


def found(rows, code, **kw) -> list[Finding]:
    return [f for f in check_history(rows, kw.pop("th", TH), kw.pop("bands", BANDS), config=CONFIG, **kw)
            if f.code == code]


def test_healthy_run_is_green_and_too_short_below_min_steps():
    assert check_history(healthy(), TH, BANDS, config=CONFIG) == []
    assert verdict([], rl_steps(healthy()), TH)[0] == "green"
    # 19 RL steps < min_steps 20: too short to judge, even with nothing wrong; 20 is enough
    assert check_history(healthy(19), TH, BANDS) == []
    level, reasons = verdict([], rl_steps(healthy(19)), TH)
    assert level == "too short to judge" and reasons[0].startswith("too short to judge: 19 RL step(s)")
    assert verdict([], rl_steps(healthy(20)), TH)[0] == "green"


def test_verdict_order_red_then_too_short_then_yellow():
    y, r = Finding("yellow", "truncation", "t", "s"), Finding("red", "non_finite", "n", "s")
    assert verdict([y]) == ("yellow", ["[yellow] truncation: t"])
    assert verdict([y, r], steps=3) == ("red", ["[red] non_finite: n", "[yellow] truncation: t"])  # red even if short
    assert verdict([y], steps=3)[0] == "too short to judge" and verdict([y], steps=3)[1][1] == "[yellow] truncation: t"


def test_no_learning_signal_after_five_dead_steps_not_four():
    rows = set_last(healthy(), "adv/frac_zero_std", 1.0, 5)
    (f,) = found(rows, "no_learning_signal")
    assert f.level == "red" and "5 steps in a row (steps 26-30)" in f.message and "every group had zero" in f.message
    assert f.suggestion.startswith("try `rollout.k=12`")  # twice K = 6 from the config
    assert found(set_last(healthy(), "adv/frac_zero_std", 1.0, 4), "no_learning_signal") == []
    # loss and grad norm exactly 0 is the same (a run that logs no advantage metric)
    rows = healthy()
    for row in rl(rows)[-5:]:
        del row["adv/frac_zero_std"]
        row["loss/total"], row["health/grad_norm"] = 0.0, 0.0
    assert "loss and grad norm were 0" in found(rows, "no_learning_signal")[0].message
    # all groups equal because every answer is right: solved, not dead
    rows = set_last(set_last(healthy(), "adv/frac_zero_std", 1.0, 5), "reward/fairness/mean", 0.95, 5)
    assert found(rows, "no_learning_signal") == []


def test_a_run_dead_from_its_first_step_is_yellow_until_five_steps_then_red():
    rows = set_last(healthy(4), "adv/frac_zero_std", 1.0, 4)
    (f,) = found(rows, "no_learning_signal")
    assert f.level == "yellow" and "in any of the 4 step(s) so far" in f.message and "red at 5 steps" in f.message
    assert verdict(check_history(rows, TH, BANDS), rl_steps(rows), TH)[0] == "too short to judge"
    doctor, fired = Doctor(TH, BANDS, CONFIG), []
    for row in set_last(healthy(6), "adv/frac_zero_std", 1.0, 6):
        fired += [(row["step"], f.level) for f in doctor.update(row) if f.code == "no_learning_signal"]
    assert fired == [(1, "yellow"), (5, "red")]  # the escalation fires again, so the loop can act on the red
    assert [a.level for a in doctor.cleared if a.code == "no_learning_signal"] == ["yellow"]
    # one step with a signal first: a later dead stretch is judged only by its length
    rows = set_last(healthy(4), "adv/frac_zero_std", 1.0, 3)
    assert found(rows, "no_learning_signal") == []


def test_reward_stuck_at_its_start_with_mostly_zero_std_groups():
    # start window (steps 1-10) 0.25; last window 0.30: +0.05 <= tolerance 0.05 -> flat; 60% zero-std > 50%
    rows = healthy()
    for row in rl(rows):
        row["reward/fairness/mean"] = 0.25 if row["step"] <= 20 else 0.30
        row["adv/fairness/frac_zero_std"] = 0.6
    (f,) = found(rows, "reward_stuck")
    assert f.level == "red" and f.task == "fairness" and "0.300 in steps 21-30, 0.250 in the first window" in f.message
    assert "60% of its groups" in f.message and f.suggestion.startswith("try `rollout.k=12`")
    for row in rl(rows):  # +0.06 above the start: it moved
        row["reward/fairness/mean"] = 0.25 if row["step"] <= 20 else 0.31
    assert found(rows, "reward_stuck") == []
    for row in rl(rows):  # flat, but half the groups have signal: not "mostly zero-std"
        row["reward/fairness/mean"] = 0.25
        row["adv/fairness/frac_zero_std"] = 0.5
    assert found(rows, "reward_stuck") == []


def test_rates_are_judged_over_a_whole_window_only():
    rows = set_last(healthy(9), "rollout/fairness/truncated", 1.0, 9)
    assert found(rows, "truncation") == []  # 9 steps: not a window yet
    rows = set_last(healthy(10), "rollout/fairness/truncated", 1.0, 10)
    assert found(rows, "truncation")


def test_reward_stuck_needs_min_steps():
    rows = healthy(19)
    for row in rl(rows):
        row["reward/fairness/mean"], row["adv/fairness/frac_zero_std"] = 0.0, 1.0
    assert found(rows, "reward_stuck") == []
    rows = healthy(20)
    for row in rl(rows):
        row["reward/fairness/mean"], row["adv/fairness/frac_zero_std"] = 0.0, 1.0
    (f,) = found(rows, "reward_stuck")
    assert f.suggestion.startswith("try `sft.steps=70`")  # nothing ever scored: the warm-up must teach the format
    # the warm-up ended far from its targets: under LoRA the adapter could not fit them; else it needs more steps
    rows.insert(1, {"step": 0, "sft/loss_first": 6.0, "sft/loss_last": 3.96})
    lora = {**CONFIG, "model": {"lora": True}}
    (f,) = [f for f in check_history(rows, TH, BANDS, config=lora) if f.code == "reward_stuck"]
    assert f.suggestion.startswith("try `model.lora=false`: the warm-up ended at loss 3.96 nats per token (above 1)")
    (f,) = found(rows, "reward_stuck")
    assert f.suggestion.startswith("try `sft.steps=70`: the warm-up ended at loss 3.96 nats per token")
    rows[1]["sft/loss_last"] = 1.0  # at the limit: taught, so the format is not the problem the loss shows
    assert "read samples/" in found(rows, "reward_stuck")[0].suggestion


def collapsed(share: float = 0.77, top_in: int = 10, last: float = 0.7, best: float = 0.8) -> list[dict]:
    """Reward `best` for steps 1-20 (the best window), `last` in steps 21-30; `unknown` the top answer with `share` in
    the last `top_in` steps of the window."""
    rows = healthy()
    for row in rl(rows):
        row["reward/fairness/mean"] = best if row["step"] <= 20 else last
    for row in rl(rows)[-10:]:
        row["rollout/fairness/top_share"] = share
    for row in rl(rows)[-top_in:]:
        row["rollout/fairness/top_answer"] = "unknown"
    return rows


def test_answer_collapse_edges_share_dominance_and_reward():
    (f,) = found(collapsed(), "answer_collapse")
    assert f.level == "red" and f.message.startswith("fairness: collapse onto `unknown`: it is the top answer in 10 of "
                                                     "10 steps and 77% of the task's samples in steps 21-30")
    assert "reward 0.700 against its best 0.800 (steps 1-10)" in f.message
    assert f.suggestion.startswith("try `kl.fairness.beta=0.08`")  # twice the logged β 0.04
    assert found(collapsed(share=0.6), "answer_collapse")  # share >= 0.6
    assert not found(collapsed(share=0.59), "answer_collapse")
    assert found(collapsed(top_in=5), "answer_collapse")  # top answer in 5 of 10 steps >= half
    assert not found(collapsed(top_in=4), "answer_collapse")
    # reward fallen from its best by more than 0.05, though above the solved level 0.9: 0.92 < 0.98 - 0.05
    assert "against its best 0.980" in found(collapsed(best=0.98, last=0.92), "answer_collapse")[0].message
    assert not found(collapsed(best=0.98, last=0.93), "answer_collapse")  # not below best - gap, and solved
    # at its best but below the solved level: one answer that is not right for every prompt
    (f,) = found(collapsed(best=0.8, last=0.8), "answer_collapse")
    assert "reward 0.800 below the solved level 0.9" in f.message
    assert not found(collapsed(best=0.9, last=0.9), "answer_collapse")  # a dominant answer that is right: learned
    # rewards on another scale (a penalty in [-1, 0]): "below the solved level 0.9" means nothing there, so a dominant
    # answer at the task's best reward is not a collapse; a fall from the best still is
    assert not found(collapsed(best=-0.2, last=-0.2), "answer_collapse")
    assert "against its best -0.200" in found(collapsed(best=-0.2, last=-0.3), "answer_collapse")[0].message


def test_answer_collapse_needs_the_share_to_have_risen_from_the_first_window():
    """The first window's top share is 0.45 in the base history; 0.6 in the last window is +0.15 >= 0.1: a collapse.
    A first window at 0.5 is +0.1 (fires, at the edge); at 0.51 it is +0.09 (does not): a share that was high from the
    start is the task's reply format, e.g. free-form replies that all begin alike."""
    (f,) = found(collapsed(share=0.6), "answer_collapse")
    assert "60% of the task's samples in steps 21-30 (45% in the first window); reward 0.700" in f.message

    def first_window(share: float) -> list[dict]:
        rows = collapsed(share=0.6)
        for row in rl(rows)[:10]:
            row["rollout/fairness/top_share"] = share
        return rows

    assert found(first_window(0.5), "answer_collapse")
    assert not found(first_window(0.51), "answer_collapse")
    # free-form replies that open alike from step 1 ("based on the context ..."), reward 0.5 throughout: the format
    rows = healthy()
    for row in rl(rows):
        row["rollout/fairness/top_answer"], row["rollout/fairness/top_share"] = "based on the context", 0.95
        row["reward/fairness/mean"] = 0.5
    assert found(rows, "answer_collapse") == []


def test_entropy_collapse_is_red_only_with_a_falling_heldout_reward():
    rows = set_last(healthy(), "entropy/fairness", 0.04, 10)  # the whole last window below the 0.05 floor
    assert codes(check_history(rows, TH, BANDS)) == {}  # held-out still rising: converged, not collapsed
    next(r for r in rows if r["step"] == 10 and "eval/fairness/reward" in r)["eval/fairness/reward"] = 0.45  # moving
    rows[-1]["eval/fairness/reward"] = 0.54  # best 0.6 at step 20: 0.54 < 0.6 - 0.05 is falling
    got = codes(check_history(rows, TH, BANDS))
    assert got["entropy_collapse"] == "red"
    (f,) = found(rows, "entropy_collapse")
    assert "fell to 0.540 (step 30) from its best 0.600" in f.message and "`loss.entropy_coef=0.01`" in f.suggestion
    rows[-1]["eval/fairness/reward"] = 0.55  # 0.6 - 0.05: not below it
    assert found(rows, "entropy_collapse") == []
    # a fall of more than 80% from the first window counts as well: 1.0 -> 0.19 is 81%, 0.21 is 79%
    rows = set_last(healthy(), "entropy/fairness", 0.19, 20)
    rows[-1]["eval/fairness/reward"] = 0.5
    assert found(rows, "entropy_collapse")
    rows = set_last(healthy(), "entropy/fairness", 0.21, 20)
    rows[-1]["eval/fairness/reward"] = 0.5
    assert found(rows, "entropy_collapse") == []


def test_entropy_collapse_with_a_heldout_reward_stalled_below_solved():
    rows = set_last(healthy(), "entropy/fairness", 0.04, 10)
    for row in rows:
        if "eval/fairness/reward" in row and row["step"] > 0:
            row["eval/fairness/reward"] = 0.6875  # steps 10, 20, 30: the same, below 0.9
    (f,) = found(rows, "entropy_collapse")
    assert "stays at 0.688, below the solved level 0.9, over its last 3 evaluations (steps 10-30)" in f.message
    rows[-1]["eval/fairness/reward"] = 0.74  # 0.74 - 0.6875 > 0.05: it moved
    assert found(rows, "entropy_collapse") == []
    for row in rows:
        if "eval/fairness/reward" in row and row["step"] > 0:
            row["eval/fairness/reward"] = 0.95  # flat, but solved
    assert found(rows, "entropy_collapse") == []
    del rows[-1]  # two evaluations since RL started are not three
    for row in rows:
        if "eval/fairness/reward" in row and row["step"] > 0:
            row["eval/fairness/reward"] = 0.6875
    assert found(rows, "entropy_collapse") == []


def test_entropy_drop_without_heldout_is_yellow_when_the_reward_falls():
    rows = [r for r in collapsed(share=0.4, last=0.7) if "loss/total" in r or r["step"] == 0]  # no eval after RL
    for row in rl(rows)[-10:]:
        row["entropy/fairness"] = 0.04
    assert codes(check_history(rows, TH, BANDS))["entropy_drop"] == "yellow"
    for row in rl(rows):
        row["reward/fairness/mean"] = 0.8  # reward at its best: nothing to warn about
    assert "entropy_drop" not in codes(check_history(rows, TH, BANDS))


def test_kl_out_of_band_for_patience_steps_and_runaway_above_three_times_its_top():
    rows = set_last(healthy(), "kl/fairness", 0.12, 20)
    (f,) = found(rows, "kl_out_of_band")
    assert f.level == "yellow" and "above its band [0.01, 0.08] for 20 steps from step 11" in f.message
    assert f.suggestion.startswith("try `kl.fairness.beta=0.08`")
    assert found(set_last(healthy(), "kl/fairness", 0.12, 19), "kl_out_of_band") == []
    # 0.25 > 3 × 0.08 = 0.24 for 20 steps: a runaway (red), not a mere excursion; 0.24 is not above it
    assert codes(check_history(set_last(healthy(), "kl/fairness", 0.25, 20), TH, BANDS)) == {"kl_runaway": "red"}
    assert codes(check_history(set_last(healthy(), "kl/fairness", 0.24, 20), TH, BANDS)) == {"kl_out_of_band": "yellow"}
    assert codes(check_history(set_last(healthy(), "kl/fairness", 0.25, 19), TH, BANDS)) == {}
    # without a band: the absolute 1 nat per token
    assert codes(check_history(set_last(healthy(), "kl/fairness", 1.01, 20), TH, None)) == {"kl_runaway": "red"}
    assert codes(check_history(set_last(healthy(), "kl/fairness", 1.0, 20), TH, None)) == {}


def test_kl_below_band_counts_only_consecutive_steps():
    rows = set_last(healthy(), "kl/fairness", 0.001, 25)
    rl(rows)[-13]["kl/fairness"] = 0.04  # one step back in the band: 12 + 12 < 20
    assert found(rows, "kl_out_of_band") == []
    rl(rows)[-13]["kl/fairness"] = 0.001
    (f,) = found(rows, "kl_out_of_band")
    assert "below" in f.message and "25 steps" in f.message and "`kl.fairness.beta=0.02`" in f.suggestion


def test_judge_failures_yellow_above_five_percent_red_above_a_quarter():
    assert codes(check_history(set_last(healthy(), "judge/failures", 2.0, 10), TH, BANDS)) == {
        "judge_failures": "yellow"}
    assert check_history(set_last(healthy(), "judge/failures", 1.0, 10), TH, BANDS) == []  # 1/32 = 3.1%
    assert codes(check_history(set_last(healthy(), "judge/failures", 8.0, 10), TH, BANDS)) == {
        "judge_failures": "yellow"}
    assert codes(check_history(set_last(healthy(), "judge/failures", 9.0, 10), TH, BANDS)) == {"judge_failures": "red"}


def test_truncation_and_unexplained_zero_std_groups():
    assert codes(check_history(set_last(healthy(), "rollout/fairness/truncated", 0.21, 10), TH, BANDS)) == {
        "truncation": "yellow"}
    assert check_history(set_last(healthy(), "rollout/fairness/truncated", 0.2, 10), TH, BANDS) == []
    # reward 0.61..0.7 in the last window (mean 0.655): zero-std 1.0 leaves 34.5% unexplained (< 50%), but at 0.1
    # reward the window's 90%-zero-std groups leave 80% unexplained
    rows = set_last(healthy(), "adv/fairness/frac_zero_std", 0.99, 10)
    assert found(rows, "zero_std_groups") == []
    rows = set_last(set_last(healthy(), "adv/fairness/frac_zero_std", 0.9, 10), "reward/fairness/mean", 0.1, 10)
    (f,) = found(rows, "zero_std_groups")
    assert f.level == "yellow" and "at least 80% of the groups gave no signal" in f.message
    rows = set_last(set_last(healthy(), "adv/fairness/frac_zero_std", 0.6, 10), "reward/fairness/mean", 0.1, 10)
    assert found(rows, "zero_std_groups") == []  # 0.6 - 0.1 = 0.5, not above it
    # under dynamic sampling the finding says how many of the task's groups were kept (window mean 0.5 a step)
    rows = set_last(set_last(healthy(), "adv/fairness/frac_zero_std", 0.9, 10), "reward/fairness/mean", 0.1, 10)
    for i, row in enumerate(rl(rows)[-10:]):
        row["rollout/fairness/dynamic_kept_groups"] = float(i % 2)
    (f,) = found(rows, "zero_std_groups")
    assert "dynamic sampling dropped them and trained on 0.5 fairness groups a step" in f.message
    assert "no KL term on what was dropped (train.dynamic_sampling_keep_kl keeps it)" in f.message


def test_non_finite_skipped_and_restored_over_the_whole_run():
    rows = healthy()
    rl(rows)[6]["loss/total"] = float("nan")
    (f,) = found(rows, "non_finite")
    assert f.level == "red" and "loss/total (step 7)" in f.message
    rows = healthy()
    for i in (3, 9, 15, 21):  # 4 of 30 = 13% > 10%
        rl(rows)[i]["health/skipped"] = 1.0
    assert codes(check_history(rows, TH, BANDS)) == {"skipped_steps": "red"}
    rows = healthy()
    rl(rows)[5]["health/skipped"] = 1.0  # 1 of 30: fine
    assert check_history(rows, TH, BANDS) == []
    rl(rows)[7]["health/restored"] = 1.0
    assert codes(check_history(rows, TH, BANDS)) == {"restored_weights": "yellow"}


def test_heldout_gains_from_eval_json_and_the_solved_ceiling():
    evals = {"before_sft": {"fairness": 0.3}, "after_sft": {"fairness": 0.5}, "after_rl": {"fairness": 0.4}}
    assert codes(check_history(healthy(), TH, BANDS, evals)) == {"reward_regressed": "red"}  # -0.1 < -0.05
    evals["after_rl"]["fairness"] = 0.5
    assert codes(check_history(healthy(), TH, BANDS, evals)) == {"reward_flat": "yellow"}
    evals["after_rl"]["fairness"] = 0.52
    assert check_history(healthy(), TH, BANDS, evals) == []
    solved = {"before_sft": {"fairness": 0.0}, "after_sft": {"fairness": 1.0}, "after_rl": {"fairness": 1.0}}
    assert check_history(healthy(), TH, BANDS, solved) == []  # nothing left to gain
    judge = {"after_sft": {"fairness": 0.95}, "after_rl": {"fairness": 0.95}}  # a 0-10 judge at 0.95: not solved
    rows = healthy()
    for row in rl(rows):
        row["reward/fairness/mean"] *= 10  # 4.1 .. 7.0
    assert codes(check_history(rows, TH, BANDS, judge)) == {"reward_flat": "yellow"}
    no_eval = [r for r in healthy() if "loss/total" in r]
    (f,) = found(no_eval, "no_heldout")
    assert f.level == "yellow" and "`train.eval_every=20`" in f.suggestion


def test_doctor_fires_once_clears_and_logs_every_code():
    doctor = Doctor(TH, BANDS, CONFIG)
    fired_at = {}
    rows = healthy()
    for row in rl(rows)[-8:-3]:  # steps 23-27 dead, then signal again
        row["adv/frac_zero_std"] = 1.0
    for row in rows:
        for f in doctor.update(row):
            fired_at.setdefault(f.code, []).append(row["step"])
        if row.get("step") == 27 and "loss/total" in row:
            assert doctor.metrics()["doctor/no_learning_signal"] == 1.0 and doctor.metrics()["doctor/red"] == 1.0
    assert fired_at == {"no_learning_signal": [27]}  # on the fifth dead step, once
    assert doctor.findings() == [] and doctor.metrics()["doctor/no_learning_signal"] == 0.0
    (alarm,) = doctor.cleared
    assert (alarm.code, alarm.first_step, alarm.last_step, alarm.level) == ("no_learning_signal", 27, 27, "red")
    assert set(doctor.metrics()) == {f"doctor/{c}" for c in ONLINE_CODES} | {"doctor/red"}


def test_doctor_reads_heldout_from_eval_json_phases():
    evals = {"before_sft": {"t": 0.1}, "after_sft": {"t": 0.4}, "step_20": {"t": 0.6}, "after_rl": {"t": 0.7}}
    assert heldout_series(evals, 30) == {"t": [(0, 0.1), (0, 0.4), (20, 0.6), (30, 0.7)]}
    doctor = Doctor(TH)
    doctor.update({"step": 1, "loss/total": 0.1, "reward/t/mean": 0.2})
    doctor.update({"step": 30, "loss/total": 0.1, "reward/t/mean": 0.2}, evals)
    # before RL: the last held-out before the first RL step (after SFT); best over all; the points since RL started
    assert doctor.heldout_after_start("t") == (0.4, 0.7, [(20, 0.6), (30, 0.7)])


def test_thresholds_must_be_positive():
    with pytest.raises(ValueError, match="recent_window=0"):
        Doctor(DoctorThresholds(recent_window=0))


# ------------------------------------------------------------------------------------------------ any reward scale
def test_a_length_reward_around_minus_one_is_read_on_its_own_scale():
    """A newcomer's length reward: mean -1.04, every group with signal. The zero-std check must not read the mean as
    a share of solved groups (that reports "at least 104% of the groups gave no signal")."""
    rows = healthy()
    for row in rl(rows):  # rising by 0.02 a step from -1.04: learning, not stuck
        row["reward/fairness/mean"], row["reward/fairness/std"] = -1.04 + 0.02 * row["step"], 0.3
        row["adv/frac_zero_std"] = row["adv/fairness/frac_zero_std"] = 0.0
    assert found(rows, "zero_std_groups") == []
    for row in rl(rows)[-10:]:  # 60% of the groups without signal: seen as such, not explained by "solved" ones
        row["adv/frac_zero_std"] = row["adv/fairness/frac_zero_std"] = 0.6
    (f,) = found(rows, "zero_std_groups")
    assert "60% of its groups" in f.message and "they gave no signal" in f.message


def test_reward_stuck_tolerance_is_a_share_of_the_rewards_spread():
    """stuck_tolerance 0.05 is of the unit scale; a reward with within-step std 5 (spread 10) is stuck only within
    0.5 of its start: +0.3 over the run is stuck, +1.0 is not."""
    for rise, stuck in ((0.3, True), (1.0, False)):
        rows = healthy()
        for row in rl(rows):
            row["reward/fairness/mean"] = -20.0 + (rise if row["step"] > 10 else 0.0)
            row["reward/fairness/std"], row["adv/fairness/frac_zero_std"] = 5.0, 0.9
        hits = found(rows, "reward_stuck")
        assert bool(hits) is stuck
        if stuck:  # not a [0, 1] score near 0: no warm-up advice, more samples per prompt
            assert hits[0].suggestion.startswith("try `rollout.k=12`")


def test_no_warm_up_is_advised_when_the_warm_up_was_skipped_for_want_of_targets():
    rows = healthy(20)
    for row in rl(rows):
        row["reward/fairness/mean"], row["adv/fairness/frac_zero_std"] = 0.0, 1.0
    assert found(rows, "reward_stuck")[0].suggestion.startswith("try `sft.steps=70`")
    rows.insert(1, {"step": 0, "sft/skipped": 1.0})  # grpo_train.sft_phase logs it when no row has a target
    (f,) = found(rows, "reward_stuck")
    assert f.suggestion.startswith("try `rollout.k=12`") and "skipped" in f.suggestion


def test_a_smoke_test_of_a_few_steps_is_too_short_unless_something_broke():
    regressed = Finding("red", "reward_regressed", "held-out fairness fell", "try ...", "fairness")
    assert verdict([regressed], 5, TH)[0] == "too short to judge"
    assert verdict([regressed], 20, TH)[0] == "red"
    for code in ("non_finite", "no_learning_signal", "judge_failures", "kl_runaway"):
        assert verdict([regressed, Finding("red", code, "m", "s")], 5, TH)[0] == "red", code


def with_memory(rows: list[dict], gb) -> list[dict]:
    """memory/host_rss_gb on every RL step: gb(step)."""
    for row in rl(rows):
        row["memory/host_rss_gb"] = gb(row["step"])
    return rows


def test_memory_growing_step_over_step_is_yellow_at_the_edge_of_its_thresholds():
    # a flat run whose resident set jitters a few MB up and down around 1 GB: nothing
    assert found(with_memory(healthy(), lambda s: 1.0 + 0.004 * (s % 2)), "memory_growth") == []
    # rising at every step of the last window (steps 21-30): +0.0117 GB a step adds 0.105 GB, below 10 % of its first
    # step's 1.246 GB; +0.0147 GB a step adds 0.132 GB, above 10 % of 1.309 GB -> yellow, projected to max_steps
    assert found(with_memory(healthy(), lambda s: 1.0 + 0.0117 * s), "memory_growth") == []
    leak = found(with_memory(healthy(), lambda s: 1.0 + 0.0147 * s), "memory_growth")
    assert [f.level for f in leak] == ["yellow"]
    assert "rose in 9 of the 9 steps of steps 21-30" in leak[0].message and "+15 MB a step" in leak[0].message
    assert "GB by step 120" in leak[0].message and "tracemalloc" in leak[0].suggestion
    # risen at 7 of 9 steps (< 0.8 x 9 = 7.2): a level that moves, not a leak
    bumpy = with_memory(healthy(), lambda s: 1.0 + 0.05 * s - (0.06 if s in (24, 27) else 0.0))
    assert found(bumpy, "memory_growth") == []
    # the absolute floor: +4 MB a step on a 0.2 GB process is 18 % of it but only 36 MB in the window
    assert found(with_memory(healthy(), lambda s: 0.2 + 0.004 * s), "memory_growth") == []


def test_the_online_doctor_logs_memory_growth_and_clears_it_when_memory_levels_off():
    doctor = Doctor(TH, BANDS, CONFIG)
    rows = with_memory(healthy(40), lambda s: 1.0 + 0.05 * min(s, 25))  # a leak that stops at step 25
    fired, flags = {}, {}
    for row in rows:
        for f in doctor.update(row):
            fired.setdefault(f.code, row["step"])
        if "loss/total" in row:
            flags[row["step"]] = doctor.metrics()["doctor/memory_growth"]
    assert fired["memory_growth"] == 10  # the first full window
    assert flags[10] == flags[25] == 1.0 and flags[40] == 0.0
    assert [a.code for a in doctor.cleared if a.code == "memory_growth"] == ["memory_growth"]


def with_graph(rows: list[dict], compiled_at: set[int], captured_at: set[int] = frozenset()) -> list[dict]:
    """The graph engine's per-step counts on every RL row: compiles at `compiled_at`, captures at `captured_at`."""
    for row in rl(rows):
        row["rollout/graph_compiles"] = float(row["step"] in compiled_at)
        row["rollout/graph_captures"] = float(row["step"] in captured_at) + float(row["step"] in compiled_at)
        row["rollout/graph_fallbacks"] = 0.0
    return rows


def test_a_graph_engine_that_keeps_recompiling_is_yellow():
    """Compiles in the first window are the run's shapes being met: nothing. After it, three steps of a window that
    compile (recompile_steps) are yellow; two are not; captures alone (buffers the update needs back, laid out and
    captured at every rollout) are not a finding."""
    assert found(with_graph(healthy(), {1, 2, 5, 9}), "graph_recompiling") == []
    assert found(with_graph(healthy(), {1, 23, 28}), "graph_recompiling") == []
    assert found(with_graph(healthy(), {1}, set(range(2, 31))), "graph_recompiling") == []
    busy = found(with_graph(healthy(), {1, 22, 24, 29}), "graph_recompiling")
    assert [f.level for f in busy] == ["yellow"]
    assert "compiled its decoding step 3 times at 3 of the steps of steps 21-30" in busy[0].message
    assert "data.max_prompt_tokens" in busy[0].suggestion


def test_graph_codes_are_logged_only_by_runs_the_graph_engine_decodes():
    plain, graph = Doctor(TH, BANDS, CONFIG), Doctor(TH, BANDS, CONFIG)
    for row in healthy(12):
        plain.update(row)
    for row in with_graph(healthy(12), {1}):
        graph.update(row)
    assert "doctor/graph_recompiling" not in plain.metrics()
    assert graph.metrics()["doctor/graph_recompiling"] == 0.0


# ------------------------------------------------------------------------------ empty or template-less completions
def test_mostly_empty_completions_are_named_with_their_cause_and_fix_not_a_kl_knob():
    """Most of a task's completions empty over the window (the reply ended at once): yellow above half, red above
    80%, from the first step (a broken format shows at once); with plain-string prompts for a chat model (logged as
    data/<task>/raw_prompts) the cause and the fix are the prompt format, not "double beta" (what heldout_collapse
    and answer_collapse said for an all-empty SmolLM2 run). At exactly the thresholds it does not fire."""
    from grpo.run.doctor.window_checks import RAW_FIX

    def emptied(share: float, n: int = STEPS) -> list[dict]:
        return set_last(set_last(healthy(), "rollout/fairness/top_answer", "<empty>", n),
                        "rollout/fairness/top_share", share, n)

    assert not found(emptied(0.5), "empty_completions")  # half: not "most"
    (warn,) = found(emptied(0.6), "empty_completions")
    assert warn.level == "yellow" and "60% of its completions" in warn.message and "held no word" in warn.message
    assert "stop tokens" in warn.suggestion and "kl." not in warn.suggestion
    assert found(emptied(0.8), "empty_completions")[0].level == "yellow"
    (red,) = found(emptied(0.9), "empty_completions")
    assert red.level == "red" and "plain strings" not in red.message
    raw = [{"step": 0, "data/fairness/raw_prompts": 1.0}] + emptied(0.9)
    (named,) = found(raw, "empty_completions")
    assert "its prompts are plain strings and the model has a chat template" in named.message
    assert named.suggestion == RAW_FIX and "conversations" in RAW_FIX and "data.prompt_format=chat" in RAW_FIX
    assert not found(raw, "template_less_prompts")  # the same evidence: one finding
    doctor = Doctor(TH, BANDS, CONFIG)
    fired = [f.code for row in emptied(0.9)[:2] for f in doctor.update(row)]
    assert fired == ["empty_completions"]  # at the first RL step
    from grpo.run.doctor.end_checks import heldout_collapse
    from grpo.run.doctor.window_checks import empty_fix

    answers = {"before_sft": {"fairness": ["Answer: a", "Answer: b", "Answer: c", ""]},
               "after_rl": {"fairness": ["", "", "", "Answer: a"]}}
    evals = {"before_sft": {"fairness": 0.3}, "after_rl": {"fairness": 0.1}}
    (held,) = heldout_collapse(answers, evals, TH, raw, CONFIG)  # greedy replies 75% empty after RL
    assert held.suggestion == RAW_FIX and "kl." not in held.suggestion
    (plain,) = heldout_collapse(answers, evals, TH, healthy(), CONFIG)
    assert plain.suggestion == empty_fix(False) and "kl." not in plain.suggestion


def test_plain_string_prompts_for_a_chat_model_are_a_warning_and_their_metrics_appear_only_then():
    """Plain-string prompts for a chat model whose replies are not (yet) mostly empty: yellow template_less_prompts
    with the fix. doctor/empty_completions and doctor/template_less_prompts are logged only by such a run (or once
    one fires): a run without them (the demo) logs the same keys as before."""
    rows = [{"step": 0, "data/fairness/raw_prompts": 0.75}] + healthy()
    (warn,) = found(rows, "template_less_prompts")
    assert warn.level == "yellow" and "75% of its training prompts are plain strings" in warn.message
    doctor = Doctor(TH, BANDS, CONFIG)
    for row in rows[:3]:
        doctor.update(row)
    assert {"doctor/empty_completions", "doctor/template_less_prompts"} <= set(doctor.metrics())
    assert doctor.metrics()["doctor/template_less_prompts"] == 1.0
    plain = Doctor(TH, BANDS, CONFIG)
    for row in healthy()[:3]:
        plain.update(row)
    assert set(plain.metrics()) == {f"doctor/{code}" for code in ONLINE_CODES} | {"doctor/red"}
    assert not found(healthy(), "empty_completions") + found(healthy(), "template_less_prompts")


@pytest.mark.parametrize("fixture", ["run_seed0", "run_seed1", "run_demo", "run_notebook"])
def test_the_demos_records_have_no_empty_or_template_less_completions(fixture):
    """The demo's real runs (tests/fixtures): its replies are never mostly empty and its prompts go through the chat
    template, so neither finding fires and no prompt-format metric would be logged."""
    import json
    from pathlib import Path

    folder = Path(__file__).parent / "fixtures" / fixture
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    config = json.loads((folder / "config.json").read_text())
    assert not [f for f in check_history(rows, TH, config=config)
                if f.code in ("empty_completions", "template_less_prompts")]
    assert not any(k.startswith("data/") and k.endswith("/raw_prompts") for row in rows for k in row)
