"""The settings' shapes: frozen dataclasses whose defaults are the sidecar's built-in defaults.

Plain values; :mod:`sidecar.config.env` fills them from the environment. Connection options
(:class:`~sidecar.transport.options.RedisSettings`, ``KafkaSettings``) live with the clients.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Any, Literal

from sidecar.transport.options import Secret

MQBackend = Literal["redis", "kafka", "split"]

MQ_BACKENDS: tuple[str, ...] = ("redis", "kafka", "split")

OTEL_SAMPLERS: tuple[str, ...] = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)
OTLP_PROTOCOLS: tuple[str, ...] = ("grpc", "http/protobuf")


def _host_and_pid() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class MirrorSettings:
    """What ``ragflow-sidecar mirror`` reads, where it starts and how much it carries."""

    streams: tuple[str, ...] = ("te.1.common", "te.0.common")
    priority_streams: tuple[str, ...] = ("te.1.common", "rag_flow_svr_queue_1")
    group: str = "ragflow_kafka_mirror"
    consumer: str = field(default_factory=_host_and_pid)
    start: str = "$"  # XGROUP CREATE id: "$" (new), "0" (earliest) or an entry id
    claim_idle_ms: int = 60000
    traffic_percent: float = 100.0
    batch: int = 500
    block_ms: int = 1000
    shutdown_grace_s: float = 25.0
    status_interval_s: float = 30.0
    routes: tuple[tuple[str, str], ...] = ()  # (task_type pattern, topic) overrides


@dataclass(frozen=True)
class ShadowSettings:
    """What ``ragflow-sidecar shadow`` consumes, runs and how it compares the two paths."""

    group: str = "ragflow-shadow"
    start: str = "earliest"  # where a new shadow group starts in the task topics
    handler: str = "ragflow"  # ragflow, noop or package.module:callable
    max_concurrent_tasks: int = 5
    max_attempts: int = 3
    retry_backoff_ms: int = 500
    noise_runs: int = 0  # extra redis runs; paths differing between them are noise
    compare_timeout_s: float = 300.0
    join_ttl_s: int = 7 * 86400
    # One key per processed entry: a day covers any replay, and keeps RAGFlow's small Valkey
    # (128 MB in its compose) from holding a week of them.
    dedup_ttl_s: int = 86400
    # Arrivals of one side recorded in the join in one batch at most; 1: one call each.
    join_batch: int = 500
    rules_file: str | None = None
    latency_tolerance_ms: float = 60000.0
    observer_interval_ms: int = 500
    # How long the shadow's group waits for a member that stopped heartbeating before its
    # partitions move: a crashed replica's work resumes elsewhere within this and a rebalance
    # (30 s + about 10 s, inside 45 s). Heartbeats run on aiokafka's own task, so a long
    # handler never needs a long session timeout (max_poll_interval_ms covers it).
    session_timeout_ms: int = 30_000
    instance: str = field(default_factory=_host_and_pid)
    # SIDECAR_INSTANCE was given: a name that survives restarts, so the shadow consumer joins
    # its group as a static member and gets its partitions back at once after a crash.
    stable_instance: bool = False

    @property
    def group_timing_ms(self) -> dict[str, Any]:
        """The shadow consumer's session and heartbeat: a heartbeat every third of the session,
        as Kafka advises, and no slower than the client's default 3 s."""
        return {
            "session_timeout_ms": self.session_timeout_ms,
            "heartbeat_interval_ms": min(3_000, self.session_timeout_ms // 3),
        }


@dataclass(frozen=True)
class MetricsSettings:
    """Where the metrics and health endpoint listens, and whether metrics also go over OTLP."""

    port: int = 9464  # SIDECAR_METRICS_PORT; 0 turns the HTTP endpoint off
    host: str = "0.0.0.0"  # SIDECAR_METRICS_HOST; the container's port is published by compose
    otlp: bool = False  # OTEL_METRICS_EXPORTER has otlp, or an OTLP endpoint is set
    # /healthz turns 503 when a loop has not turned for this long (HEALTH_WEDGED_S): above
    # the longest a handler or a produce retry may legitimately hold one turn.
    wedged_s: float = 300.0
    # How often the state store's memory (INFO) is read for /metrics (SIDECAR_STATE_POLL_S): as
    # often as compose's Prometheus scrapes, so a scrape never shows a figure staler than that.
    state_poll_s: float = 15.0


@dataclass(frozen=True)
class TracingSettings:
    """OpenTelemetry traces, from the standard ``OTEL_*`` variables (see sidecar.telemetry.tracing).

    Off unless ``OTEL_TRACES_EXPORTER=otlp`` or an OTLP endpoint is set."""

    enabled: bool = False
    # gRPC: the collector's URL; http/protobuf: the full URL, .../v1/traces.
    endpoint: str = "http://localhost:4317"
    protocol: str = "grpc"  # grpc or http/protobuf
    headers: tuple[tuple[str, Secret], ...] = ()  # sent with each export; may hold API keys
    service_name: str = "ragflow-kafka-sidecar"
    resource_attributes: tuple[tuple[str, str], ...] = ()  # OTEL_RESOURCE_ATTRIBUTES
    sampler: str = "parentbased_always_on"
    sampler_ratio: float = 1.0  # OTEL_TRACES_SAMPLER_ARG, for the *traceidratio samplers
    redact_fields: tuple[str, ...] = ("message_dict",)  # TRACE_REDACT_FIELDS
