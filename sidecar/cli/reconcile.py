"""``ragflow-sidecar reconcile``: account for every stream entry of a window in Kafka.

Each entry of the task streams (read with XRANGE in pages: the streams are never trimmed) is
classed the way the mirror classes it: in the traffic share, outside it, or undecodable (the
mirror dead-letters those). The task topics and the DLQ are read without a consumer group and
their records matched to entries by the ``x-redis-stream``/``x-redis-id`` headers. An entry
that should be in Kafka and is in neither its task topic nor the DLQ is missing; an entry with
more than one record is duplicated; and within each partition, a key whose entries arrive out
of stream order (first copies only: a replayed batch repeats older entries by design) is an
order violation. This is the accounting the fault tests use as their oracle.

Served records (``x-served: 1``, tasks RAGFlow executed from Kafka) name no entry: they are
counted apart, and those ``drain-to-redis`` moved back are checked against the entry they
became (``sidecar/cli/reconcile_served.py``); such an entry is drained, not missing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import valkey.asyncio as avalkey

from sidecar.cli.reconcile_render import render_json, render_report
from sidecar.cli.reconcile_report import OrderViolation, ReconcileReport, StreamReconciliation
from sidecar.cli.reconcile_served import ServedAccount, drained_entry_ids
from sidecar.config import Settings
from sidecar.config.routing import RouteTable
from sidecar.config.traffic import in_traffic_share
from sidecar.errors import ConfigError, MessageDecodeError
from sidecar.transport.message import decode_task, header_text
from sidecar.transport.redis_streams import MESSAGE_FIELD
from sidecar.transport.served import is_served
from sidecar.transport.topic_reader import read_topics
from sidecar.transport.topics import DLQ_TOPIC
from sidecar.transport.valkey_client import create_client, translate_valkey_errors
from sidecar.wire.contract import Keys

__all__ = [
    "OrderViolation",
    "ReconcileReport",
    "StreamReconciliation",
    "Window",
    "reconcile",
    "render_json",  # from reconcile_render, where the renderings live
    "render_report",
]

XRANGE_PAGE = 10_000
_MAX_SEQ = 2**64 - 1


@dataclass(frozen=True)
class Window:
    """Entry ids from ``min_id`` to ``max_id`` inclusive (XRANGE syntax)."""

    min_id: str = "-"
    max_id: str = "+"

    @classmethod
    def build(
        cls,
        *,
        since_ms: int | None = None,
        until_ms: int | None = None,
        min_id: str | None = None,
        max_id: str | None = None,
    ) -> Window:
        if since_ms is not None and min_id is not None:
            raise ConfigError("--from-id", "give --since or --from-id, not both")
        if until_ms is not None and max_id is not None:
            raise ConfigError("--to-id", "give --until or --to-id, not both")
        for option, value in (("--from-id", min_id), ("--to-id", max_id)):
            if value is not None and _id_key(value) is None:
                raise ConfigError(option, f"{value!r} is not a stream entry id (ms or ms-seq)")
        low = min_id or (f"{since_ms}-0" if since_ms is not None else "-")
        high = max_id or (f"{until_ms}-{_MAX_SEQ}" if until_ms is not None else "+")
        return cls(low, high)

    @property
    def since_ms(self) -> int | None:
        """Where Kafka is read from: records of older entries cannot be in the window."""
        key = _id_key(self.min_id)
        return key[0] if key is not None else None


async def reconcile(
    settings: Settings,
    *,
    streams: Sequence[str] | None = None,
    since_ms: int | None = None,
    until_ms: int | None = None,
    min_id: str | None = None,
    max_id: str | None = None,
    traffic_percent: float | None = None,
) -> ReconcileReport:
    """Account for the entries of ``streams`` (default ``MIRROR_STREAMS``) in the window.

    ``traffic_percent`` (default ``KAFKA_TRAFFIC_PERCENT``) decides which entries should be in
    Kafka; give the percentage in force when the window was mirrored if it has changed since.
    """
    window = Window.build(since_ms=since_ms, until_ms=until_ms, min_id=min_id, max_id=max_id)
    names = list(streams or settings.mirror.streams)
    percent = settings.mirror.traffic_percent if traffic_percent is None else traffic_percent
    if not 0 <= percent <= 100:
        raise ConfigError("--percent", f"{percent} is not between 0 and 100")
    routes = RouteTable(settings.mirror.routes)
    expected: dict[str, dict[str, bool]] = {}  # stream -> entry id -> expected in Kafka
    report = ReconcileReport(
        {name: StreamReconciliation(name) for name in names},
        {"from_id": window.min_id, "to_id": window.max_id},
        percent,
    )
    until = _id_key(window.max_id)
    report.served = ServedAccount(
        window.since_ms, until[0] if until else None, settings.mirror.streams
    )
    client = create_client(settings.redis)
    try:
        for name in names:
            priority = 1 if name in settings.mirror.priority_streams else 0
            with translate_valkey_errors(f"read {name}", settings.redis.display_url):
                expected[name] = await _classify_stream(
                    client,
                    name,
                    window,
                    into=report.streams[name],
                    routes=routes,
                    priority=priority,
                    percent=percent,
                )
    finally:
        await client.aclose()

    matcher = _KafkaMatcher(expected, report.served)
    outcome = await read_topics(
        settings.kafka,
        sorted({*routes.topics, DLQ_TOPIC}),
        matcher.take,
        since_ms=window.since_ms,
        require_all=False,
        # Right after a broker restart a leader election can stall a fetch for a while.
        idle_timeout_ms=max(settings.kafka.request_timeout_ms, 1500),
    )
    report.kafka_complete = outcome.complete
    report.kafka_records = outcome.records
    report.absent_topics = outcome.absent_topics
    client = create_client(settings.redis)
    try:
        with translate_valkey_errors("check the drained records", settings.redis.display_url):
            keys = Keys(settings.serve.key_prefix)
            await report.served.verify(client, keys)
            matcher.drained_ids = await drained_entry_ids(client, keys)
    finally:
        await client.aclose()
    for name in names:
        matcher.settle(name, expected[name], report.streams[name])
    return report


async def _classify_stream(
    client: avalkey.Valkey,
    stream: str,
    window: Window,
    *,
    into: StreamReconciliation,
    routes: RouteTable,
    priority: int,
    percent: float,
) -> dict[str, bool]:
    """Every entry id of the window, mapped to whether the mirror puts it in Kafka."""
    classes: dict[str, bool] = {}
    low = window.min_id
    while True:
        page = await client.xrange(stream, min=low, max=window.max_id, count=XRANGE_PAGE)
        for raw_id, fields in page:
            entry_id = raw_id.decode()
            into.written += 1
            verdict = _share_of((fields or {}).get(MESSAGE_FIELD), routes, priority, percent)
            if verdict is None:
                into.undecodable += 1
            elif verdict:
                into.in_share += 1
            else:
                into.outside_share += 1
            classes[entry_id] = verdict is None or verdict
        if len(page) < XRANGE_PAGE:
            return classes
        low = "(" + page[-1][0].decode()  # exclusive: the next page starts after the last id


def _share_of(
    value: bytes | None, routes: RouteTable, priority: int, percent: float
) -> bool | None:
    """Whether the mirror carries this entry's task to Kafka; ``None``: it dead-letters it."""
    try:
        task = decode_task(value)
    except MessageDecodeError:
        return None
    task_id = task.get("id")
    if not isinstance(task_id, str) or not task_id:
        return None
    route = routes.route(task, priority)
    if not in_traffic_share(route.key, percent):
        return False
    tenant = task.get("tenant_id")
    texts = (task_id, route.task_type, route.key, tenant if isinstance(tenant, str) else "")
    try:
        for text in texts:
            text.encode()
    except UnicodeEncodeError:
        return None  # a lone surrogate: the mirror dead-letters it as not_unicode
    return True


class _KafkaMatcher:
    """Counts records per entry and checks per-key order as the records stream past."""

    def __init__(self, expected: dict[str, dict[str, bool]], served: ServedAccount) -> None:
        self._expected = expected
        self._served = served
        self.drained_ids: set[str] = set()  # entries drain-to-redis wrote, set before settle
        self.task_records: dict[str, Counter[str]] = {name: Counter() for name in expected}
        self.dlq_records: dict[str, Counter[str]] = {name: Counter() for name in expected}
        # (topic, partition, stream, key) -> the newest entry id seen first there
        self._last: dict[tuple[str, int, str, bytes], tuple[int, int]] = {}
        self._last_text: dict[tuple[str, int, str, bytes], str] = {}
        self.violations: dict[str, list[OrderViolation]] = {name: [] for name in expected}

    def take(self, record: Any) -> None:
        headers = record.headers or ()
        if is_served(headers):
            # The DLQ keeps a dead-lettered served record's headers; it was not executed.
            if record.topic != DLQ_TOPIC:
                self._served.take(record)
            return
        stream = header_text(headers, "x-redis-stream")
        entry_id = header_text(headers, "x-redis-id")
        if stream is None or entry_id is None or stream not in self._expected:
            return
        if entry_id not in self._expected[stream]:
            return  # outside the window
        if record.topic == DLQ_TOPIC:
            # Only the mirror's dead letters stand for an entry; the shadow side dead-letters
            # records it could not process, whose entry is already in a task topic.
            if header_text(headers, "x-stage") == "mirror":
                self.dlq_records[stream][entry_id] += 1
            return
        seen = self.task_records[stream]
        seen[entry_id] += 1
        if seen[entry_id] == 1 and record.key is not None:
            self._check_order(record, stream, entry_id)

    def _check_order(self, record: Any, stream: str, entry_id: str) -> None:
        position = _id_key(entry_id)
        if position is None:
            return
        slot = (record.topic, record.partition, stream, record.key)
        last = self._last.get(slot)
        if last is not None and position < last:
            self.violations[stream].append(
                OrderViolation(
                    record.topic,
                    record.partition,
                    record.key.decode("utf-8", "replace"),
                    entry_id,
                    self._last_text[slot],
                )
            )
            return
        self._last[slot] = position
        self._last_text[slot] = entry_id

    def settle(self, stream: str, classes: dict[str, bool], into: StreamReconciliation) -> None:
        tasks, dead = self.task_records[stream], self.dlq_records[stream]
        for entry_id, wanted in classes.items():
            records = tasks[entry_id] + dead[entry_id]
            if not wanted:
                into.unexpected += records > 0
                continue
            if records == 0:
                if entry_id in self.drained_ids:
                    into.drained += 1
                else:
                    into.missing.append(entry_id)
                continue
            into.found += 1
            into.in_task_topics += tasks[entry_id] > 0
            into.dead_lettered += dead[entry_id] > 0
            if records > 1:
                into.duplicated[entry_id] = records
        into.order_violations = self.violations[stream]


def _id_key(entry_id: str) -> tuple[int, int] | None:
    millis, _, seq = entry_id.partition("-")
    if not millis.isdigit() or (seq and not seq.isdigit()):
        return None
    return int(millis), int(seq or 0)
