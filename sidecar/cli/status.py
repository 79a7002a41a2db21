"""``status``: where the mirror, RAGFlow's own consumers and the shadow stand, read-only.

The verdict counts and the memory figures come from the state store (``SIDECAR_STATE_URL``),
the streams from RAGFlow's Valkey (``REDIS_URL``); they are one server unless configured apart.

Nothing here joins a consumer group or touches RAGFlow's: RAGFlow's group is only looked at
with XINFO GROUPS (never XREADGROUP, XACK or XCLAIM), Kafka offsets are read with a consumer
that has no group, and topic metadata is fetched for all topics at once, because a request
naming a missing topic makes a broker with ``auto.create.topics.enable`` create it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import valkey.asyncio as valkey
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from sidecar.app.state_store import eviction_warnings, shares_ragflows_valkey
from sidecar.config import Settings
from sidecar.observer.observer import RAGFLOW_GROUP
from sidecar.text import as_text
from sidecar.transport.admin import group_offsets, topic_partitions
from sidecar.transport.kafka import kafka_where, translate_kafka_errors
from sidecar.transport.lag import stream_lag
from sidecar.transport.topics import DLQ_TOPIC, TASK_TOPICS
from sidecar.transport.valkey_client import create_client, translate_valkey_errors
from sidecar.transport.valkey_memory import ValkeyMemory, human_bytes, read_memory
from sidecar.verdicts.model import VERDICT_COUNTS_KEY, VERDICTS, canonical_verdict

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StreamStatus:
    """One Valkey stream: ``None`` lags/pending mean the stream or that group is absent."""

    stream: str
    exists: bool
    length: int | None
    mirror_lag: int | None
    ragflow_lag: int | None
    ragflow_pending: int | None
    key_type: str = "stream"  # what the key is when it exists but is not a stream


@dataclass(frozen=True)
class TopicStatus:
    """One task topic and the shadow group's position in it."""

    topic: str
    exists: bool
    partitions: int = 0
    end_offsets: int = 0  # sum over partitions
    committed: int | None = None  # sum of the group's committed offsets; None: no commits
    committed_partitions: int = 0
    lag: int | None = None


@dataclass(frozen=True)
class StatusReport:
    """Everything ``render_status`` shows; holds no secrets."""

    redis: str  # display URL, password masked
    kafka: str
    mirror_group: str
    shadow_group: str
    traffic_percent: float
    streams: list[StreamStatus] = field(default_factory=list)
    topics: list[TopicStatus] = field(default_factory=list)
    verdict_counts: dict[str, int] = field(default_factory=dict)
    dlq_topic: str = DLQ_TOPIC
    dlq_records: int | None = None  # None: the topic does not exist
    ragflow_group: str = RAGFLOW_GROUP
    state: str = ""  # the state store's display URL
    state_is_ragflows: bool = True  # the same Valkey server as REDIS_URL
    state_memory: ValkeyMemory | None = None
    state_warnings: list[str] = field(default_factory=list)


async def collect_status(
    settings: Settings,
    *,
    task_topics: Sequence[str] = TASK_TOPICS,
    dlq_topic: str = DLQ_TOPIC,
) -> StatusReport:
    """Read the state of both sides; raises ``SidecarError`` subclasses on client failures."""
    streams = await _streams(settings)
    counts, memory = await _state_store(settings)
    topics, dlq_records = await _kafka_side(settings, task_topics, dlq_topic)
    return StatusReport(
        redis=settings.redis.display_url,
        kafka=",".join(settings.kafka.bootstrap_servers),
        mirror_group=settings.mirror.group,
        shadow_group=settings.shadow.group,
        traffic_percent=settings.mirror.traffic_percent,
        streams=streams,
        topics=topics,
        verdict_counts=counts,
        dlq_topic=dlq_topic,
        dlq_records=dlq_records,
        state=settings.state.display_url,
        state_is_ragflows=shares_ragflows_valkey(settings),
        state_memory=memory,
        state_warnings=eviction_warnings(settings, memory),
    )


async def _streams(settings: Settings) -> list[StreamStatus]:
    where = settings.redis.display_url
    client = create_client(settings.redis)
    try:
        streams = []
        for stream in settings.mirror.streams:
            with translate_valkey_errors(f"read stream {stream} and its groups", where):
                streams.append(await _stream_status(client, stream, settings.mirror.group))
    finally:
        await client.aclose()
    return streams


async def _state_store(settings: Settings) -> tuple[dict[str, int], ValkeyMemory]:
    """The verdict counts and the memory figures of the state store."""
    where = settings.state.display_url
    client = create_client(settings.state)
    try:
        with translate_valkey_errors(f"HGETALL {VERDICT_COUNTS_KEY}", where):
            # valkey-py types hash commands as sync-or-async; on the asyncio client it awaits.
            raw: dict[Any, Any] = await cast(
                Awaitable[dict[Any, Any]], client.hgetall(VERDICT_COUNTS_KEY)
            )
        memory = await read_memory(client, where)
    finally:
        await client.aclose()
    return _counts(raw), memory


async def _stream_status(client: valkey.Valkey, stream: str, mirror_group: str) -> StreamStatus:
    key_type = as_text(await client.type(stream))
    if key_type == "none":
        return StreamStatus(stream, False, None, None, None, None)
    if key_type != "stream":
        logger.warning("key %s is a %s, not a stream", stream, key_type)
        return StreamStatus(stream, True, None, None, None, None, key_type=key_type)
    length = int(await client.xlen(stream))
    pending = None
    for info in await client.xinfo_groups(stream):
        if as_text(info.get("name")) == RAGFLOW_GROUP:
            pending = int(info.get("pending") or 0)
    ragflow_lag = await stream_lag(client, stream, RAGFLOW_GROUP) if pending is not None else None
    mirror_lag = await stream_lag(client, stream, mirror_group)
    return StreamStatus(stream, True, length, mirror_lag, ragflow_lag, pending)


def _counts(raw: dict[Any, Any]) -> dict[str, int]:
    counts: dict[str, int] = dict.fromkeys(VERDICTS, 0)
    for name, value in raw.items():
        try:
            # A count kept by the previous release under an old name adds to the new one.
            kind = canonical_verdict(as_text(name))
            counts[kind] = counts.get(kind, 0) + int(value)
        except ValueError:
            logger.warning("verdict count %s is not a number: %r", as_text(name), value)
    return counts


async def _kafka_side(
    settings: Settings, task_topics: Sequence[str], dlq_topic: str
) -> tuple[list[TopicStatus], int | None]:
    where = kafka_where(settings.kafka)
    consumer = AIOKafkaConsumer(**settings.kafka.client_kwargs(), group_id=None)
    admin = AIOKafkaAdminClient(**settings.kafka.client_kwargs())
    try:
        with translate_kafka_errors("connect", where):
            await consumer.start()
            await admin.start()
        existing = await topic_partitions(admin, where)
        partitions: dict[str, list[TopicPartition]] = {
            topic: [TopicPartition(topic, n) for n in existing[topic]]
            for topic in (*task_topics, dlq_topic)
            if existing.get(topic)
        }
        every = [tp for tps in partitions.values() for tp in tps]
        beginnings: dict[TopicPartition, int] = {}
        ends: dict[TopicPartition, int] = {}
        committed: dict[TopicPartition, int] = {}
        if every:
            with translate_kafka_errors("read offsets", where):
                beginnings = await consumer.beginning_offsets(every)
                ends = await consumer.end_offsets(every)
        task_partitions = [tp for tp in every if tp.topic in task_topics]
        if task_partitions:
            group = settings.shadow.group
            answer = await group_offsets(admin, group, task_partitions, where)
            # -1: the group has no offset there.
            committed = {tp: meta.offset for tp, meta in answer.items() if meta.offset >= 0}
    finally:
        await admin.close()
        await consumer.stop()

    topics = [
        _topic_status(topic, partitions.get(topic, []), beginnings, ends, committed)
        for topic in task_topics
    ]
    dlq_records = None
    if dlq_topic in partitions:
        dlq_records = sum(ends[tp] - beginnings[tp] for tp in partitions[dlq_topic])
    return topics, dlq_records


def _topic_status(
    topic: str,
    tps: list[TopicPartition],
    beginnings: dict[TopicPartition, int],
    ends: dict[TopicPartition, int],
    committed: dict[TopicPartition, int],
) -> TopicStatus:
    if not tps:
        return TopicStatus(topic, exists=False)
    done = [tp for tp in tps if tp in committed]
    # A partition without a commit is read from its beginning (the shadow consumer's
    # auto_offset_reset is earliest), so all it still holds is lag.
    lag = sum(max(ends[tp] - committed.get(tp, beginnings[tp]), 0) for tp in tps)
    return TopicStatus(
        topic,
        exists=True,
        partitions=len(tps),
        end_offsets=sum(ends[tp] for tp in tps),
        committed=sum(committed[tp] for tp in done) if done else None,
        committed_partitions=len(done),
        lag=lag,
    )


def render_status(report: StatusReport) -> str:
    """A plain text report: a few settings, then aligned tables for streams and topics."""
    percent = f"{report.traffic_percent:g}%"
    shared = "RAGFlow's Valkey" if report.state_is_ragflows else "a Valkey of its own"
    lines = [
        f"redis         {report.redis}",
        f"state store   {report.state} ({shared})",
        f"kafka         {report.kafka}",
        f"traffic       {percent} of tasks mirrored to Kafka",
        f"groups        mirror {report.mirror_group}, RAGFlow {report.ragflow_group} "
        f"(read-only), shadow {report.shadow_group}",
        "",
    ]
    stream_rows = [
        [
            s.stream,
            "yes"
            if s.exists and s.key_type == "stream"
            else ("no" if not s.exists else s.key_type),
            _number(s.length),
            _number(s.mirror_lag, "no group"),
            _number(s.ragflow_lag, "no group"),
            _number(s.ragflow_pending, "no group"),
        ]
        for s in report.streams
    ]
    for row in stream_rows:
        if row[1] != "yes":
            row[2:] = ["-"] * 4
    lines += _table(
        ["STREAM", "EXISTS", "LENGTH", "MIRROR LAG", "RAGFLOW LAG", "RAGFLOW PENDING"],
        stream_rows,
    )
    lines.append("")
    topic_rows = [
        [
            t.topic,
            _number(t.partitions) if t.exists else "missing",
            _number(t.end_offsets) if t.exists else "-",
            _committed(t),
            _number(t.lag) if t.exists else "-",
        ]
        for t in report.topics
    ]
    lines += _table(["TOPIC", "PARTITIONS", "END OFFSETS", "COMMITTED", "SHADOW LAG"], topic_rows)
    lines.append("")
    counts = "  ".join(f"{name} {count}" for name, count in report.verdict_counts.items())
    lines.append(f"verdicts      {counts}")
    if report.dlq_records is None:
        dlq = "missing"
    else:
        dlq = f"{report.dlq_records} record{'' if report.dlq_records == 1 else 's'}"
    lines.append(f"dead letters  {report.dlq_topic}: {dlq}")
    if report.state_memory is not None:
        lines.append(f"state memory  {_memory(report.state_memory)}")
    lines += [f"WARNING: {warning}" for warning in report.state_warnings]
    return "\n".join(lines)


def _memory(memory: ValkeyMemory) -> str:
    limit = "no limit" if not memory.maxmemory else human_bytes(memory.maxmemory)
    used = human_bytes(memory.used_memory)
    if memory.maxmemory:
        used += f" ({100 * memory.used_memory / memory.maxmemory:.0f}%)"
    return (
        f"used_memory {used}, maxmemory {limit}, maxmemory-policy {memory.policy}, "
        f"evicted_keys {memory.evicted_keys}"
    )


def _committed(topic: TopicStatus) -> str:
    if not topic.exists:
        return "-"
    if topic.committed is None:
        return "none"
    if topic.committed_partitions < topic.partitions:
        return f"{topic.committed} ({topic.committed_partitions}/{topic.partitions} partitions)"
    return str(topic.committed)


def _number(value: int | None, absent: str = "-") -> str:
    return absent if value is None else str(value)


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """Columns padded to their widest cell; the first column left-aligned, the rest right."""
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = [cell.rjust(width) for cell, width in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join([first, *rest]).rstrip()

    return [line(headers), *(line(row) for row in rows)]
