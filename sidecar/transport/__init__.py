"""The message-queue layer: one interface over Redis Streams and Kafka."""

# ragflow_mq loads this package inside RAGFlow's processes: what it does not load itself
# (coalesce, lag, served, topic_reader) is imported from its module, not exported here.
from sidecar.transport.admin import group_offsets, topic_partitions
from sidecar.transport.base import (
    MessageQueueConsumer,
    MessageQueueProducer,
    OutgoingMessage,
    SendResult,
)
from sidecar.transport.dead_letter import NAME_LIMIT, dead_letter
from sidecar.transport.factory import create_consumer, create_producer
from sidecar.transport.kafka import (
    KafkaConsumer,
    KafkaProducer,
    check_login,
    kafka_where,
    stop_consumer,
    translate_kafka_errors,
)
from sidecar.transport.message import QueueMessage, decode_task, encode_task, header_text
from sidecar.transport.options import (
    COMPRESSION_TYPES,
    RAGFLOW_REDIS_DB,
    SASL_MECHANISMS,
    SECURITY_PROTOCOLS,
    KafkaSettings,
    RedisSettings,
    Secret,
    SecurityProtocol,
)
from sidecar.transport.partitioner import murmur2
from sidecar.transport.redis_streams import MESSAGE_FIELD, RedisStreamConsumer, RedisStreamProducer
from sidecar.transport.topics import (
    DATAFLOW_TOPIC,
    DLQ_TOPIC,
    GRAPHRAG_TOPIC,
    MEMORY_TOPIC,
    PARSE_PRIORITY_TOPIC,
    PARSE_TOPIC,
    TASK_TOPICS,
    VERDICTS_TOPIC,
    init_topics,
    missing_topics,
)
from sidecar.transport.valkey_client import (
    SOCKET_TIMEOUT_S,
    create_client,
    ping,
    translate_valkey_errors,
)
from sidecar.transport.valkey_memory import (
    ValkeyMemory,
    ValkeyPersistence,
    human_bytes,
    read_memory,
    read_persistence,
)

# The interface over both queues, and its messages.
__all__ = [
    "MessageQueueConsumer",
    "MessageQueueProducer",
    "OutgoingMessage",
    "QueueMessage",
    "SendResult",
    "create_consumer",
    "create_producer",
    "decode_task",
    "encode_task",
    "header_text",
]
# Kafka.
__all__ += [
    "KafkaConsumer",
    "KafkaProducer",
    "check_login",
    "group_offsets",
    "kafka_where",
    "murmur2",
    "stop_consumer",
    "topic_partitions",
    "translate_kafka_errors",
]
# Redis Streams and Valkey.
__all__ += [
    "MESSAGE_FIELD",
    "SOCKET_TIMEOUT_S",
    "RedisStreamConsumer",
    "RedisStreamProducer",
    "ValkeyMemory",
    "ValkeyPersistence",
    "create_client",
    "human_bytes",
    "ping",
    "read_memory",
    "read_persistence",
    "translate_valkey_errors",
]
# Topics and dead letters.
__all__ += [
    "DATAFLOW_TOPIC",
    "DLQ_TOPIC",
    "GRAPHRAG_TOPIC",
    "MEMORY_TOPIC",
    "NAME_LIMIT",
    "PARSE_PRIORITY_TOPIC",
    "PARSE_TOPIC",
    "TASK_TOPICS",
    "VERDICTS_TOPIC",
    "dead_letter",
    "init_topics",
    "missing_topics",
]
# Connection options, read by config.
__all__ += [
    "COMPRESSION_TYPES",
    "RAGFLOW_REDIS_DB",
    "SASL_MECHANISMS",
    "SECURITY_PROTOCOLS",
    "KafkaSettings",
    "RedisSettings",
    "Secret",
    "SecurityProtocol",
]
