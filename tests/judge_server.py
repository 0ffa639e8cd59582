"""A tiny fake OpenAI-compatible judge: POST /v1/chat/completions on 127.0.0.1, in a background thread.

    with JudgeServer(reply=lambda req, n: Reply(content='{"score": 8}')) as server:
        judge = Judge(JudgeConfig(base_url=server.url, model="m", api_key_env=""))
Run standalone (serves a fixed score until Ctrl-C):  python tests/judge_server.py --port 8001 --score 8
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable


@dataclass
class Reply:
    """What the server answers to one request."""

    content: str = '{"score": 8, "reason": "fixed reply"}'
    """The assistant message content (used when `raw` is None)."""
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    """Sleep before answering (to provoke client timeouts)."""
    raw: bytes | None = None
    """A raw body sent instead of a chat-completion JSON (malformed replies)."""

    @classmethod
    def garbage(cls) -> "Reply":
        """A 200 whose body is not JSON (what a proxy's error page looks like)."""
        return cls(raw=b"<html><body>502 Bad Gateway</body></html>")

    @classmethod
    def empty_choices(cls) -> "Reply":
        """A well-formed chat.completion with `"choices": []` (an overloaded or filtering server)."""
        body = chat_body("")
        body["choices"] = []
        return cls(raw=json.dumps(body).encode())


def chat_body(content: str, model: str = "fake-judge") -> dict[str, Any]:
    """A minimal but complete chat.completion object."""
    return {
        "id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


@dataclass
class Seen:
    """One request as the server received it."""

    t: float
    """time.monotonic() at arrival."""
    body: dict[str, Any]
    path: str
    headers: dict[str, str]
    """Lower-cased names. Kept in memory only (it holds the Authorization header); never written anywhere."""


class JudgeServer:
    """Starts on `port` (0 = any free port); `reply(request_json, n)` decides the answer to the n-th request."""

    def __init__(self, reply: Callable[[dict[str, Any], int], Reply] | None = None, port: int = 0) -> None:
        self.reply = reply or (lambda body, n: Reply())
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
                pass  # keep test output clean

            def do_POST(self) -> None:  # noqa: N802 - stdlib name
                body_bytes = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                try:
                    body = json.loads(body_bytes or b"{}")
                except json.JSONDecodeError:
                    body = {}
                with server._lock:
                    n = len(server.seen)
                    headers = {k.lower(): v for k, v in self.headers.items()}
                    server.seen.append(Seen(t=time.monotonic(), body=body, path=self.path, headers=headers))
                reply = server.reply(body, n)
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                payload = reply.raw if reply.raw is not None else json.dumps(chat_body(reply.content)).encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    for key, value in reply.headers.items():
                        self.send_header(key, value)
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out and left: expected in timeout tests

        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        """The base_url to give an OpenAI client."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def count(self) -> int:
        with self._lock:
            return len(self.seen)

    def start(self) -> "JudgeServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> "JudgeServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description="Fake OpenAI-compatible judge serving a fixed score.")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--score", type=float, default=8.0, help="score put in every reply, on the 0-10 scale")
    args = parser.parse_args()
    content = json.dumps({"score": args.score, "reason": "fixed score from tests/judge_server.py"})
    server = JudgeServer(reply=lambda body, n: Reply(content=content), port=args.port).start()
    print(f"fake judge at {server.url} (score {args.score}); Ctrl-C to stop", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()
