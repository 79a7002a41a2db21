"""Configuration: one validated object; bad values name their variable; secrets stay hidden."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.config import KNOWN_VARIABLES, Secret, Settings, expand_variables
from sidecar.config.env import Reader, Value
from sidecar.config.service_conf import FILE_VARIABLES
from sidecar.config.settings import SHADOW, build_settings
from sidecar.errors import ConfigError


def test_defaults_follow_the_seed_design() -> None:
    settings = Settings.from_env({})
    assert settings.mq_backend == "redis"
    assert settings.kafka.bootstrap_servers == ("localhost:9092",)
    assert settings.kafka.consumer_group == "ragflow-task-executor"
    assert settings.kafka.compression_type == "gzip"
    assert settings.kafka.replication_factor == 1
    assert settings.kafka.batch_bytes == 524_288  # ours: aiokafka's 16 KiB cost a request per ~25
    assert settings.redis.db == 1  # RAGFlow's queue DB


@pytest.mark.parametrize(
    ("url", "host", "port", "db", "username", "password", "tls"),
    [
        ("redis://localhost", "localhost", 6379, 1, None, None, False),
        (
            "valkey://:infini_rag_flow@redis:6380/1",
            "redis",
            6380,
            1,
            None,
            "infini_rag_flow",
            False,
        ),
        (
            "rediss://user:p%40ss@cache.example:6390/3",
            "cache.example",
            6390,
            3,
            "user",
            "p@ss",
            True,
        ),
        ("valkeys://h/0", "h", 6379, 0, None, None, True),
    ],
)
def test_redis_url_forms(
    url: str, host: str, port: int, db: int, username: str | None, password: str | None, tls: bool
) -> None:
    redis = Settings.from_env({"REDIS_URL": url}).redis
    assert (redis.host, redis.port, redis.db, redis.username, redis.tls) == (
        host,
        port,
        db,
        username,
        tls,
    )
    assert (redis.password.reveal() if redis.password else None) == password


@pytest.mark.parametrize(
    ("environ", "variable", "fragment"),
    [
        ({"REDIS_URL": "http://localhost:6379"}, "REDIS_URL", "unsupported scheme 'http'"),
        ({"REDIS_URL": "redis://localhost/one"}, "REDIS_URL", "not a number"),
        ({"REDIS_URL": "redis://localhost:99999"}, "REDIS_URL", "not a valid URL"),
        ({"KAFKA_DEFAULT_PARTITIONS": "eight"}, "KAFKA_DEFAULT_PARTITIONS", "not a whole number"),
        ({"KAFKA_DEFAULT_PARTITIONS": "0"}, "KAFKA_DEFAULT_PARTITIONS", "out of range"),
        ({"KAFKA_BOOTSTRAP_SERVERS": "kafka"}, "KAFKA_BOOTSTRAP_SERVERS", "not host:port"),
        ({"KAFKA_BOOTSTRAP_SERVERS": "a:1,b:x"}, "KAFKA_BOOTSTRAP_SERVERS", "'b:x'"),
        ({"MQ_BACKEND": "rabbitmq"}, "MQ_BACKEND", "unknown value 'rabbitmq'"),
        ({"KAFKA_SECURITY_PROTOCOL": "TLS"}, "KAFKA_SECURITY_PROTOCOL", "unknown value"),
        ({"KAFKA_COMPRESSION_TYPE": "brotli"}, "KAFKA_COMPRESSION_TYPE", "unknown value"),
        ({"KAFKA_BATCH_BYTES": "2097152"}, "KAFKA_BATCH_BYTES", "out of range"),
        ({"KAFKA_BATCH_BYTES": "512k"}, "KAFKA_BATCH_BYTES", "not a whole number"),
        (
            {"KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "KAFKA_SASL_USERNAME": "u"},
            "KAFKA_SASL_PASSWORD",
            "required when KAFKA_SECURITY_PROTOCOL=SASL_SSL",
        ),
        (
            {"KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "KAFKA_SASL_PASSWORD": "p"},
            "KAFKA_SASL_USERNAME",
            "required",
        ),
        ({"KAFKA_SSL_CAFILE": "/nonexistent/ca.pem"}, "KAFKA_SSL_CAFILE", "no such file"),
        ({"SIDECAR_STATE_URL": "http://state:6379"}, "SIDECAR_STATE_URL", "unsupported scheme"),
        ({"SIDECAR_STATE_URL": "redis://state/one"}, "SIDECAR_STATE_URL", "not a number"),
        ({"SIDECAR_STATE_URL": "redis://:6379/0"}, "SIDECAR_STATE_URL", "has no host name"),
        ({"SIDECAR_STATE_POLL_S": "0"}, "SIDECAR_STATE_POLL_S", "out of range"),
        ({"SIDECAR_STATE_POLL_S": "15s"}, "SIDECAR_STATE_POLL_S", "not a number"),
        ({"SHADOW_SESSION_TIMEOUT_MS": "5999"}, "SHADOW_SESSION_TIMEOUT_MS", "out of range"),
        ({"SHADOW_SESSION_TIMEOUT_MS": "30s"}, "SHADOW_SESSION_TIMEOUT_MS", "not"),
    ],
)
def test_bad_values_name_the_variable(
    environ: dict[str, str], variable: str, fragment: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env(environ)
    assert caught.value.variable == variable
    assert fragment in str(caught.value)
    assert str(caught.value).startswith(variable)


def test_the_known_variables_are_the_ones_read() -> None:
    """Known and read come from one table: every known variable is read (the sampler's argument
    only for a ratio sampler), a file key sets a known one, and nothing else can be read."""
    consulted: set[str] = set()
    for environ in ({}, {"OTEL_TRACES_SAMPLER": "traceidratio"}):
        reader = Reader({k: Value(v, k) for k, v in environ.items()}, KNOWN_VARIABLES)
        build_settings(reader)
        consulted |= reader.consulted
    assert consulted == set(KNOWN_VARIABLES)
    assert set(FILE_VARIABLES) <= set(KNOWN_VARIABLES)
    with pytest.raises(LookupError):
        SHADOW.reader(Reader({}, KNOWN_VARIABLES)).text("MIRROR_BATCH", None)
    with pytest.raises(LookupError):
        Reader({}, KNOWN_VARIABLES).limited_to(["NOT_A_SIDECAR_VARIABLE"])


def test_the_served_paths_defaults() -> None:
    """Claims and done markers replaced the delivery counts: the attempts and the revoke wait
    are gone, the enqueue is bounded in time, a key's path is kept 10 s from its decision."""
    serve = Settings.from_env({}).serve
    assert (serve.enqueue_timeout_ms, serve.breaker_open_s) == (2000, 30.0)
    assert serve.produce_timeout_ms == 10000  # now only the producer's request timeout
    assert serve.max_poll_interval_ms == 3_600_000
    assert (serve.lease_s, serve.done_ttl_s, serve.sticky_s) == (300.0, 43_200, 10.0)
    assert serve.claim_refresh_s == 10.0
    assert not {"SERVE_MAX_ATTEMPTS", "SERVE_REVOKE_WAIT_S"} & set(KNOWN_VARIABLES)


@pytest.mark.parametrize(
    ("variable", "said"),
    [
        ("SERVE_CAP_REFRESH_S", "renamed SERVE_SHARE_REFRESH_S"),
        ("SERVE_MAX_ATTEMPTS", "retry_count"),
        ("SERVE_REVOKE_WAIT_S", "claims"),
        ("ROLLOUT_MIN_TASKS", "renamed ROLLOUT_MIN_DOCUMENTS"),
        ("GATE_MIN_SAMPLE", "GATE_MIN_DOCUMENTS .finished documents a path. and GATE_MIN_VERDICTS"),
    ],
)
def test_a_retired_variable_stops_the_start_naming_it(variable: str, said: str) -> None:
    """An operator's setting for an older build is refused, never silently ignored."""
    with pytest.raises(ConfigError, match=said) as caught:
        Settings.from_env({variable: "3"})
    assert caught.value.variable == variable
    Settings.from_env({variable: " "})  # set empty, as compose passes an unset one: fine


@pytest.mark.parametrize(
    ("variable", "lowest", "highest", "below", "above"),
    [
        ("SERVE_ENQUEUE_TIMEOUT_MS", "50", "60000", "49", "60001"),
        ("SERVE_BREAKER_OPEN_S", "0.1", "3600", "0.09", "3600.5"),
        ("SERVE_MAX_POLL_INTERVAL_MS", "1000", "86400000", "999", "86400001"),
        ("SERVE_LEASE_S", "1", "3600", "0.5", "3601"),
        ("SERVE_DONE_TTL_S", "600", "2592000", "599", "2592001"),
    ],
)
def test_the_served_paths_bounds_are_refused_naming_the_variable(
    variable: str, lowest: str, highest: str, below: str, above: str
) -> None:
    """Each end of the range is taken; one step past it stops RAGFlow's processes (and the
    sidecar) with the variable named."""
    for value in (lowest, highest):
        Settings.from_env({variable: value})
    for value in (below, above):
        with pytest.raises(ConfigError) as caught:
            Settings.from_env({variable: value})
        assert caught.value.variable == variable
        assert str(caught.value).startswith(f"{variable}: {value} is out of range")


def test_gate_alpha_is_a_probability_strictly_between_0_and_half() -> None:
    """GATE_ALPHA, the sequential tests' error rate: 0 could never roll back and from 0.5 on a
    roll-back is no better than a coin, so both ends are refused at start, naming it."""
    assert Settings.from_env({}).gate.alpha == 0.01
    for value in ("0.0001", "0.05", "0.499"):
        assert Settings.from_env({"GATE_ALPHA": value}).gate.alpha == float(value)
    for value in ("0", "0.5", "-0.01", "1", "nan"):
        with pytest.raises(ConfigError) as caught:
            Settings.from_env({"GATE_ALPHA": value})
        assert caught.value.variable == "GATE_ALPHA"
        assert str(caught.value).startswith(f"GATE_ALPHA: {value} is out of range"), caught.value
    with pytest.raises(ConfigError, match="GATE_ALPHA: 'one percent' is not a number"):
        Settings.from_env({"GATE_ALPHA": "one percent"})


def test_the_gates_fixed_thresholds_are_gone() -> None:
    """The sequential tests replaced them; GATE_LATENCY_FLOOR_MS replaced the p99 floor."""
    retired = {
        "GATE_MAX_FAILURE_DELTA_PP",
        "GATE_WARN_FAILURE_DELTA_PP",
        "GATE_MAX_P99_RATIO",
        "GATE_WARN_P99_RATIO",
        "GATE_P99_FLOOR_MS",
    }
    assert not retired & set(KNOWN_VARIABLES)
    assert Settings.from_env({"GATE_LATENCY_FLOOR_MS": "250"}).gate.latency_floor_ms == 250.0


def test_secrets_never_show_in_reprs() -> None:
    settings = Settings.from_env(
        {
            "REDIS_URL": "redis://:redis-pw-123@localhost:6379/1",
            "KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "KAFKA_SASL_USERNAME": "sidecar",
            "KAFKA_SASL_PASSWORD": "kafka-pw-456",
        }
    )
    text = f"{settings!r} {settings} {settings.redis.display_url} {settings.kafka}"
    assert "redis-pw-123" not in text
    assert "kafka-pw-456" not in text
    assert "***" in settings.redis.display_url
    assert settings.kafka.sasl_password == Secret("kafka-pw-456")
    assert settings.kafka.client_kwargs()["sasl_plain_password"] == "kafka-pw-456"


def test_the_state_store_defaults_to_redis_urls_server_and_db(tmp_path: Path) -> None:
    """Unset (or blank), SIDECAR_STATE_URL is REDIS_URL: zero-config keeps the state where it
    always was, also when REDIS_URL comes from service_conf.yaml."""
    for environ in (
        {"REDIS_URL": "redis://:pw@valkey.internal:6380/2"},
        {"REDIS_URL": "redis://:pw@valkey.internal:6380/2", "SIDECAR_STATE_URL": " "},
    ):
        settings = Settings.from_env(environ)
        assert settings.state == settings.redis
        state = settings.state
        assert (state.host, state.port, state.db) == ("valkey.internal", 6380, 2)
    assert Settings.from_env({}).state == Settings.from_env({}).redis
    conf = tmp_path / "service_conf.yaml"
    conf.write_text(SERVICE_CONF)
    from_file = Settings.from_env({"REDIS_HOST": "valkey.internal"}, config_file=conf)
    assert from_file.state == from_file.redis and from_file.state.host == "valkey.internal"


STATE_URLS = [
    ("redis://sidecar-state:6379/0", ("sidecar-state", 6379, 0, None, None, False)),
    ("valkey://sidecar-state", ("sidecar-state", 6379, 1, None, None, False)),
    ("rediss://user:p%40ss@state.example:6390/3", ("state.example", 6390, 3, "user", "p@ss", True)),
    ("valkeys://:s3cret@state/0", ("state", 6379, 0, None, "s3cret", True)),
]


@pytest.mark.parametrize(("url", "expected"), STATE_URLS)
def test_state_url_forms_are_redis_urls(url: str, expected: tuple[object, ...]) -> None:
    """Parsed as REDIS_URL is: the same schemes, TLS, user, password and db (1 when absent)."""
    settings = Settings.from_env(
        {"REDIS_URL": "redis://:ragflow-pw@redis:6379/1", "SIDECAR_STATE_URL": url}
    )
    state = settings.state
    password = state.password.reveal() if state.password else None
    assert (state.host, state.port, state.db, state.username, password, state.tls) == expected
    assert settings.redis.host == "redis"  # RAGFlow's Valkey is left as it was
    assert settings.state != settings.redis


def test_the_state_stores_password_never_shows() -> None:
    settings = Settings.from_env(
        {"SIDECAR_STATE_URL": "rediss://sidecar:state-pw-789@state.example:6390/0"}
    )
    text = f"{settings!r} {settings} {settings.state} {settings.state.display_url}"
    assert "state-pw-789" not in text
    assert settings.state.display_url == "rediss://sidecar:***@state.example:6390/0"
    assert settings.state.client_kwargs()["password"] == "state-pw-789"


def test_expansion_uses_default_when_unset_or_empty() -> None:
    env = {"SET": "value", "EMPTY": ""}
    assert expand_variables("${SET:-x}/${EMPTY:-d}/${UNSET:-u}/${UNSET}", env) == "value/d/u/"


SERVICE_CONF = """
ragflow:
  host: 0.0.0.0
redis:
  db: 1
  password: '${REDIS_PASSWORD:-infini_rag_flow}'
  host: '${REDIS_HOST:-redis}:6379'
kafka:
  bootstrap_servers: '${KAFKA_BOOTSTRAP_SERVERS:-kafka:9092}'
  client_id: 'ragflow-server'
  security_protocol: '${KAFKA_SECURITY_PROTOCOL:-PLAINTEXT}'
  sasl_mechanism: '${KAFKA_SASL_MECHANISM:-PLAIN}'
  sasl_username: '${KAFKA_SASL_USERNAME:-}'
  sasl_password: '${KAFKA_SASL_PASSWORD:-}'
mq:
  backend: '${MQ_BACKEND:-redis}'
  consumer_group: 'ragflow-task-executor'
"""


def test_service_conf_is_read_with_expansion_and_env_wins(tmp_path: Path) -> None:
    conf = tmp_path / "service_conf.yaml"
    conf.write_text(SERVICE_CONF)
    from_file = Settings.from_env({"REDIS_HOST": "valkey.internal"}, config_file=conf)
    assert from_file.redis.host == "valkey.internal"
    assert from_file.redis.password == Secret("infini_rag_flow")
    assert from_file.kafka.bootstrap_servers == ("kafka:9092",)
    assert from_file.kafka.client_id == "ragflow-server"
    assert from_file.mq_backend == "redis"

    overridden = Settings.from_env(
        {"KAFKA_BOOTSTRAP_SERVERS": "k1:9092,k2:9092", "MQ_BACKEND": "kafka"}, config_file=conf
    )
    assert overridden.kafka.bootstrap_servers == ("k1:9092", "k2:9092")
    assert overridden.mq_backend == "kafka"


def test_service_conf_errors_name_the_file_key(tmp_path: Path) -> None:
    conf = tmp_path / "service_conf.yaml"
    conf.write_text("kafka:\n  default_partitions: lots\n")
    with pytest.raises(ConfigError, match=r"KAFKA_DEFAULT_PARTITIONS \(service_conf.yaml"):
        Settings.from_env({}, config_file=conf)
    conf.write_text("kafka:\n  bootstrap_server: typo:9092\n")
    with pytest.raises(ConfigError, match=r"kafka\.bootstrap_server: unknown key"):
        Settings.from_env({}, config_file=conf)
    conf.write_text("kafka: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        Settings.from_env({}, config_file=conf)
    with pytest.raises(ConfigError, match="cannot read file"):
        Settings.from_env({}, config_file=tmp_path / "missing.yaml")


def test_a_crashed_shadows_partitions_move_within_45_s_by_default() -> None:
    # The session timeout plus a rebalance (about 10 s) must stay inside 45 s; heartbeats run
    # in the background, so long handlers do not need more (max_poll_interval_ms covers them).
    settings = Settings.from_env({})
    assert settings.shadow.session_timeout_ms == 30_000
    assert (
        Settings.from_env({"SHADOW_SESSION_TIMEOUT_MS": "6000"}).shadow.session_timeout_ms == 6000
    )
    # A heartbeat every third of the session, 3 s at most.
    assert settings.shadow.group_timing_ms == {
        "session_timeout_ms": 30_000,
        "heartbeat_interval_ms": 3_000,
    }
    shortest = Settings.from_env({"SHADOW_SESSION_TIMEOUT_MS": "6000"}).shadow
    assert shortest.group_timing_ms["heartbeat_interval_ms"] == 2_000
