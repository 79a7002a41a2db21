"""A real Jaeger (v2) on 127.0.0.1: OTLP in, traces in memory, the query API out.

The binary is built from the Go module proxy by ``make jaeger`` (the Makefile's ``$(JAEGER)``)
into the same cache as Kafka's jars, never at test time; ``JAEGER`` names another one. Its
configuration is ``jaeger.yaml`` beside this module, whose addresses come from the environment
the process is started with, so several Jaegers (a developer's and the tests') can run at once.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from sidecar.dev.local_stack.kafka import cache_root
from sidecar.dev.local_stack.process import ManagedProcess
from sidecar.errors import LocalStackError

__all__ = ["JAEGER_VERSION", "JaegerPorts", "LocalJaeger", "jaeger_binary"]

# The module version the Makefile builds (JAEGER_VERSION there): the one approved release.
JAEGER_VERSION: Final = "v1.75.0"
CONFIG_FILE: Final = Path(__file__).with_name("jaeger.yaml")
_HTTP_TIMEOUT_S: Final = 5.0


def jaeger_binary() -> Path:
    """``JAEGER`` if set, else the one ``make jaeger`` built into the cache."""
    override = os.environ.get("JAEGER", "").strip()
    path = Path(override) if override else cache_root() / f"jaeger-{JAEGER_VERSION}" / "jaeger"
    if not os.access(path, os.X_OK):
        raise LocalStackError(
            f"no Jaeger binary at {path}; `make jaeger` builds it (Go, a few minutes)"
        )
    return path


@dataclass(frozen=True)
class JaegerPorts:
    """Its listeners on 127.0.0.1: OTLP gRPC and HTTP in, the query API (HTTP, gRPC), health."""

    otlp_grpc: int = 14317
    otlp_http: int = 14318
    query_http: int = 16686
    query_grpc: int = 16685
    health: int = 13133


class LocalJaeger:
    """One Jaeger under ``root``, known by its pid file."""

    def __init__(self, root: Path, ports: JaegerPorts) -> None:
        self.root = root
        self.ports = ports
        self.process = ManagedProcess("jaeger", root / "jaeger.pid", root / "logs" / "jaeger.log")

    @property
    def otlp_grpc_endpoint(self) -> str:
        """What ``OTEL_EXPORTER_OTLP_ENDPOINT`` names for the sidecar's gRPC exporter."""
        return f"http://127.0.0.1:{self.ports.otlp_grpc}"

    @property
    def otlp_http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports.otlp_http}"

    @property
    def query_url(self) -> str:
        """The query API: ``/api/traces``, ``/api/services`` (and the UI, built with its assets)."""
        return f"http://127.0.0.1:{self.ports.query_http}"

    def start(self, timeout_s: float = 60.0) -> None:
        """Start unless running, then wait until the query API answers."""
        if self.process.pid() is None:
            address = "127.0.0.1:{}".format
            env = {
                **os.environ,
                "JAEGER_OTLP_GRPC_ENDPOINT": address(self.ports.otlp_grpc),
                "JAEGER_OTLP_HTTP_ENDPOINT": address(self.ports.otlp_http),
                "JAEGER_QUERY_HTTP_ENDPOINT": address(self.ports.query_http),
                "JAEGER_QUERY_GRPC_ENDPOINT": address(self.ports.query_grpc),
                "JAEGER_HEALTH_ENDPOINT": address(self.ports.health),
            }
            self.process.start([str(jaeger_binary()), "--config", f"file:{CONFIG_FILE}"], env)
        self.process.wait_until(self.answers, timeout_s, 0.1, what="answer on its query API")

    def answers(self) -> bool:
        try:
            self.get("/api/services")
        except LocalStackError:
            return False
        return True

    def get(self, path: str, **query: str) -> Any:
        """The query API's JSON answer to ``GET path?query``; LocalStackError when it fails."""
        url = self.query_url + path + ("?" + urllib.parse.urlencode(query) if query else "")
        try:
            with urllib.request.urlopen(url, timeout=_HTTP_TIMEOUT_S) as response:
                return json.loads(response.read())
        except (OSError, ValueError) as exc:  # URLError and HTTPError are OSErrors
            raise LocalStackError(f"Jaeger's query API: GET {path}: {exc}") from exc

    def stop(self) -> bool:
        return self.process.stop(timeout_s=15.0)
