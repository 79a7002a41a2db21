"""Choose the backend by ``MQ_BACKEND``."""

from __future__ import annotations

from collections.abc import Sequence

from sidecar.mq.base import MessageQueueConsumer, MessageQueueProducer
from sidecar.mq.kafka import KafkaConsumer, KafkaProducer
from sidecar.mq.redis_streams import RedisStreamConsumer, RedisStreamProducer
from sidecar.settings import MQBackend, Settings


def create_producer(settings: Settings, backend: MQBackend | None = None) -> MessageQueueProducer:
    """A producer for ``backend`` (default: ``settings.mq_backend``)."""
    if (backend or settings.mq_backend) == "kafka":
        return KafkaProducer(settings.kafka)
    return RedisStreamProducer(settings=settings.redis)


def create_consumer(
    settings: Settings,
    sources: Sequence[str],
    *,
    group: str | None = None,
    consumer_name: str,
    backend: MQBackend | None = None,
) -> MessageQueueConsumer:
    """A consumer of ``sources`` (streams or topics, highest priority first) in ``group``.

    For Kafka, ``group`` defaults to ``KAFKA_CONSUMER_GROUP``; Redis needs it named.
    """
    if (backend or settings.mq_backend) == "kafka":
        return KafkaConsumer(
            settings.kafka,
            sources,
            group or settings.kafka.consumer_group,
            client_id=f"{settings.kafka.client_id}-{consumer_name}",
        )
    if group is None:
        raise ValueError("a Redis consumer group must be named")
    return RedisStreamConsumer(sources, group, consumer_name, settings=settings.redis)
