"""The served path on the three-broker cluster: RAGFlow's API (the stand-in, through
``ragflow_mq.install()``) enqueuing and its executors running tasks while the executors'
group coordinator is killed with -9, and while two of three brokers are down (below
``min.insync.replicas``, and without a controller quorum). Every task queued is executed
exactly once by task id; no ``queue_product`` holds RAGFlow past ``SERVE_ENQUEUE_TIMEOUT_MS``."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import valkey.asyncio as avalkey

from sidecar.dev.local_stack import LocalStack
from sidecar.dev.local_stack.broker_faults import BrokerFaults
from sidecar.transport.topic_reader import read_topics
from tests.faults.support import FaultRow
from tests.ragflow_support import assert_exactly_once, pending_count, read_produced, wait_until
from tests.serve_support import ServeWorld, by_path, make_world

pytestmark = [pytest.mark.faults, pytest.mark.cluster, pytest.mark.timeout(600)]

ENQUEUE_TIMEOUT_MS = 1000
RAGFLOW_GROUP = "rag_flow_svr_task_broker"
RATE = 20  # tasks/s from RAGFlow's API: a busy site's upload rate, not a bench


async def _serve_through(
    world: ServeWorld,
    client: avalkey.Valkey,
    docs: int,
    hit: Callable[[Callable[[int], Awaitable[None]]], Awaitable[str]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str]:
    """Two executors and the API queuing at ``RATE``/s (``docs`` tasks at most); ``hit`` gets a
    waiter for "n tasks queued" and does the fault; then the API is stopped (SIGTERM: after
    the task in hand). Returns what the API queued, what ran, and ``hit``'s note."""
    with (
        world.executor("task_executor_common_c_0") as first,
        world.executor("task_executor_common_c_1") as second,
    ):
        await world.wait_members(2)
        api, out = world.api("produced.jsonl", docs=docs, tasks_per_doc=1, rate=RATE)

        async def queued(n: int) -> None:
            def enough() -> bool:
                return out.exists() and len(read_produced(out)) >= n

            await wait_until(enough, 120, interval_s=0.1, what=f"{n} tasks queued")

        with api:
            await queued(2 * RATE)
            note = await hit(queued)
            assert await asyncio.to_thread(api.terminate) == 0, api.log_text()
        produced = read_produced(out)
        ids = {str(p["task_id"]) for p in produced}
        await world.wait_executed(client, ids, timeout_s=180)

        async def settled() -> bool:
            pending = await pending_count(client, world.streams, RAGFLOW_GROUP)
            return pending == 0 and await world.kafka_settled()

        await wait_until(settled, 120, interval_s=0.5, what="both paths settled")
        first.terminate()
        second.terminate()
    return produced, await world.executed(client), note


async def served_since(
    world: ServeWorld, client: avalkey.Valkey, moment: float, count: int
) -> None:
    """Wait until ``count`` tasks started from Kafka after ``moment`` (monotonic, the clock the
    executors record)."""

    async def enough() -> bool:
        records = await world.executed(client)
        return sum(":" in str(r["msg_id"]) and r["t"] > moment for r in records) >= count

    await wait_until(enough, 120, interval_s=0.25, what=f"{count} tasks served from Kafka")


def _row(
    fault: str, produced: list[dict[str, Any]], records: list[dict[str, Any]], note: str
) -> FaultRow:
    """Acknowledged: tasks ``queue_product`` took; lost: never executed; duplicates:
    executions beyond the first; recover s: the longest time no task started from Kafka."""
    ids = {str(p["task_id"]) for p in produced if p["ok"]}
    ran = [str(r["task_id"]) for r in records]
    starts = sorted(float(r["t"]) for r in records if ":" in str(r["msg_id"]))
    gap = max((b - a for a, b in itertools.pairwise(starts)), default=0.0)
    took = max(float(p["took_s"]) for p in produced)
    return FaultRow(
        fault, len(ids), len(ids - set(ran)), len(ran) - len(set(ran)), gap,
        f"{dict(by_path(records))}; queue_product max {took * 1000:.0f} ms; {note}",
    )  # fmt: skip


async def _served_world(
    stack: LocalStack, brokers: BrokerFaults, unique: str, tmp_path: Path
) -> ServeWorld:
    """Every task served from the cluster, RAGFlow's enqueue bounded and its breaker short."""
    return await make_world(
        stack, unique, tmp_path, kafka=brokers.cluster.bootstrap_servers, replication=3,
        KAFKA_SERVE_PERCENT="100", SERVE_ENQUEUE_TIMEOUT_MS=str(ENQUEUE_TIMEOUT_MS),
        SERVE_BREAKER_OPEN_S="2",
    )  # fmt: skip


async def test_executors_group_coordinator_killed_with_9(
    stack: LocalStack,
    brokers: BrokerFaults,
    unique: str,
    tmp_path: Path,
    valkey_client: avalkey.Valkey,
    fault_table: list[FaultRow],
) -> None:
    world = await _served_world(stack, brokers, unique, tmp_path)

    async def hit(queued: Callable[[int], Awaitable[None]]) -> str:
        coordinator = await brokers.coordinator_of(world.group)
        await asyncio.to_thread(brokers.kill, coordinator)
        killed = time.monotonic()
        moved_to = await brokers.coordinator_moved(world.group, coordinator)
        # The group goes on under its new coordinator: tasks served from Kafka again (the
        # dead node also led task partitions: produces to them time out, and the breaker sends
        # tasks to Redis until the controller fences it and a probe succeeds).
        await served_since(world, valkey_client, time.monotonic(), 2 * RATE)
        serving_s = time.monotonic() - killed
        await asyncio.to_thread(brokers.start, coordinator)
        await served_since(world, valkey_client, time.monotonic(), RATE)
        return (
            f"coordinator node {coordinator} killed, node {moved_to} took over, "
            f"{2 * RATE} tasks served from Kafka {serving_s:.0f} s after the kill"
        )

    produced, records, note = await _serve_through(world, valkey_client, 100 * RATE, hit)
    assert all(p["ok"] for p in produced)
    assert_exactly_once({str(p["task_id"]) for p in produced}, records)
    row = _row("executors' group coordinator killed -9", produced, records, note)
    print(row)
    fault_table.append(row)


async def test_two_of_three_brokers_down_then_back(
    stack: LocalStack,
    brokers: BrokerFaults,
    unique: str,
    tmp_path: Path,
    valkey_client: avalkey.Valkey,
    fault_table: list[FaultRow],
) -> None:
    world = await _served_world(stack, brokers, unique, tmp_path)
    marks: dict[str, int] = {}

    def queued_now() -> int:
        return len(read_produced(world.tmp / "produced.jsonl"))

    async def hit(queued: Callable[[int], Awaitable[None]]) -> str:
        survivor = await brokers.coordinator_of(world.group)
        down = [n for n in sorted(brokers.cluster.nodes) if n != survivor]
        for node_id in down:
            await asyncio.to_thread(brokers.kill, node_id)
        marks["down"] = queued_now()
        await queued(marks["down"] + 8 * RATE)  # 8 s below min.insync.replicas
        began = time.monotonic()
        await asyncio.to_thread(brokers.start, down[0])
        answered = time.monotonic() - began
        marks["back"] = queued_now()
        # Two brokers again: tasks are served from Kafka once the returning replica is back
        # in the ISR and the breaker lets a probe through.
        await served_since(world, valkey_client, time.monotonic(), 2 * RATE)
        resumed = time.monotonic() - began
        await asyncio.to_thread(brokers.start, down[1])
        await brokers.wait_replicated([f"{unique}.tasks", f"{unique}.tasks.priority"])
        return (
            f"nodes {down} killed -9 after task {marks['down']}, node {down[0]} started after "
            f"8 s ({answered:.0f} s to answer, served from Kafka again {resumed:.0f} s after "
            f"its start), node {down[1]} after that"
        )

    produced, records, note = await _serve_through(world, valkey_client, 100 * RATE, hit)
    ids = {str(p["task_id"]) for p in produced}
    assert all(p["ok"] for p in produced), [p for p in produced if not p["ok"]][:3]
    took = max(float(p["took_s"]) for p in produced)
    assert took < ENQUEUE_TIMEOUT_MS / 1000 + 1.0, took  # bounded: then Redis
    assert_exactly_once(ids, records)
    path_of = {str(r["task_id"]): "kafka" if ":" in str(r["msg_id"]) else "redis" for r in records}
    order = [str(p["task_id"]) for p in produced]
    assert {path_of[t] for t in order[: marks["down"] - 5]} == {"kafka"}, "before the fault"
    assert "redis" in {path_of[t] for t in order[marks["down"] : marks["back"]]}, "meanwhile"
    # (Back on Kafka: the hit waited for tasks served from it. The very last ones may be on
    # Redis: a broker returning takes its preferred leaderships back, and an enqueue caught in
    # that move may overrun the bound and open the breaker; docs/operations.md.)
    # Every task acknowledged by Kafka is in Kafka (none lost with the two brokers' data).
    in_kafka: set[str] = set()

    def take(record: Any) -> None:
        in_kafka.add(json.loads(record.value)["id"])

    await read_topics(world.settings().kafka, [f"{unique}.tasks"], take)
    assert {t for t, path in path_of.items() if path == "kafka"} <= in_kafka
    row = _row("two of three brokers down (below min ISR), then back", produced, records, note)
    row.note += f"; {len(in_kafka & {t for t, p in path_of.items() if p == 'redis'})} timed out"
    row.note += " and landed in Kafka later, ran once from Redis"
    print(row)
    fault_table.append(row)
