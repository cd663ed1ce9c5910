"""AnthropicGateway against the real ``anthropic`` SDK over a mock ``httpx2`` transport (and loopback sockets)."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from typing import Any

import anthropic
import httpx2
import pytest

from cuaderno import Agent, FinalStep, Session, SqliteCheckpointer
from cuaderno.errors import ErrorClass, GatewayError, UsageError
from cuaderno.gateway.anthropic import AnthropicGateway
from cuaderno.gateway.base import ModelRequest, ModelResponse
from cuaderno.gateway.empty import Outcome, Reason, classify_response
from cuaderno.gateway.pricing import PriceTable

KEY = "run-1:step-3:abcdef"
REQ = ModelRequest(instructions="be brief", messages=({"role": "user", "content": "hola"},))
TOOLS = ({"name": "lookup", "description": "find a thing", "parameters": {"type": "object", "properties": {
    "q": {"type": "string"}}}},)
TOOL_REQ = ModelRequest(instructions="use tools", messages=({"role": "user", "content": "find x"},), tools=TOOLS,
                        require_tool=True)

MakeGw = Callable[..., AnthropicGateway]


def message(*blocks: dict[str, Any], stop: str | None = "end_turn", usage: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test-20250101",
            "content": list(blocks), "stop_reason": stop, "stop_sequence": None,
            "usage": usage or {"input_tokens": 10, "output_tokens": 5}}


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def tool_use(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": arguments}


async def test_text_answer_with_cache_usage_and_ids(fake: Any, make_anthropic: MakeGw) -> None:
    usage = {"input_tokens": 50, "output_tokens": 20, "cache_read_input_tokens": 300,
             "cache_creation_input_tokens": 100}
    raw = json.dumps(message(text("¡hola"), text("!"), usage=usage)).encode()
    fake.queue(httpx2.Response(200, content=raw, headers={"content-type": "application/json",
                                                         "request-id": "req_ant_1"}))
    resp = await make_anthropic().complete(REQ, idempotency_key=KEY)
    assert resp.text == "¡hola!"
    assert resp.finish_reason == "end_turn"
    # Neutral input_tokens include cache reads and writes; cached_tokens are the reads.
    assert (resp.usage.input_tokens, resp.usage.cached_tokens, resp.usage.output_tokens) == (450, 300, 20)
    assert resp.provider_request_id == "req_ant_1"
    assert resp.body_sha256 == hashlib.sha256(raw).hexdigest()
    assert resp.model == "claude-test-20250101"
    assert resp.cost is None
    request = fake.requests[0]
    assert request.headers["Idempotency-Key"] == KEY
    assert request.headers["authorization"] == "Bearer sk-ant-test"  # this SDK sends keys as a bearer token
    sent = fake.body()
    assert sent["system"] == "be brief"
    assert sent["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hola"}]}]
    assert sent["max_tokens"] == 4096 and sent["model"] == "claude-test"


async def test_tool_use_both_ways(fake: Any, make_anthropic: MakeGw) -> None:
    fake.json(body=message(text("Looking."), tool_use("toolu_a", "lookup", {"q": "x"}),
                           tool_use("toolu_b", "lookup", {"q": "y"}), stop="tool_use"))
    history = ModelRequest(instructions="use tools", tools=TOOLS, require_tool=True, max_output_tokens=500, messages=(
        {"role": "user", "content": "find x"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "toolu_0", "name": "lookup", "arguments": {"q": 1}},
                                                            {"id": "toolu_1", "name": "lookup", "arguments": {}}]},
        {"role": "tool", "tool_call_id": "toolu_0", "name": "lookup", "content": "found", "is_error": False},
        {"role": "tool", "tool_call_id": "toolu_1", "name": "lookup", "content": "no such id", "is_error": True},
        {"role": "user", "content": "and now?"},
        {"role": "assistant", "content": ""},  # nothing to send: dropped
    ))
    resp = await make_anthropic().complete(history, idempotency_key=KEY)
    assert resp.text == "Looking."
    assert [(c.id, c.arguments) for c in resp.tool_calls] == [("toolu_a", {"q": "x"}), ("toolu_b", {"q": "y"})]
    assert classify_response(resp, require_tool=True).ok
    sent = fake.body()
    assert sent["tool_choice"] == {"type": "tool", "name": "lookup"}  # the one tool, named
    assert sent["max_tokens"] == 500
    assert sent["tools"] == [{"name": "lookup", "description": "find a thing", "input_schema": TOOLS[0]["parameters"]}]
    assert sent["messages"][1] == {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_0", "name": "lookup", "input": {"q": 1}},
        {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {}}]}
    assert sent["messages"][2] == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_0", "content": "found"},
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "no such id", "is_error": True},
        {"type": "text", "text": "and now?"}]}
    assert len(sent["messages"]) == 3


async def test_bad_tool_input_and_unknown_tool_are_preserved(fake: Any, make_anthropic: MakeGw) -> None:
    fake.json(body=message(tool_use("t1", "lookup", '{"q": "x"'), tool_use("t2", "delete_everything", {"all": True}),
                           tool_use("t3", "lookup", ["not", "an", "object"]), stop="tool_use"))
    resp = await make_anthropic().complete(TOOL_REQ, idempotency_key=KEY)
    broken, unknown, listy = resp.tool_calls
    assert broken.arguments_error is not None and broken.raw_arguments == '{"q": "x"'
    assert unknown.name == "delete_everything" and unknown.arguments == {"all": True}
    assert listy.arguments_error is not None and listy.raw_arguments == '["not", "an", "object"]'
    assert ModelResponse.from_json(json.loads(json.dumps(resp.to_json()))) == resp


@pytest.mark.parametrize(("body", "reason"), [
    (message(), Reason.NO_OUTPUT),
    (message(text("")), Reason.NO_OUTPUT),
    (message({"type": "thinking", "thinking": "I should call lookup", "signature": "sig"}), Reason.REASONING_ONLY),
    (message(stop="max_tokens", usage={"input_tokens": 10, "output_tokens": 4096}), Reason.LENGTH_WITHOUT_OUTPUT),
    ({"type": "error", "error": {"type": "api_error", "message": "internal"}}, Reason.ERROR_FINISH_REASON),
])
async def test_empty_200s(fake: Any, make_anthropic: MakeGw, body: dict[str, Any], reason: Reason) -> None:
    fake.json(body=body)
    resp = await make_anthropic().complete(TOOL_REQ, idempotency_key=KEY)
    verdict = classify_response(resp, require_tool=True)
    assert (verdict.outcome, verdict.reason) == (Outcome.EMPTY, reason)


async def test_reasoning_is_kept(fake: Any, make_anthropic: MakeGw) -> None:
    fake.json(body=message({"type": "thinking", "thinking": "hmm", "signature": "s"}, text("ok")))
    resp = await make_anthropic().complete(REQ, idempotency_key=KEY)
    assert (resp.reasoning, resp.text) == ("hmm", "ok")


async def test_refusal_stop_reason(fake: Any, make_anthropic: MakeGw) -> None:
    fake.json(body=message(stop="refusal"))
    resp = await make_anthropic().complete(REQ, idempotency_key=KEY)
    assert resp.refusal == "refusal"
    verdict = classify_response(resp, require_tool=False)
    assert (verdict.outcome, verdict.reason) == (Outcome.REFUSAL, Reason.REFUSAL_FIELD)


async def test_text_without_required_tool(fake: Any, make_anthropic: MakeGw) -> None:
    fake.json(body=message(text("I'd rather chat.")))
    resp = await make_anthropic().complete(TOOL_REQ, idempotency_key=KEY)
    assert classify_response(resp, require_tool=True).outcome is Outcome.NO_TOOL_CALL


async def test_cost_from_price_table_and_litellm_header(fake: Any, make_anthropic: MakeGw) -> None:
    usage = {"input_tokens": 1_000_000, "output_tokens": 1_000_000, "cache_read_input_tokens": 1_000_000}
    fake.json(body=message(text("a"), usage=usage))
    fake.json(body=message(text("b")), headers={"x-litellm-response-cost": "0.25"})
    table = PriceTable({"claude-test": {"input": 3.0, "output": 15.0, "cached_input": 0.3}})
    gw = make_anthropic(prices=table)
    assert (await gw.complete(REQ, idempotency_key=KEY)).cost == pytest.approx(3.0 + 15.0 + 0.3)
    assert (await gw.complete(REQ, idempotency_key=KEY)).cost == 0.25


@pytest.mark.parametrize(("status", "error_class"), [
    (400, ErrorClass.INVALID_INPUT), (401, ErrorClass.PERMANENT), (403, ErrorClass.PERMANENT),
    (404, ErrorClass.PERMANENT), (413, ErrorClass.INVALID_INPUT), (429, ErrorClass.TRANSIENT),
    (500, ErrorClass.AMBIGUOUS), (529, ErrorClass.TRANSIENT),
])
async def test_status_classes_and_exactly_one_request(fake: Any, make_anthropic: MakeGw, status: int,
                                                      error_class: ErrorClass) -> None:
    fake.json(status, body={"type": "error", "error": {"type": "some_error", "message": f"boom {status}"}},
              headers={"request-id": "req_x", "retry-after-ms": "250"})
    with pytest.raises(GatewayError) as info:
        await make_anthropic().complete(REQ, idempotency_key=KEY)
    err = info.value
    assert (err.error_class, err.status, err.sent, err.retry_after) == (error_class, status, True, 0.25)
    assert f"boom {status}" in str(err) and "req_x" in str(err)
    assert isinstance(err.__cause__, anthropic.APIStatusError)
    assert len(fake.requests) == 1


async def test_connection_refused_before_send(unused_port: int) -> None:
    gw = AnthropicGateway("claude-test", base_url=f"http://127.0.0.1:{unused_port}", api_key="k", timeout=5.0)
    try:
        with pytest.raises(GatewayError) as info:
            await gw.complete(REQ, idempotency_key=KEY)
    finally:
        await gw.aclose()
    assert (info.value.error_class, info.value.sent) == (ErrorClass.TRANSIENT, False)


async def test_read_timeout_after_send(silent_server: str) -> None:
    gw = AnthropicGateway("claude-test", base_url=silent_server, api_key="k",
                          timeout=httpx2.Timeout(0.3, connect=5.0))
    try:
        with pytest.raises(GatewayError) as info:
            await gw.complete(REQ, idempotency_key=KEY)
    finally:
        await gw.aclose()
    assert (info.value.error_class, info.value.sent) == (ErrorClass.AMBIGUOUS, True)


async def test_connect_error_is_one_attempt(fake: Any, make_anthropic: MakeGw) -> None:
    fake.queue(httpx2.ConnectError("refused"))
    with pytest.raises(GatewayError) as info:
        await make_anthropic().complete(REQ, idempotency_key=KEY)
    assert (info.value.error_class, info.value.sent) == (ErrorClass.TRANSIENT, False)
    assert len(fake.requests) == 1


async def test_truncated_json(fake: Any, make_anthropic: MakeGw) -> None:
    raw = json.dumps(message(text("cut"))).encode()[:25]
    fake.queue(httpx2.Response(200, content=raw, headers={"content-type": "application/json"}))
    with pytest.raises(GatewayError) as info:
        await make_anthropic().complete(REQ, idempotency_key=KEY)
    assert (info.value.error_class, info.value.sent) == (ErrorClass.AMBIGUOUS, True)


async def test_impossible_shape(fake: Any, make_anthropic: MakeGw) -> None:
    fake.json(body={"type": "message", "content": "not a list"})
    with pytest.raises(GatewayError) as info:
        await make_anthropic().complete(REQ, idempotency_key=KEY)
    assert info.value.error_class is ErrorClass.BUG


async def test_10mb_body_is_refused_with_bounded_reading(fake: Any, make_anthropic: MakeGw, lazy_body: Any) -> None:
    pulled, gen = lazy_body(10 * 1024 * 1024)
    fake.queue(httpx2.Response(200, content=gen(), headers={"content-type": "application/json"}))
    with pytest.raises(GatewayError) as info:
        await make_anthropic().complete(REQ, idempotency_key=KEY)  # default 8 MiB
    assert (info.value.error_class, info.value.sent) == (ErrorClass.PERMANENT, True)
    assert pulled() <= 8 * 1024 * 1024 + 64 * 1024
    assert len(fake.requests) == 1


def test_no_key_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(UsageError, match="ANTHROPIC_API_KEY"):
        AnthropicGateway("claude-test")


async def test_given_client_gets_retries_off(fake: Any) -> None:
    client = anthropic.AsyncAnthropic(api_key="k", base_url="http://127.0.0.1:9", max_retries=4,
                                      http_client=fake.client())
    gw = AnthropicGateway("claude-test", client=client)
    try:
        fake.json(529, body={"type": "error", "error": {"type": "overloaded_error", "message": "busy"}})
        with pytest.raises(GatewayError):
            await gw.complete(REQ, idempotency_key=KEY)
        assert len(fake.requests) == 1
    finally:
        await gw.aclose()


# -- what reaches the wire: temperature, tool_choice (through the SDK's real request path) -------

TWO_TOOLS = (*TOOLS, {"name": "save", "parameters": {"type": "object", "properties": {}}})


@pytest.mark.parametrize(("tools", "require_tool", "choice"), [
    (TOOLS, False, {"type": "auto"}),
    (TWO_TOOLS, False, {"type": "auto"}),
    (TOOLS, True, {"type": "tool", "name": "lookup"}),
    (TWO_TOOLS, True, {"type": "any"}),
    ((), False, None),
])
async def test_tool_choice_is_sent_whenever_tools_are(fake: Any, make_anthropic: MakeGw, tools: tuple[Any, ...],
                                                      require_tool: bool, choice: dict[str, Any] | None) -> None:
    fake.json(body=message(text("ok")))
    request = ModelRequest(instructions="i", messages=({"role": "user", "content": "x"},), tools=tools,
                           require_tool=require_tool)
    await make_anthropic().complete(request, idempotency_key=KEY)
    assert fake.body().get("tool_choice") == choice


async def test_temperature_reaches_a_compatible_server_in_the_body(fake: Any, make_anthropic: MakeGw) -> None:
    # The SDK's create() has no temperature parameter: passing it was a TypeError for every
    # agent with a temperature, and no request was ever made.
    fake.json(body=message(text("ok")))
    request = ModelRequest(instructions="i", messages=({"role": "user", "content": "x"},), temperature=0.2)
    resp = await make_anthropic().complete(request, idempotency_key=KEY)
    assert resp.text == "ok" and len(fake.requests) == 1
    assert fake.body()["temperature"] == 0.2
    assert fake.requests[0].headers["anthropic-version"] == "2026-10-21"


async def test_no_temperature_no_field(fake: Any, make_anthropic: MakeGw) -> None:
    fake.json(body=message(text("ok")))
    await make_anthropic().complete(REQ, idempotency_key=KEY)
    assert "temperature" not in fake.body()


async def test_temperature_rules_for_anthropics_own_api(fake: Any) -> None:
    """api.anthropic.com at 2026-10-21 answers 400 to any temperature: refused before sending by
    default, dropped on request, sent for a client pinned to an older API version."""
    request = ModelRequest(instructions="i", messages=({"role": "user", "content": "x"},), temperature=0.0)
    refusing = AnthropicGateway("claude-test", api_key="k", http_client=fake.client())
    dropping = AnthropicGateway("claude-test", api_key="k", http_client=fake.client(), on_temperature="drop")
    pinned = AnthropicGateway("claude-test", client=anthropic.AsyncAnthropic(
        api_key="k", http_client=fake.client(), default_headers={"anthropic-version": "2023-06-01"}))
    try:
        assert (refusing.on_temperature, dropping.on_temperature, pinned.on_temperature) == ("refuse", "drop", "send")
        with pytest.raises(GatewayError, match=r"temperature=0.0 .*2026-10-21.*on_temperature=\"drop\"") as info:
            await refusing.complete(request, idempotency_key=KEY)
        assert (info.value.error_class, info.value.sent) == (ErrorClass.PERMANENT, False)
        assert fake.requests == []
        fake.json(body=message(text("a")))
        await dropping.complete(request, idempotency_key=KEY)
        assert "temperature" not in fake.body()
        fake.json(body=message(text("b")))
        await pinned.complete(request, idempotency_key=KEY)
        assert fake.body()["temperature"] == 0.0
        assert fake.requests[-1].headers["anthropic-version"] == "2023-06-01"
    finally:
        for gw in (refusing, dropping, pinned):
            await gw.aclose()


def test_unknown_temperature_rule_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="on_temperature"):
        AnthropicGateway("claude-test", api_key="k", base_url="http://127.0.0.1:9", on_temperature="ignore")  # type: ignore[arg-type]


# -- sent only when a request was made ------------------------------------------------------------

UNENCODABLE = ({"name": "lookup", "parameters": {"type": "object", "properties": {"q": {"default": object()}}}},)
"""A tool schema the SDK cannot encode as JSON: it raises while building the request, before any
request exists."""


async def test_an_sdk_error_before_any_request_is_not_sent(fake: Any, make_anthropic: MakeGw) -> None:
    request = ModelRequest(instructions="i", messages=({"role": "user", "content": "x"},), tools=UNENCODABLE)
    with pytest.raises(GatewayError) as info:
        await make_anthropic().complete(request, idempotency_key=KEY)
    assert fake.requests == []
    assert (info.value.error_class, info.value.sent) == (ErrorClass.BUG, False)
    assert "nothing was sent" in str(info.value)
    assert isinstance(info.value.__cause__, TypeError)


async def test_the_mark_is_per_call_not_per_gateway(fake: Any, make_anthropic: MakeGw) -> None:
    """One call's request in flight does not make a concurrent call's pre-send failure "sent"."""
    arrived, release = asyncio.Event(), asyncio.Event()

    async def slow(request: httpx2.Request) -> httpx2.Response:
        arrived.set()
        await release.wait()
        return httpx2.Response(200, json=message(text("a")))

    fake.queue(slow)
    gw = make_anthropic()
    first = asyncio.create_task(gw.complete(REQ, idempotency_key=KEY))
    await arrived.wait()
    request = ModelRequest(instructions="i", messages=({"role": "user", "content": "x"},), tools=UNENCODABLE)
    with pytest.raises(GatewayError) as info:
        await gw.complete(request, idempotency_key=KEY)
    assert info.value.sent is False
    release.set()
    assert (await first).text == "a"
    assert len(fake.requests) == 1


async def test_a_failure_once_the_request_is_handed_over_stays_sent(fake: Any, make_anthropic: MakeGw) -> None:
    # The transport itself blows up with something that is not an httpx2 error: the request was
    # handed over, so we cannot prove it did not leave.
    fake.queue(RuntimeError("transport exploded"))
    with pytest.raises(GatewayError) as info:
        await make_anthropic().complete(REQ, idempotency_key=KEY)
    assert len(fake.requests) == 1
    assert info.value.sent is True


class _MockEndpointGateway(AnthropicGateway):
    async def preflight(self) -> None:
        pass  # the endpoint is a mock transport: there is no socket to connect to


class _OldTemperatureGateway(_MockEndpointGateway):
    """The gateway as it was: ``temperature`` passed to ``messages.create()``, which this SDK
    refuses with a ``TypeError`` before building any request."""

    def _request_kwargs(self, request: ModelRequest) -> dict[str, Any]:
        return {**super()._request_kwargs(request), "temperature": request.temperature}


async def test_an_agent_with_a_temperature_completes(fake: Any, tmp_path: Any) -> None:

    fake.json(body=message(text("hecho")))
    gw = _MockEndpointGateway("claude-test", base_url="http://127.0.0.1:9", api_key="k", http_client=fake.client())
    try:
        steps = [s async for s in Agent(instructions="i", temperature=0.2).run(
            "t", session=Session("temp", gw, SqliteCheckpointer(tmp_path / "j.sqlite")))]
    finally:
        await gw.aclose()
    assert isinstance(steps[-1], FinalStep) and steps[-1].output == "hecho"
    assert len(fake.requests) == 1 and fake.body()["temperature"] == 0.2


async def test_a_pre_send_sdk_error_is_journaled_as_not_sent(fake: Any, tmp_path: Any) -> None:
    """Through the loop and the real SDK: the journal's error row says ``sent: false``, and the
    server saw nothing."""

    store = SqliteCheckpointer(tmp_path / "j.sqlite")
    gw = _OldTemperatureGateway("claude-test", base_url="http://127.0.0.1:9", api_key="k", http_client=fake.client())
    try:
        with pytest.raises(GatewayError) as info:
            async for _ in Agent(instructions="i", temperature=0.2).run("t", session=Session("pre-send", gw, store)):
                pass
    finally:
        await gw.aclose()
    assert fake.requests == []
    assert isinstance(info.value.__cause__, TypeError) and "temperature" in str(info.value.__cause__)
    errors = [e for e in store.load("pre-send") if e.phase.startswith("error")]
    assert [(e.payload["error"]["sent"], e.payload["error"]["error_class"]) for e in errors] == [(False, "bug")]
    # Nothing left the process, so nothing is counted as sent (the intent's count is taken back).
    cp = store.checkpoint("pre-send")
    assert cp is not None and cp.count("model_sends") == 0


async def test_a_refused_temperature_is_journaled_as_not_sent_and_not_billed_on_resume(fake: Any, tmp_path: Any) -> None:

    store = SqliteCheckpointer(tmp_path / "j.sqlite")

    async def run(gw: AnthropicGateway, agent: Agent) -> list[Any]:
        try:
            return [s async for s in agent.run("t", session=Session("refused", gw, store))]
        finally:
            await gw.aclose()

    refusing = _MockEndpointGateway("claude-test", api_key="k", http_client=fake.client())  # api.anthropic.com
    with pytest.raises(GatewayError, match="temperature"):
        await run(refusing, Agent(instructions="i", temperature=0.5))
    assert fake.requests == []
    errors = [e.payload["error"] for e in store.load("refused") if e.phase.startswith("error")]
    assert [(e["sent"], e["error_class"]) for e in errors] == [(False, "permanent")]
    assert store.checkpoint("refused").count("model_sends") == 0
    fake.json(body=message(text("ok")))
    dropping = _MockEndpointGateway("claude-test", api_key="k", http_client=fake.client(), on_temperature="drop")
    steps = await run(dropping, Agent(instructions="i", temperature=0.5))
    assert isinstance(steps[-1], FinalStep) and "temperature" not in fake.body()
    assert store.checkpoint("refused").count("possibly_billed_twice") == 0
