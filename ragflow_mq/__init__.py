"""The seed design's MQ layer, as RAGFlow loads it: ``install()`` moves a share of RAGFlow's
own task execution from Redis Streams to Kafka, by ``MQ_BACKEND`` and ``KAFKA_SERVE_PERCENT``.

The message model and the producer/consumer interfaces are the sidecar's (``sidecar.transport``):
one Kafka client for both, not two.
"""

from ragflow_mq.factory import create_consumer, create_producer
from ragflow_mq.install import install, uninstall
from sidecar.transport.base import MessageQueueConsumer, MessageQueueProducer, OutgoingMessage
from sidecar.transport.message import QueueMessage
from sidecar.wire.contract import QUEUE_HEADER, SERVED_HEADER, Keys

__all__ = [
    "QUEUE_HEADER",
    "SERVED_HEADER",
    "Keys",
    "MessageQueueConsumer",
    "MessageQueueProducer",
    "OutgoingMessage",
    "QueueMessage",
    "create_consumer",
    "create_producer",
    "install",
    "uninstall",
]
