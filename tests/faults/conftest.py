"""The fault suite: marked ``faults``, and a table of every fault's accounting at the end.

The cluster rows (``test_cluster_*``, also marked ``cluster``: ``pytest -m cluster`` runs them
alone) share one three-broker cluster, started the first time a test asks for it and stopped (by
pid) when the fault suite's package is done.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import valkey.asyncio as avalkey

from sidecar.config import Settings
from sidecar.dev.local_stack.broker_faults import BrokerFaults
from sidecar.dev.local_stack.cluster import CLUSTER_SIZE, LocalCluster
from sidecar.errors import LocalStackError
from sidecar.transport.topics import TOPIC_PLAN, init_topics
from tests import tiers
from tests.conftest import free_port
from tests.faults.support import FaultRow, Share, valkey_url

_ROWS = pytest.StashKey[list[FaultRow]]()
_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The cluster's tests run last of the fault suite: its package-scoped cluster then runs
    only while they do (three idle brokers cost about an eighth of a CPU)."""
    on_cluster = [item for item in items if item.get_closest_marker("cluster")]
    if not on_cluster:
        return
    rest = [item for item in items if not item.get_closest_marker("cluster")]
    ours = [n for n, item in enumerate(rest) if _HERE in Path(item.path).resolve().parents]
    at = ours[-1] + 1 if ours else len(rest)
    items[:] = [*rest[:at], *on_cluster, *rest[at:]]


@pytest.fixture(scope="package")
@tiers.starts_servers
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three combined broker+controller nodes on free ports, for this package's tests."""
    root = tmp_path_factory.mktemp("cluster")
    ports = [(free_port(), free_port()) for _ in range(CLUSTER_SIZE)]
    cluster = LocalCluster(root, ports)
    try:
        cluster.start()
    except LocalStackError as exc:
        cluster.stop()
        pytest.fail(f"the three-broker cluster did not start: {exc}")
    yield cluster
    cluster.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="package")
async def cluster_settings(settings: Settings, cluster: LocalCluster) -> Settings:
    """The session's Valkey and the cluster, its topics made by init-topics with three
    replicas (so ``min.insync.replicas`` 2)."""
    on_cluster = Settings.from_env(
        {
            "REDIS_URL": valkey_url(settings),
            "KAFKA_BOOTSTRAP_SERVERS": cluster.bootstrap_servers,
            "KAFKA_LINGER_MS": "1",
            "KAFKA_REPLICATION_FACTOR": "3",
        }
    )
    await init_topics(on_cluster.kafka, replication_factor=3)
    return on_cluster


@pytest.fixture
async def brokers(cluster: LocalCluster, cluster_settings: Settings) -> AsyncIterator[BrokerFaults]:
    """The fault harness on the cluster; every node running and every seed topic fully
    replicated before and after the test (a failed test leaves no node down)."""
    faults = BrokerFaults(cluster)
    await faults.wait_replicated(list(TOPIC_PLAN))
    try:
        yield faults
    finally:
        await asyncio.to_thread(faults.heal)
        await faults.wait_replicated(list(TOPIC_PLAN))


@pytest.fixture
def fault_table(request: pytest.FixtureRequest) -> list[FaultRow]:
    """Rows appended here are printed in the fault table after the run."""
    return request.config.stash.setdefault(_ROWS, [])


@pytest.fixture
async def share(settings: Settings, valkey_client: avalkey.Valkey, unique: str) -> Share:
    """The test's own stream, with RAGFlow's group, on the session's Valkey and Kafka."""
    return await Share.prepare(settings, valkey_client, unique)


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    rows = config.stash.get(_ROWS, [])
    if not rows:
        return
    terminalreporter.section("fault suite")
    # Acknowledged: XADDs RAGFlow got an id for (or enqueues that returned True); lost: those
    # not in Kafka (or never executed); duplicates: copies (or executions) beyond the first.
    header = ("fault", "acknowledged", "lost", "duplicates", "recover s", "note")
    cells = [
        (r.fault, str(r.written), str(r.missing), str(r.duplicates), f"{r.recover_s:.1f}", r.note)
        for r in rows
    ]
    widths = [max(len(row[i]) for row in [header, *cells]) for i in range(len(header))]
    for row in [header, *cells]:
        terminalreporter.write_line(
            "  ".join(
                c.ljust(w) if i in (0, 5) else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
