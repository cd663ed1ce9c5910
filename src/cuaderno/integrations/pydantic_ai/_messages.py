"""Pydantic AI messages as the journal holds them, and the fingerprints replay checks them by.

A message dumped by ``ModelMessagesTypeAdapter`` carries values that differ on every run of the
same conversation (each part's ``timestamp``, the framework's ``run_id``): a fingerprint over them
would call every replay a divergence. :func:`content` drops them; what remains is what the model
is asked and what it answered.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelResponse,
    TextPart,
    ToolCallPart,
)

from cuaderno.fingerprint import fingerprint
from cuaderno.gateway.base import ModelResponse as JournalResponse
from cuaderno.gateway.base import ToolCall, Usage
from cuaderno.gateway.pricing import Prices

__all__ = ["content", "dump", "load_response", "messages_fingerprint", "to_journal"]

_VOLATILE = frozenset({"timestamp", "run_id", "conversation_id", "started_at", "finished_at", "duration"})
"""Keys whose values change between runs of one conversation (clocks, the framework's own ids);
any key ending in ``_timestamp`` is one too (``request_timestamp``...)."""


def dump(messages: Sequence[ModelMessage]) -> list[dict[str, Any]]:
    """Messages as plain JSON (the framework's own serialization, so they load back exactly)."""
    dumped: list[dict[str, Any]] = ModelMessagesTypeAdapter.dump_python(list(messages), mode="json")
    return dumped


def load_response(data: dict[str, Any]) -> ModelResponse:
    """A journaled response, as the framework's object (what replay hands the agent)."""
    [message] = ModelMessagesTypeAdapter.validate_python([data])
    if not isinstance(message, ModelResponse):
        raise TypeError(f"journaled pydantic-ai message is a {type(message).__name__}, not a ModelResponse")
    return message


def content(value: Any) -> Any:
    """``value`` without the keys that differ between runs of one conversation (``_VOLATILE``)."""
    if isinstance(value, dict):
        return {k: content(v) for k, v in value.items() if k not in _VOLATILE and not k.endswith("_timestamp")}
    if isinstance(value, list):
        return [content(v) for v in value]
    return value


def messages_fingerprint(messages: Sequence[ModelMessage]) -> str:
    """The fingerprint of a conversation's content (a request, a message history)."""
    return fingerprint(content(dump(messages)))


def to_journal(response: ModelResponse, prices: Prices | None = None) -> JournalResponse:
    """The response in cuaderno's own shape, for what reads every run alike (``cuaderno show``,
    the empty/refused verdict, usage and cost at ``prices``: ``None``, unpriced, when they do not
    know the model). The framework's own dump is journaled beside it and is what replay uses."""
    text = "".join(p.content for p in response.parts if isinstance(p, TextPart))
    calls = []
    for p in response.parts:
        if isinstance(p, ToolCallPart):
            try:
                calls.append(ToolCall(id=p.tool_call_id, name=p.tool_name, arguments=p.args_as_dict()))
            except ValueError as exc:  # arguments that are not JSON: journaled as the model sent them
                calls.append(ToolCall(id=p.tool_call_id, name=p.tool_name, arguments={},
                                      arguments_error=str(exc)[:200], raw_arguments=str(p.args)))
    usage = Usage(input_tokens=response.usage.input_tokens, output_tokens=response.usage.output_tokens,
                  cached_tokens=response.usage.cache_read_tokens)
    return JournalResponse(text=text, tool_calls=tuple(calls), finish_reason=response.finish_reason, usage=usage,
                           model=response.model_name, response_id=response.provider_response_id,
                           cost=prices.cost(usage, response.model_name) if prices is not None else None)
