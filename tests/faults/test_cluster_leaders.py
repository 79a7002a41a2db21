"""Leaders moving under load on the three-broker cluster (replication 3, min.insync.replicas 2,
acks=all): the busiest task partition's leader killed with -9, and a rolling restart (each
broker stopped and started in turn). Nothing acknowledged to RAGFlow is lost, nothing is
written twice beyond the retries the sidecar logged, every entry gets one final verdict."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import valkey.asyncio as avalkey

from sidecar.config import Settings
from sidecar.dev.local_stack.broker_faults import BrokerFaults
from sidecar.transport.topics import TOPIC_PLAN
from tests.faults.cluster_support import Load, busiest_leader, sidecar_through
from tests.faults.support import FaultRow, Share, wait_until

pytestmark = [pytest.mark.faults, pytest.mark.cluster, pytest.mark.timeout(600)]

# What the mirror alone, and the whole sidecar (mirror, shadow, observer, verdicts), carry beside
# RAGFlow's worker and three brokers on this suite's 2 shared CPUs (docs/operations.md).
KILL_RATE = 1000
ROLLING_RATE = 150


async def test_busiest_partition_leader_killed_with_9_under_load(
    cluster_settings: Settings,
    brokers: BrokerFaults,
    valkey_client: avalkey.Valkey,
    unique: str,
    tmp_path: Path,
    fault_table: list[FaultRow],
) -> None:
    async def hit(share: Share, load: Load) -> str:
        topic, partition, leader = await busiest_leader(brokers)
        await asyncio.to_thread(brokers.kill, leader)
        # The two brokers left take the writes: the mirror goes on without the dead one.
        await wait_until(_progress(load, 2 * load.rate), "progress", 60)
        new_leader = await brokers.leader_of(topic, partition)
        assert new_leader != leader
        await asyncio.to_thread(brokers.start, leader)
        await brokers.wait_replicated(list(TOPIC_PLAN))
        return f"killed node {leader} leading {topic}:{partition}, node {new_leader} took over"

    row = await sidecar_through(
        "leader of the busiest task partition killed -9", cluster_settings, brokers,
        valkey_client, unique, tmp_path, hit, rate=KILL_RATE, judge=False,
    )  # fmt: skip
    fault_table.append(row)


async def test_rolling_restart_under_load(
    cluster_settings: Settings,
    brokers: BrokerFaults,
    valkey_client: avalkey.Valkey,
    unique: str,
    tmp_path: Path,
    fault_table: list[FaultRow],
) -> None:
    async def hit(share: Share, load: Load) -> str:
        restarted = []
        for node_id in sorted(brokers.cluster.nodes):
            await asyncio.to_thread(brokers.stop, node_id)
            await wait_until(_progress(load, load.rate), "progress", 60)
            await asyncio.to_thread(brokers.start, node_id)
            # The next broker goes only once this one is back in every ISR, as an operator's
            # rolling restart waits for under-replicated partitions to reach 0.
            took = await brokers.wait_replicated(list(TOPIC_PLAN))
            restarted.append(f"{node_id} ({took:.0f} s to in-sync)")
        return "restarted nodes " + ", ".join(restarted)

    row = await sidecar_through(
        "rolling restart (controlled stop, start, in sync; each broker)", cluster_settings,
        brokers, valkey_client, unique, tmp_path, hit, rate=ROLLING_RATE,
    )  # fmt: skip
    fault_table.append(row)


def _progress(load: Load, more: int) -> Callable[[], Awaitable[bool]]:
    """Whether the mirror has acked ``more`` entries since this was asked."""
    target = load.mirrored + more
    return lambda: load.mirrored_at_least(target)
