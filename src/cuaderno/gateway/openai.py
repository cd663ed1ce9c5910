"""A :class:`~cuaderno.gateway.base.ModelGateway` for OpenAI chat completions and compatible servers.

Works against api.openai.com and any OpenAI-compatible ``base_url``: a LiteLLM proxy, vLLM, the
llama.cpp server, Ollama, OpenRouter. It drives the official ``openai`` SDK with
``max_retries=0`` (cuaderno's loop is the only retry layer) and reads the *raw* response: the
body bytes are hashed into ``body_sha256`` and parsed here, so fields the SDK's models do not
know (OpenRouter's ``usage.cost`` and ``native_finish_reason``, vLLM's ``reasoning_content``) are
kept, and a truncated body is classified instead of half-parsed.

Keys: ``api_key``, else ``OPENAI_API_KEY``. With neither and no ``base_url``, construction raises
:class:`~cuaderno.errors.UsageError` (calling api.openai.com without a key can only fail). With a
``base_url`` and no key, a placeholder is sent: local servers ignore it, and a hosted endpoint
answers 401, which surfaces as a ``permanent`` :class:`~cuaderno.errors.GatewayError` saying to
check the key. An unreachable endpoint is a ``transient`` error with ``sent=False``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import httpx2
import openai
from openai.types.chat import (
    ChatCompletionAssistantMessageParam,
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageParam,
)
from openai.types.shared_params import FunctionDefinition

from cuaderno.errors import UsageError
from cuaderno.gateway._common import (
    NO_KEY_PLACEHOLDER,
    Evidence,
    KeyHeaders,
    as_int,
    choose_cost,
    key_header_names,
    parse_body,
    parse_tool_call,
    sha256_hex,
)
from cuaderno.gateway._errors import impossible_shape
from cuaderno.gateway._sdk import SdkGateway
from cuaderno.gateway._stream import OnToken, OpenAIEvents, stream_call
from cuaderno.gateway.base import Message, ModelRequest, ModelResponse, ToolCall, Usage
from cuaderno.gateway.pricing import Prices
from cuaderno.gateway.rate import RateLimit

__all__ = ["DEFAULT_KEY_HEADERS", "OpenAIGateway"]

_PROVIDER = "openai"
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
DEFAULT_TIMEOUT = httpx2.Timeout(240.0, connect=10.0)
"""The model-call activity profile (seed 002): 180-240 s, one attempt. Connecting gets 10 s."""

DEFAULT_KEY_HEADERS: tuple[str, ...] = ("Idempotency-Key", "X-Idempotency-Key")
"""Both carry the key by default. ``Idempotency-Key`` is the conventional name; proxies that forward
only ``x-`` headers to the backend (LiteLLM with ``forward_client_headers_to_llm_api``) drop it and
pass ``X-Idempotency-Key`` on, so the backend's logs can still be matched with the journal."""


class OpenAIGateway(SdkGateway):
    """Chat completions through the official SDK, one HTTP request per :meth:`complete`.

    Args:
        model: the default model (used when ``ModelRequest.model`` is ``None``).
        base_url: an OpenAI-compatible endpoint (``http://127.0.0.1:8080/v1``...); ``None`` is OpenAI.
        api_key: the key; ``None`` reads ``OPENAI_API_KEY`` (see the module docstring when absent).
        client: a ready ``openai.AsyncOpenAI``; it is copied with ``max_retries=0`` and the body
            limit is installed on its HTTP client. Excludes ``base_url``/``api_key``/``http_client``.
        http_client: an ``httpx2.AsyncClient`` to send through (proxies, TLS, tests' mock transport).
        idempotency_header: the header, or headers, carrying the idempotency key (each gets it);
            ``None`` sends none. By default both ``Idempotency-Key`` and ``X-Idempotency-Key``
            (see :data:`DEFAULT_KEY_HEADERS` and the README's table of which reaches which backend).
        prices: prices for endpoints that do not report a cost (a :class:`PriceTable`, or any
            :class:`~cuaderno.gateway.pricing.Prices`). ``None``: the maintained ``genai-prices``
            table for this ``base_url`` when the ``[prices]`` extra is installed, which leaves
            unknown models and local endpoints unpriced; ``PriceTable()`` turns defaults off.
        max_body_bytes: larger responses are refused unread (``permanent``, ``sent=True``).
        timeout: seconds, or an ``httpx2.Timeout``.
        max_tokens_field: ``"max_completion_tokens"`` or ``"max_tokens"``; by default the former
            for api.openai.com and the latter for other servers (older vLLM/llama.cpp only know it).
        zero_cost_is_unpriced: do not believe a *reported* cost of 0 for a call that used tokens.
        rate_limit: the provider's requests and tokens per minute for this key, shared by every
            worker on the journal (:class:`~cuaderno.RateLimit`, :mod:`cuaderno.flow.ratelimit`):
            a request waits for its turn before its intent is written; ``None``: no limit kept.
    """

    provider_name = _PROVIDER
    """``gen_ai.provider.name`` for telemetry."""
    _client: openai.AsyncOpenAI
    _default_http_client = openai.DefaultAsyncHttpxClient

    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None,
                 client: openai.AsyncOpenAI | None = None, http_client: httpx2.AsyncClient | None = None,
                 idempotency_header: KeyHeaders = DEFAULT_KEY_HEADERS, prices: Prices | None = None,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, timeout: float | httpx2.Timeout = DEFAULT_TIMEOUT,
                 max_tokens_field: str | None = None, zero_cost_is_unpriced: bool = True,
                 rate_limit: RateLimit | None = None) -> None:
        if not model:
            raise UsageError("OpenAIGateway needs a default model")
        super().__init__(model, client=client, base_url=base_url, api_key=api_key, http_client=http_client,
                         idempotency_header=key_header_names(idempotency_header),  # a bad name fails here, not per call
                         prices=prices, max_body_bytes=max_body_bytes, timeout=timeout,
                         zero_cost_is_unpriced=zero_cost_is_unpriced, rate_limit=rate_limit)
        self.max_tokens_field = max_tokens_field or _default_max_tokens_field(self._client.base_url)

    def _new_client(self, base_url: str | None, api_key: str | None, http_client: httpx2.AsyncClient,
                    timeout: float | httpx2.Timeout) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(api_key=_resolve_key(api_key, base_url), base_url=base_url, http_client=http_client,
                                  max_retries=0, timeout=timeout)

    async def _create(self, kwargs: dict[str, Any], headers: dict[str, str]) -> Any:
        return await self._client.chat.completions.with_raw_response.create(**kwargs, extra_headers=headers, timeout=self._timeout)

    async def complete_streaming(self, request: ModelRequest, *, idempotency_key: str,
                                 on_token: OnToken) -> ModelResponse:
        """:meth:`complete`, streamed: ``stream=True`` with ``stream_options.include_usage`` (so the
        last chunk carries the usage the cost is computed from), each text delta handed to
        ``on_token`` as it arrives. Returns the same :class:`ModelResponse` a non-streamed call
        would (``body_sha256`` hashes the event stream). A stream that stops before ``[DONE]``
        is :class:`~cuaderno.errors.StreamInterrupted` (see :mod:`cuaderno.gateway._stream`)."""
        kwargs = {**self._request_kwargs(request), "stream": True, "stream_options": {"include_usage": True}}

        def open_stream(headers: dict[str, str]) -> Any:
            return self._client.chat.completions.with_streaming_response.create(
                **kwargs, extra_headers=headers, timeout=self._timeout)

        return await stream_call(self, request, idempotency_key, on_token, open_stream, OpenAIEvents())

    def _request_kwargs(self, request: ModelRequest) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"model": request.model or self.model, "messages": to_openai_messages(request)}
        if request.tools:
            kwargs["tools"] = [_tool_schema(t) for t in request.tools]
            # Sent explicitly: OpenAI defaults to "auto", but some compatible servers (llama.cpp)
            # read a missing tool_choice as "none" and ignore the tools.
            kwargs["tool_choice"] = "auto"
        if request.require_tool:
            if not request.tools:
                raise UsageError("require_tool=True needs at least one tool")
            # With one tool, naming it is the same obligation and the form every compatible
            # server implements; llama.cpp's "required" fails with a 500.
            only = request.tools[0]["name"] if len(request.tools) == 1 else None
            kwargs["tool_choice"] = {"type": "function", "function": {"name": only}} if only else "required"
        if request.max_output_tokens is not None:
            kwargs[self.max_tokens_field] = request.max_output_tokens
        if request.temperature is not None:
            kwargs["temperature"] = request.temperature
        return kwargs

    def _parse(self, raw: bytes, headers: Mapping[str, str], request: ModelRequest) -> ModelResponse:
        data = parse_body(raw, _PROVIDER)
        usage, body_cost = _usage(data.get("usage"))
        model = named if isinstance(named := data.get("model"), str) else None
        cost = choose_cost(headers=headers, body_cost=body_cost, usage=usage, prices=self.prices,
                           models=(model, request.model or self.model),
                           zero_cost_is_unpriced=self.zero_cost_is_unpriced, api_url=str(self._client.base_url))
        request_id = headers.get("x-request-id") or _str(data.get("id"))
        common: Evidence = {"usage": usage, "model": model, "cost": cost, "provider_request_id": request_id,
                            "response_id": _str(data.get("id")), "body_sha256": sha256_hex(raw)}
        choices = data.get("choices")
        if not choices and data.get("error") is not None:
            # A 200 that carries an error object and no answer (seen behind proxies/routers): an
            # empty generation, which the empty-response detector rejects with reason "error".
            return ModelResponse(finish_reason="error", **common)
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise impossible_shape(_PROVIDER, "no choices in a 2xx chat completion")
        choice = choices[0]
        message = choice.get("message") or {}
        if not isinstance(message, dict):
            raise impossible_shape(_PROVIDER, f"choices[0].message is a {type(message).__name__}")
        return ModelResponse(text=_text(message.get("content")), tool_calls=_tool_calls(message.get("tool_calls")),
                             finish_reason=_finish_reason(choice), reasoning=_reasoning(message),
                             refusal=_str(message.get("refusal")), **common)


def to_openai_messages(request: ModelRequest) -> list[ChatCompletionMessageParam]:
    """The neutral conversation in chat-completions form, system prompt first."""
    out: list[ChatCompletionMessageParam] = []
    if request.instructions:
        out.append({"role": "system", "content": request.instructions})
    for message in request.messages:
        out.append(_to_openai_message(message))
    return out


def _to_openai_message(message: Message) -> ChatCompletionMessageParam:
    role = message.get("role")
    if role == "user":
        return {"role": "user", "content": _content_text(message.get("content"))}
    if role == "tool":
        # Chat completions has no is_error flag: the tool result's content must say it failed.
        return {"role": "tool", "tool_call_id": message["tool_call_id"],
                "content": _content_text(message.get("content"))}
    if role == "assistant":
        calls = message.get("tool_calls") or []
        # "" rather than null: some compatible servers reject a null content beside tool calls.
        out: ChatCompletionAssistantMessageParam = {"role": "assistant",
                                                    "content": _content_text(message.get("content"))}
        if calls:
            out["tool_calls"] = [{"id": c["id"], "type": "function",
                                  "function": {"name": c["name"], "arguments": _arguments_text(c)}} for c in calls]
        return out
    raise UsageError(f"unknown message role {role!r}; expected user, assistant or tool")


def _arguments_text(call: Mapping[str, Any]) -> str:
    # Echo what the model wrote when it failed to parse, so its next turn sees its own mistake.
    raw = call.get("raw_arguments")
    if isinstance(raw, str):
        return raw
    return json.dumps(call.get("arguments") or {}, ensure_ascii=False)


def _content_text(content: object) -> str:
    if content is None:
        return ""
    return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)


def _tool_schema(tool: Mapping[str, Any]) -> ChatCompletionFunctionToolParam:
    function: FunctionDefinition = {"name": tool["name"],
                                "parameters": tool.get("parameters") or {"type": "object", "properties": {}}}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _usage(raw: object) -> tuple[Usage, object]:
    """The neutral usage and the body's own cost (OpenRouter puts it in ``usage.cost``)."""
    if not isinstance(raw, dict):
        return Usage(), None
    prompt_details = raw.get("prompt_tokens_details") or {}
    completion_details = raw.get("completion_tokens_details") or {}
    cached = prompt_details.get("cached_tokens") if isinstance(prompt_details, dict) else None
    reasoning = completion_details.get("reasoning_tokens") if isinstance(completion_details, dict) else None
    usage = Usage(input_tokens=as_int(raw.get("prompt_tokens")), output_tokens=as_int(raw.get("completion_tokens")),
                  cached_tokens=as_int(cached), reasoning_tokens=as_int(reasoning))
    return usage, raw.get("cost")


def _tool_calls(raw: object) -> tuple[ToolCall, ...]:
    if not isinstance(raw, list):
        return ()
    calls: list[ToolCall] = []
    for index, item in enumerate(raw):
        if not isinstance(item, dict):
            raise impossible_shape(_PROVIDER, f"tool_calls[{index}] is a {type(item).__name__}")
        function = item.get("function")
        if not isinstance(function, dict):
            function = {}
        # Some local servers omit ids; a positional one is deterministic and journaled with the answer.
        call_id = _str(item.get("id")) or f"call_{index}"
        calls.append(parse_tool_call(call_id, _str(function.get("name")) or "", function.get("arguments")))
    return tuple(calls)


def _finish_reason(choice: Mapping[str, Any]) -> str | None:
    """The most native finish reason available.

    OpenRouter's ``native_finish_reason`` is the upstream model's own (``MALFORMED_FUNCTION_CALL``,
    ``SAFETY``...), which its normalized ``finish_reason`` may collapse; a per-choice ``error``
    object means the generation broke, whatever the reason field says.
    """
    if choice.get("error"):
        return "error"
    return _str(choice.get("native_finish_reason")) or _str(choice.get("finish_reason"))


def _reasoning(message: Mapping[str, Any]) -> str | None:
    # vLLM/DeepSeek/llama.cpp use reasoning_content; OpenRouter and newer vLLM use reasoning.
    return _str(message.get("reasoning_content")) or _str(message.get("reasoning"))


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        # Some proxies return content parts; keep the text ones in order.
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _resolve_key(api_key: str | None, base_url: str | None) -> str:
    key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
    if key:
        return key
    if base_url is None and not os.environ.get("OPENAI_BASE_URL"):
        raise UsageError("no OpenAI API key: pass api_key= or set OPENAI_API_KEY "
                         "(for a local OpenAI-compatible server, pass its base_url=; no key is needed)")
    return NO_KEY_PLACEHOLDER


def _default_max_tokens_field(base_url: httpx2.URL) -> str:
    return "max_completion_tokens" if base_url.host.endswith("openai.com") else "max_tokens"
