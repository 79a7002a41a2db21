"""The sidecar under load on the three-broker cluster (replication 3, min.insync.replicas 2,
acks=all): the busiest task partition's leader killed with -9 under the mirror, a rolling
restart (each broker stopped and started in turn) and the shadow's group coordinator killed
with -9 under the whole sidecar, and two of three brokers down under the mirror. Nothing
acknowledged to RAGFlow is lost, nothing is written twice beyond the batches the sidecar
logged sending again, and (whole sidecar) every entry gets one final verdict."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import valkey.asyncio as avalkey

from sidecar.config import Settings
from sidecar.dev.local_stack.broker_faults import BrokerFaults
from sidecar.transport.topics import TOPIC_PLAN
from tests.faults.cluster_support import Load, busiest_leader, committed_offsets, sidecar_through
from tests.faults.support import FaultRow, Share, wait_until

pytestmark = [pytest.mark.faults, pytest.mark.cluster, pytest.mark.timeout(600)]

# What the mirror alone, and the whole sidecar (mirror, shadow, observer, verdicts), carry beside
# RAGFlow's worker and three brokers on this suite's 2 shared CPUs (docs/operations.md).
KILL_RATE = 1000
ROLLING_RATE = 150
TWO_DOWN_RATE = 300
DOWN_S = 8


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
        # The node comes back (and into every ISR) after the load, in the fixture's heal.
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
            began = time.monotonic()
            await asyncio.to_thread(brokers.stop, node_id)
            stopped = time.monotonic()
            await wait_until(_progress(load, load.rate), "progress", 60)
            await asyncio.to_thread(brokers.start, node_id)
            started = time.monotonic()
            # The next broker goes only once this one is back in every ISR, as an operator's
            # rolling restart waits for under-replicated partitions to reach 0.
            took = await brokers.wait_replicated(list(TOPIC_PLAN))
            restarted.append(
                f"{node_id} (stop {stopped - began:.0f} s, start {started - stopped:.0f} s, "
                f"in sync {took:.0f} s)"
            )
        return "restarted nodes " + ", ".join(restarted)

    row = await sidecar_through(
        "rolling restart (controlled stop, start, in sync; each broker)", cluster_settings,
        brokers, valkey_client, unique, tmp_path, hit, rate=ROLLING_RATE,
    )  # fmt: skip
    fault_table.append(row)


async def test_shadow_group_coordinator_killed_with_9_under_load(
    cluster_settings: Settings,
    brokers: BrokerFaults,
    valkey_client: avalkey.Valkey,
    unique: str,
    tmp_path: Path,
    fault_table: list[FaultRow],
) -> None:
    async def hit(share: Share, load: Load) -> str:
        group = f"shadow-{unique}"
        coordinator = await brokers.coordinator_of(group)
        committed = await committed_offsets(brokers, group)
        await asyncio.to_thread(brokers.kill, coordinator)
        killed = time.monotonic()
        moved_to = await brokers.coordinator_moved(group, coordinator)

        async def commits_again() -> bool:
            return await committed_offsets(brokers, group) > committed

        await wait_until(commits_again, "the shadow to commit again", 120, 0.5)
        return (
            f"coordinator node {coordinator} killed, node {moved_to} took over, the shadow "
            f"committed again {time.monotonic() - killed:.0f} s after the kill"
        )

    row = await sidecar_through(
        "shadow's group coordinator killed -9", cluster_settings, brokers, valkey_client,
        unique, tmp_path, hit, rate=ROLLING_RATE,
    )  # fmt: skip
    fault_table.append(row)


async def test_two_of_three_brokers_down_under_the_mirror(
    cluster_settings: Settings,
    brokers: BrokerFaults,
    valkey_client: avalkey.Valkey,
    unique: str,
    tmp_path: Path,
    fault_table: list[FaultRow],
) -> None:
    async def hit(share: Share, load: Load) -> str:
        down = [1, 2]
        for node_id in down:
            await asyncio.to_thread(brokers.kill, node_id)
        await asyncio.sleep(DOWN_S)
        stalled = load.mirrored
        pending = (await valkey_client.xpending(share.stream, share.mirror_group))["pending"]
        await asyncio.to_thread(brokers.start, down[0])
        await wait_until(_progress(load, 2 * load.rate), "progress with two brokers", 120)
        # The third comes back after the load, in the fixture's heal.
        return (
            f"nodes {down} killed -9 for {DOWN_S} s: the mirror held {pending} entries "
            f"read and unacked at {stalled} mirrored, went on once node {down[0]} was back"
        )

    row = await sidecar_through(
        "two of three brokers down (below min ISR), then back", cluster_settings, brokers,
        valkey_client, unique, tmp_path, hit, rate=TWO_DOWN_RATE, judge=False,
    )  # fmt: skip
    fault_table.append(row)


def _progress(load: Load, more: int) -> Callable[[], Awaitable[bool]]:
    """Whether the mirror has acked ``more`` entries since this was asked."""
    target = load.mirrored + more
    return lambda: load.mirrored_at_least(target)
