"""init-topics creates the seed plan idempotently and reports short topics, never hides them."""

from __future__ import annotations

import uuid

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from sidecar.config import Settings
from sidecar.errors import MessageQueueError
from sidecar.transport.topics import TOPIC_PLAN, init_topics

pytestmark = pytest.mark.kafka39


async def partitions_of(settings: Settings, names: list[str]) -> dict[str, int]:
    admin = AIOKafkaAdminClient(**settings.kafka.client_kwargs())
    await admin.start()
    try:
        return {t["topic"]: len(t["partitions"]) for t in await admin.describe_topics(names)}
    finally:
        await admin.close()


async def test_seed_plan_is_created_once(settings: Settings) -> None:
    first = await init_topics(settings.kafka)
    second = await init_topics(settings.kafka)
    assert sorted(first.created + first.existed) == sorted(TOPIC_PLAN)
    assert second.created == [] and sorted(second.existed) == sorted(TOPIC_PLAN)
    assert await partitions_of(settings, list(TOPIC_PLAN)) == TOPIC_PLAN
    assert TOPIC_PLAN["ragflow.task.parse"] == 8 and TOPIC_PLAN["ragflow.task.dlq"] == 2


async def test_existing_topic_with_fewer_partitions_is_reported(settings: Settings) -> None:
    name = f"test.short.{uuid.uuid4().hex[:8]}"
    await init_topics(settings.kafka, plan={name: 2})
    report = await init_topics(settings.kafka, plan={name: 8})
    assert not report.ok
    assert report.under_partitioned == [(name, 2, 8)]
    assert any("PROBLEM" in line and name in line for line in report.lines())
    assert (await partitions_of(settings, [name]))[name] == 2  # reported, never altered


async def test_replication_factor_above_the_live_brokers_is_refused(settings: Settings) -> None:
    name = f"test.rf.{uuid.uuid4().hex[:8]}"
    with pytest.raises(
        MessageQueueError, match=r"replication factor 3 is more than the 1 live broker of"
    ):
        await init_topics(settings.kafka, plan={name: 1}, replication_factor=3)
    assert (await partitions_of(settings, [name]))[name] == 0, "nothing is made"
