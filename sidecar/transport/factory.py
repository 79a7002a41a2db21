"""A producer or consumer for a backend by name (``MQ_BACKEND``): Redis Streams or Kafka."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from sidecar.transport.base import MessageQueueConsumer, MessageQueueProducer
from sidecar.transport.kafka import KafkaConsumer, KafkaProducer
from sidecar.transport.options import KafkaSettings, RedisSettings
from sidecar.transport.redis_streams import RedisStreamConsumer, RedisStreamProducer

Backend = Literal["redis", "kafka", "split"]


def create_producer(
    backend: Backend, *, redis: RedisSettings, kafka: KafkaSettings
) -> MessageQueueProducer:
    """A Kafka producer for ``kafka``, else a Redis Streams one (``split`` produces to Redis)."""
    if backend == "kafka":
        return KafkaProducer(kafka)
    return RedisStreamProducer(settings=redis)


def create_consumer(
    backend: Backend,
    sources: Sequence[str],
    *,
    redis: RedisSettings,
    kafka: KafkaSettings,
    group: str | None = None,
    consumer_name: str,
) -> MessageQueueConsumer:
    """A consumer of ``sources`` (streams or topics, highest priority first) in ``group``.

    For Kafka, ``group`` defaults to ``KAFKA_CONSUMER_GROUP``; Redis needs it named.
    """
    if backend == "kafka":
        return KafkaConsumer(
            kafka,
            sources,
            group or kafka.consumer_group,
            client_id=f"{kafka.client_id}-{consumer_name}",
        )
    if group is None:
        raise ValueError("a Redis consumer group must be named")
    return RedisStreamConsumer(sources, group, consumer_name, settings=redis)
