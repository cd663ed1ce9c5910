"""Helpers shared by the provider gateways: body parsing, tool arguments, cost, HTTP client set-up."""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn, Protocol, TypedDict, TypeVar

import httpx2

from cuaderno.errors import GatewayError, UsageError
from cuaderno.gateway import _errors
from cuaderno.gateway._limits import install_body_limit
from cuaderno.gateway.base import ToolCall, Usage
from cuaderno.gateway.pricing import Prices, default_prices
from cuaderno.plainjson import not_plain, shown

__all__ = [
    "LITELLM_COST_HEADER",
    "Evidence",
    "adopted_client",
    "NO_KEY_PLACEHOLDER",
    "as_int",
    "capped_http_client",
    "choose_cost",
    "enforce_size",
    "KeyHeaders",
    "key_header_names",
    "key_headers",
    "parse_body",
    "parse_tool_call",
    "reraise",
    "sdk_http_client",
    "sha256_hex",
]

LITELLM_COST_HEADER = "x-litellm-response-cost"


class Evidence(TypedDict):
    """What a parsed response carries besides its answer, passed to :class:`ModelResponse` as
    keyword arguments: the accounting the projection sums, and how to find the call again."""

    usage: Usage
    model: str | None
    """The model that answered, as the body names it (``None``: the body does not say)."""
    cost: float | None
    provider_request_id: str | None
    response_id: str | None
    body_sha256: str

NO_KEY_PLACEHOLDER = "cuaderno-no-key"
"""Sent as the key to a custom ``base_url`` when none is configured: local servers (llama.cpp,
vLLM, Ollama) ignore it; a hosted endpoint answers 401, which maps to a ``permanent`` error."""


KeyHeaders = str | Sequence[str] | None
"""Which header(s) carry a call's idempotency key: one name, several (each gets the key), or none."""

_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP header name (RFC 9110 token)


def key_header_names(spec: KeyHeaders) -> tuple[str, ...]:
    """The header names of ``spec``, checked.

    Raises:
        UsageError: a name that is empty or not an HTTP header name, or a repeated one.
    """
    if spec is None or spec == "":  # "" has always meant "send none"
        return ()
    names = (spec,) if isinstance(spec, str) else tuple(spec)
    for name in names:
        if not isinstance(name, str) or not _TOKEN.fullmatch(name):
            raise UsageError(f"idempotency_header: {name!r} is not an HTTP header name")
    if len({n.lower() for n in names}) != len(names):
        raise UsageError(f"idempotency_header names a header twice: {names!r}")
    return names


def key_headers(spec: KeyHeaders, key: str) -> dict[str, str]:
    """The headers that carry ``key``: each name of ``spec`` gets it."""
    return dict.fromkeys(key_header_names(spec), key)


def sha256_hex(raw: bytes) -> str:
    """The hex sha256 of the raw body, journaled as ``body_sha256`` (evidence, not for replay)."""
    return hashlib.sha256(raw).hexdigest()


def parse_body(raw: bytes, provider: str) -> dict[str, object]:
    """Decode a 2xx body as a JSON object.

    Raises:
        GatewayError: ``ambiguous`` when it is not JSON, ``bug`` when it is JSON but not an object.
    """
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _errors.malformed_body(provider, f"{type(exc).__name__}: {exc}; {len(raw)} bytes") from exc
    if not isinstance(data, dict):
        raise _errors.impossible_shape(provider, f"expected a JSON object, got {type(data).__name__}")
    return data


def parse_tool_call(call_id: str, name: str, arguments: object) -> ToolCall:
    """Build a :class:`ToolCall`, never raising on bad arguments.

    ``arguments`` is the JSON text a model wrote (OpenAI) or an already-decoded value (Anthropic,
    some proxies). An empty string means "no arguments" (llama.cpp and others send it for
    parameterless tools). Anything that is not a JSON object is kept verbatim in ``raw_arguments``
    with the reason in ``arguments_error``: the loop must refuse to run it, and replay needs the
    raw text to show what the model actually wrote.
    """
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return ToolCall(id=call_id, name=name, arguments={})
    parsed = arguments
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments, parse_constant=_no_constant)
        except (ValueError, RecursionError) as exc:
            return ToolCall(id=call_id, name=name, arguments_error=f"arguments are not valid JSON: {exc}",
                            raw_arguments=arguments)
    if not isinstance(parsed, dict):
        problem = f"must be a JSON object, got {type(parsed).__name__}"
    else:
        unusable = not_plain(parsed)  # NaN, nesting too deep: it could not be fingerprinted or journaled
        if unusable is None:
            return ToolCall(id=call_id, name=name, arguments=parsed)
        problem = f"hold {unusable}"
    raw = arguments if isinstance(arguments, str) else shown(arguments)
    return ToolCall(id=call_id, name=name, raw_arguments=raw, arguments_error=f"arguments {problem}")


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON number")


def as_int(value: object) -> int:
    """A token count as reported; anything that is not a non-negative number reads as 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return 0
    return max(int(value), 0)


def _as_cost(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if isinstance(value, (int, float)) and math.isfinite(value) and value >= 0:
        return float(value)
    return None


def choose_cost(*, headers: Mapping[str, str], body_cost: object, usage: Usage, prices: Prices | None,
                models: tuple[str | None, ...], zero_cost_is_unpriced: bool,
                api_url: str | None = None) -> float | None:
    """The call's cost: the endpoint's own report first, then the price table, else ``None``.

    Order: the LiteLLM proxy's ``x-litellm-response-cost`` header, then a ``usage.cost`` field in
    the body (OpenRouter), then ``prices``; with no ``prices``, the maintained table's prices for
    the endpoint ``api_url`` (:func:`~cuaderno.gateway.pricing.default_prices`; ``None`` infers
    the provider from the model's name), which leaves unknown models and endpoints unpriced.
    With ``zero_cost_is_unpriced`` (the default in the gateways), a *reported* 0 for a call that used tokens is not believed: LiteLLM reports 0 for
    models it has no price for, which is exactly the "looks free" failure. An explicit 0 in your
    own price table is always believed.
    """
    used_tokens = usage.input_tokens + usage.output_tokens > 0
    for reported in (_as_cost(headers.get(LITELLM_COST_HEADER)), _as_cost(body_cost)):
        if reported is None:
            continue
        if reported == 0 and used_tokens and zero_cost_is_unpriced:
            continue
        return reported
    table = prices if prices is not None else default_prices(api_url)
    return table.cost(usage, *models) if table is not None else None


def capped_http_client(http_client: httpx2.AsyncClient | None, *, default: type[httpx2.AsyncClient],
                       timeout: float | httpx2.Timeout, max_body_bytes: int) -> httpx2.AsyncClient:
    """The ``httpx2`` client a gateway uses, with the body limit installed.

    A client passed in is used as is (its transport, proxies, TLS) and gets the limit's event
    hooks added; otherwise one is built from the SDK's default client class.
    """
    if max_body_bytes <= 0:
        raise UsageError(f"max_body_bytes must be positive, got {max_body_bytes}")
    client = http_client if http_client is not None else default(timeout=timeout)
    install_body_limit(client, max_body_bytes)
    return client


def enforce_size(body: bytes, limit: int) -> None:
    """Refuse a body already in memory that exceeds ``limit``.

    The stream cap (``_limits``) normally stops reading long before this; a transport that hands
    over pre-read bodies bypasses it, and the limit must mean the same thing either way.
    """
    if len(body) > limit:
        raise _errors.ResponseTooLarge(limit, read=len(body))


def sdk_http_client(sdk_client: object) -> httpx2.AsyncClient:
    """The ``httpx2`` client inside an SDK client, to install the body limit on it.

    Both SDKs keep it in ``_client`` (a private attribute, hence the check).

    Raises:
        UsageError: it is not there, so ``max_body_bytes`` could not be enforced.
    """
    inner = getattr(sdk_client, "_client", None)
    if not isinstance(inner, httpx2.AsyncClient):
        raise UsageError("cannot install max_body_bytes on the given SDK client (no httpx2.AsyncClient found); "
                         "pass http_client= instead of client=")
    return inner


class _SdkClient(Protocol):
    def with_options(self, *, max_retries: int) -> Any: ...


_SDK = TypeVar("_SDK", bound=_SdkClient)


def adopted_client(client: _SDK, *, base_url: str | None, api_key: str | None,
                   http_client: httpx2.AsyncClient | None, max_body_bytes: int) -> _SDK:
    """A caller's SDK client as a gateway uses it: a copy with the SDK's retries off (the caller's
    keeps its own setting; both share the HTTP client, on which the body limit is installed).

    Raises:
        UsageError: ``base_url``, ``api_key`` or ``http_client`` was given too (they would be ignored).
    """
    if base_url is not None or api_key is not None or http_client is not None:
        raise UsageError("pass either client= or base_url/api_key/http_client, not both")
    sdk: _SDK = client.with_options(max_retries=0)
    install_body_limit(sdk_http_client(sdk), max_body_bytes)
    return sdk


def reraise(exc: BaseException, provider: str) -> GatewayError:
    """The :class:`GatewayError` for an SDK failure (callers ``raise ... from exc``)."""
    return _errors.from_exception(exc, provider=provider)


async def preflight_reachable(url: Any, provider: str, timeout: float = 3.0) -> None:
    """Fail before a run writes anything when the endpoint cannot even be connected to.

    Opens (and closes) one TCP connection to the endpoint's host and port: no HTTP request, no
    cost, nothing billed. A failure is a :class:`GatewayError` (``transient``, not sent) naming
    the endpoint.
    """
    import asyncio

    from cuaderno.errors import ErrorClass, GatewayError

    host = str(url.host)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, TimeoutError) as exc:
        raise GatewayError(f"{provider} endpoint {url} is unreachable ({type(exc).__name__}: {exc}); "
                           "nothing was sent and nothing was journaled", error_class=ErrorClass.TRANSIENT,
                           sent=False) from exc
    writer.close()
    try:
        await writer.wait_closed()
    except OSError:
        pass
