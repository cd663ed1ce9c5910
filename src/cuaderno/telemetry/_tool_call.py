"""The ``execute_tool`` span and the duration metric of one tool execution (:func:`tool_call`)."""

from __future__ import annotations

import time
from contextvars import Token
from types import TracebackType
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
from cuaderno.telemetry._otel import _Instruments, _instruments, _tracer
from cuaderno.telemetry._spans import _finish, _log, _mark_error, _start, error_type


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
