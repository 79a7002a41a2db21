"""Apache Kafka backend on aiokafka.

Producer: ``acks="all"`` and ``enable_idempotence=True``. aiokafka has neither ``retries`` nor
``max_in_flight_requests_per_connection`` (the seed design passes both): it keeps at most one
in-flight batch per partition and retries it until ``request_timeout_ms``, and idempotence
lets the broker drop a retried duplicate. Together they keep per-key order with no loss.

Consumer: manual commits only. An ack commits a partition up to its lowest unfinished offset
(:class:`~sidecar.mq.offsets.PartitionOffsets`), never "everything fetched", so records still
in flight when the process dies are delivered again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka import errors as kafka_errors
from aiokafka.conn import create_conn

from sidecar.errors import (
    AuthenticationError,
    MessageQueueError,
    MessageTooLargeError,
    ProducerStateLostError,
    RetriableMessageQueueError,
    ServiceUnavailableError,
    SidecarError,
)
from sidecar.mq.base import MessageQueueConsumer, MessageQueueProducer, OutgoingMessage, SendResult
from sidecar.mq.message import QueueMessage
from sidecar.mq.offsets import PartitionOffsets
from sidecar.mq.redelivery import DelayedRedeliveries
from sidecar.partitioner import KeyPartitioner
from sidecar.settings import KafkaSettings

logger = logging.getLogger(__name__)


def translate_kafka_error(exc: BaseException, action: str, where: str) -> SidecarError:
    """The sidecar's error for an aiokafka exception."""
    if isinstance(
        exc,
        kafka_errors.AuthenticationFailedError
        | kafka_errors.SaslAuthenticationFailed
        | kafka_errors.UnsupportedSaslMechanismError
        | kafka_errors.AuthenticationMethodNotSupported
        | kafka_errors.TopicAuthorizationFailedError
        | kafka_errors.GroupAuthorizationFailedError
        | kafka_errors.ClusterAuthorizationFailedError,
    ):
        return AuthenticationError(f"Kafka at {where} refused to let us {action}: {exc}")
    if isinstance(exc, kafka_errors.KafkaConnectionError):
        return ServiceUnavailableError(f"cannot reach Kafka at {where} to {action}: {exc}")
    if isinstance(exc, kafka_errors.MessageSizeTooLargeError):
        return MessageTooLargeError(f"Kafka at {where} cannot {action}: {exc}")
    if isinstance(exc, kafka_errors.UnknownTopicOrPartitionError):
        return MessageQueueError(f"Kafka at {where} cannot {action}: the topic does not exist")
    if isinstance(
        exc,
        kafka_errors.OutOfOrderSequenceNumber
        | kafka_errors.UnknownProducerId
        | kafka_errors.ProducerFenced  # what aiokafka makes of InvalidProducerEpoch
        | kafka_errors.InvalidProducerEpoch
        | kafka_errors.InvalidProducerIdMapping,
    ):
        return ProducerStateLostError(
            f"Kafka at {where} refused the producer's sequence to {action}: {exc!r}"
        )
    if isinstance(exc, kafka_errors.KafkaTimeoutError):
        return RetriableMessageQueueError(f"Kafka at {where} timed out trying to {action}")
    if isinstance(exc, kafka_errors.KafkaError) and exc.retriable:
        return RetriableMessageQueueError(f"Kafka at {where} failed to {action}: {exc!r}")
    return MessageQueueError(f"Kafka at {where} failed to {action}: {exc!r}")


@contextmanager
def translate_kafka_errors(action: str, where: str) -> Iterator[None]:
    """Raise the sidecar's error for anything aiokafka raises inside the block."""
    try:
        yield
    except kafka_errors.KafkaError as exc:
        raise translate_kafka_error(exc, action, where) from exc


def _where(settings: KafkaSettings) -> str:
    return ",".join(settings.bootstrap_servers)


async def check_login(settings: KafkaSettings) -> None:
    """Raise :class:`AuthenticationError` if Kafka refuses our TLS or SASL login.

    aiokafka only logs why its bootstrap connections failed (refused credentials, a certificate
    not signed by the CA) and raises a connection error that looks like a broker that is down,
    which a supervisor would retry forever. One connection made by hand before the clients start
    tells the two apart. A broker that is really unreachable is left to the clients to report.
    """
    if settings.security_protocol == "PLAINTEXT":
        return
    options = settings.client_kwargs()
    action = "log in"
    if settings.security_protocol.startswith("SASL_"):
        action += f" as {settings.sasl_username!r} with {settings.sasl_mechanism}"
    for server in settings.bootstrap_servers:
        host, _, port = server.rpartition(":")
        try:
            connection = await create_conn(
                host,
                int(port),
                client_id=settings.client_id,
                request_timeout_ms=settings.request_timeout_ms,
                ssl_context=options.get("ssl_context"),
                security_protocol=settings.security_protocol,
                sasl_mechanism=options.get("sasl_mechanism"),
                sasl_plain_username=options.get("sasl_plain_username"),
                sasl_plain_password=options.get("sasl_plain_password"),
            )
        except (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLSyscallError):
            continue  # dropped mid-handshake: a broker starting or restarting, not a refusal
        except ssl.SSLError as exc:
            raise AuthenticationError(
                f"Kafka at {server}: TLS handshake failed ({exc.reason or exc}); "
                "is KAFKA_SSL_CAFILE the CA that signed the broker's certificate?"
            ) from exc
        except kafka_errors.KafkaError as exc:
            translated = translate_kafka_error(exc, action, server)
            if not translated.retriable:
                raise translated from exc
        except (OSError, TimeoutError):
            continue
        else:
            connection.close()
            return  # one broker accepted us; the others hold the same users


class KafkaProducer(MessageQueueProducer):
    """Idempotent, ``acks=all`` producer; ``send_many`` keeps every record of a batch in flight."""

    def __init__(self, settings: KafkaSettings, **overrides: Any) -> None:
        super().__init__()
        self._settings = settings
        self._overrides = overrides
        self._producer: Any = None
        self._where = _where(settings)
        timeout_ms = int(overrides.get("request_timeout_ms", settings.request_timeout_ms))
        self._delivery_timeout_s = (2 * timeout_ms + settings.linger_ms) / 1000 + 1

    async def _start(self) -> None:
        options: dict[str, Any] = {
            **self._settings.client_kwargs(),
            "acks": "all",
            "enable_idempotence": True,
            "compression_type": self._settings.compression_type,
            "linger_ms": self._settings.linger_ms,
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
        for message in messages:
            try:
                # send() only enqueues; awaiting the returned future waits for the broker's ack.
                future = await self._producer.send(
                    message.destination,
                    message.value_bytes(),
                    key=message.key_bytes(),
                    headers=message.headers or None,
                )
            except kafka_errors.KafkaError as exc:
                pending.append(
                    translate_kafka_error(exc, f"send to {message.destination}", self._where)
                )
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
        self._where = _where(settings)
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
        for tp in list(self._offsets):
            await self._commit(tp)

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

    async def _commit(self, tp: TopicPartition) -> None:
        # One commit at a time, never backwards: two acks racing must not move a partition back.
        async with self._commit_lock:
            offsets = self._offsets.get(tp)
            target = offsets.committable() if offsets else None
            if target is None or target <= self._committed.get(tp, -1) or self._consumer is None:
                return
            with translate_kafka_errors(f"commit {tp.topic}[{tp.partition}]", self._where):
                await self._consumer.commit({tp: target})
            self._committed[tp] = target

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
