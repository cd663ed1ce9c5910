"""Shared by the integrations' tests: this folder is on ``sys.path`` (pytest puts a conftest's
folder there), so ``_runner_end``, the reference both integrations' end states are compared with,
and ``_spans_seen`` are one module each for both."""

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from cuaderno import telemetry


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """cuaderno's spans, in memory, for one test (its own tracer provider, handed to cuaderno)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.configure(tracer_provider=provider)
    try:
        yield exporter
    finally:
        telemetry.configure()

