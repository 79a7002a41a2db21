"""Redis Streams backend against the real valkey-server: RAGFlow's wire format and semantics."""

from __future__ import annotations

import json
import logging
import time

import pytest
import valkey.asyncio as avalkey

from sidecar.config import Settings
from sidecar.errors import MessageDecodeError
from sidecar.transport import RedisStreamConsumer, RedisStreamProducer
from sidecar.transport.message import QueueMessage

UGLY_TASK = {
    "id": "a3f1c2d4e5f60718293a4b5c6d7e8f90",
    "doc_id": "0f1e2d3c4b5a69788796a5b4c3d2e1f0",
    "progress": 0.0,
    "from_page": 0,
    "to_page": 100000000,
    "name": 'Überprüfung 文档 "quoted" \\ back\nslash',
    "big": 2**70,
    "ratio": 1e-300,
    "nested": [[1, [2, [3]]], {"k": None}],
}


async def consumer_for(
    settings: Settings, streams: list[str], group: str, name: str = "c1", **kwargs: object
) -> RedisStreamConsumer:
    consumer = RedisStreamConsumer(streams, group, name, settings=settings.redis, **kwargs)  # type: ignore[arg-type]
    await consumer.start()
    return consumer


async def test_produce_is_ragflow_wire_format_byte_for_byte(
    settings: Settings, valkey_client: avalkey.Valkey, unique: str
) -> None:
    async with RedisStreamProducer(settings=settings.redis) as producer:
        sent = await producer.send(unique, UGLY_TASK)
    entries = await valkey_client.xrange(unique)
    assert len(entries) == 1
    entry_id, fields = entries[0]
    assert entry_id.decode() == sent.id
    assert fields == {b"message": json.dumps(UGLY_TASK).encode()}


async def test_reads_what_ragflow_writes_unchanged(
    settings: Settings, valkey_client: avalkey.Valkey, unique: str
) -> None:
    raw = json.dumps(UGLY_TASK)  # exactly what RAGFlow's queue_product XADDs
    entry_id = await valkey_client.xadd(unique, {"message": raw})
    consumer = await consumer_for(settings, [unique], f"{unique}-g")
    try:
        message = await consumer.poll(timeout_ms=2000)
    finally:
        await consumer.stop()
    assert message is not None
    assert message.id == entry_id.decode()
    assert message.value == raw.encode()
    assert message.payload == UGLY_TASK
    assert message.timestamp_ms == int(entry_id.decode().split("-")[0])
    assert message.partition == -1 and message.offset == -1


async def test_priority_stream_is_served_first(
    settings: Settings, valkey_client: avalkey.Valkey, unique: str
) -> None:
    high, low = f"{unique}.te.1", f"{unique}.te.0"
    for n in range(3):
        await valkey_client.xadd(low, {"message": json.dumps({"id": f"low{n}"})})
    for n in range(2):
        await valkey_client.xadd(high, {"message": json.dumps({"id": f"high{n}"})})
    consumer = await consumer_for(settings, [high, low], f"{unique}-g")
    order: list[str] = []
    try:
        while len(order) < 6:
            message = await consumer.poll(timeout_ms=2000)
            assert message is not None
            order.append(message.payload["id"])
            await message.ack()
            if len(order) == 1:
                # A new high-priority entry overtakes the low ones still waiting.
                await valkey_client.xadd(high, {"message": json.dumps({"id": "high-late"})})
    finally:
        await consumer.stop()
    assert order == ["high0", "high1", "high-late", "low0", "low1", "low2"]


async def pending_ids(client: avalkey.Valkey, stream: str, group: str) -> list[str]:
    rows = await client.xpending_range(stream, group, min="-", max="+", count=100)
    return [row["message_id"].decode() for row in rows]


async def test_ack_removes_from_pending_and_unacked_entries_replay_after_restart(
    settings: Settings, valkey_client: avalkey.Valkey, unique: str
) -> None:
    group = f"{unique}-g"
    ids = [
        (await valkey_client.xadd(unique, {"message": json.dumps({"id": str(n)})})).decode()
        for n in range(4)
    ]
    consumer = await consumer_for(settings, [unique], group)
    batch = await consumer.poll_batch(10, 2000)
    assert [m.id for m in batch] == ids
    await batch[0].ack()
    await batch[2].ack()
    assert await pending_ids(valkey_client, unique, group) == [ids[1], ids[3]]
    await consumer.stop()  # as if crashed: ids[1] and ids[3] were never acked

    restarted = await consumer_for(settings, [unique], group)
    try:
        replayed = await restarted.poll_batch(10, 2000)
        assert [m.id for m in replayed] == [ids[1], ids[3]]
        for message in replayed:
            await message.ack()
        assert await restarted.poll_batch(10, 100) == []
    finally:
        await restarted.stop()
    assert await pending_ids(valkey_client, unique, group) == []


async def test_nack_redelivers_after_the_delay_and_stays_pending(
    settings: Settings, valkey_client: avalkey.Valkey, unique: str
) -> None:
    group = f"{unique}-g"
    entry_id = (await valkey_client.xadd(unique, {"message": '{"id": "x"}'})).decode()
    consumer = await consumer_for(settings, [unique], group)
    try:
        first = await consumer.poll(timeout_ms=2000)
        assert first is not None
        nacked_at = time.monotonic()
        await first.nack(delay_ms=300)
        assert await pending_ids(valkey_client, unique, group) == [entry_id]
        again: QueueMessage | None = None
        while again is None:
            again = await consumer.poll(timeout_ms=1000)
        assert time.monotonic() - nacked_at >= 0.29
        assert again.id == entry_id and again.value == first.value
        rows = await valkey_client.xpending_range(unique, group, min="-", max="+", count=1)
        assert rows[0]["times_delivered"] == 2
        await again.ack()
        assert await pending_ids(valkey_client, unique, group) == []
    finally:
        await consumer.stop()


async def test_entries_in_hand_are_not_taken_over_by_their_own_consumer(
    settings: Settings, valkey_client: avalkey.Valkey, unique: str
) -> None:
    """XAUTOCLAIM takes any entry idle past ``claim_idle_ms``, the consumer's own included: a
    batch held while Kafka is away must not come back a second time (a duplicate in Kafka),
    while an idle entry of a dead consumer is still taken over."""
    group = f"{unique}-g"
    ids = [
        (await valkey_client.xadd(unique, {"message": json.dumps({"id": str(n)})})).decode()
        for n in range(6)
    ]
    consumer = await consumer_for(settings, [unique], group, claim_idle_ms=200)
    try:
        in_hand = await consumer.poll_batch(2, 2000)  # held, as a batch waiting on Kafka
        assert [m.id for m in in_hand] == ids[:2]
        dead = await consumer_for(settings, [unique], group, name="dead")
        assert [m.id for m in await dead.poll_batch(2, 2000)] == ids[2:4]
        await dead.stop()  # never acks: its entries wait for a taker
        # The held entries were delivered first, so they are idle longer than the dead
        # consumer's: any pass of XAUTOCLAIM that takes those would take these too.
        taken: list[QueueMessage] = []
        deadline = time.monotonic() + 10
        while not set(ids[2:4]) <= {m.id for m in taken}:
            assert time.monotonic() < deadline, [m.id for m in taken]
            taken += await consumer.poll_batch(10, 100)
        taken_ids = [m.id for m in taken]
        assert not set(taken_ids) & set(ids[:2]), taken_ids
        assert sorted(taken_ids) == ids[2:], taken_ids  # each once, the new ones included
        for message in in_hand + taken:
            await message.ack()
        assert await pending_ids(valkey_client, unique, group) == []
    finally:
        await consumer.stop()


async def test_existing_group_is_never_moved_or_recreated(
    settings: Settings, valkey_client: avalkey.Valkey, unique: str
) -> None:
    group = "rag_flow_svr_task_broker"
    await valkey_client.xadd(unique, {"message": '{"id": "old"}'})
    await valkey_client.xgroup_create(unique, group, id="$")
    before = await valkey_client.xinfo_groups(unique)
    consumer = await consumer_for(settings, [unique], group, group_start_id="0")
    await consumer.stop()
    after = await valkey_client.xinfo_groups(unique)
    assert after == before


async def test_missing_stream_is_quiet_and_picked_up_once_created(
    settings: Settings,
    valkey_client: avalkey.Valkey,
    unique: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="sidecar.transport.redis_streams")
    consumer = await consumer_for(settings, [unique], f"{unique}-g", missing_stream_recheck_s=0.05)
    try:
        for _ in range(5):
            assert await consumer.poll_batch(10, 50) == []
        assert not await valkey_client.exists(unique)  # the consumer never creates it
        await valkey_client.xadd(unique, {"message": '{"id": "late"}'})
        message = None
        while message is None:
            message = await consumer.poll(timeout_ms=200)
        assert message.payload == {"id": "late"}
    finally:
        await consumer.stop()
    missing_lines = [r for r in caplog.records if "does not exist yet" in r.getMessage()]
    assert len(missing_lines) == 1
    assert all(r.levelno < logging.WARNING for r in caplog.records)


async def test_entry_without_message_field_is_delivered_not_dropped(
    settings: Settings, valkey_client: avalkey.Valkey, unique: str
) -> None:
    await valkey_client.xadd(unique, {"other": b"\xff\xfe", "traceparent": "00-ab-cd-01"})
    consumer = await consumer_for(settings, [unique], f"{unique}-g")
    try:
        message = await consumer.poll(timeout_ms=2000)
    finally:
        await consumer.stop()
    assert message is not None and message.value is None
    assert message.header("other") == b"\xff\xfe"
    assert message.header("traceparent") == b"00-ab-cd-01"
    with pytest.raises(MessageDecodeError) as caught:
        _ = message.payload
    assert caught.value.reason == "no_message_field"


async def test_start_and_stop_are_idempotent(settings: Settings, unique: str) -> None:
    consumer = RedisStreamConsumer([unique], f"{unique}-g", "c", settings=settings.redis)
    await consumer.stop()
    await consumer.start()
    await consumer.start()
    assert consumer.started
    await consumer.stop()
    await consumer.stop()
    assert not consumer.started
