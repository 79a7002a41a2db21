"""Faults on a chosen broker of a :class:`~sidecar.dev.local_stack.cluster.LocalCluster`.

A broker is chosen by node id, as the leader of a partition (``describe_topics``), as the
coordinator of a consumer group (``find_coordinator``), or as the leader of a topic's busiest
partition (most records); then killed with -9, paused (SIGSTOP) and resumed (SIGCONT), or
stopped (a controlled shutdown: its leaderships move first) and started again on its data.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from sidecar.dev.local_stack.cluster import LocalCluster
from sidecar.errors import LocalStackError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PartitionState:
    """Who leads a partition (-1: nobody), who holds it and who is in sync."""

    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]

    @property
    def fully_replicated(self) -> bool:
        return self.leader >= 0 and set(self.isr) == set(self.replicas)


class BrokerFaults:
    """Find a broker by its role in ``cluster`` and hit it; every call names the node id."""

    def __init__(self, cluster: LocalCluster, request_timeout_ms: int = 5000) -> None:
        self.cluster = cluster
        self.request_timeout_ms = request_timeout_ms
        self._paused: set[int] = set()

    @asynccontextmanager
    async def _admin(self) -> AsyncIterator[AIOKafkaAdminClient]:
        admin = AIOKafkaAdminClient(
            bootstrap_servers=self._live_bootstrap(), request_timeout_ms=self.request_timeout_ms
        )
        try:
            await admin.start()
            yield admin
        finally:
            await admin.close()

    def _live_bootstrap(self) -> str:
        # A paused node accepts connections and never answers: the admin client's bootstrap
        # would wait on it, so only the running, unpaused nodes are asked.
        live = [
            node.bootstrap_servers
            for node_id, node in self.cluster.nodes.items()
            if node_id in self.cluster.running() and node_id not in self._paused
        ]
        if not live:
            raise LocalStackError("no node of the cluster is running")
        return ",".join(live)

    async def partitions(self, topics: list[str]) -> dict[tuple[str, int], PartitionState]:
        """Every partition of ``topics`` and its leader, replicas and in-sync replicas."""
        async with self._admin() as admin:
            described = await admin.describe_topics(topics)
        states = {}
        for topic in described:
            if topic["error_code"] != 0:
                raise LocalStackError(f"describing {topic['topic']}: error {topic['error_code']}")
            for p in topic["partitions"]:
                states[topic["topic"], p["partition"]] = PartitionState(
                    p["leader"], tuple(p["replicas"]), tuple(p["isr"])
                )
        return states

    async def leader_of(self, topic: str, partition: int) -> int:
        """The node id leading ``topic``'s ``partition``."""
        state = (await self.partitions([topic])).get((topic, partition))
        if state is None or state.leader < 0:
            raise LocalStackError(f"{topic}:{partition} has no leader now")
        return state.leader

    async def coordinator_of(self, group: str, timeout_s: float = 30.0) -> int:
        """The node id coordinating consumer group ``group`` (asked again while the offsets
        topic is being created or its partition is moving)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                async with self._admin() as admin:
                    return int(await admin.find_coordinator(group))
            except Exception as exc:  # not available yet: ask again until the deadline
                if time.monotonic() > deadline:
                    raise LocalStackError(f"no coordinator for group {group}: {exc}") from exc
                await asyncio.sleep(0.5)

    async def coordinator_moved(self, group: str, away_from: int, timeout_s: float = 60.0) -> int:
        """Wait until a node other than ``away_from`` coordinates ``group``; returns it (the
        controller fences a dead broker after ``broker.session.timeout.ms``, 9 s)."""
        deadline = time.monotonic() + timeout_s
        while (coordinator := await self.coordinator_of(group, timeout_s)) == away_from:
            if time.monotonic() > deadline:
                raise LocalStackError(f"group {group} still on node {away_from}")
            await asyncio.sleep(0.5)
        return coordinator

    async def busiest_partition(self, topics: list[str]) -> tuple[str, int]:
        """The partition of ``topics`` holding the most records."""
        states = await self.partitions(topics)
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self._live_bootstrap(), request_timeout_ms=self.request_timeout_ms
        )
        await consumer.start()
        try:
            ends = await consumer.end_offsets([TopicPartition(t, p) for t, p in states])
        finally:
            await consumer.stop()
        busiest = max(ends, key=lambda tp: ends[tp])
        return busiest.topic, busiest.partition

    async def wait_replicated(self, topics: list[str], timeout_s: float = 120.0) -> float:
        """Wait until every partition of ``topics`` has a leader and all its replicas in sync;
        returns the seconds it took."""
        began = time.monotonic()
        lagging: list[tuple[str, int]] = []
        while time.monotonic() - began < timeout_s:
            try:
                states = await self.partitions(topics)
            except Exception as exc:  # a node just restarted: ask again
                logger.debug("describe failed while waiting for replication: %s", exc)
            else:
                lagging = [tp for tp, state in states.items() if not state.fully_replicated]
                if not lagging:
                    return time.monotonic() - began
            await asyncio.sleep(0.5)
        raise LocalStackError(
            f"partitions not fully replicated after {timeout_s:.0f} s: {lagging[:10]}"
        )

    def kill(self, node_id: int) -> None:
        """``kill -9`` the node: no controlled shutdown, its page cache flushed by nobody."""
        logger.info("killing kafka node %d with -9", node_id)
        self._paused.discard(node_id)
        self.cluster.node(node_id).kill()

    def pause(self, node_id: int) -> None:
        """SIGSTOP: the node's connections stay open and nothing answers on them."""
        if not self.cluster.node(node_id).process.signal(signal.SIGSTOP):
            raise LocalStackError(f"kafka node {node_id} is not running")
        self._paused.add(node_id)

    def resume(self, node_id: int) -> None:
        """SIGCONT a paused node."""
        self.cluster.node(node_id).process.signal(signal.SIGCONT)
        self._paused.discard(node_id)

    def stop(self, node_id: int) -> None:
        """A controlled shutdown (SIGTERM): the node hands its leaderships over, then exits."""
        logger.info("stopping kafka node %d", node_id)
        self.cluster.node(node_id).stop()

    def start(self, node_id: int, timeout_s: float = 120.0) -> None:
        """Start the node again on its data and wait until it answers."""
        logger.info("starting kafka node %d", node_id)
        self.cluster.node(node_id).start(timeout_s)

    def heal(self) -> None:
        """Every node resumed and running again (what a test leaves behind)."""
        for node_id in list(self._paused):
            self.resume(node_id)
        missing = [n for n in self.cluster.nodes if n not in self.cluster.running()]
        if missing:
            self.cluster.start()
