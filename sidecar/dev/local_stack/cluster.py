"""A three-node Apache Kafka cluster on 127.0.0.1: each node a combined broker+controller, the
three controllers one KRaft quorum (three voters), as ``local-stack up --brokers 3`` starts it.

Each node is a :class:`~sidecar.dev.local_stack.kafka.LocalKafka` under a directory of its own
(``kafka-<id>/``), with its own ports, the cluster's node id and voters, and internal topics
replicated three times. The nodes are formatted with one cluster id (kept in ``cluster-id``),
so a node killed and started again rejoins the same cluster on its data.

With combined nodes the controller quorum is lost with any two nodes: a cluster with one node
left keeps serving reads from what it leads but elects no leader and shrinks no ISR until a
second node returns (docs/operations.md, "Three brokers").
"""

from __future__ import annotations

import base64
import concurrent.futures
import subprocess
import uuid
from pathlib import Path

from sidecar.dev.local_stack.kafka import DEFAULT_KAFKA_VERSION, LocalKafka
from sidecar.dev.local_stack.process import ManagedProcess
from sidecar.errors import LocalStackError

CLUSTER_SIZE = 3
# Two CPUs and a few GiB for the three: each broker's heap is small (the tests' load needs
# well under this; a production broker gets 4-6 GiB).
CLUSTER_HEAP_MB = 384
# The internal topics (offsets, transactions) survive one node down and take writes with two.
_REPLICATED = {
    "offsets.topic.replication.factor": "3",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "share.coordinator.state.topic.replication.factor": "3",
    "share.coordinator.state.topic.min.isr": "2",
    # A stopped broker hands its leaderships over before it goes (the default, said here
    # because the rolling restart relies on it), and a returning one takes them back.
    "controlled.shutdown.enable": "true",
    "auto.leader.rebalance.enable": "true",
    "leader.imbalance.check.interval.seconds": "10",
}


class ClusterNode(LocalKafka):
    """One combined broker+controller of a :class:`LocalCluster`."""

    def __init__(
        self,
        root: Path,
        node_id: int,
        ports: tuple[int, int],
        *,
        voters: str,
        cluster_id_file: Path,
        version: str = DEFAULT_KAFKA_VERSION,
        heap_mb: int = CLUSTER_HEAP_MB,
    ) -> None:
        super().__init__(root, ports[0], ports[1], version=version, heap_mb=heap_mb)
        self.node_id = node_id
        self.voters = voters
        self.cluster_id_file = cluster_id_file
        name = f"kafka-{node_id}"
        self.server_log = root / "logs" / f"{name}-server.log"
        self.process = ManagedProcess(name, root / f"{name}.pid", root / "logs" / f"{name}.out")

    def _write_config(self) -> None:
        super()._write_config()
        path = self.home / "server.properties"
        properties = dict(
            line.split("=", 1) for line in path.read_text().splitlines() if "=" in line
        )
        properties.update(
            {
                "node.id": str(self.node_id),
                "controller.quorum.voters": self.voters,
                **_REPLICATED,
            }
        )
        path.write_text("".join(f"{key}={value}\n" for key, value in properties.items()))
        log4j = self.home / "log4j2.properties"
        # The single broker's log4j file names its log; each node writes its own.
        text = log4j.read_text()
        log4j.write_text(
            "\n".join(
                f"appender.file.fileName = {self.server_log}"
                if line.startswith("appender.file.fileName")
                else line
                for line in text.splitlines()
            )
            + "\n"
        )

    def _format(self, java: str, classpath: str) -> None:
        # Every node of a cluster is formatted with the same id (a node with another would
        # not join the quorum).
        result = subprocess.run(
            [
                java, "-Xmx256m", f"-Dlog4j2.configurationFile={self.home / 'log4j2.properties'}",
                "-cp", classpath, "kafka.tools.StorageTool", "format",
                f"--cluster-id={self.cluster_id_file.read_text().strip()}",
                "--config", str(self.home / "server.properties"),
            ],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if result.returncode != 0:
            raise LocalStackError(
                f"kafka storage format of node {self.node_id} failed: "
                f"{result.stderr.strip()[-800:]}"
            )


class LocalCluster:
    """Three :class:`ClusterNode` under ``root``; ``ports`` is each node's (broker, controller)
    pair, node ids 1, 2, 3 in order."""

    def __init__(
        self,
        root: Path,
        ports: list[tuple[int, int]],
        version: str = DEFAULT_KAFKA_VERSION,
        heap_mb: int = CLUSTER_HEAP_MB,
    ) -> None:
        if len(ports) != CLUSTER_SIZE:
            raise LocalStackError(f"a cluster has {CLUSTER_SIZE} nodes, {len(ports)} were given")
        if len({port for pair in ports for port in pair}) != 2 * CLUSTER_SIZE:
            raise LocalStackError(f"the cluster's ports must all differ: {ports}")
        self.root = root
        self.cluster_id_file = root / "kafka-cluster-id"
        voters = ",".join(
            f"{node_id}@127.0.0.1:{controller}"
            for node_id, (_, controller) in enumerate(ports, start=1)
        )
        self.nodes: dict[int, ClusterNode] = {
            node_id: ClusterNode(
                root / f"kafka-{node_id}",
                node_id,
                pair,
                voters=voters,
                cluster_id_file=self.cluster_id_file,
                version=version,
                heap_mb=heap_mb,
            )
            for node_id, pair in enumerate(ports, start=1)
        }

    @classmethod
    def on_ports(
        cls, root: Path, kafka_port: int, controller_port: int, **options: object
    ) -> LocalCluster:
        """The nodes on ``kafka_port``/``controller_port`` and the next two tens above them
        (19092, 19102, 19112 and 19093, 19103, 19113 by default)."""
        ports = [(kafka_port + 10 * n, controller_port + 10 * n) for n in range(CLUSTER_SIZE)]
        return cls(root, ports, **options)  # type: ignore[arg-type]

    @property
    def bootstrap_servers(self) -> str:
        """Every node's address: clients find the cluster through any that answers."""
        return ",".join(node.bootstrap_servers for node in self.nodes.values())

    def node(self, node_id: int) -> ClusterNode:
        try:
            return self.nodes[node_id]
        except KeyError:
            raise LocalStackError(
                f"no node {node_id} in the cluster (nodes {sorted(self.nodes)})"
            ) from None

    def running(self) -> list[int]:
        """The ids of the nodes whose process runs (answering or not)."""
        return [node_id for node_id, node in self.nodes.items() if node.process.pid() is not None]

    def start(self, timeout_s: float = 120.0) -> None:
        """Start every node that is not running, side by side (a node answers only once a
        majority of the quorum runs), and wait until each answers."""
        self.root.mkdir(parents=True, exist_ok=True)
        if not self.cluster_id_file.exists():
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
            self.cluster_id_file.write_text(cluster_id + "\n")
        with concurrent.futures.ThreadPoolExecutor(CLUSTER_SIZE) as pool:
            starting = [pool.submit(node.start, timeout_s) for node in self.nodes.values()]
            errors = [f.exception() for f in starting]
        failed = [exc for exc in errors if exc is not None]
        if failed:
            raise LocalStackError("; ".join(str(exc) for exc in failed))

    def stop(self) -> list[str]:
        """Stop every running node, side by side; returns the names stopped. One after the
        other, the last would wait for a controller quorum that left before it, and be killed
        after the stop's timeout."""
        with concurrent.futures.ThreadPoolExecutor(CLUSTER_SIZE) as pool:
            stopped = list(pool.map(lambda node: node.stop(), self.nodes.values()))
        names = [node.process.name for node in self.nodes.values()]
        return [name for name, was_running in zip(names, stopped, strict=True) if was_running]

    def running_version(self) -> str:
        return next(iter(self.nodes.values())).running_version()
