"""`diffs` reads verdicts back exactly once each; `status` reports both sides without touching them.

Against the session's real Valkey and Kafka. The verdicts topic and the counts hash are shared
by the whole session, so these tests read their own topics or filter on their own task types,
and compare counts with what they were before.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from typing import Any

import pytest
import valkey.asyncio as avalkey
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from sidecar.cli.diffs import render_diff, render_diffs
from sidecar.cli.status import RAGFLOW_GROUP, collect_status, render_status
from sidecar.config import Settings
from sidecar.errors import ConfigError, MessageQueueError, ServiceUnavailableError
from sidecar.transport.topics import (
    DLQ_TOPIC,
    PARSE_TOPIC,
    TASK_TOPICS,
    TOPIC_PLAN,
    VERDICTS_TOPIC,
    init_topics,
)
from sidecar.verdicts.model import VERDICT_COUNTS_KEY, VerdictRecord
from sidecar.verdicts.reader import VerdictReadStats, parse_since, read_verdicts
from tests.conftest import free_port
from tests.mirror_support import group_state

BASE_MS = 1_700_000_000_000
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def verdict(entry: str, kind: Any, task_type: str, at_ms: int, **extra: Any) -> VerdictRecord:
    return VerdictRecord(
        verdict=kind,
        stream="te.0.common",
        entry_id=entry,
        task_id=f"task-{entry}",
        task_type=task_type,
        decided_at_ms=at_ms,
        sidecar="test",
        **extra,
    )


async def produce(
    settings: Settings,
    topic: str,
    records: list[tuple[bytes | None, bytes | None]],
    partition: int | None = None,
) -> None:
    producer = AIOKafkaProducer(**settings.kafka.client_kwargs(), acks="all")
    await producer.start()
    try:
        for key, value in records:
            await producer.send_and_wait(topic, value, key=key, partition=partition)
    finally:
        await producer.stop()


async def group_names(settings: Settings) -> set[str]:
    admin = AIOKafkaAdminClient(**settings.kafka.client_kwargs())
    await admin.start()
    try:
        return {str(group[0]) for group in await admin.list_consumer_groups()}
    finally:
        await admin.close()


async def visible(settings: Settings, topic: str) -> None:
    """Wait until the broker's metadata shows a topic just created (it can trail the create)."""
    admin = AIOKafkaAdminClient(**settings.kafka.client_kwargs())
    await admin.start()
    try:
        for _ in range(100):
            if topic in await admin.list_topics():
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"{topic} never showed up")
    finally:
        await admin.close()


def ids(records: list[dict[str, Any]]) -> list[str]:
    return [str(r["entry_id"]) + ("/dup" if r["verdict"] == "duplicate" else "") for r in records]


async def test_read_verdicts_dedups_skips_junk_and_filters(
    settings: Settings, make_topic: Any
) -> None:
    topic = await make_topic(4)
    match = verdict("1-0", "match", "parse", BASE_MS)
    duplicate = verdict("1-0", "duplicate", "parse", BASE_MS + 30_000, deliveries=2)
    mismatch = verdict(
        "2-0",
        "mismatch",
        "parse",
        BASE_MS + 60_000,
        differences=[{"path": "name", "kind": "value_changed", "left": "a", "right": "b"}],
        differences_total=1,
    )
    error = verdict("3-0", "error", "graphrag", BASE_MS + 120_000, error="handler crashed")
    missing = verdict("4-0", "missing_in_kafka", "dataflow", BASE_MS + 180_000)
    # Same entry, same kind of verdict published again later: the first one counts.
    republished = verdict("2-0", "mismatch", "memory", BASE_MS + 900_000)
    assert republished.verdict_id == mismatch.verdict_id
    records: list[tuple[bytes | None, bytes | None]] = [
        (v.task_id.encode(), v.to_json())
        for v in (match, mismatch, error, duplicate, missing, republished)
    ]
    records += [(b"junk", b"not json"), (b"junk", b'{"hello": 1}'), (b"junk", None)]
    await produce(settings, topic, records)
    groups_before = await group_names(settings)

    async def read(**filters: Any) -> list[dict[str, Any]]:
        options: dict[str, Any] = {"since_ms": None, "verdicts": None, "task_types": None}
        options.update(filters)
        return await read_verdicts(settings.kafka, topic=topic, **options)

    stats = VerdictReadStats()
    started = time.monotonic()
    # A long idle timeout: returning quickly shows the read stops at the end offsets.
    everything = await read_verdicts(
        settings.kafka,
        since_ms=None,
        verdicts=None,
        task_types=None,
        topic=topic,
        idle_timeout_ms=60_000,
        stats=stats,
    )
    assert time.monotonic() - started < 20
    assert ids(everything) == ["1-0", "1-0/dup", "2-0", "3-0", "4-0"]
    assert everything[2] == mismatch.to_dict()  # the first of the two, whole
    assert (stats.records, stats.not_verdicts, stats.duplicates) == (9, 3, 1)
    assert stats.complete

    assert ids(await read(since_ms=BASE_MS + 60_000)) == ["2-0", "3-0", "4-0"]
    assert ids(await read(since_ms=BASE_MS + 60_001)) == ["3-0", "4-0"]
    assert ids(await read(verdicts={"mismatch", "error"})) == ["2-0", "3-0"]
    assert ids(await read(verdicts={"duplicate"})) == ["1-0/dup"]
    assert ids(await read(task_types={"graphrag", "dataflow"})) == ["3-0", "4-0"]
    assert ids(await read(task_types={"memory"})) == []  # only the dropped duplicate had it
    combined = await read(
        since_ms=BASE_MS + 100_000, verdicts={"error", "match"}, task_types={"graphrag", "parse"}
    )
    assert ids(combined) == ["3-0"]
    # Reading used no consumer group, so nothing was created or moved.
    assert await group_names(settings) == groups_before


async def test_read_verdicts_on_an_empty_topic_returns_at_once(
    settings: Settings, make_topic: Any
) -> None:
    topic = await make_topic(2)
    await visible(settings, topic)
    started = time.monotonic()
    options: dict[str, Any] = {"since_ms": None, "verdicts": None, "task_types": None}
    assert await read_verdicts(settings.kafka, topic=topic, idle_timeout_ms=60_000, **options) == []
    assert time.monotonic() - started < 20


async def test_read_verdicts_errors(settings: Settings, unique: str) -> None:
    options: dict[str, Any] = {"since_ms": None, "task_types": None}
    with pytest.raises(ConfigError, match=r"--verdict: unknown verdict mismatches"):
        await read_verdicts(settings.kafka, verdicts={"mismatches"}, **options)
    with pytest.raises(MessageQueueError, match=rf"topic test\.{unique} does not exist"):
        await read_verdicts(settings.kafka, verdicts=None, topic=f"test.{unique}", **options)
    nowhere = Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}"})
    with pytest.raises(ServiceUnavailableError, match="cannot reach Kafka"):
        await read_verdicts(nowhere.kafka, verdicts=None, **options)


async def test_read_verdicts_from_the_shared_verdicts_topic(
    settings: Settings, unique: str
) -> None:
    await init_topics(settings.kafka)
    first = verdict(f"{unique}-1", "match", unique, BASE_MS)
    second = verdict(f"{unique}-2", "mismatch", unique, BASE_MS + 1)
    other = verdict(f"{unique}-3", "match", f"{unique}-other", BASE_MS + 2)
    await produce(
        settings,
        VERDICTS_TOPIC,
        [(v.task_id.encode(), v.to_json()) for v in (first, second, other)],
    )
    found = await read_verdicts(settings.kafka, since_ms=None, verdicts=None, task_types={unique})
    assert found == [first.to_dict(), second.to_dict()]


def mismatch_record() -> dict[str, Any]:
    long_left = "L" * 400
    long_right = "R" * 400
    return verdict(
        "1700000000000-7",
        "mismatch",
        "parse",
        BASE_MS,
        topic=PARSE_TOPIC,
        partition=3,
        offset=42,
        differences=[
            {
                "path": "parser_config.chunk_token_num",
                "kind": "value_changed",
                "left": 128,
                "right": 256,
            },
            {"path": "priority", "kind": "type_changed", "left": "1", "right": 1},
            {"path": "extra", "kind": "added", "left": None, "right": "only-kafka"},
            {"path": "content", "kind": "value_changed", "left": long_left, "right": long_right},
            {"path": "name", "kind": "value_changed", "left": "a\x1b[2Jb\nc", "right": "abc"},
        ],
        differences_total=9,
    ).to_dict()


def test_render_diff_shows_each_changed_field_side_by_side() -> None:
    record = mismatch_record()
    plain = render_diff(record, color=False, width=100)
    lines = plain.splitlines()
    assert "\x1b" not in plain
    assert all(len(line) <= 100 for line in lines), [len(line) for line in lines]
    # The header is packed onto as many lines as the width needs, never cut short.
    heading = next(i for i, line in enumerate(lines) if "redis run" in line)
    header = " ".join(lines[:heading])
    for part in ("MISMATCH", "parse", "task-1700000000000-7", "te.0.common 1700000000000-7"):
        assert part in header
    assert f"{PARSE_TOPIC}[3]@42" in header
    assert "kafka run" in lines[heading]
    assert lines[heading].index("redis run") < lines[heading].index("kafka run")
    assert len(render_diff(record, color=False, width=200).splitlines()) == len(lines) - 1

    def row(path: str) -> list[str]:
        line = next(line for line in lines if line.strip().startswith(path))
        return [cell.strip() for cell in line.split("│")]

    assert row("parser_config.chunk_token_num") == ["parser_config.chunk_token_num", "128", "256"]
    assert row("priority") == ["priority [type_changed]", '"1"', "1"]
    assert row("extra") == ["extra [added]", "(absent)", "only-kafka"]
    content = row("content")
    assert content[1].startswith("LLL") and content[1].endswith("…") and "R" not in content[1]
    assert content[2].startswith("RRR") and content[2].endswith("…")
    # A control character from a payload is shown escaped, never sent to the terminal.
    assert row("name")[1] == "a\\x1b[2Jb\\nc"
    assert lines[-1].strip() == "… and 4 more not kept in the verdict"

    narrow = render_diff(record, color=False, width=60)
    assert all(len(line) <= 60 for line in narrow.splitlines())
    assert "parser_config" in narrow and "128" in narrow and "256" in narrow


def test_render_diff_names_the_verdicts_trace() -> None:
    """The trace id recorded with the verdict is printed with it, whole, for Jaeger."""
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    record = {**mismatch_record(), "trace_id": trace_id}
    for width in (60, 100):
        assert f"trace {trace_id}" in render_diff(record, color=False, width=width)
    missing = {**record, "verdict": "missing_in_kafka"}
    assert render_diff(missing, color=False).endswith(f"trace {trace_id}")
    assert "trace" not in render_diff(mismatch_record(), color=False).split("redis run")[0]


def test_render_diff_colors_only_when_asked() -> None:
    record = mismatch_record()
    plain = render_diff(record, color=False)
    colored = render_diff(record, color=True)
    assert "\x1b[1m" in colored.splitlines()[0]  # bold header
    assert "\x1b[31m128" in colored and "\x1b[32m256" in colored  # red Redis, green Kafka
    assert ANSI.sub("", colored) == plain


def test_render_other_verdicts_as_one_line() -> None:
    match = verdict("5-0", "match", "parse", BASE_MS, topic=PARSE_TOPIC, partition=0, offset=1)
    error = verdict("6-0", "error", "graphrag", BASE_MS, error="handler crashed: KeyError 'doc'")
    missing = verdict("7-0", "missing_in_kafka", "parse", BASE_MS)
    for record in (match, error, missing):
        text = render_diff(record.to_dict(), color=False)
        assert "\n" not in text and record.verdict.upper() in text and record.task_id in text
    assert "handler crashed: KeyError 'doc'" in render_diff(error.to_dict(), color=False)
    assert "kafka -" in render_diff(missing.to_dict(), color=False)

    text = render_diffs([match.to_dict(), mismatch_record(), error.to_dict()], color=False)
    assert text.splitlines()[-1] == "3 verdicts: 1 match, 1 mismatch, 1 error"
    assert "\x1b" not in text
    assert render_diffs([], color=True) == "0 verdicts"


NOW_MS = 1_714_564_800_000  # 2024-05-01T12:00:00Z


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30s", NOW_MS - 30_000),
        ("10m", NOW_MS - 600_000),
        ("2h", NOW_MS - 7_200_000),
        ("1d", NOW_MS - 86_400_000),
        (" 10M ", NOW_MS - 600_000),
        ("0m", NOW_MS),
        ("2024-05-01T12:00:00Z", NOW_MS),
        ("2024-05-01T14:00:00+02:00", NOW_MS),
        ("2024-05-01T12:00:00", NOW_MS),  # no zone: UTC
        ("2024-05-01", NOW_MS - 12 * 3_600_000),
        ("1700000000000", 1_700_000_000_000),
    ],
)
def test_parse_since(text: str, expected: int) -> None:
    assert parse_since(text, NOW_MS) == expected


@pytest.mark.parametrize(
    "text", ["", "ten minutes", "10x", "-5m", "5 m ago", "2024-13-01", "1.5h", "²", "٣m"]
)
def test_parse_since_rejects(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_since(text, NOW_MS)
    assert caught.value.variable == "--since"
    assert "30s" in caught.value.problem


def cells(output: str, first: str) -> list[str]:
    """The cells of the table row that starts with ``first`` (cells are 2+ spaces apart)."""
    line = next(line for line in output.splitlines() if line.startswith(first + " "))
    return re.split(r"\s{2,}", line.strip())


async def task_end_offsets(settings: Settings) -> dict[TopicPartition, int]:
    consumer = AIOKafkaConsumer(**settings.kafka.client_kwargs(), group_id=None)
    await consumer.start()
    try:
        tps = [TopicPartition(t, p) for t in TASK_TOPICS for p in range(TOPIC_PLAN[t])]
        return dict(await consumer.end_offsets(tps))
    finally:
        await consumer.stop()


async def commit(settings: Settings, group: str, offsets: dict[TopicPartition, int]) -> None:
    """Commit as a member of ``group`` would, with a real consumer."""
    consumer = AIOKafkaConsumer(
        **settings.kafka.client_kwargs(), group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        consumer.assign(list(offsets))
        await consumer.commit(offsets)
    finally:
        await consumer.stop()


async def test_status_reports_streams_groups_topics_and_counts(
    settings: Settings, valkey_client: avalkey.Valkey, unique: str
) -> None:
    await init_topics(settings.kafka)
    user, secret = f"{unique}-user", f"pw-{uuid.uuid4().hex}"
    await valkey_client.execute_command("ACL", "SETUSER", user, "on", f">{secret}", "~*", "+@all")
    try:
        await check_status(settings, valkey_client, unique, user, secret)
    finally:
        await valkey_client.execute_command("ACL", "DELUSER", user)


async def check_status(
    settings: Settings, valkey_client: avalkey.Valkey, unique: str, user: str, secret: str
) -> None:
    busy, idle, absent, wrong = (f"{unique}.{name}" for name in ("busy", "idle", "absent", "str"))
    mirror_group, shadow_group = f"{unique}-mirror", f"{unique}-shadow"
    missing_topic = f"test.missing.{unique}"
    ours = Settings.from_env(
        {
            "REDIS_URL": f"redis://{user}:{secret}@127.0.0.1:{settings.redis.port}/1",
            "KAFKA_BOOTSTRAP_SERVERS": ",".join(settings.kafka.bootstrap_servers),
            "MIRROR_STREAMS": ",".join([busy, idle, absent, wrong]),
            "MIRROR_GROUP": mirror_group,
            "SHADOW_GROUP": shadow_group,
            "KAFKA_TRAFFIC_PERCENT": "25",
        }
    )
    # busy: 5 entries; RAGFlow read 2 and acked 1; the mirror read 1.
    entries = [await valkey_client.xadd(busy, {"message": b"{}"}) for _ in range(5)]
    await valkey_client.xgroup_create(busy, RAGFLOW_GROUP, id="0")
    read = await valkey_client.xreadgroup(RAGFLOW_GROUP, "task_executor_0", {busy: ">"}, count=2)
    assert len(read[0][1]) == 2
    await valkey_client.xack(busy, RAGFLOW_GROUP, entries[0])
    await valkey_client.xgroup_create(busy, mirror_group, id="0")
    await valkey_client.xreadgroup(mirror_group, "mirror-0", {busy: ">"}, count=1)
    # idle: 3 entries and no groups at all; wrong: a key that is not a stream.
    for _ in range(3):
        await valkey_client.xadd(idle, {"message": b"{}"})
    await valkey_client.set(wrong, b"x")
    ragflow_before = await group_state(valkey_client, busy, RAGFLOW_GROUP)

    # Kafka: 5 new records in one partition of the parse topic, the shadow group 2 past
    # where it was and at the end everywhere else.
    before = await collect_status(ours)
    ends = await task_end_offsets(settings)
    first = TopicPartition(PARSE_TOPIC, 0)
    await produce(settings, PARSE_TOPIC, [(b"k", b"{}")] * 5, partition=0)
    await commit(settings, shadow_group, {**ends, first: ends[first] + 2})
    await produce(settings, DLQ_TOPIC, [(b"k", b"{}")] * 2)
    counts_before = {
        k.decode(): int(v) for k, v in (await valkey_client.hgetall(VERDICT_COUNTS_KEY)).items()
    }
    await valkey_client.hincrby(VERDICT_COUNTS_KEY, "mismatch", 2)
    await valkey_client.hincrby(VERDICT_COUNTS_KEY, "error", 1)

    report = await collect_status(ours, task_topics=(*TASK_TOPICS, missing_topic))

    assert await group_state(valkey_client, busy, RAGFLOW_GROUP) == ragflow_before
    streams = {s.stream: s for s in report.streams}
    assert (streams[busy].exists, streams[busy].length) == (True, 5)
    assert (streams[busy].mirror_lag, streams[busy].ragflow_lag) == (4, 3)
    assert streams[busy].ragflow_pending == 1
    assert (streams[idle].exists, streams[idle].length, streams[idle].mirror_lag) == (True, 3, None)
    assert (streams[idle].ragflow_lag, streams[idle].ragflow_pending) == (None, None)
    assert not streams[absent].exists and streams[absent].length is None
    assert streams[wrong].key_type == "string"

    topics = {t.topic: t for t in report.topics}
    assert list(topics) == [*TASK_TOPICS, missing_topic]
    parse = topics[PARSE_TOPIC]
    parse_ends = sum(offset for tp, offset in ends.items() if tp.topic == PARSE_TOPIC)
    assert parse.partitions == TOPIC_PLAN[PARSE_TOPIC]
    assert (parse.end_offsets, parse.committed, parse.lag) == (parse_ends + 5, parse_ends + 2, 3)
    for name in TASK_TOPICS:
        assert topics[name].exists and topics[name].committed_partitions == TOPIC_PLAN[name]
        if name != PARSE_TOPIC:
            assert topics[name].lag == 0
    assert not topics[missing_topic].exists and topics[missing_topic].lag is None

    assert report.traffic_percent == 25.0
    assert before.dlq_records is not None and report.dlq_records == before.dlq_records + 2
    for name, count in report.verdict_counts.items():
        added = {"mismatch": 2, "error": 1}.get(name, 0)
        assert count == counts_before.get(name, 0) + added, name
    assert {"match", "mismatch", "missing_in_kafka", "duplicate", "error"} <= set(
        report.verdict_counts
    )

    output = render_status(report)
    assert secret not in output and secret not in repr(report)
    assert f"redis://{user}:***@127.0.0.1:{settings.redis.port}/1" in output
    assert cells(output, busy) == [busy, "yes", "5", "4", "3", "1"]
    assert cells(output, idle) == [idle, "yes", "3", "no group", "no group", "no group"]
    assert cells(output, absent) == [absent, "no", "-", "-", "-", "-"]
    assert cells(output, wrong) == [wrong, "string", "-", "-", "-", "-"]
    assert cells(output, PARSE_TOPIC) == [
        PARSE_TOPIC,
        str(TOPIC_PLAN[PARSE_TOPIC]),
        str(parse_ends + 5),
        str(parse_ends + 2),
        "3",
    ]
    assert cells(output, missing_topic) == [missing_topic, "missing", "-", "-", "-"]
    assert "25% of tasks" in output
    assert re.search(rf"{DLQ_TOPIC}: {report.dlq_records} records?$", output, re.M)

    # A group that never committed: nothing committed, all it could read is lag.
    fresh = await collect_status(
        Settings.from_env(
            {
                "REDIS_URL": settings.redis.display_url,
                "KAFKA_BOOTSTRAP_SERVERS": ",".join(settings.kafka.bootstrap_servers),
                "MIRROR_STREAMS": absent,
                "SHADOW_GROUP": f"{unique}-never",
            }
        )
    )
    parse_fresh = next(t for t in fresh.topics if t.topic == PARSE_TOPIC)
    assert parse_fresh.committed is None and parse_fresh.committed_partitions == 0
    assert parse_fresh.lag == parse_fresh.end_offsets  # nothing was deleted in the test topic
    assert cells(render_status(fresh), PARSE_TOPIC)[3] == "none"


async def test_status_names_a_service_it_cannot_reach(settings: Settings) -> None:
    secret = f"pw-{uuid.uuid4().hex}"
    nowhere = Settings.from_env(
        {
            "REDIS_URL": f"redis://user:{secret}@127.0.0.1:{free_port()}/1",
            "KAFKA_BOOTSTRAP_SERVERS": ",".join(settings.kafka.bootstrap_servers),
        }
    )
    with pytest.raises(ServiceUnavailableError, match="cannot reach Valkey") as caught:
        await collect_status(nowhere)
    assert secret not in str(caught.value)

    no_kafka = Settings.from_env(
        {
            "REDIS_URL": settings.redis.display_url,
            "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",
            "KAFKA_REQUEST_TIMEOUT_MS": "2000",
        }
    )
    with pytest.raises(ServiceUnavailableError, match="cannot reach Kafka"):
        await collect_status(no_kafka)
