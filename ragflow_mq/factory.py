"""The seed design's factory by ``MQ_BACKEND``: ``redis``, ``kafka``, or ``split``.

For ``split`` the asynchronous producer sends each task to Kafka (served) or to its Redis
stream by the same decision as ``install()``'s ``queue_product``; consuming a split belongs
to ``install()``, which hands both paths' tasks to RAGFlow's synchronous executor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ragflow_mq.producer import served_headers
from sidecar.config import Settings
from sidecar.config.routing import RouteTable
from sidecar.config.traffic import in_traffic_share
from sidecar.errors import SidecarError
from sidecar.transport.base import (
    MessageQueueConsumer,
    MessageQueueProducer,
    OutgoingMessage,
    SendResult,
)
from sidecar.transport.factory import create_consumer as _create_consumer
from sidecar.transport.factory import create_producer as _create_producer
from sidecar.transport.kafka import KafkaProducer
from sidecar.transport.message import decode_task
from sidecar.transport.redis_streams import RedisStreamProducer
from sidecar.wire.share import ShareValues


class SplitProducer(MessageQueueProducer):
    """Messages addressed to RAGFlow's streams: served keys to Kafka, the rest to Redis."""

    def __init__(self, settings: Settings, share: ShareValues | None = None) -> None:
        """``share``: the live share to serve under the ceiling (none: the ceiling)."""
        super().__init__()
        self._settings = settings
        self._percent = (share or ShareValues()).served(settings.serve.percent)
        self._routes = RouteTable(settings.mirror.routes)
        self._priority = frozenset(settings.mirror.priority_streams)
        self._kafka = KafkaProducer(settings.kafka)
        self._redis = RedisStreamProducer(settings=settings.redis)

    async def _start(self) -> None:
        await self._redis.start()
        try:
            await self._kafka.start()
        except BaseException:
            await self._redis.stop()
            raise

    async def _stop(self) -> None:
        try:
            await self._kafka.stop()
        finally:
            await self._redis.stop()

    def _split(self, message: OutgoingMessage) -> OutgoingMessage | None:
        task: Mapping[str, Any] = (
            decode_task(message.value) if isinstance(message.value, bytes) else message.value
        )
        priority = 1 if message.destination in self._priority else 0
        route = self._routes.route(task, priority)
        if not in_traffic_share(route.key, self._percent):
            return None
        headers = [*message.headers, *served_headers(message.destination, task, route)]
        return OutgoingMessage(route.topic, message.value_bytes(), route.key, headers)

    async def send_many(
        self, messages: Sequence[OutgoingMessage]
    ) -> list[SendResult | SidecarError]:
        plans = [self._split(message) for message in messages]
        to_kafka = [plan for plan in plans if plan is not None]
        to_redis = [m for m, plan in zip(messages, plans, strict=True) if plan is None]
        kafka = iter(await self._kafka.send_many(to_kafka) if to_kafka else [])
        redis = iter(await self._redis.send_many(to_redis) if to_redis else [])
        return [next(redis) if plan is None else next(kafka) for plan in plans]

    async def flush(self) -> None:
        await self._kafka.flush()


def create_producer(settings: Settings) -> MessageQueueProducer:
    """A producer for ``settings.mq_backend``."""
    if settings.mq_backend == "split":
        return SplitProducer(settings)
    return _create_producer(settings.mq_backend, redis=settings.redis, kafka=settings.kafka)


def create_consumer(
    settings: Settings, sources: Sequence[str], *, group: str | None = None, consumer_name: str
) -> MessageQueueConsumer:
    """A consumer of ``sources`` for ``redis`` or ``kafka`` (a split is consumed through
    ``install()``)."""
    if settings.mq_backend == "split":
        raise ValueError("MQ_BACKEND=split is consumed through ragflow_mq.install()")
    return _create_consumer(
        settings.mq_backend,
        sources,
        redis=settings.redis,
        kafka=settings.kafka,
        group=group,
        consumer_name=consumer_name,
    )
