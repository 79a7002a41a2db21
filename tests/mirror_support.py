"""Shared pieces for the mirror tests: RAGFlow-shaped tasks, a RAGFlow-like worker, Kafka reads."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Any

import valkey.asyncio as avalkey

from sidecar.mq import KafkaConsumer
from sidecar.settings import Settings
from sidecar.topics import TOPIC_PLAN

RAGFLOW_GROUP = "rag_flow_svr_task_broker"


def ragflow_tasks(n: int) -> list[dict[str, Any]]:
    """``n`` tasks cycling through the five shapes of ../shared/ragflow-queue.md."""
    tasks: list[dict[str, Any]] = []
    for i in range(n):
        tid, doc = uuid.uuid1().hex, uuid.uuid1().hex
        common = {"begin_at": "2026-08-22 10:15:03", "digest": "9f3c1b2a7d4e6f80",
                  "create_time": 1787379303123 + i, "create_date": "2026-08-22 10:15:03",
                  "update_time": 1787379303123 + i, "update_date": "2026-08-22 10:15:03"}  # fmt: skip
        kind = i % 5
        if kind == 0:
            task = {"id": tid, "doc_id": doc, "progress": 0.0, "from_page": 0, "to_page": 12,
                    "priority": 0, **common}  # fmt: skip
        elif kind == 1:
            task = {"id": tid, "doc_id": "graph_raptor_x", "from_page": 100000000,
                    "to_page": 100000000, "task_type": "raptor",
                    "progress_msg": "10:20:00 created task raptor", **common,
                    "doc_ids": ["d1", "d2"]}  # fmt: skip
        elif kind == 2:
            task = {"id": tid, "doc_id": doc, "from_page": 100000000, "to_page": 100000000,
                    "task_type": "raptor", "progress_msg": "", **common, "doc_ids": [doc]}  # fmt: skip
        elif kind == 3:
            task = {"id": tid, "doc_id": doc, "task_type": "dataflow", "kb_id": "kb1",
                    "tenant_id": "tenant-7", "dataflow_id": "df1", "file": None, **common}  # fmt: skip
        else:
            task = {"id": tid, "task_id": tid, "task_type": "memory", "memory_id": f"mem{i % 3}",
                    "tenant_id": "tenant-7", "source_id": 1042,
                    "message_dict": {"user_id": "", "agent_id": "a1", "session_id": "s1",
                                     "user_input": "Grüße, 你好 \"quoted\"\n",
                                     "agent_response": "ok"}}  # fmt: skip
        tasks.append(task)
    return tasks


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
                if headers.get("x-redis-stream", b"").decode() in streams:
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
