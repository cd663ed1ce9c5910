"""OpenAIGateway against the real ``openai`` SDK over a mock ``httpx2`` transport (and loopback sockets)."""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Callable
from typing import Any

import httpx2
import openai
import pytest

from cuaderno.errors import ErrorClass, GatewayError, UsageError
from cuaderno.gateway.base import ModelRequest, ModelResponse
from cuaderno.gateway.empty import Outcome, Reason, classify_response
from cuaderno.gateway.openai import OpenAIGateway
from cuaderno.gateway.pricing import ModelPrice, PriceTable

KEY = "run-1:step-3:abcdef"
REQ = ModelRequest(instructions="be brief", messages=({"role": "user", "content": "hola"},))
TOOLS = ({"name": "lookup", "description": "find a thing", "parameters": {"type": "object", "properties": {
    "q": {"type": "string"}}, "required": ["q"]}},)
TOOL_REQ = ModelRequest(instructions="use tools", messages=({"role": "user", "content": "find x"},), tools=TOOLS,
                        require_tool=True)

MakeGw = Callable[..., OpenAIGateway]


def completion(content: Any = "hello", *, tool_calls: list[dict[str, Any]] | None = None, finish: str | None = "stop",
               usage: dict[str, Any] | None = None, message_extra: dict[str, Any] | None = None,
               choice_extra: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content, **(message_extra or {})}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    choice = {"index": 0, "message": message, "finish_reason": finish, **(choice_extra or {})}
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-test-2025-01-01",
            "choices": [choice], "usage": usage or {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
            **extra}


def call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# -- normal answers -------------------------------------------------------------------------------


async def test_text_answer_is_parsed_with_usage_ids_and_body_hash(fake: Any, make_openai: MakeGw) -> None:
    usage = {"prompt_tokens": 100, "completion_tokens": 40, "prompt_tokens_details": {"cached_tokens": 60},
             "completion_tokens_details": {"reasoning_tokens": 25}}
    raw = json.dumps(completion("¡hola!", usage=usage)).encode()
    fake.queue(httpx2.Response(200, content=raw, headers={"content-type": "application/json",
                                                         "x-request-id": "req_123"}))
    resp = await make_openai().complete(REQ, idempotency_key=KEY)
    assert resp.text == "¡hola!"
    assert resp.tool_calls == ()
    assert resp.finish_reason == "stop"
    assert (resp.usage.input_tokens, resp.usage.output_tokens) == (100, 40)
    assert (resp.usage.cached_tokens, resp.usage.reasoning_tokens) == (60, 25)
    assert resp.model == "gpt-test-2025-01-01"
    assert resp.provider_request_id == "req_123"
    assert resp.body_sha256 == hashlib.sha256(raw).hexdigest()
    assert resp.cost is None  # no header, no usage.cost, no price table: unpriced, not free
    assert classify_response(resp, require_tool=False).outcome is Outcome.OK
    sent = fake.body()
    assert sent["model"] == "gpt-test"
    assert sent["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hola"}]
    assert "tools" not in sent and "tool_choice" not in sent


async def test_idempotency_key_is_sent_exactly(fake: Any, make_openai: MakeGw) -> None:
    fake.json(body=completion()).json(body=completion()).json(body=completion())
    await make_openai().complete(REQ, idempotency_key=KEY)
    await make_openai(idempotency_header="X-Step-Key").complete(REQ, idempotency_key=KEY)
    await make_openai(idempotency_header=None).complete(REQ, idempotency_key=KEY)
    assert fake.requests[0].headers["Idempotency-Key"] == KEY
    assert fake.requests[1].headers["X-Step-Key"] == KEY
    assert "Idempotency-Key" not in fake.requests[2].headers


async def test_request_options_are_translated(fake: Any, make_openai: MakeGw) -> None:
    fake.json(body=completion())
    req = ModelRequest(instructions="", messages=REQ.messages, model="other-model", max_output_tokens=77,
                       temperature=0.2)
    await make_openai().complete(req, idempotency_key=KEY)
    sent = fake.body()
    assert sent["model"] == "other-model"
    assert sent["max_tokens"] == 77  # a non-OpenAI base_url gets the widely supported field
    assert sent["temperature"] == 0.2
    assert sent["messages"] == [{"role": "user", "content": "hola"}]  # no empty system message


async def test_tool_calls_both_ways(fake: Any, make_openai: MakeGw) -> None:
    fake.json(body=completion(None, finish="tool_calls", tool_calls=[
        call("call_a", "lookup", '{"q": "x"}'), call("call_b", "lookup", '{"q": "y"}')]))
    history = ModelRequest(instructions="use tools", tools=TOOLS, require_tool=True, messages=(
        {"role": "user", "content": "find x"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_0", "name": "lookup", "arguments": {"q": 1}},
                                                            {"id": "call_1", "name": "lookup", "arguments": {},
                                                             "raw_arguments": "{bad"}]},
        {"role": "tool", "tool_call_id": "call_0", "name": "lookup", "content": "found", "is_error": False},
        {"role": "tool", "tool_call_id": "call_1", "name": "lookup", "content": "bad args", "is_error": True},
    ))
    resp = await make_openai().complete(history, idempotency_key=KEY)
    assert [(c.id, c.name, c.arguments) for c in resp.tool_calls] == [("call_a", "lookup", {"q": "x"}),
                                                                      ("call_b", "lookup", {"q": "y"})]
    assert resp.text == ""
    assert classify_response(resp, require_tool=True).outcome is Outcome.OK
    sent = fake.body()
    # One tool: the obligation is sent as a named tool choice (what every compatible server implements).
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "lookup"}}
    assert sent["tools"] == [{"type": "function", "function": {"name": "lookup", "description": "find a thing",
                                                               "parameters": TOOLS[0]["parameters"]}}]
    assistant = sent["messages"][2]
    assert assistant["content"] == ""  # not null: llama.cpp rejects a null content beside tool calls
    assert assistant["tool_calls"][0] == {"id": "call_0", "type": "function",
                                          "function": {"name": "lookup", "arguments": '{"q": 1}'}}
    assert assistant["tool_calls"][1]["function"]["arguments"] == "{bad"  # the model sees what it wrote
    assert sent["messages"][3] == {"role": "tool", "tool_call_id": "call_0", "content": "found"}


async def test_invalid_tool_arguments_become_evidence_not_errors(fake: Any, make_openai: MakeGw) -> None:
    fake.json(body=completion(None, finish="tool_calls", tool_calls=[
        call("c1", "lookup", '{"q": "x"'), call("c2", "lookup", "[1, 2]"), call("c3", "lookup", ""),
        {"type": "function", "function": {"name": "lookup", "arguments": "{}"}}]))
    resp = await make_openai().complete(TOOL_REQ, idempotency_key=KEY)
    broken, not_object, empty, no_id = resp.tool_calls
    assert broken.arguments == {} and broken.raw_arguments == '{"q": "x"'
    assert broken.arguments_error is not None and "not valid JSON" in broken.arguments_error
    assert not_object.arguments_error is not None and "JSON object" in not_object.arguments_error
    assert not_object.raw_arguments == "[1, 2]"
    assert empty.arguments == {} and empty.arguments_error is None
    assert no_id.id == "call_3"  # a deterministic id when the server sends none
    assert ModelResponse.from_json(json.loads(json.dumps(resp.to_json()))) == resp


async def test_unknown_tool_name_is_preserved(fake: Any, make_openai: MakeGw) -> None:
    fake.json(body=completion(None, finish="tool_calls", tool_calls=[call("c1", "rm_rf", '{"path": "/"}')]))
    resp = await make_openai().complete(TOOL_REQ, idempotency_key=KEY)
    assert resp.tool_calls[0].name == "rm_rf"  # returned as written; refusing it is the loop's job
    assert resp.tool_calls[0].arguments == {"path": "/"}


# -- empty 200s and refusals ----------------------------------------------------------------------


@pytest.mark.parametrize(("body", "reason"), [
    (completion(""), Reason.NO_OUTPUT),
    (completion(None), Reason.NO_OUTPUT),
    (completion("  \n", finish=None), Reason.NO_OUTPUT),
    (completion(None, message_extra={"reasoning_content": "let me think..."}), Reason.REASONING_ONLY),
    (completion(None, message_extra={"reasoning": "hmm"}), Reason.REASONING_ONLY),
    (completion(None, finish="length", usage={"prompt_tokens": 9, "completion_tokens": 32000}),
     Reason.LENGTH_WITHOUT_OUTPUT),
    (completion(None, finish="error"), Reason.ERROR_FINISH_REASON),
    (completion("partial", finish="stop", choice_extra={"native_finish_reason": "MALFORMED_FUNCTION_CALL"}),
     Reason.ERROR_FINISH_REASON),
    (completion(None, choice_extra={"error": {"code": 502, "message": "upstream died"}}), Reason.ERROR_FINISH_REASON),
    ({"error": {"message": "provider returned error", "code": 502}, "usage": {"prompt_tokens": 5}},
     Reason.ERROR_FINISH_REASON),
])
async def test_empty_200s_parse_and_are_classified_empty(fake: Any, make_openai: MakeGw, body: dict[str, Any],
                                                         reason: Reason) -> None:
    fake.json(body=body)
    resp = await make_openai().complete(TOOL_REQ, idempotency_key=KEY)
    assert resp.tool_calls == ()
    assert resp.cost is None
    verdict = classify_response(resp, require_tool=True)
    assert (verdict.outcome, verdict.reason) == (Outcome.EMPTY, reason)


async def test_text_without_required_tool_call_is_rejected_distinctly(fake: Any, make_openai: MakeGw) -> None:
    fake.json(body=completion("I would call lookup now."))
    resp = await make_openai().complete(TOOL_REQ, idempotency_key=KEY)
    verdict = classify_response(resp, require_tool=True)
    assert (verdict.outcome, verdict.reason) == (Outcome.NO_TOOL_CALL, Reason.TEXT_WITHOUT_REQUIRED_TOOL_CALL)
    assert classify_response(resp, require_tool=False).ok


@pytest.mark.parametrize("body", [
    completion(None, message_extra={"refusal": "I can't help with that."}),
    completion("", finish="content_filter"),
    completion("", choice_extra={"native_finish_reason": "SAFETY"}),
])
async def test_refusals(fake: Any, make_openai: MakeGw, body: dict[str, Any]) -> None:
    fake.json(body=body)
    resp = await make_openai().complete(REQ, idempotency_key=KEY)
    assert classify_response(resp, require_tool=False).outcome is Outcome.REFUSAL


async def test_refusal_field_is_kept(fake: Any, make_openai: MakeGw) -> None:
    fake.json(body=completion(None, message_extra={"refusal": "No."}))
    resp = await make_openai().complete(REQ, idempotency_key=KEY)
    assert resp.refusal == "No."


# -- cost -----------------------------------------------------------------------------------------


async def test_litellm_cost_header(fake: Any, make_openai: MakeGw) -> None:
    fake.json(body=completion(), headers={"x-litellm-response-cost": "0.00042"})
    resp = await make_openai().complete(REQ, idempotency_key=KEY)
    assert resp.cost == pytest.approx(0.00042)


async def test_litellm_zero_cost_for_used_tokens_is_unpriced(fake: Any, make_openai: MakeGw) -> None:
    fake.json(body=completion(), headers={"x-litellm-response-cost": "0.0"})
    fake.json(body=completion(), headers={"x-litellm-response-cost": "0.0"})
    assert (await make_openai().complete(REQ, idempotency_key=KEY)).cost is None
    resp = await make_openai(zero_cost_is_unpriced=False).complete(REQ, idempotency_key=KEY)
    assert resp.cost == 0.0


async def test_openrouter_usage_cost(fake: Any, make_openai: MakeGw) -> None:
    fake.json(body=completion(usage={"prompt_tokens": 10, "completion_tokens": 5, "cost": 0.0123}))
    resp = await make_openai().complete(REQ, idempotency_key=KEY)
    assert resp.cost == pytest.approx(0.0123)


async def test_price_table(fake: Any, make_openai: MakeGw) -> None:
    usage = {"prompt_tokens": 1_000_000, "completion_tokens": 100_000,
             "prompt_tokens_details": {"cached_tokens": 400_000}}
    fake.json(body=completion(usage=usage)).json(body=completion(usage=usage))
    # Keyed by the requested alias: the answer names a dated snapshot, the table the alias.
    table = PriceTable({"gpt-test": ModelPrice(input=2.0, output=8.0, cached_input=0.5)})
    resp = await make_openai(prices=table).complete(REQ, idempotency_key=KEY)
    assert resp.cost == pytest.approx(600_000 * 2.0 / 1e6 + 400_000 * 0.5 / 1e6 + 100_000 * 8.0 / 1e6)
    unknown = PriceTable({"some-other-model": {"input": 1.0, "output": 1.0}})
    assert (await make_openai(prices=unknown).complete(REQ, idempotency_key=KEY)).cost is None


async def test_header_cost_wins_over_price_table(fake: Any, make_openai: MakeGw) -> None:
    fake.json(body=completion(), headers={"x-litellm-response-cost": "0.5"})
    table = PriceTable({"gpt-test": {"input": 1000.0, "output": 1000.0}})
    assert (await make_openai(prices=table).complete(REQ, idempotency_key=KEY)).cost == 0.5


# -- HTTP errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "error_class"), [
    (400, ErrorClass.INVALID_INPUT), (422, ErrorClass.INVALID_INPUT), (413, ErrorClass.INVALID_INPUT),
    (401, ErrorClass.PERMANENT), (403, ErrorClass.PERMANENT), (404, ErrorClass.PERMANENT),
    (402, ErrorClass.PERMANENT), (408, ErrorClass.TRANSIENT), (409, ErrorClass.TRANSIENT),
    (429, ErrorClass.TRANSIENT), (503, ErrorClass.TRANSIENT),
    (500, ErrorClass.AMBIGUOUS), (502, ErrorClass.AMBIGUOUS), (504, ErrorClass.AMBIGUOUS),
])
async def test_status_classes_and_exactly_one_request(fake: Any, make_openai: MakeGw, status: int,
                                                      error_class: ErrorClass) -> None:
    fake.json(status, body={"error": {"message": f"boom {status}", "type": "x"}}, headers={"x-request-id": "req_9"})
    with pytest.raises(GatewayError) as info:
        await make_openai().complete(REQ, idempotency_key=KEY)
    err = info.value
    assert (err.error_class, err.status, err.sent) == (error_class, status, True)
    assert f"boom {status}" in str(err) and "req_9" in str(err)
    assert isinstance(err.__cause__, openai.APIStatusError)
    assert len(fake.requests) == 1  # SDK retries are off: the loop is the only retry layer


async def test_429_retry_after_seconds_and_ms(fake: Any, make_openai: MakeGw) -> None:
    fake.json(429, body={"error": {"message": "slow down"}}, headers={"retry-after": "2"})
    fake.json(429, body={"error": {"message": "slow down"}}, headers={"retry-after-ms": "1500", "retry-after": "9"})
    gw = make_openai()
    for expected in (2.0, 1.5):
        with pytest.raises(GatewayError) as info:
            await gw.complete(REQ, idempotency_key=KEY)
        assert info.value.error_class is ErrorClass.TRANSIENT
        assert info.value.retry_after == expected
    assert len(fake.requests) == 2


async def test_429_insufficient_quota_is_permanent(fake: Any, make_openai: MakeGw) -> None:
    fake.json(429, body={"error": {"message": "You exceeded your quota", "type": "insufficient_quota",
                                   "code": "insufficient_quota"}})
    with pytest.raises(GatewayError) as info:
        await make_openai().complete(REQ, idempotency_key=KEY)
    assert info.value.error_class is ErrorClass.PERMANENT


async def test_401_says_to_check_the_key(fake: Any, make_openai: MakeGw) -> None:
    fake.json(401, body={"error": {"message": "Incorrect API key provided"}})
    with pytest.raises(GatewayError) as info:
        await make_openai().complete(REQ, idempotency_key=KEY)
    assert info.value.error_class is ErrorClass.PERMANENT and "API key" in str(info.value)
    assert "sk-test" not in str(info.value)


# -- transport failures ---------------------------------------------------------------------------


async def test_connection_refused_before_send_is_transient_not_sent(unused_port: int) -> None:
    gw = OpenAIGateway("gpt-test", base_url=f"http://127.0.0.1:{unused_port}/v1", api_key="k", timeout=5.0)
    try:
        with pytest.raises(GatewayError) as info:
            await gw.complete(REQ, idempotency_key=KEY)
    finally:
        await gw.aclose()
    assert (info.value.error_class, info.value.sent) == (ErrorClass.TRANSIENT, False)
    assert info.value.status is None


async def test_read_timeout_after_send_is_ambiguous(silent_server: str) -> None:
    gw = OpenAIGateway("gpt-test", base_url=f"{silent_server}/v1", api_key="k",
                       timeout=httpx2.Timeout(0.3, connect=5.0))
    try:
        with pytest.raises(GatewayError) as info:
            await gw.complete(REQ, idempotency_key=KEY)
    finally:
        await gw.aclose()
    assert (info.value.error_class, info.value.sent) == (ErrorClass.AMBIGUOUS, True)


@pytest.mark.parametrize(("exc", "error_class", "sent"), [
    (httpx2.ConnectError("refused"), ErrorClass.TRANSIENT, False),
    (httpx2.ConnectTimeout("slow connect"), ErrorClass.TRANSIENT, False),
    (httpx2.ReadTimeout("slow answer"), ErrorClass.AMBIGUOUS, True),
    (httpx2.RemoteProtocolError("server hung up"), ErrorClass.AMBIGUOUS, True),
    (httpx2.WriteError("broken pipe"), ErrorClass.TRANSIENT, True),
])
async def test_transport_errors_map_once(fake: Any, make_openai: MakeGw, exc: Exception, error_class: ErrorClass,
                                         sent: bool) -> None:
    fake.queue(exc)
    with pytest.raises(GatewayError) as info:
        await make_openai().complete(REQ, idempotency_key=KEY)
    assert (info.value.error_class, info.value.sent) == (error_class, sent)
    assert len(fake.requests) == 1


# -- malformed and oversized bodies ---------------------------------------------------------------


async def test_truncated_json_body_is_ambiguous(fake: Any, make_openai: MakeGw) -> None:
    raw = json.dumps(completion()).encode()[:-20]
    fake.queue(httpx2.Response(200, content=raw, headers={"content-type": "application/json"}))
    with pytest.raises(GatewayError) as info:
        await make_openai().complete(REQ, idempotency_key=KEY)
    assert (info.value.error_class, info.value.sent) == (ErrorClass.AMBIGUOUS, True)
    assert isinstance(info.value.__cause__, ValueError)


@pytest.mark.parametrize("body", [[1, 2, 3], {"object": "chat.completion", "choices": []}, {"choices": ["x"]}])
async def test_impossible_shapes_are_bugs(fake: Any, make_openai: MakeGw, body: Any) -> None:
    fake.json(body=body)
    with pytest.raises(GatewayError) as info:
        await make_openai().complete(REQ, idempotency_key=KEY)
    assert (info.value.error_class, info.value.sent) == (ErrorClass.BUG, True)


async def test_10mb_chunked_body_is_refused_with_bounded_reading(fake: Any, make_openai: MakeGw,
                                                                 lazy_body: Any) -> None:
    pulled, gen = lazy_body(10 * 1024 * 1024)
    fake.queue(httpx2.Response(200, content=gen(), headers={"content-type": "application/json"}))
    limit = 1024 * 1024
    with pytest.raises(GatewayError) as info:
        await make_openai(max_body_bytes=limit).complete(REQ, idempotency_key=KEY)
    assert (info.value.error_class, info.value.sent) == (ErrorClass.PERMANENT, True)
    assert "max_body_bytes" in str(info.value)
    assert pulled() <= limit + 64 * 1024  # stopped one chunk past the cap, not after 10 MB


async def test_10mb_declared_body_is_refused_unread(fake: Any, make_openai: MakeGw, lazy_body: Any) -> None:
    pulled, gen = lazy_body(10 * 1024 * 1024)
    fake.queue(httpx2.Response(200, content=gen(), headers={"content-type": "application/json",
                                                            "content-length": str(10 * 1024 * 1024)}))
    with pytest.raises(GatewayError) as info:
        await make_openai().complete(REQ, idempotency_key=KEY)  # default 8 MiB limit
    assert info.value.error_class is ErrorClass.PERMANENT
    assert pulled() == 0


async def test_compressed_body_is_capped_on_its_decoded_size(fake: Any, make_openai: MakeGw) -> None:
    bomb = gzip.compress(b" " * (20 * 1024 * 1024))  # ~20 KB on the wire, 20 MB decoded
    pulled = 0

    async def stream() -> Any:
        nonlocal pulled
        for i in range(0, len(bomb), 4096):
            pulled += len(bomb[i:i + 4096])
            yield bomb[i:i + 4096]

    fake.queue(httpx2.Response(200, content=stream(), headers={
        "content-type": "application/json", "content-encoding": "gzip", "content-length": str(len(bomb))}))
    with pytest.raises(GatewayError) as info:
        await make_openai(max_body_bytes=1024 * 1024).complete(REQ, idempotency_key=KEY)
    assert info.value.error_class is ErrorClass.PERMANENT
    assert pulled < len(bomb)  # refused on the decoded size, before the whole bomb arrived


async def test_body_already_in_memory_is_still_refused(fake: Any, make_openai: MakeGw) -> None:
    # A transport that hands over a pre-read body bypasses the stream cap; the size is checked again.
    response = httpx2.Response(200, content=b" " * (2 * 1024 * 1024), headers={"content-type": "application/json"})
    del response.headers["content-length"]
    fake.queue(response)
    with pytest.raises(GatewayError) as info:
        await make_openai(max_body_bytes=1024 * 1024).complete(REQ, idempotency_key=KEY)
    assert info.value.error_class is ErrorClass.PERMANENT


async def test_small_compressed_body_still_parses(fake: Any, make_openai: MakeGw) -> None:
    raw = json.dumps(completion("comprimido")).encode()
    fake.queue(httpx2.Response(200, content=gzip.compress(raw), headers={"content-type": "application/json",
                                                                         "content-encoding": "gzip"}))
    resp = await make_openai().complete(REQ, idempotency_key=KEY)
    assert resp.text == "comprimido"
    assert resp.body_sha256 == hashlib.sha256(raw).hexdigest()
    assert fake.requests[0].headers["accept-encoding"] == "identity"


async def test_error_bodies_are_capped_too(fake: Any, make_openai: MakeGw, lazy_body: Any) -> None:
    pulled, gen = lazy_body(10 * 1024 * 1024)
    fake.queue(httpx2.Response(500, content=gen()))
    with pytest.raises(GatewayError) as info:
        await make_openai(max_body_bytes=256 * 1024).complete(REQ, idempotency_key=KEY)
    assert info.value.error_class is ErrorClass.PERMANENT
    assert pulled() <= 256 * 1024 + 64 * 1024


# -- construction ---------------------------------------------------------------------------------


def test_no_key_and_no_base_url_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(UsageError, match="OPENAI_API_KEY"):
        OpenAIGateway("gpt-test")


async def test_local_server_needs_no_key(fake: Any, make_openai: MakeGw, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    fake.json(body=completion())
    await make_openai(api_key=None).complete(REQ, idempotency_key=KEY)
    assert fake.requests[0].headers["authorization"] == "Bearer cuaderno-no-key"


async def test_given_client_gets_retries_off_and_the_body_limit(fake: Any, lazy_body: Any) -> None:
    client = openai.AsyncOpenAI(api_key="k", base_url="http://127.0.0.1:9/v1", max_retries=5,
                                http_client=fake.client())
    gw = OpenAIGateway("gpt-test", client=client, max_body_bytes=128 * 1024)
    try:
        fake.json(500, body={"error": {"message": "boom"}})
        with pytest.raises(GatewayError):
            await gw.complete(REQ, idempotency_key=KEY)
        assert len(fake.requests) == 1
        pulled, gen = lazy_body(10 * 1024 * 1024)
        fake.queue(httpx2.Response(200, content=gen()))
        with pytest.raises(GatewayError) as info:
            await gw.complete(REQ, idempotency_key=KEY)
        assert info.value.error_class is ErrorClass.PERMANENT
        assert client.max_retries == 5  # the caller's client is untouched
    finally:
        await gw.aclose()


def test_client_excludes_connection_options() -> None:
    client = openai.AsyncOpenAI(api_key="k", base_url="http://127.0.0.1:9/v1")
    with pytest.raises(UsageError):
        OpenAIGateway("gpt-test", client=client, api_key="other")


async def test_require_tool_without_tools_is_a_usage_error(fake: Any, make_openai: MakeGw) -> None:
    with pytest.raises(UsageError):
        await make_openai().complete(ModelRequest(instructions="", messages=(), require_tool=True),
                                     idempotency_key=KEY)
    assert fake.requests == []


async def test_an_sdk_error_before_any_request_is_not_sent(fake: Any, make_openai: MakeGw) -> None:
    # A tool schema the SDK cannot encode: it raises while building the request, so nothing left.
    tools = ({"name": "lookup", "parameters": {"type": "object", "properties": {"q": {"default": object()}}}},)
    request = ModelRequest(instructions="i", messages=({"role": "user", "content": "x"},), tools=tools)
    with pytest.raises(GatewayError) as info:
        await make_openai().complete(request, idempotency_key=KEY)
    assert fake.requests == []
    assert (info.value.error_class, info.value.sent) == (ErrorClass.BUG, False)
    assert isinstance(info.value.__cause__, TypeError)
