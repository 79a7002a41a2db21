"""The primary observer: watch RAGFlow's own consumer group, read-only, and time its deliveries.

RAGFlow's task executors read ``te.1.common``/``te.0.common`` in ``rag_flow_svr_task_broker``
and XACK when done. The observer never joins that group: it only looks at it, so the Redis
path's queue wait (enqueue to delivery) and processing time (delivery to ack) can be set beside
the Kafka path's. Commands are in :data:`COMMANDS_USED`; none of them changes the group.

Each round, per stream:

1. ``XINFO GROUPS``: the group's ``last-delivered-id`` and ``pending`` count. A missing stream
   or group is normal (``te.1.common`` often does not exist): skipped, logged once at INFO.
2. ``XPENDING <stream> <group> <start> <end> <count>`` (extended form), paged by ``page_size``
   and capped at ``max_per_round`` entries; skipped when ``pending`` is 0. When the cap cuts a
   scan short, the next round goes on from there, so a huge pending list (dead workers' entries,
   which RAGFlow never reclaims) is covered over several rounds instead of starving the rest.
3. If ``last-delivered-id`` moved: ``XRANGE <stream> (<previous> <new>`` (paged, capped) for the
   ids delivered since. If the pending scan did not cover that id range, it is scanned too.

Rules:

- An entry first seen pending is tracked with ``delivered_ms = now - idle``; ``exact`` is True.
  If it was delivered more than once by then, that is its latest delivery (the earlier ones were
  not seen). Later rounds update ``consumer`` (the current holder: after an XCLAIM, the new one)
  and ``deliveries``; ``delivered_ms`` stays the first one known, so ``processing_ms`` spans all
  attempts.
- A tracked entry missing from a scanned part of the pending list was acked between the two
  rounds: reported with ``acked_ms`` = this round's time (an upper bound; the previous round is
  the lower bound).
- An id delivered since the previous round (XRANGE) that is neither tracked nor pending was
  delivered and acked between two rounds: reported with ``exact=False``, ``consumer=None``,
  ``deliveries=1`` and ``delivered_ms = acked_ms`` = this round's time (upper bounds);
  its ``processing_ms`` is None (only known to be under one interval).
- Baseline: the first round for a stream (at :meth:`PrimaryObserver.start`, or when a stream or
  group first appears or reappears) records ``last-delivered-id`` and tracks what is pending
  without reporting anything. Entries delivered and acked before it are never reported;
  entries pending at it are reported when acked, with what is known.
- ``last-delivered-id`` moving backwards means the group was reset (XGROUP SETID, or destroyed
  and recreated, which RAGFlow does at ``0``): tracked entries are dropped unreported (their
  ack cannot be told from the reset) and the stream is baselined again. A group that vanishes
  drops its tracked entries the same way. (A group destroyed and recreated within one interval
  whose new ``last-delivered-id`` is already past the old one cannot be told from normal work.)
  Removing a consumer (XGROUP DELCONSUMER) discards its pending entries; that looks like an ack
  and is reported as one.
- Times are this host's wall clock in ms; entry ids carry Valkey's. ``delivered_ms`` is kept
  >= ``enqueued_ms`` and ``acked_ms`` >= ``delivered_ms`` so a small clock skew cannot give
  negative waits (a large skew still biases them: run NTP).
- Memory: tracked entries (at most ``max_tracked``, per observer) and, per stream, the ids
  already reported that ``last-delivered-id`` has not passed yet (so an entry first seen pending
  and acked before the XRANGE cursor reached it is not reported twice). Message bodies are
  read by XRANGE but never kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import valkey.asyncio as valkey

from sidecar.config import Settings
from sidecar.errors import MessageQueueError, SidecarError
from sidecar.lifecycle import Lifecycle
from sidecar.transport.options import RedisSettings
from sidecar.transport.redis_streams import translate_valkey_errors

logger = logging.getLogger(__name__)

RAGFLOW_GROUP = "rag_flow_svr_task_broker"

# Every command the observer's connection sends, for an ACL such as
# ``+xinfo|groups +xpending +xrange +select``. SELECT is the client's own: RAGFlow's queue is
# in db 1. valkey-py also tries CLIENT SETINFO on connect and ignores a refusal.
COMMANDS_USED: tuple[str, ...] = ("XINFO GROUPS", "XPENDING", "XRANGE", "SELECT")

DEFAULT_PAGE_SIZE = 1000
DEFAULT_MAX_PER_ROUND = 10_000
DEFAULT_MAX_TRACKED = 100_000

StreamId = tuple[int, int]
# (exclusive low, inclusive high); None is an open end.
_Range = tuple[StreamId | None, StreamId | None]

OnDelivery = Callable[["PrimaryDelivery"], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class PrimaryDelivery:
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


def parse_stream_id(raw: bytes | str) -> StreamId:
    """``b"1700000000000-3"`` as ``(1700000000000, 3)``, for ordering."""
    text = raw.decode("ascii") if isinstance(raw, bytes) else raw
    millis, _, seq = text.partition("-")
    return int(millis), int(seq or 0)


def format_stream_id(sid: StreamId) -> str:
    return f"{sid[0]}-{sid[1]}"


def _text(raw: Any) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _in_ranges(sid: StreamId, ranges: Sequence[_Range]) -> bool:
    return any((lo is None or sid > lo) and (hi is None or sid <= hi) for lo, hi in ranges)


class _GroupGone(Exception):
    """The stream or group disappeared in the middle of a round."""


@dataclass(slots=True)
class _Pending:
    consumer: str
    deliveries: int
    delivered_ms: int  # reply time minus idle: the latest delivery


@dataclass(slots=True)
class _Tracked:
    delivered_ms: int
    consumer: str
    deliveries: int


@dataclass(slots=True)
class _StreamState:
    cursor: StreamId | None = None  # last-delivered-id at the previous round; None: no baseline
    tracked: dict[StreamId, _Tracked] = field(default_factory=dict)
    reported_ahead: set[StreamId] = field(default_factory=set)
    scan_from: StreamId | None = None  # where a pending scan cut short by the cap goes on
    absent: bool = False  # stream or group missing, already logged

    def forget(self) -> int:
        dropped = len(self.tracked)
        self.cursor = None
        self.tracked.clear()
        self.reported_ahead.clear()
        self.scan_from = None
        return dropped


class PrimaryObserver(Lifecycle):
    """Watches RAGFlow's consumer group read-only; reports each entry once it is acked."""

    def __init__(
        self,
        settings: RedisSettings,
        streams: Sequence[str],
        group: str = RAGFLOW_GROUP,
        *,
        interval_ms: int = 500,
        on_delivery: OnDelivery | None = None,
        client: valkey.Valkey,
        page_size: int = DEFAULT_PAGE_SIZE,
        max_per_round: int = DEFAULT_MAX_PER_ROUND,
        max_tracked: int = DEFAULT_MAX_TRACKED,
    ) -> None:
        """``client`` is the composition root's (:func:`sidecar.app.wiring.observer_client`,
        with a socket timeout): the observer neither starts nor closes it."""
        if not streams:
            raise ValueError("at least one stream is needed")
        if interval_ms < 1 or page_size < 1 or max_per_round < 1 or max_tracked < 1:
            raise ValueError("interval_ms, page_size, max_per_round and max_tracked must be >= 1")
        super().__init__()
        self.settings = settings
        self.streams = tuple(streams)
        self.group = group
        self.interval_ms = interval_ms
        self._on_delivery = on_delivery
        self._client = client
        self._page_size = page_size
        self._max_per_round = max_per_round
        self._max_tracked = max_tracked
        self._where = settings.display_url
        self._states: dict[str, _StreamState] = {s: _StreamState() for s in self.streams}
        self._round_lock = asyncio.Lock()
        self._warned_full = False

    @classmethod
    def from_settings(
        cls, settings: Settings, streams: Sequence[str] | None = None, **kwargs: Any
    ) -> PrimaryObserver:
        """Observe ``streams`` (default: the mirror's) every ``OBSERVER_INTERVAL_MS``."""
        return cls(
            settings.redis,
            settings.mirror.streams if streams is None else streams,
            interval_ms=settings.shadow.observer_interval_ms,
            **kwargs,
        )

    @property
    def client(self) -> valkey.Valkey:
        return self._client

    async def _start(self) -> None:
        self._states = {s: _StreamState() for s in self.streams}
        await self._round()  # the baseline: reports nothing

    async def _stop(self) -> None:
        """Nothing to release: the client is the caller's."""

    def pending(self) -> list[PrimaryDelivery]:
        """The entries tracked as delivered and not acked yet, as last seen."""
        return [
            self._record(stream, sid, entry, acked_ms=None)
            for stream, state in self._states.items()
            for sid, entry in sorted(state.tracked.items())
        ]

    async def poll_once(self) -> list[PrimaryDelivery]:
        """One observation round: the entries seen acked since the last one, in stream order.

        ``on_delivery`` is called for each, stream by stream; an exception it raises is logged
        and does not stop the others. Valkey errors raise :class:`SidecarError`.
        """
        if not self.started:
            raise RuntimeError("observer is not started")
        return await self._round()

    async def run(self, stop: asyncio.Event) -> None:
        """Observe every ``interval_ms`` until ``stop`` is set; failed rounds are retried.

        A stop cancels a round in flight: whatever that round had not handed to
        ``on_delivery`` yet is not reported.
        """
        if not self.started:
            raise RuntimeError("observer is not started")
        interval_s = self.interval_ms / 1000
        failing = False
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            began = loop.time()
            try:
                finished = await _unless_stopped(self._round(), stop)
            except SidecarError as exc:
                if not failing:
                    logger.warning(
                        "observing %s in %s failed: %s; retrying every %d ms",
                        ",".join(self.streams),
                        self.group,
                        exc,
                        self.interval_ms,
                    )
                else:
                    logger.debug("observing %s still fails: %s", self.group, exc)
                failing = True
            else:
                if not finished:
                    return
                if failing:
                    logger.info("observing %s works again", self.group)
                    failing = False
            remaining = interval_s - (loop.time() - began)
            if remaining > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=remaining)

    async def _round(self) -> list[PrimaryDelivery]:
        async with self._round_lock:
            reported: list[PrimaryDelivery] = []
            for stream in self.streams:
                records = await self._observe(stream, self._states[stream])
                for record in records:
                    await self._notify(record)
                reported += records
            return reported

    async def _notify(self, record: PrimaryDelivery) -> None:
        if self._on_delivery is None:
            return
        try:
            await self._on_delivery(record)
        except SidecarError as exc:
            if exc.retriable:
                raise  # Valkey or Kafka away: the round fails once, not once per delivery
            logger.error("on_delivery failed for %s %s: %s", record.stream, record.entry_id, exc)
        except Exception:
            logger.exception("on_delivery failed for %s %s", record.stream, record.entry_id)

    async def _observe(self, stream: str, state: _StreamState) -> list[PrimaryDelivery]:
        try:
            return await self._observe_group(stream, state)
        except _GroupGone:
            # Gone between XINFO and XPENDING: change nothing, the next round sees it missing.
            return []

    async def _observe_group(self, stream: str, state: _StreamState) -> list[PrimaryDelivery]:
        info = await self._group_info(stream)
        if info is None:
            dropped = state.forget()
            if dropped:
                logger.warning(
                    "group %s on %s vanished; %d pending entries no longer tracked",
                    self.group,
                    stream,
                    dropped,
                )
            if not state.absent:
                state.absent = True
                logger.info("stream %s or its group %s does not exist (yet)", stream, self.group)
            return []
        if state.absent:
            state.absent = False
            logger.info("observing group %s on %s", self.group, stream)
        last = parse_stream_id(info.get("last-delivered-id") or b"0-0")
        if state.cursor is not None and last < state.cursor:
            logger.warning(
                "last-delivered-id of %s on %s went back from %s to %s (group reset); "
                "dropping %d tracked entries and starting over",
                self.group,
                stream,
                format_stream_id(state.cursor),
                format_stream_id(last),
                len(state.tracked),
            )
            state.forget()

        # What is pending now, and which id ranges that answer covers.
        ranges: list[_Range] = []
        pending: dict[StreamId, _Pending] = {}
        if int(info.get("pending") or 0) == 0:
            ranges.append((None, None))  # pending count and last id are one snapshot
            state.scan_from = None
        else:
            found, covered_to = await self._scan_pending(stream, state.scan_from, None)
            pending.update(found)
            ranges.append((state.scan_from, covered_to))
            state.scan_from = covered_to

        if state.cursor is None:
            for sid, seen in pending.items():
                self._track(stream, state, sid, seen)
            state.cursor = last
            return []

        cursor = state.cursor
        delivered: list[StreamId] = []
        if last > cursor:
            delivered, complete = await self._delivered_between(stream, cursor, last)
            new_cursor = last if complete or not delivered else delivered[-1]
            if delivered and not _in_ranges_all(cursor, delivered[-1], ranges):
                found, covered_to = await self._scan_pending(stream, cursor, delivered[-1])
                pending.update(found)
                ranges.append((cursor, covered_to))
                if covered_to is not None and covered_to < delivered[-1]:
                    new_cursor = min(new_cursor, covered_to)
                    delivered = [sid for sid in delivered if sid <= covered_to]
        else:
            new_cursor = cursor

        now = _now_ms()
        records: list[PrimaryDelivery] = []
        for sid in delivered:
            if sid in state.tracked or sid in state.reported_ahead or sid in pending:
                continue
            # Delivered and acked between two rounds: only the cursor moving shows it.
            when = max(now, sid[0])
            records.append(
                PrimaryDelivery(
                    stream=stream,
                    entry_id=format_stream_id(sid),
                    enqueued_ms=sid[0],
                    delivered_ms=when,
                    consumer=None,
                    deliveries=1,
                    acked_ms=when,
                    exact=False,
                )
            )
        for sid, seen in pending.items():
            self._track(stream, state, sid, seen)
        for sid in [s for s in state.tracked if s not in pending and _in_ranges(s, ranges)]:
            entry = state.tracked.pop(sid)
            records.append(self._record(stream, sid, entry, acked_ms=now))
            if sid > new_cursor:
                state.reported_ahead.add(sid)
        state.cursor = new_cursor
        state.reported_ahead = {sid for sid in state.reported_ahead if sid > new_cursor}
        records.sort(key=lambda r: parse_stream_id(r.entry_id))
        return records

    def _track(self, stream: str, state: _StreamState, sid: StreamId, seen: _Pending) -> None:
        entry = state.tracked.get(sid)
        if entry is not None:
            entry.consumer = seen.consumer
            entry.deliveries = max(entry.deliveries, seen.deliveries)
            return
        if sum(len(s.tracked) for s in self._states.values()) >= self._max_tracked:
            if not self._warned_full:
                self._warned_full = True
                logger.warning(
                    "tracking %d pending entries already; further ones (first: %s %s) "
                    "are not reported",
                    self._max_tracked,
                    stream,
                    format_stream_id(sid),
                )
            return
        state.tracked[sid] = _Tracked(
            delivered_ms=max(seen.delivered_ms, sid[0]),
            consumer=seen.consumer,
            deliveries=seen.deliveries,
        )

    @staticmethod
    def _record(
        stream: str, sid: StreamId, entry: _Tracked, acked_ms: int | None
    ) -> PrimaryDelivery:
        return PrimaryDelivery(
            stream=stream,
            entry_id=format_stream_id(sid),
            enqueued_ms=sid[0],
            delivered_ms=entry.delivered_ms,
            consumer=entry.consumer,
            deliveries=max(entry.deliveries, 1),
            acked_ms=None if acked_ms is None else max(acked_ms, entry.delivered_ms),
            exact=True,
        )

    async def _group_info(self, stream: str) -> dict[str, Any] | None:
        try:
            with translate_valkey_errors(f"XINFO GROUPS {stream}", self._where):
                groups = await self.client.xinfo_groups(stream)
        except MessageQueueError as exc:
            if "no such key" in str(exc).lower():
                return None
            raise
        for info in groups:
            if _text(info.get("name")) == self.group:
                return dict(info)
        return None

    async def _scan_pending(
        self, stream: str, after: StreamId | None, upto: StreamId | None
    ) -> tuple[dict[StreamId, _Pending], StreamId | None]:
        """Pending entries in (after, upto]; and how far that got: None when to ``upto``."""
        found: dict[StreamId, _Pending] = {}
        start = "-" if after is None else f"({format_stream_id(after)}"
        end = "+" if upto is None else format_stream_id(upto)
        while True:
            count = min(self._page_size, self._max_per_round - len(found))
            try:
                with translate_valkey_errors(f"XPENDING {stream}", self._where):
                    page = await self.client.xpending_range(stream, self.group, start, end, count)
            except MessageQueueError as exc:
                if "NOGROUP" in str(exc):
                    raise _GroupGone from exc
                raise
            replied_ms = _now_ms()
            for item in page:
                sid = parse_stream_id(item["message_id"])
                found[sid] = _Pending(
                    consumer=_text(item["consumer"]),
                    deliveries=int(item["times_delivered"]),
                    delivered_ms=replied_ms - int(item["time_since_delivered"]),
                )
            if len(page) < count:
                return found, upto
            last = parse_stream_id(page[-1]["message_id"])
            if len(found) >= self._max_per_round:
                return found, last
            start = f"({format_stream_id(last)}"

    async def _delivered_between(
        self, stream: str, after: StreamId, upto: StreamId
    ) -> tuple[list[StreamId], bool]:
        """Entry ids in (after, upto], and whether all of them fitted under the cap."""
        ids: list[StreamId] = []
        start = f"({format_stream_id(after)}"
        end = format_stream_id(upto)
        while True:
            count = min(self._page_size, self._max_per_round - len(ids))
            with translate_valkey_errors(f"XRANGE {stream}", self._where):
                page = await self.client.xrange(stream, min=start, max=end, count=count)
            ids += [parse_stream_id(entry_id) for entry_id, _ in page]
            if len(page) < count:
                return ids, True
            if len(ids) >= self._max_per_round:
                return ids, False
            start = f"({format_stream_id(ids[-1])}"


def _in_ranges_all(after: StreamId, upto: StreamId, ranges: Sequence[_Range]) -> bool:
    """Whether one of ``ranges`` holds all of (after, upto]."""
    return any((lo is None or lo <= after) and (hi is None or hi >= upto) for lo, hi in ranges)


async def _unless_stopped(work: Awaitable[Any], stop: asyncio.Event) -> bool:
    """Run ``work``; False, with ``work`` cancelled, if ``stop`` is set first."""
    task = asyncio.ensure_future(work)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    finally:
        stopping.cancel()
    if task.done():
        task.result()
        return True
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return False
