"""The Helm chart (compose/helm/ragflow-kafka-sidecar/) rendered, checked without a cluster.

Helm is the one `make helm` builds from the Go module proxy (``HELM``, or the cache path the
Makefile uses); a missing one fails these tests, never skips them. Every manifest rendered from
the three values files in the chart's ``ci/`` is validated against the Kubernetes OpenAPI schemas
that ``kubernetes-validate`` bundles (no download at test time), on the oldest Kubernetes the
chart supports and the newest bundled. The Prometheus operator's kinds have no bundled schema:
the PrometheusRule's groups go through ``promtool check rules`` and must be compose/alerts.yml,
the ServiceMonitor must select the Service's port. Every variable a pod gets is a setting of the
sidecar, and the whole environment passes the sidecar's own validation. The values the chart
refuses and RAGFlow's side: tests/test_helm_values.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

import sidecar.config as sidecar_settings
import tests.helm_support as chart
from sidecar.config import Settings
from tests.helm_support import (
    ALERTS,
    CHART,
    CI_VALUES,
    DASHBOARDS,
    KUBERNETES_VERSIONS,
    OTEL_SDK_VARIABLES,
    POD_NAME,
    SECRET_VALUES,
)

# Every test renders or lints the chart with Helm (tests/tiers.py).
pytestmark = pytest.mark.servers


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {name: chart.manifests(chart.template(path)) for name, path in CI_VALUES.items()}


def test_helm_lint_strict_passes_on_every_values_file() -> None:
    for name, path in CI_VALUES.items():
        result = chart.run("lint", "--strict", str(CHART), "-f", str(path))
        assert result.returncode == 0, f"{name}: {result.stdout}{result.stderr}"


@pytest.mark.parametrize("name", sorted(CI_VALUES))
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_is_valid_against_the_kubernetes_schemas(
    rendered: dict[str, list[dict[str, Any]]], name: str, version: str
) -> None:
    operator_kinds = {"ServiceMonitor", "PrometheusRule"}
    validated = 0
    for manifest in rendered[name]:
        if manifest["kind"] in operator_kinds:
            continue  # no bundled schema: checked by the tests below
        try:
            kubernetes_validate.validate(manifest, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{name}: {manifest['kind']}/{manifest['metadata']['name']}: {error}")
        validated += 1
    assert validated >= 7, [m["kind"] for m in rendered[name]]


def test_the_schema_validation_refuses_a_manifest_kubernetes_would(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    deployment = chart.part(rendered["minimal"], "StatefulSet", "sidecar")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    broken = {**deployment, "spec": {**deployment["spec"], "template": {"spec": {"containers": [{**container, "livenessProbe": {"httpGet": {"path": "/healthz"}}}]}}}}  # fmt: skip
    with pytest.raises(kubernetes_validate.ValidationError, match="port"):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[-1], strict=True)
    unknown = {**deployment, "spec": {**deployment["spec"], "replica": 1}}
    with pytest.raises(kubernetes_validate.ValidationError, match="replica"):
        kubernetes_validate.validate(unknown, KUBERNETES_VERSIONS[-1], strict=True)


def test_the_parts_each_values_file_renders(rendered: dict[str, list[dict[str, Any]]]) -> None:
    kinds = {name: sorted(m["kind"] for m in manifests) for name, manifests in rendered.items()}
    for name in CI_VALUES:
        for kind in ("StatefulSet", "Service", "Job", "PodDisruptionBudget", "NetworkPolicy"):
            assert kind in kinds[name], (name, kind)
        assert kinds[name].count("ConfigMap") == 2  # the two dashboards
        assert "ServiceMonitor" in kinds[name] and "PrometheusRule" in kinds[name]
    # The autopilot is off and the state store absent unless asked for.
    assert "Deployment" not in kinds["minimal"] and kinds["minimal"].count("StatefulSet") == 1
    assert kinds["production"].count("StatefulSet") == 2
    rollout = chart.part(rendered["autopilot"], "Deployment", "rollout")
    assert rollout["spec"]["replicas"] == 2
    assert rollout["spec"]["template"]["spec"]["containers"][0]["args"] == ["rollout", "run"]


def test_the_operator_kinds_render_only_where_their_api_exists() -> None:
    kinds = {m["kind"] for m in chart.manifests(chart.template(CI_VALUES["production"], apis=()))}
    assert not kinds & {"ServiceMonitor", "PrometheusRule"}
    assert {"StatefulSet", "ConfigMap"} <= kinds


def test_run_has_its_probes_on_the_metrics_port_and_a_stable_name_per_pod(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for manifests in rendered.values():
        run = chart.part(manifests, "StatefulSet", "sidecar")
        # A pod keeps its name through restarts: one process per mirror consumer and shadow
        # member name, replaced in place by a rolling update.
        assert run["spec"]["updateStrategy"] == {"type": "RollingUpdate"}
        assert run["spec"]["replicas"] == 1
        (container,) = run["spec"]["template"]["spec"]["containers"]
        assert container["args"] == ["run"]
        names = {e["name"]: e.get("valueFrom") for e in container["env"]}
        pod_name = {"fieldRef": {"fieldPath": "metadata.name"}}
        assert names["SIDECAR_INSTANCE"] == names["MIRROR_CONSUMER"] == pod_name
        (port,) = container["ports"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert (
            port["name"] == "metrics" and str(port["containerPort"]) == env["SIDECAR_METRICS_PORT"]
        )
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
        assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
        # SHUTDOWN_GRACE_S to finish the batch, then closing: the kubelet waits longer.
        grace = float(env.get("SHUTDOWN_GRACE_S") or 25)
        assert run["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= grace + 10
        service = chart.part(manifests, "Service", "sidecar")
        assert run["spec"]["serviceName"] == service["metadata"]["name"]
        assert service["spec"]["ports"][0]["targetPort"] == "metrics"
        assert service["spec"]["selector"].items() <= run["spec"]["template"]["metadata"]["labels"].items()  # fmt: skip


def test_two_replicas_of_run_each_take_their_pods_name() -> None:
    manifests = chart.manifests(chart.template(CI_VALUES["minimal"], sets=("sidecar.replicas=2",)))
    assert chart.part(manifests, "StatefulSet", "sidecar")["spec"]["replicas"] == 2


def test_init_topics_is_a_hook_before_install_and_upgrade(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    (job,) = chart.kind(rendered["minimal"], "Job")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    spec = job["spec"]["template"]["spec"]
    assert spec["restartPolicy"] == "Never"
    assert spec["containers"][0]["args"] == ["init-topics"]
    # A pre-install hook runs before the release's own objects exist: it may only read what the
    # site created beforehand (existing Secrets), never a ConfigMap or Secret of this chart.
    names = {m["metadata"]["name"] for m in rendered["production"] if m["kind"] in ("ConfigMap", "Secret")}  # fmt: skip
    (job,) = chart.kind(rendered["production"], "Job")
    refs = json.dumps(job["spec"])
    assert not [name for name in names if f'"{name}"' in refs]


def test_the_state_store_never_evicts_and_keeps_an_append_only_file(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    store = chart.part(rendered["production"], "StatefulSet", "state-store")
    assert store["spec"]["replicas"] == 1
    args = store["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
    assert args[args.index("--appendonly") + 1] == "yes"
    assert args[args.index("--maxmemory") + 1] == "512mb"
    assert store["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "5Gi"  # fmt: skip
    # Every sidecar pod points at it, through its Service.
    services = {s["metadata"]["name"]: s for s in chart.kind(rendered["production"], "Service")}
    for container in chart.sidecar_containers(rendered["production"]):
        url = next(e["value"] for e in container["env"] if e["name"] == "SIDECAR_STATE_URL")
        host = re.match(r"redis://([^.]+)\.ragflow\.svc:6379/0$", url)
        assert host and host.group(1) == store["metadata"]["name"] and host.group(1) in services
    # Reached by the sidecar's pods and RAGFlow's only.
    (policy,) = [p for p in chart.kind(rendered["production"], "NetworkPolicy") if p["spec"]["podSelector"]["matchLabels"].get("app.kubernetes.io/component") == "state-store"]  # fmt: skip
    sources = [rule["podSelector"]["matchLabels"] for rule in policy["spec"]["ingress"][0]["from"]]
    assert {
        "app.kubernetes.io/name": "ragflow",
        "app.kubernetes.io/component": "ragflow",
    } in sources


def _environment(container: dict[str, Any], files: Path) -> dict[str, str]:
    """The container's environment as the sidecar would see it: secrets by stand-ins, and the
    files the settings name (the CA bundle, the rules) created, since the settings check them."""
    env: dict[str, str] = {}
    for item in container["env"]:
        name = item["name"]
        if "valueFrom" in item and "fieldRef" in item["valueFrom"]:
            assert item["valueFrom"]["fieldRef"] == {"fieldPath": "metadata.name"}, item
            env[name] = POD_NAME
        elif "valueFrom" in item:
            assert set(item["valueFrom"]) == {"secretKeyRef"}, item
            env[name] = SECRET_VALUES[name]
        else:
            env[name] = item["value"]
    for name in ("KAFKA_SSL_CAFILE", "COMPARE_RULES"):
        if name in env:
            path = files / Path(env[name]).name
            path.write_text("rules: []\n" if name == "COMPARE_RULES" else "", encoding="utf-8")
            env[name] = str(path)
    return env


@pytest.mark.parametrize("name", sorted(CI_VALUES))
def test_every_variable_rendered_is_a_setting_and_the_sidecar_accepts_them(
    rendered: dict[str, list[dict[str, Any]]], name: str, tmp_path: Path
) -> None:
    known = set(sidecar_settings.KNOWN_VARIABLES) | OTEL_SDK_VARIABLES
    containers = list(chart.sidecar_containers(rendered[name]))
    assert len(containers) >= 2  # run and init-topics at least
    environments = [_environment(container, tmp_path) for container in containers]
    for container, env in zip(containers, environments, strict=True):
        unknown = set(env) - known
        assert not unknown, f"{container['name']}: not settings of the sidecar: {sorted(unknown)}"
        assert len(env) == len(container["env"]), "a variable twice"
        settings = Settings.from_env(environ=env)
        assert settings.shadow.stable_instance and settings.shadow.instance == POD_NAME
        assert settings.mirror.consumer == POD_NAME
    # run, rollout and init-topics read one configuration.
    assert all(env == environments[0] for env in environments)
    values = yaml.safe_load(CI_VALUES[name].read_text(encoding="utf-8"))
    settings = Settings.from_env(environ=environments[0])
    expected = values.get("settings", {})
    assert settings.mirror.traffic_percent == expected.get("KAFKA_TRAFFIC_PERCENT", 0)
    assert settings.serve.percent == expected.get("KAFKA_SERVE_PERCENT", 0)


def test_large_and_fractional_numbers_reach_the_sidecar_as_written(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    # Helm reads numbers as floats; 1000000 must not become 1e+06, nor 12.5 become 12.
    (container, *_) = chart.sidecar_containers(rendered["production"])
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["SHADOW_JOIN_TTL_S"] == "1000000"
    assert env["GATE_LATENCY_FLOOR_MS"] == "3600000"
    assert env["KAFKA_SERVE_PERCENT"] == "12.5"
    assert env["OTEL_TRACES_SAMPLER_ARG"] == "0.1"
    (container, *_) = chart.sidecar_containers(rendered["autopilot"])
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["ROLLOUT_STEPS"] == "1,5,25,50,100"


def test_secrets_come_from_existing_secrets_never_from_values(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    assert not chart.kind(rendered["production"], "Secret")
    for container in chart.sidecar_containers(rendered["production"]):
        refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"] if "secretKeyRef" in e.get("valueFrom", {})}  # fmt: skip
        assert refs == {
            "REDIS_URL": {"name": "ragflow-sidecar-redis", "key": "REDIS_URL"},
            "KAFKA_SASL_USERNAME": {"name": "ragflow-sidecar-kafka", "key": "username"},
            "KAFKA_SASL_PASSWORD": {"name": "ragflow-sidecar-kafka", "key": "password"},
        }
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert str(Path(env["KAFKA_SSL_CAFILE"]).parent) in mounts
        assert str(Path(env["COMPARE_RULES"]).parent) in mounts


def test_the_prometheus_rule_is_compose_alerts_and_promtool_accepts_it(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    (rule,) = chart.kind(rendered["production"], "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(rule["spec"]), encoding="utf-8")
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed: run `make system-deps`"
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_service_monitor_scrapes_the_services_metrics_port(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    (monitor,) = chart.kind(rendered["production"], "ServiceMonitor")
    (service,) = [s for s in chart.kind(rendered["production"], "Service") if s["metadata"]["labels"].get("app.kubernetes.io/component") == "sidecar"]  # fmt: skip
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()  # fmt: skip
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"


def test_the_dashboards_are_the_repositorys_labelled_for_grafanas_sidecar(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    sources = {path.name: path.read_text(encoding="utf-8") for path in DASHBOARDS.glob("*.json")}
    copies = {p.name: p.read_text(encoding="utf-8") for p in (CHART / "files" / "dashboards").glob("*.json")}  # fmt: skip
    assert copies == sources, "copy dashboards/*.json into the chart's files/dashboards/"
    assert (CHART / "files" / "alerts.yml").read_bytes() == ALERTS.read_bytes(), (
        "copy compose/alerts.yml into the chart's files/alerts.yml"
    )
    maps = chart.kind(rendered["minimal"], "ConfigMap")
    data = {key: value for m in maps for key, value in m["data"].items()}
    assert data == sources
    for m in maps:
        assert m["metadata"]["labels"]["grafana_dashboard"] == "1"
        # A ConfigMap holds at most 1 MiB.
        assert len(json.dumps(m)) < 1_000_000
