"""The span attributes the sidecar's traces share (its semantic conventions).

As the OpenTelemetry Kafka instrumentations do, the messaging attributes are the names
``opentelemetry.semconv`` generates (incubating there); the rest are the sidecar's own. An
attribute only one stage writes is named beside that stage's spans (``sidecar.*.trace``).
"""

from __future__ import annotations

from typing import Final

from opentelemetry.semconv._incubating.attributes.messaging_attributes import (
    MESSAGING_BATCH_MESSAGE_COUNT,
    MESSAGING_CONSUMER_GROUP_NAME,
    MESSAGING_DESTINATION_NAME,
    MESSAGING_DESTINATION_PARTITION_ID,
    MESSAGING_KAFKA_OFFSET,
    MESSAGING_MESSAGE_ID,
    MESSAGING_OPERATION_NAME,
    MESSAGING_OPERATION_TYPE,
    MESSAGING_SYSTEM,
    MessagingSystemValues,
)

__all__ = [
    "BATCH_COUNT",
    "CONSUMER_GROUP",
    "DESTINATION",
    "KAFKA_OFFSET",
    "MESSAGE_ID",
    "OPERATION_NAME",
    "OPERATION_TYPE",
    "PARTITION",
    "SYSTEM",
    "SYSTEM_KAFKA",
    "SYSTEM_REDIS",
    "TASK_ID",
    "TASK_PATH",
    "TASK_TYPE",
    "VERDICT",
]

SYSTEM: Final = MESSAGING_SYSTEM  # messaging.system
OPERATION_NAME: Final = MESSAGING_OPERATION_NAME  # messaging.operation.name
OPERATION_TYPE: Final = MESSAGING_OPERATION_TYPE  # messaging.operation.type
DESTINATION: Final = MESSAGING_DESTINATION_NAME  # messaging.destination.name
CONSUMER_GROUP: Final = MESSAGING_CONSUMER_GROUP_NAME  # messaging.consumer.group.name
PARTITION: Final = MESSAGING_DESTINATION_PARTITION_ID  # messaging.destination.partition.id
KAFKA_OFFSET: Final = MESSAGING_KAFKA_OFFSET  # messaging.kafka.offset
MESSAGE_ID: Final = MESSAGING_MESSAGE_ID  # messaging.message.id: the Redis entry id throughout
BATCH_COUNT: Final = MESSAGING_BATCH_MESSAGE_COUNT  # messaging.batch.message_count

SYSTEM_REDIS: Final = "redis"  # not among the semconv's messaging.system values
SYSTEM_KAFKA: Final[str] = MessagingSystemValues.KAFKA.value  # "kafka"

# The sidecar's own. The sampler and the export read VERDICT; a task's ids are on every stage's
# spans.
VERDICT: Final = "verdict"
TASK_TYPE: Final = "task.type"
TASK_ID: Final = "task.id"
# Which copy of the task a span handles: "redis" (the mirror's redis run) or "kafka" (the
# shadow's kafka run), as TaskMeta.path names them.
TASK_PATH: Final = "task.path"
