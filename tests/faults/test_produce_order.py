"""Per-key order through a record the producer did not take: its later records of the same key
are not written before it (a broker that stops answering, then answers again)."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest
from aiokafka import errors as kafka_errors
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from sidecar.config import Settings
from sidecar.dev.local_stack import LocalKafka
from sidecar.errors import SidecarError
from sidecar.transport import KafkaConsumer, KafkaProducer, OutgoingMessage

pytestmark = [pytest.mark.faults, pytest.mark.timeout(180)]

RECORDS = 30


async def test_a_record_send_refused_holds_back_the_later_records_of_its_key(
    own_broker: LocalKafka, unique: str
) -> None:
    """The broker is frozen (SIGSTOP) with a request in flight; the partition's next batch
    waits and aiokafka's ``send_batch()`` gives up on the one after it at the request timeout.
    The broker is thawed right then, so the queue drains and the following batch would be
    taken: records after the refused ones would be in Kafka before their retry (an ``order``
    mismatch the migration really made). They are held back and retried with them."""
    settings = Settings.from_env(
        {"KAFKA_BOOTSTRAP_SERVERS": own_broker.bootstrap_servers, "KAFKA_LINGER_MS": "1"}
    )
    topic = f"order.{unique}"
    admin = AIOKafkaAdminClient(**settings.kafka.client_kwargs())
    await admin.start()
    await admin.create_topics([NewTopic(topic, 1, 1)])
    await admin.close()
    pid = own_broker.process.pid()
    assert pid is not None
    padding = "x" * 300  # two records a batch: 15 batches of one partition, queued in turn
    records = [
        OutgoingMessage(topic, {"id": n, "padding": padding}, key="doc") for n in range(RECORDS)
    ]
    refused: list[int] = []
    # A small batch and request timeout bring aiokafka's "batch full for the request timeout"
    # refusal within a few seconds; everything is still sent to and written by the real broker.
    async with KafkaProducer(
        settings.kafka, max_batch_size=1024, request_timeout_ms=1000
    ) as producer:
        warm = await producer.send_many([OutgoingMessage(topic, {"id": -1}, key="warm")])
        assert not [o for o in warm if isinstance(o, SidecarError)]
        aiokafka_producer: Any = producer._producer
        send = aiokafka_producer.send_batch

        async def send_then_thaw(*args: Any, **kwargs: Any) -> Any:
            try:
                return await send(*args, **kwargs)
            except kafka_errors.KafkaTimeoutError:
                refused.append(len(refused))
                os.kill(pid, signal.SIGCONT)  # the batch drains while the next record waits
                raise

        aiokafka_producer.send_batch = send_then_thaw
        os.kill(pid, signal.SIGSTOP)
        try:
            outcomes = await producer.send_many(records)
        finally:
            os.kill(pid, signal.SIGCONT)
        aiokafka_producer.send_batch = send
        assert refused, "no record was refused: the fault did not happen"
        failed = [n for n, o in enumerate(outcomes) if isinstance(o, SidecarError)]
        assert failed
        # What is retried is the tail from the first record not taken, as the mirror does.
        assert failed == list(range(failed[0], RECORDS))
        again = await producer.send_many([records[n] for n in failed])
        assert not [o for o in again if isinstance(o, SidecarError)]

    ids: list[int] = []
    async with KafkaConsumer(settings.kafka, [topic], f"order-{unique}") as consumer:
        for _ in range(120):
            ids += [m.payload["id"] for m in await consumer.poll_batch(500, 500)]
            if set(range(RECORDS)) <= set(ids):
                break
    first_copies = [n for at, n in enumerate(ids) if n >= 0 and n not in ids[:at]]
    assert first_copies == list(range(RECORDS))
