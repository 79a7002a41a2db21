"""A Kafka broker killed with -9 and restarted on the same data loses no acknowledged record."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from sidecar.errors import SidecarError
from sidecar.local_stack import LocalKafka
from sidecar.mq import KafkaConsumer, KafkaProducer, OutgoingMessage
from sidecar.settings import Settings

pytestmark = pytest.mark.faults


async def test_kill_9_and_restart_keeps_every_acknowledged_record(own_broker: LocalKafka) -> None:
    settings = Settings.from_env(
        {"KAFKA_BOOTSTRAP_SERVERS": own_broker.bootstrap_servers, "KAFKA_LINGER_MS": "1"}
    )
    topic = "restart.test"
    admin = AIOKafkaAdminClient(**settings.kafka.client_kwargs())
    await admin.start()
    await admin.create_topics([NewTopic(topic, 3, 1)])
    await admin.close()

    acknowledged: set[str] = set()
    async with KafkaProducer(settings.kafka) as producer:
        for batch in range(10):
            outcomes = await producer.send_many(
                [
                    OutgoingMessage(topic, {"id": f"{batch}-{n}"}, key=f"doc{n % 7}")
                    for n in range(100)
                ]
            )
            assert not [o for o in outcomes if isinstance(o, SidecarError)]
            acknowledged.update(f"{batch}-{n}" for n in range(100))

    pid_before = own_broker.process.pid()
    await asyncio.to_thread(own_broker.kill)
    assert own_broker.process.pid() is None
    await asyncio.to_thread(own_broker.start)
    assert own_broker.process.pid() not in (None, pid_before)

    seen: list[str] = []
    async with KafkaConsumer(settings.kafka, [topic], "restart-check") as consumer:
        for _ in range(120):
            seen += [m.payload["id"] for m in await consumer.poll_batch(500, 500)]
            if len(seen) >= len(acknowledged):
                break
    assert set(seen) == acknowledged
    assert len(seen) == len(acknowledged)  # and nothing twice
