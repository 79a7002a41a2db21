"""The Kafka producer: ``acks="all"`` and ``enable_idempotence=True``.

aiokafka has neither ``retries`` nor ``max_in_flight_requests_per_connection`` (the seed design
passes both): it keeps at most one in-flight batch per partition and retries it until
``request_timeout_ms``, and idempotence lets the broker drop a retried duplicate. Together they
keep per-key order with no loss.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka import errors as kafka_errors

from sidecar.errors import MessageQueueError, RetriableMessageQueueError, SidecarError
from sidecar.transport.base import MessageQueueProducer, OutgoingMessage, SendResult
from sidecar.transport.kafka_errors import (
    kafka_where,
    translate_kafka_error,
    translate_kafka_errors,
)
from sidecar.transport.options import KafkaSettings
from sidecar.transport.partitioner import KeyPartitioner

logger = logging.getLogger(__name__)


class KafkaProducer(MessageQueueProducer):
    """Idempotent, ``acks=all`` producer; ``send_many`` keeps every record of a batch in flight."""

    def __init__(self, settings: KafkaSettings, **overrides: Any) -> None:
        super().__init__()
        self._settings = settings
        self._overrides = overrides
        self._producer: Any = None
        self._where = kafka_where(settings)
        timeout_ms = int(overrides.get("request_timeout_ms", settings.request_timeout_ms))
        self._delivery_timeout_s = (2 * timeout_ms + settings.linger_ms) / 1000 + 1

    async def _start(self) -> None:
        options: dict[str, Any] = {
            **self._settings.client_kwargs(),
            "acks": "all",
            "enable_idempotence": True,
            "compression_type": self._settings.compression_type,
            "linger_ms": self._settings.linger_ms,
            "max_batch_size": self._settings.batch_bytes,
            "partitioner": KeyPartitioner(),
        }
        options.update(self._overrides)
        try:
            producer = AIOKafkaProducer(**options)
        except (kafka_errors.KafkaError, RuntimeError, ValueError) as exc:
            raise MessageQueueError(f"invalid Kafka producer settings: {exc}") from exc
        try:
            with translate_kafka_errors("start a producer", self._where):
                await producer.start()
        except BaseException:
            await producer.stop()
            raise
        self._producer = producer

    async def _stop(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            with translate_kafka_errors("flush and stop the producer", self._where):
                try:
                    # A flush towards a broker that is gone would wait forever.
                    await asyncio.wait_for(producer.stop(), timeout=self._delivery_timeout_s)
                except TimeoutError:
                    logger.warning("producer did not flush in %.0f s", self._delivery_timeout_s)
                    await _force_close(producer)

    async def send_many(
        self, messages: Sequence[OutgoingMessage]
    ) -> list[SendResult | SidecarError]:
        if self._producer is None:
            raise RuntimeError("producer is not started")
        pending: list[asyncio.Future[Any] | SidecarError] = []
        # Keys a record of which send() refused for a passing reason, to be sent again: their
        # later records are held back too. send() gives up on a record when its partition's
        # batch stays full for the request timeout, and the batch may drain a moment later:
        # the next record of the key would be written first, before the retry of this one.
        refused: set[tuple[str, bytes | None]] = set()
        for message in messages:
            place = (message.destination, message.key_bytes())
            if place in refused:
                pending.append(
                    RetriableMessageQueueError(
                        f"held back: an earlier record of its key for {message.destination} "
                        "was not taken"
                    )
                )
                continue
            try:
                # send() only enqueues; awaiting the returned future waits for the broker's ack.
                future = await self._producer.send(
                    message.destination,
                    message.value_bytes(),
                    key=place[1],
                    headers=message.headers or None,
                )
            except kafka_errors.KafkaError as exc:
                error = translate_kafka_error(exc, f"send to {message.destination}", self._where)
                if error.retriable:
                    refused.add(place)
                pending.append(error)
                continue
            pending.append(future)
        # aiokafka can leave a future pending for as long as a dead broker's connection looks
        # open; past the delivery timeout the record counts as not taken and is sent again.
        futures = [item for item in pending if not isinstance(item, SidecarError)]
        if futures:
            # Waiting on the last record first usually finds the rest done already, and
            # registers one callback instead of one per record.
            deadline = asyncio.get_running_loop().time() + self._delivery_timeout_s
            await asyncio.wait(futures[-1:], timeout=self._delivery_timeout_s)
            unfinished = [future for future in futures if not future.done()]
            remaining_s = deadline - asyncio.get_running_loop().time()
            if unfinished and remaining_s > 0:
                await asyncio.wait(unfinished, timeout=remaining_s)
        outcomes: list[SendResult | SidecarError] = []
        for message, item in zip(messages, pending, strict=True):
            if isinstance(item, SidecarError):
                outcomes.append(item)
                continue
            if not item.done():
                outcomes.append(
                    RetriableMessageQueueError(
                        f"Kafka at {self._where} did not acknowledge a record for "
                        f"{message.destination} within {self._delivery_timeout_s:.0f} s"
                    )
                )
                continue
            try:
                metadata = item.result()
            except kafka_errors.KafkaError as exc:
                outcomes.append(
                    translate_kafka_error(exc, f"send to {message.destination}", self._where)
                )
                continue
            topic, partition, offset = metadata.topic, metadata.partition, metadata.offset
            outcomes.append(SendResult(topic, f"{topic}:{partition}:{offset}", partition, offset))
        return outcomes

    async def flush(self) -> None:
        if self._producer is not None:
            with translate_kafka_errors("flush", self._where):
                await self._producer.flush()


async def _force_close(producer: AIOKafkaProducer) -> None:
    """Close what a cancelled ``stop()`` leaves open: aiokafka marks the producer closed before
    it flushes, so its sender would go on retrying the unsent records in the background, and
    deliver them whenever the broker came back, long after we gave them up."""
    sender = getattr(producer, "_sender", None)
    with contextlib.suppress(Exception, asyncio.CancelledError, TimeoutError):
        if sender is not None:
            await asyncio.wait_for(sender.close(), timeout=5)
    with contextlib.suppress(Exception, asyncio.CancelledError, TimeoutError):
        await asyncio.wait_for(producer.client.close(), timeout=5)
