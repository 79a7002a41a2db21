"""Served records RAGFlow cannot take (no JSON object with a string id): to ``ragflow.task.dlq``
with their bytes and the reason. Nothing else is ever dead-lettered on the served path: a
task that fails or kills its executor is RAGFlow's to abandon, by its own ``retry_count``."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from sidecar.config import KafkaSettings
from sidecar.errors import SidecarError
from sidecar.transport.dead_letter import dead_letter
from sidecar.transport.kafka import KafkaProducer
from sidecar.transport.message import QueueMessage

logger = logging.getLogger(__name__)

_DLQ_MAX_BYTES = 1_000_000


class DeadLetters:
    """A producer of its own (started on first use), replaced when Kafka says it is broken."""

    def __init__(self, settings: KafkaSettings) -> None:
        self._settings = settings
        self._producer = KafkaProducer(settings, linger_ms=0)

    async def send(
        self, message: QueueMessage, queue: str, reason: str, detail: str, stopping: asyncio.Event
    ) -> None:
        """Tried until the DLQ has it (or ``stopping``): until then the record is not finished,
        so nothing past it is committed, and a restart reads it again."""
        record = dead_letter(
            reason=reason,
            detail=detail,
            value=message.value,
            stream=queue,
            entry_id=message.id,
            stage="serve",
            max_value_bytes=_DLQ_MAX_BYTES,
            extra_headers=(
                ("x-source-topic", message.topic.encode()),
                ("x-source-offset", f"{message.partition}:{message.offset}".encode()),
                *message.headers,
            ),
        )
        while True:
            try:
                await self._producer.start()
                await self._producer.send(
                    record.destination, record.value, key=record.key, headers=record.headers
                )
                return
            except SidecarError as exc:
                if stopping.is_set():
                    raise
                logger.warning("dead-lettering %s failed (again in 1 s): %s", message.id, exc)
                if exc.needs_new_client:
                    broken, self._producer = (
                        self._producer,
                        KafkaProducer(self._settings, linger_ms=0),
                    )
                    with contextlib.suppress(SidecarError):
                        await broken.stop()
                await asyncio.sleep(1)

    async def stop(self) -> None:
        await self._producer.stop()
