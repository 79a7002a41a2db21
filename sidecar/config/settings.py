"""The whole configuration, :class:`Settings`, and the variable tables of its sections.

Values come from, in rising precedence: built-in defaults (the dataclasses' own), an optional
RAGFlow ``service_conf.yaml`` (see :mod:`sidecar.config.service_conf`), and environment
variables. A missing, unknown or malformed value raises :class:`~sidecar.errors.ConfigError`
naming the variable.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from sidecar.config.env import (
    Reader,
    Table,
    Value,
    Var,
    choice,
    existing_file,
    integer,
    names,
    number,
    text,
)
from sidecar.config.model import (
    MQ_BACKENDS,
    OTEL_SAMPLERS,
    OTLP_PROTOCOLS,
    MetricsSettings,
    MirrorSettings,
    MQBackend,
    ShadowSettings,
    TracingSettings,
)
from sidecar.config.rollout import ROLLOUT, RolloutSettings, build_rollout
from sidecar.config.serve import GATE, SERVE, GateSettings, ServeSettings, build_gate, build_serve
from sidecar.config.service_conf import read_service_conf
from sidecar.errors import ConfigError
from sidecar.transport.options import (
    COMPRESSION_TYPES,
    SASL_MECHANISMS,
    SECURITY_PROTOCOLS,
    KafkaSettings,
    RedisSettings,
    Secret,
)


@dataclass(frozen=True)
class Settings:
    """Everything the sidecar is configured with."""

    mq_backend: MQBackend = "redis"
    redis: RedisSettings = field(default_factory=RedisSettings)
    # The sidecar's own keys (join, dedup, liveness, verdict counts): SIDECAR_STATE_URL, by
    # default REDIS_URL's server and db. from_env fills it; RAGFlow's keys stay on ``redis``.
    state: RedisSettings = field(default_factory=RedisSettings)
    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    mirror: MirrorSettings = field(default_factory=MirrorSettings)
    shadow: ShadowSettings = field(default_factory=ShadowSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    tracing: TracingSettings = field(default_factory=TracingSettings)
    serve: ServeSettings = field(default_factory=ServeSettings)
    gate: GateSettings = field(default_factory=GateSettings)
    rollout: RolloutSettings = field(default_factory=RolloutSettings)

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        config_file: str | Path | None = None,
    ) -> Settings:
        """Build and validate the settings; the one place that reads configuration."""
        env = os.environ if environ is None else environ
        for name, instead in RETIRED_VARIABLES.items():
            if (env.get(name) or "").strip():
                raise ConfigError(name, f"no longer read: {instead}")
        values: dict[str, Value] = {}
        if config_file is not None:
            values.update(read_service_conf(Path(config_file), env))
        for name in KNOWN_VARIABLES:
            raw = env.get(name)
            if raw is not None and raw.strip() != "":
                values[name] = Value(raw.strip(), name)
        return build_settings(Reader(values, KNOWN_VARIABLES))


def _bootstrap_servers(reader: Reader, name: str, default: Any, _: Mapping[str, Any]) -> Any:
    raw = reader.text(name, None)
    if raw is None:
        return default
    servers = []
    for item in (part.strip() for part in raw.split(",")):
        host, sep, port = item.rpartition(":")
        if not item or not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise reader.error(name, f"{item!r} is not host:port (e.g. kafka:9092)")
        servers.append(item)
    return tuple(servers)


def _sasl_login(reader: Reader, name: str, default: Any, fields: Mapping[str, Any]) -> Any:
    """KAFKA_SASL_USERNAME and _PASSWORD are required with a SASL_* security protocol."""
    login = reader.text(name, default)
    protocol = fields["security_protocol"]
    if protocol.startswith("SASL_") and not login:
        raise reader.error(name, f"required when KAFKA_SECURITY_PROTOCOL={protocol}")
    return login


def _sasl_password(reader: Reader, name: str, default: Any, fields: Mapping[str, Any]) -> Any:
    password = _sasl_login(reader, name, None, fields)
    return Secret(password) if password else None


def _compression(reader: Reader, name: str, default: Any, _: Mapping[str, Any]) -> Any:
    compression = reader.choice(name, COMPRESSION_TYPES, default or "none", upper=False)
    return None if compression == "none" else compression


# Rows are read in order, and a login's row checks the security protocol read above it.
KAFKA = Table(
    KafkaSettings,
    Var("KAFKA_BOOTSTRAP_SERVERS", "bootstrap_servers", _bootstrap_servers),
    Var("KAFKA_SECURITY_PROTOCOL", "security_protocol", choice(SECURITY_PROTOCOLS, upper=True)),
    Var("KAFKA_SASL_MECHANISM", "sasl_mechanism", choice(SASL_MECHANISMS, upper=True)),
    Var("KAFKA_SASL_USERNAME", "sasl_username", _sasl_login),
    Var("KAFKA_SASL_PASSWORD", "sasl_password", _sasl_password),
    Var("KAFKA_SSL_CAFILE", "ssl_cafile", existing_file),
    Var("KAFKA_COMPRESSION_TYPE", "compression_type", _compression),
    Var("KAFKA_CLIENT_ID", "client_id", text()),
    Var("KAFKA_CONSUMER_GROUP", "consumer_group", text()),
    Var("KAFKA_DEFAULT_PARTITIONS", "default_partitions", integer(1)),
    Var("KAFKA_REPLICATION_FACTOR", "replication_factor", integer(1, 32)),
    Var("KAFKA_LINGER_MS", "linger_ms", integer(0, 60000)),
    # Up to the broker's default message.max.bytes (1 MiB): a batch is one record batch there.
    Var("KAFKA_BATCH_BYTES", "batch_bytes", integer(1024, 1_048_576)),
    Var("KAFKA_REQUEST_TIMEOUT_MS", "request_timeout_ms", integer(1000)),
)

_ENTRY_ID = re.compile(r"^\d+(-\d+)?$")


def _mirror_start(reader: Reader, name: str, default: Any, _: Mapping[str, Any]) -> Any:
    """``new`` (``$``), ``earliest`` (``0``) or a stream entry id, as XGROUP CREATE takes it."""
    start = reader.required_text(name, default)
    if start in ("new", "$"):
        return "$"
    if start in ("earliest", "0"):
        return "0"
    if _ENTRY_ID.match(start):
        return start
    raise reader.error(
        name, f"{start!r} is not new, earliest or a stream entry id (1700000000000-0)"
    )


def _routes(reader: Reader, name: str, default: Any, _: Mapping[str, Any]) -> Any:
    """A JSON object of task_type (or prefix*) to topic, over the default routes."""
    raw = reader.text(name, None)
    if raw is None:
        return default
    try:
        routes = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise reader.error(name, f"not JSON ({exc.msg})") from None
    if not isinstance(routes, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and k and v for k, v in routes.items()
    ):
        raise reader.error(name, 'must be a JSON object of names, {"raptor": "topic"}')
    return tuple(routes.items())


MIRROR = Table(
    MirrorSettings,
    Var("MIRROR_START", "start", _mirror_start),
    Var("MIRROR_STREAMS", "streams", names()),
    Var("MIRROR_PRIORITY_STREAMS", "priority_streams", names()),
    Var("MIRROR_GROUP", "group", text()),
    Var("MIRROR_CONSUMER", "consumer", text()),
    Var("MIRROR_CLAIM_IDLE_MS", "claim_idle_ms", integer(100)),
    Var("KAFKA_TRAFFIC_PERCENT", "traffic_percent", number(0.0, 100.0)),
    Var("MIRROR_BATCH", "batch", integer(1, 100000)),
    Var("MIRROR_BLOCK_MS", "block_ms", integer(1, 60000)),
    Var("SHUTDOWN_GRACE_S", "shutdown_grace_s", number(0.0, 3600.0)),
    Var("STATUS_INTERVAL_S", "status_interval_s", number(0.1, 86400.0)),
    Var("MIRROR_ROUTES", "routes", _routes),
)


def _is_set(reader: Reader, name: str, default: Any, _: Mapping[str, Any]) -> bool:
    return reader.text(name, None) is not None


SHADOW = Table(
    ShadowSettings,
    Var("COMPARE_RULES", "rules_file", existing_file),
    Var("SHADOW_GROUP", "group", text()),
    Var("SHADOW_START", "start", choice(("earliest", "latest"))),
    Var("SHADOW_HANDLER", "handler", text()),
    Var("MAX_CONCURRENT_TASKS", "max_concurrent_tasks", integer(1, 1000)),
    Var("SHADOW_MAX_ATTEMPTS", "max_attempts", integer(1, 100)),
    Var("SHADOW_RETRY_BACKOFF_MS", "retry_backoff_ms", integer(0)),
    Var("SHADOW_NOISE_RUNS", "noise_runs", integer(0, 10)),
    Var("SHADOW_COMPARE_TIMEOUT_S", "compare_timeout_s", number(0.1, 7 * 86400.0)),
    Var("SHADOW_JOIN_TTL_S", "join_ttl_s", integer(60)),
    Var("SHADOW_DEDUP_TTL_S", "dedup_ttl_s", integer(60)),
    Var("SHADOW_JOIN_BATCH", "join_batch", integer(1, 10_000)),
    Var("COMPARE_LATENCY_TOLERANCE_MS", "latency_tolerance_ms", number(0.0, 86400000.0)),
    Var("OBSERVER_INTERVAL_MS", "observer_interval_ms", integer(10)),
    # Kafka brokers accept 6 s to 30 min by default (group.min/max.session.timeout.ms); above
    # 5 min a crashed replica's partitions wait longer than any alert's window.
    Var("SHADOW_SESSION_TIMEOUT_MS", "session_timeout_ms", integer(6000, 300_000)),
    Var("SIDECAR_INSTANCE", "instance", text()),
    Var("SIDECAR_INSTANCE", "stable_instance", _is_set),
)

METRICS = Table(
    MetricsSettings,
    Var("OTEL_METRICS_EXPORTER", "otlp"),
    Var("OTEL_EXPORTER_OTLP_ENDPOINT", "otlp"),
    Var("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "otlp"),
    Var("SIDECAR_METRICS_PORT", "port", integer(0, 65535)),
    Var("SIDECAR_METRICS_HOST", "host", text()),
    Var("HEALTH_WEDGED_S", "wedged_s", number(1.0, 86400.0)),
    Var("SIDECAR_STATE_POLL_S", "state_poll_s", number(0.1, 3600.0)),
)


def build_metrics(reader: Reader) -> MetricsSettings:
    env = METRICS.reader(reader)
    exporters = env.text("OTEL_METRICS_EXPORTER", None)
    endpoint = env.text("OTEL_EXPORTER_OTLP_ENDPOINT", None) or env.text(
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", None
    )
    otlp = "otlp" in exporters.split(",") if exporters is not None else endpoint is not None
    return METRICS.build(reader, otlp=otlp)


def _key_values(reader: Reader, name: str) -> tuple[tuple[str, str], ...]:
    """``key1=value1,key2=value2``, percent-encoded, as OTEL_*_HEADERS and the like are."""
    pairs = []
    for item in (reader.text(name, None) or "").split(","):
        key, sep, value = item.partition("=")
        if not item.strip():
            continue
        if not sep or not key.strip():
            raise reader.error(name, "must be key=value pairs separated by commas")
        pairs.append((unquote(key.strip()), unquote(value.strip())))
    return tuple(pairs)


def _sampler_ratio(reader: Reader, name: str, default: Any, fields: Mapping[str, Any]) -> Any:
    """Read for the *traceidratio samplers only; the others take no argument."""
    if fields["sampler"].endswith("traceidratio"):
        return reader.number(name, default, 0.0, 1.0)
    return default


def _redact_fields(reader: Reader, name: str, default: Any, _: Mapping[str, Any]) -> Any:
    redact = reader.names(name, default)
    return () if redact == ("none",) else redact


def _service_name(reader: Reader, name: str, default: Any, fields: Mapping[str, Any]) -> Any:
    """OTEL_SERVICE_NAME wins over a service.name in OTEL_RESOURCE_ATTRIBUTES."""
    return reader.text(name, dict(fields["resource_attributes"]).get("service.name", default))


TRACING = Table(
    TracingSettings,
    Var("OTEL_SDK_DISABLED", "enabled"),
    Var("OTEL_TRACES_EXPORTER", "enabled"),
    Var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "endpoint"),  # and "enabled", when set
    Var("OTEL_EXPORTER_OTLP_ENDPOINT", "endpoint"),
    Var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "protocol"),
    Var("OTEL_EXPORTER_OTLP_PROTOCOL", "protocol"),
    Var("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "headers"),
    Var("OTEL_EXPORTER_OTLP_HEADERS", "headers"),
    Var("OTEL_TRACES_SAMPLER", "sampler", choice(OTEL_SAMPLERS)),
    Var("OTEL_TRACES_SAMPLER_ARG", "sampler_ratio", _sampler_ratio),
    Var("TRACE_REDACT_FIELDS", "redact_fields", _redact_fields),
    Var(
        "OTEL_RESOURCE_ATTRIBUTES",
        "resource_attributes",
        lambda reader, name, default, _: _key_values(reader, name),
    ),
    Var("OTEL_SERVICE_NAME", "service_name", _service_name),
)


def _signal_variable(reader: Reader, traces: str, general: str) -> str:
    """The traces-specific variable when it is set, else the general one (OTel's precedence)."""
    return traces if reader.text(traces, None) is not None else general


def build_tracing(reader: Reader) -> TracingSettings:
    """The ``OTEL_*`` trace variables (signal-specific ones win over the general ones)."""
    env = TRACING.reader(reader)
    disabled = env.choice("OTEL_SDK_DISABLED", ("true", "false"), "false", upper=False)
    exporter = env.text("OTEL_TRACES_EXPORTER", None)
    if exporter is not None:
        exporter = env.choice("OTEL_TRACES_EXPORTER", ("otlp", "none"), "otlp", upper=False)
    endpoint_var = _signal_variable(
        env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    endpoint_set = env.text(endpoint_var, None) is not None
    enabled = disabled == "false" and (exporter == "otlp" if exporter is not None else endpoint_set)
    protocol_var = _signal_variable(
        env, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"
    )
    protocol = env.choice(protocol_var, OTLP_PROTOCOLS, "grpc", upper=False)
    grpc = protocol == "grpc"
    endpoint = "http://localhost:4317" if grpc else "http://localhost:4318/v1/traces"
    if endpoint_set:
        endpoint = env.required_text(endpoint_var, endpoint)
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise env.error(endpoint_var, f"{endpoint!r} is not an http:// or https:// URL")
        if endpoint_var == "OTEL_EXPORTER_OTLP_ENDPOINT" and not grpc:
            endpoint = endpoint.rstrip("/") + "/v1/traces"  # the base URL of every signal
    headers_var = _signal_variable(
        env, "OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS"
    )
    headers = tuple((key.lower(), Secret(value)) for key, value in _key_values(env, headers_var))
    return TRACING.build(
        reader, enabled=enabled, endpoint=endpoint, protocol=protocol, headers=headers
    )


# Settings' own: the sections are built by their tables.
CORE = Table(
    Settings,
    Var("REDIS_URL", "redis"),
    Var("SIDECAR_STATE_URL", "state"),
    Var("MQ_BACKEND", "mq_backend"),
)

# Set by an operator for an older build: refused, not silently ignored, with what replaced it.
RETIRED_VARIABLES: dict[str, str] = {
    "SERVE_CAP_REFRESH_S": "renamed SERVE_SHARE_REFRESH_S",
    "SERVE_MAX_ATTEMPTS": "RAGFlow's own retry_count abandons a task; remove it",
    "SERVE_REVOKE_WAIT_S": "claims keep a rebalance from running a task twice; remove it",
    "ROLLOUT_MIN_TASKS": "renamed ROLLOUT_MIN_DOCUMENTS (the gate counts documents, not tasks)",
    "GATE_MIN_SAMPLE": "split into GATE_MIN_DOCUMENTS (finished documents a path) and "
    "GATE_MIN_VERDICTS (judged verdicts)",
}

KNOWN_VARIABLES: tuple[str, ...] = tuple(
    dict.fromkeys(
        chain.from_iterable(
            table.names
            for table in (CORE, METRICS, TRACING, MIRROR, SHADOW, KAFKA, SERVE, GATE, ROLLOUT)
        )
    )
)


def build_settings(reader: Reader) -> Settings:
    """The settings from ``reader``'s values; each section reads through its own table."""
    env = CORE.reader(reader)
    redis_url = env.required_text("REDIS_URL", "redis://localhost:6379/1")
    redis = RedisSettings.from_url(redis_url, variable=env.origin("REDIS_URL"))
    state_url = env.text("SIDECAR_STATE_URL", None)
    # Unset: the sidecar's state stays where it always was, beside RAGFlow's queue.
    state = (
        redis
        if state_url is None
        else RedisSettings.from_url(state_url, variable=env.origin("SIDECAR_STATE_URL"))
    )
    kafka = KAFKA.build(reader)
    backend = env.choice("MQ_BACKEND", MQ_BACKENDS, "redis", upper=False)
    mirror = MIRROR.build(reader)
    shadow = SHADOW.build(reader)
    return CORE.build(
        reader,
        mq_backend=backend,
        redis=redis,
        state=state,
        kafka=kafka,
        mirror=mirror,
        shadow=shadow,
        metrics=build_metrics(reader),
        tracing=build_tracing(reader),
        serve=build_serve(
            reader,
            backend=backend,
            traffic_percent=mirror.traffic_percent,
            concurrency=shadow.max_concurrent_tasks,
        ),
        gate=build_gate(reader),
        rollout=build_rollout(reader),
    )
