"""The mirror against real Valkey and Kafka: every entry once, in the right place, unchanged."""

from __future__ import annotations

import asyncio
import json

import pytest
import valkey.asyncio as avalkey

from sidecar.app.wiring import StandaloneMirror, running_mirror
from sidecar.config import Settings
from sidecar.config.routing import RouteTable
from sidecar.config.traffic import in_traffic_share
from sidecar.errors import ConfigError
from sidecar.transport import RedisStreamConsumer
from sidecar.transport.topics import init_topics
from tests.mirror_support import (
    RAGFLOW_GROUP,
    group_state,
    mirror_settings,
    mirror_until,
    ragflow_tasks,
    ragflow_worker,
    read_mirrored,
)

pytestmark = pytest.mark.kafka39

UGLY = [
    {"id": "u1", "doc_id": "du1", "name": "\u00fc\u6587\u6863 \ud83d\ude00", "to_page": 100000000},
    {"id": "u2", "doc_id": "du2", "text": 'tab\t"q" back\\slash \u2028', "n": 2**100},
    {"id": "u3", "doc_id": "du3", "f": 1.7976931348623157e308, "tiny": 5e-324, "neg": -0.0},
    {"id": "u4", "doc_id": "du4", "nested": [[[[[]]]], {"a": [1, {"b": None}]}], "e": {}},
]


async def test_every_entry_lands_once_in_the_right_topic_with_key_value_and_headers(
    settings: Settings, valkey_client: avalkey.Valkey, unique: str
) -> None:
    await init_topics(settings.kafka)
    high, low = f"{unique}.te.1.common", f"{unique}.te.0.common"
    tasks = ragflow_tasks(50)
    values: dict[tuple[str, bytes], bytes] = {}  # (stream, entry id) -> exact value written
    for stream, batch in ((low, tasks + UGLY), (high, tasks[:10])):
        for task in batch:
            # Written as RAGFlow does: json.dumps defaults, ensure_ascii escapes included.
            raw = json.dumps(task).encode()
            values[stream, await valkey_client.xadd(stream, {"message": raw})] = raw
    for stream in (high, low):
        await valkey_client.xgroup_create(stream, RAGFLOW_GROUP, id="0")

    # RAGFlow's worker runs side by side; leave one entry pending on it, like a task in flight.
    await ragflow_worker(valkey_client, low, handled=20)
    await valkey_client.xreadgroup(RAGFLOW_GROUP, "task_executor_x_1", {low: ">"}, count=1)
    before = {s: await group_state(valkey_client, s, RAGFLOW_GROUP) for s in (high, low)}

    s = mirror_settings(settings, [high, low])
    async with running_mirror(s) as mirror:
        await mirror_until(mirror, len(values))
        assert await mirror.lag() == {high: 0, low: 0}
    after = {s: await group_state(valkey_client, s, RAGFLOW_GROUP) for s in (high, low)}
    assert after == before  # RAGFlow's group never noticed the sidecar

    found = await read_mirrored(settings, {high, low}, len(values))
    by_id = {(m.headers["x-redis-stream"].decode(), m.headers["x-redis-id"]): m for m in found}
    assert len(found) == len(values) == len(by_id)  # each entry exactly once
    table = RouteTable()
    for (stream, entry_id), raw in values.items():
        record = by_id[stream, entry_id]
        task = json.loads(raw)
        priority = 1 if stream == high else 0
        route = table.route(task, priority)
        assert record.value == raw  # byte-identical, never re-serialised
        assert record.topic == route.topic
        assert record.key == route.key.encode()
        assert record.headers["x-task-type"] == task.get("task_type", "parse").encode()
        assert record.headers["x-task-id"] == task["id"].encode()
        assert record.headers["x-tenant-id"] == task.get("tenant_id", "").encode()
        assert record.headers["x-priority"] == str(priority).encode()
        assert record.headers["x-source"] == f"redis:{stream}".encode()
        assert record.headers["x-timestamp"] == entry_id.split(b"-")[0]
        assert record.headers["x-retry-count"] == b"0"
        assert record.headers["x-schema-version"] == b"1"
    topics = {m.topic for m in found}
    assert topics == {
        "ragflow.task.parse",
        "ragflow.task.parse.priority",
        "ragflow.task.graphrag",
        "ragflow.task.dataflow",
        "ragflow.task.memory",
    }
    # Per-key order: within a key, Kafka offsets follow each stream's entry order.
    by_key: dict[tuple[str, bytes | None, bytes], list[tuple[int, bytes]]] = {}
    for m in found:
        group = (m.topic, m.key, m.headers["x-redis-stream"])
        by_key.setdefault(group, []).append((m.offset, m.headers["x-redis-id"]))
    assert any(len(records) > 1 for records in by_key.values())
    for records in by_key.values():
        ids = [rid for _, rid in sorted(records)]
        assert ids == sorted(ids, key=lambda i: tuple(int(x) for x in i.split(b"-")))


async def test_bad_input_goes_to_the_dlq_with_its_bytes_and_the_mirror_goes_on(
    settings: Settings, valkey_client: avalkey.Valkey, unique: str
) -> None:
    await init_topics(settings.kafka)
    huge = json.dumps({"id": "big", "doc_id": "d", "blob": "x" * (2 * 1024 * 1024)}).encode()
    cases = {
        "no_message_field": {b"payload": b"\x00\xff raw"},
        "not_utf8": {b"message": b'{"id": "\xff\xfe"}'},
        "not_json": {b"message": b"{not json"},
        "not_object": {b"message": b"[1, 2, 3]"},
        "no_task_id": {b"message": b'{"doc_id": "d"}'},
        "too_large": {b"message": huge},
    }
    ids = {}
    for reason, fields in cases.items():
        ids[reason] = await valkey_client.xadd(unique, fields)
    good = await valkey_client.xadd(unique, {"message": b'{"id": "ok", "doc_id": "d"}'})

    async with running_mirror(mirror_settings(settings, [unique])) as mirror:
        await mirror_until(mirror, len(cases) + 1)
        assert sum(mirror.stats.dead_lettered.values()) == len(cases)
        assert mirror.stats.mirrored["ragflow.task.parse"] == 1
        assert await valkey_client.xpending(unique, "ragflow_kafka_mirror") == {
            "pending": 0, "min": None, "max": None, "consumers": []
        }  # fmt: skip

    found = {m.headers["x-redis-id"]: m for m in await read_mirrored(settings, {unique}, 7)}
    assert found[good].topic == "ragflow.task.parse"
    for reason, fields in cases.items():
        record = found[ids[reason]]
        assert record.topic == "ragflow.task.dlq"
        assert record.headers["x-error"] == reason.encode()
        assert record.headers["x-error-detail"]
        if reason == "no_message_field":
            assert record.value == b""
            assert record.headers["x-redis-field-payload"] == b"\x00\xff raw"
        elif reason == "too_large":
            assert record.headers["x-truncated"] == b"true"
            assert record.headers["x-original-size"] == str(len(huge)).encode()
            assert record.value and huge.startswith(record.value)
        else:
            assert record.value == fields[b"message"]
            assert record.headers["x-truncated"] == b"false"


async def test_traffic_share_mirrors_exactly_the_keys_in_the_share(
    settings: Settings, valkey_client: avalkey.Valkey, unique: str
) -> None:
    await init_topics(settings.kafka)
    tasks = [t for t in ragflow_tasks(1000) if t.get("task_type") is None]
    pipe = valkey_client.pipeline(transaction=False)
    for task in tasks:
        pipe.xadd(unique, {"message": json.dumps(task)})
    await pipe.execute()
    async with running_mirror(
        mirror_settings(settings, [unique], KAFKA_TRAFFIC_PERCENT="30")
    ) as mirror:
        await mirror_until(mirror, len(tasks))
        skipped = mirror.stats.skipped["outside_share"]
    expected = {t["id"] for t in tasks if in_traffic_share(t["doc_id"], 30)}
    found = await read_mirrored(settings, {unique}, len(expected))
    assert {m.headers["x-task-id"].decode() for m in found} == expected
    assert skipped == len(tasks) - len(expected)


async def test_entries_of_a_dead_instance_are_taken_over(
    settings: Settings, valkey_client: avalkey.Valkey, unique: str
) -> None:
    await init_topics(settings.kafka)
    for task in ragflow_tasks(30):
        await valkey_client.xadd(unique, {"message": json.dumps(task)})
    # An instance that read 30 entries and died before producing them.
    dead = RedisStreamConsumer(
        [unique], "ragflow_kafka_mirror", "dead-host-1", settings=settings.redis
    )
    await dead.start()
    assert len(await dead.poll_batch(30, 1000)) == 30
    await dead.stop()

    s = mirror_settings(settings, [unique], MIRROR_CLAIM_IDLE_MS="300", MIRROR_CONSUMER="alive")
    async with running_mirror(s) as mirror:
        await mirror_until(mirror, 30)
    found = await read_mirrored(settings, {unique}, 30)
    assert len({m.headers["x-redis-id"] for m in found}) == 30
    # Sent by the live mirror, marked as taken over: the shadow promises them no order.
    assert {m.headers["x-mirror-consumer"] for m in found} == {b"alive"}
    assert {m.headers.get("x-mirror-claimed") for m in found} == {b"1"}
    assert await valkey_client.xpending(unique, "ragflow_kafka_mirror") == {
        "pending": 0, "min": None, "max": None, "consumers": []
    }  # fmt: skip


async def test_missing_topics_fail_at_start_and_ragflow_group_is_refused(
    settings: Settings, unique: str
) -> None:
    s = mirror_settings(settings, [unique], MIRROR_ROUTES='{"parse": "no.such.topic"}')
    try:
        async with running_mirror(s):
            raise AssertionError("started without its topics")
    except ConfigError as exc:
        assert "no.such.topic" in str(exc) and "init-topics" in str(exc)
    try:
        StandaloneMirror(mirror_settings(settings, [unique], MIRROR_GROUP=RAGFLOW_GROUP))
        raise AssertionError("accepted RAGFlow's group")
    except ConfigError as exc:
        assert exc.variable == "MIRROR_GROUP"
    await asyncio.sleep(0)
