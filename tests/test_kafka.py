"""Kafka backend against the real broker: bytes, keys, headers, ack/nack, contiguous commits."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from sidecar.config import Settings
from sidecar.errors import (
    MessageQueueError,
    MessageTooLargeError,
    RetriableMessageQueueError,
    ServiceUnavailableError,
)
from sidecar.transport import KafkaConsumer, KafkaProducer, OutgoingMessage, SendResult
from sidecar.transport.message import QueueMessage
from sidecar.transport.partitioner import key_partition

pytestmark = pytest.mark.kafka39

MakeTopic = Callable[[int], Awaitable[str]]


async def poll_until(consumer: KafkaConsumer, count: int) -> list[QueueMessage]:
    """Poll until ``count`` messages arrived (the group join takes a moment)."""
    got: list[QueueMessage] = []
    for _ in range(60):
        got += await consumer.poll_batch(count - len(got), 500)
        if len(got) >= count:
            return got
    raise AssertionError(f"only {len(got)} of {count} messages arrived")


async def committed_offset(settings: Settings, group: str, tp: TopicPartition) -> int:
    admin = AIOKafkaAdminClient(**settings.kafka.client_kwargs())
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group, partitions=[tp])
    finally:
        await admin.close()
    return int(offsets[tp].offset)


async def one_partition_with(
    settings: Settings, make_topic: MakeTopic, count: int
) -> tuple[str, TopicPartition]:
    """A new topic of one partition holding ``count`` records ``{"id": "<n>"}``, n from 0."""
    topic = await make_topic(1)
    async with KafkaProducer(settings.kafka) as producer:
        for n in range(count):
            await producer.send(topic, {"id": str(n)})
    return topic, TopicPartition(topic, 0)


async def test_value_key_and_headers_arrive_unchanged(
    settings: Settings, make_topic: MakeTopic, unique: str
) -> None:
    topic = await make_topic(1)
    raw = json.dumps({"id": "t1", "doc_id": "d1", "name": '文档 "q"', "n": 2**80}).encode()
    headers = [("x-task-id", b"t1"), ("x-redis-id", b"1-0"), ("x-empty", b"")]
    async with KafkaProducer(settings.kafka) as producer:
        sent = await producer.send(topic, raw, key="d1", headers=headers)
    assert (sent.partition, sent.offset) == (0, 0)
    async with KafkaConsumer(settings.kafka, [topic], unique) as consumer:
        [message] = await poll_until(consumer, 1)
    assert message.value == raw
    assert message.key == b"d1"
    assert list(message.headers) == headers
    assert message.id == f"{topic}:0:0"
    assert message.payload["n"] == 2**80


@pytest.mark.parametrize("codec", ["gzip", "lz4", "snappy", "zstd", "none"])
async def test_every_advertised_compression_type_starts_and_round_trips(
    settings: Settings, make_topic: MakeTopic, unique: str, codec: str
) -> None:
    # lz4, snappy and zstd need cramjam: without it the producer refused to start.
    kafka = replace(settings.kafka, compression_type=None if codec == "none" else codec)
    topic = await make_topic(1)
    values = [json.dumps({"id": f"t{n}", "text": "chunk " * 50}).encode() for n in range(20)]
    async with KafkaProducer(kafka) as producer:
        outcomes = await producer.send_many([OutgoingMessage(topic, v) for v in values])
    assert all(not isinstance(outcome, Exception) for outcome in outcomes), outcomes
    async with KafkaConsumer(kafka, [topic], unique) as consumer:
        got = await poll_until(consumer, len(values))
    assert [message.value for message in got] == values


async def test_same_key_keeps_order_across_a_batch(
    settings: Settings, make_topic: MakeTopic, unique: str
) -> None:
    topic = await make_topic(4)
    batch = [
        OutgoingMessage(topic, {"id": f"{doc}-{n}", "doc_id": doc}, key=doc)
        for n in range(50)
        for doc in ("a", "b", "c")
    ]
    async with KafkaProducer(settings.kafka) as producer:
        outcomes = await producer.send_many(batch)
    assert all(not isinstance(o, Exception) for o in outcomes)
    async with KafkaConsumer(settings.kafka, [topic], unique) as consumer:
        got = await poll_until(consumer, len(batch))
    for doc in ("a", "b", "c"):
        ids = [m.payload["id"] for m in got if m.payload["doc_id"] == doc]
        assert ids == [f"{doc}-{n}" for n in range(50)]
        assert len({m.partition for m in got if m.payload["doc_id"] == doc}) == 1


async def test_a_partition_chosen_by_the_caller_wins_over_the_key(
    settings: Settings, make_topic: MakeTopic
) -> None:
    """The served path deals a document's tasks across partitions: the partition it chose
    is where the record is, one record at a time and in a batch, whatever its key."""
    topic = await make_topic(4)
    async with KafkaProducer(settings.kafka) as producer:
        assert await producer.partitions(topic) == [0, 1, 2, 3]
        one = await producer.send_many([OutgoingMessage(topic, {"id": "x"}, "k", (), 3)])
        many = await producer.send_many(
            [OutgoingMessage(topic, {"id": str(n)}, "k", (), n % 4) for n in range(8)]
        )
    assert [o.partition for o in one + many] == [3, 0, 1, 2, 3, 0, 1, 2, 3]  # type: ignore[union-attr]


async def test_each_outcome_names_where_its_record_was_stored_across_many_batches(
    settings: Settings, make_topic: MakeTopic, unique: str
) -> None:
    """A call is sent as explicit batches, several per partition when they pass
    ``KAFKA_BATCH_BYTES``: each outcome's partition is Kafka's placement of its key, and its
    offset is where the consumer finds that very record."""
    topic = await make_topic(4)
    kafka = replace(settings.kafka, batch_bytes=1024)
    ids = [(f"{doc}-{n}", f"doc-{doc}") for n in range(20) for doc in range(12)]
    batch = [OutgoingMessage(topic, {"id": id_, "pad": "p" * 200}, key=key) for id_, key in ids]
    async with KafkaProducer(kafka) as producer:
        outcomes = await producer.send_many(batch)
    stored: dict[tuple[int, int], str] = {}
    for (id_, key), outcome in zip(ids, outcomes, strict=True):
        assert isinstance(outcome, SendResult), outcome
        assert outcome.partition == key_partition(key.encode(), 4)
        stored[(outcome.partition, outcome.offset)] = id_
    assert len(stored) == len(batch)
    async with KafkaConsumer(kafka, [topic], unique) as consumer:
        got = await poll_until(consumer, len(batch))
    assert {(m.partition, m.offset): m.payload["id"] for m in got} == stored


async def test_a_partition_whose_batch_is_not_taken_does_not_hold_up_the_others(
    settings: Settings, make_topic: MakeTopic, unique: str
) -> None:
    """aiokafka takes a partition's batch only once the one before it is on its way, which
    waits as long as the partition's leader does not answer. That partition's records are
    refused at the call's delivery timeout; the other partitions' records, later in the call,
    are written meanwhile."""
    topic = await make_topic(4)
    keys = [f"doc-{n}" for n in range(40)]
    stuck = key_partition(keys[0].encode(), 4)  # the call's first record's partition
    batch = [OutgoingMessage(topic, {"id": n}, key=key) for n, key in enumerate(keys)]
    waited: list[str] = []
    async with KafkaProducer(settings.kafka, request_timeout_ms=1000) as producer:
        aiokafka_producer: Any = producer._producer
        send_batch = aiokafka_producer.send_batch

        async def leader_away(builder: Any, topic: str, *, partition: int) -> Any:
            if partition != stuck:
                return await send_batch(builder, topic, partition=partition)
            try:
                await asyncio.Event().wait()  # the previous batch never drains
            except asyncio.CancelledError:
                waited.append("given up")
                raise

        aiokafka_producer.send_batch = leader_away
        outcomes = await producer.send_many(batch)
    assert waited == ["given up"]
    on_stuck = [n for n, key in enumerate(keys) if key_partition(key.encode(), 4) == stuck]
    for n, outcome in enumerate(outcomes):
        if n in on_stuck:
            assert isinstance(outcome, RetriableMessageQueueError), outcome
        else:
            assert isinstance(outcome, SendResult), outcome
    async with KafkaConsumer(settings.kafka, [topic], unique) as consumer:
        got = await poll_until(consumer, len(keys) - len(on_stuck))
    assert sorted(m.payload["id"] for m in got) == [n for n in range(40) if n not in on_stuck]


async def test_finishing_5_before_3_commits_only_up_to_3_and_restart_redelivers(
    settings: Settings, make_topic: MakeTopic, unique: str
) -> None:
    topic, tp = await one_partition_with(settings, make_topic, 6)

    async with KafkaConsumer(settings.kafka, [topic], unique) as consumer:
        first = await poll_until(consumer, 6)
        assert [m.offset for m in first] == [0, 1, 2, 3, 4, 5]
        await first[5].ack()
        assert await committed_offset(settings, unique, tp) == -1  # nothing contiguous yet
        for message in first[:3]:
            await message.ack()
        assert consumer.in_flight(topic, 0) == 2
    # Stopped with 3 and 4 unfinished: the group must resume at 3.
    assert await committed_offset(settings, unique, tp) == 3

    async with KafkaConsumer(settings.kafka, [topic], unique) as restarted:
        again = await poll_until(restarted, 3)
        assert [m.offset for m in again] == [3, 4, 5]
        for message in reversed(again):
            await message.ack()
    assert await committed_offset(settings, unique, tp) == 6


async def test_nack_redelivers_and_holds_the_commit(
    settings: Settings, make_topic: MakeTopic, unique: str
) -> None:
    topic, tp = await one_partition_with(settings, make_topic, 2)
    async with KafkaConsumer(settings.kafka, [topic], unique) as consumer:
        first, second = await poll_until(consumer, 2)
        await first.nack(delay_ms=200)
        await second.ack()
        assert await committed_offset(settings, unique, tp) == -1
        [again] = await poll_until(consumer, 1)
        assert again.offset == 0 and again.value == first.value
        await again.ack()
        assert await committed_offset(settings, unique, tp) == 2


async def test_too_large_and_unknown_topic_are_clear_errors(
    settings: Settings, make_topic: MakeTopic
) -> None:
    topic = await make_topic(1)
    async with KafkaProducer(settings.kafka, request_timeout_ms=3000) as producer:
        outcomes = await producer.send_many(
            [
                OutgoingMessage(topic, b"x" * (2 * 1024 * 1024)),
                OutgoingMessage(topic, b"fits"),
            ]
        )
        assert isinstance(outcomes[0], MessageTooLargeError)
        assert not isinstance(outcomes[1], Exception)
        with pytest.raises(MessageQueueError):
            await producer.send("no.such.topic.anywhere", b"v")


async def test_unreachable_broker_is_a_retriable_error() -> None:
    settings = Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1"})
    producer = KafkaProducer(settings.kafka)
    with pytest.raises(ServiceUnavailableError) as caught:
        await producer.start()
    assert caught.value.retriable
    assert "127.0.0.1:1" in str(caught.value)
    await producer.stop()  # stop after a failed start is harmless
