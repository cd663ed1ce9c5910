"""What the two SDK gateways share: one request per call, the size cap, one error mapping.

Subclasses say how to build the request (``_request_kwargs``), how to send it through their SDK's
raw-response API (``_create``) and how to parse the body (``_parse``); sending, bounding, mapping
failures and the preflight live here once.

``sent``: a failure is "sent" only if the request reached the HTTP client's send step. An SDK
that refuses its arguments (a ``TypeError`` for an unknown parameter, a body it cannot encode)
raises before any request exists; the mapping in ``_errors`` cannot tell that from a failure after
sending (it has no status and no ``httpx2`` error in its chain), so it says ``sent=True`` to be
safe, and the journal would then record a send that never happened. A request event hook on the
SDK's ``httpx2`` client marks the attempt when ``httpx2`` is about to hand the request to its
transport; without that mark, nothing left the process.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping
from typing import Any

import httpx2

from cuaderno.errors import GatewayError
from cuaderno.gateway import rate
from cuaderno.gateway._common import (
    KeyHeaders,
    adopted_client,
    capped_http_client,
    enforce_size,
    key_headers,
    preflight_reachable,
    reraise,
    sdk_http_client,
)
from cuaderno.gateway.base import ModelRequest, ModelResponse
from cuaderno.gateway.pricing import Prices
from cuaderno.gateway.rate import RateLimit

__all__ = ["SdkGateway", "report_failure"]


class _Attempt:
    """One :meth:`SdkGateway.complete` call: did its request reach the HTTP client's send step?"""

    __slots__ = ("handed_over",)

    def __init__(self) -> None:
        self.handed_over = False


# Per call, not per gateway: one gateway serves concurrent calls, and the hook runs in the
# awaiting task's context (httpx2 calls it inline), so each call sees only its own mark.
_ATTEMPT: contextvars.ContextVar[_Attempt | None] = contextvars.ContextVar("cuaderno_sdk_attempt", default=None)


async def _mark_handed_over(request: httpx2.Request) -> None:
    attempt = _ATTEMPT.get()
    if attempt is not None:
        attempt.handed_over = True


def _watch_sends(client: httpx2.AsyncClient) -> None:
    """Add the hook to ``client`` once (idempotent; a shared client keeps one copy)."""
    hooks = client.event_hooks
    if _mark_handed_over not in hooks.get("request", []):
        client.event_hooks = {"request": [*hooks.get("request", []), _mark_handed_over],
                              "response": list(hooks.get("response", []))}


class SdkGateway:
    """Base of :class:`~cuaderno.gateway.openai.OpenAIGateway` and
    :class:`~cuaderno.gateway.anthropic.AnthropicGateway`."""

    provider_name: str = ""
    """``gen_ai.provider.name`` for telemetry, and the name errors are mapped under."""
    _client: Any
    _timeout: Any
    idempotency_header: KeyHeaders
    max_body_bytes: int
    rate_limit: RateLimit | None = None
    """The provider's limit this gateway's requests share with every worker on the journal
    (:mod:`cuaderno.flow.ratelimit`); ``None``: none is kept."""
    _default_http_client: type[httpx2.AsyncClient]
    """The SDK's own ``httpx2`` client class, built when no ``http_client`` is given."""

    def __init__(self, model: str, *, client: Any, base_url: str | None, api_key: str | None,
                 http_client: httpx2.AsyncClient | None, idempotency_header: KeyHeaders, prices: Prices | None,
                 max_body_bytes: int, timeout: float | httpx2.Timeout, zero_cost_is_unpriced: bool,
                 rate_limit: RateLimit | None) -> None:
        """The settings both gateways keep (their arguments, checked by the subclass first) and
        the SDK client: ``client`` adopted, or a new one (:meth:`_new_client`) on the HTTP client
        with the body limit installed."""
        self.model = model
        self.rate_limit = rate_limit
        self.idempotency_header = idempotency_header
        self.prices = prices
        self.zero_cost_is_unpriced = zero_cost_is_unpriced
        self.max_body_bytes = max_body_bytes
        self._timeout = timeout
        if client is not None:
            self._client = adopted_client(client, base_url=base_url, api_key=api_key, http_client=http_client,
                                          max_body_bytes=max_body_bytes)
        else:
            hc = capped_http_client(http_client, default=self._default_http_client, timeout=timeout,
                                    max_body_bytes=max_body_bytes)
            self._client = self._new_client(base_url, api_key, hc, timeout)

    def _new_client(self, base_url: str | None, api_key: str | None, http_client: httpx2.AsyncClient,
                    timeout: float | httpx2.Timeout) -> Any:
        """The SDK client of a gateway given no ``client=``: retries off, sending through ``http_client``."""
        raise NotImplementedError

    def rate_bucket(self, request: ModelRequest) -> str:
        """The shared budget a request of this gateway counts against: its endpoint and API key
        (or model), hashed."""
        limit = self.rate_limit or RateLimit(requests_per_minute=1)
        return rate.bucket_label(limit, endpoint=self.endpoint, api_key=getattr(self._client, "api_key", None),
                                 model=request.model or getattr(self, "model", None))

    @property
    def endpoint(self) -> str:
        """The base URL requests go to (telemetry names a compatible server by its host)."""
        return str(self._client.base_url)

    async def aclose(self) -> None:
        """Close the underlying HTTP client."""
        await self._client.close()

    async def preflight(self) -> None:
        """Check that the endpoint accepts connections (one TCP connect, no request), so a run on
        an unreachable endpoint fails before its first journal write."""
        await preflight_reachable(self._client.base_url, self.provider_name)

    async def complete(self, request: ModelRequest, *, idempotency_key: str) -> ModelResponse:
        """Send one request through the SDK (retries off) and parse it.

        Returns:
            The parsed response, to be journaled whole. Replay rebuilds the next context from
            ``text`` and ``tool_calls`` (in order; a call with ``arguments_error`` never runs);
            ``usage`` and ``cost`` are the accounting (``cost=None`` is unpriced, never free);
            ``finish_reason`` is native and unmapped; ``provider_request_id`` and ``body_sha256``
            are evidence only, never compared.

        Raises:
            GatewayError: every failure, classified by :mod:`cuaderno.gateway._errors`.
            UsageError: the request cannot be expressed (unknown role, ``require_tool`` without tools).
        """
        kwargs = self._request_kwargs(request)
        headers = key_headers(self.idempotency_header, idempotency_key)
        _watch_sends(sdk_http_client(self._client))
        with classified(self.provider_name):
            raw = await self._create(kwargs, headers)
            rate.report(raw.http_response.headers, status=raw.http_response.status_code)
            body = await raw.http_response.aread()
            enforce_size(body, self.max_body_bytes)
        return self._parse(body, raw.http_response.headers, request)

    async def _create(self, kwargs: dict[str, Any], headers: dict[str, str]) -> Any:
        raise NotImplementedError

    def _request_kwargs(self, request: ModelRequest) -> dict[str, Any]:
        raise NotImplementedError

    def _parse(self, raw: bytes, headers: Mapping[str, str], request: ModelRequest) -> ModelResponse:
        raise NotImplementedError


def report_failure(exc: BaseException) -> None:
    """Hand the rate signal of a refused request (a 429's ``Retry-After`` and ``x-ratelimit-*``)
    to the send that watches it: the SDKs keep the answer on their status errors."""
    response = getattr(exc, "response", None)
    if isinstance(response, httpx2.Response):
        rate.report(response.headers, status=response.status_code)


@contextlib.contextmanager
def classified(provider: str, *, passing: tuple[type[Exception], ...] = ()) -> Iterator[None]:
    """One send (a plain call or a stream), its failures raised as a classified
    :class:`GatewayError`: ``sent`` only when its request reached the HTTP client's send step
    (see the module). An exception of ``passing`` (already classified, or the caller's own) goes
    out as it is."""
    attempt = _Attempt()
    token = _ATTEMPT.set(attempt)
    try:
        yield
    except passing:
        raise
    except Exception as exc:
        report_failure(exc)
        err = reraise(exc, provider)
        raise (err if attempt.handed_over else _not_sent(err)) from exc
    finally:
        _ATTEMPT.reset(token)


def _not_sent(err: GatewayError) -> GatewayError:
    """``err`` for a failure raised before the request reached the HTTP client: provably unsent.

    Its class is kept (an SDK refusing our arguments maps to ``bug``: retrying the same arguments
    cannot help); only ``sent`` changes, and the message says so.
    """
    if not err.sent:
        return err
    return GatewayError(f"{err}; raised before any request was made: nothing was sent", error_class=err.error_class,
                        sent=False, retry_after=err.retry_after, status=err.status)
