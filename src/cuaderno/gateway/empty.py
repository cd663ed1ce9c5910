"""Provider-neutral detection of empty generations and refusals, on the *parsed* response.

Seed 002: a generation that ends in a provider error can arrive as HTTP 200 with no content, no
tool call and no price. The gateway fallback (reacts to HTTP errors), the orchestrator's retry
(reacts to exceptions) and the SDK (reacts to malformed bodies) all stay silent, so the check
has to read the parsed :class:`~cuaderno.gateway.base.ModelResponse` and look at the consequence:
did the turn produce anything usable?

Rules, in order (finish reasons compared case-insensitively, so OpenAI's ``content_filter``,
Anthropic's ``refusal`` and Gemini's ``SAFETY``/``MALFORMED_FUNCTION_CALL`` all match):

1. an explicit refusal field, or a refusal/filter finish reason → ``refusal``;
2. an error-like finish reason (``error``, ``MALFORMED_FUNCTION_CALL``, ``other``...) → ``empty``
   even when some text came back: a broken generation's partial output is not an answer;
3. at least one tool call → ``ok``;
4. no visible text (whitespace counts as none) → ``empty``, with the reason
   ``length_without_output`` (hit the token limit first, typically spent on reasoning),
   ``reasoning_only`` (reasoning alone is not an answer) or ``no_output``;
5. visible text but ``require_tool`` → ``no_tool_call``: a rejected response of its own kind
   (the model answered in prose where the turn had to call a tool);
6. otherwise → ``ok``.

Token counts are deliberately not used: zero tokens would flag a legitimately short answer, and
a burned budget of tens of thousands of output tokens can still produce nothing.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from cuaderno.gateway.base import ModelResponse

__all__ = [
    "ERROR_FINISH_REASONS",
    "LENGTH_FINISH_REASONS",
    "REFUSAL_FINISH_REASONS",
    "Outcome",
    "Reason",
    "ResponseOutcome",
    "classify_response",
]


class Outcome(enum.StrEnum):
    """What a response is worth to the turn. Values are journaled; never rename them."""

    OK = "ok"
    EMPTY = "empty"
    """Nothing usable came back (or the generation broke): a rejected response."""
    NO_TOOL_CALL = "no_tool_call"
    """Text only, on a turn that had to call a tool: a rejected response."""
    REFUSAL = "refusal"
    """The provider or the model refused: a rejected response, not an empty one."""
    INVALID_OUTPUT = "invalid_output"
    """A final answer that fails the agent's ``output_type`` (:mod:`cuaderno.gateway.structured`): a
    rejected response, sent back to the model with the errors."""


class Reason(enum.StrEnum):
    """Why a response got its outcome. Values are journaled; never rename them."""

    ANSWERED = "answered"
    TOOL_CALLED = "tool_called"
    ERROR_FINISH_REASON = "error_finish_reason"
    LENGTH_WITHOUT_OUTPUT = "length_without_output"
    REASONING_ONLY = "reasoning_only"
    NO_OUTPUT = "no_output"
    TEXT_WITHOUT_REQUIRED_TOOL_CALL = "text_without_required_tool_call"
    REFUSAL_FIELD = "refusal_field"
    REFUSAL_FINISH_REASON = "refusal_finish_reason"
    OUTPUT_FAILED_VALIDATION = "output_failed_validation"


REFUSAL_FINISH_REASONS = frozenset({
    "content_filter", "refusal", "safety", "recitation", "blocklist", "prohibited_content", "spii",
    "image_safety",
})
"""OpenAI, Anthropic and Gemini spellings (lower-cased) of "blocked by a filter or refused"."""

ERROR_FINISH_REASONS = frozenset({
    "error", "malformed_function_call", "unexpected_tool_call", "other", "finish_reason_unspecified",
    "too_many_tool_calls", "language",
})
"""Finish reasons that mean the generation broke (OpenRouter/LiteLLM ``error``, Gemini's others)."""

LENGTH_FINISH_REASONS = frozenset({"length", "max_tokens", "model_context_window_exceeded"})
"""The output (or the context) ran out of tokens."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ResponseOutcome:
    """The verdict on one response; plain data, journaled with :meth:`to_json`."""

    outcome: Outcome
    reason: Reason
    detail: str

    @property
    def ok(self) -> bool:
        """The turn can use this response."""
        return self.outcome is Outcome.OK

    @property
    def rejected(self) -> bool:
        """The response counts against the per-episode cap on rejected responses."""
        return self.outcome is not Outcome.OK

    def to_json(self) -> dict[str, str]:
        """The journaled form."""
        return {"outcome": self.outcome.value, "reason": self.reason.value, "detail": self.detail}


def classify_response(response: ModelResponse, *, require_tool: bool) -> ResponseOutcome:
    """Classify a parsed response (see the module docstring for the rules).

    Args:
        response: the parsed response, live or rebuilt from the journal (the verdict is the same).
        require_tool: whether this turn had to call a tool.
    """
    finish = (response.finish_reason or "").strip().lower()
    if response.refusal and response.refusal.strip():
        return _verdict(Outcome.REFUSAL, Reason.REFUSAL_FIELD, f"the provider signalled a refusal: {response.refusal}")
    if finish in REFUSAL_FINISH_REASONS:
        return _verdict(Outcome.REFUSAL, Reason.REFUSAL_FINISH_REASON, f"finish reason {response.finish_reason!r}")
    if finish in ERROR_FINISH_REASONS:
        return _verdict(Outcome.EMPTY, Reason.ERROR_FINISH_REASON,
                        f"finish reason {response.finish_reason!r}: the generation ended in an error")
    if response.tool_calls:
        return _verdict(Outcome.OK, Reason.TOOL_CALLED, f"{len(response.tool_calls)} tool call(s)")
    if not response.text.strip():
        return _empty(response, finish)
    if require_tool:
        return _verdict(Outcome.NO_TOOL_CALL, Reason.TEXT_WITHOUT_REQUIRED_TOOL_CALL,
                        "the turn had to call a tool and the model answered with text only")
    return _verdict(Outcome.OK, Reason.ANSWERED, "visible text")


def _empty(response: ModelResponse, finish: str) -> ResponseOutcome:
    spent = f"{response.usage.output_tokens} output tokens"
    if finish in LENGTH_FINISH_REASONS:
        return _verdict(Outcome.EMPTY, Reason.LENGTH_WITHOUT_OUTPUT,
                        f"finish reason {response.finish_reason!r} with no text and no tool call ({spent})")
    if response.reasoning and response.reasoning.strip():
        return _verdict(Outcome.EMPTY, Reason.REASONING_ONLY,
                        f"reasoning but no text and no tool call ({spent})")
    return _verdict(Outcome.EMPTY, Reason.NO_OUTPUT,
                    f"no text and no tool call, finish reason {response.finish_reason!r} ({spent})")


def _verdict(outcome: Outcome, reason: Reason, detail: str) -> ResponseOutcome:
    return ResponseOutcome(outcome=outcome, reason=reason, detail=detail)
