"""End-to-end behaviour of the trainer on a tiny model, and one regression test per known trainer bug."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import replace

import pytest
import torch

import grpo.run.step_owners as owners
import grpo_train as G
from grpo import config as C
from grpo.grading.scoring import score_rollouts
from grpo.models.logprobs import completion_logprobs
from grpo.phases.batch import batch_logprobs, build_train_batch
from grpo.phases.generate import generate_rollouts
from grpo.phases.update import Learner, StepSettings, update_passes
from tests.trainer_helpers import fast_config, rollout_batch

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: a tiny model gains nothing from threads


def _params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("lora", [False, True])
def test_two_step_run_moves_every_trainable_parameter(tmp_path, lora):
    extra = ["model.lora=true", "model.lora_r=4", "train.lr=5e-2"] if lora else []
    run = G.setup(fast_config(tmp_path, *extra))
    before = _params(run.policy.model)
    ref_before = None if lora else _params(run.policy.ref_model)
    for step in (1, 2):
        G.rl_step(run, step)
    after = dict(run.policy.model.named_parameters())
    trainable = {n for n, p in after.items() if p.requires_grad}
    assert trainable, "no trainable parameters"
    unmoved = [n for n in trainable if torch.equal(after[n].detach(), before[n])]
    assert not unmoved, f"trainable parameters that did not move: {unmoved}"
    moved_frozen = [n for n, p in after.items() if not p.requires_grad and not torch.equal(p.detach(), before[n])]
    assert not moved_frozen, f"frozen parameters moved: {moved_frozen}"
    if ref_before is not None:
        assert all(torch.equal(p, ref_before[n]) for n, p in run.policy.ref_model.named_parameters())
    lines = [json.loads(x) for x in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    last = lines[-1]
    for key in ("reward/fairness/mean", "reward/hallucination/mean", "kl/fairness", "beta/hallucination",
                "rollout/fairness/length", "rollout/hallucination/truncated", "loss/total", "loss/clip_frac_high",
                "health/grad_norm", "entropy/fairness", "time/generate", "time/update", "adv/frac_zero_std"):
        assert key in last, f"metrics.jsonl lacks {key}"
    assert last["step"] == 2


@pytest.mark.parametrize("loss,mu", [("gspo", 2), ("gspo", 3), ("grpo", 2), ("gspo_token", 2)])
def test_mu_passes_no_backward_twice(tmp_path, loss, mu):
    """Regression (the seed's GSPO bug): μ > 1 backpropagated through a graph built before the μ loop."""
    run = G.setup(fast_config(tmp_path, f"loss.policy_loss={loss}", f"loss.mu={mu}"))
    steps = []
    real_step = run.updater.optimizer.step

    def counting_step(*a, **k):
        steps.append(1)
        return real_step(*a, **k)

    run.updater.optimizer.step = counting_step
    metrics = G.rl_step(run, 1)
    assert len(steps) == mu, "each μ pass is exactly one optimizer step"
    assert math.isfinite(metrics["loss/total"])
    # old log-probs used by the passes carry no graph
    batch = rollout_batch(run, 2, 4)
    old = batch_logprobs(run.policy.model, batch, 4, 1.0)
    assert not old.requires_grad and old.grad_fn is None


def test_ratio_metrics_cover_every_mu_pass(tmp_path):
    """At μ = 1 the ratio is exactly 1 (on-policy); at μ = 3 the later passes are off-policy and the reported ratio /
    clip metrics must show it (taken from the first pass only, where the ratio is always 1, they would hide it)."""
    on = G.rl_step(G.setup(fast_config(tmp_path / "a", "loss.mu=1", "train.lr=5e-2")), 1)
    assert on["loss/ratio_min"] == on["loss/ratio_max"] == 1.0 and on["loss/clip_frac_high"] == 0.0
    off = G.rl_step(G.setup(fast_config(tmp_path / "b", "loss.mu=3", "train.lr=5e-2")), 1)
    assert off["loss/ratio_max"] > 1.0 > off["loss/ratio_min"]
    assert off["loss/clip_frac_low"] + off["loss/clip_frac_high"] > 0  # a 5e-2 step moves the ratio past the clip
    assert off["health/grad_norm_max"] >= off["health/grad_norm"] > 0


def _fixed_batch(run, n_prompts=2):
    batch = rollout_batch(run, n_prompts)
    batch.ref_logps_BT = batch_logprobs(run.policy.ref_model, batch, 8, 1.0) - 0.05 * batch.completion_mask_BT
    return batch


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_grad_accumulation_equivalence(tmp_path, agg):
    """GA = 2 x micro-batch 4 gives the same parameters as GA = 1 x micro-batch 8 after one optimizer step.

    Regression: zero_grad()/step() inside the micro-batch loop, or gradients overwritten instead of added,
    trains on one micro-batch only.
    """
    run = G.setup(fast_config(tmp_path))
    batch = _fixed_batch(run)
    assert batch.size == 8 and batch.advantages_B.abs().sum() > 0
    results = []
    for micro in (4, 8):
        model = copy.deepcopy(run.policy.model)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.SGD(params, lr=1.0)  # SGD: the update IS the gradient, so any difference shows
        update_passes(Learner(model, opt, params), batch, torch.tensor([0.1, 0.3]), C.LossConfig(agg_mode=agg),
                   run.tasks, StepSettings(micro_batch_seqs=micro, temperature=1.0, max_grad_norm=1e9,
                                           skip_grad_norm=1e9, agg_constant=6.0))
        results.append(params)
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    moved = max((a - b).abs().max().item() for a, b in zip(results[0], run.policy.model.parameters(), strict=True))
    assert moved > 1e-4, "the step must move the weights, or the comparison proves nothing"


def test_trained_tokens_are_sampled_tokens(tmp_path):
    """Regression for mask/slicing bugs: the tokens whose log-probs are trained are exactly the sampled ids,
    scored with the same template and padding as sampling, for prompts of different lengths (left padding)."""
    run = G.setup(fast_config(tmp_path))
    samples = run.generation.sampler.next_batch(4)
    assert len({len(s.messages[0]["content"]) for s in samples}) > 1
    rollouts, _ = generate_rollouts(run.policy.model, run.tokenizer, samples, replace(run.cfg.rollout, k=2),
                                    run.generation.stop_ids)
    scored, _ = score_rollouts(rollouts, run.rewarder.specs, None)
    batch = build_train_batch(scored, torch.zeros(len(scored)), run.tasks, run.tokenizer.pad_token_id, run.device)
    assert len({len(r.prompt_ids) for r in rollouts}) > 1, "need prompts of different lengths"
    logps = batch_logprobs(run.policy.model, batch, 16, 1.0)
    run.policy.model.eval()
    for i, r in enumerate(rollouts):
        row = batch.input_ids_BL[i, batch.prompt_len:]
        mask = batch.completion_mask_BT[i].bool()
        assert row[mask].tolist() == list(r.completion_ids)
        assert batch.input_ids_BL[i, :batch.prompt_len][batch.attention_mask_BL[i, :batch.prompt_len].bool()
                                                        ].tolist() == list(r.prompt_ids)
        ids = torch.tensor([list(r.prompt_ids) + list(r.completion_ids)])
        with torch.no_grad():
            alone, _ = completion_logprobs(run.policy.model, ids, torch.ones_like(ids), len(r.prompt_ids))
        torch.testing.assert_close(logps[i][mask], alone[0], atol=1e-5, rtol=1e-5)


def test_nan_gradient_is_skipped(tmp_path):
    """An injected NaN gradient: the optimizer step is skipped and counted, the weights stay finite."""
    run = G.setup(fast_config(tmp_path))
    target = run.policy.trainable_parameters()[0]
    handle = target.register_hook(lambda g: torch.full_like(g, float("nan")))
    before = _params(run.policy.model)
    metrics = G.rl_step(run, 1)
    handle.remove()
    assert metrics["health/skipped"] == 1.0 and metrics["health/skipped_total"] == 1.0
    assert all(torch.equal(p.detach(), before[n]) for n, p in run.policy.model.named_parameters())
    assert all(torch.isfinite(p).all() for p in run.policy.model.parameters())
    metrics = G.rl_step(run, 2)  # the next step trains normally
    assert metrics["health/skipped"] == 0.0


def test_nan_weights_are_restored(tmp_path):
    """A step that leaves NaN weights is rolled back to the last good copy and counted."""
    run = G.setup(fast_config(tmp_path))
    G.rl_step(run, 1)
    good = _params(run.policy.model)
    real_step = run.updater.optimizer.step

    def poisoned_step(*a, **k):
        out = real_step(*a, **k)
        with torch.no_grad():
            run.policy.trainable_parameters()[0].fill_(float("inf"))
        return out

    run.updater.optimizer.step = poisoned_step
    metrics = G.rl_step(run, 2)
    assert metrics["health/restored"] == 1.0
    assert all(torch.equal(p.detach(), good[n]) for n, p in run.policy.model.named_parameters())


def test_per_task_beta_moves_in_opposite_directions(tmp_path):
    """Fairness KL sits above its band, hallucination KL below: their β move apart and stay within bounds."""
    run = G.setup(fast_config(
        tmp_path, "train.max_steps=4", "train.lr=5e-2",
        "kl.fairness.controller=band", "kl.fairness.beta=0.1", "kl.fairness.band_low=0",
        "kl.fairness.band_high=1e-9", "kl.fairness.window=1", "kl.fairness.up=2", "kl.fairness.beta_max=0.3",
        "kl.hallucination.controller=band", "kl.hallucination.beta=0.1", "kl.hallucination.band_low=5",
        "kl.hallucination.band_high=10", "kl.hallucination.window=1", "kl.hallucination.down=0.5",
        "kl.hallucination.beta_min=0.02"))
    betas = []
    for step in range(1, 5):
        m = G.rl_step(run, step)
        betas.append((m["beta/fairness"], m["beta/hallucination"]))
    f_end, h_end = run.updater.controllers["fairness"].value, run.updater.controllers["hallucination"].value
    assert f_end > 0.1 and h_end < 0.1
    assert f_end <= 0.3 + 1e-12 and h_end >= 0.02 - 1e-12
    assert betas[0] == (0.1, 0.1)  # a step trains with the β its controller held before the step
    from grpo.run.checkpoint.save_resume import checkpoint_state

    state = checkpoint_state(run)["controllers"]
    assert state["fairness"] != state["hallucination"]


def test_cagrad_trains_end_to_end(tmp_path):
    run = G.setup(fast_config(tmp_path, "multi.combine=cagrad", "train.lr=5e-2"))
    before = _params(run.policy.model)
    metrics = G.rl_step(run, 1)
    metrics = G.rl_step(run, 2)
    assert "multi/cos/fairness__hallucination" in metrics and "reward/fairness/mean" in metrics
    assert "reward/hallucination/mean" in metrics and metrics["multi/active"] == 1.0
    assert any(not torch.equal(p.detach(), before[n]) for n, p in run.policy.model.named_parameters())


def test_oom_retries_with_half_micro_batch(tmp_path, monkeypatch):
    """A CUDA OOM in the update is reported and the step retried once with half the micro-batch."""
    import grpo.phases.update as U

    run = G.setup(fast_config(tmp_path))
    real = U.completion_logprobs
    calls = {"big": 0}

    def flaky(model, ids, *a, **k):
        if ids.shape[0] > 4 and model.training:
            calls["big"] += 1
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(model, ids, *a, **k)

    monkeypatch.setattr(U, "completion_logprobs", flaky)
    metrics = G.rl_step(run, 1)
    assert calls["big"] == 1 and run.updater.micro_batch_seqs == 4
    assert metrics["health/oom_retries"] == 1.0 and math.isfinite(metrics["loss/total"])


def test_after_an_oom_retry_every_pass_uses_the_halved_micro_batch(tmp_path, monkeypatch):
    """Regression: after an OOM retry only the training pass used the halved micro-batch; the reference (and
    old-log-prob) passes of the next steps kept the size that had run out of memory."""
    import grpo.phases.update as U

    run = G.setup(fast_config(tmp_path, "loss.mu=2"))
    assert run.cfg.kl_enabled and run.updater.micro_batch_seqs == 8
    real_forward, real_pass = U.completion_logprobs, owners.batch_logprobs
    oom = {"left": 1}
    sizes: list[tuple[str, int]] = []

    def flaky(model, ids, *a, **k):
        if oom["left"] and model.training:
            oom["left"] -= 1
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        if model.training:
            sizes.append(("train", ids.shape[0]))
        return real_forward(model, ids, *a, **k)

    def no_grad_pass(model, batch, micro_batch_seqs, temperature):
        sizes.append(("ref" if model is not run.policy.model else "old", micro_batch_seqs))
        return real_pass(model, batch, micro_batch_seqs, temperature)

    monkeypatch.setattr(U, "completion_logprobs", flaky)
    monkeypatch.setattr(owners, "batch_logprobs", no_grad_pass)
    monkeypatch.setattr(owners, "has_dropout", lambda model: True)  # the old-log-prob pass runs too
    assert G.rl_step(run, 1)["health/oom_retries"] == 1.0
    assert sizes[:2] == [("old", 8), ("ref", 8)] and {n for kind, n in sizes[2:]} == {4}
    sizes.clear()
    assert G.rl_step(run, 2)["health/oom_retries"] == 0.0
    assert sizes[:2] == [("old", 4), ("ref", 4)] and {n for kind, n in sizes[2:]} == {4}


def test_nan_loss_is_skipped_and_training_stops_after_k_bad_steps(tmp_path, monkeypatch):
    """An injected NaN loss is caught (the step is skipped, weights untouched); K bad steps in a row stop the run
    with a message that names what to change."""
    import grpo.phases.update as U
    from grpo.core.weight_guard import TrainingUnstable

    run = G.setup(fast_config(tmp_path, "train.max_consecutive_bad=2"))
    real = U.bound_policy_loss

    def nan_loss(loss):
        bound = real(loss)

        def loss_fn(*tensors):
            loss_BT, metrics = bound(*tensors)
            return loss_BT * float("nan"), metrics
        return loss_fn

    monkeypatch.setattr(U, "bound_policy_loss", nan_loss)
    before = _params(run.policy.model)
    metrics = G.rl_step(run, 1)
    assert metrics["health/skipped"] == 1.0
    assert all(torch.equal(p.detach(), before[n]) for n, p in run.policy.model.named_parameters())
    with pytest.raises(TrainingUnstable) as err:
        G.rl_step(run, 2)
    assert "2" in str(err.value) and ("lr" in str(err.value) or "learning rate" in str(err.value))


def passes(run, batch) -> dict[str, float]:
    """The update's μ passes over `batch` with β 0, as Updater.update runs them."""
    u = run.updater
    return owners.update_passes(u.learner, batch, torch.zeros(2), u.loss, u.tasks, u.step_settings())


def test_fused_lm_head_setting_reaches_the_training_pass(tmp_path, monkeypatch):
    """model.fused_lm_head decides whether the training micro-batches go through head_logprobs."""
    import grpo.models.logprobs as L

    calls = []
    real = L.head_logprobs
    monkeypatch.setattr(L, "head_logprobs", lambda *a, **k: calls.append(1) or real(*a, **k))
    for fused in (True, False):
        calls.clear()
        run = G.setup(fast_config(tmp_path / str(fused), f"model.fused_lm_head={str(fused).lower()}",
                                  "kl.default.beta=0.0", "kl.default.controller=fixed"))
        assert run.cfg.model.fused_lm_head is fused
        batch = rollout_batch(run)
        passes(run, batch)
        assert bool(calls) is fused


def test_mu_passes_reuse_the_first_pass_log_probs_when_there_is_no_dropout(tmp_path, monkeypatch):
    """μ = 2 without dropout: no separate old-log-prob forward, and the update equals the one with that forward."""
    from grpo.models.modeling import has_dropout

    run = G.setup(fast_config(tmp_path / "a", "loss.mu=2", "loss.policy_loss=gspo"))
    assert not has_dropout(run.policy.model)
    calls = []
    real = owners.batch_logprobs
    monkeypatch.setattr(owners, "batch_logprobs", lambda model, *a, **k: calls.append(model) or real(model, *a, **k))
    G.rl_step(run, 1)
    assert all(m is not run.policy.model for m in calls)  # only the reference pass ran

    results = []
    for precomputed in (True, False):
        run = G.setup(fast_config(tmp_path / f"b{precomputed}", "loss.mu=2", "loss.policy_loss=gspo"))
        torch.manual_seed(5)
        batch = rollout_batch(run)
        if precomputed:
            batch.old_logps_BT = real(run.policy.model, batch, run.updater.micro_batch_seqs, 1.0)
        metrics = passes(run, batch)
        results.append((_params(run.policy.model), metrics["loss/ratio_max"]))
    (a, ratio_a), (b, ratio_b) = results
    assert all(torch.allclose(a[n], b[n], atol=1e-6) for n in a)
    assert ratio_a == pytest.approx(ratio_b, abs=1e-6) and ratio_a > 1.0  # pass 2 really was off-policy


def test_dropout_is_detected_where_train_mode_differs():
    from transformers import LlamaConfig, LlamaForCausalLM

    from grpo.models.modeling import TINY_NAME, has_dropout, load_policy

    assert not has_dropout(LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                                                        num_hidden_layers=1, num_attention_heads=2)))
    assert has_dropout(LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                                                    num_hidden_layers=1, num_attention_heads=2,
                                                    attention_dropout=0.1)))
    section = C.ModelConfig(name=TINY_NAME, lora=True, lora_r=4, lora_dropout=0.05, lora_target_modules=["q_proj"],
                            tiny_hidden=32, tiny_layers=1, tiny_heads=2)
    lora = load_policy(section, tiny_corpus=["a b c"] * 5)
    assert has_dropout(lora.model)


def test_kl_k1_is_logged_beside_k3_and_tells_one_tail_token_from_drift():
    """`kl/<task>` is k3's mean, `kl_k1/<task>` the mean log-ratio. One sampled token with π = π_ref / 1000 among
    four: k3 = 1000 − ln 1000 − 1 = 992.09 on it, 248.02 per token; k1 = −ln 1000 / 4 = −1.727. A task drifted by
    +0.05 nats on every token: k1 = 0.05, k3 = e^−0.05 + 0.05 − 1 = 0.00123."""
    from grpo.core.losses import kl_penalty
    from grpo.phases.update import _StepStats
    ln1000 = math.log(1000.0)
    logps_BT = torch.tensor([[-1.0 - ln1000, -1.0, -1.0, -1.0], [-2.0, -2.0, -2.0, -2.0]])
    ref_BT = torch.tensor([[-1.0, -1.0, -1.0, -1.0], [-2.05, -2.05, -2.05, -2.05]])
    mask_BT = torch.ones(2, 4)
    parts = {"pg_BT": torch.zeros(2, 4), "kl_BT": kl_penalty(logps_BT, ref_BT, "k3"),
             "kl_k1_BT": kl_penalty(logps_BT, ref_BT, "k1"), "entropy_BT": torch.zeros(2, 4), "logps_BT": logps_BT,
             "mask_BT": mask_BT}
    stats = _StepStats(2, torch.device("cpu"))
    stats.add(torch.tensor(0.0), parts, torch.tensor([0, 1]))
    out = stats.finish(["tail", "drift"])
    assert out["kl/tail"] == pytest.approx((1000.0 - ln1000 - 1.0) / 4, rel=1e-5)  # 248.02
    assert out["kl_k1/tail"] == pytest.approx(-ln1000 / 4, rel=1e-5)  # -1.727
    assert out["kl_k1/drift"] == pytest.approx(0.05, abs=1e-6)
    assert out["kl/drift"] == pytest.approx(math.exp(-0.05) + 0.05 - 1.0, rel=1e-4)  # 0.00123


def test_a_training_step_logs_kl_k1_for_every_task(tmp_path):
    """Through `update_passes`: reference log-probs 0.05 nats below the policy's on every completion token give
    kl_k1 = 0.05 and kl (k3) = e^−0.05 + 0.05 − 1 for each task (the first pass is on-policy)."""
    run = G.setup(fast_config(tmp_path))
    batch = _fixed_batch(run)
    model = copy.deepcopy(run.policy.model)
    params = [p for p in model.parameters() if p.requires_grad]
    out = update_passes(Learner(model, torch.optim.SGD(params, lr=0.0), params), batch, torch.tensor([0.1, 0.3]),
                     C.LossConfig(), run.tasks, StepSettings(micro_batch_seqs=8, temperature=1.0, max_grad_norm=1e9,
                                                             skip_grad_norm=1e9, agg_constant=6.0))
    assert sorted(set(batch.task_ids_B.tolist())) == list(range(len(run.tasks)))  # both tasks in the batch
    for t in run.tasks:
        assert out[f"kl_k1/{t}"] == pytest.approx(0.05, abs=1e-4)
        assert out[f"kl/{t}"] == pytest.approx(math.exp(-0.05) + 0.05 - 1.0, rel=2e-2)
