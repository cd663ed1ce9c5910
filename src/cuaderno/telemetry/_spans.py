"""What every span of cuaderno shares: the ``error.type`` of a failure, starting a span as the
current one and ending it; and what a model call's handle and a tool call's have in common (a
``with`` block that times the call, settles its outcome and records its metrics)."""

from __future__ import annotations

import logging
import time
from contextvars import Token
from types import TracebackType
from typing import ClassVar, Self

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from cuaderno.errors import GatewayError, ToolError
from cuaderno.telemetry._names import ERROR_TYPE, Attributes
from cuaderno.telemetry._otel import _Instruments

_log = logging.getLogger("cuaderno.telemetry")


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


def _mark_error(span: Span | None, exc: BaseException, etype: str, what: str) -> None:
    """Set ``error.type``, the exception event and status ``ERROR`` on ``span`` (the ``what`` span);
    a failure to do so is logged, never raised."""
    try:
        if span is not None and span.is_recording():
            span.set_attribute(ERROR_TYPE, etype)
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
    except Exception:
        _log.exception("cuaderno telemetry: could not record a %s error on its span", what)


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


class _CallSpan:
    """What the handle of a model call and of a tool call do alike; this base is the do-nothing one."""

    __slots__ = ()

    def error(self, exc: BaseException) -> None:
        """Record a failure: span status ``ERROR`` and ``error.type``.

        Args:
            exc: the failure; a :class:`~cuaderno.errors.GatewayError` or :class:`~cuaderno.errors.ToolError`
                reports its ``error_class``.
        """

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        return None


class _LiveCall(_CallSpan):
    """A call's span (when tracing) and its metrics (when measuring), from ``__enter__`` to
    ``__exit__``. An exception that escapes the block is the call's error unless an outcome was
    already given. Subclasses start their span (:meth:`_open`) and record their metrics
    (:meth:`_measure`)."""

    __slots__ = ("_error_type", "_instruments", "_run_id", "_settled", "_span", "_start", "_step_id", "_token",
                 "_tracer")
    _what: ClassVar[str]
    """What the call is, in a log line."""

    def __init__(self, tracer: Tracer | None, instruments: _Instruments | None, run_id: str, step_id: str) -> None:
        self._tracer = tracer
        self._instruments = instruments
        self._run_id = run_id
        self._step_id = step_id
        self._span: Span | None = None
        self._token: Token[Context] | None = None
        self._start = 0.0
        self._settled = False
        self._error_type: str | None = None

    def _open(self, tracer: Tracer) -> tuple[Span | None, Token[Context] | None]:
        """Start the call's span as the current one (:func:`_start`)."""
        raise NotImplementedError

    def _measure(self, inst: _Instruments, elapsed: float) -> None:
        """Record the call's metrics, ``elapsed`` seconds after it started."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        if self._tracer is not None:
            self._span, self._token = self._open(self._tracer)
        self._start = time.perf_counter()
        return self

    def error(self, exc: BaseException) -> None:
        self._settled = True
        self._error_type = error_type(exc)
        _mark_error(self._span, exc, self._error_type, self._what)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        elapsed = time.perf_counter() - self._start
        try:
            if exc is not None and not self._settled:
                self.error(exc)
            if self._instruments is not None:
                self._measure(self._instruments, elapsed)
        except Exception:
            _log.exception("cuaderno telemetry: could not record %s metrics", self._what)
        finally:
            _finish(self._span, self._token)
            self._span = None
            self._token = None
