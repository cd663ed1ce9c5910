"""Streaming gateways: ``complete_streaming`` through the real SDKs' HTTP layer, an ``httpx2``
MockTransport serving server-sent events; tokens as they arrive, the same response as a
non-streamed call, and a stream cut mid-way a typed, ambiguous error."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx2
import pytest

from cuaderno.errors import ErrorClass, GatewayError, StreamInterrupted
from cuaderno.gateway.anthropic import AnthropicGateway
from cuaderno.gateway.base import ModelRequest
from cuaderno.gateway.openai import OpenAIGateway
from cuaderno.gateway.pricing import PriceTable

KEY = "run-1:t0000.model:abcdef"
REQ = ModelRequest(instructions="be brief", messages=({"role": "user", "content": "hola"},))
TOOLS = ({"name": "lookup", "description": "find", "parameters": {"type": "object", "properties": {
    "q": {"type": "string"}}}},)


def sse(*events: Any, done: bool = True, named: bool = False) -> list[bytes]:
    """Each event as one SSE frame (``event:`` lines for Anthropic's named events)."""
    out = []
    for ev in events:
        head = f"event: {ev['type']}\n" if named else ""
        out.append(f"{head}data: {json.dumps(ev)}\n\n".encode())
    if done:
        out.append(b"data: [DONE]\n\n")
    return out


def streamed(frames: list[bytes], *, cut: BaseException | None = None) -> Callable[[httpx2.Request], httpx2.Response]:
    """An answer serving ``frames`` one by one, then raising ``cut`` (the connection dropped)."""

    def answer(request: httpx2.Request) -> httpx2.Response:
        async def body() -> AsyncIterator[bytes]:
            for frame in frames:
                yield frame
            if cut is not None:
                raise cut

        return httpx2.Response(200, headers={"content-type": "text/event-stream", "x-request-id": "req_s"},
                               content=body())

    return answer


def chunk(content: str | None = None, *, finish: str | None = None, tool_calls: list[Any] | None = None,
          **delta: Any) -> dict[str, Any]:
    d: dict[str, Any] = dict(delta)
    if content is not None:
        d["content"] = content
    if tool_calls is not None:
        d["tool_calls"] = tool_calls
    return {"id": "chatcmpl-s", "object": "chat.completion.chunk", "model": "gpt-test-2025",
            "choices": [{"index": 0, "delta": d, "finish_reason": finish}]}


USAGE = {"id": "chatcmpl-s", "object": "chat.completion.chunk", "model": "gpt-test-2025", "choices": [],
         "usage": {"prompt_tokens": 12, "completion_tokens": 3}}


# -- OpenAI --------------------------------------------------------------------------------------------


async def test_openai_tokens_arrive_in_order_and_the_response_is_the_complete_answer(fake: Any,
                                                                                     make_openai: Any) -> None:
    frames = sse(chunk("", role="assistant"), chunk("¡Ho"), chunk("la"), chunk("!", finish="stop"), USAGE)
    fake.queue(streamed(frames))
    tokens: list[str] = []
    gw: OpenAIGateway = make_openai(prices=PriceTable({"gpt-test": {"input": 1.0, "output": 2.0}}))
    resp = await gw.complete_streaming(REQ, idempotency_key=KEY, on_token=tokens.append)
    assert tokens == ["¡Ho", "la", "!"]
    assert resp.text == "¡Hola!" and resp.finish_reason == "stop" and resp.tool_calls == ()
    assert (resp.usage.input_tokens, resp.usage.output_tokens) == (12, 3)
    assert resp.cost == pytest.approx((12 * 1.0 + 3 * 2.0) / 1e6)
    assert resp.response_id == "chatcmpl-s" and resp.model == "gpt-test-2025"
    assert resp.body_sha256 == hashlib.sha256(b"".join(frames)).hexdigest()
    sent = fake.body()
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
    assert fake.requests[0].headers["idempotency-key"] == KEY
    assert fake.requests[0].headers["x-idempotency-key"] == KEY


async def test_a_stream_without_usage_is_unpriced_never_free(fake: Any, make_openai: Any) -> None:
    # llama-cpp-python 0.3 ignores stream_options: no usage chunk. A price table would price 0
    # tokens at $0; the call is unpriced instead.
    fake.queue(streamed(sse(chunk("hi", finish="stop"))))
    gw: OpenAIGateway = make_openai(prices=PriceTable({"gpt-test": {"input": 1.0, "output": 2.0}}))
    resp = await gw.complete_streaming(REQ, idempotency_key=KEY, on_token=lambda t: None)
    assert resp.text == "hi" and resp.cost is None and resp.usage.output_tokens == 0
    fake.queue(streamed(sse(chunk("hi", finish="stop"))))
    fake.queue(streamed(sse(chunk("hi", finish="stop"), USAGE)))
    assert (await gw.complete_streaming(REQ, idempotency_key=KEY, on_token=lambda t: None)).cost is None
    assert (await gw.complete_streaming(REQ, idempotency_key=KEY, on_token=lambda t: None)).cost is not None


async def test_openai_tool_calls_in_pieces_and_reasoning_are_folded_not_shown(fake: Any, make_openai: Any) -> None:
    frames = sse(chunk(reasoning_content="think"),
                 chunk(tool_calls=[{"index": 0, "id": "call_1", "type": "function",
                                    "function": {"name": "lookup", "arguments": ""}}]),
                 chunk(tool_calls=[{"index": 0, "function": {"arguments": '{"q": '}}]),
                 chunk(tool_calls=[{"index": 0, "function": {"arguments": '"x"}'}}]),
                 chunk(finish="tool_calls"), USAGE)
    fake.queue(streamed(frames))
    tokens: list[str] = []
    resp = await make_openai().complete_streaming(ModelRequest(instructions="", messages=REQ.messages, tools=TOOLS),
                                                  idempotency_key=KEY, on_token=tokens.append)
    assert tokens == []
    assert [(c.id, c.name, c.arguments) for c in resp.tool_calls] == [("call_1", "lookup", {"q": "x"})]
    assert resp.reasoning == "think" and resp.finish_reason == "tool_calls"


async def test_openai_a_stream_cut_mid_token_is_stream_interrupted_ambiguous_and_sent(fake: Any,
                                                                                  make_openai: Any) -> None:
    # The connection drops in the middle of an event ("con" of the next token's JSON).
    frames = [*sse(chunk("Hel"), done=False), b'data: {"id": "chatcmpl-s", "choices": [{"delta": {"con']
    fake.queue(streamed(frames, cut=httpx2.RemoteProtocolError("peer closed connection without sending complete "
                                                               "message body")))
    tokens: list[str] = []
    with pytest.raises(StreamInterrupted) as info:
        await make_openai().complete_streaming(REQ, idempotency_key=KEY, on_token=tokens.append)
    err = info.value
    assert isinstance(err, GatewayError) and err.error_class is ErrorClass.AMBIGUOUS and err.sent is True
    assert tokens == ["Hel"]
    assert "3 characters of text" in str(err) and "RemoteProtocolError" in str(err)
    assert err.to_json()["type"] == "StreamInterrupted"


async def test_openai_a_stream_that_ends_without_done_is_interrupted(fake: Any, make_openai: Any) -> None:
    fake.queue(streamed(sse(chunk("Hel"), done=False) + [b'data: {"choi']))
    with pytest.raises(StreamInterrupted, match="an event cut in the middle"):
        await make_openai().complete_streaming(REQ, idempotency_key=KEY, on_token=lambda t: None)
    fake.queue(streamed(sse(chunk("Hel", finish="stop"), done=False)))
    with pytest.raises(StreamInterrupted, match="no end event"):
        await make_openai().complete_streaming(REQ, idempotency_key=KEY, on_token=lambda t: None)


async def test_openai_a_refusal_before_the_stream_is_the_usual_classified_error(fake: Any, make_openai: Any) -> None:
    fake.json(429, {"error": {"message": "slow down"}}, headers={"retry-after": "2"})
    with pytest.raises(GatewayError) as info:
        await make_openai().complete_streaming(REQ, idempotency_key=KEY, on_token=lambda t: None)
    assert not isinstance(info.value, StreamInterrupted)
    assert info.value.error_class is ErrorClass.TRANSIENT and info.value.retry_after == 2


async def test_openai_an_event_that_is_not_json_is_a_malformed_body(fake: Any, make_openai: Any) -> None:
    fake.queue(streamed([b"data: {not json}\n\n", b"data: [DONE]\n\n"]))
    with pytest.raises(GatewayError) as info:
        await make_openai().complete_streaming(REQ, idempotency_key=KEY, on_token=lambda t: None)
    assert info.value.error_class is ErrorClass.AMBIGUOUS and info.value.sent is True


async def test_an_exception_of_the_callers_on_token_is_raised_as_it_is(fake: Any, make_openai: Any) -> None:
    fake.queue(streamed(sse(chunk("x", finish="stop"), USAGE)))

    def boom(text: str) -> None:
        raise KeyError("the caller's bug")

    with pytest.raises(KeyError, match="the caller's bug"):
        await make_openai().complete_streaming(REQ, idempotency_key=KEY, on_token=boom)


# -- Anthropic -----------------------------------------------------------------------------------------


def anthropic_frames(*, stop: bool = True) -> list[bytes]:
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": {"id": "msg_s", "type": "message", "role": "assistant",
                                              "model": "claude-test-1", "content": [],
                                              "usage": {"input_tokens": 20, "output_tokens": 1,
                                                        "cache_read_input_tokens": 5}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "ping"},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Bus"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "co"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "toolu_1",
                                                                      "name": "lookup", "input": {}}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": '{"q":'}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": ' "y"}'}},
        {"type": "content_block_stop", "index": 1},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}},
    ]
    if stop:
        events.append({"type": "message_stop"})
    return sse(*events, done=False, named=True)


async def test_anthropic_text_deltas_stream_and_the_message_is_folded_whole(fake: Any, make_anthropic: Any) -> None:
    frames = anthropic_frames()
    fake.queue(streamed(frames))
    tokens: list[str] = []
    gw: AnthropicGateway = make_anthropic()
    resp = await gw.complete_streaming(ModelRequest(instructions="s", messages=REQ.messages, tools=TOOLS),
                                       idempotency_key=KEY, on_token=tokens.append)
    assert tokens == ["Bus", "co"]
    assert resp.text == "Busco" and resp.finish_reason == "tool_use"
    assert [(c.id, c.name, c.arguments) for c in resp.tool_calls] == [("toolu_1", "lookup", {"q": "y"})]
    assert (resp.usage.input_tokens, resp.usage.output_tokens, resp.usage.cached_tokens) == (25, 9, 5)
    assert resp.response_id == "msg_s" and resp.body_sha256 == hashlib.sha256(b"".join(frames)).hexdigest()
    assert fake.body()["stream"] is True and fake.requests[0].headers["idempotency-key"] == KEY


async def test_anthropic_an_error_event_or_a_cut_is_stream_interrupted(fake: Any, make_anthropic: Any) -> None:
    error = sse({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}, done=False,
                named=True)
    fake.queue(streamed(anthropic_frames(stop=False)[:4] + error))
    tokens: list[str] = []
    with pytest.raises(StreamInterrupted, match="overloaded_error") as info:
        await make_anthropic().complete_streaming(REQ, idempotency_key=KEY, on_token=tokens.append)
    assert info.value.error_class is ErrorClass.AMBIGUOUS and tokens == ["Bus"]
    fake.queue(streamed(anthropic_frames(stop=False)))  # no message_stop: the connection closed cleanly
    with pytest.raises(StreamInterrupted, match="no end event"):
        await make_anthropic().complete_streaming(REQ, idempotency_key=KEY, on_token=lambda t: None)
    fake.queue(streamed(anthropic_frames()[:5], cut=httpx2.ReadTimeout("read timed out")))
    with pytest.raises(StreamInterrupted, match="ReadTimeout"):
        await make_anthropic().complete_streaming(REQ, idempotency_key=KEY, on_token=lambda t: None)
