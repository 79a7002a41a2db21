"""What ``install()`` runs in one RAGFlow process: the loop, the producer, the consumer, the
live share and the evidence, and RAGFlow's ``RedisMsg`` timed for the evidence."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import valkey

from ragflow_mq.backlog import ServedBacklog
from ragflow_mq.callers import Callers
from ragflow_mq.consumer import ServeConsumer
from ragflow_mq.failures import watch_failures
from ragflow_mq.hand import KafkaTask
from ragflow_mq.loop import BackgroundLoop
from ragflow_mq.producer import ServeProducer
from ragflow_mq.recorder import Recorder, write
from ragflow_mq.redis_task import RedisTask
from ragflow_mq.share import LiveShare
from ragflow_mq.spread import Spread
from sidecar.config import Settings
from sidecar.config.routing import RouteTable
from sidecar.transport.valkey_client import SOCKET_TIMEOUT_S, create_client
from sidecar.wire.contract import Keys

logger = logging.getLogger(__name__)

PATCHED = ("queue_product", "queue_consumer", "get_unacked_iterator", "queue_info")
_ENTRY_ID = re.compile(r"^(\d+)-\d+$")
_CONSUMER_RETRY_S = 5.0
_CLOSE_TIMEOUT_S = 10.0
_FIRST_SHARE_READ_S = 0.5
_BACKLOG_REFRESH_S = 5.0


class Runtime:
    """Everything ``install()`` runs in one process: the loop, the producer, the consumer
    (started on the first consuming call, with RAGFlow's consumer name), the live share and
    the evidence. ``close()`` runs at exit."""

    def __init__(self, settings: Settings, conn: Any) -> None:
        self.settings = settings
        self.keys = Keys(settings.serve.key_prefix)
        self.loop = BackgroundLoop()
        self.recorder = Recorder()
        self.routes = RouteTable(settings.mirror.routes)
        self._conn = conn
        self.originals: dict[str, Callable[..., Any]] = {n: getattr(conn, n) for n in PATCHED}
        self._store: Any = None
        self._state_sync: valkey.Valkey | None = None
        self.backlog = ServedBacklog(settings, self.routes)
        self._backlog_started = False
        self.spread = Spread(settings)
        self.producer = self._new_producer()
        self.consumer: ServeConsumer | None = None
        self._lock = threading.Lock()
        self._background = False
        self._consumer_retry_at = 0.0
        self._starting: concurrent.futures.Future[ServeConsumer] | None = None
        self.share = LiveShare(self.keys)
        self._evidence_failing = False
        # Task id -> (path, document), while RAGFlow holds the task; and how many are Redis's.
        self._held: dict[str, tuple[str, str]] = {}
        self._held_on_redis = 0
        self.callers = Callers(self._gave_up)
        self._redis_busy: dict[str, bool] = {}
        self._redis_turn: dict[str, bool] = {}
        self._closed = False
        self._chores_stop = threading.Event()
        self._chores: list[threading.Thread] = []
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        """A forked child (a pre-forking server) has no loop thread and no client of its own:
        it starts afresh, and its parent's unflushed evidence stays the parent's."""
        self.loop = BackgroundLoop()
        self.recorder = Recorder()
        self._store = None
        self._state_sync = None
        self.backlog = ServedBacklog(self.settings, self.routes)
        self._backlog_started = False
        self.spread = Spread(self.settings)
        self.producer = self._new_producer()
        self.consumer = None
        self._starting = None
        self._lock = threading.Lock()
        self._background = False
        self._held.clear()
        self._held_on_redis = 0
        self.callers = Callers(self._gave_up)
        self._chores_stop = threading.Event()
        self._chores = []

    def _new_producer(self) -> ServeProducer:
        return ServeProducer(
            self.settings,
            self.loop,
            self.routes,
            self.percent,
            self.recorder,
            self.store,
            self.keys,
            self.spread,
        )

    def store(self) -> Any:
        """The state store's client (claims, done markers), used on the loop thread only:
        ``SIDECAR_STATE_URL``, or RAGFlow's Valkey when that is unset."""
        if self._store is None:
            self._store = create_client(self.settings.state)
        return self._store

    def busy_on_redis(self) -> int:
        """RAGFlow's slots filled by Redis tasks (the Kafka side fetches only for the rest)."""
        return self._held_on_redis

    def sync_store(self) -> Any:
        """The synchronous client of the live share and the evidence: RAGFlow's own (looked up each
        time, RAGFlow may reopen it) unless ``SIDECAR_STATE_URL`` names a state store apart,
        where they live beside the claims, out of reach of RAGFlow's LRU eviction."""
        if self.settings.state == self.settings.redis:
            return self._conn.REDIS
        if self._state_sync is None:
            self._state_sync = valkey.Valkey(
                **self.settings.state.client_kwargs(),
                socket_connect_timeout=5,
                socket_timeout=SOCKET_TIMEOUT_S,
            )
        return self._state_sync

    # -- the share ---------------------------------------------------------------------------

    def percent(self) -> float:
        self._ensure_background()
        return self.share.served(self.settings.serve.percent)

    def read_share(self) -> None:
        self.share.read(self.sync_store())

    def _ensure_background(self) -> None:
        if self._background:
            return
        with self._lock:
            if self._background:
                return
            # The share and the evidence are read and written with the synchronous client, on
            # threads of their own: not the loop's default executor, which the interpreter
            # shuts at exit before atexit runs close(), so that the last periodic flush raised
            # "cannot schedule new futures after shutdown" while the executor stopped.
            serve = self.settings.serve
            self._chores = [
                _every(self.read_share, serve.share_refresh_s, self._chores_stop, "share", True),
                _every(self.flush_evidence, serve.evidence_flush_s, self._chores_stop, "evidence"),
            ]
            if self.settings.serve.percent > 0:
                self.loop.spawn(self.spread.keep_refreshing, "ragflow-mq-spread")
            self._background = True
            # The first decision waits for the first read (0 is served until it answers), but
            # not past _FIRST_SHARE_READ_S: a store that hangs must not hold RAGFlow's call.
            self.share.tried.wait(_FIRST_SHARE_READ_S)

    def flush_evidence(self) -> None:
        pending = self.recorder.drain()
        if not pending:
            return
        try:
            pipe = self.sync_store().pipeline(transaction=False)
            write(pipe, self.keys, pending)
            pipe.execute()
        except Exception as exc:
            self.recorder.restore(pending)
            if not self._evidence_failing:
                self._evidence_failing = True
                logger.warning(
                    "ragflow_mq could not write its evidence (kept for later; once per outage): %s",
                    exc,
                )
            return
        self._evidence_failing = False

    def served_backlog(self, queue: str) -> int:
        """Served records of ``queue`` not yet acked, as last read (0 until the first read,
        and always 0 where nothing is ever served)."""
        if self.settings.serve.percent <= 0 or self._closed:
            return 0
        if not self._backlog_started:
            with self._lock:
                if not self._backlog_started:
                    self._backlog_started = True
                    self.loop.spawn(self._refresh_backlog, "ragflow-mq-backlog")
        return self.backlog.by_queue.get(queue, 0)

    async def _refresh_backlog(self) -> None:
        try:
            while True:
                await self.backlog.refresh()
                await asyncio.sleep(_BACKLOG_REFRESH_S)
        finally:
            await self.backlog.close()

    # -- consuming ---------------------------------------------------------------------------

    def ensure_consumer(self, consumer_name: str) -> ServeConsumer | None:
        """The Kafka side of this executor, or ``None`` until it has joined its group.

        Started in the background on the first consuming call, so RAGFlow's call never waits
        on Kafka: while Kafka cannot be reached the executor goes on with Redis work, and a
        start is tried again every 5 s.
        """
        if self.consumer is not None or self._closed:
            return self.consumer
        with self._lock:
            starting = self._starting
            if starting is not None and starting.done():
                self._starting = None
                failure = starting.exception()
                if failure is None:
                    self.consumer = starting.result()
                else:
                    self._consumer_retry_at = time.monotonic() + _CONSUMER_RETRY_S
                    logger.warning("ragflow_mq: no Kafka consumer yet, Redis only: %s", failure)
            elif starting is None and time.monotonic() >= self._consumer_retry_at:
                watch_failures(self.failed)
                self._starting = self.loop.submit(self._start_consumer(consumer_name))
        if self.consumer is not None:
            self._ensure_background()  # outside the lock: it takes the lock itself
        return self.consumer

    async def _start_consumer(self, consumer_name: str) -> ServeConsumer:
        consumer = ServeConsumer(
            self.settings,
            self.routes,
            self.keys,
            self.store(),
            self.recorder,
            consumer_name,
            busy=self.busy_on_redis,
            on_finished=self.kafka_finished,
        )
        try:
            await consumer.start()
        except BaseException:
            await consumer.stop()
            raise
        return consumer

    def handed_out(self, path: str, task: KafkaTask | RedisTask, *, retried: bool = False) -> None:
        """RAGFlow holds ``task`` now: its slot is taken, its document may start here. A task
        handed out again (``retried``) is counted under the minute its document started."""
        message, task_id = task.get_message(), str(task.task_id)
        document = self.routes.route(message, 0).key if isinstance(message, dict) else task_id
        with self._lock:
            previous = self._held.get(task_id)
            self._held[task_id] = (path, document)
            self._held_on_redis += (path == "redis") - (
                previous is not None and previous[0] == "redis"
            )
        wait_ms = task.queue_wait_ms
        if wait_ms is not None:
            self.recorder.first(path, "started", document, latency="queue_wait", ms=wait_ms)
        if retried:
            self.recorder.of_document(path, "retried", document)
        self.callers.handed(task)

    def _gave_up(self, task: KafkaTask | RedisTask) -> None:
        """RAGFlow dropped ``task`` unacked: its slot is free. A Redis entry stays pending in
        Redis; a served task is kept pending for this consumer name in the state store."""
        task_id = task.task_id
        self._let_go(str(task_id))
        if isinstance(task, KafkaTask):
            if self.consumer is not None:
                self.consumer.given_up(task)
            return
        self.recorder.count("redis", "abandoned")
        logger.warning("task %s was handed out from Redis and never acked: left pending", task_id)
        if self.consumer is not None:
            self.consumer.wake()

    def _let_go(self, task_id: str) -> tuple[str, str] | None:
        with self._lock:
            held = self._held.pop(task_id, None)
            if held is not None and held[0] == "redis":
                self._held_on_redis -= 1
        return held

    def finished(self, path: str, task: RedisTask) -> None:
        """A Redis task was acked (Kafka tasks are counted by their consumer)."""
        processing_ms = (time.time() - task.handed_out_s) * 1000
        self.recorder.count(path, "finished")
        self.recorder.observe(path, "processing", processing_ms)
        if task.task_id is not None:
            self._finished_document(self._let_go(task.task_id), processing_ms)
        if self.consumer is not None:
            self.consumer.wake()  # the slot it held may take a served task now

    def kafka_finished(self, task: KafkaTask) -> None:
        """A served task was acked (its consumer counted the task)."""
        processing_ms = (time.time() - task.handed_out_s) * 1000
        self._finished_document(self._let_go(task.task_id), processing_ms)

    def _finished_document(self, held: tuple[str, str] | None, processing_ms: float) -> None:
        if held is not None:
            path, document = held
            self.recorder.first(path, "finished", document, latency="processing", ms=processing_ms)

    def failed(self, task_id: Any) -> None:
        held = self._held.get(str(task_id))
        if held is not None:
            path, document = held
            self.recorder.count(path, "failed")
            self.recorder.first(path, "failed", document)

    def redis_task(self, message: Any, *, retried: bool) -> RedisTask | None:
        if message is None or isinstance(message, RedisTask):
            return message
        task = RedisTask(message, self.finished)
        self.recorder.count("redis", "started")
        match = _ENTRY_ID.match(str(task.get_msg_id()))
        if match:
            task.queue_wait_ms = time.time() * 1000 - int(match[1])
            self.recorder.observe("redis", "queue_wait", task.queue_wait_ms)
        if task.task_id is not None:
            self.handed_out("redis", task, retried=retried)
        elif retried:
            self.recorder.count("redis", "retried")  # no document to file it under
        return task

    def kafka_first(self, queue: str) -> bool:
        """Whether to offer Kafka's task before asking Redis: always while Redis's last read
        of this queue found nothing, alternately while both have work (neither starves)."""
        if not self._redis_busy.get(queue, False):
            return True
        turn = not self._redis_turn.get(queue, False)
        self._redis_turn[queue] = turn
        return not turn

    def note_redis(self, queue: str, found: bool) -> None:
        self._redis_busy[queue] = found

    def close(self) -> None:
        """Commit what is finished, leave the group, flush the evidence, stop the loop."""
        if self._closed:
            return
        self._closed = True
        consumer = self.consumer

        async def stop_consumer() -> None:
            if consumer is not None:
                await consumer.stop()

        async def close_store() -> None:
            if self._store is not None:
                await self._store.aclose()

        self.loop.close([stop_consumer, self.producer.close, close_store], _CLOSE_TIMEOUT_S)
        # The periodic flush ends (one under way finishes: its writes are not cut short) before
        # the last one, from the calling thread, writes everything recorded until now.
        self._chores_stop.set()
        for chore in self._chores:
            chore.join(_CLOSE_TIMEOUT_S)
        self.flush_evidence()
        if self._state_sync is not None:
            self._state_sync.close()  # type: ignore[no-untyped-call]


def _every(
    work: Callable[[], None], every_s: float, stop: threading.Event, name: str, now: bool = False
) -> threading.Thread:
    """A daemon thread that runs ``work`` every ``every_s`` (first at once if ``now``) until
    ``stop`` is set; ``work`` handles its own failures (one warning per outage)."""

    def run() -> None:
        due = now
        while due or not stop.wait(every_s):
            due = False
            try:
                work()
            except Exception:
                # Kept going: a chore that died would leave the share or the evidence stale
                # for the rest of the process's life.
                logger.exception("ragflow_mq %s failed", name)

    thread = threading.Thread(target=run, name=f"ragflow-mq-{name}", daemon=True)
    thread.start()
    return thread
