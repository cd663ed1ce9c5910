"""Structured output: the final answer of an agent with an ``output_type`` must validate.

The check runs once, on the live response, before its result is journaled. What it decided is
journaled with the response (the verdict, and for an accepted answer the validated JSON under
``output``), and replay reads that decision instead of validating again: the recorded response is
what it is, even under a pydantic that would now judge it differently.

A failing answer is a rejected response, on the same path as an empty generation
(:mod:`cuaderno.gateway.empty`): counted in ``rejected_responses``, bounded by
``Budgets.rejected_responses`` (past the bound the run ends failed with that reason). Unlike an
empty generation, the model is told what was wrong: the answer and a message carrying the
validation errors join the conversation, built from the journaled verdict alone so a resume
rebuilds the same request (and the same idempotency key) for the next turn.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Final

import pydantic

from cuaderno.gateway.base import Message, ModelResponse, assistant_message
from cuaderno.gateway.empty import Outcome, Reason, ResponseOutcome
from cuaderno.plainjson import JSONObject

__all__ = ["check_output", "feedback_messages"]

_FENCE: Final = re.compile(r"```(?:json|JSON)?[ \t]*\n?(.*?)```", re.DOTALL)
_MAX_ERRORS: Final = 10


def answer_json(text: str) -> str:
    """The JSON of an answer: the first fenced block if there is one, else the whole text."""
    found = _FENCE.search(text)
    return (found.group(1) if found else text).strip()


def check_output(output_type: type[pydantic.BaseModel],
                 response: ModelResponse) -> tuple[ResponseOutcome, JSONObject | None]:
    """The verdict on a final answer, and the validated value as JSON when it is accepted.

    The rejected verdict's ``detail`` is the whole message the model is sent back (the errors and
    the schema), so replay needs nothing but the journal to rebuild it.
    """
    try:
        value = output_type.model_validate_json(answer_json(response.text))
    except pydantic.ValidationError as exc:
        problems = [f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}" for e in exc.errors()[:_MAX_ERRORS]]
        more = exc.error_count() - len(problems)
        if more > 0:
            problems.append(f"... and {more} more")
        schema = json.dumps(output_type.model_json_schema(), sort_keys=True)
        detail = (f"Your final answer is not a valid {output_type.__name__}: " + "; ".join(problems)
                  + f". Answer again with only a JSON object that matches this JSON schema: {schema}")
        return ResponseOutcome(outcome=Outcome.INVALID_OUTPUT, reason=Reason.OUTPUT_FAILED_VALIDATION,
                               detail=detail), None
    return (ResponseOutcome(outcome=Outcome.OK, reason=Reason.ANSWERED, detail=f"a valid {output_type.__name__}"),
            value.model_dump(mode="json"))


def feedback_messages(payload: Mapping[str, Any]) -> list[Message]:
    """What a journaled, rejected model result adds to the conversation: for an answer that
    failed validation, the answer and the errors; for any other rejection, nothing (the same
    request is asked again)."""
    verdict = payload.get("verdict") or {}
    if verdict.get("outcome") != Outcome.INVALID_OUTPUT or payload.get("response") is None:
        return []
    return [assistant_message(payload["response"]), {"role": "user", "content": str(verdict.get("detail", ""))}]
