"""Reading whole topics, or their recent part, without a consumer group.

``diffs`` reads the verdicts topic and ``reconcile`` the task topics and the DLQ this way: no
group means looking never moves anyone's committed offsets, and the read stops at the end
offsets seen when it began, so it finishes even while producers keep writing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from sidecar.errors import MessageQueueError
from sidecar.transport.admin import topic_partitions
from sidecar.transport.kafka import kafka_where, stop_consumer, translate_kafka_errors
from sidecar.transport.options import KafkaSettings

logger = logging.getLogger(__name__)

# Records are found by their Kafka timestamp, which comes from another clock than the one a
# caller filters on (a verdict's decided_at_ms, a stream entry's id): the seek starts this much
# earlier.
SEEK_MARGIN_MS = 60_000
_FETCH_MS: Final = 200

OnRecord = Callable[[Any], None]


@dataclass
class TopicReadOutcome:
    """Whether every partition was read to the end offsets it had when the read began."""

    records: int = 0
    complete: bool = True  # False: stopped on idle_timeout_ms short of the end offsets
    short_partitions: list[tuple[str, int]] = field(default_factory=list)
    absent_topics: list[str] = field(default_factory=list)
    # Where each partition's read stopped: the next read of what came since starts there.
    positions: dict[TopicPartition, int] = field(default_factory=dict)


async def read_topics(
    settings: KafkaSettings,
    topics: Sequence[str],
    on_record: OnRecord,
    *,
    since_ms: int | None = None,
    idle_timeout_ms: int = 1500,
    require_all: bool = True,
    start_offsets: Mapping[TopicPartition, int] | None = None,
) -> TopicReadOutcome:
    """Hand every record of ``topics`` (from ``since_ms`` less a margin, else the beginning;
    a partition in ``start_offsets`` from there, as an earlier read's ``positions`` left it)
    up to the end offsets seen at the start to ``on_record``, partition by partition in order.

    ``idle_timeout_ms`` only guards against a broker that stops answering. A topic that does
    not exist raises, unless ``require_all`` is false (then it is listed in ``absent_topics``).
    """
    outcome = TopicReadOutcome()
    where = kafka_where(settings)
    consumer = AIOKafkaConsumer(
        **settings.client_kwargs(),
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    admin = AIOKafkaAdminClient(**settings.client_kwargs())
    try:
        with translate_kafka_errors("connect", where):
            await admin.start()
            await consumer.start()
        existing = await topic_partitions(admin, where)
        outcome.absent_topics = [topic for topic in topics if not existing.get(topic)]
        if outcome.absent_topics and require_all:
            # Kafka leaves out of the metadata what the principal may not DESCRIBE.
            hidden = " or no ACL allows DESCRIBE on it" if settings.sasl_username else ""
            raise MessageQueueError(
                f"topic {', '.join(outcome.absent_topics)} does not exist in Kafka at {where}"
                f"{hidden} (run init-topics; see docs/security.md)"
            )
        tps = [TopicPartition(t, p) for t in topics if existing.get(t) for p in existing[t]]
        if not tps:
            return outcome
        consumer.assign(tps)
        with translate_kafka_errors("read the offsets of " + ", ".join(topics), where):
            ends: dict[TopicPartition, int] = await consumer.end_offsets(tps)
            await _seek_to_start(consumer, tps, since_ms, ends, start_offsets or {})
        await _read_to_end(
            consumer,
            tps,
            ends,
            on_record,
            outcome=outcome,
            idle_timeout_ms=idle_timeout_ms,
            where=where,
        )
    finally:
        try:
            await admin.close()
        finally:
            await stop_consumer(consumer)
    return outcome


async def _seek_to_start(
    consumer: AIOKafkaConsumer,
    tps: list[TopicPartition],
    since_ms: int | None,
    ends: Mapping[TopicPartition, int],
    start_offsets: Mapping[TopicPartition, int],
) -> None:
    """From the beginning, or with ``since_ms`` from the first record produced after it
    (less a margin for clocks), so a recent window does not read the whole topic; a partition
    in ``start_offsets`` from there."""
    for tp in tps:
        if tp in start_offsets:
            consumer.seek(tp, start_offsets[tp])
    rest = [tp for tp in tps if tp not in start_offsets]
    if not rest:
        return
    if since_ms is None:
        await consumer.seek_to_beginning(*rest)
        return
    found = await consumer.offsets_for_times({tp: max(since_ms - SEEK_MARGIN_MS, 0) for tp in rest})
    for tp in rest:
        at = found.get(tp)
        consumer.seek(tp, at.offset if at is not None else ends[tp])


async def _read_to_end(
    consumer: AIOKafkaConsumer,
    tps: list[TopicPartition],
    ends: Mapping[TopicPartition, int],
    on_record: OnRecord,
    *,
    outcome: TopicReadOutcome,
    idle_timeout_ms: int,
    where: str,
) -> None:
    last_progress = time.monotonic()
    positions: dict[TopicPartition, int] = {}
    while True:
        with translate_kafka_errors("read offsets", where):
            current = {tp: await consumer.position(tp) for tp in tps}
        # Progress is the position moving, not records arriving: control batches and
        # compacted gaps move it without handing out a record.
        if current != positions:
            positions = current
            last_progress = time.monotonic()
        outcome.positions = {tp: min(positions[tp], ends[tp]) for tp in tps}
        remaining = [tp for tp in tps if positions[tp] < ends[tp]]
        if not remaining:
            return
        if (time.monotonic() - last_progress) * 1000 >= idle_timeout_ms:
            outcome.complete = False
            outcome.short_partitions = [(tp.topic, tp.partition) for tp in remaining]
            logger.warning(
                "stopped reading after %d ms without progress; partitions %s are short of "
                "the end, so what is reported is incomplete",
                idle_timeout_ms,
                ", ".join(f"{tp.topic}[{tp.partition}]" for tp in remaining),
            )
            return
        with translate_kafka_errors("fetch records", where):
            fetched = await consumer.getmany(*remaining, timeout_ms=_FETCH_MS)
        for tp, records in fetched.items():
            for record in records:
                if record.offset < ends[tp]:  # later ones arrived after the read began
                    outcome.records += 1
                    on_record(record)
