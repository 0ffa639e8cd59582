"""LLM judge: a thread pool of rubric-graded chat calls through a provider chain, with retries, one global rate
limit, a SQLite cache and counters. A failed item returns score None (counted); it never becomes 0.

  calibrated score = clip(a·s + b, 0, 1), s = parsed judge score in [0, 1]      (linear calibration)
  backoff(k) = max(Retry-After, U[0.5, 1)·min(backoff_max_s, backoff_base_s·2^k))   (exponential, "equal jitter")
  cache key = sha256(json([model, rubric version, task, prompt, response]))
Re-sent (up to judge.max_retries, counted in judge/retries): timeouts, connection errors, HTTP 408/409/425/429/5xx,
a body that is not JSON and a reply without choices (an overloaded proxy or server). Not re-sent: a reply whose text
holds no usable score (at temperature 0 the same prompt gets the same text); the next provider is tried instead.
API keys: a provider names the environment variable holding its key (`api_key_env`); the key is read when the
client is built, handed only to the SDK client, and never stored on any object of this module, logged or cached.
Nothing happens at import: SDKs are imported when a Judge is built.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import math
import os
import random
import sqlite3
import threading
import time
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo.grading.rubrics import JudgeReplyError, Rubric, load_rubric, parse_score

if TYPE_CHECKING:  # grpo/config/__init__.py is standard-library only; the judge reads its section, it keeps no copy
    from grpo.config import JudgeConfig

log = logging.getLogger(__name__)

RETRY_AFTER_CAP_S = 60.0  # a server asking for longer than this is treated as down; we move to the next provider
LATENCY_WINDOW = 2048  # recent calls kept for p50 / p95: enough for stable quantiles, bounded memory
NO_KEY = "unused"  # what the SDK gets when api_key_env is empty (local servers that need no key)
RETRIABLE_STATUS = frozenset({408, 409, 425, 429}) | frozenset(range(500, 600))
CACHE_FILE = "judge_cache.sqlite"
"""The cache in the run folder when judge.cache_path is empty."""


@dataclass(frozen=True)
class JudgeProvider:
    """One judge endpoint; the chain tries providers in order."""

    name: str
    """Label recorded as the provider of every score it gives ("judge:<name>")."""
    model: str
    base_url: str | None = None
    """OpenAI-compatible base URL (e.g. http://127.0.0.1:8000/v1); None = the SDK default."""
    api_key_env: str = "OPENAI_API_KEY"
    """NAME of the environment variable holding the key; "" for servers that need none. Never the key itself."""
    kind: str = "openai"
    """"openai" (any OpenAI-compatible server) or "anthropic" (needs the anthropic SDK)."""


def providers_of(cfg: JudgeConfig) -> tuple[JudgeProvider, ...]:
    """The provider chain a judge config names: judge.base_url, then judge.fallback_base_url when set."""
    if not cfg.base_url:
        raise ValueError("config field `judge.base_url` = '' is invalid for a Judge: set it to an OpenAI-compatible "
                         "endpoint, e.g. http://127.0.0.1:8000/v1 (or build no Judge)")
    chain = [JudgeProvider(name=cfg.model, model=cfg.model, base_url=cfg.base_url, api_key_env=cfg.api_key_env,
                           kind=cfg.kind)]
    if cfg.fallback_base_url:
        model = cfg.fallback_model or cfg.model
        chain.append(JudgeProvider(name=model, model=model, base_url=cfg.fallback_base_url,
                                   api_key_env=cfg.api_key_env, kind=cfg.kind))
    return tuple(chain)


@dataclass(frozen=True)
class JudgeItem:
    task: str
    prompt: str
    response: str
    gold: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class JudgeResult:
    score: float | None
    """Calibrated score in [0, 1], or None when every provider failed."""
    provider: str
    """"judge:<name>", "cache:<name>" or "failed"."""
    error: str | None = None


RATE_WAIT_NOTE_S = 10.0
"""A wait for a request slot longer than this is said once (a slow judge.rate_limit_per_s shows why a step waits;
the config refuses one that would hold a step past JUDGE_RATE_MAX_STEP_S)."""


class RateLimiter:
    """Request starts at least 1/rate apart across all threads. Slots are reserved under the lock; the sleep
    happens outside it, so a waiting thread never blocks the others from reserving theirs."""

    def __init__(self, requests_per_s: float) -> None:
        self._interval = 1.0 / requests_per_s if requests_per_s > 0 else 0.0
        self._rate = requests_per_s
        self._lock = threading.Lock()
        self._next = 0.0
        self._noted = False

    def wait(self) -> None:
        if self._interval == 0.0:
            return
        with self._lock:
            now = time.monotonic()
            slot = max(now, self._next)
            self._next = slot + self._interval
            note = slot - now > RATE_WAIT_NOTE_S and not self._noted
            self._noted = self._noted or note
        if note:
            log.warning("judge: waiting %.0f s for a request slot under judge.rate_limit_per_s=%g (said once)",
                        slot - now, self._rate)
        if slot > now:
            time.sleep(slot - now)


class JudgeCache:
    """SQLite cache of real judge answers (raw score in [0, 1] and the provider), safe under threads:
    one connection with check_same_thread=False, every use under a lock. Safe for concurrent PROCESSES too (the
    ranks of a data-parallel run share one file): write-ahead logging lets readers run beside a writer, and a
    writer waits up to BUSY_TIMEOUT_S for the lock instead of failing."""

    BUSY_TIMEOUT_S = 60.0

    def __init__(self, path: str | Path) -> None:
        """Opens (creating) the SQLite file at `path`; an OSError naming the path and judge.cache_path when that is
        a folder or anything else SQLite cannot use (sqlite3's own errors name no file)."""
        if Path(path).is_dir():
            raise IsADirectoryError(errno.EISDIR, "the judge cache (judge.cache_path) is a folder; name a SQLite file "
                                    f"in it, e.g. {Path(path) / CACHE_FILE}", str(path))
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(str(path), check_same_thread=False, timeout=self.BUSY_TIMEOUT_S)
            self._set_up()
        except sqlite3.Error as err:  # "unable to open database file", "file is not a database"
            raise OSError(errno.EIO, f"the judge cache (judge.cache_path) cannot be used as a SQLite file ({err}); "
                          "name another file, or leave judge.cache_path empty", str(path)) from None

    def _set_up(self) -> None:
        """WAL mode and the table. Two processes opening a new file at once can get 'database is locked' here at
        once, without SQLite's busy wait (switching the journal mode takes the lock another connection is
        upgrading): retried until BUSY_TIMEOUT_S, like every other wait for the lock."""
        deadline = time.monotonic() + self.BUSY_TIMEOUT_S
        pause = 0.01
        while True:
            try:
                with self._lock:
                    self._db.execute("PRAGMA journal_mode=WAL")
                    with self._db:
                        self._db.execute("CREATE TABLE IF NOT EXISTS scores (key TEXT PRIMARY KEY, score REAL, "
                                         "provider TEXT)")
                return
            except sqlite3.OperationalError as err:
                if "locked" not in str(err) and "busy" not in str(err) or time.monotonic() > deadline:
                    raise
                time.sleep(pause)
                pause = min(2 * pause, 0.5)

    @staticmethod
    def key(model: str, rubric_version: str, task: str, prompt: str, response: str) -> str:
        payload = json.dumps([model, rubric_version, task, prompt, response], ensure_ascii=False)
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()

    def get(self, key: str) -> tuple[float, str] | None:
        with self._lock:
            row = self._db.execute("SELECT score, provider FROM scores WHERE key = ?", (key,)).fetchone()
        return None if row is None else (float(row[0]), str(row[1]))

    def put(self, key: str, score: float, provider: str) -> None:
        with self._lock, self._db:
            self._db.execute("INSERT OR REPLACE INTO scores VALUES (?, ?, ?)", (key, score, provider))

    def close(self) -> None:
        with self._lock:
            self._db.close()


class _CallError(Exception):
    """One failed call: `kind` for counting, `retriable`, and the server's Retry-After in seconds if any."""

    def __init__(self, kind: str, message: str, retriable: bool, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.kind, self.retriable, self.retry_after = kind, retriable, retry_after


def _retry_after(err: Exception) -> float | None:
    response = getattr(err, "response", None)
    headers = getattr(response, "headers", None) or {}
    for name, factor in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is not None:
            try:
                return max(0.0, float(value) * factor)
            except ValueError:
                continue  # an HTTP-date form: fall back to our own backoff
    return None


class JudgeSetupError(RuntimeError, ValueError):
    """The judge cannot be built from its settings (no key in the named variable): the message names the setting.
    A ValueError too, so the entry points report it in one line like every other bad setting."""


class _Client:
    """A provider's SDK client; `complete` returns the reply text or raises _CallError."""

    def __init__(self, provider: JudgeProvider, timeout_s: float, temperature: float, max_tokens: int) -> None:
        self.provider = provider
        self.timeout_s, self.temperature, self.max_tokens = timeout_s, temperature, max_tokens
        key = os.environ.get(provider.api_key_env) if provider.api_key_env else NO_KEY
        if not key:
            raise JudgeSetupError(
                f"judge provider {provider.name!r}: environment variable {provider.api_key_env!r} is not set "
                "(judge.api_key_env); export it, or set judge.api_key_env='' for a server that needs no key"
            )
        if provider.kind == "anthropic":
            try:
                import anthropic as sdk  # lazy: optional dependency
            except ImportError as err:
                raise ImportError(
                    f"judge provider {provider.name!r} (judge.kind=anthropic) needs the Anthropic SDK: "
                    "pip install anthropic"
                ) from err
            self._client: Any = sdk.Anthropic(api_key=key, base_url=provider.base_url, max_retries=0)
        else:
            import openai as sdk  # lazy: keeps import of this module free of side effects

            # max_retries=0: we retry ourselves, so Retry-After, backoff and the counters are ours.
            self._client = sdk.OpenAI(api_key=key, base_url=provider.base_url, max_retries=0)
        self._sdk = sdk

    def __repr__(self) -> str:
        return f"_Client({self.provider!r})"  # never the SDK client: it holds the key

    def complete(self, text: str) -> str:
        s, sdk = self, self._sdk
        try:
            if self.provider.kind == "anthropic":
                reply = self._client.messages.create(
                    model=self.provider.model, max_tokens=s.max_tokens, temperature=s.temperature,
                    messages=[{"role": "user", "content": text}], timeout=s.timeout_s)
                return "".join(getattr(block, "text", "") for block in (reply.content or []))
            reply = self._client.chat.completions.create(
                model=self.provider.model, messages=[{"role": "user", "content": text}],
                temperature=s.temperature, max_tokens=s.max_tokens, timeout=s.timeout_s)
        except sdk.APITimeoutError as err:
            raise _CallError("timeout", f"no reply within {s.timeout_s}s", True) from err
        except sdk.APIConnectionError as err:
            raise _CallError("connection", f"connection failed: {err}", True) from err
        except sdk.APIStatusError as err:
            status = int(err.status_code)
            raise _CallError(f"http_{status}", f"HTTP {status}: {err}", status in RETRIABLE_STATUS,
                             _retry_after(err)) from err
        except ValueError as err:  # the SDK could not decode the body (not JSON): a proxy's error page, a cut body
            raise _CallError("bad_body", f"reply body is not JSON ({err})", True) from err
        choices = getattr(reply, "choices", None)
        if not choices or getattr(choices[0], "message", None) is None:
            # An overloaded or filtering server answers 200 with no choice; a re-send is usually answered.
            raise _CallError("no_choices", 'reply JSON has no "choices[0].message"', True)
        return choices[0].message.content or ""


class Judge:
    """Scores (task, prompt, response, gold) items with an LLM through the provider chain, in a thread pool.

    Reads its config section (config.JudgeConfig: endpoints, model names, key variable, timeout, retries, rate limit,
    workers, calibration, cache path) directly; what is not a config field is a keyword argument."""

    def __init__(self, cfg: JudgeConfig, run_dir: str | Path | None = None, *, rubric_dir: str | None = None,
                 score_scale: float = 10.0, backoff_base_s: float = 0.5, backoff_max_s: float = 20.0,
                 temperature: float = 0.0, max_tokens: int = 256) -> None:
        """`run_dir`: where the cache goes when judge.cache_path is empty (None: no cache then).
        `rubric_dir`: folder of <task>.txt rubrics (None = grpo/grading/rubrics). `score_scale`: the rubric's range
        0..score_scale (a bare number n in a reply means n / score_scale). Backoff: see the module docstring."""
        self.cfg = cfg
        self.rubric_dir, self.score_scale = rubric_dir, score_scale
        self.backoff_base_s, self.backoff_max_s = backoff_base_s, backoff_max_s
        self.providers = providers_of(cfg)
        self._clients = [_Client(p, cfg.timeout_s, temperature, max_tokens) for p in self.providers]
        self._limiter = RateLimiter(cfg.rate_limit_per_s)
        cache_path = cfg.cache_path or (str(Path(run_dir) / CACHE_FILE) if run_dir is not None else None)
        self._cache = JudgeCache(cache_path) if cache_path else None
        self._rubrics: dict[str, Rubric] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._latencies: deque[float] = deque(maxlen=LATENCY_WINDOW)
        self._warned: set[str] = set()

    @classmethod
    def from_config(cls, cfg: JudgeConfig, run_dir: str | Path | None, **options: Any) -> "Judge | None":
        """The run's judge: None when judge.base_url is empty (rule graders only), else a Judge (see __init__)."""
        return cls(cfg, run_dir, **options) if cfg.base_url else None

    def __repr__(self) -> str:
        return f"Judge({self.cfg!r})"  # the config names the key's variable, never the key

    def rubric(self, task: str) -> Rubric:
        with self._lock:
            if task not in self._rubrics:
                self._rubrics[task] = load_rubric(task, self.rubric_dir)
            return self._rubrics[task]

    def score_batch(self, items: list[JudgeItem]) -> list[JudgeResult]:
        """One result per item, in input order; calls run in the thread pool under the global rate limit."""
        if not items:
            return []
        for task in {i.task for i in items}:
            self.rubric(task)  # load (and validate) every rubric once, before the threads start
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.cfg.num_workers, thread_name_prefix="judge")
            pool = self._pool
        return list(pool.map(self.score_one, items))

    def score_one(self, item: JudgeItem) -> JudgeResult:
        """Cache first (any provider's model), then each provider in order; None score when all fail."""
        rubric = self.rubric(item.task)
        keys = [JudgeCache.key(c.provider.model, rubric.version, item.task, item.prompt, item.response)
                for c in self._clients]
        if self._cache is not None:
            for key in keys:
                hit = self._cache.get(key)
                if hit is not None:
                    self._count("cache_hits", "share/cache")
                    return JudgeResult(self._calibrate(hit[0]), f"cache:{hit[1]}")
        text = rubric.render(item.prompt, item.response, item.gold)
        error = "no provider tried"
        for client, key in zip(self._clients, keys, strict=True):
            try:
                raw = self._call_with_retries(client, text)
            except _CallError as err:
                error = f"{client.provider.name}: {err}"
                continue
            if self._cache is not None:
                self._cache.put(key, raw, client.provider.name)
            self._count(f"share/{client.provider.name}")
            return JudgeResult(self._calibrate(raw), f"judge:{client.provider.name}")
        self._count("failures", "share/failed")
        return JudgeResult(None, "failed", error)

    def _call_with_retries(self, client: _Client, text: str) -> float:
        max_retries = self.cfg.max_retries
        for attempt in range(max_retries + 1):
            self._limiter.wait()
            start = time.monotonic()
            try:
                reply = client.complete(text)
                return parse_score(reply, self.score_scale)
            except JudgeReplyError as err:
                # The judge answered but not usefully: with temperature 0 a re-send repeats it; next provider.
                failure = _CallError(err.kind, str(err), retriable=False)
            except _CallError as err:
                failure = err
            finally:
                with self._lock:
                    self._latencies.append(time.monotonic() - start)
                    self._counts["calls"] += 1
            self._note_error(client.provider.name, failure)
            if not failure.retriable or attempt == max_retries:
                raise failure
            if failure.retry_after is not None and failure.retry_after > RETRY_AFTER_CAP_S:
                raise failure
            self._count("retries")
            time.sleep(self._backoff(attempt, failure.retry_after))
        raise AssertionError("unreachable: the loop returns or raises")

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        delay = random.uniform(0.5, 1.0) * min(self.backoff_max_s, self.backoff_base_s * 2**attempt)
        return max(delay, retry_after or 0.0)

    def _calibrate(self, raw: float) -> float:
        return min(1.0, max(0.0, self.cfg.calibration_a * raw + self.cfg.calibration_b))

    def _count(self, *names: str) -> None:
        with self._lock:
            for name in names:
                self._counts[name] += 1

    def _note_error(self, provider: str, err: _CallError) -> None:
        """Count every error by kind; log each kind once per provider (not once per call)."""
        tag = f"{provider}/{err.kind}"
        with self._lock:
            self._counts[f"errors/{err.kind}"] += 1
            first = tag not in self._warned
            self._warned.add(tag)
        if first:
            log.warning("judge provider %r: %s (further %r errors are only counted in judge/errors/%s)",
                        provider, err, err.kind, err.kind)

    def metrics(self) -> dict[str, float]:
        """Cumulative `judge/*` counters since the Judge was built; latency quantiles over recent calls."""
        with self._lock:
            counts = dict(self._counts)
            lat = sorted(self._latencies)
        scored = sum(v for k, v in counts.items() if k.startswith("share/"))
        out = {f"judge/{k}": float(counts.get(k, 0)) for k in ("calls", "failures", "cache_hits", "retries")}
        out["judge/items"] = float(scored)
        out["judge/p50_s"] = _quantile(lat, 0.50)
        out["judge/p95_s"] = _quantile(lat, 0.95)
        for k, v in counts.items():
            if k.startswith("share/"):
                out[f"judge/{k}"] = v / scored
            elif k.startswith("errors/"):
                out[f"judge/{k}"] = float(v)
        return out

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        if self._cache is not None:
            self._cache.close()

    def __enter__(self) -> "Judge":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _quantile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank quantile x_(ceil(q·n)) (1-based); 0.0 when there is no value yet."""
    if not sorted_values:
        return 0.0
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]
