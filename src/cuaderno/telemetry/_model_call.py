"""The ``chat`` span and the model metrics of one model call (:func:`model_call`)."""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import Token
from typing import Any, Final

from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Tracer

from cuaderno.gateway.base import ModelRequest, ModelResponse, Usage
from cuaderno.telemetry._names import (
    CUADERNO_COST_USD,
    CUADERNO_ESCALATION_EVENT,
    CUADERNO_PROVIDER_REQUEST_ID,
    CUADERNO_RUN_ID,
    CUADERNO_STEP_ID,
    CUADERNO_TIER,
    CUADERNO_UNPRICED,
    ERROR_TYPE,
    GEN_AI_CONVERSATION_ID,
    GEN_AI_OPERATION_NAME,
    GEN_AI_PROVIDER_NAME,
    GEN_AI_REQUEST_MAX_TOKENS,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_REQUEST_TEMPERATURE,
    GEN_AI_RESPONSE_FINISH_REASONS,
    GEN_AI_RESPONSE_ID,
    GEN_AI_RESPONSE_MODEL,
    GEN_AI_TOKEN_TYPE,
    GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
    GEN_AI_USAGE_INPUT_TOKENS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
    GEN_AI_USAGE_REASONING_OUTPUT_TOKENS,
    OPERATION_CHAT,
    TOKEN_TYPE_INPUT,
    TOKEN_TYPE_OUTPUT,
    Attributes,
)
from cuaderno.telemetry._otel import _configured, _Instruments
from cuaderno.telemetry._spans import _CallSpan, _LiveCall, _log, _start


class ModelCallSpan(_CallSpan):
    """The handle :func:`model_call` yields. This base class is the do-nothing one.

    Use it as a context manager (``with``). Call :meth:`response` with what the gateway
    returned, or :meth:`error` with a failure the block handles itself. An exception that escapes
    the block counts as the call's error unless an outcome was already given.
    """

    __slots__ = ()

    def response(self, resp: ModelResponse) -> None:
        """Record the answer: response model, finish reason, token usage and cost.

        Args:
            resp: what the gateway returned.
        """


_NOOP_MODEL_CALL: Final = ModelCallSpan()


class _LiveModelCall(_LiveCall, ModelCallSpan):
    __slots__ = ("_provider", "_request", "_response")
    _what = "model call"

    def __init__(self, tracer: Tracer | None, instruments: _Instruments | None, request: ModelRequest,
                 run_id: str, step_id: str, provider: str | None) -> None:
        super().__init__(tracer, instruments, run_id, step_id)
        self._request = request
        self._provider = provider
        self._response: ModelResponse | None = None

    def _open(self, tracer: Tracer) -> tuple[Span | None, Token[Context] | None]:
        model = self._request.model
        attrs: Attributes = {GEN_AI_OPERATION_NAME: OPERATION_CHAT, GEN_AI_CONVERSATION_ID: self._run_id,
                             CUADERNO_RUN_ID: self._run_id, CUADERNO_STEP_ID: self._step_id}
        if model:
            attrs[GEN_AI_REQUEST_MODEL] = model
        if self._provider:
            attrs[GEN_AI_PROVIDER_NAME] = self._provider
        span, token = _start(tracer, f"{OPERATION_CHAT} {model}" if model else OPERATION_CHAT, SpanKind.CLIENT, attrs)
        if span is not None and span.is_recording():
            if self._request.max_output_tokens is not None:
                span.set_attribute(GEN_AI_REQUEST_MAX_TOKENS, self._request.max_output_tokens)
            if self._request.temperature is not None:
                span.set_attribute(GEN_AI_REQUEST_TEMPERATURE, self._request.temperature)
        return span, token

    def response(self, resp: ModelResponse) -> None:
        self._response = resp
        self._settled = True
        span = self._span
        if span is None or not span.is_recording():
            return
        try:
            span.set_attributes(_response_attributes(resp))
            for esc in resp.escalations:
                span.add_event(CUADERNO_ESCALATION_EVENT, _escalation_attributes(esc))
        except Exception:
            _log.exception("cuaderno telemetry: could not record a model response on its span")

    def _measure(self, inst: _Instruments, elapsed: float) -> None:
        base: Attributes = {GEN_AI_OPERATION_NAME: OPERATION_CHAT}
        if self._provider:
            base[GEN_AI_PROVIDER_NAME] = self._provider
        if self._request.model:
            base[GEN_AI_REQUEST_MODEL] = self._request.model
        resp = self._response
        attrs = base
        if resp is not None:
            attrs = _with_model_and_tier(base, resp.model, resp.tier)
        if self._error_type is not None:
            inst.duration.record(elapsed, {**attrs, ERROR_TYPE: self._error_type})
        else:
            inst.duration.record(elapsed, attrs)
        if resp is None:
            return
        _record_usage(inst, attrs, resp.usage, resp.cost)
        for esc in resp.escalations:
            eattrs = _with_model_and_tier(base, _str_or_none(esc.get("model")), _str_or_none(esc.get("from_tier")))
            _record_usage(inst, eattrs, Usage.from_json(esc.get("usage")), esc.get("cost"))


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _with_model_and_tier(base: Attributes, model: str | None, tier: str | None) -> Attributes:
    if not model and not tier:
        return base
    attrs = dict(base)
    if model:
        attrs[GEN_AI_RESPONSE_MODEL] = model
    if tier:
        attrs[CUADERNO_TIER] = tier
    return attrs


def _record_usage(inst: _Instruments, attrs: Attributes, usage: Usage, cost: Any) -> None:
    inst.token_usage.record(usage.input_tokens, {**attrs, GEN_AI_TOKEN_TYPE: TOKEN_TYPE_INPUT})
    inst.token_usage.record(usage.output_tokens, {**attrs, GEN_AI_TOKEN_TYPE: TOKEN_TYPE_OUTPUT})
    if cost is None:
        inst.unpriced.add(1, attrs)
    else:
        inst.cost.add(float(cost), attrs)


def _response_attributes(resp: ModelResponse) -> Attributes:
    usage = resp.usage
    attrs: Attributes = {GEN_AI_USAGE_INPUT_TOKENS: usage.input_tokens,
                         GEN_AI_USAGE_OUTPUT_TOKENS: usage.output_tokens}
    if usage.cached_tokens:
        attrs[GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] = usage.cached_tokens
    if usage.reasoning_tokens:
        attrs[GEN_AI_USAGE_REASONING_OUTPUT_TOKENS] = usage.reasoning_tokens
    if resp.model:
        attrs[GEN_AI_RESPONSE_MODEL] = resp.model
    if resp.response_id:
        attrs[GEN_AI_RESPONSE_ID] = resp.response_id
    if resp.finish_reason is not None:
        attrs[GEN_AI_RESPONSE_FINISH_REASONS] = [resp.finish_reason]
    if resp.cost is None:
        attrs[CUADERNO_UNPRICED] = True
    else:
        attrs[CUADERNO_COST_USD] = float(resp.cost)
    if resp.tier:
        attrs[CUADERNO_TIER] = resp.tier
    if resp.provider_request_id:
        attrs[CUADERNO_PROVIDER_REQUEST_ID] = resp.provider_request_id
    return attrs


def _escalation_attributes(esc: Mapping[str, Any]) -> Attributes:
    attrs: Attributes = {}
    for key in ("from_tier", "to_tier", "reason", "outcome", "model", "finish_reason"):
        value = esc.get(key)
        if isinstance(value, str):
            attrs[f"cuaderno.escalation.{key}"] = value
    usage = Usage.from_json(esc.get("usage"))
    attrs[GEN_AI_USAGE_INPUT_TOKENS] = usage.input_tokens
    attrs[GEN_AI_USAGE_OUTPUT_TOKENS] = usage.output_tokens
    cost = esc.get("cost")
    if cost is None:
        attrs[CUADERNO_UNPRICED] = True
    else:
        attrs[CUADERNO_COST_USD] = float(cost)
    return attrs


def model_call(request: ModelRequest, *, run_id: str, step_id: str, provider: str | None = None) -> ModelCallSpan:
    """Trace and measure one model call (one send through the gateway).

    Use it as a plain ``with`` block, in sync or async code, around each send (each retry is its own
    call)::

        with telemetry.model_call(request, run_id=run_id, step_id=step_id, provider="openai") as call:
            response = await gateway.complete(request, idempotency_key=key)
            call.response(response)

    A replayed response is not a call: do not wrap journal reads.

    Args:
        request: the request being sent; its ``model`` names the span.
        run_id: the run, set as ``cuaderno.run_id`` on the span.
        step_id: the step, set as ``cuaderno.step_id`` on the span.
        provider: the ``gen_ai.provider.name`` value (``openai``, ``anthropic``...), when known.

    Returns:
        A context manager whose ``__enter__`` returns the :class:`ModelCallSpan` to report to.
        With neither tracing nor metrics configured it is a shared do-nothing handle.
    """
    live = _configured()
    return _NOOP_MODEL_CALL if live is None else _LiveModelCall(*live, request, run_id, step_id, provider)
