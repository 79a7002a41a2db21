"""What the observer reports for an entry, and what it keeps per stream between rounds."""

from __future__ import annotations

from dataclasses import dataclass, field

from sidecar.observer.stream_ids import StreamId, format_stream_id


@dataclass(frozen=True, slots=True)
class WorkerDelivery:
    """What the observer knows of one entry's delivery in RAGFlow's group."""

    stream: str
    entry_id: str
    enqueued_ms: int
    delivered_ms: int | None
    consumer: str | None
    deliveries: int
    acked_ms: int | None
    exact: bool

    @property
    def queue_wait_ms(self) -> int | None:
        """Enqueue to (first known) delivery; an upper bound when not ``exact``."""
        if self.delivered_ms is None:
            return None
        return self.delivered_ms - self.enqueued_ms

    @property
    def processing_ms(self) -> int | None:
        """Delivery to ack; None until acked, or when both fell between two rounds."""
        if self.acked_ms is None or self.delivered_ms is None or not self.exact:
            return None
        return self.acked_ms - self.delivered_ms


@dataclass(slots=True)
class Pending:
    """One entry of an XPENDING reply."""

    consumer: str
    deliveries: int
    delivered_ms: int  # reply time minus idle: the latest delivery


@dataclass(slots=True)
class Tracked:
    """An entry seen pending and not seen acked yet."""

    delivered_ms: int
    consumer: str
    deliveries: int


def tracked_delivery(
    stream: str, sid: StreamId, entry: Tracked, acked_ms: int | None
) -> WorkerDelivery:
    """What is known of a tracked entry; ``acked_ms`` None while it is still pending."""
    return WorkerDelivery(
        stream=stream,
        entry_id=format_stream_id(sid),
        enqueued_ms=sid[0],
        delivered_ms=entry.delivered_ms,
        consumer=entry.consumer,
        deliveries=max(entry.deliveries, 1),
        acked_ms=None if acked_ms is None else max(acked_ms, entry.delivered_ms),
        exact=True,
    )


def inferred_delivery(stream: str, sid: StreamId, now: int) -> WorkerDelivery:
    """An entry delivered and acked between two rounds, both at ``now`` (upper bounds)."""
    when = max(now, sid[0])
    return WorkerDelivery(
        stream=stream,
        entry_id=format_stream_id(sid),
        enqueued_ms=sid[0],
        delivered_ms=when,
        consumer=None,
        deliveries=1,
        acked_ms=when,
        exact=False,
    )


@dataclass(slots=True)
class StreamState:
    """The observer's memory of one stream between rounds."""

    cursor: StreamId | None = None  # last-delivered-id at the previous round; None: no baseline
    tracked: dict[StreamId, Tracked] = field(default_factory=dict)
    reported_ahead: set[StreamId] = field(default_factory=set)
    scan_from: StreamId | None = None  # where a pending scan cut short by the cap goes on
    absent: bool = False  # stream or group missing, already logged

    def forget(self) -> int:
        """Drop the baseline and everything tracked; returns how many entries were tracked."""
        dropped = len(self.tracked)
        self.cursor = None
        self.tracked.clear()
        self.reported_ahead.clear()
        self.scan_from = None
        return dropped
