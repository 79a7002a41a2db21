"""The message-queue layer: one interface over Redis Streams and Kafka."""

from sidecar.mq.base import (
    MessageQueueConsumer,
    MessageQueueProducer,
    OutgoingMessage,
    SendResult,
)
from sidecar.mq.factory import create_consumer, create_producer
from sidecar.mq.kafka import KafkaConsumer, KafkaProducer
from sidecar.mq.message import QueueMessage, decode_task, encode_task
from sidecar.mq.redis_streams import RedisStreamConsumer, RedisStreamProducer

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
