"""The empty-generation detector on hand-built (and journal-rebuilt) responses."""

from __future__ import annotations

import pytest

from cuaderno.gateway.base import ModelResponse, ToolCall, Usage
from cuaderno.gateway.empty import Outcome, Reason, classify_response

CALL = (ToolCall(id="c1", name="lookup", arguments={"q": "x"}),)


@pytest.mark.parametrize(("response", "require_tool", "outcome", "reason"), [
    (ModelResponse(text="hi", finish_reason="stop"), False, Outcome.OK, Reason.ANSWERED),
    (ModelResponse(tool_calls=CALL, finish_reason="tool_calls"), True, Outcome.OK, Reason.TOOL_CALLED),
    (ModelResponse(text="truncated prose", finish_reason="length"), False, Outcome.OK, Reason.ANSWERED),
    (ModelResponse(tool_calls=CALL, finish_reason="length"), True, Outcome.OK, Reason.TOOL_CALLED),
    (ModelResponse(finish_reason="stop"), False, Outcome.EMPTY, Reason.NO_OUTPUT),
    (ModelResponse(text=" \n\t", finish_reason="end_turn"), True, Outcome.EMPTY, Reason.NO_OUTPUT),
    (ModelResponse(finish_reason=None), False, Outcome.EMPTY, Reason.NO_OUTPUT),
    (ModelResponse(reasoning="thinking hard", finish_reason="stop"), True, Outcome.EMPTY, Reason.REASONING_ONLY),
    (ModelResponse(reasoning="long think", finish_reason="length", usage=Usage(output_tokens=32000)), True,
     Outcome.EMPTY, Reason.LENGTH_WITHOUT_OUTPUT),
    (ModelResponse(finish_reason="MAX_TOKENS"), False, Outcome.EMPTY, Reason.LENGTH_WITHOUT_OUTPUT),
    (ModelResponse(finish_reason="error"), False, Outcome.EMPTY, Reason.ERROR_FINISH_REASON),
    (ModelResponse(text="half an answ", finish_reason="error"), False, Outcome.EMPTY, Reason.ERROR_FINISH_REASON),
    (ModelResponse(tool_calls=CALL, finish_reason="MALFORMED_FUNCTION_CALL"), True, Outcome.EMPTY,
     Reason.ERROR_FINISH_REASON),
    (ModelResponse(finish_reason="OTHER"), False, Outcome.EMPTY, Reason.ERROR_FINISH_REASON),
    (ModelResponse(text="Sure, I'll look it up.", finish_reason="stop"), True, Outcome.NO_TOOL_CALL,
     Reason.TEXT_WITHOUT_REQUIRED_TOOL_CALL),
    (ModelResponse(refusal="I can't.", finish_reason="stop"), False, Outcome.REFUSAL, Reason.REFUSAL_FIELD),
    (ModelResponse(text="partial", finish_reason="content_filter"), False, Outcome.REFUSAL,
     Reason.REFUSAL_FINISH_REASON),
    (ModelResponse(finish_reason="SAFETY"), True, Outcome.REFUSAL, Reason.REFUSAL_FINISH_REASON),
    (ModelResponse(finish_reason="refusal"), True, Outcome.REFUSAL, Reason.REFUSAL_FINISH_REASON),
])
def test_classification(response: ModelResponse, require_tool: bool, outcome: Outcome, reason: Reason) -> None:
    verdict = classify_response(response, require_tool=require_tool)
    assert (verdict.outcome, verdict.reason) == (outcome, reason)
    assert verdict.ok is (outcome is Outcome.OK)
    assert verdict.rejected is (outcome is not Outcome.OK)
    # Replay rebuilds the response from the journal; the verdict must not change.
    rebuilt = ModelResponse.from_json(response.to_json())
    assert classify_response(rebuilt, require_tool=require_tool) == verdict


def test_verdict_is_plain_json() -> None:
    verdict = classify_response(ModelResponse(), require_tool=True)
    assert verdict.to_json() == {"outcome": "empty", "reason": "no_output", "detail": verdict.detail}
