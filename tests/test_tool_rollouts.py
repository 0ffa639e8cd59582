"""Multi-turn rollouts with tools on hand-made trajectories and the tiny model: the trajectory is [prompt | reply |
tool message | reply ...] with the model's own tokens marked; the train batch trains on those only (the loss's
gradient is exactly zero on every tool-result token, for the policy loss, the KL and the entropy); its log-probs are
one forward over the concatenated ids; limits, a raising tool and a timeout end or continue a trajectory as
documented; the mask and the loss equal TRL 1.16's on the same trajectory."""

from __future__ import annotations

import json
import time
import types
from pathlib import Path

import pytest
import torch

from grpo.config import ConfigError, LossConfig, RolloutConfig
from grpo.core.losses import aggregate, kl_penalty, policy_loss
from grpo.core.step_types import Sample, Scored
from grpo.core.tool_calls import parse_tool_calls
from grpo.models.modeling import build_tiny_model, build_tiny_tokenizer
from grpo.phases import tools as T
from grpo.phases.batch import batch_logprobs, build_train_batch
from grpo.phases.generate import GREEDY, SamplingPlan
from grpo.phases.update import micro_batch_terms
from tests.trainer_helpers import assert_resume_is_bit_identical, call_text, fast_config

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def calculator(expression: str) -> str:
    """Multiply two integers.

    Args:
        expression: Two integers joined by '*', e.g. "123*456".
    """
    a, b = expression.split("*")
    return str(int(a) * int(b))


def broken(x: int) -> int:
    """Always raises.

    Args:
        x: Anything.
    """
    raise RuntimeError("the service is down")


def sleepy(seconds: float) -> str:
    """Sleep, then answer.

    Args:
        seconds: How long.
    """
    time.sleep(seconds)
    return "awake"


CORPUS = ["the product is 56088", "123*456", call_text("calculator", {"expression": "123*456"}),
          call_text("broken", {"x": 1})]


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer(CORPUS, vocab_size=320)


@pytest.fixture(scope="module")
def model(tok):
    return build_tiny_model(tok, seed=3, hidden=64, layers=2, heads=4, kv_heads=2)


@pytest.fixture(scope="module")
def box():
    return T.ToolBox(T.resolve_tools([calculator, broken, sleepy]), timeout_s=0.3, max_result_tokens=48)


def reply(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]


def scripted(monkeypatch, script: list[list[list[int]]], pad: int = 0) -> list[int]:
    """The engine replaced by a script: row i's reply at turn t is script[i][t] (then padding, as decode pads).
    Row i is still active at turn t exactly when t < len(script[i]). Returns the list of calls' row counts."""
    calls: list[int] = []

    def fake(model, rows, rollout, stop_ids, pad_id, *, greedy, row_keys=None, synced_gpus=False):
        t = len(calls)
        calls.append(len(rows))
        out = [s[t] + [pad_id] * 3 for s in script if t < len(s)]
        assert len(out) == len(rows), (t, len(out), len(rows))
        return out, 0

    monkeypatch.setattr(T, "decoder", lambda *a, **k: fake)
    return calls


def sample(i: int = 0) -> Sample:
    return Sample(task="calc", id=str(i), messages=({"role": "user", "content": f"What is 123*45{i}?"},),
                  gold={"answer": str(123 * (450 + i))})


# ----------------------------------------------------------------------------------------------- the trajectory
def test_a_trajectory_is_prompt_reply_tool_message_reply_with_the_models_tokens_marked(tok, model, box, monkeypatch):
    call = reply(tok, call_text("calculator", {"expression": "123*450"}))
    answer = reply(tok, "the product is 55350")
    direct = reply(tok, "the product is 5")
    calls = scripted(monkeypatch, [[call, answer], [direct]])
    rollouts, metrics = T.tool_rollouts(model, tok, [sample()], RolloutConfig(k=2, max_new_tokens=40), tools=box)
    assert calls == [2, 1]  # the second turn decodes only the trajectory that called a tool
    suffix = T.tool_suffix_ids(tok, [{"role": "tool", "name": "calculator", "content": "55350"}])
    r = rollouts[0]
    assert list(r.completion_ids) == call + suffix + answer
    assert list(r.model_mask) == [1] * len(call) + [0] * len(suffix) + [1] * len(answer)
    assert r.prompt_ids == tuple(box.encode_prompt(tok, sample().messages))
    assert r.text == "the product is 55350" and r.stopped and not r.truncated
    assert [m["role"] for m in r.messages] == ["assistant", "tool", "assistant"] and r.messages[1]["content"] == "55350"
    assert (r.tool_use.n_calls, r.tool_use.n_failures, r.tool_use.turns, r.tool_use.cut_by_limit) == (1, 0, 2, False)
    single = rollouts[1]
    assert list(single.completion_ids) == direct and list(single.model_mask) == [1] * len(direct)
    assert metrics["tools/calls_per_rollout"] == 0.5 and metrics["tools/turns"] == 1.5
    assert metrics["tools/calculator/calls_per_rollout"] == 0.5 and metrics["tools/failure_rate"] == 0.0


def test_k_samples_of_a_prompt_stay_one_group_in_order(tok, model, box, monkeypatch):
    call = reply(tok, call_text("calculator", {"expression": "1*2"}))
    scripted(monkeypatch, [[call, reply(tok, f"{i}")] if i % 2 else [reply(tok, f"{i}")] for i in range(6)])
    rollouts, _ = T.tool_rollouts(model, tok, [sample(0), sample(1), sample(2)], RolloutConfig(k=2), tools=box)
    assert [r.sample.id for r in rollouts] == ["0", "0", "1", "1", "2", "2"]
    assert [r.text for r in rollouts] == [str(i) for i in range(6)]


def test_the_turn_limit_ends_a_trajectory_that_keeps_calling(tok, model, box, monkeypatch):
    call = reply(tok, call_text("calculator", {"expression": "2*3"}))
    scripted(monkeypatch, [[call, call, call]])
    [r], metrics = T.tool_rollouts(model, tok, [sample()], RolloutConfig(k=2, max_tool_turns=2), tools=box,
                                   plan=GREEDY)
    assert r.tool_use.turns == 3 and r.tool_use.cut_by_limit and r.tool_use.n_calls == 3  # the last call never ran
    assert [m["role"] for m in r.messages] == ["assistant", "tool", "assistant", "tool", "assistant"]
    assert metrics["tools/cut_by_limit"] == 1.0 and metrics["tools/turns"] == 3.0


def test_the_token_budget_ends_a_trajectory_before_a_result_it_cannot_hold(tok, model, box, monkeypatch):
    call = reply(tok, call_text("calculator", {"expression": "2*3"}))
    scripted(monkeypatch, [[call]])
    rollout = RolloutConfig(k=2, max_new_tokens=len(call), max_trajectory_tokens=len(call) + 2)
    [r], _ = T.tool_rollouts(model, tok, [sample()], rollout, tools=box, plan=GREEDY)
    assert list(r.completion_ids) == call and r.tool_use.cut_by_limit and r.tool_use.n_calls == 1


def test_a_raising_tool_a_timeout_and_a_malformed_call_are_told_to_the_model_and_counted(tok, model, box, monkeypatch):
    bad_json = reply(tok, '<tool_call>{"name": "calculator", "arguments": </tool_call>')
    raising = reply(tok, call_text("broken", {"x": 1}))
    slow = reply(tok, call_text("sleepy", {"seconds": 5.0}))
    unknown = reply(tok, call_text("shell", {"cmd": "ls"}))
    end = reply(tok, "done")
    scripted(monkeypatch, [[bad_json, end], [raising, end], [slow, end], [unknown, end]])
    start = time.perf_counter()
    rollouts, metrics = T.tool_rollouts(model, tok, [sample(0), sample(1)], RolloutConfig(k=2), tools=box)
    assert time.perf_counter() - start < 3.0  # the 5 s call was abandoned at its 0.3 s timeout
    contents = [r.messages[1]["content"] for r in rollouts]
    assert "not valid JSON" in contents[0]
    assert contents[1] == "error: broken raised RuntimeError: the service is down"
    assert contents[2] == "error: sleepy timed out after 0.3 s"
    assert "unknown tool 'shell'" in contents[3] and rollouts[3].messages[1]["name"] == T.INVALID_TOOL
    assert all(r.text == "done" and r.tool_use.n_failures == 1 and r.tool_use.turns == 2 for r in rollouts)
    assert metrics["tools/failure_rate"] == 1.0 and metrics["tools/broken/failure_rate"] == 1.0
    assert metrics["tools/invalid/calls_per_rollout"] == 0.5  # the malformed call and the unknown tool


def test_tool_rollouts_on_the_tiny_model_decode_every_turn_from_the_exact_ids(tok, model, box, monkeypatch):
    """Real decoding, with the first reply of rows 0 and 2 replaced by a call: the second turn continues each
    trajectory from exactly prompt + reply + tool message, with fresh keys per turn."""
    real, seen = T.decoder, []
    call = reply(tok, call_text("calculator", {"expression": "3*4"}))

    def first_turn_calls(model, rows, rollout, stop_ids, pad_id, **kw):
        out, fixed = real(model, rollout, kw["greedy"])(model, rows, rollout, stop_ids, pad_id, **kw)
        seen.append(([list(r) for r in rows], kw.get("row_keys")))
        if len(seen) == 1:
            out = [call if i % 2 == 0 else o for i, o in enumerate(out)]
        return out, fixed

    monkeypatch.setattr(T, "decoder", lambda *a, **k: first_turn_calls)
    keys = [11, 12, 13, 14]
    rollouts, metrics = T.tool_rollouts(model, tok, [sample(0), sample(1)], RolloutConfig(k=2, max_new_tokens=8),
                                        tools=box, plan=SamplingPlan(row_keys=keys))
    assert len(seen) == 2 and seen[0][1] == keys and seen[1][1] == T.turn_keys([11, 13], 1)
    for i in (0, 2):
        suffix = T.tool_suffix_ids(tok, [{"role": "tool", "name": "calculator", "content": "12"}])
        assert rollouts[i].completion_ids[:len(call) + len(suffix)] == tuple(call + suffix)
        assert seen[1][0][i // 2] == list(rollouts[i].prompt_ids) + call + suffix
    assert metrics["tools/calls_per_rollout"] == 0.5


# ------------------------------------------------------------------------------------------------- the train batch
def two_turn_batch(tok, model, box, monkeypatch, mask_truncated: bool = False):
    call = reply(tok, call_text("calculator", {"expression": "123*450"}))
    scripted(monkeypatch, [[call, reply(tok, "the product is 55350")], [reply(tok, "no idea")],
                           [call, reply(tok, "55350")], [reply(tok, "the product is 55350 for sure")]])
    rollouts, _ = T.tool_rollouts(model, tok, [sample(0), sample(1)], RolloutConfig(k=2), tools=box)
    scored = [Scored(r, 1.0 if "55350" in r.text else 0.0) for r in rollouts]
    adv = torch.tensor([0.7, -0.7, 0.3, -0.3])
    return rollouts, build_train_batch(scored, adv, ["calc"], tok.pad_token_id, torch.device("cpu"), group_size=2,
                                       mask_truncated=mask_truncated)


def test_the_completion_mask_of_the_batch_is_the_model_token_mask(tok, model, box, monkeypatch):
    rollouts, batch = two_turn_batch(tok, model, box, monkeypatch)
    for b, r in enumerate(rollouts):
        n = len(r.completion_ids)
        assert batch.completion_mask_BT[b, :n].tolist() == [float(m) for m in r.model_mask]
        assert batch.completion_mask_BT[b, n:].sum() == 0
        assert batch.input_ids_BL[b, batch.prompt_len:batch.prompt_len + n].tolist() == list(r.completion_ids)
    assert batch.num_tokens == sum(sum(r.model_mask) for r in rollouts)


def one_forward_logprobs(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """log p(completion_t | everything before it) from one plain forward over prompt + completion, no padding."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    logps = torch.log_softmax(logits[len(prompt) - 1:-1], dim=-1)
    return logps.gather(1, torch.tensor(completion)[:, None]).squeeze(1)


@pytest.mark.parametrize("micro_batch_seqs", [1, 2, 4])
def test_multi_turn_logprobs_equal_one_forward_over_the_concatenated_ids(tok, model, box, monkeypatch,
                                                                         micro_batch_seqs):
    """Every micro-batch size: a row whose mask has holes (tool results) keeps every column up to its last reply
    (the micro-batch trimming once cut a row at its mask's sum, dropping the last reply's tokens)."""
    rollouts, batch = two_turn_batch(tok, model, box, monkeypatch)
    logps_BT = batch_logprobs(model, batch, micro_batch_seqs, temperature=1.0)
    for b, r in enumerate(rollouts):
        want = one_forward_logprobs(model, list(r.prompt_ids), list(r.completion_ids))
        mask = torch.tensor(r.model_mask, dtype=torch.float32)
        torch.testing.assert_close(logps_BT[b, :len(mask)], want * mask, atol=2e-5, rtol=0)
        assert (logps_BT[b, :len(mask)][mask > 0] != 0).all()


def test_the_loss_gradient_is_exactly_zero_on_every_tool_result_token(tok, model, box, monkeypatch):
    """Policy loss, KL and entropy bonus together: d loss / d log p_t and d loss / d H_t vanish wherever the model
    did not write the token, and not on its own tokens."""
    rollouts, batch = two_turn_batch(tok, model, box, monkeypatch)
    batch.ref_logps_BT = batch_logprobs(model, batch, 4, temperature=1.0) - 0.05 * batch.completion_mask_BT
    caught = []
    real = micro_batch_terms.__globals__["completion_logprobs"]

    def keep_grads(*args, **kwargs):
        logps_BT, entropy_BT = real(*args, **kwargs)
        logps_BT.retain_grad()
        entropy_BT.retain_grad()
        caught.append((logps_BT, entropy_BT))
        return logps_BT, entropy_BT

    monkeypatch.setitem(micro_batch_terms.__globals__, "completion_logprobs", keep_grads)
    loss = LossConfig(entropy_coef=0.01)
    pg_BT, reg_BT, mask_BT, _ = micro_batch_terms(model, batch, torch.tensor([0.1]), loss, 1.0, True)
    aggregate(pg_BT + reg_BT, mask_BT, loss.agg_mode).backward()
    (logps_BT, entropy_BT), = caught
    tool_BT = (batch.completion_mask_BT == 0) & (batch.attention_mask_BL[:, batch.prompt_len:] > 0)
    assert tool_BT.sum() >= 2 * len(T.tool_suffix_ids(tok, [{"role": "tool", "name": "calculator",
                                                             "content": "55350"}]))
    for grad in (logps_BT.grad, entropy_BT.grad):
        assert (grad[tool_BT] == 0).all()
        assert (grad[batch.completion_mask_BT > 0] != 0).any()


# ------------------------------------------------------------------------------------------------------ TRL parity
def trl_trajectories(tok, box, prompts_ids, script):
    """TRL 1.16's `GRPOTrainer._tool_call_loop` on a stand-in trainer holding what it reads, generating `script`'s
    replies (TRL's first turn is generated before the loop); `parse_response` parses with our default format."""
    trl = pytest.importorskip("trl.trainer.grpo_trainer")
    turn = [0]

    def generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        turn[0] += 1
        return [s[turn[0]] for s in script if turn[0] < len(s)], None

    def parse(tokenizer, ids, prefix=None, tools=None):
        text = tokenizer.decode(ids, skip_special_tokens=True)
        calls = [c for c in parse_tool_calls(text, box.names) if c.error is None]
        out = {"role": "assistant", "content": text}
        if calls:
            out["tool_calls"] = [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                                 for c in calls]
        return out

    trainer = types.SimpleNamespace(
        processing_class=tok, _tokenizer=tok, chat_template=None, chat_template_kwargs={}, _is_vlm=False,
        use_vllm=False, model=types.SimpleNamespace(config=types.SimpleNamespace(max_position_embeddings=4096)),
        max_completion_length=4096, max_tool_calling_iterations=4, environment_factories=None,
        tools=[t.fn for t in box.tools], _sync_tool_dicts=[{t.name: t.fn for t in box.tools}] * len(script),
        _async_tool_dicts=[{}] * len(script), _generate_single_turn=generate)
    trainer._get_tool_suffix_ids = lambda messages: trl.GRPOTrainer._get_tool_suffix_ids(trainer, messages)
    original = trl.parse_response
    trl.parse_response = parse
    try:
        first = [s[0] for s in script]
        prompts = [[{"role": "user", "content": "q"}] for _ in script]
        out = trl.GRPOTrainer._tool_call_loop(trainer, prompts, [list(p) for p in prompts_ids],
                                              [list(f) for f in first], [[parse(tok, f)] for f in first], None, None,
                                              None)
    finally:
        trl.parse_response = original
    tool_mask, _, completion_ids, _, n_calls, n_failures, _ = out
    return tool_mask, completion_ids, n_calls, n_failures


def trl_loss(logps, old, ref, adv, mask, beta, eps_low=0.2, eps_high=0.2):
    """TRL 1.16 `_compute_loss` for loss_type="bnpo" (a token mean over the batch: our token-mean), token-level
    ratios, k3 KL (grpo_trainer.py:3084-3158, the lines that apply)."""
    advantages = adv.unsqueeze(1)
    coef_1 = torch.exp(logps - old)
    per_token_kl = torch.exp(ref - logps) - (ref - logps) - 1
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages) + beta * per_token_kl
    return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)


def test_the_mask_of_model_tokens_and_the_loss_equal_trls_on_the_same_trajectory(tok, model, box, monkeypatch):
    calls2 = reply(tok, call_text("calculator", {"expression": "2*3"}) + call_text("calculator", {"expression": "4*5"}))
    call = reply(tok, call_text("calculator", {"expression": "123*450"}))
    script = [[call, calls2, reply(tok, "6 and 20")], [reply(tok, "no idea")], [call, reply(tok, "55350")],
              [reply(tok, "the product is 55350")]]
    scripted(monkeypatch, script)
    rollouts, _ = T.tool_rollouts(model, tok, [sample(0), sample(1)], RolloutConfig(k=2), tools=box)
    tool_mask, completion_ids, n_calls, n_failures = trl_trajectories(tok, box, [r.prompt_ids for r in rollouts],
                                                                      script)
    assert [list(r.completion_ids) for r in rollouts] == completion_ids
    assert [list(r.model_mask) for r in rollouts] == tool_mask
    assert sum(r.tool_use.n_calls for r in rollouts) == n_calls == 4
    assert sum(r.tool_use.n_failures for r in rollouts) == n_failures == 0

    # the same loss on identical tensors: our batch's completion mask is TRL's completion_mask * tool_mask
    scored = [Scored(r, 0.0) for r in rollouts]
    adv = torch.tensor([0.9, -0.9, 0.4, -0.4])
    batch = build_train_batch(scored, adv, ["calc"], tok.pad_token_id, torch.device("cpu"))
    T_ = batch.completion_mask_BT.shape[1]
    trl_mask = torch.zeros(4, T_)
    for b, m in enumerate(tool_mask):
        trl_mask[b, :len(m)] = torch.tensor(m, dtype=torch.float32)  # completion_mask (1 on ids) * tool_mask
    assert torch.equal(batch.completion_mask_BT, trl_mask)
    g = torch.Generator().manual_seed(0)
    logps = (-torch.rand(4, T_, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    old = logps.detach() + 0.2 * torch.randn(4, T_, generator=g, dtype=torch.float64)
    ref = logps.detach() + 0.3 * torch.randn(4, T_, generator=g, dtype=torch.float64)
    mask = batch.completion_mask_BT.double()
    pg_BT, _ = policy_loss("grpo", logps, old, adv.double(), mask, clip_low=0.2, clip_high=0.2)
    ours = aggregate(pg_BT + 0.04 * kl_penalty(logps, ref, "k3"), mask, "token-mean")
    theirs = trl_loss(logps, old, ref, adv.double(), trl_mask.double(), beta=0.04)
    (g_ours,), (g_trl,) = torch.autograd.grad(ours, logps), torch.autograd.grad(theirs, logps)
    torch.testing.assert_close(ours, theirs, atol=1e-12, rtol=0)
    torch.testing.assert_close(g_ours, g_trl, atol=1e-12, rtol=0)
    assert (g_ours[mask == 0] == 0).all() and (g_ours[mask > 0] != 0).any()


# ---------------------------------------------------------------------------------------------- runs with tools
ROWS = [{"prompt": [{"role": "user", "content": f"What is 12*{i}?"}], "answer": str(12 * i)} for i in range(24)]
SHORT = {"train": {"max_steps": 2, "prompts_per_micro_step": 2, "eval_every": 0, "tensorboard": False,
                   "sample_every": 0, "lr": 1e-2},
         "rollout": {"k": 2, "max_new_tokens": 6}, "data": {"eval_size": 4}}
TINY = ["model.tiny_hidden=32", "model.tiny_layers=1", "model.tiny_heads=2"]


@pytest.fixture
def calls_sometimes(monkeypatch):
    """Real decoding, except that each first reply whose first sampled id is even becomes a calculator call: a
    randomly initialised model would never write one, and the runs below need tool turns. Deterministic given the
    sampled ids, so an interrupted and resumed run decides as the uninterrupted one does."""
    real = T.decoder

    def forced(model, rows, rollout, stop_ids, pad_id, **kw):
        out, fixed = real(model, rollout, kw["greedy"])(model, rows, rollout, stop_ids, pad_id, **kw)
        tok = forced.tokenizer
        first = not any(tok.decode(r).count("tool: ") for r in rows)  # the tiny template's tool turns
        if first:
            call = tok(call_text("calculator", {"expression": "12*3"}), add_special_tokens=False)["input_ids"]
            out = [call + [stop_ids[0]] if o and o[0] % 2 == 0 else o for o in out]
        return out, fixed

    monkeypatch.setattr(T, "decoder", lambda *a, **k: forced)
    return forced


def test_train_with_tools_runs_logs_tool_metrics_and_rewards_see_the_trajectory(tmp_path, calls_sometimes,
                                                                                monkeypatch):
    import grpo_train
    from grpo.run.assembly import model_loading

    real_policy = model_loading.policy_from_config

    def policy(*args, **kwargs):  # the tokenizer the run builds, for the forcing fixture
        p = real_policy(*args, **kwargs)
        calls_sometimes.tokenizer = p.tokenizer
        return p

    monkeypatch.setattr(grpo_train, "policy_from_config", policy)
    seen = []

    def reward_used_tool(completions, trajectory, tool_calls, tool_failures, answer, **kwargs):
        seen.append((completions, trajectory, tool_calls, tool_failures))
        return [float(n > 0 and m[-1]["content"] == a) for n, m, a in zip(tool_calls, completions, answer, strict=True)]

    run = grpo_train.train(TINY, tasks={"calc": ROWS}, rewards={"calc": [reward_used_tool]}, tools=[calculator],
                           **{**SHORT, "train": {**SHORT["train"], "output_dir": str(tmp_path), "run_name": "t"}})
    rows = [json.loads(x) for x in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if "tools/calls_per_rollout" in r]
    assert len(rl) == 2 and sum(r["tools/calls_per_rollout"] for r in rl) > 0
    assert {"tools/failure_rate", "tools/turns", "tools/cut_by_limit", "tools/calculator/calls_per_rollout",
            "doctor/tool_unused", "doctor/tool_loops"} <= set(rl[0])
    assert json.loads((run.run_dir / "config.json").read_text())["rollout"]["tools"] == [
        T.tool_specs([calculator])[0][0]]
    with_call = [(c, t, n, f) for batch in seen for c, t, n, f in zip(*batch, strict=True) if n]
    assert with_call  # the reward function got whole trajectories: prompt, the call, the tool message, the reply
    completion, trajectory, n, failures = with_call[0]
    assert [m["role"] for m in completion] == ["assistant", "tool", "assistant"] and completion[1]["content"] == "36"
    assert trajectory[0]["role"] == "user" and trajectory[0]["content"].startswith("What is 12*")
    assert trajectory[1:] == completion
    assert (n, failures) == (1, 0)


def test_a_tool_that_cannot_be_imported_stops_the_run_before_the_model_loads(tmp_path, monkeypatch):
    import grpo_train

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(grpo_train, "policy_from_config", no_model)
    cfg = fast_config(tmp_path, "rollout.tools=tests.test_tool_rollouts:no_such_tool")
    with pytest.raises(ConfigError, match="no callable 'no_such_tool'") as err:
        grpo_train.setup(cfg)
    assert err.value.field == "rollout.tools" and not (tmp_path / "t").exists()


def test_resume_with_a_deterministic_tool_is_bit_identical(tmp_path, calls_sometimes, monkeypatch):
    """2N steps in one go == N steps, then resume, then N steps, with tool turns in the rollouts."""
    import grpo_train as G
    from grpo.run.assembly import model_loading

    real_policy = model_loading.policy_from_config

    def policy(*args, **kwargs):
        p = real_policy(*args, **kwargs)
        calls_sometimes.tokenizer = p.tokenizer
        return p

    monkeypatch.setattr(G, "policy_from_config", policy)
    extra = ["rollout.tools=tests.test_tool_rollouts:calculator", "checkpoint.every=2", "rollout.max_new_tokens=8",
             "rollout.max_tool_turns=2"]
    assert_resume_is_bit_identical(tmp_path, extra, "tools/calls_per_rollout")


# ------------------------------------------------------------------------------------------------------ the doctor
def tool_rows(n: int, calls: float, failures: float, cut: float) -> list[dict]:
    return [{"step": s, "adv/frac_zero_std": 0.0, "reward/calc/mean": 0.5, "tools/calls_per_rollout": calls,
             "tools/failure_rate": failures, "tools/turns": 1 + calls, "tools/cut_by_limit": cut}
            for s in range(1, n + 1)]


@pytest.mark.parametrize("calls,failures,cut,want", [
    (0.0, 0.0, 0.0, {("tool_unused", "yellow")}),
    (1.0, 0.3, 0.0, {("tool_failures", "yellow")}),
    (1.0, 0.9, 0.0, {("tool_failures", "red")}),
    (2.0, 0.0, 0.6, {("tool_loops", "yellow")}),
    (1.0, 0.1, 0.1, set()),
])
def test_the_doctor_names_an_unused_tool_dominant_errors_and_loops(calls, failures, cut, want):
    from grpo.run.doctor.thresholds import TOOL_CODES, DoctorThresholds
    from grpo.run.doctor.verdict import Doctor

    doctor = Doctor(DoctorThresholds(), config={"rollout": {"tools": ["m:calculator"]}, "sft": {"steps": 0}})
    for row in tool_rows(10, calls, failures, cut):
        doctor.update(row)
    found = {(f.code, f.level) for f in doctor.findings() if f.code in TOOL_CODES}
    assert found == want
    assert all(f"doctor/{c}" in doctor.metrics() for c in TOOL_CODES)
    quiet = Doctor(DoctorThresholds())  # a run without tools: no tool codes, no tool findings
    for row in tool_rows(10, 0.0, 0.0, 0.0):
        quiet.update({k: v for k, v in row.items() if not k.startswith("tools/")})
    assert not any(f.code in TOOL_CODES for f in quiet.findings())
    assert not any(f"doctor/{c}" in quiet.metrics() for c in TOOL_CODES)


def test_the_smollm2_tools_preset_runs_its_task_tool_and_grader_on_the_tiny_model(tmp_path, monkeypatch):
    """The preset's rows, tool, reward and warm-up wired end to end, on the tiny model instead of SmolLM2 (whose run
    is recorded in docs/CUSTOM_TASKS.md): the warm-up's demonstrations are the tool calls, rendered with the tool
    instructions the rollouts' prompts get."""
    import grpo_train as G
    from grpo import config as C
    from grpo.phases import sft

    monkeypatch.chdir(Path(__file__).resolve().parents[1])  # the preset's paths are relative to the repository
    seen = []
    real = sft.sft_examples
    monkeypatch.setattr(G, "sft_examples", lambda tok, rows, system, cap, **kw: seen.append(system) or real(
        tok, rows, system, cap, **kw))
    cfg = C.load_config("smollm2-tools", [f"train.output_dir={tmp_path}", "train.run_name=p", "model.name=builtin:tiny",
                                          "model.lora=false", *TINY, "train.max_steps=1", "sft.steps=2",
                                          "data.eval_size=4", "rollout.k=2", "rollout.max_new_tokens=8",
                                          "train.prompts_per_micro_step=2", "train.tensorboard=false"])
    run = G.main(cfg)
    assert set(run.progress.evals) == {"before_sft", "after_sft", "after_rl"}
    assert run.generation.toolbox.names == ["calculator"] and seen == [run.generation.toolbox.system_prompt]
    rows = [json.loads(x) for x in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any("tools/calls_per_rollout" in r for r in rows)
    kept = [json.loads(x) for x in (run.run_dir / "evals" / "after_rl.jsonl").read_text().splitlines()]
    assert len(kept) == 8 and all(k["messages"][0]["role"] == "assistant" and "tool_calls" in k for k in kept)
    assert {k["task"] for k in kept} == {"products", "products_answer"}  # the second turn's rows: a task of their own


def test_the_docs_trl_tools_script_runs_here_with_only_the_import_and_the_call_changed(tmp_path, monkeypatch):
    """docs/CUSTOM_TASKS.md section 6: the TRL script's tool, reward function and rows, as the doc writes them, train
    through the doc's grpo_train.train(...) call, as the doc writes it. Only the model is a tiny one built here, and
    GRPOConfig gets max_steps=2 and short completions (its defaults train 3 epochs of 256 tokens)."""
    import functools
    import re

    import trl

    text = (Path(__file__).resolve().parents[1] / "docs" / "CUSTOM_TASKS.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    trl_script = next(b for b in blocks if "GRPOTrainer(" in b and "tools=[multiply]" in b)
    ours = next(b for b in blocks if "grpo_train.train(" in b and "tools=[multiply]" in b)
    shared, trl_only = trl_script.split("trainer = GRPOTrainer(")
    assert "trainer.train()" in trl_only  # everything before the trainer is the user's code, run unchanged
    tokenizer = build_tiny_tokenizer(CORPUS, vocab_size=320)
    namespace = {"model": build_tiny_model(tokenizer, seed=3, hidden=64, layers=2, heads=4, kv_heads=2),
                 "tokenizer": tokenizer}
    exec(compile(shared, "docs/CUSTOM_TASKS.md", "exec"), namespace)
    namespace["GRPOConfig"] = functools.partial(trl.GRPOConfig, output_dir=str(tmp_path / "run"), max_steps=2,
                                                max_completion_length=12, report_to=[], use_cpu=True)
    monkeypatch.chdir(tmp_path)
    exec(compile(ours, "docs/CUSTOM_TASKS.md", "exec"), namespace)
    run = namespace["run"]
    assert run.progress.step == 2 and run.generation.toolbox.names == ["multiply"]
    rows = [json.loads(x) for x in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sum("tools/calls_per_rollout" in r for r in rows) == 2
