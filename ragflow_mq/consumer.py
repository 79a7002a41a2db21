"""The executor's Kafka side: served records fetched ahead, handed out by RAGFlow's queue name.

One group member per executor process, in ``KAFKA_CONSUMER_GROUP``, reads every task topic
(the priority parse topic first). A fetch task keeps at most ``SERVE_PREFETCH`` records
waiting; ``take(queue)`` hands the next one of that queue to RAGFlow without waiting, and its
``ack()`` marks it done; finished offsets are committed every ``SERVE_COMMIT_INTERVAL_MS``,
contiguously, so a crash redelivers everything not yet done (at-least-once, as Redis's
pending entries). Records without ``x-served`` are the mirror's copies: skipped. A record
RAGFlow could not take (no JSON object with an id) or handed out more than
``SERVE_MAX_ATTEMPTS`` times goes to the DLQ with its bytes and the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ragflow_mq.contract import ATTEMPTS_TTL_S, QUEUE_HEADER, SERVED_HEADER, Keys
from ragflow_mq.evidence import Recorder
from sidecar.config import Settings
from sidecar.config.routing import RouteTable
from sidecar.errors import MessageDecodeError, SidecarError
from sidecar.transport.dead_letter import dead_letter
from sidecar.transport.kafka import KafkaConsumer, KafkaProducer
from sidecar.transport.message import QueueMessage, decode_task

logger = logging.getLogger(__name__)

_DLQ_MAX_BYTES = 1_000_000
_FETCH_TIMEOUT_MS = 500


class KafkaTask:
    """What ``queue_consumer`` returns for a served record: RAGFlow's ``RedisMsg`` interface."""

    def __init__(self, owner: ServeConsumer, message: QueueMessage, task: dict[str, Any]) -> None:
        self._owner = owner
        self.message = message
        self._task = task
        self.handed_out_s = time.time()
        self._acked = False

    def get_message(self) -> dict[str, Any]:
        return self._task

    def get_msg_id(self) -> str:
        return self.message.id

    @property
    def task_id(self) -> str:
        return str(self._task.get("id"))

    def ack(self) -> bool:
        """Mark the task done; its offset is committed with the next interval's commit."""
        if not self._acked:
            self._acked = True
            self._owner.finished(self)
        return True


class ServeConsumer:
    """Owns the Kafka consumer and the prefetch buffers; ``take``/``finished`` are thread-safe."""

    def __init__(  # noqa: PLR0917
        self,
        settings: Settings,
        routes: RouteTable,
        keys: Keys,
        redis: Callable[[], Any],
        recorder: Recorder,
        consumer_name: str,
        on_finished: Callable[[str], None] = lambda task_id: None,
    ) -> None:
        self._settings = settings
        self._routes = routes
        self._keys = keys
        self._redis = redis  # RAGFlow's own synchronous client, looked up at each use
        self._recorder = recorder
        self._consumer_name = consumer_name
        self._on_finished = on_finished
        self._queues = tuple(settings.mirror.streams)
        self._lock = threading.Lock()
        self._buffers: dict[str, deque[KafkaTask]] = {queue: deque() for queue in self._queues}
        self._in_hand: dict[str, KafkaTask] = {}  # message id -> task handed out, not acked
        self._buffered = 0
        self._room = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._consumer: KafkaConsumer | None = None
        self._dlq: KafkaProducer | None = None
        self._stopping = False
        self._tasks: list[asyncio.Task[None]] = []
        self._warned: set[str] = set()
        # Partitions revoked since the last fetch returned: records of theirs still on their
        # way to the buffers are now their new owner's, and must not be handed out here too.
        self._revoked_lately: set[tuple[str, int]] = set()

    async def start(self) -> None:
        serve = self._settings.serve
        self._loop = asyncio.get_running_loop()
        self._room = asyncio.Event()
        self._consumer = KafkaConsumer(
            self._settings.kafka,
            self._routes.ordered_topics(),
            self._settings.kafka.consumer_group,
            commit_interval_ms=max(serve.commit_interval_ms, 1),
            on_revoke=self._revoked,
            client_id=f"{self._settings.kafka.client_id}-{self._consumer_name}",
            session_timeout_ms=serve.session_timeout_ms,
            heartbeat_interval_ms=min(3000, serve.session_timeout_ms // 3),
        )
        await self._consumer.start()
        self._dlq = KafkaProducer(self._settings.kafka, linger_ms=0)
        self._tasks = [
            asyncio.create_task(self._keep_fetching(), name="ragflow-mq-fetch"),
            asyncio.create_task(self.run_commits(), name="ragflow-mq-commit"),
        ]

    async def _keep_fetching(self) -> None:
        """``run_fetch`` until ``stop()``, through Kafka's passing failures: a broker away
        leaves the executor on Redis work meanwhile, not without a consumer for good."""
        while not self._stopping:
            try:
                await self.run_fetch()
            except SidecarError as exc:
                logger.warning("fetching served tasks failed (again in 1 s): %s", exc)
                await asyncio.sleep(1)

    async def run_fetch(self) -> None:
        """Keep the buffers filled up to the prefetch bound until ``stop()``."""
        while not self._stopping:
            room = self._settings.serve.prefetch - self._buffered
            if room <= 0:
                self._room.clear()
                await self._room.wait()
                continue
            consumer = self._consumer
            if consumer is None:
                return
            batch = await consumer.poll_batch(room, _FETCH_TIMEOUT_MS)
            # Cleared when the fetch returns, not when it begins: a fetch that waited through a
            # rebalance returns records of the assignment that followed (aiokafka drops what
            # was fetched before), so a partition revoked meanwhile and given back is ours.
            # Taken for a new owner's, those records were dropped by the member that still
            # owned them: never run, until another rebalance. No await since the fetch
            # returned, so no revoke of what it returned is missed.
            self._revoked_lately.clear()
            if batch:
                await self._accept(batch)

    async def run_commits(self) -> None:
        """Commit finished work at the configured pace until ``stop()``."""
        interval_s = max(self._settings.serve.commit_interval_ms, 1) / 1000
        while not self._stopping:
            await asyncio.sleep(interval_s)
            consumer = self._consumer
            if self._stopping or consumer is None:
                return  # stop() makes the last commit
            try:
                await consumer.commit_due()
            except SidecarError as exc:
                logger.warning("could not commit finished tasks: %s", exc)

    async def _accept(self, batch: list[QueueMessage]) -> None:
        assert self._consumer is not None
        served: list[tuple[QueueMessage, dict[str, Any]]] = []
        for message in batch:
            if message.header(SERVED_HEADER) != b"1":
                self._consumer.finish(message)  # the mirror's copy: RAGFlow ran it from Redis
                continue
            try:
                task = decode_task(message.value)
                if not isinstance(task.get("id"), str):
                    raise MessageDecodeError("no_task_id", "the task has no string 'id'")
            except MessageDecodeError as exc:
                await self._dead_letter(message, exc.reason, exc.detail)
                continue
            served.append((message, task))
        if not served:
            return
        attempts = await asyncio.to_thread(self._count_attempts, [m for m, _ in served])
        counted = list(zip(served, attempts, strict=True))
        # No await from here to the buffers: a rebalance that took a partition while its
        # records were counted has run by now, and those records are the new owner's.
        late = [
            KafkaTask(self, m, t)
            for (m, t), _ in counted
            if (m.topic, m.partition) in self._revoked_lately
        ]
        if late:
            gone = {task.message.id for task in late}
            counted = [(pair, n) for pair, n in counted if pair[0].id not in gone]
        limit = self._settings.serve.max_attempts
        with self._lock:
            for (message, task), attempt in counted:
                if attempt > limit:
                    continue
                if attempt > 1:
                    self._recorder.count("kafka", "retried")
                queue = _text(message.header(QUEUE_HEADER))
                if queue not in self._buffers:
                    # A queue this executor was not configured with (MIRROR_STREAMS): served
                    # with the lowest priority rather than left unread.
                    queue = self._queues[-1]
                self._buffers[queue].append(KafkaTask(self, message, task))
                self._buffered += 1
        if late:
            logger.info(
                "%d fetched record(s) of revoked partitions left to their new owner: %s",
                len(late),
                ", ".join(task.message.id for task in late),
            )
            await asyncio.to_thread(self._give_back, late)
        for (message, _), attempt in counted:
            if attempt > limit:
                detail = f"handed out {attempt - 1} times without an ack"
                await self._dead_letter(message, "max_attempts", detail)

    def _count_attempts(self, messages: list[QueueMessage]) -> list[int]:
        """One pipelined INCR per record: how often it has been handed out, across restarts.
        Without Valkey, a record counts as a first attempt rather than stalling the executor."""
        try:
            pipe = self._redis().pipeline(transaction=False)
            for message in messages:
                key = self._keys.attempts(message.topic, message.partition, message.offset)
                pipe.incr(key)
                pipe.expire(key, ATTEMPTS_TTL_S)
            replies = pipe.execute()
        except Exception as exc:
            logger.warning("could not count delivery attempts: %s", exc)
            return [1] * len(messages)
        return [int(reply) for reply in replies[::2]]

    def _give_back(self, tasks: list[KafkaTask]) -> None:
        """Records fetched ahead and never handed to RAGFlow were not attempted: their count
        goes back down, so restarts and rebalances do not dead-letter a task nobody ran."""
        if not tasks:
            return
        try:
            pipe = self._redis().pipeline(transaction=False)
            for task in tasks:
                message = task.message
                pipe.decr(self._keys.attempts(message.topic, message.partition, message.offset))
            pipe.execute()
        except Exception as exc:
            logger.warning("could not give back %d delivery attempts: %s", len(tasks), exc)

    async def _dead_letter(self, message: QueueMessage, reason: str, detail: str) -> None:
        assert self._consumer is not None and self._dlq is not None
        # Built once: the DLQ record keeps the bytes as read whatever happens next.
        record = dead_letter(
            reason=reason,
            detail=detail,
            value=message.value,
            stream=_text(message.header(QUEUE_HEADER)) or "",
            entry_id=message.id,
            stage="serve",
            max_value_bytes=_DLQ_MAX_BYTES,
            extra_headers=(
                ("x-source-topic", message.topic.encode()),
                ("x-source-offset", f"{message.partition}:{message.offset}".encode()),
                *message.headers,
            ),
        )
        # Not finished (so not committed past) until the DLQ has it. Tried until it does:
        # giving up here would leave the record unfinished and its partition's commits stuck
        # behind it until the next rebalance; Kafka being away stalls fetching anyway.
        while True:
            try:
                await self._dlq.start()
                await self._dlq.send(
                    record.destination, record.value, key=record.key, headers=record.headers
                )
                break
            except SidecarError as exc:
                if self._stopping:
                    raise
                logger.warning("dead-lettering %s failed (again in 1 s): %s", message.id, exc)
                if exc.needs_new_client:
                    broken, self._dlq = self._dlq, KafkaProducer(self._settings.kafka, linger_ms=0)
                    with contextlib.suppress(SidecarError):
                        await broken.stop()
                await asyncio.sleep(1)
        self._consumer.finish(message)
        self._recorder.count("kafka", "dead_lettered")
        logger.warning("served record %s dead-lettered: %s (%s)", message.id, reason, detail)

    def take(self, queue: str) -> KafkaTask | None:
        """The next served task of ``queue``, or ``None`` at once when none is waiting."""
        buffer = self._buffers.get(queue)
        if buffer is None:
            if queue not in self._warned:
                self._warned.add(queue)
                logger.warning("queue %s is not in MIRROR_STREAMS; no Kafka tasks for it", queue)
            return None
        with self._lock:
            if not buffer:
                return None
            task = buffer.popleft()
            self._buffered -= 1
            task.handed_out_s = time.time()
            self._in_hand[task.message.id] = task
        self._recorder.count("kafka", "started")
        wait_ms = task.handed_out_s * 1000 - task.message.timestamp_ms
        self._recorder.observe("kafka", "queue_wait", wait_ms)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._room.set)
        return task

    def finished(self, task: KafkaTask) -> None:
        """RAGFlow acked ``task`` (any thread)."""
        consumer = self._consumer
        if self._loop is not None and consumer is not None:
            # Queued on the loop before the task leaves the hand: a rebalance that sees the
            # hand empty finds its offset finished once it yields (see _revoked).
            self._loop.call_soon_threadsafe(consumer.finish, task.message)
        with self._lock:
            self._in_hand.pop(task.message.id, None)
        self._recorder.count("kafka", "finished")
        self._recorder.observe("kafka", "processing", (time.time() - task.handed_out_s) * 1000)
        self._on_finished(task.task_id)

    def in_hand(self) -> int:
        with self._lock:
            return len(self._in_hand)

    async def _revoked(self, partitions: set[tuple[str, int]]) -> None:
        """Fetched-ahead records of the revoked partitions go back (their new owner reads
        them again); tasks in RAGFlow's hands get ``SERVE_REVOKE_WAIT_S`` to be acked, so a
        rebalance does not run them twice."""

        def revoked(task: KafkaTask) -> bool:
            return (task.message.topic, task.message.partition) in partitions

        self._revoked_lately |= partitions

        with self._lock:
            dropped: list[KafkaTask] = []
            for queue, buffer in self._buffers.items():
                kept = deque(task for task in buffer if not revoked(task))
                dropped += [task for task in buffer if revoked(task)]
                self._buffered -= len(buffer) - len(kept)
                self._buffers[queue] = kept
        if self._stopping:
            self._give_back(dropped)  # at interpreter exit to_thread's pool is already gone
        else:
            await asyncio.to_thread(self._give_back, dropped)
        self._room.set()
        # Leaving the group at exit: what RAGFlow still holds will not be acked by a process
        # that is ending, so there is nothing to wait for; it is delivered again elsewhere.
        wait_s = 0.0 if self._stopping else self._settings.serve.revoke_wait_s
        deadline = time.monotonic() + wait_s
        waiting = 0
        while time.monotonic() < deadline:
            with self._lock:
                waiting = sum(1 for task in self._in_hand.values() if revoked(task))
            if not waiting:
                await asyncio.sleep(0)  # let the acks' finish() callbacks run before the commit
                return
            await asyncio.sleep(0.05)
        if waiting:
            logger.warning(
                "partitions revoked while %d served task(s) were still running: they may run twice",
                waiting,
            )

    async def stop(self) -> None:
        """Stop fetching; commit what is finished and leave the group (what was fetched ahead
        or is still running is not committed, so it is delivered again)."""
        self._stopping = True
        self._room.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        with self._lock:
            unused = [task for buffer in self._buffers.values() for task in buffer]
            for buffer in self._buffers.values():
                buffer.clear()
            self._buffered = 0
        # Called at interpreter exit too, when the thread pool behind to_thread is gone.
        self._give_back(unused)
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()
        dlq, self._dlq = self._dlq, None
        if dlq is not None:
            await dlq.stop()


def _text(value: bytes | None) -> str | None:
    return value.decode("utf-8", "replace") if value is not None else None
