"""The Helm chart's values: what values.schema.json and the templates refuse, naming the value;
the schema's settings against the sidecar's; and RAGFlow's side (the env: block NOTES prints,
compose/helm/ragflow-values.yaml, the post-renderer plugin). Helm as in tests/test_helm.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

import sidecar.config as sidecar_settings
import tests.helm_support as chart
from sidecar.config import Settings
from tests.helm_support import (
    CHART,
    CI_VALUES,
    POST_RENDERER,
    RAGFLOW_OVERRIDE,
    RAGFLOW_VALUES,
    SECRET_VALUES,
)

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
    (("sidecar.replicas=3",), "replicas"),
    (("sidecar.replicas=2", "sidecar.instance=sidecar-a"), "leave them blank with sidecar.replicas above 1"),
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


@pytest.mark.servers
@pytest.mark.parametrize(("sets", "words"), REFUSED, ids=[" ".join(s) for s, _ in REFUSED])
def test_bad_values_are_refused_naming_the_value(sets: tuple[str, ...], words: str) -> None:
    result = chart.template(CI_VALUES["minimal"], sets=sets)
    assert result.returncode != 0, f"accepted: {sets}"
    assert words in result.stderr, result.stderr


def _ragflow_block(*sets: str) -> dict[str, Any]:
    """The values NOTES.txt prints for RAGFlow's chart (`helm install --dry-run=client`: no
    cluster is contacted)."""
    args = ["install", "ragflow-kafka-sidecar", str(CHART), "--dry-run=client", "--namespace", "ragflow"]  # fmt: skip
    for item in sets:
        args += ["--set", item]
    result = chart.run(*args, "-f", str(CI_VALUES["minimal"]))
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


@pytest.mark.servers
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
    # Every variable ragflow_mq reads can be passed: set here, by the post-renderer (the
    # secrets and the CA file), or by its image (PYTHONPATH).
    shared = re.search(
        r'define "sidecar.ragflowSharedSettings" -\}\}\n(.*?)\n',
        (CHART / "templates" / "_ragflow.tpl").read_text(encoding="utf-8"),
    )
    assert shared
    passed = set(shared.group(1).split()) | set(env) | {"KAFKA_SASL_MECHANISM", "KAFKA_CLIENT_ID"}
    by_patch = {"KAFKA_SASL_USERNAME", "KAFKA_SASL_PASSWORD", "KAFKA_SSL_CAFILE"}
    assert _ragflow_variables() - passed - by_patch == set()
    assert env["SIDECAR_STATE_URL"] == "redis://ragflow-kafka-sidecar-state.ragflow.svc:6379/0"
    env = {**env, "REDIS_URL": SECRET_VALUES["REDIS_URL"]}
    settings = Settings.from_env(environ=env)
    assert settings.mq_backend == "split" and settings.serve.percent == 0
    assert settings.mirror.traffic_percent == 50


@pytest.mark.servers
def test_ragflow_values_file_is_what_notes_print_for_its_release() -> None:
    committed = yaml.safe_load(RAGFLOW_VALUES.read_text(encoding="utf-8"))
    assert committed == _ragflow_block("stateStore.enabled=true", "kafka.bootstrapServers=kafka:9092")  # fmt: skip


@pytest.mark.servers
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
        [chart.helm(), "plugin", "list"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "HELM_PLUGINS": str(POST_RENDERER.parent)},
    )
    assert result.returncode == 0, result.stderr
    assert re.search(r"^ragflow-mq\s+0\.1\.0\s+postrenderer/v1", result.stdout, re.M), result.stdout


# What the templates write from their own values (redis, kafka, stateStore, compareRules, sidecar,
# metrics), never under settings:.
DERIVED_BY_THE_CHART = frozenset({
    "REDIS_URL", "SIDECAR_STATE_URL", "KAFKA_BOOTSTRAP_SERVERS", "KAFKA_SECURITY_PROTOCOL",
    "KAFKA_SASL_MECHANISM", "KAFKA_SASL_USERNAME", "KAFKA_SASL_PASSWORD", "KAFKA_SSL_CAFILE",
    "COMPARE_RULES", "SIDECAR_INSTANCE", "MIRROR_CONSUMER", "SIDECAR_METRICS_PORT",
    "SIDECAR_METRICS_HOST",
})  # fmt: skip


def test_the_schemas_settings_are_the_sidecars_and_its_bounds_are_accepted_by_it() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    properties = schema["properties"]["settings"]["properties"]
    assert set(properties) <= set(sidecar_settings.KNOWN_VARIABLES)
    # And every setting has a way in: under settings:, or made by the chart from its values
    # (a setting added to the sidecar and not here fails this, not a site's install).
    missing = set(sidecar_settings.KNOWN_VARIABLES) - set(properties) - DERIVED_BY_THE_CHART
    assert not missing, f"settings the chart cannot pass: {sorted(missing)}"
    # Whatever the chart lets through at its bounds, the sidecar takes too: a value the schema
    # passes must never stop the pod at start.
    # The rules between two settings (a claim refreshed at least three times a lease) are the
    # sidecar's own: the base leaves room for each bound on its own.
    base = {"REDIS_URL": SECRET_VALUES["REDIS_URL"], "KAFKA_TRAFFIC_PERCENT": "100", "MQ_BACKEND": "split", "SERVE_LEASE_S": "3600"}  # fmt: skip
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
