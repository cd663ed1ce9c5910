"""The model gateway contract: one async method, plain data in and out.

A gateway turns a provider-neutral :class:`ModelRequest` into a :class:`ModelResponse`. It owns
the translation to one provider's wire format and the mapping of its failures to
:class:`~cuaderno.errors.GatewayError` (with an :class:`~cuaderno.errors.ErrorClass`); it does
*not* retry: cuaderno's loop is the only retry layer, so official SDKs run with
``max_retries=0``.

Messages are plain JSON dicts in one neutral shape (roles ``user``, ``assistant``, ``tool``):

- ``{"role": "user", "content": str}``
- ``{"role": "assistant", "content": str, "tool_calls": [{"id", "name", "arguments": {...}}]}``
- ``{"role": "tool", "tool_call_id": str, "name": str, "content": str, "is_error": bool}``

Responses are journaled with :meth:`ModelResponse.to_json` and rebuilt on replay with
:meth:`ModelResponse.from_json`; every field added later must have a default, because journals
written before it must keep loading.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

from cuaderno.plainjson import JSONObject, JSONValue

if TYPE_CHECKING:
    from cuaderno.events.payloads import Escalation, Response, ToolCallJSON, UsageJSON

__all__ = [
    "Message",
    "ModelGateway",
    "ModelRequest",
    "ModelResponse",
    "ToolCall",
    "ToolSchema",
    "Usage",
    "assistant_message",
]

Message = dict[str, Any]
"""One neutral chat message (see the module docstring)."""

ToolSchema = dict[str, Any]
"""``{"name": str, "description": str, "parameters": <JSON schema object>}``."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolCall:
    """A tool call the model asked for."""

    id: str
    """The provider's call id; echoed back in the tool result message."""
    name: str
    """The tool's name as the model wrote it (it may not exist: that is checked, not trusted)."""
    arguments: JSONObject = field(default_factory=dict[str, JSONValue])
    """The parsed arguments. Empty when ``arguments_error`` is set."""
    arguments_error: str | None = None
    """Why the raw arguments could not be parsed as a JSON object; a tool never runs then."""
    raw_arguments: str | None = None
    """The raw argument text when it failed to parse, kept as evidence."""

    def to_json(self) -> ToolCallJSON:
        """The journaled form."""
        if self.arguments_error is None:
            return {"id": self.id, "name": self.name, "arguments": self.arguments}
        return {"id": self.id, "name": self.name, "arguments": self.arguments,
                "arguments_error": self.arguments_error, "raw_arguments": self.raw_arguments}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ToolCall:
        """Rebuild from :meth:`to_json` output."""
        return cls(id=data["id"], name=data["name"], arguments=data.get("arguments") or {},
                   arguments_error=data.get("arguments_error"), raw_arguments=data.get("raw_arguments"))


@dataclass(frozen=True, kw_only=True, slots=True)
class Usage:
    """Tokens a call consumed, as the provider reported them (0 when it did not say).

    ``input_tokens`` includes cached tokens; ``cached_tokens`` says how many of them were read
    from the provider's prompt cache."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0

    def to_json(self) -> UsageJSON:
        """The journaled form."""
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "cached_tokens": self.cached_tokens, "reasoning_tokens": self.reasoning_tokens}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Usage:
        """Rebuild from :meth:`to_json` output; missing fields are 0."""
        if not data:
            return cls()
        return cls(input_tokens=data.get("input_tokens", 0), output_tokens=data.get("output_tokens", 0),
                   cached_tokens=data.get("cached_tokens", 0), reasoning_tokens=data.get("reasoning_tokens", 0))


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelResponse:
    """What one model call returned, parsed and provider-neutral.

    Replay hands this back instead of calling the model again, so it must carry everything the
    loop derives the next context from: the text, the tool calls in order, and the accounting.
    """

    text: str = ""
    """Visible text. Empty is allowed; whether that is an empty generation is decided elsewhere."""
    tool_calls: tuple[ToolCall, ...] = ()
    """Tool calls in the order the model wrote them; the loop runs them in this order."""
    finish_reason: str | None = None
    """The provider's native finish/stop reason, unmapped (``stop``, ``tool_calls``, ``end_turn``...)."""
    usage: Usage = field(default_factory=Usage)
    model: str | None = None
    """The model that answered, as the provider named it."""
    cost: float | None = None
    """Cost in USD as reported by the endpoint or a price table; ``None`` means *unpriced*, never free."""
    reasoning: str | None = None
    """Reasoning text, if the provider returned any. Reasoning alone is not an answer."""
    refusal: str | None = None
    """A refusal the provider signalled explicitly."""
    provider_request_id: str | None = None
    response_id: str | None = None
    """The provider's id for this completion (the body's ``id``: ``chatcmpl-...``, ``msg_...``),
    ``gen_ai.response.id`` on the call's span. Evidence only, never compared on replay; journaled
    so a replayed run can still name the completion it reuses."""
    body_sha256: str | None = None
    """sha256 of the raw response body, kept as evidence."""
    tier: str | None = None
    """Which tier answered when a tiered gateway was used."""
    escalations: tuple[Escalation, ...] = ()
    """Evidence of each lower-tier answer that was rejected and escalated within this step
    (``{"from_tier", "to_tier", "reason", "usage", "cost", "finish_reason", "body_sha256"}``).
    Those calls were made (and maybe billed); the loop counts them from here."""

    def to_json(self) -> Response:
        """The journaled form (``response_id`` only when known: a response without one is
        journaled byte for byte as before the field existed)."""
        data: dict[str, object] = {
            "text": self.text,
            "tool_calls": [c.to_json() for c in self.tool_calls],
            "finish_reason": self.finish_reason,
            "usage": self.usage.to_json(),
            "model": self.model,
            "cost": self.cost,
            "reasoning": self.reasoning,
            "refusal": self.refusal,
            "provider_request_id": self.provider_request_id,
            "body_sha256": self.body_sha256,
            "tier": self.tier,
            "escalations": list(self.escalations),
        }
        if self.response_id is not None:
            data["response_id"] = self.response_id  # in place: a copy would cost every model step
        return cast("Response", data)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModelResponse:
        """Rebuild from :meth:`to_json` output. Fields absent in old journals take their defaults."""
        return cls(
            text=data.get("text") or "",
            tool_calls=tuple(ToolCall.from_json(c) for c in data.get("tool_calls") or ()),
            finish_reason=data.get("finish_reason"),
            usage=Usage.from_json(data.get("usage")),
            model=data.get("model"),
            cost=data.get("cost"),
            reasoning=data.get("reasoning"),
            refusal=data.get("refusal"),
            provider_request_id=data.get("provider_request_id"),
            response_id=data.get("response_id"),
            body_sha256=data.get("body_sha256"),
            tier=data.get("tier"),
            escalations=tuple(data.get("escalations") or ()),
        )

    def assistant_message(self) -> Message:
        """The neutral assistant message this response adds to the conversation."""
        return assistant_message(self.to_json())


def assistant_message(response: Mapping[str, Any]) -> Message:
    """The neutral assistant message a response adds to the conversation, from its journaled
    form (:meth:`ModelResponse.to_json`).

    The loop builds the message from the journaled form both when the call is made and when it is
    replayed, so the two cannot differ: anything the message shows is something the journal
    holds. Replay also skips rebuilding the whole :class:`ModelResponse` this way.
    """
    msg: Message = {"role": "assistant", "content": response.get("text") or ""}
    calls = response.get("tool_calls")
    if calls:
        msg["tool_calls"] = [_call_message(c) for c in calls]
    return msg


def _call_message(call: Mapping[str, Any]) -> dict[str, object]:
    out: dict[str, object] = {"id": call["id"], "name": call["name"], "arguments": call.get("arguments") or {}}
    raw = call.get("raw_arguments")
    if raw is not None:
        # Show the model the malformed text it wrote, not an empty object, so it can repair it.
        out["raw_arguments"] = raw
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelRequest:
    """A provider-neutral request for one model turn."""

    instructions: str
    """The system prompt."""
    messages: tuple[Message, ...]
    """The conversation so far, oldest first."""
    tools: tuple[ToolSchema, ...] = ()
    model: str | None = None
    """The model to ask; ``None`` lets the gateway use its default."""
    require_tool: bool = False
    """The turn must call a tool (``tool_choice=required``); an empty turn is then a rejected response."""
    max_output_tokens: int | None = None
    temperature: float | None = None

    def body(self) -> dict[str, object]:
        """The neutral body, as plain JSON (used for fingerprints and by fakes)."""
        body: dict[str, object] = {"instructions": self.instructions, "messages": list(self.messages),
                                   "tools": list(self.tools), "model": self.model,
                                   "require_tool": self.require_tool}
        if self.max_output_tokens is not None:
            body["max_output_tokens"] = self.max_output_tokens
        if self.temperature is not None:
            body["temperature"] = self.temperature
        return body


@runtime_checkable
class ModelGateway(Protocol):
    """Anything that can answer a :class:`ModelRequest`.

    Implementations must:

    - send ``idempotency_key`` to providers that accept one (it is stable across re-sends of the
      same step with the same body);
    - never retry on their own (cuaderno's loop is the only retry layer);
    - raise :class:`~cuaderno.errors.GatewayError` with the right ``error_class`` and ``sent``
      for every failure, and never return a response they could not parse.
    """

    async def complete(self, request: ModelRequest, *, idempotency_key: str) -> ModelResponse:
        """Answer one request."""
        ...
