"""OpenTelemetry spans and metrics for model calls and tool calls.

cuaderno depends on ``opentelemetry-api`` only. With no SDK installed or configured, every
helper here returns a shared do-nothing handle after two provider look-ups: no span, no
attribute, no clock read. Install and configure the SDK (or call :func:`configure`) and the same
calls emit telemetry that follows the OpenTelemetry GenAI semantic conventions (status
*development*, now kept in ``open-telemetry/semantic-conventions-genai``). The attribute names
are plain string constants in this module, so nothing depends on the unpinned, incubating
``opentelemetry-semantic-conventions`` package.

Spans (each carries ``gen_ai.conversation.id``, the run id):

- ``invoke_agent {gen_ai.agent.name}``, kind ``INTERNAL``, one per pass of a run (:func:`agent_pass`):
  every other span of the pass is its child, and a pass after the first links to the previous
  one through a marker journaled by it (:data:`PASS_PHASE`), in whatever process it ran.
- ``chat {gen_ai.request.model}`` (just ``chat`` when the request names no model), kind
  ``CLIENT``, one per attempt sent through the gateway. Attributes given at start (where a
  sampler can see them): ``gen_ai.operation.name="chat"``, ``gen_ai.request.model``,
  ``gen_ai.provider.name`` (:func:`provider_name`; ``TracedGateway`` always sets it), ``cuaderno.run_id``,
  ``cuaderno.step_id``; then ``gen_ai.request.max_tokens`` and ``gen_ai.request.temperature``
  when set. A response adds ``gen_ai.response.model``, ``gen_ai.response.id`` (when the provider gave one),
  ``gen_ai.response.finish_reasons``,
  ``gen_ai.usage.input_tokens`` (cached tokens included, as the conventions ask),
  ``gen_ai.usage.output_tokens`` (reasoning tokens included), and, when non-zero,
  ``gen_ai.usage.cache_read.input_tokens`` and ``gen_ai.usage.reasoning.output_tokens``. It
  also adds ``cuaderno.cost_usd`` for a priced answer or ``cuaderno.unpriced=true`` when the cost
  is ``None`` (unpriced, never free), ``cuaderno.tier`` and ``cuaderno.provider_request_id`` when
  known, and one ``cuaderno.escalation`` event per lower-tier answer a tiered gateway rejected.
- ``execute_tool {gen_ai.tool.name}``, kind ``INTERNAL``: ``gen_ai.operation.name="execute_tool"``,
  ``gen_ai.tool.name``, ``gen_ai.tool.call.id``, ``cuaderno.run_id``, ``cuaderno.step_id``.

A failure sets the span status to ``ERROR``, records the exception as a span event and sets
``error.type``. For a :class:`~cuaderno.errors.GatewayError` or :class:`~cuaderno.errors.ToolError`
that is its :class:`~cuaderno.errors.ErrorClass` value (``transient``, ``ambiguous``...). For any
other exception it is the exception's type name. Success leaves the status ``UNSET``, as the
tracing spec asks of instrumentation libraries.

Metrics (meter ``cuaderno``). Their attributes are the low-cardinality ones only:
``gen_ai.operation.name``, ``gen_ai.provider.name``, ``gen_ai.request.model``,
``gen_ai.response.model``, ``cuaderno.tier``, ``gen_ai.tool.name``, ``error.type``. Run and step
ids stay on spans.

- ``gen_ai.client.token.usage``: histogram, ``{token}``, one record per call and
  ``gen_ai.token.type`` (``input`` / ``output``).
- ``gen_ai.client.operation.duration``: histogram, ``s``; ``error.type`` on failures.
- ``gen_ai.execute_tool.duration``: histogram, ``s``, per tool execution; ``error.type`` on failures.
- ``cuaderno.model.cost``: counter, ``USD``, added to for priced calls only.
- ``cuaderno.model.unpriced_calls``: counter, ``{call}``, one per call whose cost is ``None``.

A tiered gateway's escalations were real, maybe billed calls. Their tokens and cost are recorded
in the token, cost and unpriced metrics too, under the lower tier's model and ``cuaderno.tier``, so
metric totals match the run's :class:`~cuaderno.checkpoint.Checkpoint` accounting. The span's
``gen_ai.usage.*`` and ``cuaderno.cost_usd`` describe the final answer only; escalation events
carry the rest.

Providers are looked up on every call: the ones given to :func:`configure`, else the global ones.
Nothing is captured at import time. A provider set after cuaderno was imported, or after earlier
calls, is used from the next call on, and instruments are created on the real provider, not
through the API's proxy. Telemetry never changes what the loop does: an error inside it is
logged and swallowed, and an exception from the wrapped code always propagates unchanged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, Mapping
from contextvars import Token
from types import TracebackType
from typing import Any, Final, TypeVar
from urllib.parse import urlsplit

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.context import Context
from opentelemetry.metrics import Counter, Histogram, Meter, MeterProvider
from opentelemetry.metrics import _internal as _metrics_internal
from opentelemetry.trace import Span, SpanContext, SpanKind, Status, StatusCode, TraceFlags, Tracer, TracerProvider
from opentelemetry.util.types import AttributeValue

from cuaderno.errors import GatewayError, ToolError
from cuaderno.events import StepEvent, numbered
from cuaderno.gateway.base import ModelRequest, ModelResponse, Usage
from cuaderno.gateway.scripted import ScriptedGateway
from cuaderno.gateway.tiered import TieredGateway

__all__ = [
    "AgentPassSpan",
    "ModelCallSpan",
    "ToolCallSpan",
    "agent_pass",
    "configure",
    "error_type",
    "model_call",
    "provider_name",
    "tool_call",
]

_log = logging.getLogger(__name__)

INSTRUMENTATION_NAME: Final = "cuaderno"

# -- GenAI semantic conventions (attribute and metric names, as strings) ---------------------------
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_CONVERSATION_ID: Final = "gen_ai.conversation.id"
GEN_AI_AGENT_NAME: Final = "gen_ai.agent.name"
GEN_AI_RESPONSE_ID: Final = "gen_ai.response.id"
GEN_AI_PROVIDER_NAME: Final = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_TEMPERATURE: Final = "gen_ai.request.temperature"
GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
GEN_AI_RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: Final = "gen_ai.usage.cache_read.input_tokens"
GEN_AI_USAGE_REASONING_OUTPUT_TOKENS: Final = "gen_ai.usage.reasoning.output_tokens"
GEN_AI_TOKEN_TYPE: Final = "gen_ai.token.type"
GEN_AI_TOOL_NAME: Final = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
ERROR_TYPE: Final = "error.type"

OPERATION_CHAT: Final = "chat"
OPERATION_EXECUTE_TOOL: Final = "execute_tool"
OPERATION_INVOKE_AGENT: Final = "invoke_agent"
TOKEN_TYPE_INPUT: Final = "input"
TOKEN_TYPE_OUTPUT: Final = "output"

METRIC_TOKEN_USAGE: Final = "gen_ai.client.token.usage"
METRIC_OPERATION_DURATION: Final = "gen_ai.client.operation.duration"
METRIC_TOOL_DURATION: Final = "gen_ai.execute_tool.duration"

# -- cuaderno's own names -------------------------------------------------------------------------
CUADERNO_RUN_ID: Final = "cuaderno.run_id"
CUADERNO_STEP_ID: Final = "cuaderno.step_id"
CUADERNO_COST_USD: Final = "cuaderno.cost_usd"
CUADERNO_UNPRICED: Final = "cuaderno.unpriced"
CUADERNO_TIER: Final = "cuaderno.tier"
CUADERNO_PROVIDER_REQUEST_ID: Final = "cuaderno.provider_request_id"
CUADERNO_ESCALATION_EVENT: Final = "cuaderno.escalation"
CUADERNO_PASS: Final = "cuaderno.pass"
CUADERNO_LINK: Final = "cuaderno.link"

METRIC_MODEL_COST: Final = "cuaderno.model.cost"
METRIC_UNPRICED_CALLS: Final = "cuaderno.model.unpriced_calls"

# Bucket boundaries the GenAI conventions recommend for these two histograms.
_TOKEN_BUCKETS: Final = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216,
                         67108864)
_DURATION_BUCKETS: Final = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96,
                            81.92)

Attributes = dict[str, AttributeValue]


# -- provider resolution --------------------------------------------------------------------------

class _Instruments:
    """The instruments of one meter, created once per meter provider."""

    __slots__ = ("cost", "duration", "token_usage", "tool_duration", "unpriced")

    def __init__(self, meter: Meter) -> None:
        self.token_usage: Histogram = meter.create_histogram(
            METRIC_TOKEN_USAGE, unit="{token}", description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=_TOKEN_BUCKETS)
        self.duration: Histogram = meter.create_histogram(
            METRIC_OPERATION_DURATION, unit="s", description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS)
        self.tool_duration: Histogram = meter.create_histogram(
            METRIC_TOOL_DURATION, unit="s", description="The duration of a single tool execution.",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS)
        self.cost: Counter = meter.create_counter(
            METRIC_MODEL_COST, unit="USD", description="Cost of priced model calls, in US dollars.")
        self.unpriced: Counter = meter.create_counter(
            METRIC_UNPRICED_CALLS, unit="{call}", description="Model calls whose cost is unknown (unpriced).")


class _State:
    """Which providers to use, and what was resolved from them (cached per provider object)."""

    __slots__ = ("meter_env_read", "meter_provider", "meters", "tracer_env_read", "tracer_provider", "tracers")

    def __init__(self) -> None:
        self.tracer_provider: TracerProvider | None = None
        self.meter_provider: MeterProvider | None = None
        # (provider, resolved): one tuple, replaced atomically, so threads never see a torn pair.
        self.tracers: tuple[object, Tracer | None] = (None, None)
        self.meters: tuple[object, _Instruments | None] = (None, None)
        # Whether the API's public getter ran once (it loads a provider named by
        # OTEL_PYTHON_{TRACER,METER}_PROVIDER the first time it is asked).
        self.tracer_env_read = False
        self.meter_env_read = False


_state = _State()
_MISSING: Final = object()


def configure(*, tracer_provider: TracerProvider | None = None, meter_provider: MeterProvider | None = None) -> None:
    """Use these providers instead of the global ones; pass nothing to go back to the globals.

    The global OpenTelemetry providers can be set only once per process, so tests (and
    applications that keep several pipelines) hand their providers to cuaderno here.

    Args:
        tracer_provider: where cuaderno's spans go; ``None`` means the global tracer provider.
        meter_provider: where cuaderno's metrics go; ``None`` means the global meter provider.
    """
    _state.tracer_provider = tracer_provider
    _state.meter_provider = meter_provider
    _state.tracers = (None, None)
    _state.meters = (None, None)


def _version() -> str | None:
    try:
        from importlib.metadata import version

        return version("cuaderno")
    except Exception:  # not installed as a distribution (a source checkout on sys.path)
        return None


# The API's public getters test ``name in os.environ`` on every call while no global provider is
# set, which costs about 2 us (a KeyError raised and caught inside ``os.environ``). Once the
# getter has run, the module global it reads is checked directly instead. If a later API renames
# that private global, ``getattr`` finds nothing and the public getter is used: still correct.

def _global_tracer_provider() -> TracerProvider | None:
    if _state.tracer_env_read and getattr(trace, "_TRACER_PROVIDER", _MISSING) is None:
        return None
    provider = trace.get_tracer_provider()
    _state.tracer_env_read = True
    return provider


def _global_meter_provider() -> MeterProvider | None:
    if _state.meter_env_read and getattr(_metrics_internal, "_METER_PROVIDER", _MISSING) is None:
        return None
    provider = metrics.get_meter_provider()
    _state.meter_env_read = True
    return provider


def _tracer() -> Tracer | None:
    """The tracer to use now, or ``None`` when tracing is the API's no-op."""
    provider = _state.tracer_provider
    if provider is None:
        provider = _global_tracer_provider()
        if provider is None:
            return None
    seen, tracer = _state.tracers
    if provider is seen:
        return tracer
    if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        tracer = None  # no SDK yet: the next call looks again, so a provider set later is picked up
    else:
        tracer = provider.get_tracer(INSTRUMENTATION_NAME, _version())
        if isinstance(tracer, trace.NoOpTracer):  # e.g. the SDK with OTEL_SDK_DISABLED=true
            tracer = None
    _state.tracers = (provider, tracer)
    return tracer


def _is_noop_meter_provider(provider: MeterProvider) -> bool:
    # The API's proxy for "no provider set yet" is private; its name is checked, not its type.
    # Should it ever be renamed, the proxy is merely treated as real: correct, only slower.
    return isinstance(provider, metrics.NoOpMeterProvider) or type(provider).__name__ == "_ProxyMeterProvider"


def _instruments() -> _Instruments | None:
    """The instruments to use now, or ``None`` when metrics are the API's no-op."""
    provider = _state.meter_provider
    if provider is None:
        provider = _global_meter_provider()
        if provider is None:
            return None
    seen, instruments = _state.meters
    if provider is seen:
        return instruments
    instruments = None
    if not _is_noop_meter_provider(provider):
        meter = provider.get_meter(INSTRUMENTATION_NAME, _version())
        if not isinstance(meter, metrics.NoOpMeter):
            instruments = _Instruments(meter)
    _state.meters = (provider, instruments)
    return instruments


# -- error classification -------------------------------------------------------------------------

def error_type(exc: BaseException) -> str:
    """The ``error.type`` value for an exception.

    Args:
        exc: the failure.

    Returns:
        The :class:`~cuaderno.errors.ErrorClass` value for a :class:`~cuaderno.errors.GatewayError`
        or :class:`~cuaderno.errors.ToolError`, else the exception's type name.
    """
    if isinstance(exc, (GatewayError, ToolError)):
        return exc.error_class.value
    return type(exc).__name__


def _mark_error(span: Span | None, exc: BaseException, etype: str) -> None:
    if span is not None and span.is_recording():
        span.set_attribute(ERROR_TYPE, etype)
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))


def _start(tracer: Tracer, name: str, kind: SpanKind,
           attributes: Attributes) -> tuple[Span | None, Token[Context] | None]:
    """Start a span and make it current; returns it and the context token (``None`` if not attached)."""
    try:
        span = tracer.start_span(name, kind=kind, attributes=attributes)
    except Exception:
        _log.exception("cuaderno telemetry: could not start span %r", name)
        return None, None
    token: Token[Context] | None = None
    if span.get_span_context().is_valid:
        # Attached even when not sampled, so children inherit the decision (parent-based sampling).
        token = otel_context.attach(trace.set_span_in_context(span))
    return span, token


def _finish(span: Span | None, token: Token[Context] | None) -> None:
    if span is not None:
        span.end()
    if token is not None:
        otel_context.detach(token)


# -- model calls ----------------------------------------------------------------------------------

class ModelCallSpan:
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

    def error(self, exc: BaseException) -> None:
        """Record a failure: span status ``ERROR`` and ``error.type``.

        Args:
            exc: the failure; a :class:`~cuaderno.errors.GatewayError` reports its ``error_class``.
        """

    def __enter__(self) -> ModelCallSpan:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        return None


_NOOP_MODEL_CALL: Final = ModelCallSpan()


class _LiveModelCall(ModelCallSpan):
    __slots__ = ("_error_type", "_instruments", "_provider", "_request", "_response", "_run_id", "_span",
                 "_start", "_step_id", "_token", "_tracer")

    def __init__(self, tracer: Tracer | None, instruments: _Instruments | None, request: ModelRequest,
                 run_id: str, step_id: str, provider: str | None) -> None:
        self._tracer = tracer
        self._instruments = instruments
        self._request = request
        self._run_id = run_id
        self._step_id = step_id
        self._provider = provider
        self._span: Span | None = None
        self._token: Token[Context] | None = None
        self._start = 0.0
        self._response: ModelResponse | None = None
        self._error_type: str | None = None

    def __enter__(self) -> ModelCallSpan:
        if self._tracer is not None:
            model = self._request.model
            attrs: Attributes = {GEN_AI_OPERATION_NAME: OPERATION_CHAT, GEN_AI_CONVERSATION_ID: self._run_id,
                                 CUADERNO_RUN_ID: self._run_id, CUADERNO_STEP_ID: self._step_id}
            if model:
                attrs[GEN_AI_REQUEST_MODEL] = model
            if self._provider:
                attrs[GEN_AI_PROVIDER_NAME] = self._provider
            name = f"{OPERATION_CHAT} {model}" if model else OPERATION_CHAT
            span, self._token = _start(self._tracer, name, SpanKind.CLIENT, attrs)
            self._span = span
            if span is not None and span.is_recording():
                if self._request.max_output_tokens is not None:
                    span.set_attribute(GEN_AI_REQUEST_MAX_TOKENS, self._request.max_output_tokens)
                if self._request.temperature is not None:
                    span.set_attribute(GEN_AI_REQUEST_TEMPERATURE, self._request.temperature)
        self._start = time.perf_counter()
        return self

    def response(self, resp: ModelResponse) -> None:
        self._response = resp
        span = self._span
        if span is None or not span.is_recording():
            return
        try:
            span.set_attributes(_response_attributes(resp))
            for esc in resp.escalations:
                span.add_event(CUADERNO_ESCALATION_EVENT, _escalation_attributes(esc))
        except Exception:
            _log.exception("cuaderno telemetry: could not record a model response on its span")

    def error(self, exc: BaseException) -> None:
        self._error_type = error_type(exc)
        try:
            _mark_error(self._span, exc, self._error_type)
        except Exception:
            _log.exception("cuaderno telemetry: could not record a model call error on its span")

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        elapsed = time.perf_counter() - self._start
        try:
            if exc is not None and self._response is None and self._error_type is None:
                self.error(exc)
            if self._instruments is not None:
                self._record_metrics(self._instruments, elapsed)
        except Exception:
            _log.exception("cuaderno telemetry: could not record model call metrics")
        finally:
            _finish(self._span, self._token)
            self._span = None
            self._token = None

    def _record_metrics(self, inst: _Instruments, elapsed: float) -> None:
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
    tracer = _tracer()
    instruments = _instruments()
    if tracer is None and instruments is None:
        return _NOOP_MODEL_CALL
    return _LiveModelCall(tracer, instruments, request, run_id, step_id, provider)


# -- tool calls -----------------------------------------------------------------------------------

class ToolCallSpan:
    """The handle :func:`tool_call` yields. This base class is the do-nothing one.

    Call :meth:`ok` or :meth:`error`. Leaving the block normally counts as :meth:`ok`. An
    exception that escapes it counts as the error unless an outcome was already given.
    """

    __slots__ = ()

    def ok(self) -> None:
        """The tool returned a result. The span status stays ``UNSET``, as the conventions ask."""

    def error(self, exc: BaseException) -> None:
        """Record a failure: span status ``ERROR`` and ``error.type``.

        Args:
            exc: the failure; a :class:`~cuaderno.errors.ToolError` reports its ``error_class``.
        """

    def __enter__(self) -> ToolCallSpan:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        return None


_NOOP_TOOL_CALL: Final = ToolCallSpan()


class _LiveToolCall(ToolCallSpan):
    __slots__ = ("_call_id", "_error_type", "_instruments", "_name", "_run_id", "_settled", "_span", "_start",
                 "_step_id", "_token", "_tracer")

    def __init__(self, tracer: Tracer | None, instruments: _Instruments | None, name: str, run_id: str,
                 step_id: str, call_id: str | None) -> None:
        self._tracer = tracer
        self._instruments = instruments
        self._name = name
        self._run_id = run_id
        self._step_id = step_id
        self._call_id = call_id
        self._span: Span | None = None
        self._token: Token[Context] | None = None
        self._start = 0.0
        self._settled = False
        self._error_type: str | None = None

    def __enter__(self) -> ToolCallSpan:
        if self._tracer is not None:
            attrs: Attributes = {GEN_AI_OPERATION_NAME: OPERATION_EXECUTE_TOOL, GEN_AI_TOOL_NAME: self._name,
                                 GEN_AI_CONVERSATION_ID: self._run_id, CUADERNO_RUN_ID: self._run_id,
                                 CUADERNO_STEP_ID: self._step_id}
            if self._call_id:
                attrs[GEN_AI_TOOL_CALL_ID] = self._call_id
            self._span, self._token = _start(self._tracer, f"{OPERATION_EXECUTE_TOOL} {self._name}",
                                             SpanKind.INTERNAL, attrs)
        self._start = time.perf_counter()
        return self

    def ok(self) -> None:
        self._settled = True
        self._error_type = None

    def error(self, exc: BaseException) -> None:
        self._settled = True
        self._error_type = error_type(exc)
        try:
            _mark_error(self._span, exc, self._error_type)
        except Exception:
            _log.exception("cuaderno telemetry: could not record a tool error on its span")

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        elapsed = time.perf_counter() - self._start
        try:
            if exc is not None and not self._settled:
                self.error(exc)
            if self._instruments is not None:
                attrs: Attributes = {GEN_AI_OPERATION_NAME: OPERATION_EXECUTE_TOOL, GEN_AI_TOOL_NAME: self._name}
                if self._error_type is not None:
                    attrs[ERROR_TYPE] = self._error_type
                self._instruments.tool_duration.record(elapsed, attrs)
        except Exception:
            _log.exception("cuaderno telemetry: could not record tool call metrics")
        finally:
            _finish(self._span, self._token)
            self._span = None
            self._token = None


def tool_call(name: str, *, run_id: str, step_id: str, call_id: str | None = None) -> ToolCallSpan:
    """Trace and measure one execution of a tool body.

    Use it as a plain ``with`` block, in sync or async code::

        with telemetry.tool_call(call.name, run_id=run_id, step_id=step_id, call_id=call.id) as span:
            value = await tool.invoke(kwargs, ctx)

    Args:
        name: the tool's name (``gen_ai.tool.name``; it names the span).
        run_id: the run, set as ``cuaderno.run_id`` on the span.
        step_id: the step, set as ``cuaderno.step_id`` on the span.
        call_id: the model's tool call id (``gen_ai.tool.call.id``), when there is one.

    Returns:
        A context manager whose ``__enter__`` returns the :class:`ToolCallSpan` to report to.
        With neither tracing nor metrics configured it is a shared do-nothing handle.
    """
    tracer = _tracer()
    instruments = _instruments()
    if tracer is None and instruments is None:
        return _NOOP_TOOL_CALL
    return _LiveToolCall(tracer, instruments, name, run_id, step_id, call_id)


# -- provider names -------------------------------------------------------------------------------

# Hosts of the providers the GenAI conventions name (their well-known ``gen_ai.provider.name``).
_KNOWN_HOSTS: Final = {
    "api.openai.com": "openai",
    "api.anthropic.com": "anthropic",
    "generativelanguage.googleapis.com": "gcp.gemini",
    "api.deepseek.com": "deepseek",
    "api.mistral.ai": "mistral_ai",
    "api.groq.com": "groq",
    "api.x.ai": "x_ai",
    "api.perplexity.ai": "perplexity",
    "api.cohere.com": "cohere",
}
_KNOWN_HOST_SUFFIXES: Final = ((".openai.azure.com", "azure.ai.openai"),)


def provider_name(gateway: object) -> str:
    """The ``gen_ai.provider.name`` of a gateway; never empty.

    An HTTP gateway (its ``endpoint`` is a URL) is named by the host it sends to: a provider the
    GenAI conventions list by its well-known name (``openai``, ``anthropic``, ``azure.ai.openai``...),
    any other (an OpenAI-compatible server, a proxy) by its host name, so two local servers stay
    apart. A :class:`~cuaderno.gateway.scripted.ScriptedGateway` is ``scripted``; a tiered
    gateway is its tiers' provider (``a+b`` when they differ); any other gateway is its own
    ``provider_name`` attribute, else its class name.

    Args:
        gateway: the session's gateway.

    Returns:
        The provider name.
    """
    if isinstance(gateway, ScriptedGateway):
        return "scripted"
    if isinstance(gateway, TieredGateway):
        names = dict.fromkeys((provider_name(gateway.cheap), provider_name(gateway.strong)))
        return "+".join(names)
    endpoint = getattr(gateway, "endpoint", None)
    if isinstance(endpoint, str) and endpoint:
        host = (urlsplit(endpoint).hostname or "").rstrip(".")
        if host:
            known = _KNOWN_HOSTS.get(host)
            if known is None:
                known = next((name for suffix, name in _KNOWN_HOST_SUFFIXES if host.endswith(suffix)), host)
            return known
    declared = getattr(gateway, "provider_name", None)
    if isinstance(declared, str) and declared:
        return declared
    return type(gateway).__name__


# -- run passes -----------------------------------------------------------------------------------

PASS_STEP_ID: Final = "run"
PASS_PHASE: Final = "pass"
"""A pass marker is the journal event ``("run", "pass")``, then ``pass.2``, ``pass.3``... (kind
``run``). Its payload, ``{"trace_id", "span_id"}`` (lowercase hex), names the ``invoke_agent``
span of the pass that wrote it, so a later pass (in any process) links to it. Replay reads none
of it: the checkpoint's projection ignores the phase, and the loop replays only model, tool and
final steps."""

_T = TypeVar("_T")


class AgentPassSpan:
    """The handle :func:`agent_pass` returns. This base class is the do-nothing one."""

    __slots__ = ()

    def drive(self, steps: AsyncGenerator[_T, None]) -> AsyncGenerator[_T, None]:
        """The pass's steps, each produced inside the pass's span (the do-nothing handle returns
        ``steps`` itself: no generator more per step)."""
        return steps

    def opened(self, journal: dict[tuple[str, str], StepEvent]) -> StepEvent | None:
        """The run is open: link the span to the previous pass's (found in ``journal``, keyed by
        ``(step_id, phase)``) and return this pass's marker, to commit with the pass's first
        write (``None``: nothing to write)."""
        return None


_NOOP_PASS: Final = AgentPassSpan()


class _LivePass(AgentPassSpan):
    __slots__ = ("_agent", "_gateway", "_model", "_run_id", "_span", "_tracer")

    def __init__(self, tracer: Tracer, agent: str, run_id: str, model: str | None, gateway: object) -> None:
        self._tracer = tracer
        self._agent = agent
        self._run_id = run_id
        self._model = model
        self._gateway = gateway
        self._span: Span | None = None

    def _start(self) -> Span | None:
        attrs: Attributes = {GEN_AI_OPERATION_NAME: OPERATION_INVOKE_AGENT, GEN_AI_AGENT_NAME: self._agent,
                             GEN_AI_CONVERSATION_ID: self._run_id, CUADERNO_RUN_ID: self._run_id}
        try:
            attrs[GEN_AI_PROVIDER_NAME] = provider_name(self._gateway)
            if self._model:
                attrs[GEN_AI_REQUEST_MODEL] = self._model
            return self._tracer.start_span(f"{OPERATION_INVOKE_AGENT} {self._agent}", kind=SpanKind.INTERNAL,
                                           attributes=attrs)
        except Exception:
            _log.exception("cuaderno telemetry: could not start the invoke_agent span")
            return None

    async def drive(self, steps: AsyncGenerator[_T, None]) -> AsyncGenerator[_T, None]:
        # Current only while the loop runs (each __anext__), not while the caller holds a step:
        # the caller's own spans between two steps are not the pass's children, and a token is
        # always detached in the context it was attached in.
        span = self._span = self._start()
        ctx = trace.set_span_in_context(span) if span is not None else None
        try:
            while True:
                token = otel_context.attach(ctx) if ctx is not None else None
                try:
                    step = await steps.__anext__()
                except StopAsyncIteration:
                    return
                except BaseException as exc:
                    if span is not None:
                        try:
                            _mark_error(span, exc, error_type(exc))
                        except Exception:
                            _log.exception("cuaderno telemetry: could not record a pass error on its span")
                    raise
                finally:
                    if token is not None:
                        otel_context.detach(token)
                yield step
        finally:
            token = otel_context.attach(ctx) if ctx is not None else None
            try:
                await steps.aclose()  # the loop's clean-up commits (a flush) belong to the pass too
            finally:
                if token is not None:
                    otel_context.detach(token)
                _finish(span, None)

    def opened(self, journal: dict[tuple[str, str], StepEvent]) -> StepEvent | None:
        span = self._span
        if span is None:
            return None
        try:
            earlier = numbered(journal, PASS_STEP_ID, PASS_PHASE)
            if earlier:
                link = _span_context(earlier[-1].payload)
                if link is not None:
                    span.add_link(link, {CUADERNO_LINK: "previous_pass"})
            n = len(earlier) + 1
            span.set_attribute(CUADERNO_PASS, n)
            ctx = span.get_span_context()
            if not span.is_recording() or not ctx.is_valid:
                return None  # a later pass would link to a span no backend has
            return StepEvent(run_id=self._run_id, step_id=PASS_STEP_ID, phase=PASS_PHASE if n == 1 else f"{PASS_PHASE}.{n}",
                             kind="run", payload={"trace_id": format(ctx.trace_id, "032x"),
                                                  "span_id": format(ctx.span_id, "016x")})
        except Exception:
            _log.exception("cuaderno telemetry: could not link the pass to the previous one")
            return None


def _span_context(payload: Mapping[str, Any]) -> SpanContext | None:
    """The span context a pass marker names, or ``None`` if it names none (hand-edited, damaged)."""
    try:
        trace_id, span_id = int(str(payload["trace_id"]), 16), int(str(payload["span_id"]), 16)
    except (KeyError, TypeError, ValueError):
        return None
    found = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return found if found.is_valid else None


def agent_pass(agent: str, *, run_id: str, model: str | None, gateway: object) -> AgentPassSpan:
    """Trace one pass of a run: one call of ``agent.run`` that drives it (the first, a resumed one).

    The ``invoke_agent {agent}`` span (kind ``INTERNAL``) covers the pass from opening the run to
    its last step, and every ``chat`` and ``execute_tool`` span of the pass is its child. It
    carries ``gen_ai.operation.name="invoke_agent"``, ``gen_ai.agent.name``,
    ``gen_ai.conversation.id`` (the run id), ``gen_ai.provider.name``, ``gen_ai.request.model``
    and ``cuaderno.pass`` (1 for the first pass). A pass after the first links to the previous
    traced pass, whichever process ran it, through the marker the previous one journaled (see
    :data:`PASS_PHASE`)::

        span = telemetry.agent_pass(agent.name, run_id=run_id, model=agent.model, gateway=gateway)
        async for step in span.drive(loop_steps()):  # the loop calls span.opened(journal) once open
            ...

    Args:
        agent: the agent's name.
        run_id: the run (``gen_ai.conversation.id``).
        model: the model the agent asks for, if it names one.
        gateway: the session's gateway (:func:`provider_name` names it, only when tracing).

    Returns:
        The handle; with no tracer configured, a shared do-nothing one.
    """
    tracer = _tracer()
    if tracer is None:
        return _NOOP_PASS
    return _LivePass(tracer, agent, run_id, model, gateway)
