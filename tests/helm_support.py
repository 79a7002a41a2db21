"""What the Helm chart's tests share: Helm itself (the one `make helm` builds), rendering the
chart with a values file, and picking parts out of what it rendered."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from sidecar.dev.local_stack.kafka import cache_root

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
# What Kubernetes puts in a variable taken from the pod's name (fieldRef metadata.name).
POD_NAME = "ragflow-kafka-sidecar-0"
# Stand-ins for what a Secret holds, so that the sidecar's own validation runs on the rest.
SECRET_VALUES = {
    "REDIS_URL": "redis://:secret@ragflow-redis.ragflow.svc:6379/1",
    "KAFKA_SASL_USERNAME": "ragflow-sidecar",
    "KAFKA_SASL_PASSWORD": "secret",
}


def helm() -> str:
    # make pytest names it; else where the Makefile's HELM_VERSION is built by default.
    path = os.environ.get("HELM") or str(cache_root() / "helm-v4.3.2" / "helm")
    if not (shutil.which(path) or (Path(path).is_file() and os.access(path, os.X_OK))):
        pytest.fail(
            f"helm is not at {path}: run `make helm` (it builds Helm from the Go module proxy "
            "into the cache; `make test` does the same)",
            pytrace=False,
        )
    return path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [helm(), *args], capture_output=True, text=True, timeout=120, check=False, cwd=REPO
    )


def template(
    *values: Path, sets: tuple[str, ...] = (), apis: tuple[str, ...] = (MONITORING_API,)
) -> subprocess.CompletedProcess[str]:
    args = ["template", "ragflow-kafka-sidecar", str(CHART), "--namespace", "ragflow"]
    for path in values:
        args += ["-f", str(path)]
    for item in sets:
        args += ["--set", item]
    for api in apis:
        args += ["--api-versions", api]
    return run(*args)


def manifests(result: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def kind(manifests: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """The manifests of kind ``name``."""
    return [m for m in manifests if m["kind"] == name]


def part(manifests: list[dict[str, Any]], name: str, component: str) -> dict[str, Any]:
    """The one manifest of kind ``name`` labelled as ``component`` of the release."""
    (found,) = [m for m in kind(manifests, name) if m["metadata"]["labels"].get("app.kubernetes.io/component") == component]  # fmt: skip
    return found


def pod_specs(manifests: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for m in manifests:
        if m["kind"] in ("Deployment", "StatefulSet", "Job"):
            yield m["metadata"]["name"], m["spec"]["template"]["spec"]


def sidecar_containers(manifests: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The containers running the sidecar's image (not the state store's Valkey)."""
    for _, spec in pod_specs(manifests):
        for container in spec["containers"]:
            if "ragflow-kafka-sidecar" in container["image"]:
                yield container
