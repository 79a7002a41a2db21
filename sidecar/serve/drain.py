"""``ragflow-sidecar drain-to-redis``: put every served record not yet executed back on the
Redis stream it names, so that Kafka can be removed (or the served share rolled back) with
nothing lost.

Run it with RAGFlow's executors stopped. It refuses while the executor group has members,
joins that group alone, and reads each task topic up to the end offsets sampled once it holds
every partition. Records of one partition are taken strictly in offset order, one at a time:

- a served record: one Lua script sets its drained key (no TTL) and XADDs the value, byte for
  byte, as the entry's ``message`` field, the XADD only if the key was new. Only then is the
  offset acked, and committed after it. A crash anywhere in between is harmless: a re-run
  finds the key and counts the record as already moved instead of moving it twice. A queue
  that is not one of ``MIRROR_STREAMS`` goes to the last of them, as the executors serve it.
- a served record whose task already ran (its done marker is in the state store: finished
  by an executor while an earlier record sat uncommitted behind a running task, or a record
  that landed after ``queue_product`` had given the task to Redis): committed past. A task
  moved is marked done (``redis``), so no other record of it runs from Kafka later.
- a record without ``x-served`` (the mirror's copy of a stream entry): committed past.
- a served record with no value, or no usable ``x-ragflow-queue``: to the DLQ with its bytes
  and the reason, then committed past.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from valkey.commands.core import AsyncScript

from sidecar.config import Settings
from sidecar.config.routing import RouteTable
from sidecar.errors import MessageQueueError, SidecarError
from sidecar.transport.admin import topic_partitions
from sidecar.transport.dead_letter import dead_letter
from sidecar.transport.kafka import (
    KafkaConsumer,
    KafkaProducer,
    kafka_where,
    translate_kafka_errors,
)
from sidecar.transport.message import QueueMessage
from sidecar.transport.redis_streams import MESSAGE_FIELD
from sidecar.transport.served import is_served, served_queue, target_stream
from sidecar.transport.topics import DLQ_TOPIC
from sidecar.transport.valkey_client import create_client, translate_valkey_errors
from sidecar.wire.contract import REDIS_MARKER, Keys

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 600.0
MAX_DLQ_BYTES = 1_048_576
BATCH = 500
POLL_MS = 200
# Acked records are committed at this pace rather than one commit per record: a commit that
# comes late only means a re-run meets the drained key and skips the record.
COMMIT_INTERVAL_MS = 200

# KEYS[1]: the record's drained key; KEYS[2]: the stream. ARGV[1]: the record's value.
# GET, XADD, SET in that order: a failing XADD (wrong type, out of memory) then leaves no key
# behind, and a key left behind without its entry would make every re-run skip the record.
# In one script the three are atomic: no run sees the key without the entry or the reverse.
DRAIN_SCRIPT = f"""
local prior = redis.call('GET', KEYS[1])
if prior then
  return {{0, prior}}
end
local id = redis.call('XADD', KEYS[2], '*', '{MESSAGE_FIELD.decode()}', ARGV[1])
redis.call('SET', KEYS[1], id)
return {{1, id}}
"""


class DrainRefused(SidecarError):
    """Someone else is (or came) in the executor group: moving records now could have one
    task run twice, from Kafka by them and from Redis after the move."""


@dataclass
class DrainReport:
    """What one run did; ``complete`` when every partition was read to its sampled end."""

    group: str
    topics: list[str] = field(default_factory=list)
    absent_topics: list[str] = field(default_factory=list)
    moved: Counter[str] = field(default_factory=Counter)  # stream -> records moved now
    already_moved: int = 0  # served records an earlier run moved (its commit was lost)
    already_done: int = 0  # served records whose task ran already (its done marker is set)
    skipped_mirror: int = 0  # records without x-served: the mirror's copies of entries
    dead_lettered: Counter[str] = field(default_factory=Counter)  # reason -> records
    complete: bool = True
    short_partitions: list[str] = field(default_factory=list)  # "topic[partition]"

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.complete,
            "group": self.group,
            "topics": self.topics,
            "absent_topics": self.absent_topics,
            "moved": dict(self.moved),
            "moved_total": sum(self.moved.values()),
            "already_moved": self.already_moved,
            "already_done": self.already_done,
            "skipped_mirror": self.skipped_mirror,
            "dead_lettered": dict(self.dead_lettered),
            "complete": self.complete,
            "short_partitions": self.short_partitions,
        }


async def drain_to_redis(
    settings: Settings, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> DrainReport:
    """Move every served record the executor group has not committed back to its stream.

    Raises :class:`DrainRefused` while the group has members, or if one joins meanwhile.
    Past ``timeout_s`` (from the start) it stops, commits what it moved and reports
    ``complete=False``; running it again carries on where it stopped.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    where = kafka_where(settings.kafka)
    group = settings.kafka.consumer_group
    wanted = RouteTable(settings.mirror.routes).ordered_topics()
    report = DrainReport(group)
    admin = AIOKafkaAdminClient(**settings.kafka.client_kwargs())
    try:
        with translate_kafka_errors("connect", where):
            await admin.start()
        members = await group_members(admin, group, where)
        if members:
            raise DrainRefused(
                f"the executor group {group!r} has {len(members)} active member(s) "
                f"({', '.join(members)}): stop RAGFlow's task executors first"
            )
        existing = await topic_partitions(admin, where)
        report.topics = [topic for topic in wanted if existing.get(topic)]
        report.absent_topics = [topic for topic in wanted if not existing.get(topic)]
        if not existing.get(DLQ_TOPIC):
            logger.warning(
                "%s is absent (run init-topics): a bad served record stops the drain", DLQ_TOPIC
            )
        if not report.topics:
            return report
        partitions = {(topic, p) for topic in report.topics for p in existing[topic]}
        await _Drain(settings, report, partitions).run(admin, deadline)
    finally:
        await admin.close()
    return report


async def group_members(
    admin: AIOKafkaAdminClient, group: str, where: str, patience_s: float = 30.0
) -> list[str]:
    """``client_id@host`` of every member of ``group`` (none for an empty or unknown group)."""
    give_up = asyncio.get_running_loop().time() + patience_s
    while True:
        try:
            with translate_kafka_errors(f"describe the group {group}", where):
                responses = await admin.describe_consumer_groups([group])
            break
        except SidecarError as exc:
            # A cluster whose first group this is creates its offsets topic now, and has no
            # coordinator to name for a few seconds.
            if not exc.retriable or asyncio.get_running_loop().time() > give_up:
                raise
            await asyncio.sleep(0.5)
    members = []
    for response in responses:
        for described in response.to_object()["groups"]:
            if described["error_code"]:
                raise MessageQueueError(
                    f"Kafka at {where} cannot describe the group {group!r} "
                    f"(error {described['error_code']})"
                )
            members += [f"{m['client_id']}@{m['client_host']}" for m in described["members"]]
    return members


class _Drain:
    """One run in the executor group: the consumer, the script, the DLQ producer."""

    def __init__(
        self, settings: Settings, report: DrainReport, partitions: set[tuple[str, int]]
    ) -> None:
        self._settings = settings
        self._report = report
        self._partitions = partitions
        self._keys = Keys(settings.serve.key_prefix)
        self._streams = settings.mirror.streams
        self._where = settings.redis.display_url
        self._state: Any = None

    async def run(self, admin: AIOKafkaAdminClient, deadline: float) -> None:
        settings, report = self._settings, self._report
        client = create_client(settings.redis)
        self._state = create_client(settings.state)
        script = client.register_script(DRAIN_SCRIPT)
        consumer = KafkaConsumer(
            settings.kafka,
            report.topics,
            report.group,
            commit_interval_ms=COMMIT_INTERVAL_MS,
            # The executors' own timeout: a drain killed with -9 must not hold the group (and
            # refuse the next run) for the default two minutes.
            session_timeout_ms=settings.serve.session_timeout_ms,
        )
        dlq = KafkaProducer(settings.kafka, max_request_size=MAX_DLQ_BYTES)
        try:
            async with dlq, consumer:
                loop = asyncio.get_running_loop()
                await consumer.wait_for_assignment(max(deadline - loop.time(), 1.0))
                await self._check_alone(admin, consumer)
                ends = await consumer.end_offsets()
                start = await consumer.positions()
                logger.info(
                    "draining %d partitions of %s: %d records not yet committed",
                    len(ends),
                    ", ".join(report.topics),
                    sum(max(end - start.get(tp, end), 0) for tp, end in ends.items()),
                )
                await self._read(consumer, script, dlq, ends, deadline)
        finally:
            await client.aclose()
            await self._state.aclose()

    async def _check_alone(self, admin: AIOKafkaAdminClient, consumer: KafkaConsumer) -> None:
        """Refuse unless this run holds every partition and is the group's only member: an
        executor that joined between the first check and our join would get records too."""
        group = self._report.group
        members = await group_members(admin, group, kafka_where(self._settings.kafka))
        held = set(await consumer.positions())
        if len(members) > 1 or held != self._partitions:
            raise DrainRefused(
                f"another member joined the executor group {group!r} ({', '.join(members)}): "
                "stop RAGFlow's task executors and run drain-to-redis again"
            )

    async def _read(
        self,
        consumer: KafkaConsumer,
        script: AsyncScript,
        dlq: KafkaProducer,
        ends: dict[tuple[str, int], int],
        deadline: float,
    ) -> None:
        loop = asyncio.get_running_loop()
        while True:
            positions = await consumer.positions()
            if set(positions) != self._partitions:
                # A rebalance: someone joined. What was moved is committed on the way out.
                raise DrainRefused(
                    f"the executor group {self._report.group!r} was rebalanced during the "
                    "drain (someone joined): stop the executors and run drain-to-redis again"
                )
            # A position past the end means every record below it was handed out, and every
            # record handed out is taken before the next turn.
            short = sorted(tp for tp, end in ends.items() if positions[tp] < end)
            if not short:
                return
            left_ms = (deadline - loop.time()) * 1000
            if left_ms <= 0:
                self._report.complete = False
                self._report.short_partitions = [f"{t}[{p}]" for t, p in short]
                logger.warning(
                    "stopped at the timeout; %d partitions not read to the end", len(short)
                )
                return
            batch = await consumer.poll_batch(BATCH, int(min(POLL_MS, left_ms)) + 1)
            for message in batch:
                if message.offset >= ends[message.topic, message.partition]:
                    # Produced after the start: not ours to move; left uncommitted, so the
                    # committed offset stops at the sampled end.
                    continue
                await self._take(message, script, dlq)
                await message.ack()  # only now: the move (or dead letter) is done
            await consumer.commit_due()

    async def _take(self, message: QueueMessage, script: AsyncScript, dlq: KafkaProducer) -> None:
        report = self._report
        if not is_served(message.headers):
            report.skipped_mirror += 1
            return
        queue = served_queue(message.headers)
        if not message.value:
            reason, detail = "no_value", "a served record without a value"
        elif queue is None:
            reason, detail = "no_queue", "a served record without a usable x-ragflow-queue"
        else:
            stream = target_stream(queue, self._streams)
            if stream != queue:
                logger.warning(
                    "%s names %r, not a task stream: moved to %s", message.id, queue, stream
                )
            task_id = _task_id(message.value)
            done = self._keys.done(task_id) if task_id else None
            state_where = self._settings.state.display_url
            if done is not None:
                with translate_valkey_errors("read a done marker", state_where):
                    if await self._state.exists(done):
                        report.already_done += 1
                        return
            drained = self._keys.drained(message.topic, message.partition, message.offset)
            with translate_valkey_errors(f"move a record to {stream}", self._where):
                created, _ = await script(keys=[drained, stream], args=[message.value])
            if created:
                report.moved[stream] += 1
            else:
                report.already_moved += 1
            if done is not None:
                # After the move: a crash between the two is caught by the drained key.
                ttl_s = self._settings.serve.done_ttl_s
                with translate_valkey_errors("mark a moved task", state_where):
                    await self._state.set(done, REDIS_MARKER, ex=ttl_s)
            return
        await self._dead_letter(message, dlq, reason, detail, queue)

    async def _dead_letter(
        self,
        message: QueueMessage,
        dlq: KafkaProducer,
        reason: str,
        detail: str,
        queue: str | None,
    ) -> None:
        # Sent and acknowledged before the offset is acked: never lost, at worst sent twice
        # when a crash comes between the two.
        record = dead_letter(
            reason=reason,
            detail=detail,
            value=message.value,
            stream=queue or "",
            entry_id="",
            stage="drain",
            max_value_bytes=MAX_DLQ_BYTES,
            extra_headers=(
                *message.headers,
                ("x-source-topic", message.topic.encode()),
                ("x-source-offset", f"{message.partition}:{message.offset}".encode()),
            ),
        )
        await dlq.send(record.destination, record.value, key=record.key, headers=record.headers)
        self._report.dead_lettered[reason] += 1
        logger.warning("dead-lettered %s: %s", message.id, detail)


def _task_id(value: bytes | None) -> str | None:
    """The task's id, when the record is a JSON object with a string id."""
    try:
        task = json.loads(value or b"")
    except ValueError:
        return None
    task_id = task.get("id") if isinstance(task, dict) else None
    return task_id if isinstance(task_id, str) else None


def render_drain(report: DrainReport) -> str:
    """The summary: moved per stream, already moved, skipped mirror copies, dead-lettered."""
    lines = [f"drain-to-redis: group {report.group}, topics {', '.join(report.topics) or '(none)'}"]
    if report.absent_topics:
        lines.append(f"absent from Kafka (nothing to move): {', '.join(report.absent_topics)}")
    for stream, count in sorted(report.moved.items()):
        lines.append(f"moved to {stream}: {count}")
    lines += [
        f"moved in all: {sum(report.moved.values())}",
        f"already moved by an earlier run: {report.already_moved}",
        f"skipped (their task ran already): {report.already_done}",
        f"skipped (mirror copies, not served): {report.skipped_mirror}",
        f"dead-lettered: {sum(report.dead_lettered.values())}"
        + "".join(f", {reason} {n}" for reason, n in sorted(report.dead_lettered.items())),
    ]
    if not report.complete:
        lines.append(f"NOT COMPLETE: short of the end in {', '.join(report.short_partitions)}")
    return "\n".join(lines)


def render_drain_json(report: DrainReport) -> str:
    return json.dumps(report.to_dict(), indent=2, sort_keys=True)
