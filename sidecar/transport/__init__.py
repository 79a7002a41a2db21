"""The message-queue layer: one interface over Redis Streams and Kafka."""

from sidecar.transport.base import (
    MessageQueueConsumer,
    MessageQueueProducer,
    OutgoingMessage,
    SendResult,
)
from sidecar.transport.factory import create_consumer, create_producer
from sidecar.transport.kafka import KafkaConsumer, KafkaProducer
from sidecar.transport.message import QueueMessage, decode_task, encode_task
from sidecar.transport.redis_streams import RedisStreamConsumer, RedisStreamProducer

__all__ = [
    "KafkaConsumer",
    "KafkaProducer",
    "MessageQueueConsumer",
    "MessageQueueProducer",
    "OutgoingMessage",
    "QueueMessage",
    "RedisStreamConsumer",
    "RedisStreamProducer",
    "SendResult",
    "create_consumer",
    "create_producer",
    "decode_task",
    "encode_task",
]
