"""A produce/consume round trip through both backends: the smoke test ``make demo`` runs."""

from __future__ import annotations

import logging
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

from sidecar.config import MQBackend, Settings
from sidecar.errors import MessageDecodeError
from sidecar.transport.factory import create_consumer, create_producer
from sidecar.transport.message import QueueMessage, encode_task
from sidecar.transport.topics import PARSE_TOPIC

logger = logging.getLogger(__name__)

ROUNDTRIP_STREAM = "ragflow_sidecar.roundtrip"


@dataclass(frozen=True)
class RoundTrip:
    backend: MQBackend
    destination: str
    sent_id: str
    received_id: str
    identical: bool
    elapsed_ms: float


def sample_parse_task() -> dict[str, Any]:
    """A parse task shaped as RAGFlow's ``queue_tasks`` writes it."""
    now = time.strftime("%Y-%m-%d %H:%M:%S")
    millis = int(time.time() * 1000)
    return {
        "id": uuid.uuid1().hex,
        "doc_id": uuid.uuid1().hex,
        "progress": 0.0,
        "from_page": 0,
        "to_page": 12,
        "begin_at": now,
        "digest": uuid.uuid4().hex[:16],
        "priority": 0,
        "create_time": millis,
        "create_date": now,
        "update_time": millis,
        "update_date": now,
    }


async def round_trip(settings: Settings, backend: MQBackend, timeout_s: float = 30.0) -> RoundTrip:
    """Send one task and read it back in a fresh group; the value must come back unchanged."""
    task = sample_parse_task()
    destination = PARSE_TOPIC if backend == "kafka" else ROUNDTRIP_STREAM
    group = f"ragflow-sidecar-roundtrip-{uuid.uuid4().hex[:8]}"
    started = time.perf_counter()
    async with create_producer(backend, redis=settings.redis, kafka=settings.kafka) as producer:
        sent = await producer.send(destination, task, key=task["doc_id"])
    consumer = create_consumer(
        backend,
        [destination],
        redis=settings.redis,
        kafka=settings.kafka,
        group=group,
        consumer_name=f"roundtrip-{os.getpid()}",
    )
    async with consumer:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for message in await consumer.poll_batch(100, 1000):
                await message.ack()
                if _task_id(message) == task["id"]:
                    return RoundTrip(
                        backend=backend,
                        destination=destination,
                        sent_id=sent.id,
                        received_id=message.id,
                        identical=message.value == encode_task(task),
                        elapsed_ms=(time.perf_counter() - started) * 1000,
                    )
    raise TimeoutError(f"task {task['id']} did not come back through {backend} in {timeout_s} s")


def _task_id(message: QueueMessage) -> object:
    """The task id of a message, or ``None``: the topic may hold anything, broken records too."""
    try:
        return message.payload.get("id")
    except MessageDecodeError:
        return None
