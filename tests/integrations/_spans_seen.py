"""What the integrations' span tests read from the in-memory exporter (the ``spans`` fixture of
this folder's conftest)."""

from __future__ import annotations

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


def span_names(exporter: InMemorySpanExporter) -> list[tuple[str, str]]:
    """Each finished span's name and step id, in the order they ended."""
    finished: tuple[ReadableSpan, ...] = exporter.get_finished_spans()
    return [(s.name, str((s.attributes or {}).get("cuaderno.step_id"))) for s in finished]
