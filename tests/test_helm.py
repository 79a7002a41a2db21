"""The Helm chart (compose/helm/ragflow-kafka-sidecar/), checked without a cluster.

Helm is the one `make helm` builds from the Go module proxy (``HELM``, or the cache path the
Makefile uses); a missing one fails these tests, never skips them. Every manifest rendered from
the three values files in the chart's ``ci/`` is validated against the Kubernetes OpenAPI schemas
that ``kubernetes-validate`` bundles (no download at test time), on the oldest Kubernetes the
chart supports and the newest bundled. The Prometheus operator's kinds have no bundled schema:
the PrometheusRule's groups go through ``promtool check rules`` and must be compose/alerts.yml,
the ServiceMonitor must select the Service's port. Every variable a pod gets is a setting of the
sidecar, and the whole environment passes the sidecar's own validation.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

import sidecar.config as sidecar_settings
from sidecar.config import Settings

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "compose" / "helm" / "ragflow-kafka-sidecar"
CI_VALUES = {name: CHART / "ci" / f"{name}-values.yaml" for name in ("minimal", "production", "autopilot")}  # fmt: skip
RAGFLOW_VALUES = REPO / "compose" / "helm" / "ragflow-values.yaml"
POST_RENDERER = REPO / "compose" / "helm" / "ragflow-post-renderer"
RAGFLOW_OVERRIDE = REPO / "compose" / "ragflow-override.yml"
ALERTS = REPO / "compose" / "alerts.yml"
DASHBOARDS = REPO / "dashboards"
MONITORING_API = "monitoring.coreos.com/v1"
# The chart's kubeVersion floor and the newest schemas kubernetes-validate bundles.
KUBERNETES_VERSIONS = ("1.25.0", kubernetes_validate.utils.latest_version() + ".0")
# What the chart's pods may be given besides the sidecar's settings: the standard variables the
# OpenTelemetry SDK reads itself.
OTEL_SDK_VARIABLES = frozenset({"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"})
# Stand-ins for what a Secret holds, so that the sidecar's own validation runs on the rest.
SECRET_VALUES = {
    "REDIS_URL": "redis://:secret@ragflow-redis.ragflow.svc:6379/1",
    "KAFKA_SASL_USERNAME": "ragflow-sidecar",
    "KAFKA_SASL_PASSWORD": "secret",
}


def _helm() -> str:
    path = os.environ.get("HELM") or str(
        Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
        / "ragflow-kafka-sidecar"
        / "helm-v4.3.2"
        / "helm"
    )
    if not (shutil.which(path) or (Path(path).is_file() and os.access(path, os.X_OK))):
        pytest.fail(
            f"helm is not at {path}: run `make helm` (it builds Helm from the Go module proxy "
            "into the cache; `make test` does the same)",
            pytrace=False,
        )
    return path


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_helm(), *args], capture_output=True, text=True, timeout=120, check=False, cwd=REPO
    )


def _template(
    *values: Path, sets: tuple[str, ...] = (), apis: tuple[str, ...] = (MONITORING_API,)
) -> subprocess.CompletedProcess[str]:
    args = ["template", "ragflow-kafka-sidecar", str(CHART), "--namespace", "ragflow"]
    for path in values:
        args += ["-f", str(path)]
    for item in sets:
        args += ["--set", item]
    for api in apis:
        args += ["--api-versions", api]
    return _run(*args)


def _manifests(result: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {name: _manifests(_template(path)) for name, path in CI_VALUES.items()}


def _kind(manifests: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [m for m in manifests if m["kind"] == kind]


def _pod_specs(manifests: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for m in manifests:
        if m["kind"] in ("Deployment", "StatefulSet", "Job"):
            yield m["metadata"]["name"], m["spec"]["template"]["spec"]


def _sidecar_containers(manifests: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The containers running the sidecar's image (not the state store's Valkey)."""
    for _, spec in _pod_specs(manifests):
        for container in spec["containers"]:
            if "ragflow-kafka-sidecar" in container["image"]:
                yield container


def test_helm_lint_strict_passes_on_every_values_file() -> None:
    for name, path in CI_VALUES.items():
        result = _run("lint", "--strict", str(CHART), "-f", str(path))
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
    (deployment, *_) = _kind(rendered["minimal"], "Deployment")
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
        for kind in ("Deployment", "Service", "Job", "PodDisruptionBudget", "NetworkPolicy"):
            assert kind in kinds[name], (name, kind)
        assert kinds[name].count("ConfigMap") == 2  # the two dashboards
        assert "ServiceMonitor" in kinds[name] and "PrometheusRule" in kinds[name]
    # The autopilot is off and the state store absent unless asked for.
    assert kinds["minimal"].count("Deployment") == 1 and "StatefulSet" not in kinds["minimal"]
    assert "StatefulSet" in kinds["production"]
    rollout = [d for d in _kind(rendered["autopilot"], "Deployment") if d["metadata"]["name"].endswith("-rollout")]  # fmt: skip
    assert len(rollout) == 1 and rollout[0]["spec"]["replicas"] == 2
    assert rollout[0]["spec"]["template"]["spec"]["containers"][0]["args"] == ["rollout", "run"]


def test_the_operator_kinds_render_only_where_their_api_exists() -> None:
    kinds = {m["kind"] for m in _manifests(_template(CI_VALUES["production"], apis=()))}
    assert not kinds & {"ServiceMonitor", "PrometheusRule"}
    assert {"Deployment", "ConfigMap"} <= kinds


def test_run_has_its_probes_on_the_metrics_port_and_one_process_at_a_time(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for manifests in rendered.values():
        (run,) = [d for d in _kind(manifests, "Deployment") if not d["metadata"]["name"].endswith("-rollout")]  # fmt: skip
        # Stable consumer and member names are held by one process: no surge pod beside it.
        assert run["spec"]["strategy"] == {"type": "Recreate"}
        assert run["spec"]["replicas"] == 1
        (container,) = run["spec"]["template"]["spec"]["containers"]
        assert container["args"] == ["run"]
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
        (service,) = _kind(manifests, "Service")[:1]
        assert service["spec"]["ports"][0]["targetPort"] == "metrics"
        assert service["spec"]["selector"].items() <= run["spec"]["template"]["metadata"]["labels"].items()  # fmt: skip


def test_init_topics_is_a_hook_before_install_and_upgrade(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    (job,) = _kind(rendered["minimal"], "Job")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    spec = job["spec"]["template"]["spec"]
    assert spec["restartPolicy"] == "Never"
    assert spec["containers"][0]["args"] == ["init-topics"]
    # A pre-install hook runs before the release's own objects exist: it may only read what the
    # site created beforehand (existing Secrets), never a ConfigMap or Secret of this chart.
    names = {m["metadata"]["name"] for m in rendered["production"] if m["kind"] in ("ConfigMap", "Secret")}  # fmt: skip
    (job,) = _kind(rendered["production"], "Job")
    refs = json.dumps(job["spec"])
    assert not [name for name in names if f'"{name}"' in refs]


def test_the_state_store_never_evicts_and_keeps_an_append_only_file(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    (store,) = _kind(rendered["production"], "StatefulSet")
    assert store["spec"]["replicas"] == 1
    args = store["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
    assert args[args.index("--appendonly") + 1] == "yes"
    assert args[args.index("--maxmemory") + 1] == "512mb"
    assert store["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "5Gi"  # fmt: skip
    # Every sidecar pod points at it, through its Service.
    services = {s["metadata"]["name"]: s for s in _kind(rendered["production"], "Service")}
    for container in _sidecar_containers(rendered["production"]):
        url = next(e["value"] for e in container["env"] if e["name"] == "SIDECAR_STATE_URL")
        host = re.match(r"redis://([^.]+)\.ragflow\.svc:6379/0$", url)
        assert host and host.group(1) == store["metadata"]["name"] and host.group(1) in services
    # Reached by the sidecar's pods and RAGFlow's only.
    (policy,) = [p for p in _kind(rendered["production"], "NetworkPolicy") if p["spec"]["podSelector"]["matchLabels"].get("app.kubernetes.io/component") == "state-store"]  # fmt: skip
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
        if "valueFrom" in item:
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
    containers = list(_sidecar_containers(rendered[name]))
    assert len(containers) >= 2  # run and init-topics at least
    environments = [_environment(container, tmp_path) for container in containers]
    for container, env in zip(containers, environments, strict=True):
        unknown = set(env) - known
        assert not unknown, f"{container['name']}: not settings of the sidecar: {sorted(unknown)}"
        assert len(env) == len(container["env"]), "a variable twice"
        settings = Settings.from_env(environ=env)
        assert (
            settings.shadow.stable_instance and settings.shadow.instance == "ragflow-kafka-sidecar"
        )
        assert settings.mirror.consumer == "ragflow-kafka-sidecar"
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
    (container, *_) = _sidecar_containers(rendered["production"])
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["SHADOW_JOIN_TTL_S"] == "1000000"
    assert env["GATE_LATENCY_FLOOR_MS"] == "3600000"
    assert env["KAFKA_SERVE_PERCENT"] == "12.5"
    assert env["OTEL_TRACES_SAMPLER_ARG"] == "0.1"
    (container, *_) = _sidecar_containers(rendered["autopilot"])
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["ROLLOUT_STEPS"] == "1,5,25,50,100"


def test_secrets_come_from_existing_secrets_never_from_values(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    assert not _kind(rendered["production"], "Secret")
    for container in _sidecar_containers(rendered["production"]):
        refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"] if "valueFrom" in e}  # fmt: skip
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
    (rule,) = _kind(rendered["production"], "PrometheusRule")
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
    (monitor,) = _kind(rendered["production"], "ServiceMonitor")
    (service,) = [s for s in _kind(rendered["production"], "Service") if s["metadata"]["labels"].get("app.kubernetes.io/component") == "sidecar"]  # fmt: skip
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
    maps = _kind(rendered["minimal"], "ConfigMap")
    data = {key: value for m in maps for key, value in m["data"].items()}
    assert data == sources
    for m in maps:
        assert m["metadata"]["labels"]["grafana_dashboard"] == "1"
        # A ConfigMap holds at most 1 MiB.
        assert len(json.dumps(m)) < 1_000_000


# Values that must be refused, each with the words the error must carry.
REFUSED = [
    (("settings.KAFKA_TRAFFIC_PERCENT=101",), "KAFKA_TRAFFIC_PERCENT"),
    (("settings.KAFKA_TRAFFIC_PERCENT=-1",), "KAFKA_TRAFFIC_PERCENT"),
    (("settings.GATE_MIN_MATCH_PERCENT=101",), "GATE_MIN_MATCH_PERCENT"),
    (("settings.KAFKA_TRAFFIC_PERCENT=10", "settings.KAFKA_SERVE_PERCENT=20"), "above the ceiling settings.KAFKA_TRAFFIC_PERCENT"),
    (("settings.MQ_BACKEND=kafka",), "KAFKA_SERVE_PERCENT must be 100"),
    (("settings.MQ_BACKEND=kafak",), "MQ_BACKEND"),
    (("settings.KAFKA_COMPRESSION_TYPE=brotli",), "KAFKA_COMPRESSION_TYPE"),
    (("settings.REDIS_URL=redis://x:6379/1",), "REDIS_URL"),
    (("settings.MIRROR_BACH=10",), "MIRROR_BACH"),
    (("settings.SERVE_SESSION_TIMEOUT_MS=1000",), "SERVE_SESSION_TIMEOUT_MS"),
    (("sidecar.replicas=2",), "replicas"),
    (("autopilot.replicas=3",), "replicas"),
    (("kafka.securityProtocol=SASL_SSL",), "existingSecret"),
    (("kafka.securityProtocol=TLS",), "securityProtocol"),
    (("kafka.bootstrapServers=kafka",), "bootstrapServers"),
    (("kafka.ssl.caSecret=ca",), "does not use TLS"),
    (("redis.url=",), "redis.url or redis.existingSecret is required"),
    (("redis.existingSecret=s",), "not both"),
    (("autopilot.enabled=true", "settings.KAFKA_TRAFFIC_PERCENT=20", "settings.KAFKA_SERVE_PERCENT=20"), "step 25 is above the ceiling settings.KAFKA_SERVE_PERCENT=20"),
    (("autopilot.enabled=true", "settings.KAFKA_TRAFFIC_PERCENT=100", "settings.KAFKA_SERVE_PERCENT=100", "settings.ROLLOUT_STEPS={5,1}"), "must rise"),
    (("autopilot.enabled=true",), "step 1 is above the ceiling settings.KAFKA_SERVE_PERCENT=0"),
    (("stateStore.maxmemory=lots",), "maxmemory"),
]  # fmt: skip


@pytest.mark.parametrize(("sets", "words"), REFUSED, ids=[" ".join(s) for s, _ in REFUSED])
def test_bad_values_are_refused_naming_the_value(sets: tuple[str, ...], words: str) -> None:
    result = _template(CI_VALUES["minimal"], sets=sets)
    assert result.returncode != 0, f"accepted: {sets}"
    assert words in result.stderr, result.stderr


def _ragflow_block(*sets: str) -> dict[str, Any]:
    """The values NOTES.txt prints for RAGFlow's chart (`helm install --dry-run=client`: no
    cluster is contacted)."""
    args = ["install", "ragflow-kafka-sidecar", str(CHART), "--dry-run=client", "--namespace", "ragflow"]  # fmt: skip
    for item in sets:
        args += ["--set", item]
    result = _run(*args, "-f", str(CI_VALUES["minimal"]))
    assert result.returncode == 0, result.stderr
    block = re.search(r"# --- ragflow-values.yaml ---\n(.*)# --- end ---", result.stdout, re.S)
    assert block, result.stdout
    document = yaml.safe_load(block.group(1))
    assert isinstance(document, dict)
    return document


def _ragflow_variables() -> set[str]:
    """What ragflow_mq reads inside RAGFlow (compose's override gives RAGFlow these)."""
    override = yaml.safe_load(RAGFLOW_OVERRIDE.read_text(encoding="utf-8"))
    return set(override["x-ragflow-mq"]["environment"]) - {"PYTHONPATH"}


def test_notes_print_ragflows_env_quoted_and_accepted_by_ragflow_mq() -> None:
    block = _ragflow_block(
        "stateStore.enabled=true",
        "settings.KAFKA_TRAFFIC_PERCENT=50",
        "settings.KAFKA_SERVE_PERCENT=0",
        "settings.SERVE_DONE_TTL_S=1000000",
        "settings.SHADOW_JOIN_TTL_S=7200",
    )
    assert block["ragflow"]["image"] == {"repository": "ragflow-mq", "tag": "v0.27.0"}
    env = block["env"]
    # Quoted: RAGFlow's chart drops an `env:` value that is falsy, such as an unquoted 0.
    assert all(isinstance(value, str) and value for value in env.values()), env
    assert env["KAFKA_SERVE_PERCENT"] == "0" and env["SERVE_DONE_TTL_S"] == "1000000"
    assert set(env) <= _ragflow_variables(), sorted(set(env) - _ragflow_variables())
    assert "SHADOW_JOIN_TTL_S" not in env  # the sidecar's alone
    assert env["SIDECAR_STATE_URL"] == "redis://ragflow-kafka-sidecar-state.ragflow.svc:6379/0"
    env = {**env, "REDIS_URL": SECRET_VALUES["REDIS_URL"]}
    settings = Settings.from_env(environ=env)
    assert settings.mq_backend == "split" and settings.serve.percent == 0
    assert settings.mirror.traffic_percent == 50


def test_ragflow_values_file_is_what_notes_print_for_its_release() -> None:
    committed = yaml.safe_load(RAGFLOW_VALUES.read_text(encoding="utf-8"))
    assert committed == _ragflow_block("stateStore.enabled=true", "kafka.bootstrapServers=kafka:9092")  # fmt: skip


def test_the_post_renderer_is_a_helm_plugin_patching_ragflows_deployment() -> None:
    plugin = yaml.safe_load((POST_RENDERER / "plugin.yaml").read_text(encoding="utf-8"))
    assert plugin["type"] == "postrenderer/v1" and plugin["runtime"] == "subprocess"
    (command,) = plugin["runtimeConfig"]["platformCommand"]
    script = POST_RENDERER / Path(command["command"]).name
    assert os.access(script, os.X_OK)
    kustomization = yaml.safe_load((POST_RENDERER / "kustomization.yaml").read_text(encoding="utf-8"))  # fmt: skip
    (patch_ref,) = kustomization["patches"]
    patch = yaml.safe_load((POST_RENDERER / patch_ref["path"]).read_text(encoding="utf-8"))
    (container,) = patch["spec"]["template"]["spec"]["containers"]
    # RAGFlow's chart names its one container `ragflow`.
    assert container["name"] == "ragflow"
    assert {e["name"] for e in container["env"]} <= _ragflow_variables()
    mounted = {v["name"] for v in patch["spec"]["template"]["spec"]["volumes"]}
    assert {m["name"] for m in container["volumeMounts"]} <= mounted
    ca = next(e["value"] for e in container["env"] if e["name"] == "KAFKA_SSL_CAFILE")
    assert any(ca.startswith(m["mountPath"] + "/") for m in container["volumeMounts"])
    # The plugin is one Helm loads: `helm plugin list` with it as the only plugin.
    result = subprocess.run(
        [_helm(), "plugin", "list"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "HELM_PLUGINS": str(POST_RENDERER.parent)},
    )
    assert result.returncode == 0, result.stderr
    assert re.search(r"^ragflow-mq\s+0\.1\.0\s+postrenderer/v1", result.stdout, re.M), result.stdout


def test_the_schemas_settings_are_the_sidecars_and_its_bounds_are_accepted_by_it() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    properties = schema["properties"]["settings"]["properties"]
    assert set(properties) <= set(sidecar_settings.KNOWN_VARIABLES)
    # Whatever the chart lets through at its bounds, the sidecar takes too: a value the schema
    # passes must never stop the pod at start.
    base = {"REDIS_URL": SECRET_VALUES["REDIS_URL"], "KAFKA_TRAFFIC_PERCENT": "100", "MQ_BACKEND": "split"}  # fmt: skip
    checked = 0
    for name, rule in properties.items():
        for bound in ("minimum", "maximum"):
            if bound in rule:
                value = rule[bound]
                text = str(int(value)) if float(value).is_integer() else str(value)
                Settings.from_env(environ={**base, name: text})
                checked += 1
        for choice in rule.get("enum", ()):
            Settings.from_env(environ={**base, name: choice})
            checked += 1
    assert checked > 60
