"""``queue_product`` of the split: one decision per task, Kafka only or Redis only.

The decision is by routing key (the document, memory or canvas run), with the judged share's
sticky hash, against ``min(KAFKA_SERVE_PERCENT, live share)``. A key keeps its decision for
``SERVE_STICKY_S`` from when it was made (never refreshed by later tasks, so a busy key follows
a change as surely as a quiet one), so one ``queue_tasks`` call does not split a document; a
lowered share takes a served key off Kafka at once. A served task is acknowledged by Kafka
(acks=all) before ``queue_product`` returns True, as the XADD it replaces, but within
``SERVE_ENQUEUE_TIMEOUT_MS``: RAGFlow calls it on its event loop. A task Kafka did not take in
time goes to Redis, once: its task id is marked in the state store so that a record of it that
lands later is skipped, and the breaker sends the next tasks to Redis until Kafka answers.
A served document's tasks are dealt across the executors (``ragflow_mq.spread``), as idle
executors take a document's entries on Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import valkey.asyncio as avalkey

from ragflow_mq.breaker import Breaker
from ragflow_mq.claims import divert
from ragflow_mq.loop import BackgroundLoop
from ragflow_mq.recorder import Recorder
from ragflow_mq.spread import Spread
from sidecar.config import Settings
from sidecar.config.routing import Route, RouteTable
from sidecar.config.traffic import in_traffic_share
from sidecar.errors import SidecarError
from sidecar.transport.base import OutgoingMessage
from sidecar.transport.kafka import KafkaProducer
from sidecar.transport.message import encode_task
from sidecar.wire.contract import QUEUE_HEADER, SERVED_HEADER, SERVED_SOURCE, Keys

logger = logging.getLogger(__name__)

SCHEMA_VERSION = b"1"
_STICKY_LIMIT = 100_000  # keys remembered at most; the oldest go first
# Of SERVE_ENQUEUE_TIMEOUT_MS, kept for the fall-back's two Valkey round trips.
_DIVERT_RESERVE_S = 0.25


class _Decision(NamedTuple):
    served: bool
    at: float  # time.monotonic() of the decision
    percent: float  # the share it was made against


class ServeProducer:
    """Decides each task's path and sends the served ones to Kafka."""

    def __init__(  # noqa: PLR0917
        self,
        settings: Settings,
        loop: BackgroundLoop,
        routes: RouteTable,
        percent: Callable[[], float],
        recorder: Recorder,
        store: Callable[[], avalkey.Valkey],
        keys: Keys,
        spread: Spread,
    ) -> None:
        self._settings = settings
        self._spread = spread
        self._loop = loop
        self._routes = routes
        self._percent = percent
        self._recorder = recorder
        self._store = store
        self._keys = keys
        self._priority_streams = frozenset(settings.mirror.priority_streams)
        self._sticky: OrderedDict[str, _Decision] = OrderedDict()
        self._sticky_lock = threading.Lock()  # RAGFlow's API may call from several threads
        self._producer: KafkaProducer | None = None
        self._retiring: set[asyncio.Task[None]] = set()  # replaced producers, stopping
        self.breaker = Breaker(settings.serve.breaker_open_s)
        self._timeout_s = settings.serve.enqueue_timeout_ms / 1000
        self.warmed = threading.Event()  # set once warm() has tried, whatever it found

    def route(self, queue: str, message: Mapping[str, Any]) -> Route | None:
        """The Kafka route of a served task, or ``None`` for one that goes to Redis (outside
        the share, or the breaker is open)."""
        priority = 1 if queue in self._priority_streams else 0
        route = self._routes.route(message, priority)
        if not self._in_share(route.key):
            return None
        if not self.breaker.allow():
            self._recorder.count("kafka", "diverted")
            return None
        return route

    def _in_share(self, key: str) -> bool:
        percent = self._percent()
        now = time.monotonic()
        with self._sticky_lock:
            kept = self._sticky.get(key)
            if (
                kept is not None
                and now - kept.at <= self._settings.serve.sticky_s
                # A lowered share is a roll-back: it wins over the key's recent decision.
                and not (kept.served and percent < kept.percent)
            ):
                return kept.served
            served = in_traffic_share(key, percent)
            self._sticky[key] = _Decision(served, now, percent)
            self._sticky.move_to_end(key)
            if len(self._sticky) > _STICKY_LIMIT:
                self._sticky.popitem(last=False)
        return served

    def produce(self, queue: str, message: Mapping[str, Any], route: Route) -> bool:
        """Send one served task; True once Kafka acknowledged it within the bound, False when
        it did not (it may still land: call ``divert`` before giving it to Redis)."""
        outgoing = OutgoingMessage(
            route.topic,
            encode_task(message),
            key=str(message.get("id")),
            headers=served_headers(queue, message, route),
        )
        try:
            self._loop.run(
                self._send(outgoing, route.key), max(self._timeout_s - _DIVERT_RESERVE_S, 0.05)
            )
        except (SidecarError, TimeoutError) as exc:
            self.breaker.failed()
            logger.warning("ragflow_mq.queue_product %s to %s: %s", queue, route.topic, exc)
            return False
        self.breaker.succeeded()
        self._recorder.count("kafka", "produced")
        return True

    def divert(self, message: Mapping[str, Any]) -> bool | None:
        """Whether a task Kafka did not acknowledge may go to Redis: True (marked, so no
        record of it will run), False (a record of it landed and is Kafka's), None (the state
        store could not say: the task must not be enqueued anywhere else)."""
        task_id = str(message.get("id"))
        ttl_s = self._settings.serve.done_ttl_s
        where = self._settings.state.display_url
        try:
            return self._loop.run(
                divert(self._store(), self._keys, task_id, ttl_s, where), _DIVERT_RESERVE_S * 4
            )
        except (SidecarError, TimeoutError) as exc:
            logger.error("ragflow_mq: task %s cannot be diverted to Redis: %s", task_id, exc)
            return None

    async def warm(self) -> None:
        """Start the producer and read the executors' assignment and the topics' partitions
        ahead of the first served task. Cold, the first task paid Kafka's bootstrap, metadata,
        producer id and group lookup (several round trips) inside SERVE_ENQUEUE_TIMEOUT_MS, and
        on a busy machine was diverted to Redis for the cold start alone. A failure here is
        not the breaker's business: the first task still tries Kafka within its bound."""
        producer = self._current()
        try:
            await producer.start()
            await self._spread.first_read()
            for topic in sorted(self._routes.topics):
                # A route's topic it cannot describe says nothing of the producer: kept.
                with contextlib.suppress(SidecarError):
                    await producer.partitions(topic)
        except SidecarError as exc:
            self._drop(producer)
            logger.info("ragflow_mq: Kafka's producer not ready ahead of the first task: %s", exc)
        finally:
            self.warmed.set()

    def _current(self) -> KafkaProducer:
        producer = self._producer
        if producer is None:
            producer = self._producer = KafkaProducer(
                self._settings.kafka,
                # Each call waits for its own record, so lingering only adds latency; records
                # of concurrent callers still share a request while one is in flight.
                linger_ms=0,
                # Its own retries stay inside one record (idempotence dedups them); a record
                # not acknowledged in time is diverted, not sent again.
                request_timeout_ms=self._settings.serve.produce_timeout_ms,
                client_id=f"{self._settings.kafka.client_id}-ragflow-mq",
            )
        return producer

    def _drop(self, producer: KafkaProducer) -> None:
        """Replaced, never reused: after a broker restart an idempotent producer may retry an
        old batch for as long as it likes, and each record queued behind it (every probe of
        the breaker) would overrun the bound too."""
        if self._producer is producer:
            self._producer = None
            task = asyncio.create_task(self._retire(producer))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def _send(self, outgoing: OutgoingMessage, document: str) -> None:
        producer = self._current()
        try:
            await producer.start()
            await self._spread.first_read()
            partitions = await producer.partitions(outgoing.destination)
            partition = self._spread.partition(document, outgoing.destination, partitions)
            [outcome] = await producer.send_many([outgoing._replace(partition=partition)])
            if isinstance(outcome, SidecarError):
                raise outcome
        except BaseException:  # a failure, or cancelled at the bound
            self._drop(producer)
            raise

    async def _retire(self, producer: KafkaProducer) -> None:
        try:
            await asyncio.wait_for(
                producer.stop(), 2 * self._settings.serve.produce_timeout_ms / 1000
            )
        except (SidecarError, TimeoutError) as exc:
            logger.debug("dropping a broken producer: %s", exc)

    async def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()
        await asyncio.gather(*self._retiring, return_exceptions=True)


def served_headers(queue: str, message: Mapping[str, Any], route: Route) -> list[tuple[str, bytes]]:
    """The seed design's headers, and the two that make a record a served task."""
    task_id, tenant = message.get("id"), message.get("tenant_id")
    priority = message.get("priority", 0)
    return [
        ("x-task-type", route.task_type.encode("utf-8", "replace")),
        ("x-task-id", str(task_id).encode("utf-8", "replace")),
        ("x-tenant-id", tenant.encode("utf-8", "replace") if isinstance(tenant, str) else b""),
        ("x-priority", str(priority if isinstance(priority, int) else 0).encode()),
        ("x-source", SERVED_SOURCE),
        ("x-timestamp", str(int(time.time() * 1000)).encode()),
        ("x-retry-count", b"0"),
        ("x-schema-version", SCHEMA_VERSION),
        (SERVED_HEADER, b"1"),
        (QUEUE_HEADER, queue.encode("utf-8", "replace")),
    ]
