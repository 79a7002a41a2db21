"""RAGFlow's API enqueuing through a Kafka outage (its broker paused, then killed): every
``queue_product`` returns within ``SERVE_ENQUEUE_TIMEOUT_MS``, served tasks go to Redis while
Kafka is away and back to Kafka once it answers, and every task runs exactly once, including
those whose produce timed out and landed in Kafka later."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import valkey.asyncio as avalkey

from sidecar.dev.local_stack import LocalStack
from sidecar.dev.local_stack.kafka import LocalKafka
from sidecar.transport.topic_reader import read_topics
from tests.ragflow_support import assert_exactly_once, pending_count, read_produced, wait_until
from tests.serve_support import by_path, make_world

pytestmark = [pytest.mark.faults, pytest.mark.timeout(420)]

ENQUEUE_TIMEOUT_MS = 1000
RAGFLOW_GROUP = "rag_flow_svr_task_broker"


async def test_kafka_paused_then_killed_while_the_api_enqueues(
    stack: LocalStack,
    unique: str,
    tmp_path: Path,
    valkey_client: avalkey.Valkey,
    own_broker: LocalKafka,
) -> None:
    world = await make_world(
        stack, unique, tmp_path, kafka=own_broker.bootstrap_servers,
        KAFKA_SERVE_PERCENT="100", SERVE_ENQUEUE_TIMEOUT_MS=str(ENQUEUE_TIMEOUT_MS),
        SERVE_BREAKER_OPEN_S="2", SERVE_PRODUCE_TIMEOUT_MS="1500",
    )  # fmt: skip
    pid = own_broker.process.pid()
    assert pid is not None
    with world.executor("task_executor_common_o_0") as executor:
        await world.wait_members(1)
        api, out = world.api("produced.jsonl", docs=250, tasks_per_doc=1, rate=5)

        async def queued(n: int) -> None:
            def enough() -> bool:
                return out.exists() and len(read_produced(out)) >= n

            await wait_until(enough, 60, interval_s=0.1, what=f"{n} tasks queued")

        with api:
            await queued(20)
            os.kill(pid, signal.SIGSTOP)  # past the produce request timeout
            await asyncio.sleep(4)
            os.kill(pid, signal.SIGCONT)  # what was sent to it meanwhile lands now
            await asyncio.sleep(5)
            os.kill(pid, signal.SIGSTOP)
            await asyncio.sleep(2)
            await asyncio.to_thread(own_broker.kill)  # gone while paused
            await asyncio.sleep(4)
            await asyncio.to_thread(own_broker.start)
            back = len(read_produced(out))
            await queued(back + 20)  # a breaker's open time and more since Kafka answers
            assert await api.await_exit(120) == 0, api.log_text()
        produced = read_produced(out)
        ids = {str(p["task_id"]) for p in produced}
        await world.wait_executed(valkey_client, ids, timeout_s=180)

        async def settled() -> bool:
            pending = await pending_count(valkey_client, world.streams, RAGFLOW_GROUP)
            return pending == 0 and await world.kafka_settled()

        await wait_until(settled, 120, interval_s=0.5, what="both paths settled")
        executor.terminate()

    assert all(p["ok"] for p in produced), [p for p in produced if not p["ok"]]
    took = sorted(float(p["took_s"]) for p in produced)
    # The bound, plus a busy machine's scheduling: nowhere near Kafka's request timeouts.
    assert took[-1] < ENQUEUE_TIMEOUT_MS / 1000 + 1.0, took[-5:]
    records = await world.executed(valkey_client)
    assert_exactly_once(ids, records)
    path_of = {str(r["task_id"]): "kafka" if ":" in str(r["msg_id"]) else "redis" for r in records}
    order = [str(p["task_id"]) for p in produced]
    assert {path_of[t] for t in order[:15]} == {"kafka"}, "served before the outage"
    assert {path_of[t] for t in order[back + 15 :]} == {"kafka"}, "not back on Kafka after it"
    assert "redis" in {path_of[t] for t in order[20:back]}, "nothing went to Redis meanwhile"

    in_kafka: set[str] = set()

    def take(record: Any) -> None:
        in_kafka.add(json.loads(record.value)["id"])

    await read_topics(world.settings().kafka, [f"{unique}.tasks"], take)
    landed_late = {t for t in in_kafka if path_of.get(t) == "redis"}
    print(
        f"outage: {len(ids)} tasks, {by_path(records)}, queue_product max {took[-1] * 1000:.0f} "
        f"ms, p50 {took[len(took) // 2] * 1000:.1f} ms; {len(landed_late)} timed out, landed "
        "in Kafka later and ran once, from Redis"
    )
    assert landed_late, "no produce was in flight while the broker was paused"
