"""A :class:`~cuaderno.gateway.base.ModelGateway` for the Anthropic Messages API.

Drives the official ``anthropic`` SDK with ``max_retries=0`` and reads the raw response, like
:mod:`cuaderno.gateway.openai`. Translation:

- ``instructions`` → ``system``; tools → ``{"name", "description", "input_schema"}`` with
  ``tool_choice={"type": "auto"}`` sent explicitly (compatible servers that read a missing
  ``tool_choice`` as "no tools" answer in prose); ``require_tool`` → ``{"type": "tool", "name": ...}``
  with one tool (the form every compatible server implements), ``{"type": "any"}`` with several.
- ``temperature``: this SDK (2.x) has no sampling parameters, and the API version it speaks
  (``anthropic-version: 2026-10-21``) answers 400 to any of them, even 1.0. Compatible servers
  (LiteLLM, vLLM, llama.cpp, Ollama) still read ``temperature``, so it goes in the body through
  the SDK's ``extra_body``; see ``on_temperature`` for Anthropic's own API.
- assistant tool calls → ``tool_use`` blocks; neutral ``tool`` messages → ``tool_result`` blocks
  (with ``is_error``) inside a user turn. Consecutive user-side messages are merged into one turn,
  tool results first, as the API requires. An assistant message with neither text nor tool calls
  is dropped: the API rejects empty content, and such a turn carries nothing to the model.
- usage: Anthropic's ``input_tokens`` *excludes* cache reads and writes; the neutral
  ``input_tokens`` includes them (``input + cache_read + cache_creation``) so costs are computed
  the same way for every provider; ``cached_tokens`` is ``cache_read_input_tokens``.
- ``thinking`` blocks become ``reasoning``. Their signatures are not kept, so extended thinking
  combined with tool use (which needs them echoed back) is not supported by this gateway.

Keys: ``api_key``, else ``ANTHROPIC_API_KEY``, else ``ANTHROPIC_AUTH_TOKEN``. With none and no
``base_url``, construction raises :class:`~cuaderno.errors.UsageError`; for other credential
set-ups (profiles, workload identity) build an ``anthropic.AsyncAnthropic`` and pass ``client=``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

import anthropic
import httpx2
from anthropic.types import ContentBlockParam, MessageParam, ToolParam, ToolResultBlockParam

from cuaderno.errors import ErrorClass, GatewayError, UsageError
from cuaderno.gateway._common import (
    NO_KEY_PLACEHOLDER,
    Evidence,
    as_int,
    choose_cost,
    parse_body,
    parse_tool_call,
    sha256_hex,
)
from cuaderno.gateway._errors import impossible_shape
from cuaderno.gateway._sdk import SdkGateway
from cuaderno.gateway._stream import AnthropicEvents, OnToken, stream_call
from cuaderno.gateway.base import Message, ModelRequest, ModelResponse, ToolCall, Usage
from cuaderno.gateway.pricing import PriceTable
from cuaderno.gateway.rate import RateLimit

__all__ = ["AnthropicGateway"]

_PROVIDER = "anthropic"
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
DEFAULT_TIMEOUT = httpx2.Timeout(240.0, connect=10.0)
DEFAULT_MAX_TOKENS = 4096
"""The Messages API requires ``max_tokens``; used when the request does not set one."""

TemperatureRule = Literal["send", "drop", "refuse"]
_TEMPERATURE_RULES: tuple[TemperatureRule, ...] = ("send", "drop", "refuse")


class AnthropicGateway(SdkGateway):
    """Messages through the official SDK, one HTTP request per :meth:`complete`.

    Args:
        model: the default model (used when ``ModelRequest.model`` is ``None``).
        base_url: another endpoint (a LiteLLM proxy, a gateway); ``None`` is api.anthropic.com.
        api_key: the key; ``None`` reads the environment (see the module docstring).
        client: a ready ``anthropic.AsyncAnthropic``; copied with ``max_retries=0`` and the body
            limit installed. Excludes ``base_url``/``api_key``/``http_client``.
        http_client: an ``httpx2.AsyncClient`` to send through.
        idempotency_header: header carrying the idempotency key; ``None`` sends none.
        prices: prices (Anthropic does not report a cost; a LiteLLM cost header is used if present).
        max_body_bytes: larger responses are refused unread (``permanent``, ``sent=True``).
        timeout: seconds, or an ``httpx2.Timeout``. Always passed explicitly, which also keeps the
            SDK from refusing large non-streaming ``max_tokens``.
        default_max_tokens: ``max_tokens`` when the request has no ``max_output_tokens``.
        zero_cost_is_unpriced: do not believe a *reported* cost of 0 for a call that used tokens.
        on_temperature: what a request's ``temperature`` becomes. ``"send"``: a ``temperature``
            field in the body (through ``extra_body``: the SDK has no parameter for it). ``"drop"``:
            left out, the model samples at its default. ``"refuse"``: a ``permanent``
            :class:`~cuaderno.errors.GatewayError` with ``sent=False``, before anything is sent. ``None`` (default): ``"refuse"`` to Anthropic's own API when the
            client sends ``anthropic-version`` 2026-10-21 or later (this SDK's default), which
            answers 400 to any sampling parameter; ``"send"`` otherwise (a custom ``base_url``, or
            a ``client=`` whose ``default_headers`` pin an older version).
        rate_limit: the provider's requests and tokens per minute for this key, shared by every
            worker on the journal (:class:`~cuaderno.RateLimit`, :mod:`cuaderno.flow.ratelimit`):
            a request waits for its turn before its intent is written; ``None``: no limit kept.
    """

    provider_name = _PROVIDER
    """``gen_ai.provider.name`` for telemetry."""
    _client: anthropic.AsyncAnthropic
    _default_http_client = anthropic.DefaultAsyncHttpxClient

    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None,
                 client: anthropic.AsyncAnthropic | None = None, http_client: httpx2.AsyncClient | None = None,
                 idempotency_header: str | None = "Idempotency-Key", prices: PriceTable | None = None,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, timeout: float | httpx2.Timeout = DEFAULT_TIMEOUT,
                 default_max_tokens: int = DEFAULT_MAX_TOKENS, zero_cost_is_unpriced: bool = True,
                 on_temperature: TemperatureRule | None = None,
                 rate_limit: RateLimit | None = None) -> None:
        if not model:
            raise UsageError("AnthropicGateway needs a default model")
        if on_temperature is not None and on_temperature not in _TEMPERATURE_RULES:
            raise UsageError(f"on_temperature must be one of {', '.join(_TEMPERATURE_RULES)} or None, "
                             f"got {on_temperature!r}")
        self.default_max_tokens = default_max_tokens
        super().__init__(model, client=client, base_url=base_url, api_key=api_key, http_client=http_client,
                         idempotency_header=idempotency_header, prices=prices, max_body_bytes=max_body_bytes,
                         timeout=timeout, zero_cost_is_unpriced=zero_cost_is_unpriced, rate_limit=rate_limit)
        self.on_temperature: TemperatureRule = on_temperature or _default_temperature_rule(self._client)

    def _new_client(self, base_url: str | None, api_key: str | None, http_client: httpx2.AsyncClient,
                    timeout: float | httpx2.Timeout) -> anthropic.AsyncAnthropic:
        key, token = _resolve_credentials(api_key, base_url)
        if token is not None:
            return anthropic.AsyncAnthropic(auth_token=token, base_url=base_url, http_client=http_client,
                                            max_retries=0, timeout=timeout)
        return anthropic.AsyncAnthropic(api_key=key, base_url=base_url, http_client=http_client, max_retries=0,
                                        timeout=timeout)

    async def _create(self, kwargs: dict[str, Any], headers: dict[str, str]) -> Any:
        return await self._client.messages.with_raw_response.create(**kwargs, extra_headers=headers, timeout=self._timeout)

    async def complete_streaming(self, request: ModelRequest, *, idempotency_key: str,
                                 on_token: OnToken) -> ModelResponse:
        """:meth:`complete`, streamed (``stream=True``): each ``text_delta`` handed to ``on_token``
        as it arrives, the events folded into the message a non-streamed call returns
        (``body_sha256`` hashes the event stream). A stream that stops before ``message_stop``,
        or sends an ``error`` event, is :class:`~cuaderno.errors.StreamInterrupted`."""
        kwargs = {**self._request_kwargs(request), "stream": True}

        def open_stream(headers: dict[str, str]) -> Any:
            return self._client.messages.with_streaming_response.create(**kwargs, extra_headers=headers,
                                                                        timeout=self._timeout)

        return await stream_call(self, request, idempotency_key, on_token, open_stream, AnthropicEvents(_PROVIDER))

    def _request_kwargs(self, request: ModelRequest) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"model": request.model or self.model, "messages": to_anthropic_messages(request),
                                  "max_tokens": request.max_output_tokens or self.default_max_tokens}
        if request.instructions:
            kwargs["system"] = request.instructions
        if request.tools:
            kwargs["tools"] = [_tool_schema(t) for t in request.tools]
            # Sent explicitly, like the OpenAI gateway: the API defaults to "auto", but compatible
            # servers may not, and then answer in prose.
            kwargs["tool_choice"] = {"type": "auto"}
        if request.require_tool:
            if not request.tools:
                raise UsageError("require_tool=True needs at least one tool")
            # With one tool, naming it is the same obligation and the form compatible servers
            # implement most reliably; with several, "any" of them.
            only = request.tools[0]["name"] if len(request.tools) == 1 else None
            kwargs["tool_choice"] = {"type": "tool", "name": only} if only else {"type": "any"}
        if request.temperature is not None:
            kwargs.update(self._temperature(request.temperature))
        return kwargs

    def _temperature(self, temperature: float) -> dict[str, dict[str, float]]:
        """The ``create()`` arguments that carry ``temperature`` under :attr:`on_temperature`.

        ``messages.create()`` of this SDK takes no ``temperature`` (passing it is a ``TypeError``
        before any request); the one way to put it in the body is ``extra_body``.
        """
        if self.on_temperature == "drop":
            return {}
        if self.on_temperature == "refuse":
            # A GatewayError, not a UsageError: the loop has already journaled the call's intent,
            # and only a classified failure is journaled beside it as "not sent" (an intent with no
            # outcome reads as a send lost in a crash, possibly billed).
            version = _api_version(self._client) or "?"
            raise GatewayError(f"{_PROVIDER}: temperature={temperature} cannot be sent to {self._client.base_url}: "
                               f"API version {version} rejects sampling parameters (HTTP 400). Leave the agent's "
                               'temperature unset, or pass AnthropicGateway(on_temperature="drop") to ignore it; '
                               "nothing was sent", error_class=ErrorClass.PERMANENT, sent=False)
        return {"extra_body": {"temperature": temperature}}

    def _parse(self, raw: bytes, headers: Mapping[str, str], request: ModelRequest) -> ModelResponse:
        data = parse_body(raw, _PROVIDER)
        usage = _usage(data.get("usage"))
        model = named if isinstance(named := data.get("model"), str) else None
        cost = choose_cost(headers=headers, body_cost=None, usage=usage, prices=self.prices,
                           models=(model, request.model or self.model),
                           zero_cost_is_unpriced=self.zero_cost_is_unpriced)
        common: Evidence = {"usage": usage, "model": model, "cost": cost, "body_sha256": sha256_hex(raw),
                            "provider_request_id": headers.get("request-id") or _str(data.get("id")),
                            "response_id": _str(data.get("id"))}
        if data.get("type") == "error":
            # An error object under a 2xx: an empty generation, rejected by the detector as "error".
            return ModelResponse(finish_reason="error", **common)
        content = data.get("content")
        if not isinstance(content, list):
            raise impossible_shape(_PROVIDER, "a 2xx message without a content list")
        text, calls, reasoning = _blocks(content)
        stop = _str(data.get("stop_reason"))
        refusal = (text or "refusal") if stop == "refusal" else None
        return ModelResponse(text=text, tool_calls=calls, finish_reason=stop, reasoning=reasoning, refusal=refusal,
                             **common)


def to_anthropic_messages(request: ModelRequest) -> list[MessageParam]:
    """The neutral conversation as Messages API turns (the system prompt goes separately)."""
    turns: list[tuple[_Role, list[ContentBlockParam]]] = []
    for message in request.messages:
        role, blocks = _to_blocks(message)
        if not blocks:
            continue
        if turns and turns[-1][0] == role:
            # Merge same-role neighbours: tool results and a following user text form one user turn.
            turns[-1][1].extend(blocks)
        else:
            turns.append((role, blocks))
    return [_turn(role, blocks) for role, blocks in turns]


def _turn(role: _Role, blocks: list[ContentBlockParam]) -> MessageParam:
    if role == "user":
        return {"role": "user", "content": blocks}
    return {"role": "assistant", "content": blocks}


_Role = Literal["user", "assistant"]


def _to_blocks(message: Message) -> tuple[_Role, list[ContentBlockParam]]:
    role = message.get("role")
    content = message.get("content")
    text = content if isinstance(content, str) else ("" if content is None else str(content))
    if role == "user":
        return "user", [{"type": "text", "text": text}] if text else []
    if role == "tool":
        block: ToolResultBlockParam = {"type": "tool_result", "tool_use_id": message["tool_call_id"], "content": text}
        if message.get("is_error"):
            block["is_error"] = True
        return "user", [block]
    if role == "assistant":
        blocks: list[ContentBlockParam] = [{"type": "text", "text": text}] if text else []
        for call in message.get("tool_calls") or []:
            blocks.append({"type": "tool_use", "id": call["id"], "name": call["name"],
                           "input": call.get("arguments") or {}})
        return "assistant", blocks
    raise UsageError(f"unknown message role {role!r}; expected user, assistant or tool")


def _tool_schema(tool: Mapping[str, Any]) -> ToolParam:
    out: ToolParam = {"name": tool["name"],
                           "input_schema": tool.get("parameters") or {"type": "object", "properties": {}}}
    if tool.get("description"):
        out["description"] = tool["description"]
    return out


def _blocks(content: list[Any]) -> tuple[str, tuple[ToolCall, ...], str | None]:
    """Visible text, tool calls in order, and reasoning from the content blocks."""
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[ToolCall] = []
    for index, block in enumerate(content):
        if not isinstance(block, dict):
            raise impossible_shape(_PROVIDER, f"content[{index}] is a {type(block).__name__}")
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            thinking.append(block["thinking"])
        elif kind == "tool_use":
            call_id = _str(block.get("id")) or f"toolu_{index}"
            calls.append(parse_tool_call(call_id, _str(block.get("name")) or "", block.get("input")))
        # redacted_thinking and server-side blocks carry nothing the loop can use.
    return "".join(texts), tuple(calls), ("".join(thinking) or None)


def _usage(raw: object) -> Usage:
    if not isinstance(raw, dict):
        return Usage()
    cache_read = as_int(raw.get("cache_read_input_tokens"))
    cache_write = as_int(raw.get("cache_creation_input_tokens"))
    return Usage(input_tokens=as_int(raw.get("input_tokens")) + cache_read + cache_write,
                 output_tokens=as_int(raw.get("output_tokens")), cached_tokens=cache_read)


def _str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


_NO_SAMPLING_SINCE = "2026-10-21"
"""The first ``anthropic-version`` whose Messages API rejects ``temperature``/``top_p``/``top_k``."""


def _default_temperature_rule(client: anthropic.AsyncAnthropic) -> TemperatureRule:
    """``"refuse"`` where the request would certainly be a 400 (Anthropic's own API at a version
    without sampling parameters), else ``"send"``: compatible servers still read it."""
    host = client.base_url.host
    anthropic_host = host == "anthropic.com" or host.endswith(".anthropic.com")
    # ISO dates compare as strings; an unreadable version is treated as the SDK's (new) one.
    return "refuse" if anthropic_host and (_api_version(client) or _NO_SAMPLING_SINCE) >= _NO_SAMPLING_SINCE else "send"


def _api_version(client: anthropic.AsyncAnthropic) -> str | None:
    """The ``anthropic-version`` header the client sends (its default, or the caller's override)."""
    version = client.default_headers.get("anthropic-version")
    return version if isinstance(version, str) else None


def _resolve_credentials(api_key: str | None, base_url: str | None) -> tuple[str, str | None]:
    """``(api_key, auth_token)``: exactly one is used; the token only when it is all there is."""
    if api_key:
        return api_key, None
    env_key = os.environ.get("ANTHROPIC_API_KEY")
    if env_key:
        return env_key, None
    token = os.environ.get("ANTHROPIC_AUTH_TOKEN")
    if token:
        return NO_KEY_PLACEHOLDER, token
    if base_url is None and not os.environ.get("ANTHROPIC_BASE_URL"):
        raise UsageError("no Anthropic API key: pass api_key= or set ANTHROPIC_API_KEY "
                         "(or pass client= with your own credentials)")
    return NO_KEY_PLACEHOLDER, None
