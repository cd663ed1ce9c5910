"""A fake OpenAI-compatible provider that enforces rate limits per API key, with its own log.

The ground truth of the rate-limit tests: whatever cuaderno believes about its turns,
this process's log says how many requests each key sent, when, and how many were refused with
429. It is a real HTTP server on loopback (``http.server``), so a test goes through the official
``openai`` SDK's whole request path.

The limits are token buckets per API key, as OpenAI describes its own (a budget of N per minute
refills continuously; ``x-ratelimit-reset-*`` is the time until it is whole again):

- requests: ``--rpm N``, a bucket of N requests refilled at N/60 a second (``--window W``: N
  refilled every W seconds instead of 60, for tests that need a 429 to end in a second);
- tokens: ``--tpm T``, a bucket of T tokens. A request is charged at arrival its prompt (the
  characters of its messages and tools as JSON / 4, rounded up) plus its output bound (``max_tokens`` or
  ``max_completion_tokens``, else ``--default-max-tokens``); once answered, the unused part of
  the output bound is given back, so a request costs what its ``usage`` reports.

A request over either budget is answered 429 with ``Retry-After`` (whole seconds, rounded up),
``retry-after-ms``, ``x-ratelimit-limit-*``, ``x-ratelimit-remaining-*`` and
``x-ratelimit-reset-*`` (``1.5s``, ``20ms``), and an OpenAI error body (``rate_limit_exceeded``).
A request within budget is answered 200 after ``--latency`` seconds with a text answer
(``--answer``), ``usage`` (prompt tokens as charged, ``--completion-tokens`` of output), and the
same ``x-ratelimit-*`` headers.

The log (``--log PATH``, JSON lines, written before the reply leaves): one line per request with
``t`` (seconds since the server started, its monotonic clock), ``key`` (a hash of the API key,
never the key), ``status`` (200 or 429), ``idempotency_key``, ``prompt_tokens``, ``charged``
(tokens at arrival) and ``completion_tokens``.

Run it as ``python -m cuaderno.testing.rate_limited_provider --log PATH --port 0 --rpm 60``; it
prints ``PROVIDER READY port=<port> pid=<pid>`` when it serves. :class:`ProviderProcess` starts
and stops one for tests; :func:`read_log` reads its log.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, NotRequired, TypedDict

__all__ = ["Limits", "ProviderProcess", "main", "read_log", "summary"]


@dataclass
class _Bucket:
    capacity: float
    per_second: float
    level: float
    at: float

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.at) * self.per_second)
        self.at = now

    def reset_in(self) -> float:
        """Seconds until the bucket is whole again (OpenAI's ``x-ratelimit-reset-*``)."""
        return (self.capacity - self.level) / self.per_second

    def wait_for(self, amount: float) -> float:
        return max(amount - self.level, 0.0) / self.per_second


@dataclass
class Limits:
    """The provider's limits and its buckets per key."""

    rpm: float | None = None
    tpm: float | None = None
    default_max_tokens: int = 16
    completion_tokens: int = 5
    answer: str = "done"
    latency: float = 0.0
    window: float = 60.0
    start: float = field(default_factory=time.monotonic)
    _requests: dict[str, _Bucket] = field(default_factory=dict[str, _Bucket])
    _tokens: dict[str, _Bucket] = field(default_factory=dict[str, _Bucket])
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _bucket(self, table: dict[str, _Bucket], key: str, per_minute: float, now: float) -> _Bucket:
        found = table.get(key)
        if found is None:
            found = table[key] = _Bucket(per_minute, per_minute / self.window, per_minute, now)
        found.refill(now)
        return found

    def admit(self, key: str, charge: int) -> tuple[bool, dict[str, str], float]:
        """Take one request of ``charge`` tokens from ``key``'s budgets: whether it was admitted,
        the ``x-ratelimit-*`` headers, and (when refused) the seconds until it would be."""
        with self._lock:
            now = time.monotonic()
            req = self._bucket(self._requests, key, self.rpm, now) if self.rpm else None
            tok = self._bucket(self._tokens, key, self.tpm, now) if self.tpm else None
            wait = max(req.wait_for(1) if req else 0.0, tok.wait_for(charge) if tok else 0.0)
            if wait <= 0:
                if req:
                    req.level -= 1
                if tok:
                    tok.level -= charge
            return wait <= 0, _headers(req, tok), wait

    def give_back(self, key: str, tokens: int) -> None:
        with self._lock:
            tok = self._tokens.get(key)
            if tok is not None and tokens > 0:
                tok.refill(time.monotonic())
                tok.level = min(tok.capacity, tok.level + tokens)


def _duration(seconds: float) -> str:
    return f"{max(seconds, 0.0) * 1000:.0f}ms" if seconds < 1 else f"{seconds:.3f}s"


def _headers(req: _Bucket | None, tok: _Bucket | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, bucket in (("requests", req), ("tokens", tok)):
        if bucket is not None:
            out[f"x-ratelimit-limit-{name}"] = str(int(bucket.capacity))
            out[f"x-ratelimit-remaining-{name}"] = str(max(int(math.floor(bucket.level)), 0))
            out[f"x-ratelimit-reset-{name}"] = _duration(bucket.reset_in())
    return out


def prompt_tokens(body: Mapping[str, Any]) -> int:
    """The prompt as the provider counts it: the characters of its messages and tools, as JSON,
    / 4, rounded up (a tokenizer reads the tool schemas too)."""
    chars = len(json.dumps(body.get("messages") or [], separators=(",", ":")))
    if body.get("tools"):
        chars += len(json.dumps(body["tools"], separators=(",", ":")))
    return math.ceil(chars / 4)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, limits: Limits, log: Path) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.limits = limits
        self.log = log.open("a", encoding="utf-8")
        self.log_lock = threading.Lock()

    def record(self, line: Mapping[str, object]) -> None:
        with self.log_lock:
            self.log.write(json.dumps(line, sort_keys=True) + "\n")
            self.log.flush()  # in the OS before the reply leaves: a killed client cannot lose it


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length)
        if not self.path.endswith("/chat/completions"):
            self._send(404, {"error": {"message": "not found", "type": "invalid_request_error"}}, {})
            return
        try:
            body = json.loads(raw)
        except ValueError:
            self._send(400, {"error": {"message": "body is not JSON", "type": "invalid_request_error"}}, {})
            return
        limits = self.server.limits
        api_key = (self.headers.get("authorization") or "").removeprefix("Bearer ").strip()
        key = hashlib.sha256(api_key.encode()).hexdigest()[:12]
        prompt = prompt_tokens(body)
        out_bound = body.get("max_completion_tokens") or body.get("max_tokens") or limits.default_max_tokens
        charge = prompt + int(out_bound)
        admitted, headers, wait = limits.admit(key, charge)
        line = {"t": round(time.monotonic() - limits.start, 6), "key": key,
                "idempotency_key": self.headers.get("idempotency-key"), "prompt_tokens": prompt, "charged": charge}
        if not admitted:
            self.server.record({**line, "status": 429, "completion_tokens": 0, "retry_after_s": round(wait, 6)})
            headers.update({"retry-after": str(max(math.ceil(wait), 1)), "retry-after-ms": str(math.ceil(wait * 1000))})
            self._send(429, {"error": {"message": f"Rate limit reached; try again in {wait:.3f}s",
                                       "type": "requests", "code": "rate_limit_exceeded"}}, headers)
            return
        if limits.latency:
            time.sleep(limits.latency)
        completion = min(limits.completion_tokens, int(out_bound))
        limits.give_back(key, int(out_bound) - completion)
        self.server.record({**line, "status": 200, "completion_tokens": completion})
        answer = {"id": f"chatcmpl-{os.urandom(6).hex()}", "object": "chat.completion", "model": body.get("model"),
                  "created": int(time.time()),
                  "choices": [{"index": 0, "finish_reason": "stop",
                               "message": {"role": "assistant", "content": limits.answer}}],
                  "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                            "total_tokens": prompt + completion}}
        self._send(200, answer, headers)

    def _send(self, status: int, body: Mapping[str, object], headers: Mapping[str, str]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cuaderno.testing.rate_limited_provider")
    p.add_argument("--log", required=True)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--rpm", type=float, default=None)
    p.add_argument("--tpm", type=float, default=None)
    p.add_argument("--latency", type=float, default=0.0)
    p.add_argument("--window", type=float, default=60.0)
    p.add_argument("--default-max-tokens", type=int, default=16)
    p.add_argument("--completion-tokens", type=int, default=5)
    p.add_argument("--answer", default="done")
    a = p.parse_args(argv)
    limits = Limits(rpm=a.rpm, tpm=a.tpm, default_max_tokens=a.default_max_tokens,
                    completion_tokens=a.completion_tokens, answer=a.answer, latency=a.latency,
                    window=a.window)
    with _Server(a.port, limits, Path(a.log)) as server:
        print(f"PROVIDER READY port={server.server_address[1]} pid={os.getpid()}", flush=True)
        server.serve_forever()
    return 0


class LogLine(TypedDict):
    """One request the provider answered, as its log holds it (seconds since it started)."""

    t: float
    key: str
    """The first 12 hex digits of the sha256 of the request's API key: whose limit it counted against."""
    idempotency_key: str | None
    prompt_tokens: int
    charged: int
    """Tokens taken from the limit on admission (the prompt plus the answer's bound)."""
    status: int
    """200, or 429 when the limit refused it."""
    completion_tokens: int
    retry_after_s: NotRequired[float]


LogSummary = TypedDict("LogSummary", {
    "requests": int, "ok": int, "429": int, "span_s": float, "per_minute": float | None,
    "steady_per_minute": float | None, "tokens": int, "steady_tokens_per_minute": float | None})
"""What :func:`summary` counts (a functional TypedDict: ``429`` is not a name)."""


def read_log(path: str | os.PathLike[str]) -> list[LogLine]:
    """Every line of a provider's log, in order."""
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]


def summary(lines: list[LogLine]) -> LogSummary:
    """Counts and pace from a log: requests, 429s, accepted requests per minute between the first
    and the last accepted one (``per_minute``), and the same over the second half of them
    (``steady_per_minute``: a fleet's first requests arrive late, behind their process's cold
    start, and bunch up, which shortens the first span), and the tokens the accepted requests
    used."""
    ok = [line["t"] for line in lines if line["status"] == 200]
    span = (ok[-1] - ok[0]) if len(ok) > 1 else 0.0
    warm = ok[len(ok) // 2:]
    steady = (warm[-1] - warm[0]) if len(warm) > 1 else 0.0
    return {"requests": len(lines), "ok": len(ok), "429": sum(1 for line in lines if line["status"] == 429),
            "span_s": round(span, 3), "per_minute": round((len(ok) - 1) * 60.0 / span, 2) if span else None,
            "steady_per_minute": round((len(warm) - 1) * 60.0 / steady, 2) if steady else None,
            "tokens": sum(line["prompt_tokens"] + line["completion_tokens"] for line in lines
                          if line["status"] == 200),
            "steady_tokens_per_minute": round(sum(line["prompt_tokens"] + line["completion_tokens"] for line in lines
                                                  if line["status"] == 200 and line["t"] > warm[0])
                                              * 60.0 / steady, 1) if steady else None}


class ProviderProcess:
    """Starts a provider in a child process (``with ProviderProcess(log, rpm=60) as p: p.base_url``)."""

    def __init__(self, log: str | os.PathLike[str], **options: Any) -> None:
        self.log = Path(log)
        self.options = options
        self.proc: subprocess.Popen[str] | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> ProviderProcess:
        args = [sys.executable, "-m", "cuaderno.testing.rate_limited_provider", "--log", str(self.log)]
        for name, value in self.options.items():
            args += [f"--{name.replace('_', '-')}", str(value)]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("PROVIDER READY"):
            self.stop()
            raise RuntimeError(f"the provider did not start: {line!r}")
        self.port = int(line.split("port=")[1].split()[0])
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    def __enter__(self) -> ProviderProcess:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


if __name__ == "__main__":
    raise SystemExit(main())
