"""The sidecar's configuration: one typed, validated object, read from the environment here only.

Values come from, in rising precedence: built-in defaults, an optional RAGFlow
``service_conf.yaml`` (its ``redis:``, ``kafka:`` and ``mq:`` sections, with ``${VAR:-default}``
expansion as RAGFlow's template uses it), and environment variables. A missing, unknown or
malformed value raises :class:`~sidecar.errors.ConfigError` naming the variable. Passwords are
kept in :class:`Secret`, which never shows its value in a repr, str or log line.
"""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast
from urllib.parse import quote, unquote, urlsplit

import yaml

from sidecar.config.serve import (
    GATE_VARIABLES,
    SERVE_VARIABLES,
    GateSettings,
    ServeSettings,
    build_gate,
    build_serve,
)
from sidecar.errors import ConfigError
from sidecar.transport.options import (
    COMPRESSION_TYPES,
    RAGFLOW_REDIS_DB,
    SASL_MECHANISMS,
    SECURITY_PROTOCOLS,
    KafkaSettings,
    RedisSettings,
    Secret,
    SecurityProtocol,
)

MQBackend = Literal["redis", "kafka", "split"]

MQ_BACKENDS: tuple[str, ...] = ("redis", "kafka", "split")


@dataclass(frozen=True)
class MirrorSettings:
    """What ``ragflow-sidecar mirror`` reads, where it starts and how much it carries."""

    streams: tuple[str, ...] = ("te.1.common", "te.0.common")
    priority_streams: tuple[str, ...] = ("te.1.common", "rag_flow_svr_queue_1")
    group: str = "ragflow_kafka_mirror"
    consumer: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
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
    noise_runs: int = 0  # extra control runs; paths differing between them are noise
    compare_timeout_s: float = 300.0
    join_ttl_s: int = 7 * 86400
    # One key per processed entry: a day covers any replay, and keeps RAGFlow's small Valkey
    # (128 MB in its compose) from holding a week of them.
    dedup_ttl_s: int = 86400
    rules_file: str | None = None
    latency_tolerance_ms: float = 60000.0
    observer_interval_ms: int = 500
    instance: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    # SIDECAR_INSTANCE was given: a name that survives restarts, so the shadow consumer joins
    # its group as a static member and gets its partitions back at once after a crash.
    stable_instance: bool = False


@dataclass(frozen=True)
class MetricsSettings:
    """Where the metrics and health endpoint listens, and whether metrics also go over OTLP."""

    port: int = 9464  # SIDECAR_METRICS_PORT; 0 turns the HTTP endpoint off
    host: str = "0.0.0.0"  # SIDECAR_METRICS_HOST; the container's port is published by compose
    otlp: bool = False  # OTEL_METRICS_EXPORTER has otlp, or an OTLP endpoint is set
    # /healthz turns 503 when a loop has not turned for this long (HEALTH_WEDGED_S): above
    # the longest a handler or a produce retry may legitimately hold one turn.
    wedged_s: float = 300.0


OTEL_SAMPLERS: tuple[str, ...] = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)
OTLP_PROTOCOLS: tuple[str, ...] = ("grpc", "http/protobuf")


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


@dataclass(frozen=True)
class Settings:
    """Everything the sidecar is configured with."""

    mq_backend: MQBackend = "redis"
    redis: RedisSettings = field(default_factory=RedisSettings)
    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    mirror: MirrorSettings = field(default_factory=MirrorSettings)
    shadow: ShadowSettings = field(default_factory=ShadowSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    tracing: TracingSettings = field(default_factory=TracingSettings)
    serve: ServeSettings = field(default_factory=ServeSettings)
    gate: GateSettings = field(default_factory=GateSettings)

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        config_file: str | Path | None = None,
    ) -> Settings:
        """Build and validate the settings; the one place that reads configuration."""
        env = os.environ if environ is None else environ
        values: dict[str, _Value] = {}
        if config_file is not None:
            values.update(_read_service_conf(Path(config_file), env))
        for name in _KNOWN_VARIABLES:
            raw = env.get(name)
            if raw is not None and raw.strip() != "":
                values[name] = _Value(raw.strip(), name)
        return _build(_Reader(values))


@dataclass(frozen=True)
class _Value:
    text: str
    origin: str  # what to name in an error: the variable, or the file key it came from


class _Reader:
    """Typed access to the merged values; every error names where the bad value came from."""

    def __init__(self, values: Mapping[str, _Value]) -> None:
        self._values = values

    def origin(self, name: str) -> str:
        """The variable's name, with the file key beside it when the value came from a file."""
        value = self._values.get(name)
        if value is None or value.origin == name:
            return name
        return f"{name} ({value.origin})"

    def _error(self, name: str, problem: str) -> ConfigError:
        return ConfigError(self.origin(name), problem)

    def text(self, name: str, default: str | None) -> str | None:
        value = self._values.get(name)
        return value.text if value is not None else default

    def required_text(self, name: str, default: str) -> str:
        text = self.text(name, default)
        assert text is not None
        return text

    def integer(self, name: str, default: int, minimum: int, maximum: int | None = None) -> int:
        text = self.text(name, None)
        if text is None:
            return default
        try:
            number = int(text)
        except ValueError:
            raise self._error(name, f"{text!r} is not a whole number") from None
        if number < minimum or (maximum is not None and number > maximum):
            bound = f"from {minimum} to {maximum}" if maximum is not None else f">= {minimum}"
            raise self._error(name, f"{number} is out of range (must be {bound})")
        return number

    def number(self, name: str, default: float, minimum: float, maximum: float) -> float:
        text = self.text(name, None)
        if text is None:
            return default
        try:
            number = float(text)
        except ValueError:
            raise self._error(name, f"{text!r} is not a number") from None
        if not minimum <= number <= maximum:  # also rejects NaN
            raise self._error(name, f"{text} is out of range (must be from {minimum} to {maximum})")
        return number

    def names(self, name: str, default: tuple[str, ...]) -> tuple[str, ...]:
        text = self.text(name, None)
        if text is None:
            return default
        items = tuple(part.strip() for part in text.split(",") if part.strip())
        if not items:
            raise self._error(name, "needs at least one name")
        return items

    def choice(self, name: str, choices: tuple[str, ...], default: str, upper: bool) -> str:
        text = self.text(name, default)
        assert text is not None
        normalised = text.upper() if upper else text.lower()
        if normalised not in choices:
            raise self._error(name, f"unknown value {text!r}; expected one of {', '.join(choices)}")
        return normalised

    def error(self, name: str, problem: str) -> ConfigError:
        return self._error(name, problem)


def _build(reader: _Reader) -> Settings:
    redis_url = reader.required_text("REDIS_URL", "redis://localhost:6379/1")
    redis = RedisSettings.from_url(redis_url, variable=reader.origin("REDIS_URL"))

    servers = _parse_bootstrap(reader, reader.required_text("KAFKA_BOOTSTRAP_SERVERS", ""))
    protocol = cast(
        SecurityProtocol,
        reader.choice("KAFKA_SECURITY_PROTOCOL", SECURITY_PROTOCOLS, "PLAINTEXT", upper=True),
    )
    mechanism = reader.choice("KAFKA_SASL_MECHANISM", SASL_MECHANISMS, "PLAIN", upper=True)
    username = reader.text("KAFKA_SASL_USERNAME", None)
    password = reader.text("KAFKA_SASL_PASSWORD", None)
    if protocol.startswith("SASL_"):
        if not username:
            raise reader.error(
                "KAFKA_SASL_USERNAME", f"required when KAFKA_SECURITY_PROTOCOL={protocol}"
            )
        if not password:
            raise reader.error(
                "KAFKA_SASL_PASSWORD", f"required when KAFKA_SECURITY_PROTOCOL={protocol}"
            )
    cafile = reader.text("KAFKA_SSL_CAFILE", None)
    if cafile is not None and not Path(cafile).is_file():
        raise reader.error("KAFKA_SSL_CAFILE", f"no such file: {cafile}")
    compression = reader.choice("KAFKA_COMPRESSION_TYPE", COMPRESSION_TYPES, "gzip", upper=False)

    kafka = KafkaSettings(
        bootstrap_servers=servers,
        client_id=reader.required_text("KAFKA_CLIENT_ID", "ragflow-kafka-sidecar"),
        security_protocol=protocol,
        sasl_mechanism=mechanism,
        sasl_username=username,
        sasl_password=Secret(password) if password else None,
        ssl_cafile=cafile,
        consumer_group=reader.required_text("KAFKA_CONSUMER_GROUP", "ragflow-task-executor"),
        default_partitions=reader.integer("KAFKA_DEFAULT_PARTITIONS", 4, minimum=1),
        replication_factor=reader.integer("KAFKA_REPLICATION_FACTOR", 1, minimum=1, maximum=32),
        compression_type=None if compression == "none" else compression,
        linger_ms=reader.integer("KAFKA_LINGER_MS", 5, minimum=0, maximum=60000),
        request_timeout_ms=reader.integer("KAFKA_REQUEST_TIMEOUT_MS", 30000, minimum=1000),
    )
    backend = cast(MQBackend, reader.choice("MQ_BACKEND", MQ_BACKENDS, "redis", upper=False))
    mirror = _build_mirror(reader)
    shadow = _build_shadow(reader)
    return Settings(
        mq_backend=backend,
        redis=redis,
        kafka=kafka,
        mirror=mirror,
        shadow=shadow,
        metrics=_build_metrics(reader),
        tracing=_build_tracing(reader),
        serve=build_serve(
            reader,
            backend=backend,
            traffic_percent=mirror.traffic_percent,
            concurrency=shadow.max_concurrent_tasks,
        ),
        gate=build_gate(reader),
    )


def _build_tracing(reader: _Reader) -> TracingSettings:
    """The ``OTEL_*`` trace variables (signal-specific ones win over the general ones)."""
    defaults = TracingSettings()
    disabled = reader.choice("OTEL_SDK_DISABLED", ("true", "false"), "false", upper=False)
    exporter = reader.text("OTEL_TRACES_EXPORTER", None)
    if exporter is not None:
        exporter = reader.choice("OTEL_TRACES_EXPORTER", ("otlp", "none"), "otlp", upper=False)
    endpoint_var = next(
        (
            name
            for name in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
            if reader.text(name, None) is not None
        ),
        None,
    )
    enabled = disabled == "false" and (
        exporter == "otlp" if exporter is not None else endpoint_var is not None
    )
    protocol_var = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
    if reader.text(protocol_var, None) is None:
        protocol_var = "OTEL_EXPORTER_OTLP_PROTOCOL"
    protocol = reader.choice(protocol_var, OTLP_PROTOCOLS, "grpc", upper=False)
    grpc = protocol == "grpc"
    endpoint = "http://localhost:4317" if grpc else "http://localhost:4318/v1/traces"
    if endpoint_var is not None:
        endpoint = reader.required_text(endpoint_var, endpoint)
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise reader.error(endpoint_var, f"{endpoint!r} is not an http:// or https:// URL")
        if endpoint_var == "OTEL_EXPORTER_OTLP_ENDPOINT" and not grpc:
            endpoint = endpoint.rstrip("/") + "/v1/traces"  # the base URL of every signal
    headers_var = "OTEL_EXPORTER_OTLP_TRACES_HEADERS"
    if reader.text(headers_var, None) is None:
        headers_var = "OTEL_EXPORTER_OTLP_HEADERS"
    headers = [(key.lower(), Secret(value)) for key, value in _key_values(reader, headers_var)]
    sampler = reader.choice("OTEL_TRACES_SAMPLER", OTEL_SAMPLERS, defaults.sampler, upper=False)
    ratio = 1.0
    if sampler.endswith("traceidratio"):
        ratio = reader.number("OTEL_TRACES_SAMPLER_ARG", 1.0, 0.0, 1.0)
    redact = reader.names("TRACE_REDACT_FIELDS", defaults.redact_fields)
    resource = _key_values(reader, "OTEL_RESOURCE_ATTRIBUTES")
    return TracingSettings(
        enabled=enabled,
        endpoint=endpoint,
        protocol=protocol,
        headers=tuple(headers),
        # OTEL_SERVICE_NAME wins over a service.name in OTEL_RESOURCE_ATTRIBUTES.
        service_name=reader.required_text(
            "OTEL_SERVICE_NAME", dict(resource).get("service.name", defaults.service_name)
        ),
        resource_attributes=resource,
        sampler=sampler,
        sampler_ratio=ratio,
        redact_fields=() if redact == ("none",) else redact,
    )


def _key_values(reader: _Reader, name: str) -> tuple[tuple[str, str], ...]:
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


def _build_metrics(reader: _Reader) -> MetricsSettings:
    exporters = reader.text("OTEL_METRICS_EXPORTER", None)
    endpoint = reader.text("OTEL_EXPORTER_OTLP_ENDPOINT", None) or reader.text(
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", None
    )
    otlp = "otlp" in exporters.split(",") if exporters is not None else endpoint is not None
    return MetricsSettings(
        port=reader.integer("SIDECAR_METRICS_PORT", 9464, minimum=0, maximum=65535),
        host=reader.required_text("SIDECAR_METRICS_HOST", "0.0.0.0"),
        otlp=otlp,
        wedged_s=reader.number("HEALTH_WEDGED_S", 300.0, 1.0, 86400.0),
    )


def _build_shadow(reader: _Reader) -> ShadowSettings:
    defaults = ShadowSettings()
    rules = reader.text("COMPARE_RULES", None)
    if rules is not None and not Path(rules).is_file():
        raise reader.error("COMPARE_RULES", f"no such file: {rules}")
    return ShadowSettings(
        group=reader.required_text("SHADOW_GROUP", defaults.group),
        start=reader.choice("SHADOW_START", ("earliest", "latest"), "earliest", upper=False),
        handler=reader.required_text("SHADOW_HANDLER", defaults.handler),
        max_concurrent_tasks=reader.integer("MAX_CONCURRENT_TASKS", 5, minimum=1, maximum=1000),
        max_attempts=reader.integer("SHADOW_MAX_ATTEMPTS", 3, minimum=1, maximum=100),
        retry_backoff_ms=reader.integer("SHADOW_RETRY_BACKOFF_MS", 500, minimum=0),
        noise_runs=reader.integer("SHADOW_NOISE_RUNS", 0, minimum=0, maximum=10),
        compare_timeout_s=reader.number("SHADOW_COMPARE_TIMEOUT_S", 300.0, 0.1, 7 * 86400.0),
        join_ttl_s=reader.integer("SHADOW_JOIN_TTL_S", defaults.join_ttl_s, minimum=60),
        dedup_ttl_s=reader.integer("SHADOW_DEDUP_TTL_S", defaults.dedup_ttl_s, minimum=60),
        rules_file=rules,
        latency_tolerance_ms=reader.number(
            "COMPARE_LATENCY_TOLERANCE_MS", 60000.0, 0.0, 86400000.0
        ),
        observer_interval_ms=reader.integer("OBSERVER_INTERVAL_MS", 500, minimum=10),
        instance=reader.required_text("SIDECAR_INSTANCE", defaults.instance),
        stable_instance=reader.text("SIDECAR_INSTANCE", None) is not None,
    )


_ENTRY_ID = re.compile(r"^\d+(-\d+)?$")


def _build_mirror(reader: _Reader) -> MirrorSettings:
    defaults = MirrorSettings()
    start_text = reader.required_text("MIRROR_START", "new")
    if start_text in ("new", "$"):
        start = "$"
    elif start_text in ("earliest", "0"):
        start = "0"
    elif _ENTRY_ID.match(start_text):
        start = start_text
    else:
        raise reader.error(
            "MIRROR_START",
            f"{start_text!r} is not new, earliest or a stream entry id (1700000000000-0)",
        )
    return MirrorSettings(
        streams=reader.names("MIRROR_STREAMS", defaults.streams),
        priority_streams=reader.names("MIRROR_PRIORITY_STREAMS", defaults.priority_streams),
        group=reader.required_text("MIRROR_GROUP", defaults.group),
        consumer=reader.required_text("MIRROR_CONSUMER", defaults.consumer),
        start=start,
        claim_idle_ms=reader.integer("MIRROR_CLAIM_IDLE_MS", 60000, minimum=100),
        traffic_percent=reader.number("KAFKA_TRAFFIC_PERCENT", 100.0, 0.0, 100.0),
        batch=reader.integer("MIRROR_BATCH", 500, minimum=1, maximum=100000),
        block_ms=reader.integer("MIRROR_BLOCK_MS", 1000, minimum=1, maximum=60000),
        shutdown_grace_s=reader.number("SHUTDOWN_GRACE_S", 25.0, 0.0, 3600.0),
        status_interval_s=reader.number("STATUS_INTERVAL_S", 30.0, 0.1, 86400.0),
        routes=_parse_routes(reader),
    )


def _parse_routes(reader: _Reader) -> tuple[tuple[str, str], ...]:
    """``MIRROR_ROUTES``: a JSON object of task_type (or prefix*) to topic, over the defaults."""
    text = reader.text("MIRROR_ROUTES", None)
    if text is None:
        return ()
    try:
        table = json.loads(text)
    except json.JSONDecodeError as exc:
        raise reader.error("MIRROR_ROUTES", f"not JSON ({exc.msg})") from None
    if not isinstance(table, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and k and v for k, v in table.items()
    ):
        raise reader.error("MIRROR_ROUTES", 'must be a JSON object of names, {"raptor": "topic"}')
    return tuple(table.items())


def _parse_bootstrap(reader: _Reader, text: str) -> tuple[str, ...]:
    text = text or "localhost:9092"
    servers = []
    for item in (part.strip() for part in text.split(",")):
        host, sep, port = item.rpartition(":")
        if not item or not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise reader.error(
                "KAFKA_BOOTSTRAP_SERVERS", f"{item!r} is not host:port (e.g. kafka:9092)"
            )
        servers.append(item)
    return tuple(servers)


# service_conf.yaml key -> variable. Only the sections the seed design adds are checked for
# unknown keys: RAGFlow's own `redis:` section carries keys that are not ours.
_KAFKA_FILE_KEYS: dict[str, str] = {
    "bootstrap_servers": "KAFKA_BOOTSTRAP_SERVERS",
    "client_id": "KAFKA_CLIENT_ID",
    "security_protocol": "KAFKA_SECURITY_PROTOCOL",
    "sasl_mechanism": "KAFKA_SASL_MECHANISM",
    "sasl_username": "KAFKA_SASL_USERNAME",
    "sasl_password": "KAFKA_SASL_PASSWORD",
    "ssl_cafile": "KAFKA_SSL_CAFILE",
    "default_partitions": "KAFKA_DEFAULT_PARTITIONS",
    "replication_factor": "KAFKA_REPLICATION_FACTOR",
    "compression_type": "KAFKA_COMPRESSION_TYPE",
    "linger_ms": "KAFKA_LINGER_MS",
    "request_timeout_ms": "KAFKA_REQUEST_TIMEOUT_MS",
}
_MQ_FILE_KEYS: dict[str, str] = {
    "backend": "MQ_BACKEND",
    "consumer_group": "KAFKA_CONSUMER_GROUP",
}
_MIRROR_VARIABLES: tuple[str, ...] = (
    "MIRROR_STREAMS",
    "MIRROR_PRIORITY_STREAMS",
    "MIRROR_GROUP",
    "MIRROR_CONSUMER",
    "MIRROR_START",
    "MIRROR_CLAIM_IDLE_MS",
    "KAFKA_TRAFFIC_PERCENT",
    "MIRROR_BATCH",
    "MIRROR_BLOCK_MS",
    "SHUTDOWN_GRACE_S",
    "STATUS_INTERVAL_S",
    "MIRROR_ROUTES",
)
_SHADOW_VARIABLES: tuple[str, ...] = (
    "SHADOW_GROUP",
    "SHADOW_START",
    "SHADOW_HANDLER",
    "MAX_CONCURRENT_TASKS",
    "SHADOW_MAX_ATTEMPTS",
    "SHADOW_RETRY_BACKOFF_MS",
    "SHADOW_NOISE_RUNS",
    "SHADOW_COMPARE_TIMEOUT_S",
    "SHADOW_JOIN_TTL_S",
    "SHADOW_DEDUP_TTL_S",
    "COMPARE_RULES",
    "COMPARE_LATENCY_TOLERANCE_MS",
    "OBSERVER_INTERVAL_MS",
    "SIDECAR_INSTANCE",
)
_METRICS_VARIABLES: tuple[str, ...] = (
    "SIDECAR_METRICS_PORT",
    "HEALTH_WEDGED_S",
    "SIDECAR_METRICS_HOST",
    "OTEL_METRICS_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
)
_TRACING_VARIABLES: tuple[str, ...] = (
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
    "TRACE_REDACT_FIELDS",
)  # and OTEL_EXPORTER_OTLP_ENDPOINT, shared with the metrics
_KNOWN_VARIABLES: tuple[str, ...] = (
    "REDIS_URL",
    *_METRICS_VARIABLES,
    *_TRACING_VARIABLES,
    *_MIRROR_VARIABLES,
    *_SHADOW_VARIABLES,
    *_KAFKA_FILE_KEYS.values(),
    *_MQ_FILE_KEYS.values(),
    *SERVE_VARIABLES,
    *GATE_VARIABLES,
)

_EXPANSION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand_variables(text: str, environ: Mapping[str, str]) -> str:
    """Expand ``${VAR}`` and ``${VAR:-default}`` (default when VAR is unset or empty)."""

    def replace(match: re.Match[str]) -> str:
        value = environ.get(match.group(1), "")
        return value if value != "" else (match.group(2) or "")

    return _EXPANSION.sub(replace, text)


def _read_service_conf(path: Path, environ: Mapping[str, str]) -> dict[str, _Value]:
    label = f"--config {path}"
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(label, f"cannot read file ({exc.strerror})") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(label, f"not valid YAML ({exc})") from exc
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise ConfigError(label, "must be a YAML mapping of sections")

    values: dict[str, _Value] = {}

    def section(name: str) -> dict[str, Any]:
        body = document.get(name)
        if body is None:
            return {}
        if not isinstance(body, dict):
            raise ConfigError(f"{path.name} {name}", "must be a mapping")
        return body

    def scalar(key: str, raw: Any) -> str:
        if isinstance(raw, dict | list):
            raise ConfigError(f"{path.name} {key}", "must be a single value")
        return expand_variables(str(raw), environ).strip() if raw is not None else ""

    for prefix, keys in (("kafka", _KAFKA_FILE_KEYS), ("mq", _MQ_FILE_KEYS)):
        for key, raw in section(prefix).items():
            variable = keys.get(str(key))
            if variable is None:
                raise ConfigError(
                    f"{path.name} {prefix}.{key}",
                    f"unknown key; known keys are {', '.join(sorted(keys))}",
                )
            text = scalar(f"{prefix}.{key}", raw)
            if text:
                values[variable] = _Value(text, f"{path.name} {prefix}.{key}")

    redis = section("redis")
    if redis:
        url = _redis_url_from_section(redis, scalar)
        values["REDIS_URL"] = _Value(url, f"{path.name} redis")
    return values


def _redis_url_from_section(redis: dict[str, Any], scalar: Any) -> str:
    """RAGFlow writes ``host: 'redis:6379'`` with ``db`` and ``password`` beside it."""
    host = scalar("redis.host", redis.get("host", "localhost")) or "localhost"
    db = scalar("redis.db", redis.get("db", RAGFLOW_REDIS_DB)) or str(RAGFLOW_REDIS_DB)
    username = scalar("redis.username", redis.get("username"))
    password = scalar("redis.password", redis.get("password"))
    auth = ""
    if username or password:
        auth = f"{quote(username, safe='')}:{quote(password, safe='')}@"
    if ":" not in host:
        host = f"{host}:6379"
    return f"redis://{auth}{host}/{db}"
