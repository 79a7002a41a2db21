"""Shared pieces for the mirror tests: a RAGFlow-like worker and reading back from Kafka."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

import valkey.asyncio as avalkey

from sidecar.config import Settings
from sidecar.dev.samples import ragflow_tasks
from sidecar.mirror.mirror import Mirror
from sidecar.transport import KafkaConsumer
from sidecar.transport.topics import TOPIC_PLAN, init_topics

__all__ = [
    "RAGFLOW_GROUP",
    "group_state",
    "mirror_settings",
    "mirror_until",
    "prepare_stream",
    "ragflow_tasks",
    "ragflow_worker",
    "read_mirrored",
    "stream_in",
]

RAGFLOW_GROUP = "rag_flow_svr_task_broker"


async def prepare_stream(settings: Settings, client: avalkey.Valkey, stream: str) -> None:
    """The task topics made, and RAGFlow's group created on ``stream`` (with the stream, at 0,
    as RAGFlow's executor creates it)."""
    await init_topics(settings.kafka)
    await client.xgroup_create(stream, RAGFLOW_GROUP, id="0", mkstream=True)


async def stream_in(
    client: avalkey.Valkey, stream: str, total: int, chunk: int = 1000, pause_s: float = 0.05
) -> None:
    """XADD ``total`` RAGFlow-shaped tasks, ``chunk`` per pipeline with a pause in between."""
    tasks = ragflow_tasks(total)
    for start in range(0, total, chunk):
        pipe = client.pipeline(transaction=False)
        for task in tasks[start : start + chunk]:
            pipe.xadd(stream, {"message": json.dumps(task)})
        await pipe.execute()
        await asyncio.sleep(pause_s)


async def ragflow_worker(
    client: avalkey.Valkey, stream: str, handled: int, name: str = "task_executor_x_0"
) -> list[bytes]:
    """Consume like RAGFlow's collect(): XREADGROUP COUNT 1 in RAGFlow's group, then XACK."""
    seen: list[bytes] = []
    deadline = time.monotonic() + 120
    while len(seen) < handled and time.monotonic() < deadline:
        reply = await client.xreadgroup(RAGFLOW_GROUP, name, {stream: ">"}, count=1, block=5)
        for _, entries in reply or []:
            for entry_id, _fields in entries:
                seen.append(entry_id)
                await client.xack(stream, RAGFLOW_GROUP, entry_id)
        if not reply:
            await asyncio.sleep(0.005)
    return seen


@dataclass(frozen=True)
class Mirrored:
    topic: str
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]
    partition: int
    offset: int


async def read_mirrored(
    settings: Settings, streams: set[str], expected: int, timeout_s: float = 90.0
) -> list[Mirrored]:
    """Every record in the task topics and the DLQ that came from ``streams``."""
    found: list[Mirrored] = []
    group = f"reader-{uuid.uuid4().hex[:8]}"
    async with KafkaConsumer(settings.kafka, list(TOPIC_PLAN), group) as consumer:
        deadline = time.monotonic() + timeout_s
        quiet_polls = 0
        while time.monotonic() < deadline:
            batch = await consumer.poll_batch(5000, 500)
            for m in batch:
                headers = dict(m.headers)
                # Other tests write records with headers that are not UTF-8 (hostile input).
                if headers.get("x-redis-stream", b"").decode("utf-8", "replace") in streams:
                    found.append(Mirrored(m.topic, m.key, m.value, headers, m.partition, m.offset))
            quiet_polls = 0 if batch else quiet_polls + 1
            # Past the expected count, keep reading briefly: duplicates must be seen too.
            if len(found) >= expected and quiet_polls >= 2:
                break
    return found


async def group_state(client: avalkey.Valkey, stream: str, group: str) -> dict[str, Any]:
    """XINFO GROUPS, consumer names and pending ids of one group (idle times left out)."""
    info = next(g for g in await client.xinfo_groups(stream) if g["name"].decode() == group)
    consumers = sorted(c["name"] for c in await client.xinfo_consumers(stream, group))
    pending = await client.xpending_range(stream, group, min="-", max="+", count=10_000)
    return {
        "group": info,
        "consumers": consumers,
        "pending": [(p["message_id"], p["consumer"], p["times_delivered"]) for p in pending],
    }


def mirror_settings(base: Settings, streams: list[str], **extra: str) -> Settings:
    return Settings.from_env(
        {
            "REDIS_URL": f"redis://{base.redis.host}:{base.redis.port}/1",
            "KAFKA_BOOTSTRAP_SERVERS": ",".join(base.kafka.bootstrap_servers),
            "KAFKA_LINGER_MS": "1",
            "MIRROR_STREAMS": ",".join(streams),
            # With two streams the first is the priority one, as te.1.common is.
            "MIRROR_PRIORITY_STREAMS": streams[0] if len(streams) > 1 else "te.1.common",
            "MIRROR_START": "earliest",
            "MIRROR_BLOCK_MS": "100",
            **extra,
        }
    )


async def mirror_until(mirror: Mirror, read: int) -> None:
    for _ in range(1000):
        if mirror.stats.read >= read:
            return
        await mirror.mirror_once()
    raise AssertionError(f"mirror read {mirror.stats.read} of {read}")
