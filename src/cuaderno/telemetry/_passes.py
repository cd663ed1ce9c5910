"""The ``invoke_agent`` span of one pass of a run (:func:`agent_pass`), and the journaled marker
through which a later pass, in any process, links to it."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from typing import Any, Final, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanContext, SpanKind, TraceFlags, Tracer

from cuaderno.events import StepEvent, numbered
from cuaderno.telemetry._names import (
    CUADERNO_LINK,
    CUADERNO_PASS,
    CUADERNO_RUN_ID,
    GEN_AI_AGENT_NAME,
    GEN_AI_CONVERSATION_ID,
    GEN_AI_OPERATION_NAME,
    GEN_AI_PROVIDER_NAME,
    GEN_AI_REQUEST_MODEL,
    OPERATION_INVOKE_AGENT,
    PASS_PHASE,
    PASS_STEP_ID,
    Attributes,
)
from cuaderno.telemetry._otel import _tracer
from cuaderno.telemetry._provider_name import provider_name
from cuaderno.telemetry._spans import _finish, _log, _mark_error, error_type

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
                    _mark_error(span, exc, error_type(exc), "pass")
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
