"""telemetry: traces (``tracing``, with ``semconv``, ``propagation``, ``sampler``, ``export``),
metrics and health."""

from sidecar.telemetry.health import Health, HealthServer
from sidecar.telemetry.metrics import SidecarMetrics, Stats, counts
from sidecar.telemetry.propagation import (
    ROOT,
    TRACEPARENT,
    format_traceparent,
    links,
    parse_traceparent,
)
from sidecar.telemetry.sampler import ALWAYS_EXPORTED_VERDICTS
from sidecar.telemetry.semconv import (
    BATCH_COUNT,
    CONSUMER_GROUP,
    DESTINATION,
    KAFKA_OFFSET,
    MESSAGE_ID,
    OPERATION_NAME,
    OPERATION_TYPE,
    PARTITION,
    SYSTEM,
    SYSTEM_KAFKA,
    SYSTEM_REDIS,
    TASK_ID,
    TASK_TYPE,
    VERDICT,
)
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
    "format_traceparent",
    "links",
    "parse_traceparent",
]
# Span attribute names (OpenTelemetry's messaging conventions and ours).
__all__ += [
    "BATCH_COUNT",
    "CONSUMER_GROUP",
    "DESTINATION",
    "KAFKA_OFFSET",
    "MESSAGE_ID",
    "OPERATION_NAME",
    "OPERATION_TYPE",
    "PARTITION",
    "SYSTEM",
    "SYSTEM_KAFKA",
    "SYSTEM_REDIS",
    "TASK_ID",
    "TASK_TYPE",
    "VERDICT",
]
