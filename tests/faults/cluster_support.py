"""What the cluster rows share: a RAGFlow-like load at a set rate until told to stop, RAGFlow's
worker on it, the whole sidecar (``run``) on the three-broker cluster, and the stall the fault
caused in the mirror's progress."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import valkey.asyncio as avalkey
from aiokafka.admin import AIOKafkaAdminClient

from sidecar.config import Settings
from sidecar.dev.local_stack.broker_faults import BrokerFaults
from sidecar.dev.samples import ragflow_task_stream
from sidecar.transport.topics import TASK_TOPICS
from tests.faults.support import (
    FaultRow,
    Share,
    SidecarProcess,
    assert_one_verdict_each,
    own_settings,
    wait_until,
)
from tests.mirror_support import RAGFLOW_GROUP

WORKER = "task_executor_x_0"
# The default: a batch outlives a failover (the controller fences a dead broker after
# broker.session.timeout.ms, 9 s) instead of being given up and sent again.
REQUEST_TIMEOUT_MS = 30000


@dataclass
class Load:
    """XADDs at ``rate`` per second (a pipeline every 0.1 s) until ``stop`` is set, RAGFlow's
    worker acking them, and a watch of the mirror's group: the longest time it acked nothing
    while entries waited (``stall_s``)."""

    client: avalkey.Valkey
    stream: str
    mirror_group: str
    rate: int
    ids: list[str] = field(default_factory=list)
    handled: Counter[str] = field(default_factory=Counter)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    produced_s: float = 0.0
    stall_s: float = 0.0
    mirrored: int = 0

    @property
    def achieved_rate(self) -> float:
        return len(self.ids) / self.produced_s if self.produced_s else 0.0

    async def produce(self) -> None:
        # Made as sent: a list made up front blocked this loop (the watch, the worker and the
        # waits' clocks with it) for minutes on a busy machine, and the mirror saw nothing.
        tasks = ragflow_task_stream()
        chunk = max(1, self.rate // 10)
        began = time.monotonic()
        tick = began
        while not self.stop.is_set():
            pipe = self.client.pipeline(transaction=False)
            for _ in range(chunk):
                pipe.xadd(self.stream, {"message": json.dumps(next(tasks))})
            self.ids += [entry_id.decode() for entry_id in await pipe.execute()]
            tick += 0.1
            await asyncio.sleep(max(0.0, tick - time.monotonic()))
        self.produced_s = time.monotonic() - began

    async def work(self, timeout_s: float = 600) -> None:
        """RAGFlow's executor: XREADGROUP COUNT 10 in RAGFlow's group, XACK each; until the
        load has stopped and every entry was handed out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.stop.is_set() and len(self.handled) >= len(self.ids):
                return
            reply = await self.client.xreadgroup(
                RAGFLOW_GROUP, WORKER, {self.stream: ">"}, count=10, block=50
            )
            for _, entries in reply or []:
                for entry_id, _fields in entries:
                    self.handled[entry_id.decode()] += 1
                    await self.client.xack(self.stream, RAGFLOW_GROUP, entry_id)

    async def watch(self) -> None:
        """Sample the mirror's acked count every 0.2 s until it has every entry."""
        last_change = time.monotonic()
        while not (self.stop.is_set() and self.mirrored >= len(self.ids)):
            groups = await self.client.xinfo_groups(self.stream)
            info = next((g for g in groups if g["name"].decode() == self.mirror_group), None)
            acked = 0 if info is None else int(info.get("entries-read") or 0) - info["pending"]
            now = time.monotonic()
            if acked > self.mirrored or acked >= len(self.ids):
                self.mirrored = acked
                last_change = now
            elif self.mirrored:  # waiting entries, no progress (counted once the mirror runs)
                self.stall_s = max(self.stall_s, now - last_change)
            await asyncio.sleep(0.2)

    async def mirrored_at_least(self, n: int) -> bool:
        return self.mirrored >= n


async def sidecar_through(
    fault: str,
    cluster_settings: Settings,
    brokers: BrokerFaults,
    client: avalkey.Valkey,
    unique: str,
    tmp_path: Path,
    hit: Callable[[Share, Load], Awaitable[str]],
    *,
    rate: int,
    judge: bool = True,
) -> FaultRow:
    """The whole sidecar (``run``; with ``judge`` false the mirror alone) on the cluster under
    ``rate`` tasks/s; once the mirror carries it, ``hit`` does the fault (and returns a note);
    the load stops when it returns. Checked: every acknowledged XADD in Kafka (duplicates only
    as many batches as the produce retries and restarts the sidecar logged), RAGFlow's worker
    given each once, one final verdict per entry."""
    own = own_settings(cluster_settings, unique, bootstrap=brokers.cluster.bootstrap_servers)
    share = await Share.prepare(own, client, unique)
    load = Load(client, unique, share.mirror_group, rate)
    env = share.env(KAFKA_REQUEST_TIMEOUT_MS=str(REQUEST_TIMEOUT_MS), SHADOW_HANDLER="noop")
    log = tmp_path / "sidecar.log"
    with SidecarProcess(["run" if judge else "mirror"], env, log) as sidecar:
        producing = asyncio.create_task(load.produce())
        working = asyncio.create_task(load.work())
        watching = asyncio.create_task(load.watch())
        try:
            await wait_until(lambda: load.mirrored_at_least(rate), "the mirror carrying", 120)
            note = await hit(share, load)
        finally:
            load.stop.set()
        await producing
        total = len(load.ids)
        verdicts = await share.judged(total, timeout_s=300) if judge else []
        await working
        await watching
        assert sidecar.stop() == 0
    text = log.read_text()
    kinds = assert_one_verdict_each(verdicts, load.ids) if judge else "not judged (mirror only)"
    # A record is written twice only when a produce the broker wrote was not confirmed and
    # was sent again (by a new producer: the idempotent one drops its own retries), or when
    # the sidecar restarted its loops with a batch in hand: one batch each at most.
    restarts = text.count("starting again in")
    retries = text.count("Kafka did not take")
    row = await share.assert_intact(total, load.ids, _handled(load), crashes=restarts + retries)
    return FaultRow.of(
        fault,
        row,
        load.stall_s,
        f"{load.achieved_rate:.0f} tasks/s offered; {note}; verdicts {kinds}; "
        f"sidecar restarts {restarts}, produce retries {retries}",
    )


async def _handled(load: Load) -> Counter[str]:
    return load.handled


async def busiest_leader(brokers: BrokerFaults) -> tuple[str, int, int]:
    """The task partition holding the most records, and the node leading it."""
    topic, partition = await brokers.busiest_partition(list(TASK_TOPICS))
    return topic, partition, await brokers.leader_of(topic, partition)


async def committed_offsets(brokers: BrokerFaults, group: str) -> int:
    """The sum of ``group``'s committed offsets (-1 when the coordinator cannot say now)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=brokers.cluster.bootstrap_servers)
    try:
        await admin.start()
        offsets = await admin.list_consumer_group_offsets(group)
    except Exception:  # the coordinator is moving: "not now"
        return -1
    finally:
        await admin.close()
    return sum(meta.offset for meta in offsets.values())
