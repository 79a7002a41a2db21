"""The Kafka producer: ``acks="all"`` and ``enable_idempotence=True``, explicit batches.

aiokafka has neither ``retries`` nor ``max_in_flight_requests_per_connection`` (the seed design
passes both): it keeps at most one in-flight batch per partition and retries it until
``request_timeout_ms``, and idempotence lets the broker drop a retried duplicate. Together they
keep per-key order with no loss.

``send_many`` builds each partition's batch itself (``create_batch``/``send_batch``) rather
than calling ``send()`` per record: ``send()`` costs ~30 µs of CPU a record in metadata waits,
partitioning and a future each, a built batch ~3 µs. A batch is taken or refused whole; a
partition's batches are queued one at a time, in call order, the partitions side by side; all
within the call's delivery timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka import errors as kafka_errors
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from sidecar.errors import (
    MessageQueueError,
    MessageTooLargeError,
    RetriableMessageQueueError,
    SidecarError,
)
from sidecar.transport.base import MessageQueueProducer, OutgoingMessage, SendResult
from sidecar.transport.kafka_errors import (
    kafka_where,
    translate_kafka_error,
    translate_kafka_errors,
)
from sidecar.transport.options import KafkaSettings
from sidecar.transport.partitioner import KeyPartitioner

logger = logging.getLogger(__name__)

DEFAULT_MAX_REQUEST_BYTES = 1_048_576  # aiokafka's default max_request_size


class KafkaProducer(MessageQueueProducer):
    """Idempotent, ``acks=all`` producer; ``send_many`` sends a call's records as one batch per
    partition (more when one would pass ``KAFKA_BATCH_BYTES``), all in flight at once."""

    def __init__(self, settings: KafkaSettings, **overrides: Any) -> None:
        super().__init__()
        self._settings = settings
        self._overrides = overrides
        self._producer: Any = None
        self._where = kafka_where(settings)
        self._partitioner = KeyPartitioner()
        self._max_request_bytes = int(overrides.get("max_request_size", DEFAULT_MAX_REQUEST_BYTES))
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
            "max_request_size": self._max_request_bytes,
            "partitioner": self._partitioner,
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
        producer = self._producer  # stop() clears the attribute while a call may be waiting
        if producer is None:
            raise RuntimeError("producer is not started")
        if len(messages) == 1:
            return [await self._send_one(producer, messages[0])]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._delivery_timeout_s
        outcomes: list[SendResult | SidecarError | None] = [None] * len(messages)
        queues = await self._build(producer, messages, outcomes)
        if len(queues) == 1:
            sent = await self._submit(producer, queues[0], deadline, outcomes)
        else:
            # A partition's batch waits until the one before it is on its way, so a partition
            # whose leader does not answer must not hold up the others: one task each.
            async with asyncio.TaskGroup() as group:
                submitting = [
                    group.create_task(self._submit(producer, queue, deadline, outcomes))
                    for queue in queues
                ]
            sent = [pair for task in submitting for pair in task.result()]
        if sent:
            # aiokafka can leave a future pending for as long as a dead broker's connection
            # looks open; past the delivery timeout its records count as not taken and are sent
            # again. Waiting on the last batch first usually finds the rest done already.
            await asyncio.wait([sent[-1][1]], timeout=max(deadline - loop.time(), 0))
            unfinished = [future for _, future in sent if not future.done()]
            if unfinished and deadline > loop.time():
                await asyncio.wait(unfinished, timeout=deadline - loop.time())
        for batch, future in sent:
            delivered = self._delivered(batch.topic, len(batch.indexes), future)
            for index, outcome in zip(batch.indexes, delivered, strict=True):
                outcomes[index] = outcome
        results = [outcome for outcome in outcomes if outcome is not None]
        if len(results) != len(messages):
            raise RuntimeError("a record of the call was given no outcome")
        return results

    async def _send_one(self, producer: Any, message: OutgoingMessage) -> SendResult | SidecarError:
        """One record through aiokafka's own batching: concurrent callers' records (RAGFlow's
        threads through ``ragflow_mq``, the shadow's dead letters) share a partition's batch,
        which one explicit batch a call would not."""
        topic = message.destination
        try:
            future = await producer.send(
                topic,
                message.value_bytes(),
                key=message.key_bytes(),
                headers=message.headers or None,
                partition=message.partition,
            )
            await asyncio.wait([future], timeout=self._delivery_timeout_s)
        except kafka_errors.KafkaError as exc:
            return translate_kafka_error(exc, f"send to {topic}", self._where)
        return self._delivered(topic, 1, future)[0]

    async def _build(
        self,
        producer: Any,
        messages: Sequence[OutgoingMessage],
        outcomes: list[SendResult | SidecarError | None],
    ) -> list[list[_Batch]]:
        """Place each message in its partition's batch, in order: the batches of each partition,
        in the order they are to be sent. A message that cannot be placed gets its error in
        ``outcomes``."""
        partitions: dict[str, list[int] | SidecarError] = {}
        queues: dict[tuple[str, int], list[_Batch]] = {}
        for index, message in enumerate(messages):
            topic = message.destination
            known = partitions.get(topic)
            if known is None:
                known = partitions[topic] = await self._partitions_of(producer, topic)
            if isinstance(known, SidecarError):
                outcomes[index] = known
                continue
            key, value = message.key_bytes(), message.value_bytes()
            headers = list(message.headers)
            size = DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, headers)
            if size > self._max_request_bytes:
                outcomes[index] = MessageTooLargeError(
                    f"Kafka at {self._where} cannot send to {topic}: the record is {size} bytes, "
                    f"more than the producer's max_request_size ({self._max_request_bytes})"
                )
                continue
            available = () if key is not None else _available(producer, topic)
            partition = (
                self._partitioner(key, known, available)
                if message.partition is None
                else message.partition
            )
            queue = queues.get((topic, partition))
            if queue is None:
                queue = queues[(topic, partition)] = []
            if not queue or not queue[-1].append(key, value, headers):
                # A batch refuses a record past its size (the first always fits): the rest of
                # the partition's records go in a new one, sent after it.
                queue.append(_Batch(topic, partition, producer.create_batch()))
                queue[-1].append(key, value, headers)
            queue[-1].indexes.append(index)
        return list(queues.values())

    async def _submit(
        self,
        producer: Any,
        queue: list[_Batch],
        deadline: float,
        outcomes: list[SendResult | SidecarError | None],
    ) -> list[tuple[_Batch, asyncio.Future[Any]]]:
        """Queue one partition's batches in order, each taken by ``deadline`` or not at all;
        after one that is not taken the rest are held back, so none of their records is
        written before the one refused."""
        sent: list[tuple[_Batch, asyncio.Future[Any]]] = []
        for position, batch in enumerate(queue):
            # Closed, the batch goes out as soon as the partition is free: the call's records
            # are the batch, so lingering for more would only add latency.
            batch.builder.close()
            try:
                # Cancelling is safe: aiokafka queues the batch in the step that returns.
                async with asyncio.timeout_at(deadline):
                    future = await producer.send_batch(
                        batch.builder, batch.topic, partition=batch.partition
                    )
            except TimeoutError:
                error: SidecarError = RetriableMessageQueueError(
                    f"Kafka at {self._where} did not take a batch for {batch.topic} within "
                    f"{self._delivery_timeout_s:.0f} s"
                )
            except kafka_errors.KafkaError as exc:
                error = translate_kafka_error(exc, f"send to {batch.topic}", self._where)
            else:
                sent.append((batch, future))
                continue
            held = _held_back(error, batch.topic)
            for refused in queue[position:]:
                for index in refused.indexes:
                    outcomes[index] = error if refused is batch else held
            break
        return sent

    async def partitions(self, topic: str) -> list[int]:
        """The partitions of ``topic``, from the producer's metadata; raises ``SidecarError``."""
        producer = self._producer
        if producer is None:
            raise RuntimeError("producer is not started")
        known = await self._partitions_of(producer, topic)
        if isinstance(known, SidecarError):
            raise known
        return known

    async def _partitions_of(self, producer: Any, topic: str) -> list[int] | SidecarError:
        try:
            known = await producer.partitions_for(topic)
        except kafka_errors.KafkaError as exc:
            return translate_kafka_error(exc, f"send to {topic}", self._where)
        # Kafka's placement indexes the partitions in id order, as aiokafka's send() does.
        return sorted(known)

    def _delivered(
        self, topic: str, count: int, future: asyncio.Future[Any]
    ) -> list[SendResult | SidecarError]:
        """The outcomes of the ``count`` records ``future`` stands for, in order."""
        if not future.done() or future.cancelled():
            # Given up on: its late failure is nobody's to read, and must not be logged as lost.
            future.add_done_callback(_retrieve)
            return [
                RetriableMessageQueueError(
                    f"Kafka at {self._where} did not acknowledge a record for {topic} "
                    f"within {self._delivery_timeout_s:.0f} s"
                )
                for _ in range(count)
            ]
        try:
            stored = future.result()
        except kafka_errors.KafkaError as exc:
            return [
                translate_kafka_error(exc, f"send to {topic}", self._where) for _ in range(count)
            ]
        partition, base = stored.partition, stored.offset
        if base < 0:
            # The broker had the batch already (a retried duplicate) and says not where.
            return [SendResult(topic, f"{topic}:{partition}:-1", partition) for _ in range(count)]
        # A batch's records are stored at consecutive offsets from the one acknowledged.
        return [
            SendResult(topic, f"{topic}:{partition}:{base + n}", partition, base + n)
            for n in range(count)
        ]

    async def flush(self) -> None:
        if self._producer is not None:
            with translate_kafka_errors("flush", self._where):
                await self._producer.flush()


class _Batch:
    """One partition's records of a ``send_many`` call, in call order."""

    __slots__ = ("builder", "indexes", "partition", "topic")

    def __init__(self, topic: str, partition: int, builder: Any) -> None:
        self.topic = topic
        self.partition = partition
        self.builder = builder
        self.indexes: list[int] = []  # the records' places in the call, in batch order

    def append(self, key: bytes | None, value: bytes, headers: list[tuple[str, bytes]]) -> bool:
        """False when the batch is full."""
        return (
            self.builder.append(timestamp=None, key=key, value=value, headers=headers) is not None
        )


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _available(producer: Any, topic: str) -> list[int]:
    return sorted(producer.client.cluster.available_partitions_for_topic(topic))


def _held_back(error: SidecarError, topic: str) -> SidecarError:
    """The outcome of a record behind one of its partition that was not taken."""
    if not error.retriable:
        return error
    return RetriableMessageQueueError(
        f"held back: an earlier record of its partition of {topic} was not taken"
    )


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
