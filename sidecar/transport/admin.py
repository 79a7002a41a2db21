"""Kafka admin lookups shared by the commands and the stages: partitions and committed offsets."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Final

from aiokafka import TopicPartition
from aiokafka import errors as kafka_errors
from aiokafka.admin import AIOKafkaAdminClient

from sidecar.transport.kafka_errors import translate_kafka_error, translate_kafka_errors

logger = logging.getLogger(__name__)

# How long a lookup waits for a group coordinator that a fresh cluster is still electing.
_COORDINATOR_WAIT_S: Final = 15.0


async def group_offsets(
    admin: AIOKafkaAdminClient, group: str, tps: list[TopicPartition], where: str
) -> dict[TopicPartition, Any]:
    """The group's committed offsets, retried while the group coordinator is not ready.

    A cluster where no group has ever committed creates ``__consumer_offsets`` on the first
    lookup and answers "coordinator not available" until it is ready, for a few seconds.
    """
    deadline = time.monotonic() + _COORDINATOR_WAIT_S
    while True:
        try:
            answer: dict[TopicPartition, Any] = await admin.list_consumer_group_offsets(
                group, partitions=tps
            )
            return answer
        except kafka_errors.KafkaError as exc:
            if not exc.retriable or time.monotonic() >= deadline:
                raise translate_kafka_error(
                    exc, f"read the offsets of group {group}", where
                ) from exc
            logger.debug("group coordinator for %s not ready (%r); retrying", group, exc)
            await asyncio.sleep(0.25)


async def topic_partitions(admin: AIOKafkaAdminClient, where: str) -> dict[str, list[int]]:
    """Every topic's partition numbers, from metadata for all topics.

    Asking for all topics, rather than naming some, is what keeps a broker with
    ``auto.create.topics.enable`` from creating the ones that are missing.
    """
    with translate_kafka_errors("read topic metadata", where):
        described = await admin.describe_topics()
    return {
        str(topic["topic"]): sorted(int(p["partition"]) for p in topic["partitions"])
        for topic in described
        if topic["error_code"] == 0
    }
