"""Streaming for the SDK gateways: server-sent events in, tokens out, one complete response back.

A streamed call goes through the official SDK's ``with_streaming_response`` (retries off, the
same headers, the same ``httpx2`` client with its body cap), and the raw event stream is read
here: each text delta is handed to ``on_token`` as it arrives, and the events are folded into
the body the provider would have sent without streaming, which the gateway's own ``_parse``
turns into the :class:`~cuaderno.gateway.base.ModelResponse` (usage, cost, tool calls: the same
code as a non-streamed answer, so the journaled response has the same shape either way).
``body_sha256`` is the hash of the raw event stream as received.

Failures:

- before the first byte of the response, exactly as :meth:`SdkGateway.complete` (the status, the
  connection; ``sent=False`` when nothing left the process);
- after it, the answer is incomplete: the connection was cut or timed out, the stream ended
  before its end event (``[DONE]``, ``message_stop``), an event was cut in the middle, or the
  provider sent an ``error`` event. Each is :class:`~cuaderno.errors.StreamInterrupted`
  (``ambiguous``, ``sent=True``): the provider was generating and may bill it. Its message says
  how many bytes and characters of text had arrived;
- a stream that carries no usage (llama-cpp-python 0.3 ignores ``stream_options``) leaves the
  call's tokens at 0 and its cost unpriced (``None``), never $0 from a price table;
- an event that is complete but not JSON is a malformed body (``ambiguous``), like a truncated
  non-streamed body.

An exception raised by ``on_token`` (the caller's code) is not the provider's failure: it leaves
unmapped, as it was raised.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from cuaderno.errors import GatewayError, StreamInterrupted, clipped
from cuaderno.gateway import rate
from cuaderno.gateway._common import (
    LITELLM_COST_HEADER,
    enforce_size,
    key_headers,
    sdk_http_client,
    sha256_hex,
)
from cuaderno.gateway._errors import ResponseTooLarge, malformed_body
from cuaderno.gateway._sdk import SdkGateway, _watch_sends, classified
from cuaderno.gateway.base import ModelRequest, ModelResponse

__all__ = ["AnthropicEvents", "OnToken", "OpenAIEvents", "SseDecoder", "stream_call"]

OnToken = Callable[[str], None]


class SseDecoder:
    """Server-sent events from bytes as they arrive: ``(event name or None, data)`` per event.

    An event is complete at its blank line; what follows the last one is :attr:`partial` (an
    event cut in the middle when the stream ends there)."""

    def __init__(self) -> None:
        self._buffer = b""
        self._event: str | None = None
        self._data: list[str] = []

    @property
    def partial(self) -> bool:
        """Whether bytes of an unfinished event are held."""
        return bool(self._buffer.strip()) or bool(self._data)

    def feed(self, chunk: bytes) -> Iterator[tuple[str | None, str]]:
        self._buffer += chunk
        while True:
            end = self._buffer.find(b"\n")
            if end < 0:
                return
            line = self._buffer[:end].rstrip(b"\r").decode("utf-8", errors="replace")
            self._buffer = self._buffer[end + 1:]
            if not line:
                if self._data:
                    yield self._event, "\n".join(self._data)
                self._event, self._data = None, []
            elif line.startswith(":"):
                continue  # a comment (keep-alive)
            else:
                name, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if name == "data":
                    self._data.append(value)
                elif name == "event":
                    self._event = value


class Events(Protocol):
    """Folds one provider's events into its non-streamed body."""

    done: bool
    text_chars: int
    usage_known: bool

    def event(self, name: str | None, data: Any, on_token: OnToken) -> None: ...

    def body(self) -> dict[str, object]: ...


class _CallerFailed(Exception):
    """Carries an exception ``on_token`` raised past the mapping of provider failures."""

    def __init__(self, original: BaseException) -> None:
        self.original = original


async def stream_call(gateway: SdkGateway, request: ModelRequest, idempotency_key: str, on_token: OnToken,
                      open_stream: Callable[[dict[str, str]], AbstractAsyncContextManager[Any]],
                      events: Events) -> ModelResponse:
    """Send one streamed request and return the complete response (see the module docstring)."""
    headers = key_headers(gateway.idempotency_header, idempotency_key)
    _watch_sends(sdk_http_client(gateway._client))

    def hand_over(text: str) -> None:
        try:
            on_token(text)
        except BaseException as exc:  # the caller's code: raised as it is, below
            raise _CallerFailed(exc) from exc

    try:
        with classified(gateway.provider_name, passing=(_CallerFailed, StreamInterrupted)):
            async with open_stream(headers) as raw:
                http = raw.http_response
                rate.report(http.headers, status=http.status_code)
                received = bytearray()
                decoder = SseDecoder()
                try:
                    async for chunk in _chunks(http.aiter_bytes()):
                        received += chunk
                        if len(received) > gateway.max_body_bytes:
                            enforce_size(bytes(received), gateway.max_body_bytes)
                        for name, data in decoder.feed(chunk):
                            events.event(name, _json(data, gateway.provider_name), hand_over)
                except (GatewayError, _CallerFailed, ResponseTooLarge):
                    raise  # already classified (too large: permanent), or the caller's own
                except Exception as exc:
                    raise _interrupted(gateway, events, len(received), f"{type(exc).__name__}: {exc}") from exc
                if not events.done:
                    what = "an event cut in the middle" if decoder.partial else "no end event"
                    raise _interrupted(gateway, events, len(received), f"the stream ended with {what}")
                response_headers = http.headers
    except _CallerFailed as failed:
        raise failed.original from None
    body = json.dumps(events.body()).encode()
    parsed: ModelResponse = gateway._parse(body, response_headers, request)
    cost = parsed.cost
    if not events.usage_known and LITELLM_COST_HEADER not in response_headers:
        # No usage in the stream (llama-cpp-python ignores stream_options): a price table would
        # price zero tokens at $0. The call is unpriced instead, never free.
        cost = None
    return dataclasses.replace(parsed, body_sha256=sha256_hex(bytes(received)), cost=cost)


async def _chunks(source: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    async for chunk in source:
        if chunk:
            yield chunk


def _json(data: str, provider: str) -> Any:
    if data == "[DONE]":
        return data
    try:
        return json.loads(data)
    except ValueError as exc:
        raise malformed_body(provider, f"a stream event is not JSON: {exc}; {len(data)} chars") from exc


def _interrupted(gateway: SdkGateway, events: Events, received: int, why: str) -> StreamInterrupted:
    return StreamInterrupted(f"{gateway.provider_name}: the streamed answer stopped before its end ({clipped(why)}) after "
                             f"{received} bytes and {events.text_chars} characters of text; the provider may "
                             "bill the whole answer")


def _index(value: object, default: int) -> int:
    return value if type(value) is int else default


def _dict(value: object) -> Mapping[str, Any]:
    """A JSON object of the stream as it came, or an empty one: a field of another type is read
    as absent, never trusted."""
    return value if isinstance(value, dict) else {}


@dataclass(slots=True)
class _CallDeltas:
    """One tool call's deltas folded so far (by its ``index`` in the chunks)."""

    id: str | None = None
    name: str = ""
    arguments: str = ""
    """The model's text, concatenated: parsed (or kept) by the gateway, like a non-streamed body's."""


class OpenAIEvents:
    """Chat-completion chunks (``stream=True`` with ``include_usage``) folded into a completion."""

    def __init__(self) -> None:
        self.done = False
        self.text_chars = 0
        self.usage_known = False
        self._top: dict[str, str] = {}
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._refusal: list[str] = []
        self._calls: dict[int, _CallDeltas] = {}
        self._finish: str | None = None
        self._native_finish: str | None = None
        self._usage: Any = None
        self._error: Any = None

    def event(self, name: str | None, data: Any, on_token: OnToken) -> None:
        if data == "[DONE]":
            self.done = True
            return
        chunk = _dict(data)
        for field in ("id", "model"):
            if isinstance(chunk.get(field), str):
                self._top.setdefault(field, str(chunk[field]))
        if chunk.get("usage") is not None:
            self._usage = chunk["usage"]
            self.usage_known = True
        if chunk.get("error") is not None and not chunk.get("choices"):
            self._error = chunk["error"]
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices:
            return
        choice = _dict(choices[0])
        if choice.get("finish_reason"):
            self._finish = str(choice["finish_reason"])
        if choice.get("native_finish_reason"):
            self._native_finish = str(choice["native_finish_reason"])
        if choice.get("error") is not None:
            self._finish = "error"
        delta = _dict(choice.get("delta"))
        self._side(delta)
        content = delta.get("content")
        if isinstance(content, str) and content:
            self._text.append(content)
            self.text_chars += len(content)
            on_token(content)

    def _side(self, delta: Mapping[str, Any]) -> None:
        """Reasoning, refusal and tool-call deltas: folded, never shown as tokens."""
        for key in ("reasoning_content", "reasoning"):
            if isinstance(delta.get(key), str):
                self._reasoning.append(delta[key])
        if isinstance(delta.get("refusal"), str):
            self._refusal.append(delta["refusal"])
        for call in delta.get("tool_calls") or ():
            call = _dict(call)
            index = _index(call.get("index"), len(self._calls))
            into = self._calls.setdefault(index, _CallDeltas())
            if isinstance(call.get("id"), str):
                into.id = call["id"]
            function = _dict(call.get("function"))
            if isinstance(function.get("name"), str):
                into.name += function["name"]
            if isinstance(function.get("arguments"), str):
                into.arguments += function["arguments"]

    def body(self) -> dict[str, object]:
        message: dict[str, object] = {"role": "assistant", "content": "".join(self._text)}
        if self._reasoning:
            message["reasoning_content"] = "".join(self._reasoning)
        if self._refusal:
            message["refusal"] = "".join(self._refusal)
        if self._calls:
            message["tool_calls"] = [{"id": c.id, "type": "function",
                                      "function": {"name": c.name, "arguments": c.arguments}}
                                     for _, c in sorted(self._calls.items())]
        choice: dict[str, object] = {"index": 0, "message": message, "finish_reason": self._finish}
        if self._native_finish is not None:
            choice["native_finish_reason"] = self._native_finish
        body: dict[str, object] = {**self._top, "object": "chat.completion", "choices": [choice]}
        if self._usage is not None:
            body["usage"] = self._usage
        if self._error is not None and not self._text and not self._calls:
            body = {**self._top, "choices": [], "error": self._error}
        return body


class AnthropicEvents:
    """Messages API stream events folded into a message."""

    def __init__(self, provider: str = "anthropic") -> None:
        self.done = False
        self.text_chars = 0
        self.usage_known = False
        self._provider = provider
        self._message: dict[str, str] = {}
        self._blocks: dict[int, dict[str, object]] = {}
        self._json: dict[int, list[str]] = {}
        self._usage: dict[str, object] = {}
        self._stop: Any = None

    def event(self, name: str | None, data: Any, on_token: OnToken) -> None:
        event = _dict(data)
        kind = event.get("type") or name
        if kind == "message_start":
            message = _dict(event.get("message"))
            self._message = {k: message[k] for k in ("id", "model") if isinstance(message.get(k), str)}
            self._usage.update(_dict(message.get("usage")))
            self.usage_known = self.usage_known or bool(self._usage)
        elif kind == "content_block_start":
            index = _index(event.get("index"), len(self._blocks))
            self._blocks[index] = dict(_dict(event.get("content_block")))
        elif kind == "content_block_delta":
            index = _index(event.get("index"), len(self._blocks) - 1)
            block = self._blocks.setdefault(index, {"type": "text", "text": ""})
            delta = _dict(event.get("delta"))
            if delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
                block["text"] = str(block.get("text") or "") + delta["text"]
                if delta["text"]:
                    self.text_chars += len(delta["text"])
                    on_token(delta["text"])
            elif delta.get("type") == "input_json_delta" and isinstance(delta.get("partial_json"), str):
                self._json.setdefault(index, []).append(delta["partial_json"])
            elif delta.get("type") == "thinking_delta" and isinstance(delta.get("thinking"), str):
                block["thinking"] = str(block.get("thinking") or "") + delta["thinking"]
        elif kind == "message_delta":
            delta = _dict(event.get("delta"))
            if delta.get("stop_reason") is not None:
                self._stop = delta["stop_reason"]
            self._usage.update({k: v for k, v in _dict(event.get("usage")).items() if v is not None})
            self.usage_known = self.usage_known or bool(self._usage)
        elif kind == "message_stop":
            self.done = True
        elif kind == "error":
            error = _dict(event.get("error"))
            raise StreamInterrupted(f"{self._provider}: the stream sent an error event "
                                    f"({clipped(str(error.get('type', '?')))}: {clipped(str(error.get('message', '')))}) after "
                                    f"{self.text_chars} characters of text; the provider may bill the answer")

    def body(self) -> dict[str, object]:
        content: list[dict[str, object]] = []
        for index, block in sorted(self._blocks.items()):
            block = dict(block)
            if block.get("type") == "tool_use" and index in self._json:
                block["input"] = "".join(self._json[index])  # the model's text: parsed (or kept) by the gateway
            content.append(block)
        return {**self._message, "type": "message", "role": "assistant", "content": content,
                "stop_reason": self._stop, "usage": self._usage}
