"""The one place that maps SDK exceptions and HTTP statuses to :class:`~cuaderno.errors.GatewayError`.

Both official SDKs (``openai`` 3.x, ``anthropic`` 2.x) are built on ``httpx2`` and wrap its
exceptions (``APIConnectionError``/``APITimeoutError`` chained ``from`` the ``httpx2`` error,
``APIStatusError`` carrying the ``httpx2.Response``). This module reads them by duck typing and by
walking the ``__cause__``/``__context__`` chain, so it imports neither SDK and serves both.

The classification, and why (cuaderno's loop is the only retry layer and reacts to the class):

==================================  ===========  =====  ==================================================
what happened                       class        sent   why
==================================  ===========  =====  ==================================================
connect refused / connect timeout,  transient    False  no byte of the request left this process; a
pool timeout, proxy refused                             re-send is provably the first send
unsupported URL scheme              permanent    False  configuration; retrying cannot help
write error / write timeout         transient    True   part of the body may have left, but a server cannot
                                                        act on a request it did not fully receive
read timeout, connection reset or   ambiguous    True   the provider had the whole request and may have
closed mid-response                                     generated (and billed) an answer we never saw
408                                 transient    True   the server says it gave up *receiving* the request
409                                 transient    True   typically "a request with this idempotency key is
                                                        still in flight": wait, re-send with the same key
429                                 transient    True   received but not accepted; ``retry_after`` honoured
429 ``insufficient_quota``          permanent    True   out of credit; waiting will not refill it
400, 413, 422                       invalid      True   the body is wrong (schema, context too long)
401, 403, 402, 404, other 4xx       permanent    True   key, permission, credit or model name: fix config
503, 529 (overloaded)               transient    True   explicitly refused for capacity, like a 429
500, 502, 504, other 5xx            ambiguous    True   the provider (or the model behind a proxy) may have
                                                        processed the request; calling it transient would
                                                        claim it did not, and invite a blind paid re-send
body larger than ``max_body_bytes`` permanent    True   a chat answer of many MB is a misconfigured endpoint
                                                        or a runaway generation; the same body would do
                                                        it again, so fail the step and keep the evidence
body is not valid JSON (truncated)  ambiguous    True   the provider answered (and may have billed) but we
                                                        cannot know what it said: same as a lost reply
valid JSON of an impossible shape   bug          True   a broken invariant: stop and keep the evidence
anything else                       bug          True   conservative: we cannot prove it did not leave
==================================  ===========  =====  ==================================================
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator, Mapping
from email.utils import parsedate_to_datetime
from typing import Any

import httpx2

from cuaderno.errors import ErrorClass, GatewayError

__all__ = [
    "ResponseTooLarge",
    "from_exception",
    "impossible_shape",
    "malformed_body",
    "retry_after_seconds",
]

_MAX_DETAIL = 300
"""Characters of a provider's error message kept in ours: enough to act on, bounded for the journal."""

# Failures that happen before a single byte of the request is written: provably not sent.
_NOT_SENT: tuple[type[BaseException], ...] = (
    httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout, httpx2.ProxyError,
)
# Failures while writing the request: part of it may have left, but it cannot have been processed.
_PARTLY_SENT: tuple[type[BaseException], ...] = (httpx2.WriteError, httpx2.WriteTimeout)


class ResponseTooLarge(Exception):
    """Raised by the body limit (see ``_limits``) when a response exceeds ``max_body_bytes``.

    Deliberately *not* an ``httpx2`` error: the OpenAI SDK then lets it through unwrapped and the
    Anthropic SDK chains it as the cause of its connection error; either way :func:`from_exception`
    finds it.
    """

    def __init__(self, limit: int, *, declared: int | None = None, read: int | None = None) -> None:
        self.limit, self.declared, self.read = limit, declared, read
        if declared is not None:
            what = f"declares {declared} bytes (Content-Length)"
        else:
            what = f"exceeded the limit after {read} bytes"
        super().__init__(f"response body {what}; max_body_bytes is {limit}; the body was not read")


def from_exception(exc: BaseException, *, provider: str) -> GatewayError:
    """Map any exception raised while calling an SDK to a :class:`GatewayError`.

    Callers raise the result ``from exc`` so the original stays attached as evidence.

    Args:
        exc: what the SDK (or the HTTP stack under it) raised.
        provider: a short name for messages (``"openai"``, ``"anthropic"``).
    """
    if isinstance(exc, GatewayError):
        return exc
    for link in _chain(exc):
        if isinstance(link, ResponseTooLarge):
            return GatewayError(f"{provider}: {link}", error_class=ErrorClass.PERMANENT, sent=True)
    status = getattr(exc, "status_code", None)
    response = getattr(exc, "response", None)
    if isinstance(status, int) and isinstance(response, httpx2.Response):
        if 200 <= status < 300:
            # The SDK's own response validation failed on a 2xx: an impossible shape.
            return impossible_shape(provider, f"the SDK rejected the response body: {exc}")
        return from_status(status, response.headers, getattr(exc, "body", None), provider=provider)
    return _from_transport(exc, provider=provider)


def from_status(status: int, headers: Mapping[str, str], body: object, *, provider: str) -> GatewayError:
    """Map an HTTP error status (4xx/5xx) to a :class:`GatewayError` (see the module table)."""
    detail = _detail(body)
    request_id = headers.get("x-request-id") or headers.get("request-id")
    message = f"{provider}: HTTP {status}{': ' + detail if detail else ''}"
    if request_id:
        message += f" (request id {request_id})"
    retry_after = retry_after_seconds(headers)
    error_class = _status_class(status, body)
    if error_class is ErrorClass.PERMANENT and status in (401, 403):
        message += "; check the API key and its permissions"
    return GatewayError(message, error_class=error_class, sent=True, retry_after=retry_after, status=status)


def _status_class(status: int, body: object) -> ErrorClass:
    if status == 429:
        return ErrorClass.PERMANENT if _code(body) == "insufficient_quota" else ErrorClass.TRANSIENT
    if status in (408, 409, 503, 529):
        return ErrorClass.TRANSIENT
    if status in (400, 413, 422):
        return ErrorClass.INVALID_INPUT
    if 400 <= status < 500:
        return ErrorClass.PERMANENT
    # 500, 502, 504 and unknown 5xx (or odd statuses): the request may have been processed.
    return ErrorClass.AMBIGUOUS


def _from_transport(exc: BaseException, *, provider: str) -> GatewayError:
    """Classify a failure that produced no HTTP status, from the ``httpx2`` error in its chain."""
    for link in _chain(exc):
        if isinstance(link, httpx2.UnsupportedProtocol):
            return GatewayError(f"{provider}: unsupported URL: {link}", error_class=ErrorClass.PERMANENT,
                                sent=False)
        if isinstance(link, _NOT_SENT):
            return GatewayError(f"{provider}: could not connect ({type(link).__name__}: {link}); nothing was sent",
                                error_class=ErrorClass.TRANSIENT, sent=False)
        if isinstance(link, _PARTLY_SENT):
            return GatewayError(f"{provider}: failed while sending the request ({type(link).__name__}: {link})",
                                error_class=ErrorClass.TRANSIENT, sent=True)
        if isinstance(link, httpx2.TimeoutException):
            return GatewayError(f"{provider}: timed out waiting for the response after sending "
                                f"({type(link).__name__}); the provider may have answered and billed it",
                                error_class=ErrorClass.AMBIGUOUS, sent=True)
        if isinstance(link, (httpx2.TransportError, httpx2.DecodingError)):
            return GatewayError(f"{provider}: the connection failed after sending ({type(link).__name__}: {link}); "
                                "the provider may have processed the request", error_class=ErrorClass.AMBIGUOUS,
                                sent=True)
    if type(exc).__name__ in ("APITimeoutError", "APIConnectionError"):
        # An SDK connection error whose cause we cannot see: we cannot prove nothing left.
        return GatewayError(f"{provider}: {type(exc).__name__}: {exc}", error_class=ErrorClass.AMBIGUOUS, sent=True)
    return GatewayError(f"{provider}: unexpected {type(exc).__name__}: {exc}", error_class=ErrorClass.BUG, sent=True)


def malformed_body(provider: str, detail: str) -> GatewayError:
    """A 2xx whose body is not valid JSON (truncated, HTML from a proxy...): ambiguous, sent."""
    return GatewayError(f"{provider}: the response body is not valid JSON ({detail}); the provider may have "
                        "answered and billed a response nobody can read", error_class=ErrorClass.AMBIGUOUS, sent=True)


def impossible_shape(provider: str, detail: str) -> GatewayError:
    """A 2xx whose JSON cannot be a response of this API: a bug, sent."""
    return GatewayError(f"{provider}: impossible response shape: {detail}", error_class=ErrorClass.BUG, sent=True)


def retry_after_seconds(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Seconds the provider asked us to wait, or ``None`` when it did not say (or said nonsense).

    ``retry-after-ms`` (OpenAI, Anthropic) wins over ``retry-after``, which may be seconds or an
    HTTP date. Negative waits become 0.
    """
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        ms = _finite(raw_ms)
        if ms is not None:
            return max(ms / 1000.0, 0.0)
    raw = headers.get("retry-after")
    if raw is None:
        return None
    seconds = _finite(raw)
    if seconds is not None:
        return max(seconds, 0.0)
    try:
        when = parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError):
        return None
    return max(when.timestamp() - (time.time() if now is None else now), 0.0)


def _finite(text: str) -> float | None:
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` then its causes/contexts, each once (chains can loop)."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        yield link
        link = link.__cause__ or link.__context__


def _error_object(body: object) -> Mapping[str, Any]:
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except ValueError:
            return {}
    if isinstance(body, dict):
        inner = body.get("error")
        return inner if isinstance(inner, dict) else body
    return {}


def _code(body: object) -> str | None:
    err = _error_object(body)
    for key in ("code", "type"):
        value = err.get(key)
        if isinstance(value, str):
            return value
    return None


def _detail(body: object) -> str:
    err = _error_object(body)
    message = err.get("message")
    if isinstance(message, str):
        text = message
    elif isinstance(body, str):
        text = body
    else:
        text = ""
    text = " ".join(text.split())
    return text[:_MAX_DETAIL] + ("..." if len(text) > _MAX_DETAIL else "")
