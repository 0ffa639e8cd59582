"""Environments for stateful tool tasks, TRL 1.16's environment_factory: one instance per trajectory, reset on its
row (its text appended to the prompt), its public methods the model's tools, reward functions given `environments`;
a run with a deterministic environment resumes bit-identically."""

from __future__ import annotations

import json

import pytest

from grpo.config import ConfigError, RolloutConfig
from grpo.core.step_types import Sample
from grpo.models.modeling import build_tiny_model, build_tiny_tokenizer
from grpo.phases import environments as E
from grpo.phases import tools as T
from tests.trainer_helpers import assert_resume_is_bit_identical, call_text

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

BUILT: list[int] = []


class GuessingGame:
    """Guess a secret number from 1 to 9; the game answers higher / lower / right."""

    def __init__(self):
        BUILT.append(1)
        self.secret, self.guesses, self.solved = 0, [], False

    def reset(self, prompt, secret=None, **kwargs):
        """The secret comes from the row's `secret` column, else from the prompt's length (deterministic)."""
        text = prompt if isinstance(prompt, str) else prompt[-1]["content"]
        self.secret = int(secret) if secret is not None else len(text) % 9 + 1
        self.guesses, self.solved = [], False
        return " Guess with the guess tool."

    def guess(self, number: int) -> str:
        """Guess the secret number.

        Args:
            number: A whole number from 1 to 9.
        """
        self.guesses.append(int(number))
        self.solved = int(number) == self.secret
        return "right" if self.solved else ("higher" if int(number) < self.secret else "lower")

    def get_reward(self) -> float:
        return float(self.solved)

    def _cheat(self) -> int:
        return self.secret


class NoReset:
    def look(self, x: int) -> str:
        """Look.

        Args:
            x: Anything.
        """
        return "nothing"


def solved_reward(completions, environments, **kwargs):
    """TRL-style reward read from each completion's environment."""
    return [e.get_reward() for e in environments]


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer(["right higher lower", call_text("guess", {"number": 5})], vocab_size=320)


@pytest.fixture(scope="module")
def model(tok):
    return build_tiny_model(tok, seed=2, hidden=32, layers=1, heads=2, kv_heads=1)


def sample(i: int, secret: int) -> Sample:
    return Sample(task="game", id=str(i), messages=({"role": "user", "content": f"Game {i}."},),
                  gold={"secret": str(secret)})


def test_public_methods_are_the_tools_reset_get_reward_and_private_ones_are_not():
    env = E.build_environments(GuessingGame)
    assert env.name == "GuessingGame" and env.methods == ["guess"]
    assert env.schemas[0]["function"]["parameters"]["properties"]["number"]["type"] == "integer"
    assert len(env.pool) == 1  # the probe is the pool's first instance (built once, reset often)


def test_an_environment_without_reset_or_with_a_tool_name_taken_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match="NoReset has no reset method") as err:
        E.build_environments(NoReset)
    assert err.value.field == "rollout.environment_factory"
    with pytest.raises(ConfigError, match=r"\['guess'\] have the names of rollout.tools"):
        E.build_environments(GuessingGame, tool_names=["guess"])
    with pytest.raises(ConfigError, match="no callable 'Nope'"):
        E.resolve_environment("tests.test_tool_environments:Nope")

    class Undocumented(GuessingGame):
        def peek(self, x):
            return self.secret

    with pytest.raises(ConfigError, match="Undocumented: method 'peek': no JSON schema.*start its name with '_'"):
        E.build_environments(Undocumented)


def test_each_trajectory_has_its_own_environment_reset_on_its_row(tok, model, monkeypatch):
    """Two prompts x K 2: four games. Trajectory i guesses i + 4 then answers; each game holds its own guesses, its
    secret from its row, the reset's text at the end of its prompt, and the rollout keeps it for the rewards."""
    env = E.build_environments(GuessingGame)
    box = T.ToolBox([], timeout_s=5.0, max_result_tokens=16, environment=env)
    answer = tok("done", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    turn = []

    def fake(model, rows, rollout, stop_ids, pad_id, *, greedy, row_keys=None, synced_gpus=False):
        turn.append(1)
        if len(turn) > 1:
            return [answer for _ in rows], 0
        return [tok(call_text("guess", {"number": i + 4}), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
                for i in range(len(rows))], 0

    monkeypatch.setattr(T, "decoder", lambda *a, **k: fake)
    rollouts, metrics = T.tool_rollouts(model, tok, [sample(0, 5), sample(1, 6)], RolloutConfig(k=2), tools=box)
    games = [r.environment for r in rollouts]
    assert len({id(g) for g in games}) == 4 and all(g is p for g, p in zip(games, env.pool, strict=True))
    assert [g.guesses for g in games] == [[4], [5], [6], [7]] and [g.secret for g in games] == [5, 5, 6, 6]
    assert [r.messages[1]["content"] for r in rollouts] == ["higher", "right", "right", "lower"]
    assert [g.get_reward() for g in games] == [0.0, 1.0, 1.0, 0.0]
    assert tok.decode(rollouts[0].prompt_ids).endswith("Game 0. Guess with the guess tool.<|end|><|assistant|>")
    assert metrics["tools/guess/calls_per_rollout"] == 1.0
    turn.clear()
    again, _ = T.tool_rollouts(model, tok, [sample(2, 1)], RolloutConfig(k=2), tools=box)  # pooled: reset, reused
    assert all(r.environment is g for r, g in zip(again, games[:2], strict=True))
    assert [r.environment.guesses for r in again] == [[4], [5]] and again[0].environment.secret == 1


def test_get_reward_is_one_more_term_of_every_task_named_after_the_class():
    from grpo.grading.scoring import RewardSpec

    specs = {"a": RewardSpec("a", (("mine", 1.0),)), "b": RewardSpec("b", (("GuessingGame", 2.0),))}
    out, callables = E.environment_rewards(specs, {"mine": solved_reward}, E.build_environments(GuessingGame))
    assert out["a"].terms == (("mine", 1.0), ("GuessingGame_2", 1.0))  # the class name was taken: made unique
    assert out["b"].terms == (("GuessingGame", 2.0), ("GuessingGame_2", 1.0))
    games = [GuessingGame(), GuessingGame()]
    games[1].solved = True
    assert callables["GuessingGame_2"](environments=games, completions=["x", "y"]) == [0.0, 1.0]

    class NoReward(GuessingGame):
        get_reward = None

    assert E.environment_rewards(specs, {}, E.build_environments(NoReward)) == (specs, {})
    assert E.environment_rewards(specs, None, None) == (specs, {})


def test_a_reset_that_raises_stops_the_rollout_naming_the_environment_and_row(tok, model):
    class Broken(GuessingGame):
        def reset(self, **kwargs):
            raise KeyError("no such level")

    box = T.ToolBox([], timeout_s=5.0, max_result_tokens=16, environment=E.build_environments(Broken))
    with pytest.raises(ConfigError, match=r"Broken: reset\(\) on row '0' of task 'game' raised KeyError"):
        T.tool_rollouts(model, tok, [sample(0, 5)], RolloutConfig(k=2), tools=box)


# ---------------------------------------------------------------------------------------------- in a whole run
ROWS = [{"prompt": f"Guess my number, game {i}.", "secret": str(i % 9 + 1)} for i in range(12)]
TINY = ["model.tiny_hidden=32", "model.tiny_layers=1", "model.tiny_heads=2"]


@pytest.fixture
def guesses_sometimes(monkeypatch):
    """Real decoding, except that a first reply whose first sampled id is even becomes a guess of 5 (a random tiny
    model never writes a call); deterministic given the sampled ids, so a resumed run decides as the first did."""
    real = T.decoder

    def forced(model, rows, rollout, stop_ids, pad_id, **kw):
        out, fixed = real(model, rollout, kw["greedy"])(model, rows, rollout, stop_ids, pad_id, **kw)
        tok = forced.tokenizer
        if not any(tok.decode(r).count("tool: ") for r in rows):  # the first turn (the tiny template's tool turns)
            call = tok(call_text("guess", {"number": 5}), add_special_tokens=False)["input_ids"]
            out = [call + [stop_ids[0]] if o and o[0] % 2 == 0 else o for o in out]
        return out, fixed

    monkeypatch.setattr(T, "decoder", lambda *a, **k: forced)
    return forced


def keep_tokenizer(monkeypatch, fixture):
    import grpo_train
    from grpo.run.assembly import model_loading

    real = model_loading.policy_from_config

    def policy(*args, **kwargs):
        p = real(*args, **kwargs)
        fixture.tokenizer = p.tokenizer
        return p

    monkeypatch.setattr(grpo_train, "policy_from_config", policy)


def test_train_with_an_environment_factory_hands_rewards_the_environments(tmp_path, guesses_sometimes, monkeypatch):
    import grpo_train

    keep_tokenizer(monkeypatch, guesses_sometimes)
    seen = []

    def reward(completions, environments, secret, **kwargs):
        seen.append([(type(e).__name__, e.secret, list(e.guesses)) for e in environments])
        return [e.get_reward() for e in environments]

    run = grpo_train.train(TINY, tasks={"game": ROWS}, rewards={"game": [reward]}, environment_factory=GuessingGame,
                           train={"max_steps": 2, "prompts_per_micro_step": 2, "eval_every": 0, "tensorboard": False,
                                  "sample_every": 0, "output_dir": str(tmp_path), "run_name": "g"},
                           sft={"steps": 0}, rollout={"k": 2, "max_new_tokens": 6}, data={"eval_size": 4})
    config = json.loads((run.run_dir / "config.json").read_text())
    assert config["rollout"]["environment_factory"] == E.factory_spec(GuessingGame)[0]  # importable: module:Class
    assert config["rollout"]["environment_factory"].endswith("test_tool_environments:GuessingGame")
    assert seen[0] == [("GuessingGame", int(ROWS[0]["secret"]), [])] * len(seen[0])  # the preflight: fresh, reset
    played = [g for batch in seen[1:] for g in batch if g[2]]
    assert played and all(g == ("GuessingGame", g[1], [5]) for g in played)  # each game saw only its own guess
    rows = [json.loads(x) for x in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sum(r.get("tools/guess/calls_per_rollout", 0) for r in rows) > 0  # the environment's method is the tool
    assert any("eval_part/game/GuessingGame" in r for r in rows)  # its get_reward: a reward term, as in TRL


def test_resume_with_a_deterministic_environment_is_bit_identical(tmp_path, guesses_sometimes, monkeypatch):
    """2N steps in one go == N steps, then resume, then N steps, the games reset from their rows alone."""
    keep_tokenizer(monkeypatch, guesses_sometimes)
    extra = ["rollout.environment_factory=tests.test_tool_environments:GuessingGame", "checkpoint.every=2",
             "rollout.max_new_tokens=8", "rollout.max_tool_turns=2",
             "rewards.fairness=tests.test_tool_environments:solved_reward:1.0",
             "rewards.hallucination=tests.test_tool_environments:solved_reward:1.0"]
    assert_resume_is_bit_identical(tmp_path, extra, "tools/guess/calls_per_rollout")


def test_a_rollout_crosses_processes_without_its_environment():
    """The step's rollouts are pickled to every process after the rewards read their environments: an environment
    holding a lock (or a socket, a sandbox) would stop the gather; it stays in its process."""
    import pickle
    import threading

    from grpo.core.step_types import Rollout

    game = GuessingGame()
    game.lock = threading.Lock()
    r = Rollout(sample(0, 5), (1,), (2, 3), "done", True, False, model_mask=(1, 1), environment=game)
    back = pickle.loads(pickle.dumps(r))
    assert back.environment is None and back == r and r.environment is game


def test_a_run_whose_tools_come_from_an_environment_logs_the_doctors_tool_codes():
    from grpo.run.doctor.thresholds import TOOL_CODES, DoctorThresholds
    from grpo.run.doctor.verdict import Doctor

    doctor = Doctor(DoctorThresholds(), config={"rollout": {"environment_factory": "m:GuessingGame"}})
    assert all(f"doctor/{c}" in doctor.metrics() for c in TOOL_CODES)
