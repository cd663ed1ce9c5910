"""What every span of cuaderno shares: the ``error.type`` of a failure, and starting a span as the
current one and ending it."""

from __future__ import annotations

import logging
from contextvars import Token

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from cuaderno.errors import GatewayError, ToolError
from cuaderno.telemetry._names import ERROR_TYPE, Attributes

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
