"""Valkey and Kafka together (and Jaeger, asked for): what ``ragflow-sidecar local-stack
up|down|status`` drives."""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass
from pathlib import Path

from sidecar.dev.local_stack.cluster import LocalCluster
from sidecar.dev.local_stack.jaeger import JaegerPorts, LocalJaeger
from sidecar.dev.local_stack.kafka import DEFAULT_KAFKA_VERSION, LocalKafka
from sidecar.dev.local_stack.valkey import LocalValkey
from sidecar.errors import LocalStackError

TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"


@dataclass(frozen=True)
class StackConfig:
    """Where the stack keeps its data and logs, and its ports (all on 127.0.0.1)."""

    root: Path = Path(".local")
    valkey_port: int = 16379
    kafka_port: int = 19092
    kafka_controller_port: int = 19093
    valkey_aof: bool = False
    kafka_version: str = DEFAULT_KAFKA_VERSION
    # --secured: a SASL_SSL (SCRAM-SHA-512) listener on this port beside the PLAINTEXT one.
    kafka_secured: bool = False
    kafka_sasl_ssl_port: int = 19094
    # --brokers 3: a three-node KRaft cluster instead of the single broker (cluster.py), its
    # nodes on kafka_port and kafka_controller_port and the next two tens above them.
    kafka_brokers: int = 1
    # --jaeger: a Jaeger (jaeger.py) that the sidecar's traces go to; its OTLP gRPC port, and
    # the query API's (the UI's) port. Its other listeners are the next ports above them.
    jaeger: bool = False
    jaeger_otlp_port: int = 14317
    jaeger_query_port: int = 16686

    def jaeger_ports(self) -> JaegerPorts:
        return JaegerPorts(
            otlp_grpc=self.jaeger_otlp_port,
            otlp_http=self.jaeger_otlp_port + 1,
            query_http=self.jaeger_query_port,
            query_grpc=self.jaeger_query_port + 1,
            health=self.jaeger_query_port + 2,
        )


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    pid: int | None
    answering: bool
    address: str


class LocalStack:
    """Start, stop and report on the local Valkey and Kafka; ``up`` is idempotent."""

    def __init__(self, config: StackConfig) -> None:
        self.config = config
        root = config.root.resolve()
        self.valkey = LocalValkey(root, config.valkey_port, aof=config.valkey_aof)
        self.kafka = LocalKafka(
            root,
            config.kafka_port,
            config.kafka_controller_port,
            version=config.kafka_version,
            sasl_ssl_port=config.kafka_sasl_ssl_port if config.kafka_secured else None,
        )
        self.cluster: LocalCluster | None = None
        if config.kafka_brokers > 1:
            if config.kafka_secured:
                raise LocalStackError("--secured runs on the single broker, not --brokers 3")
            self.cluster = LocalCluster.on_ports(
                root, config.kafka_port, config.kafka_controller_port, version=config.kafka_version
            )
        self.jaeger = LocalJaeger(root, config.jaeger_ports()) if config.jaeger else None
        self._state_file = root / "stack.json"

    @classmethod
    def from_state(cls, root: Path) -> LocalStack:
        """The stack as the last ``up`` in ``root`` configured it (defaults if none)."""
        try:
            saved = json.loads((root / "stack.json").read_text())
            saved["root"] = root
            return cls(StackConfig(**saved))
        except (OSError, ValueError, TypeError):
            return cls(StackConfig(root=root))

    def up(self) -> None:
        self.config.root.mkdir(parents=True, exist_ok=True)
        state = {**asdict(self.config), "root": str(self.config.root)}
        self._state_file.write_text(json.dumps(state, indent=2) + "\n")
        self.valkey.start()
        if self.cluster is not None:
            self.cluster.start()
        else:
            self.kafka.start()
        if self.jaeger is not None:
            self.jaeger.start()

    def down(self) -> list[str]:
        """Stop what this stack started (by pid); returns the names stopped."""
        stopped = []
        if self.jaeger is not None and self.jaeger.stop():
            stopped.append("jaeger")
        if self.cluster is not None:
            stopped += self.cluster.stop()
        if self.kafka.stop():
            stopped.append("kafka")
        if self.valkey.stop():
            stopped.append("valkey")
        return stopped

    def status(self) -> list[ServiceStatus]:
        jaeger = self.jaeger
        if jaeger is None:
            return self._status()
        pid = jaeger.process.pid()
        return [
            *self._status(),
            ServiceStatus("jaeger", pid, pid is not None and jaeger.answers(), jaeger.query_url),
        ]

    def _status(self) -> list[ServiceStatus]:
        valkey_pid = self.valkey.process.pid()
        if self.cluster is not None:
            valkey = ServiceStatus(
                "valkey", valkey_pid, valkey_pid is not None and self.valkey.ping(), self.valkey.url
            )
            nodes = [
                ServiceStatus(
                    node.process.name,
                    node.process.pid(),
                    node.process.pid() is not None and node.answers(),
                    node.bootstrap_servers,
                )
                for node in self.cluster.nodes.values()
            ]
            return [valkey, *nodes]
        kafka_pid = self.kafka.process.pid()
        return [
            ServiceStatus(
                "valkey", valkey_pid, valkey_pid is not None and self.valkey.ping(), self.valkey.url
            ),
            ServiceStatus(
                "kafka",
                kafka_pid,
                kafka_pid is not None and self.kafka.answers(),
                self.kafka.bootstrap_servers,
            ),
        ]

    def exports(self) -> str:
        """Shell lines that point the sidecar at this stack (its secured listener if it has one).

        The SCRAM password is read from its file when the lines are eval'd, so it is never
        printed.
        """
        tracing = ""
        if self.jaeger is not None:
            # Traces only: Jaeger takes no OTLP metrics (Prometheus scrapes the sidecar's).
            tracing = f"export {TRACES_ENDPOINT}={self.jaeger.otlp_grpc_endpoint}\n"
        if not self.config.kafka_secured:
            kafka = self.cluster or self.kafka
            return (
                f"export REDIS_URL={self.valkey.url}\n"
                f"export KAFKA_BOOTSTRAP_SERVERS={kafka.bootstrap_servers}\n"
            ) + tracing
        kafka = self.kafka
        return (
            f"export REDIS_URL={self.valkey.url}\n"
            f"export KAFKA_BOOTSTRAP_SERVERS={kafka.secured_bootstrap_servers}\n"
            "export KAFKA_SECURITY_PROTOCOL=SASL_SSL\n"
            "export KAFKA_SASL_MECHANISM=SCRAM-SHA-512\n"
            f"export KAFKA_SASL_USERNAME={kafka.sasl_username}\n"
            f'export KAFKA_SASL_PASSWORD="$(cat {shlex.quote(str(kafka.sasl_password_file))})"\n'
            f"export KAFKA_SSL_CAFILE={shlex.quote(str(kafka.tls.ca_file))}\n"
        ) + tracing
