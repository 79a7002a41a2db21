"""The mirror: tail RAGFlow's task streams in a group of its own and dual-write them to Kafka.

Each batch is read with XREADGROUP in ``MIRROR_GROUP`` (never RAGFlow's group), routed,
produced to Kafka with ``acks=all``, and XACKed in the mirror's group only once Kafka has every
record of it, so a crash anywhere re-mirrors (a duplicate) rather than loses. One more batch is
read while Kafka acknowledges the current one, and none after it until that one is in Kafka:
at most two batches are held, however long Kafka is away. Bad input goes to
the DLQ with its bytes and a reason; entries outside the traffic share are acked and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

import valkey.asyncio as valkey

from sidecar.config import Settings
from sidecar.config.routing import RouteTable
from sidecar.config.traffic import in_traffic_share
from sidecar.errors import (
    ConfigError,
    MessageDecodeError,
    MessageTooLargeError,
    SidecarError,
)
from sidecar.lifecycle import Lifecycle
from sidecar.mirror.records import MIRROR_CLAIMED_HEADER, entry_dead_letter, per_stream_headers
from sidecar.mirror.stats import MirrorStats
from sidecar.mirror.trace import MirrorBatchTrace, trace_batch
from sidecar.telemetry.tracing import Tracing
from sidecar.transport.base import OutgoingMessage, SendResult
from sidecar.transport.kafka import KafkaProducer
from sidecar.transport.lag import stream_lag
from sidecar.transport.message import QueueMessage, header_text
from sidecar.transport.redis_streams import RedisStreamConsumer
from sidecar.transport.topics import DLQ_TOPIC, missing_topics
from sidecar.transport.valkey_client import translate_valkey_errors

logger = logging.getLogger(__name__)

# Called with each batch's mirrored entries and their records, after Kafka has them and before
# they are XACKed: the redis run of the comparison (sidecar.shadow.replay).
AfterProduce = Callable[[list[tuple[QueueMessage, OutgoingMessage]]], Awaitable[None]]
# Turns a planned record into the records actually sent (sidecar.dev.faults, demo and tests only).
RecordTransform = Callable[[QueueMessage, OutgoingMessage], list[OutgoingMessage]]

CLAIMED = (MIRROR_CLAIMED_HEADER, b"1")
RAGFLOW_GROUPS = ("rag_flow_svr_task_broker", "rag_flow_svr_consumer_group")
BACKOFF_INITIAL_S = 0.5
BACKOFF_MAX_S = 30.0


class Mirror(Lifecycle):
    """One mirror instance; several may share ``MIRROR_GROUP`` on the same streams."""

    def __init__(
        self,
        settings: Settings,
        *,
        client: valkey.Valkey,
        producer: KafkaProducer,
        tracing: Tracing,
        after_produce: AfterProduce | None = None,
        transform: RecordTransform | None = None,
    ):
        """``client`` (for the streams), ``producer`` and ``tracing`` are the composition
        root's (:mod:`sidecar.app.wiring`): started before the mirror, stopped after it. The
        producer is the mirror's alone: it restarts it when Kafka refuses its sequence."""
        super().__init__()
        self._tracing = tracing
        self._last_read: tuple[list[QueueMessage], int, int] | None = None
        self._after_produce = after_produce
        self._transform = transform
        mirror = settings.mirror
        if mirror.group in RAGFLOW_GROUPS:
            raise ConfigError("MIRROR_GROUP", f"{mirror.group!r} is RAGFlow's own group")
        self.settings = settings
        self.stats = MirrorStats()
        self.routes = RouteTable(mirror.routes)
        self._priority_streams = set(mirror.priority_streams)
        self._consumer = RedisStreamConsumer(
            mirror.streams,
            mirror.group,
            mirror.consumer,
            client=client,
            settings=settings.redis,
            group_start_id=mirror.start,
            claim_idle_ms=mirror.claim_idle_ms,
        )
        self._producer = producer
        self._next_status = 0.0
        self._percent = mirror.traffic_percent
        self._stream_headers: dict[str, tuple[tuple[str, bytes], ...]] = {}

    async def _replace_producer(self) -> None:
        """A fresh idempotent producer (a new producer id, sequences from zero)."""
        with contextlib.suppress(SidecarError):
            await self._producer.stop()
        await self._producer.start()  # a new aiokafka producer under the same wrapper

    async def _start(self) -> None:
        needed = sorted({*self.routes.topics, DLQ_TOPIC})
        absent = await missing_topics(self.settings.kafka, needed)
        if absent:
            raise ConfigError(
                "KAFKA_BOOTSTRAP_SERVERS",
                f"topics {', '.join(absent)} do not exist; run `ragflow-sidecar init-topics`",
            )
        await self._consumer.start()
        logger.info(
            "mirroring %s in group %s as %s (start %s, %.4g%% to Kafka)",
            ",".join(self.settings.mirror.streams),
            self.settings.mirror.group,
            self.settings.mirror.consumer,
            self.settings.mirror.start,
            self.settings.mirror.traffic_percent,
        )

    async def _stop(self) -> None:
        await self._consumer.stop()
        logger.info("mirror stopped: %s", self.stats.summary())

    async def run(self, stop: asyncio.Event) -> None:
        """Mirror until ``stop`` is set; batches already read are finished first.

        The next batch is read while Kafka acknowledges the current one. Reading sends nothing
        to Kafka, so order is unchanged; at most two batches are ever held in memory.
        """
        prefetch: asyncio.Task[list[QueueMessage]] | None = None
        try:
            while True:
                self.stats.turns += 1
                if prefetch is not None:
                    batch = await prefetch
                    prefetch = None
                elif stop.is_set():
                    break
                else:
                    batch = await self._read()
                if batch:
                    if not stop.is_set():
                        prefetch = asyncio.create_task(self._read(), name="mirror-prefetch")
                    await self._mirror_batch(batch, stop)
                await self._maybe_log_status()
        finally:
            if prefetch is not None:
                # Entries it read stay pending in our group and are replayed on restart.
                prefetch.cancel()
                with contextlib.suppress(asyncio.CancelledError, SidecarError):
                    await prefetch

    async def mirror_once(self, stop: asyncio.Event | None = None) -> int:
        """Read one batch, put it in Kafka, ack it; returns how many entries were read."""
        batch = await self._read()
        if batch:
            await self._mirror_batch(batch, stop)
        return len(batch)

    async def _read(self) -> list[QueueMessage]:
        """XREADGROUP one batch; when it started and ended is kept for its trace span."""
        started_ns = time.time_ns()
        batch = await self._consumer.poll_batch(
            self.settings.mirror.batch, self.settings.mirror.block_ms
        )
        self._last_read = (batch, started_ns, time.time_ns())
        return batch

    async def _mirror_batch(self, batch: list[QueueMessage], stop: asyncio.Event | None) -> None:
        trace: MirrorBatchTrace | None = None
        if self._tracing.enabled:
            read = self._last_read
            read_ns = read[1:] if read is not None and read[0] is batch else None
            trace = trace_batch(self._tracing, batch, self.settings.mirror.group, read_ns)
        self.stats.read += len(batch)
        self.stats.batches += 1
        outgoing: list[tuple[QueueMessage, OutgoingMessage]] = []
        settled: list[QueueMessage] = []
        dropped: list[tuple[QueueMessage, OutgoingMessage]] = []
        for message in batch:
            record = self._plan(message, trace)
            if record is None:
                settled.append(message)
            elif self._transform is not None and record.destination != DLQ_TOPIC:
                sent = self._transform(message, record)
                outgoing += [(message, one) for one in sent]
                if not sent:
                    dropped.append((message, record))
                    settled.append(message)
            else:
                outgoing.append((message, record))
        try:
            done, mirrored = await self._produce(outgoing, stop, trace)
        finally:
            if trace is not None:
                trace.finish()
        if self._after_produce is not None and (mirrored or dropped):
            # The redis run is of the Redis copy: recorded once per entry, whatever was sent.
            once = {(m.topic, m.id): (m, record) for m, record in mirrored + dropped}
            await self._after_produce(list(once.values()))
        await self._consumer.ack_many(settled + done)

    def _plan(
        self, message: QueueMessage, trace: MirrorBatchTrace | None = None
    ) -> OutgoingMessage | None:
        """The Kafka record for an entry, or ``None`` when it stays out of Kafka; with a
        ``trace``, its ``send`` span is started and its context is the ``traceparent``."""
        try:
            task = message.payload  # kept: the redis run reads the same copy
            task_id = task.get("id")
            if not isinstance(task_id, str) or not task_id:
                raise MessageDecodeError("no_task_id", "the task has no string 'id'")
        except MessageDecodeError as exc:
            return entry_dead_letter(message, exc.reason, exc.detail)
        priority = 1 if message.topic in self._priority_streams else 0
        route = self.routes.route(task, priority)
        if not route.known_type:
            # Bounded: hostile input can bring an endless run of distinct (and huge) types.
            unknown, label = self.stats.unknown_task_types, route.task_type[:100]
            unknown["(other)" if label not in unknown and len(unknown) >= 1000 else label] += 1
        if self._percent < 100 and not in_traffic_share(route.key, self._percent):
            self.stats.skipped["outside_share"] += 1
            return None
        tenant = task.get("tenant_id")
        stream_headers = self._stream_headers.get(message.topic)
        if stream_headers is None:
            stream_headers = self._stream_headers[message.topic] = per_stream_headers(
                message.topic, priority, self.settings.mirror.consumer
            )
        mirror_consumer, priority_header, source, retry_count, schema, redis_stream = stream_headers
        try:
            headers = [
                ("x-task-type", route.task_type.encode()),
                ("x-task-id", task_id.encode()),
                ("x-tenant-id", tenant.encode() if isinstance(tenant, str) else b""),
                priority_header,
                source,
                ("x-timestamp", str(message.timestamp_ms).encode()),
                retry_count,
                schema,
                redis_stream,
                ("x-redis-id", message.id.encode()),
                mirror_consumer,
            ]
            if message.claimed:
                headers.append(CLAIMED)
            if not route.key.isascii():
                route.key.encode()  # the producer encodes it; checked here, where it can be said
        except UnicodeEncodeError as exc:
            # A lone surrogate ("\ud800" in the JSON) has no UTF-8 form, and Kafka keys and
            # headers are UTF-8 (RAGFlow's MySQL refuses it too). It used to stop the mirror.
            bad = exc.object[exc.start : exc.end]
            detail = f"a lone surrogate {bad!r} in the task's id, type, tenant or routing key"
            return entry_dead_letter(message, "not_unicode", detail)
        traceparent = message.header("traceparent")
        if trace is not None:
            traceparent = trace.send(message, route.topic, task_id, route.task_type, traceparent)
        if traceparent is not None:
            headers.append(("traceparent", traceparent))
        assert message.value is not None  # payload decoded, so the field exists
        return OutgoingMessage(route.topic, message.value, key=route.key, headers=headers)

    async def _produce(
        self,
        outgoing: Sequence[tuple[QueueMessage, OutgoingMessage]],
        stop: asyncio.Event | None,
        trace: MirrorBatchTrace | None = None,
    ) -> tuple[list[QueueMessage], list[tuple[QueueMessage, OutgoingMessage]]]:
        """Produce until every record is in Kafka; returns the entries that may be acked, and
        those of them mirrored to a task topic with their records.

        Retriable failures (Kafka away, timeouts) are retried with backoff for as long as it
        takes; only a stop request ends the wait, leaving those entries pending for replay.
        """
        done: list[QueueMessage] = []
        to_task_topics: list[tuple[QueueMessage, OutgoingMessage]] = []
        pending = list(outgoing)
        backoff_s = BACKOFF_INITIAL_S
        while pending:
            outcomes = await self._producer.send_many([record for _, record in pending])
            acked_ms = int(time.time() * 1000)
            retry: list[tuple[QueueMessage, OutgoingMessage]] = []
            transient = 0
            new_producer = False
            mirrored: list[tuple[str, str]] = []
            latency = self.stats.latency_ms
            for (message, record), outcome in zip(pending, outcomes, strict=True):
                if isinstance(outcome, SendResult):
                    done.append(message)
                    if record.destination == DLQ_TOPIC:
                        reason = header_text(record.headers, "x-error") or "unknown"
                        self.stats.dead_lettered[reason] += 1
                    else:
                        mirrored.append((message.topic, record.destination))
                        latency.append(acked_ms - message.timestamp_ms)
                        to_task_topics.append((message, record))
                        if trace is not None:
                            trace.sent(message, outcome)
                elif isinstance(outcome, MessageTooLargeError) and record.destination != DLQ_TOPIC:
                    retry.append((message, entry_dead_letter(message, "too_large", str(outcome))))
                elif outcome.retriable:
                    retry.append((message, record))
                    transient += 1
                    new_producer = new_producer or outcome.needs_new_client
                else:
                    # Not the record's fault and not passing (authorisation, a deleted topic):
                    # stop with the entry unacked rather than drop or dead-letter good work.
                    raise outcome
            self.stats.routes.update(mirrored)
            self.stats.mirrored.update(topic for _, topic in mirrored)
            pending = retry
            if new_producer:
                # Records that expired in a long outage leave a gap in the producer's
                # sequence that the broker refuses for ever; a new producer starts afresh.
                # What the old one did get into Kafka is sent again: duplicates, not a loss.
                logger.warning("Kafka refused the producer's sequence numbers; a new producer")
                await self._replace_producer()
            if transient:
                self.stats.produce_retries += 1
                logger.warning(
                    "Kafka did not take %d records; retrying in %.1f s", transient, backoff_s
                )
                if await _wait(stop, backoff_s):
                    logger.info(
                        "stopping with %d entries unacked; they will be replayed", transient
                    )
                    break
                backoff_s = min(backoff_s * 2, BACKOFF_MAX_S)
        return done, to_task_topics

    async def _maybe_log_status(self) -> None:
        now = time.monotonic()
        if now < self._next_status:
            return
        self._next_status = now + self.settings.mirror.status_interval_s
        try:
            lags = " ".join(
                f"{stream}={'absent' if lag is None else lag}"
                for stream, lag in (await self.lag()).items()
            )
        except SidecarError as exc:
            lags = f"unknown ({exc})"
        logger.info("mirror status: %s lag %s", self.stats.summary(), lags)

    async def lag(self) -> dict[str, int | None]:
        """Entries not yet read by the mirror's group, per stream (``None``: no stream yet)."""
        client = self._consumer.client
        group = self.settings.mirror.group
        with translate_valkey_errors("read the lag", self.settings.redis.display_url):
            return {s: await stream_lag(client, s, group) for s in self.settings.mirror.streams}


async def _wait(stop: asyncio.Event | None, seconds: float) -> bool:
    """Sleep ``seconds`` unless ``stop`` is set first; True when stopping."""
    if stop is None:
        await asyncio.sleep(seconds)
        return False
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except TimeoutError:
        return False
    return True
