"""``queue_product`` of the split: one decision per task, Kafka only or Redis only.

The decision is by routing key (the document), with the judged share's sticky hash, against
``min(KAFKA_SERVE_PERCENT, cap)``; a key keeps its path for ``SERVE_STICKY_S`` after its last
task, so one ``queue_tasks`` call never splits a document across the paths even when the cap
moves in the middle of it. A served task is produced and acknowledged by Kafka (acks=all)
before ``queue_product`` returns True, exactly as the XADD it replaces.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from ragflow_mq.contract import QUEUE_HEADER, SERVED_HEADER, SERVED_SOURCE
from ragflow_mq.evidence import Recorder
from ragflow_mq.loop import BackgroundLoop
from sidecar.config import Settings
from sidecar.config.routing import Route, RouteTable
from sidecar.config.traffic import in_traffic_share
from sidecar.errors import SidecarError
from sidecar.transport.base import OutgoingMessage
from sidecar.transport.kafka import KafkaProducer
from sidecar.transport.message import encode_task

logger = logging.getLogger(__name__)

TRIES = 3  # as RAGFlow's queue_product
SCHEMA_VERSION = b"1"
_STICKY_LIMIT = 100_000  # keys remembered at most; the oldest go first


class ServeProducer:
    """Decides each task's path and sends the served ones to Kafka."""

    def __init__(
        self,
        settings: Settings,
        loop: BackgroundLoop,
        routes: RouteTable,
        percent: Callable[[], float],
        recorder: Recorder,
    ) -> None:
        self._settings = settings
        self._loop = loop
        self._routes = routes
        self._percent = percent
        self._recorder = recorder
        self._priority_streams = frozenset(settings.mirror.priority_streams)
        self._sticky: OrderedDict[str, tuple[bool, float]] = OrderedDict()
        self._sticky_lock = threading.Lock()  # RAGFlow's API may call from several threads
        self._producer: KafkaProducer | None = None
        timeout_ms = settings.serve.produce_timeout_ms
        # One try: the producer's own delivery timeout, plus room for a cold start.
        self._try_timeout_s = 2 * timeout_ms / 1000 + 5

    def route(self, queue: str, message: Mapping[str, Any]) -> Route | None:
        """The Kafka route of a served task, or ``None`` for one that stays on Redis."""
        priority = 1 if queue in self._priority_streams else 0
        route = self._routes.route(message, priority)
        percent = self._percent()
        now = time.monotonic()
        with self._sticky_lock:
            remembered = self._sticky.get(route.key)
            if remembered is not None and now - remembered[1] <= self._settings.serve.sticky_s:
                served = remembered[0]
            else:
                served = in_traffic_share(route.key, percent)
            self._sticky[route.key] = (served, now)
            self._sticky.move_to_end(route.key)
            if len(self._sticky) > _STICKY_LIMIT:
                self._sticky.popitem(last=False)
        return route if served else None

    def produce(self, queue: str, message: Mapping[str, Any], route: Route) -> bool:
        """Send one served task and wait for Kafka's acknowledgement; False after 3 tries."""
        outgoing = OutgoingMessage(
            route.topic,
            encode_task(message),
            key=route.key,
            headers=served_headers(queue, message, route),
        )
        for attempt in range(1, TRIES + 1):
            try:
                self._loop.run(self._send(outgoing), self._try_timeout_s)
            except (SidecarError, TimeoutError) as exc:
                logger.warning(
                    "ragflow_mq.queue_product %s to %s, try %d of %d: %s",
                    queue,
                    route.topic,
                    attempt,
                    TRIES,
                    exc,
                )
                continue
            self._recorder.count("kafka", "produced")
            return True
        logger.error("ragflow_mq.queue_product %s: Kafka did not take task %s", queue, route.key)
        return False

    async def _send(self, outgoing: OutgoingMessage) -> None:
        if self._producer is None:
            self._producer = KafkaProducer(
                self._settings.kafka,
                # Each call waits for its own record, so lingering only adds latency; records
                # of concurrent callers still share a request while one is in flight.
                linger_ms=0,
                request_timeout_ms=self._settings.serve.produce_timeout_ms,
                client_id=f"{self._settings.kafka.client_id}-ragflow-mq",
            )
        producer = self._producer
        try:
            await producer.start()
            await producer.send(
                outgoing.destination, outgoing.value, key=outgoing.key, headers=outgoing.headers
            )
        except SidecarError as exc:
            if exc.needs_new_client or not producer.started:
                self._producer = None
                await _stop_quietly(producer)
            raise

    async def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()


async def _stop_quietly(producer: KafkaProducer) -> None:
    try:
        await producer.stop()
    except SidecarError as exc:
        logger.debug("dropping a broken producer: %s", exc)


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
