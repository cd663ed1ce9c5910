"""The ``execute_tool`` span and the duration metric of one tool execution (:func:`tool_call`)."""

from __future__ import annotations

from contextvars import Token
from typing import Final

from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Tracer

from cuaderno.telemetry._names import (
    CUADERNO_RUN_ID,
    CUADERNO_STEP_ID,
    ERROR_TYPE,
    GEN_AI_CONVERSATION_ID,
    GEN_AI_OPERATION_NAME,
    GEN_AI_TOOL_CALL_ID,
    GEN_AI_TOOL_NAME,
    OPERATION_EXECUTE_TOOL,
    Attributes,
)
from cuaderno.telemetry._otel import _configured, _Instruments
from cuaderno.telemetry._spans import _CallSpan, _LiveCall, _start


class ToolCallSpan(_CallSpan):
    """The handle :func:`tool_call` yields. This base class is the do-nothing one.

    Call :meth:`ok` or :meth:`error`. Leaving the block normally counts as :meth:`ok`. An
    exception that escapes it counts as the error unless an outcome was already given.
    """

    __slots__ = ()

    def ok(self) -> None:
        """The tool returned a result. The span status stays ``UNSET``, as the conventions ask."""


_NOOP_TOOL_CALL: Final = ToolCallSpan()


class _LiveToolCall(_LiveCall, ToolCallSpan):
    __slots__ = ("_call_id", "_name")
    _what = "tool call"

    def __init__(self, tracer: Tracer | None, instruments: _Instruments | None, name: str, run_id: str,
                 step_id: str, call_id: str | None) -> None:
        super().__init__(tracer, instruments, run_id, step_id)
        self._name = name
        self._call_id = call_id

    def _open(self, tracer: Tracer) -> tuple[Span | None, Token[Context] | None]:
        attrs: Attributes = {GEN_AI_OPERATION_NAME: OPERATION_EXECUTE_TOOL, GEN_AI_TOOL_NAME: self._name,
                             GEN_AI_CONVERSATION_ID: self._run_id, CUADERNO_RUN_ID: self._run_id,
                             CUADERNO_STEP_ID: self._step_id}
        if self._call_id:
            attrs[GEN_AI_TOOL_CALL_ID] = self._call_id
        return _start(tracer, f"{OPERATION_EXECUTE_TOOL} {self._name}", SpanKind.INTERNAL, attrs)

    def ok(self) -> None:
        self._settled = True
        self._error_type = None

    def _measure(self, inst: _Instruments, elapsed: float) -> None:
        attrs: Attributes = {GEN_AI_OPERATION_NAME: OPERATION_EXECUTE_TOOL, GEN_AI_TOOL_NAME: self._name}
        if self._error_type is not None:
            attrs[ERROR_TYPE] = self._error_type
        inst.tool_duration.record(elapsed, attrs)


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
    live = _configured()
    return _NOOP_TOOL_CALL if live is None else _LiveToolCall(*live, name, run_id, step_id, call_id)
