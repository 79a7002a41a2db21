"""``make demo``: the sidecar beside a pretend RAGFlow on the local stack.

Starts real Valkey and Kafka, creates the topics, enqueues RAGFlow-shaped tasks of every kind
(plus a few broken entries) on RAGFlow's own streams while a RAGFlow-like worker consumes them
in RAGFlow's group, mirrors everything into Kafka and prints where each task went.
"""

from __future__ import annotations

import asyncio
import json
import statistics
from typing import Any

from sidecar.local_stack import LocalStack
from sidecar.mirror import Mirror
from sidecar.mq.redis_streams import create_client
from sidecar.roundtrip import round_trip
from sidecar.samples import ragflow_tasks
from sidecar.settings import Settings
from sidecar.topics import init_topics

STREAMS = ("te.1.common", "te.0.common")
RAGFLOW_GROUP = "rag_flow_svr_task_broker"
BROKEN_ENTRIES: tuple[dict[bytes, bytes], ...] = (
    {b"message": b"{not json"},
    {b"message": b'{"doc_id": "no id"}'},
    {b"payload": b"no message field"},
)


async def _ragflow_group_state(client: Any) -> list[Any]:
    state = []
    for stream in STREAMS:
        for info in await client.xinfo_groups(stream):
            if info["name"] == RAGFLOW_GROUP.encode():
                state.append((stream, info["pending"], info["last-delivered-id"]))
    return state


async def run_demo(stack: LocalStack, tasks: int = 2000) -> int:
    settings = Settings.from_env(
        {
            "REDIS_URL": stack.valkey.url,
            "KAFKA_BOOTSTRAP_SERVERS": stack.kafka.bootstrap_servers,
            "MIRROR_START": "earliest",
            "MIRROR_BLOCK_MS": "200",
            "KAFKA_TRAFFIC_PERCENT": "100",
        }
    )
    for line in (await init_topics(settings.kafka)).lines():
        print(line)
    for backend in ("redis", "kafka"):
        trip = await round_trip(settings, backend)
        print(
            f"round trip through {backend}: {'byte-identical' if trip.identical else 'DIFFERENT'}"
        )

    client = create_client(settings.redis)
    try:
        # The local stack is ours: start from empty streams, as a fresh RAGFlow would.
        await client.delete(*STREAMS)
        for stream in STREAMS:
            await client.xgroup_create(stream, RAGFLOW_GROUP, id="0", mkstream=True)
        pipe = client.pipeline(transaction=False)
        for n, task in enumerate(ragflow_tasks(tasks)):
            pipe.xadd(STREAMS[0] if n % 10 == 0 else STREAMS[1], {"message": json.dumps(task)})
        for fields in BROKEN_ENTRIES:
            pipe.xadd(STREAMS[1], fields)
        await pipe.execute()
        total = tasks + len(BROKEN_ENTRIES)
        print(f"enqueued {total} entries on {', '.join(STREAMS)} as RAGFlow does (XADD message)")
        # RAGFlow's worker takes a few; the mirror must neither take nor disturb its work.
        for stream in STREAMS:
            await client.xreadgroup(RAGFLOW_GROUP, "task_executor_demo_0", {stream: ">"}, count=3)
        before = await _ragflow_group_state(client)

        stop = asyncio.Event()
        async with Mirror(settings) as mirror:
            running = asyncio.create_task(mirror.run(stop), name="demo-mirror")
            try:
                for _ in range(600):
                    if mirror.stats.read >= total and all(
                        v == 0 for v in (await mirror.lag()).values()
                    ):
                        break
                    await asyncio.sleep(0.1)
            finally:
                stop.set()
                await running
            stats = mirror.stats
        after = await _ragflow_group_state(client)
    finally:
        await client.aclose()

    print("mirrored to Kafka:")
    for topic, count in sorted(stats.mirrored.items()):
        print(f"  {topic:30} {count:6}")
    for reason, count in sorted(stats.dead_lettered.items()):
        print(f"  {'ragflow.task.dlq ' + reason:30} {count:6}")
    latency = sorted(stats.latency_ms)
    if latency:
        p99 = latency[max(int(len(latency) * 0.99) - 1, 0)]
        print(
            f"XADD to Kafka ack, all {total} enqueued at once: "
            f"p50 {statistics.median(latency):.0f} ms, p99 {p99} ms"
        )
    untouched = before == after
    print(f"RAGFlow's group {RAGFLOW_GROUP}: {'untouched' if untouched else 'CHANGED'} ({after})")
    ok = untouched and sum(stats.mirrored.values()) + sum(stats.dead_lettered.values()) == total
    return 0 if ok else 1
