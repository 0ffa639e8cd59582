"""The LLM judge against a real HTTP server on 127.0.0.1 (tests/judge_server.py): normal, slow, rate-limited,
failing and malformed replies; ordering and the global rate limit under 64 concurrent items; the SQLite cache;
the API key never reaching any file; and reward composition with judge terms and fallbacks."""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import sqlite3
import threading
import time

import pytest
from judge_server import JudgeServer, Reply

from grpo.config import JudgeConfig
from grpo.core.step_types import Rollout, Sample
from grpo.grading.judge import Judge, JudgeItem, RateLimiter
from grpo.grading.rubrics import JudgeReplyError, load_rubric, parse_score
from grpo.grading.scoring import RewardSpec, score_rollouts

SECRET = "sk-test-SECRET-5d1f0a9e"  # recognisable, so a leak is found by grepping bytes
KEY_ENV = "GRPO_TEST_JUDGE_KEY"
FAST = dict(timeout_s=0.3, rate_limit_per_s=1000.0)  # keep the whole file well under 30 s
BACKOFF = dict(backoff_base_s=0.01, backoff_max_s=0.05)


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)


def make_judge(*servers: JudgeServer, **overrides) -> Judge:
    """A Judge on judge.base_url = servers[0] (model "model-0") and, if given, judge.fallback_base_url = servers[1]
    ("model-1"); `overrides` are judge config fields."""
    fallback = dict(fallback_base_url=servers[1].url, fallback_model="model-1") if len(servers) > 1 else {}
    cfg = JudgeConfig(base_url=servers[0].url, model="model-0", api_key_env=KEY_ENV, **fallback,
                      **{**FAST, **overrides})
    return Judge(cfg, **BACKOFF)


def item(response: str, task: str = "fairness") -> JudgeItem:
    return JudgeItem(task=task, prompt="Context: ... Question: who?", response=response,
                     gold={"label_letter": "B", "unknown_letter": "C", "context_condition": "disambig"})


def response_of(body: dict) -> str:
    """The model response embedded in the judge prompt (between the rubric's <<< >>> markers, the 2nd block)."""
    return body["messages"][0]["content"].split("<<<\n")[2].split("\n>>>")[0]


def test_parse_score_forms_and_failures():
    assert parse_score('{"score": 8}') == 0.8
    assert parse_score('```json\n{"score": 6, "reason": "ok"}\n```') == 0.6
    assert parse_score('Here you go: {"score": 3, "reason": "x"} thanks') == 0.3
    assert parse_score('{"score": "7/10"}') == 0.7
    assert parse_score('{"score": "40%"}') == 0.4
    assert parse_score('{"score": 0.5}', scale=1.0) == 0.5
    for text, kind in [("", "empty"), ("great answer", "no_json"), ('{"grade": 3}', "no_score"),
                       ('{"score": 11}', "out_of_range"), ('{"score": true}', "bad_score"),
                       ('{"score": "high"}', "bad_score"), ('{"score": "3/2"}', "out_of_range")]:
        with pytest.raises(JudgeReplyError) as err:
            parse_score(text)
        assert err.value.kind == kind, text


def test_rubrics_have_versions_and_show_gold():
    for task in ("fairness", "hallucination", "unknown-task"):
        rubric = load_rubric(task)
        assert rubric.version.startswith("v1:") and len(rubric.version) == len("v1:") + 8
    assert load_rubric("unknown-task").name == "default"
    text = load_rubric("hallucination").render("Q?", "A.", {"right_answer": "Delhi", "knowledge": "K", "format": "x"})
    assert "- right_answer: Delhi" in text and "- knowledge: K" in text and "format" not in text.split("<<<")[2]


def test_normal_answers_in_every_format_with_calibration():
    replies = {"plain": '{"score": 8}', "fenced": '```json\n{"score": 6}\n```', "prose": 'Verdict {"score": 3} ok',
               "fraction": '{"score": "7/10"}', "percent": '{"score": "40%"}'}
    with JudgeServer(lambda body, n: Reply(content=replies[response_of(body)])) as server:
        with make_judge(server) as judge:
            results = judge.score_batch([item(name) for name in replies])
            assert [r.score for r in results] == pytest.approx([0.8, 0.6, 0.3, 0.7, 0.4])
            assert {r.provider for r in results} == {"judge:model-0"}
            assert "- label_letter: B" in server.seen[0].body["messages"][0]["content"]  # the judge sees the gold
            assert server.seen[0].headers["authorization"] == f"Bearer {SECRET}"  # the key was really used
        with make_judge(server, calibration_a=0.5, calibration_b=0.25) as judge:
            # 0.5·0.8 + 0.25 = 0.65 ; 0.5·0.4 + 0.25 = 0.45
            assert [r.score for r in judge.score_batch([item("plain"), item("percent")])] == pytest.approx([0.65, 0.45])
        with make_judge(server, calibration_a=2.0) as judge:
            assert judge.score_batch([item("plain")])[0].score == 1.0  # 1.6 clipped to 1


def test_slow_primary_times_out_retries_then_secondary_answers():
    with JudgeServer(lambda body, n: Reply(delay_s=1.0)) as slow, JudgeServer() as fast:
        with make_judge(slow, fast, max_retries=1) as judge:
            result = judge.score_batch([item("x")])[0]
            metrics = judge.metrics()
        assert (result.score, result.provider) == (0.8, "judge:model-1")
        assert slow.count == 2 and fast.count == 1  # 1 call + 1 retry on the slow one
        assert metrics["judge/retries"] == 1.0 and metrics["judge/errors/timeout"] == 2.0
        assert metrics["judge/calls"] == 3.0 and metrics["judge/share/model-1"] == 1.0


def test_429_retry_after_is_honoured():
    def reply(body, n):
        return Reply(status=429, headers={"Retry-After": "1"}) if n == 0 else Reply()

    with JudgeServer(reply) as server, make_judge(server) as judge:
        result = judge.score_batch([item("x")])[0]
        metrics = judge.metrics()
    assert result.score == 0.8
    assert server.seen[1].t - server.seen[0].t >= 1.0  # our own backoff alone would be ≤ 0.05 s
    assert metrics["judge/retries"] == 1.0 and metrics["judge/errors/http_429"] == 1.0


def test_500s_are_retried_then_give_up_as_none():
    with JudgeServer(lambda body, n: Reply(status=500, raw=b'{"error": {"message": "boom"}}') if n < 2
                     else Reply()) as server:
        with make_judge(server, max_retries=2) as judge:
            assert judge.score_batch([item("x")])[0].score == 0.8
            assert judge.metrics()["judge/retries"] == 2.0
    with JudgeServer(lambda body, n: Reply(status=503, raw=b"{}")) as server:
        with make_judge(server, max_retries=1) as judge:
            result = judge.score_batch([item("x")])[0]
            metrics = judge.metrics()
    assert result.score is None and result.provider == "failed" and "HTTP 503" in result.error
    assert server.count == 2 and metrics["judge/failures"] == 1.0 and metrics["judge/share/failed"] == 1.0


def test_malformed_replies_fail_and_log_once_per_kind(caplog):
    replies = {"html": Reply.garbage(), "nochoices": Reply.empty_choices(), "nomessage": Reply(raw=b'{"foo": 1}'),
               "prose": Reply(content="I think it is fine."), "prose2": Reply(content="Also fine.")}
    with JudgeServer(lambda body, n: replies[response_of(body)]) as server, make_judge(server, max_retries=0) as judge:
        with caplog.at_level(logging.WARNING, logger="grpo.grading.judge"):
            results = judge.score_batch([item(k) for k in replies])
        metrics = judge.metrics()
    assert [r.score for r in results] == [None] * 5
    assert server.count == 5 and metrics["judge/retries"] == 0.0 and metrics["judge/failures"] == 5.0
    assert metrics["judge/errors/bad_body"] == 1.0 and metrics["judge/errors/no_choices"] == 2.0
    assert metrics["judge/errors/no_json"] == 2.0
    warned = [r.getMessage() for r in caplog.records]
    # One line per kind (bad_body; no_choices: empty choices and no choices at all; no_json: two prose replies).
    assert len(warned) == 3
    assert sum("no JSON object" in m for m in warned) == 1 and sum("bad_body" in m for m in warned) == 1


def test_garbage_bodies_and_empty_choices_are_retried_and_counted():
    """A proxy's error page or a 200 without choices is transient: re-sent like a 5xx (it was a failure at once)."""
    replies = [Reply.garbage(), Reply.empty_choices(), Reply()]
    with JudgeServer(lambda body, n: replies[min(n, 2)]) as server, make_judge(server, max_retries=3) as judge:
        result = judge.score_batch([item("x")])[0]
        metrics = judge.metrics()
    assert (result.score, result.provider) == (0.8, "judge:model-0") and server.count == 3
    assert metrics["judge/retries"] == 2.0 and metrics["judge/failures"] == 0.0
    assert metrics["judge/errors/bad_body"] == 1.0 and metrics["judge/errors/no_choices"] == 1.0
    with JudgeServer(lambda body, n: Reply.garbage()) as server, make_judge(server, max_retries=2) as judge:
        result = judge.score_batch([item("x")])[0]
        metrics = judge.metrics()
    assert result.score is None and "not JSON" in result.error
    assert server.count == 3 and metrics["judge/retries"] == 2.0 and metrics["judge/failures"] == 1.0


def test_prose_replies_are_not_resent_but_the_fallback_is_asked():
    with JudgeServer(lambda body, n: Reply(content="no score here")) as primary, JudgeServer() as fallback:
        with make_judge(primary, fallback, max_retries=3) as judge:
            result = judge.score_batch([item("x")])[0]
            metrics = judge.metrics()
    assert (result.score, result.provider) == (0.8, "judge:model-1")
    assert primary.count == 1 and metrics["judge/retries"] == 0.0


def test_the_judge_reads_its_config_section_with_the_configs_defaults(tmp_path):
    assert Judge.from_config(JudgeConfig(), tmp_path) is None  # no base_url: rule graders only
    cfg = JudgeConfig(base_url="http://127.0.0.1:9/v1", api_key_env=KEY_ENV, fallback_base_url="http://127.0.0.1:8/v1")
    with Judge.from_config(cfg, tmp_path) as judge:
        # one home per setting: the defaults are grpo/config/__init__.py's (timeout 20 s, 8 requests/s), no second
        # record's
        assert judge._clients[0].timeout_s == JudgeConfig().timeout_s == 20.0
        assert judge._limiter._interval == pytest.approx(1 / JudgeConfig().rate_limit_per_s)
        assert [(p.name, p.base_url) for p in judge.providers] == [
            ("gpt-4o-mini", "http://127.0.0.1:9/v1"), ("gpt-4o-mini", "http://127.0.0.1:8/v1")]
    assert (tmp_path / "judge_cache.sqlite").is_file()  # judge.cache_path empty: the run folder's cache
    with pytest.raises(ValueError, match="judge.base_url"):
        Judge(JudgeConfig())


def test_64_concurrent_items_keep_order_and_respect_the_rate_limit():
    rate = 40.0  # requests per second -> starts at least 25 ms apart

    def reply(body, n):
        return Reply(content=json.dumps({"score": int(response_of(body)) % 11}), delay_s=random.uniform(0, 0.05))

    with JudgeServer(reply) as server, make_judge(server, num_workers=16, rate_limit_per_s=rate) as judge:
        released: list[float] = []  # when the limiter let each request go (client side)
        wait = judge._limiter.wait

        def timed_wait() -> None:
            wait()
            released.append(time.monotonic())

        judge._limiter.wait = timed_wait
        start = time.monotonic()
        results = judge.score_batch([item(str(i)) for i in range(64)])
    assert [r.score for r in results] == pytest.approx([(i % 11) / 10 for i in range(64)])
    assert len(server.seen) == 64 and len(released) == 64
    # Slot i is at least start + i/rate, and a request is released at or after its slot (a busy CPU only delays it),
    # so the i-th earliest release is at least start + i/rate: a bound that needs no slack. The server's arrival
    # times are not used: on a loaded CPU its threads can record queued requests in a burst (seen in CI: 10
    # arrivals in 36 ms). Without the limiter, 16 workers would release 16 requests at once.
    times = sorted(released)
    assert all(t >= start + i / rate - 1e-6 for i, t in enumerate(times))  # 1e-6: float sums of the slots


def test_rate_limiter_never_sleeps_holding_its_lock():
    limiter = RateLimiter(requests_per_s=5.0)  # 200 ms apart
    limiter.wait()
    sleeper = threading.Thread(target=limiter.wait)
    sleeper.start()
    time.sleep(0.05)  # the thread is now sleeping toward its slot
    assert limiter._lock.acquire(timeout=0.01)  # free while someone sleeps
    limiter._lock.release()
    sleeper.join()


def test_cache_hits_on_repeat_and_persists(tmp_path):
    db = tmp_path / "judge.sqlite"
    with JudgeServer() as server:
        with make_judge(server, cache_path=str(db)) as judge:
            first = judge.score_batch([item("a"), item("b")])
            again = judge.score_batch([item("a"), item("b")])
            metrics = judge.metrics()
        assert server.count == 2
        assert [r.provider for r in first] == ["judge:model-0"] * 2
        assert [r.provider for r in again] == ["cache:model-0"] * 2
        assert [r.score for r in again] == [0.8, 0.8] and metrics["judge/cache_hits"] == 2.0
        with make_judge(server, cache_path=str(db)) as judge:  # a new Judge reads the same file
            assert judge.score_batch([item("a")])[0].provider == "cache:model-0"
            assert judge.score_batch([item("a", task="hallucination")])[0].provider == "judge:model-0"  # other rubric
        assert server.count == 3


def test_failures_are_not_cached(tmp_path):
    db = tmp_path / "judge.sqlite"
    healthy = {"on": False}
    with JudgeServer(lambda body, n: Reply() if healthy["on"] else Reply(status=500, raw=b"{}")) as server:
        with make_judge(server, cache_path=str(db), max_retries=0) as judge:
            assert judge.score_batch([item("a")])[0].score is None
            assert sqlite3.connect(db).execute("SELECT COUNT(*) FROM scores").fetchone()[0] == 0
            healthy["on"] = True
            assert judge.score_batch([item("a")])[0].provider == "judge:model-0"  # asked again, not a cached failure
    assert server.count == 2


def test_api_key_never_written_anywhere(tmp_path):
    log_file = tmp_path / "run.log"
    handler = logging.FileHandler(log_file)
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)  # everything, the SDK's debug logs included
    try:
        replies = [Reply(status=429, headers={"Retry-After": "0"}), Reply(raw=b"nope"), Reply()]
        with JudgeServer(lambda body, n: replies[min(n, 2)]) as server:
            with make_judge(server, cache_path=str(tmp_path / "cache.sqlite")) as judge:
                judge.score_batch([item("a"), item("b")])
                (tmp_path / "settings.json").write_text(json.dumps(dataclasses.asdict(judge.cfg)))
                (tmp_path / "repr.txt").write_text(repr(judge) + repr(judge.metrics()))
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
        handler.close()
    assert log_file.stat().st_size > 0
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), f"API key leaked into {path.name}"


def test_missing_key_env_and_missing_sdk_are_clear(monkeypatch):
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(RuntimeError, match=f"environment variable '{KEY_ENV}' is not set"):
        Judge(JudgeConfig(base_url="http://127.0.0.1:9/v1", api_key_env=KEY_ENV))
    try:
        import anthropic  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install anthropic"):
            Judge(JudgeConfig(base_url="http://127.0.0.1:9/v1", model="claude", api_key_env="", kind="anthropic"))


def rollout(text: str, task: str, gold: dict) -> Rollout:
    sample = Sample(task=task, id=f"{task}/1", messages=({"role": "user", "content": "Q?"},), gold=gold)
    return Rollout(sample=sample, prompt_ids=(1,), completion_ids=(2,), text=text, stopped=True, truncated=False)


def test_score_rollouts_judge_terms_fallback_and_none():
    gold = {"label_letter": "C", "unknown_letter": "C", "answers": ["x", "y", "z"], "format": "answer_justification"}
    specs = {
        "fairness": RewardSpec("fairness", (("llm_judge", 2.0), ("format", 1.0)), fallback="bbq_rule"),
        "strict": RewardSpec("strict", (("llm_judge", 1.0),)),
        "rules": RewardSpec("rules", (("bbq_rule", 1.0), ("format", 0.5))),
    }
    rollouts = [rollout("Answer: C", "fairness", gold), rollout("Answer: C", "strict", gold),
                rollout("Answer: C", "rules", gold)]
    with JudgeServer() as server, make_judge(server) as judge:  # healthy judge: score 0.8
        scored, metrics = score_rollouts(rollouts, specs, judge)
    # fairness: (2·0.8 + 1·0.5) / 3 = 0.7 ; strict: 0.8 ; rules: (1·1 + 0.5·0.5) / 1.5 = 0.8333…
    assert [s.reward for s in scored] == pytest.approx([0.7, 0.8, 1.25 / 1.5])
    assert [s.provider for s in scored] == ["judge:model-0", "judge:model-0", "rule"]
    assert scored[0].parts == {"llm_judge": 0.8, "format": 0.5}
    assert metrics["scoring/fairness/failed"] == 0.0 and metrics["judge/calls"] == 2.0
    down = JudgeServer(lambda body, n: Reply(status=500, raw=b"{}"))
    with down as server, make_judge(server, max_retries=0) as judge:
        scored, metrics = score_rollouts(rollouts, specs, judge)
    # fallback bbq_rule = 1 replaces the judge: (2·1 + 1·0.5) / 3 ; strict has no fallback -> None, never 0
    assert scored[0].reward == pytest.approx(2.5 / 3) and scored[0].provider == "fallback:bbq_rule"
    assert scored[0].parts == {"llm_judge": None, "fallback:bbq_rule": 1.0, "format": 0.5}
    assert scored[1].reward is None
    assert metrics["scoring/strict/failed"] == 1.0 and metrics["scoring/fairness/fallback"] == 1.0
    with pytest.raises(ValueError, match="no Judge was given"):
        score_rollouts(rollouts[:1], specs, None)
    with pytest.raises(KeyError, match="no RewardSpec for tasks"):
        score_rollouts([rollout("x", "other", gold)], specs, None)


def test_cache_setup_waits_out_a_lock_that_sqlite_does_not_wait_for(tmp_path, monkeypatch):
    """Two ranks opening a new cache file at once: one got 'database is locked' from its first statement without
    SQLite's busy wait (seen once in CI under load); the set-up retries until BUSY_TIMEOUT_S."""
    import sqlite3

    import grpo.grading.judge as J

    failures = {"left": 3}

    class Contended(sqlite3.Connection):
        def execute(self, sql, *args):
            if failures["left"]:
                failures["left"] -= 1
                raise sqlite3.OperationalError("database is locked")
            return super().execute(sql, *args)

    real_connect = sqlite3.connect
    monkeypatch.setattr(J.sqlite3, "connect", lambda *a, **k: real_connect(*a, factory=Contended, **k))
    cache = J.JudgeCache(tmp_path / "cache.sqlite")
    cache.put("k", 0.5, "judge:m")
    assert failures["left"] == 0 and cache.get("k") == (0.5, "judge:m")
    cache.close()
    failures["left"] = 10**6  # a lock that never clears still ends in the error naming judge.cache_path
    monkeypatch.setattr(J.JudgeCache, "BUSY_TIMEOUT_S", 0.05)
    with pytest.raises(OSError, match="judge.cache_path.*locked|locked.*judge.cache_path"):
        J.JudgeCache(tmp_path / "other.sqlite")


def _fill_cache(path: str, prefix: str, n: int) -> None:
    from grpo.grading.judge import JudgeCache

    cache = JudgeCache(path)
    for i in range(n):
        cache.put(f"{prefix}{i}", i / n, "judge:m")
        assert cache.get(f"{prefix}{i}") == (i / n, "judge:m")
    cache.close()


def test_cache_is_shared_safely_by_concurrent_processes(tmp_path):
    """The ranks of a data-parallel run write one cache file at once: no 'database is locked', nothing lost."""
    import multiprocessing as mp

    from grpo.grading.judge import JudgeCache

    path = str(tmp_path / "cache.sqlite")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_fill_cache, args=(path, f"rank{r}-", 300)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    cache = JudgeCache(path)
    assert all(cache.get(f"rank{r}-{i}") == (i / 300, "judge:m") for r in range(2) for i in range(300))
    cache.close()
