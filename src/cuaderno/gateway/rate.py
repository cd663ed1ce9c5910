"""A provider's rate limit, as a gateway declares it and as the provider's answers report it.

:class:`RateLimit` is configuration: the requests and tokens per minute one API key (or one
model) may spend. A gateway carries it (``OpenAIGateway(..., rate_limit=RateLimit(...))``); the
shared limiter (:mod:`cuaderno.flow.ratelimit`) enforces it across every process on the journal,
*before* a model step's intent is written.

:class:`RateSignal` is what one answer said about the limit: a 429's ``Retry-After`` (or
``retry-after-ms``), and on any answer the ``x-ratelimit-*`` (OpenAI and compatible servers) or
``anthropic-ratelimit-*`` headers. A gateway reports the headers of every answer it reads
(:func:`report`); the limiter collects what the answers of one send reported (:func:`watching`)
and feeds it to the shared state, so one worker's 429 pauses the others.

Nothing here is journaled: a rate limit decides *when* a request leaves, never *what* it is, so
replay needs none of it.
"""

from __future__ import annotations

import contextvars
import hashlib
import math
import re
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from cuaderno.errors import UsageError
from cuaderno.gateway._errors import retry_after_seconds

__all__ = ["RateLimit", "RateSignal", "Watch", "bucket_label", "parse_duration", "read_rate_headers", "report",
           "watching"]


@dataclass(frozen=True, kw_only=True, slots=True)
class RateLimit:
    """How much one API key (or one model) may send per minute, shared by every worker.

    A request that must wait waits for its turn before its intent is written, and a 429's
    ``Retry-After`` pauses every worker of the key.

    Args:
        requests_per_minute: requests per minute; ``None``: no request limit.
        tokens_per_minute: tokens (prompt + output) per minute; ``None``: no token limit. A
            request is counted before it leaves at an estimate (its prompt's characters / 3.6,
            plus ``max_output_tokens``, else ``output_tokens``) and set right from the usage
            its answer reports.
        per: ``"key"``: one budget per API key and endpoint (the provider's own rule); ``"model"``:
            one per model and endpoint.
        max_wait: seconds a request may wait for its turn; a longer wait is refused with
            :class:`~cuaderno.errors.RateLimitWaitTooLong` before anything is written.
        burst_seconds: how many seconds of budget may leave at once. ``0`` spaces requests evenly
            (the safest: providers enforce a minute's budget over shorter windows too).
        output_tokens: the output counted for a request that sets no ``max_output_tokens``.
        probe_timeout: after a pause the provider's answers asked for, the first request is a
            *probe*: every other request of the key waits until its answer is back; this bounds
            that wait (seconds from the probe's turn), for a probe whose process died or whose
            answer is slow. ``0``: no probe (the turns after a pause go as the limit spaces them).
    """

    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    per: Literal["key", "model"] = "key"
    max_wait: float = 60.0
    burst_seconds: float = 0.0
    output_tokens: int = 1024
    probe_timeout: float = 10.0

    def __post_init__(self) -> None:
        for name in ("requests_per_minute", "tokens_per_minute"):
            value = getattr(self, name)
            if value is not None and not _positive(value):
                raise UsageError(f"RateLimit({name}=...) must be a positive number or None, got {value!r:.40}")
        if self.requests_per_minute is None and self.tokens_per_minute is None:
            raise UsageError("RateLimit needs requests_per_minute, tokens_per_minute or both")
        if self.per not in ("key", "model"):
            raise UsageError(f"RateLimit(per=...) must be 'key' or 'model', got {self.per!r:.40}")
        if not all(_non_negative(v) for v in (self.max_wait, self.burst_seconds, self.probe_timeout)):
            raise UsageError("RateLimit max_wait, burst_seconds and probe_timeout must be finite numbers >= 0")
        if isinstance(self.output_tokens, bool) or not isinstance(self.output_tokens, int) or self.output_tokens < 0:
            raise UsageError(f"RateLimit(output_tokens=...) must be an int >= 0, got {self.output_tokens!r:.40}")


def _positive(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _non_negative(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def bucket_label(limit: RateLimit, *, endpoint: str, api_key: str | None, model: str | None) -> str:
    """The shared state's name for one budget: a hash, never the key itself (the journal's
    database is read by operators; an API key must not be in it)."""
    if limit.per == "model":
        what = f"model\0{endpoint}\0{model or ''}"
    else:
        what = f"key\0{endpoint}\0{api_key or ''}"
    return f"{limit.per}:{hashlib.sha256(what.encode()).hexdigest()[:24]}"


@dataclass(frozen=True, kw_only=True, slots=True)
class RateSignal:
    """What one answer said about the limit (every field ``None`` when it did not say)."""

    retry_after: float | None = None
    """Seconds a 429 (or 503) asked every sender of this key to wait."""
    remaining_requests: float | None = None
    reset_requests: float | None = None
    """Seconds until the request budget is whole again."""
    remaining_tokens: float | None = None
    reset_tokens: float | None = None
    """Seconds until the token budget is whole again."""
    limit_requests: float | None = None
    limit_tokens: float | None = None

    def pause(self) -> float:
        """Seconds every sender should now wait: the ``Retry-After``, or, for a budget the
        provider says is spent, the time it takes to refill one request (or one token): its
        reset (the time to refill it all) divided by its size, or the whole reset when the
        provider does not say the size (0 when nothing is spent)."""
        waits = [0.0]
        if self.retry_after is not None:
            waits.append(self.retry_after)
        for remaining, reset, size in ((self.remaining_requests, self.reset_requests, self.limit_requests),
                                       (self.remaining_tokens, self.reset_tokens, self.limit_tokens)):
            if remaining is not None and remaining <= 0 and reset is not None:
                # OpenAI's reset is the time until the budget is *whole*: waiting all of it after
                # every spent budget would halve the pace of a fleet that runs at the limit.
                waits.append(reset / size if size and size > 0 else reset)
        return max(waits)


_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)(ms|h|m|s))")


def parse_duration(text: str) -> float | None:
    """OpenAI's reset form (``1s``, ``6m0s``, ``20ms``, ``1h2m3.5s``) or plain seconds, in seconds."""
    text = text.strip()
    try:
        value = float(text)
        return value if math.isfinite(value) and value >= 0 else None
    except ValueError:
        pass
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    return sum(float(n) * scale[u] for n, u in parts)


def _number(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _until(text: str | None, now: float | None) -> float | None:
    """Anthropic's reset is an RFC 3339 time; seconds from ``now`` to it."""
    if text is None:
        return None
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00")).timestamp()
    except ValueError:
        return parse_duration(text)
    return max(when - (time.time() if now is None else now), 0.0)


def read_rate_headers(headers: Mapping[str, str], *, status: int | None = None,
                      now: float | None = None) -> RateSignal | None:
    """The rate-limit signal in one answer's headers, or ``None`` when they say nothing.

    ``Retry-After`` counts only on a 429 or 503 (the statuses that mean "slow down").
    """
    retry_after = retry_after_seconds(headers, now=now) if status in (429, 503) else None
    if "x-ratelimit-remaining-requests" in headers or "x-ratelimit-remaining-tokens" in headers:
        signal = RateSignal(retry_after=retry_after,
                            remaining_requests=_number(headers.get("x-ratelimit-remaining-requests")),
                            reset_requests=parse_duration(headers.get("x-ratelimit-reset-requests") or ""),
                            remaining_tokens=_number(headers.get("x-ratelimit-remaining-tokens")),
                            reset_tokens=parse_duration(headers.get("x-ratelimit-reset-tokens") or ""),
                            limit_requests=_number(headers.get("x-ratelimit-limit-requests")),
                            limit_tokens=_number(headers.get("x-ratelimit-limit-tokens")))
    elif "anthropic-ratelimit-requests-remaining" in headers or "anthropic-ratelimit-tokens-remaining" in headers:
        signal = RateSignal(retry_after=retry_after,
                            remaining_requests=_number(headers.get("anthropic-ratelimit-requests-remaining")),
                            reset_requests=_until(headers.get("anthropic-ratelimit-requests-reset"), now),
                            remaining_tokens=_number(headers.get("anthropic-ratelimit-tokens-remaining")),
                            reset_tokens=_until(headers.get("anthropic-ratelimit-tokens-reset"), now),
                            limit_requests=_number(headers.get("anthropic-ratelimit-requests-limit")),
                            limit_tokens=_number(headers.get("anthropic-ratelimit-tokens-limit")))
    elif retry_after is not None:
        signal = RateSignal(retry_after=retry_after)
    else:
        return None
    return signal


@dataclass(slots=True)
class Watch:
    """What the answers read during one send reported (see :func:`watching`)."""

    signals: list[RateSignal] = field(default_factory=list[RateSignal])


# Per send, not per gateway: one gateway serves concurrent sends, and the gateway reads the
# answer in the awaiting task's context, so each send collects only its own answers' signals.
_WATCH: contextvars.ContextVar[Watch | None] = contextvars.ContextVar("cuaderno_rate_watch", default=None)


@contextmanager
def watching() -> Iterator[Watch]:
    """Collect the rate signals of the answers read inside the block (by this task)."""
    watch = Watch()
    token = _WATCH.set(watch)
    try:
        yield watch
    finally:
        _WATCH.reset(token)


def report(headers: Mapping[str, str], *, status: int | None = None) -> None:
    """Called by a gateway for every answer it reads: hands the answer's rate signal, if any,
    to the send that is watching (a no-op when nobody watches: no limiter configured)."""
    watch = _WATCH.get()
    if watch is None:
        return
    signal = read_rate_headers(headers, status=status)
    if signal is not None:
        watch.signals.append(signal)
