"""telemetry: traces (``tracing``, with ``semconv``, ``propagation``, ``sampler``, ``export``),
metrics and health."""

# Span attribute names are read from sidecar.telemetry.semconv itself, the vocabulary
# module: the spans' code reads as the conventions it follows.
from sidecar.telemetry.health import Health, HealthServer
from sidecar.telemetry.metrics import SidecarMetrics, Stats, counts
from sidecar.telemetry.propagation import (
    ROOT,
    TRACEPARENT,
    continuing,
    format_traceparent,
    links,
    parse_traceparent,
)
from sidecar.telemetry.sampler import ALWAYS_EXPORTED_VERDICTS
from sidecar.telemetry.tracing import MAX_ATTRIBUTE_CHARS, Tracing

# Health.
__all__ = [
    "Health",
    "HealthServer",
]
# Metrics.
__all__ += [
    "SidecarMetrics",
    "Stats",
    "counts",
]
# Traces: the tracer, the context carried in headers, what is always exported.
__all__ += [
    "ALWAYS_EXPORTED_VERDICTS",
    "MAX_ATTRIBUTE_CHARS",
    "ROOT",
    "TRACEPARENT",
    "Tracing",
    "continuing",
    "format_traceparent",
    "links",
    "parse_traceparent",
]
