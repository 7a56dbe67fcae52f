"""Finished OpenTelemetry spans as plain dicts (in-memory exporter), for tests and their child processes."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

__all__ = ["recording_provider", "span_dicts"]


def recording_provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    """A tracer provider that keeps every finished span in memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _value(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


def span_dicts(exporter: InMemorySpanExporter) -> list[dict[str, Any]]:
    """Every finished span, in the order they ended: ids as hex, attributes, links, status, events."""
    out = []
    for s in exporter.get_finished_spans():
        ctx = s.get_span_context()
        out.append({
            "name": s.name,
            "kind": s.kind.name,
            "trace_id": f"{ctx.trace_id:032x}",
            "span_id": f"{ctx.span_id:016x}",
            "parent": f"{s.parent.span_id:016x}" if s.parent is not None else None,
            "attributes": {k: _value(v) for k, v in (s.attributes or {}).items()},
            "links": [{"trace_id": f"{link.context.trace_id:032x}", "span_id": f"{link.context.span_id:016x}",
                       "attributes": dict(link.attributes or {})} for link in s.links],
            "status": s.status.status_code.name,
            "description": s.status.description,
            "events": [{"name": e.name, "attributes": {k: _value(v) for k, v in (e.attributes or {}).items()}}
                       for e in s.events],
        })
    return out
