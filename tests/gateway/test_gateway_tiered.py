"""TieredGateway: escalate an empty cheap answer once, never re-send to the cheap model."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cuaderno.errors import ErrorClass, GatewayError, UsageError
from cuaderno.gateway.base import ModelGateway, ModelRequest, ModelResponse, ToolCall, Usage
from cuaderno.gateway.empty import Outcome
from cuaderno.gateway.openai import OpenAIGateway
from cuaderno.gateway.tiered import TieredGateway

KEY = "run-1:step-7:fp"
TOOL_REQ = ModelRequest(instructions="use tools", messages=({"role": "user", "content": "go"},),
                        tools=({"name": "lookup", "description": "", "parameters": {"type": "object"}},),
                        require_tool=True, model="requested-model")
CALL = (ToolCall(id="c1", name="lookup", arguments={}),)


class Scripted:
    """A gateway answering from a script and recording (request, key) pairs."""

    def __init__(self, model: str, *answers: ModelResponse | Exception) -> None:
        self.model = model
        self.answers = list(answers)
        self.calls: list[tuple[ModelRequest, str]] = []

    async def complete(self, request: ModelRequest, *, idempotency_key: str) -> ModelResponse:
        self.calls.append((request, idempotency_key))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


EMPTY = ModelResponse(finish_reason="stop", usage=Usage(input_tokens=900, output_tokens=31000), model="cheap-v1",
                      body_sha256="ab" * 32, provider_request_id="req_cheap")
GOOD = ModelResponse(tool_calls=CALL, finish_reason="tool_calls", model="strong-v1", cost=0.07)


def test_is_a_model_gateway() -> None:
    assert isinstance(TieredGateway(Scripted("a"), Scripted("b")), ModelGateway)


async def test_ok_cheap_answer_is_returned_with_its_tier() -> None:
    cheap, strong = Scripted("cheap", GOOD), Scripted("strong")
    tiered = TieredGateway(cheap, strong)
    resp = await tiered.complete(TOOL_REQ, idempotency_key=KEY)
    assert resp.tier == "cheap" and resp.escalations == ()
    assert cheap.calls == [(TOOL_REQ, KEY)] and strong.calls == []
    assert tiered.escalations == 0


async def test_empty_cheap_answer_escalates_the_same_turn_once() -> None:
    cheap, strong = Scripted("cheap", EMPTY), Scripted("strong", GOOD)
    tiered = TieredGateway(cheap, strong)
    resp = await tiered.complete(TOOL_REQ, idempotency_key=KEY)
    assert len(cheap.calls) == 1  # never re-sent to the cheap model
    assert len(strong.calls) == 1
    strong_request, strong_key = strong.calls[0]
    assert strong_key == f"{KEY}:strong" != KEY
    assert strong_request.model is None  # the strong tier answers with its own model
    assert strong_request.messages == TOOL_REQ.messages and strong_request.require_tool
    assert resp.tier == "strong" and resp.tool_calls == CALL and resp.cost == 0.07
    (evidence,) = resp.escalations
    assert evidence == {"from_tier": "cheap", "to_tier": "strong", "reason": "no_output", "outcome": "empty",
                        "detail": evidence["detail"], "usage": EMPTY.usage.to_json(), "cost": None,
                        "finish_reason": "stop", "body_sha256": "ab" * 32, "model": "cheap-v1",
                        "provider_request_id": "req_cheap"}
    assert json.loads(json.dumps(resp.to_json())) == resp.to_json()
    assert ModelResponse.from_json(resp.to_json()) == resp
    assert tiered.escalations == 1 and tiered.calls == {"cheap": 1, "strong": 1}


async def test_text_without_required_tool_call_escalates_with_its_own_reason() -> None:
    cheap, strong = Scripted("cheap", ModelResponse(text="I'd call lookup", finish_reason="stop")), Scripted(
        "strong", GOOD)
    resp = await TieredGateway(cheap, strong, names=("small", "big")).complete(TOOL_REQ, idempotency_key=KEY)
    assert resp.tier == "big"
    assert resp.escalations[0]["reason"] == "text_without_required_tool_call"
    assert strong.calls[0][1] == f"{KEY}:big"


async def test_prose_is_fine_when_no_tool_is_required() -> None:
    answer = ModelResponse(text="done", finish_reason="stop")
    cheap, strong = Scripted("cheap", answer), Scripted("strong")
    request = ModelRequest(instructions="", messages=({"role": "user", "content": "hi"},))
    resp = await TieredGateway(cheap, strong).complete(request, idempotency_key=KEY)
    assert resp.tier == "cheap" and strong.calls == []


async def test_refusal_is_not_escalated_by_default() -> None:
    refusal = ModelResponse(refusal="no", finish_reason="stop")
    cheap, strong = Scripted("cheap", refusal, refusal), Scripted("strong", GOOD)
    resp = await TieredGateway(cheap, strong).complete(TOOL_REQ, idempotency_key=KEY)
    assert resp.tier == "cheap" and strong.calls == []
    both = TieredGateway(cheap, strong, escalate_on={Outcome.EMPTY, Outcome.REFUSAL})
    assert (await both.complete(TOOL_REQ, idempotency_key=KEY)).tier == "strong"


async def test_gateway_errors_propagate_without_escalation() -> None:
    boom = GatewayError("429", error_class=ErrorClass.TRANSIENT, sent=True, retry_after=1.0, status=429)
    cheap, strong = Scripted("cheap", boom), Scripted("strong")
    with pytest.raises(GatewayError) as info:
        await TieredGateway(cheap, strong).complete(TOOL_REQ, idempotency_key=KEY)
    assert info.value is boom and strong.calls == []


async def test_strong_tier_empty_answer_is_returned_as_is_with_evidence() -> None:
    cheap, strong = Scripted("cheap", EMPTY), Scripted("strong", ModelResponse(finish_reason="stop"))
    resp = await TieredGateway(cheap, strong).complete(TOOL_REQ, idempotency_key=KEY)
    # No third call: the loop sees a rejected strong answer and counts it against its budget.
    assert resp.tier == "strong" and len(resp.escalations) == 1
    assert len(cheap.calls) == len(strong.calls) == 1


def test_misconfigurations_are_usage_errors() -> None:
    same = Scripted("m")
    with pytest.raises(UsageError):
        TieredGateway(same, same)
    with pytest.raises(UsageError):
        TieredGateway(Scripted("m"), Scripted("m"))
    with pytest.raises(UsageError):
        TieredGateway(Scripted("a"), Scripted("b"), names=("x", "x"))


def _completion(message: dict[str, Any], finish: str) -> dict[str, Any]:
    return {"id": "c", "model": "x", "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 30000}}


async def test_over_real_openai_gateways(fake: Any, other_fake: Any) -> None:
    """End to end through the SDK: the cheap endpoint sees one request, the strong one the derived key."""
    strong_fake = other_fake
    fake.json(body=_completion({"role": "assistant", "content": None, "reasoning_content": "..."}, "stop"))
    strong_fake.json(body=_completion({"role": "assistant", "content": None, "tool_calls": [
        {"id": "t1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]}, "tool_calls"))
    cheap = OpenAIGateway("cheap-model", base_url="http://127.0.0.1:9/v1", api_key="k", http_client=fake.client())
    strong = OpenAIGateway("strong-model", base_url="http://127.0.0.1:8/v1", api_key="k",
                           http_client=strong_fake.client())
    try:
        tiered = TieredGateway(cheap, strong)
        request = ModelRequest(instructions="", messages=TOOL_REQ.messages, tools=TOOL_REQ.tools, require_tool=True)
        resp = await tiered.complete(request, idempotency_key=KEY)
    finally:
        await cheap.aclose()
        await strong.aclose()
    assert resp.tier == "strong" and resp.tool_calls[0].name == "lookup"
    assert resp.escalations[0]["reason"] == "reasoning_only"
    assert len(fake.requests) == 1 and len(strong_fake.requests) == 1
    assert fake.requests[0].headers["Idempotency-Key"] == KEY
    assert strong_fake.requests[0].headers["Idempotency-Key"] == f"{KEY}:strong"
    assert json.loads(fake.requests[0].content)["model"] == "cheap-model"
    assert json.loads(strong_fake.requests[0].content)["model"] == "strong-model"
