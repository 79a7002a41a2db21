"""The shadow consumer: processes the Kafka copy of each task beside RAGFlow's Redis worker.

It reads every task topic in ``SHADOW_GROUP``, the priority topic first. At most
``MAX_CONCURRENT_TASKS`` handlers run at once; a task whose handler is done waits for the join
outside those slots (``SHADOW_JOIN_BATCH`` at most), and a partition's offset is committed only
up to its lowest unfinished record. A record is processed once per stream entry, however often
the mirror replayed it: the first delivery takes a Valkey key with NX and a TTL; a later one is
recorded as a duplicate. A failed handler is retried with backoff up to ``SHADOW_MAX_ATTEMPTS``,
then the record goes to the DLQ with its original bytes and headers; either way the outcome is
the kafka run. Served records (``x-served``, RAGFlow's own tasks on Kafka) are acked, never run."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import valkey.asyncio as valkey

from comparators import OrderTracker
from sidecar.config import Settings
from sidecar.config.routing import RouteTable
from sidecar.errors import MessageDecodeError, SidecarError
from sidecar.lifecycle import Lifecycle
from sidecar.shadow.dedup import Claim, claim_entries, claim_script
from sidecar.shadow.handlers import HandlerResult, NamedHandler, TaskMeta, load_handler, run_handler
from sidecar.shadow.recording import KafkaRunRecorder
from sidecar.shadow.records import (
    dead_letter_of,
    decode_record,
    int_or_none,
    mirror_ref,
    order_key,
    reap,
    retrieve,
)
from sidecar.shadow.replay import value_sha
from sidecar.shadow.trace import kafka_run_facts, traced
from sidecar.transport.coalesce import Coalescer
from sidecar.transport.kafka import KafkaConsumer, KafkaProducer
from sidecar.transport.message import QueueMessage
from sidecar.transport.served import is_served
from sidecar.transport.valkey_client import translate_valkey_errors
from sidecar.verdicts.join import ALIVE_PREFIX, EntryRef
from sidecar.verdicts.judge import Judge, digest_or_none

logger = logging.getLogger(__name__)

MAX_DLQ_BYTES = 1_048_576
ALIVE_TTL_MS = 15_000
POLL_TIMEOUT_MS = 200
# Offsets are committed this often: a commit per record would cap the shadow at the broker's
# commit rate; a crash redelivers finished work, which dedup absorbs.
COMMIT_INTERVAL_MS = 500


@dataclass
class ShadowStats:
    """Counters since start; the metrics exporter reads these."""

    processed: Counter[str] = field(default_factory=Counter)  # by topic
    duplicates: int = 0
    retries: int = 0
    dead_lettered: Counter[str] = field(default_factory=Counter)  # by reason
    in_flight: int = 0
    skipped_served: int = 0  # RAGFlow's own tasks on Kafka (x-served): nothing to compare
    turns: int = 0  # of the loop: the liveness probe's sign of life


class ShadowConsumer(Lifecycle):
    """One shadow instance; several share ``SHADOW_GROUP`` and split the partitions."""

    def __init__(
        self,
        settings: Settings,
        judge: Judge,
        *,
        client: valkey.Valkey,
        ragflow_client: valkey.Valkey | None = None,
        dlq: KafkaProducer,
        handler: NamedHandler | None = None,
        topics: tuple[str, ...] | None = None,
        consumer_overrides: dict[str, Any] | None = None,
        on_processed: Callable[[float | None, float], None] | None = None,
    ) -> None:
        """``on_processed(queue_wait_ms, processing_ms)`` is told of each task run (metrics);
        ``topics`` default to the mirror's route table: the shadow reads where it writes.
        ``client`` (the state store's), ``ragflow_client`` (RAGFlow's Valkey, for the cancel
        keys; default ``client``) and ``dlq`` (a producer taking ``MAX_DLQ_BYTES`` records)
        are the composition root's, started before the shadow and stopped after it."""
        super().__init__()
        routes = RouteTable(settings.mirror.routes)
        if topics is None:
            topics = tuple(routes.ordered_topics())
        self._on_processed = on_processed
        self.settings = settings
        self.stats = ShadowStats()
        self._judge = judge
        self._tracing = judge.tracing
        self._handler = handler or load_handler(settings.shadow.handler)
        self._instance = settings.shadow.instance
        self._consumer = KafkaConsumer(
            settings.kafka,
            topics,
            settings.shadow.group,
            commit_interval_ms=COMMIT_INTERVAL_MS,
            auto_offset_reset=settings.shadow.start,
            # Static membership only for a stable name: a member that leaves for good does not
            # say so, and a name per pid would hold its partitions for a session timeout.
            group_instance_id=settings.shadow.instance if settings.shadow.stable_instance else None,
            **settings.shadow.group_timing_ms,
            **(consumer_overrides or {}),
        )
        self._dlq = dlq
        self._client = client  # dedup and liveness keys: the state store's
        self._where = settings.state.display_url
        # RAGFlow's cancel keys are in RAGFlow's Valkey: asked beside the claims when apart.
        ragflow = None if ragflow_client in (None, client) else ragflow_client
        # The dedup claims of the tasks that start together: one pipelined round trip.
        self._claims: Coalescer[tuple[EntryRef, str], tuple[Claim, bool]] = Coalescer(
            functools.partial(
                claim_entries,
                client,
                claim_script(client),
                me=self._instance.encode(),
                ttl_s=settings.shadow.dedup_ttl_s,
                ragflow=None if ragflow is None else (ragflow, settings.redis.display_url),
            ),
            settings.shadow.join_batch,
        )
        self._order = OrderTracker()
        self._ordered: dict[EntryRef, str | None] = {}  # entries in hand: their order verdict
        self._runs = KafkaRunRecorder(judge, settings.shadow.join_batch, self._count_duplicate)
        self._priority_topics = [t for t in topics if t == routes.priority_parse_topic]
        self._pinned = False  # SHADOW_START=latest positions committed once per start

    async def _start(self) -> None:
        self._pinned = False
        self._runs.reset()
        await self._consumer.start()

    async def _stop(self) -> None:
        await self._consumer.stop()

    def consumer_lag(self) -> dict[tuple[str, int], int]:
        """Records behind this instance's commits, per assigned partition."""
        return self._consumer.lag()

    async def wait_ready(self, timeout_s: float = 60.0) -> dict[str, int]:
        """Wait until partitions are assigned and positioned; returns the positions."""
        await self.pin_start(timeout_s)
        return await self._consumer.wait_for_assignment(timeout_s)

    async def pin_start(self, timeout_s: float = 60.0) -> None:
        """With ``SHADOW_START=latest``, fix where a new group starts, once per start: before
        the mirror produces anything this shadow is meant to see."""
        if self.settings.shadow.start == "latest" and not self._pinned:
            await self._consumer.pin_start_positions(timeout_s)
            self._pinned = True

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until ``stop`` is set, then let the tasks in hand finish.

        A task that fails on something other than its handler (Valkey or Kafka gone) ends the
        loop with that error; its record stays uncommitted and is delivered again on restart.
        """
        limit = self.settings.shadow.max_concurrent_tasks
        # Tasks whose handler is done wait for the join outside the handler's slots: the slots
        # are the executor's (RAGFlow's MAX_CONCURRENT_TASKS), the join is the sidecar's own
        # bookkeeping, and batching it needs many arrivals at once.
        recording_limit = max(self.settings.shadow.join_batch, limit)
        await self.pin_start()
        running: set[asyncio.Task[None]] = set()
        recording = self._runs.tasks
        heartbeat = asyncio.create_task(self._heartbeat(stop), name="shadow-heartbeat")
        try:
            while not stop.is_set() and not heartbeat.done():
                self.stats.turns += 1
                reap(recording)
                full = running if len(running) >= limit else None
                if self._runs.waiting >= recording_limit and recording:
                    full = recording
                if full is not None:
                    await asyncio.wait(full, return_when=asyncio.FIRST_COMPLETED)
                    reap(full)
                    continue
                await self._consumer.commit_due()
                batch = await self._consumer.poll_batch(limit - len(running), POLL_TIMEOUT_MS)
                self._serve_priority_first(batch)
                for message in batch:
                    if is_served(message.headers):
                        # RAGFlow executes it from Kafka: no Redis entry to compare it with,
                        # and running it would be judged missing_in_redis for nothing missing.
                        self.stats.skipped_served += 1
                        await message.ack()
                        continue
                    # Order is judged in consumption order, before tasks run concurrently, and
                    # only where promised: one stream's entries of one key in one partition.
                    named = mirror_ref(message)
                    after = self._order_of(message, named)
                    work = self._process(message, named, after, stop)
                    if self._tracing.enabled:
                        work = traced(self._tracing, message, self.settings.shadow.group, work)
                    task = asyncio.create_task(work)
                    running.add(task)
                    if named is not None:
                        task.add_done_callback(functools.partial(self._forget_order, named))
                reap(running)
                self.stats.in_flight = len(running)  # handlers running: the slots in use
            if heartbeat.done():
                heartbeat.result()
        finally:
            # Stop taking work; what is in hand finishes (the caller bounds the wait), the
            # handlers first, since each hands its task to the join when it is done.
            for in_hand in (running, recording):
                if in_hand:
                    done, _ = await asyncio.wait(in_hand)
                    in_hand.difference_update(done)
                    retrieve(done)
            self.stats.in_flight = 0
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat

    def _order_of(self, message: QueueMessage, ref: EntryRef | None) -> str | None:
        """The later entry of the same key consumed before this record's entry, if any."""
        if ref is None:
            return None
        if ref in self._ordered:
            # A second copy of an entry being processed here (a replay read right behind the
            # first): both are processed and the join keeps whichever is recorded first, so
            # the first copy's order stands for both. The copy comes after later entries of
            # its key by nature; taken as a violation, it made a false order mismatch.
            return self._ordered[ref]
        key = order_key(message, ref.stream)
        violation = self._order.observe(key, ref.entry_id) if key is not None else None
        after = str(violation.right) if violation is not None else None
        self._ordered[ref] = after
        return after

    def _forget_order(self, ref: EntryRef, _: object) -> None:
        self._ordered.pop(ref, None)

    def _count_duplicate(self) -> None:
        self.stats.duplicates += 1

    def _serve_priority_first(self, batch: list[QueueMessage]) -> None:
        if not self._priority_topics:
            return
        if any(message.topic in self._priority_topics for message in batch):
            self._consumer.pause_all_but(self._priority_topics)
        else:
            self._consumer.resume_all()

    async def _heartbeat(self, stop: asyncio.Event) -> None:
        """Keep this instance's liveness key, which tells a crash redelivery from a duplicate."""
        key = f"{ALIVE_PREFIX}{self._instance}"
        while not stop.is_set():
            with translate_valkey_errors("refresh the liveness key", self._where):
                await self._client.set(key, b"1", px=ALIVE_TTL_MS)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=ALIVE_TTL_MS / 3000)
        with (
            contextlib.suppress(SidecarError),
            translate_valkey_errors("drop the liveness key", self._where),
        ):
            await self._client.delete(key)

    async def _process(
        self,
        message: QueueMessage,
        ref: EntryRef | None,
        out_of_order_after: str | None,
        stop: asyncio.Event,
    ) -> None:
        """Process one record, which names the stream entry ``ref`` (see :func:`mirror_ref`);
        ``out_of_order_after`` names a later entry of the same key that was consumed before
        this one (a per-key order violation, unless a duplicate)."""
        started_ms = int(time.time() * 1000)
        if ref is None:
            # Not put there by the mirror (or its headers name no entry): it has no Redis
            # counterpart, so it is judged missing_in_redis once the compare timeout passes.
            ref = EntryRef(f"kafka:{message.topic}", f"{message.partition}-{message.offset}")
        try:
            task = decode_record(message.value)
        except MessageDecodeError as exc:
            await self._dead_letter(message, exc.reason, exc.detail, attempts=0)
            facts = self._facts(message, None, started_ms, ref)
            facts["decode_error"] = exc.reason
            self._record_later(message, ref, facts)
            return
        with translate_valkey_errors("take the dedup key", self._where):
            [(claim, cancelled)] = await self._claims.submit([(ref, f"{task.get('id')}-cancel")])
        if claim == "skip":
            self.stats.duplicates += 1
            await message.ack()
            return
        if claim == "recorded":
            self._record_later(message, ref, self._facts(message, task, started_ms, ref))
            return
        result, attempts = await self._run_with_retries(message, task, ref, cancelled, stop)
        facts = self._facts(message, task, started_ms, ref)
        facts.update(
            outcome=result.outcome,
            error=result.error,
            digest=digest_or_none(result.outcome) if result.ok else None,
            processing_ms=round(result.elapsed_ms, 3),
            attempts=attempts,
        )
        if out_of_order_after is not None:
            facts["order_violation"] = {"after": out_of_order_after}
        if not result.ok:
            await self._dead_letter(message, "handler_failed", result.error or "", attempts)
        self._record_later(message, ref, facts)
        self.stats.processed[message.topic] += 1
        if self._on_processed is not None:
            self._on_processed(facts.get("queue_wait_ms"), result.elapsed_ms)

    def _record_later(self, message: QueueMessage, ref: EntryRef, facts: dict[str, Any]) -> None:
        """Free the handler's slot: the kafka run is recorded with the others of this turn."""
        self._runs.add(message, ref, facts)

    async def _run_with_retries(
        self,
        message: QueueMessage,
        task: dict[str, Any],
        ref: EntryRef,
        cancelled: bool,
        stop: asyncio.Event,
    ) -> tuple[HandlerResult, int]:
        shadow = self.settings.shadow
        retry_count = max(int_or_none(message.header_text("x-retry-count")) or 0, 0)
        attempt = 0
        while True:
            attempt += 1
            meta = TaskMeta(
                path="kafka",
                stream=ref.stream,
                entry_id=ref.entry_id,
                topic=message.topic,
                partition=message.partition,
                offset=message.offset,
                attempt=retry_count + attempt,
                cancelled=cancelled,
            )
            result = await run_handler(self._handler, task, meta)
            if result.ok or attempt >= shadow.max_attempts or stop.is_set():
                return result, attempt
            self.stats.retries += 1
            delay_s = shadow.retry_backoff_ms * 2 ** (attempt - 1) / 1000
            logger.info(
                "handler failed on %s (attempt %d of %d), retrying in %.1f s: %s",
                ref.entry_id,
                attempt,
                shadow.max_attempts,
                delay_s,
                result.error,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay_s)

    async def _dead_letter(
        self, message: QueueMessage, reason: str, detail: str, attempts: int
    ) -> None:
        record = dead_letter_of(message, reason, detail, attempts, MAX_DLQ_BYTES)
        await self._dlq.send(
            record.destination, record.value, key=record.key, headers=record.headers
        )
        self.stats.dead_lettered[reason] += 1

    def _facts(
        self,
        message: QueueMessage,
        task: dict[str, Any] | None,
        started_ms: int,
        ref: EntryRef,
    ) -> dict[str, Any]:
        enqueued = int_or_none(message.header_text("x-timestamp"))
        queue_wait_ms = started_ms - enqueued if enqueued is not None else None
        facts = {
            "task_id": message.header_text("x-task-id") or (str(task.get("id")) if task else None),
            "task_type": message.header_text("x-task-type"),
            "priority": int_or_none(message.header_text("x-priority")),
            "stream": ref.stream,
            "entry_id": ref.entry_id,
            "topic": message.topic,
            "partition": message.partition,
            "offset": message.offset,
            "value_sha": value_sha(message.value or b""),
            "queue_wait_ms": queue_wait_ms,
        }
        if self._tracing.enabled:
            facts.update(kafka_run_facts(message))  # for the verdict's links
        return facts
