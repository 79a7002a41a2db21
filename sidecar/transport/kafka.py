"""Apache Kafka backend on aiokafka: the consumer here, the producer in ``kafka_producer`` and
the error translation in ``kafka_errors`` (both re-exported, so ``sidecar.transport.kafka`` names
all).

Consumer: manual commits only. An ack commits a partition up to its lowest unfinished offset
(:class:`~sidecar.transport.offsets.PartitionOffsets`), never "everything fetched", so records still
in flight when the process dies are delivered again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition

from sidecar.errors import (
    RetriableMessageQueueError,
    SidecarError,
)
from sidecar.transport.base import MessageQueueConsumer
from sidecar.transport.kafka_errors import (
    check_login,
    kafka_where,
    translate_kafka_error,
    translate_kafka_errors,
)
from sidecar.transport.kafka_producer import KafkaProducer
from sidecar.transport.message import QueueMessage
from sidecar.transport.offsets import PartitionOffsets
from sidecar.transport.options import KafkaSettings
from sidecar.transport.redelivery import DelayedRedeliveries

__all__ = [
    "KafkaConsumer",
    "KafkaProducer",
    "check_login",
    "kafka_where",
    "stop_consumer",
    "translate_kafka_error",
    "translate_kafka_errors",
]

logger = logging.getLogger(__name__)


class KafkaConsumer(MessageQueueConsumer):
    """Several topics in one group; commits per partition only past contiguously finished work.

    Records are handed out in the order of ``topics`` (the first topic's records first), so a
    priority topic listed first is served first among what has been fetched.
    """

    def __init__(
        self,
        settings: KafkaSettings,
        topics: Sequence[str],
        group_id: str | None = None,
        *,
        commit_interval_ms: int = 0,
        on_revoke: Callable[[set[tuple[str, int]]], Awaitable[None]] | None = None,
        **overrides: Any,
    ) -> None:
        """``on_revoke`` is awaited with the (topic, partition) pairs being taken away, before
        their finished work is committed: an owner holding records of them (handed out, or
        fetched ahead) drops or finishes them there."""
        if not topics:
            raise ValueError("at least one topic is needed")
        super().__init__()
        self._settings = settings
        # 0 commits on every ack; more leaves commits to commit_due() (a crash then redelivers
        # up to that much finished work, which a consumer that deduplicates can afford).
        self._commit_interval_s = commit_interval_ms / 1000
        self._next_commit_at = 0.0
        self.topics = tuple(topics)
        self.group_id = group_id or settings.consumer_group
        self._overrides = overrides
        self._consumer: Any = None
        self._where = kafka_where(settings)
        self._offsets: dict[TopicPartition, PartitionOffsets] = {}
        self._committed: dict[TopicPartition, int] = {}
        self._commit_lock = asyncio.Lock()
        self._redeliveries: DelayedRedeliveries[QueueMessage] = DelayedRedeliveries()
        self._rank = {topic: index for index, topic in enumerate(self.topics)}
        self._on_revoke = on_revoke

    async def _start(self) -> None:
        options: dict[str, Any] = {
            **self._settings.client_kwargs(),
            "group_id": self.group_id,
            "enable_auto_commit": False,
            "auto_offset_reset": "earliest",
            # Long RAGFlow tasks must not make the group think this consumer is dead.
            "max_poll_interval_ms": 3_600_000,
            "session_timeout_ms": 120_000,
            "heartbeat_interval_ms": 3_000,
        }
        options.update(self._overrides)
        consumer = AIOKafkaConsumer(**options)
        consumer.subscribe(list(self.topics), listener=_Rebalance(self))
        try:
            with translate_kafka_errors("start a consumer", self._where):
                await consumer.start()
        except BaseException:
            await consumer.stop()
            raise
        self._consumer = consumer

    async def _stop(self) -> None:
        if self._consumer is not None and self._commit_interval_s:
            for tp in list(self._offsets):
                try:
                    await self._commit(tp)
                except SidecarError as exc:
                    logger.warning("could not commit %s on stop: %s", tp, exc)
        consumer, self._consumer = self._consumer, None
        self._offsets.clear()
        self._committed.clear()
        self._redeliveries = DelayedRedeliveries()
        if consumer is not None:
            with translate_kafka_errors("stop the consumer", self._where):
                await stop_consumer(consumer)

    async def poll_batch(self, max_records: int, timeout_ms: int) -> list[QueueMessage]:
        if self._consumer is None:
            raise RuntimeError("consumer is not started")
        due = self._redeliveries.pop_due(max_records)
        if due:
            return due
        next_due = self._redeliveries.seconds_until_next()
        if next_due is not None:
            timeout_ms = min(timeout_ms, int(next_due * 1000) + 1)
        with translate_kafka_errors("fetch", self._where):
            fetched = await self._consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
        messages: list[QueueMessage] = []
        for tp in sorted(fetched, key=lambda tp: (self._rank.get(tp.topic, 0), tp.partition)):
            offsets = self._offsets.setdefault(tp, PartitionOffsets())
            # Where we started reading is already the group's position: no need to commit it.
            self._committed.setdefault(tp, fetched[tp][0].offset if fetched[tp] else -1)
            for record in fetched[tp]:
                offsets.delivered(record.offset)
                messages.append(
                    QueueMessage(
                        id=f"{tp.topic}:{tp.partition}:{record.offset}",
                        value=record.value,
                        topic=tp.topic,
                        partition=tp.partition,
                        offset=record.offset,
                        timestamp_ms=record.timestamp,
                        key=record.key,
                        headers=tuple(record.headers or ()),
                        settler=self,
                    )
                )
        return messages

    async def ack(self, message: QueueMessage) -> None:
        if self.finish(message) and not self._commit_interval_s:
            await self._commit(TopicPartition(message.topic, message.partition))

    def finish(self, message: QueueMessage) -> bool:
        """Mark the record done without committing (``commit_due()`` commits it); False when
        its partition was revoked meanwhile, so its new owner will process it again."""
        offsets = self._offsets.get(TopicPartition(message.topic, message.partition))
        if offsets is None:
            logger.debug("ack of %s after its partition was revoked", message.id)
            return False
        offsets.finished(message.offset)
        return True

    async def commit_due(self) -> None:
        """With ``commit_interval_ms``: commit finished work once the interval has passed.

        The consuming loop calls it every turn; it does nothing in between.
        """
        now = asyncio.get_running_loop().time()
        if not self._commit_interval_s or now < self._next_commit_at:
            return
        self._next_commit_at = now + self._commit_interval_s
        # All partitions in one request: one by one, a shadow on 20 partitions made 40
        # commits a second, each a round trip and a write to __consumer_offsets.
        await self._commit(*self._offsets)

    async def nack(self, message: QueueMessage, delay_ms: int = 0) -> None:
        # The offset stays unfinished, so nothing past it is committed until it is acked.
        self._redeliveries.push(message, delay_ms)

    async def wait_for_assignment(self, timeout_s: float = 60.0) -> dict[str, int]:
        """Wait until the group has assigned partitions and their positions are resolved.

        Returns ``{"topic[partition]": position}``. With ``auto_offset_reset="latest"`` this is
        the point after which every record produced will be read.
        """
        if self._consumer is None:
            raise RuntimeError("consumer is not started")
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not self._consumer.assignment():
            if asyncio.get_running_loop().time() > deadline:
                raise RetriableMessageQueueError(
                    f"Kafka at {self._where} assigned no partition to {self.group_id} "
                    f"within {timeout_s:.0f} s"
                )
            await asyncio.sleep(0.05)
        positions = {}
        with translate_kafka_errors("read positions", self._where):
            for tp in sorted(self._consumer.assignment()):
                positions[f"{tp.topic}[{tp.partition}]"] = await self._consumer.position(tp)
        return positions

    async def pin_start_positions(self, timeout_s: float = 60.0) -> None:
        """Commit the current position of every assigned partition that has no commit yet.

        A group that starts at ``latest`` must start there once: without this, a partition
        that saw no commit before a restart would be reset to the end again, skipping what
        arrived meanwhile. An instance given no partition (more instances than partitions)
        has nothing to pin.
        """
        try:
            await self.wait_for_assignment(timeout_s)
        except RetriableMessageQueueError as exc:
            logger.info("no start positions to pin: %s", exc)
            return
        assert self._consumer is not None
        with translate_kafka_errors("pin start positions", self._where):
            for tp in sorted(self._consumer.assignment()):
                if await self._consumer.committed(tp) is None:
                    position = await self._consumer.position(tp)
                    await self._consumer.commit({tp: position})
                    self._committed[tp] = position

    def pause_all_but(self, topics: Sequence[str]) -> None:
        """Stop fetching every assigned partition not of ``topics`` (positions are kept)."""
        if self._consumer is None:
            return
        keep = set(topics)
        paused = [tp for tp in self._consumer.assignment() if tp.topic not in keep]
        if paused:
            self._consumer.pause(*paused)

    def resume_all(self) -> None:
        """Fetch every assigned partition again."""
        if self._consumer is not None and self._consumer.paused():
            self._consumer.resume(*self._consumer.paused())

    async def end_offsets(self) -> dict[tuple[str, int], int]:
        """One past the last record of every assigned partition, asked of the broker now."""
        if self._consumer is None:
            raise RuntimeError("consumer is not started")
        tps = sorted(self._consumer.assignment())
        if not tps:
            return {}
        with translate_kafka_errors("read end offsets", self._where):
            ends = await self._consumer.end_offsets(tps)
        return {(tp.topic, tp.partition): int(offset) for tp, offset in ends.items()}

    async def positions(self) -> dict[tuple[str, int], int]:
        """The next offset to be fetched of every assigned partition (past control records
        and compacted gaps, which hand out no record)."""
        if self._consumer is None:
            raise RuntimeError("consumer is not started")
        with translate_kafka_errors("read positions", self._where):
            return {
                (tp.topic, tp.partition): await self._consumer.position(tp)
                for tp in sorted(self._consumer.assignment())
            }

    def lag(self) -> dict[tuple[str, int], int]:
        """Records behind the group's commit per assigned partition, from the last fetch's
        high watermark (no request: cheap enough for a metrics callback)."""
        if self._consumer is None:
            return {}
        lags = {}
        for tp in self._consumer.assignment():
            highwater = self._consumer.highwater(tp)
            committed = self._committed.get(tp)
            if highwater is not None and committed is not None:
                lags[tp.topic, tp.partition] = max(highwater - committed, 0)
        return lags

    def in_flight(self, topic: str, partition: int) -> int:
        """Records of that partition handed out and not yet acked."""
        offsets = self._offsets.get(TopicPartition(topic, partition))
        return offsets.in_flight if offsets else 0

    async def _commit(self, *partitions: TopicPartition) -> None:
        # One commit at a time, never backwards: two acks racing must not move a partition back.
        async with self._commit_lock:
            targets: dict[TopicPartition, int] = {}
            for tp in partitions:
                offsets = self._offsets.get(tp)
                target = offsets.committable() if offsets else None
                if target is not None and target > self._committed.get(tp, -1):
                    targets[tp] = target
            if not targets or self._consumer is None:
                return
            named = ", ".join(f"{tp.topic}[{tp.partition}]" for tp in targets)
            with translate_kafka_errors(f"commit {named}", self._where):
                await self._consumer.commit(targets)
            self._committed.update(targets)

    async def _partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        if self._on_revoke is not None and revoked:
            try:
                await self._on_revoke({(tp.topic, tp.partition) for tp in revoked})
            except Exception:
                # The rebalance must go on whatever the owner's hook does.
                logger.exception("the revoke hook failed")
        for tp in revoked:
            try:
                await self._commit(tp)
            except SidecarError as exc:
                logger.warning("could not commit %s before it was revoked: %s", tp, exc)
            self._offsets.pop(tp, None)
            self._committed.pop(tp, None)
        self._redeliveries.discard(lambda m: TopicPartition(m.topic, m.partition) in revoked)


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, owner: KafkaConsumer) -> None:
        self._owner = owner

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self._owner._partitions_revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        logger.info("assigned %s", sorted(f"{tp.topic}[{tp.partition}]" for tp in assigned))


async def stop_consumer(consumer: AIOKafkaConsumer) -> None:
    """``consumer.stop()``, minus the CancelledError aiokafka lets out of a fetch it cancels
    while the broker is away; a cancellation of our own still propagates."""
    try:
        await consumer.stop()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
        logger.debug("the consumer's fetcher was cancelled while stopping")
