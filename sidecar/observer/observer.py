"""The worker observer: watch RAGFlow's own consumer group, read-only, and time its deliveries.

RAGFlow's task executors read ``te.1.common``/``te.0.common`` in ``rag_flow_svr_task_broker``
and XACK when done. The observer never joins that group: it only looks at it, so the Redis
path's queue wait (enqueue to delivery) and processing time (delivery to ack) can be set beside
the Kafka path's. Commands are in :data:`.reads.COMMANDS_USED`; none of them changes the group.

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
- Baseline: the first round for a stream (at :meth:`WorkerObserver.start`, or when a stream or
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
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import valkey.asyncio as valkey

from sidecar.clock import now_ms
from sidecar.config import Settings
from sidecar.errors import SidecarError
from sidecar.lifecycle import Lifecycle
from sidecar.observer.reads import GroupGone, GroupReader
from sidecar.observer.state import (
    Pending,
    StreamState,
    Tracked,
    WorkerDelivery,
    inferred_delivery,
    tracked_delivery,
)
from sidecar.observer.stream_ids import (
    IdRange,
    StreamId,
    format_stream_id,
    in_ranges,
    in_ranges_all,
    parse_stream_id,
)
from sidecar.transport.options import RedisSettings

logger = logging.getLogger(__name__)

RAGFLOW_GROUP = "rag_flow_svr_task_broker"

DEFAULT_PAGE_SIZE = 1000
DEFAULT_MAX_PER_ROUND = 10_000
DEFAULT_MAX_TRACKED = 100_000

OnDelivery = Callable[["WorkerDelivery"], Awaitable[None]]


class WorkerObserver(Lifecycle):
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
        self._states: dict[str, StreamState] = {s: StreamState() for s in self.streams}
        self._round_lock = asyncio.Lock()
        self._warned_full = False

    @classmethod
    def from_settings(
        cls, settings: Settings, streams: Sequence[str] | None = None, **kwargs: Any
    ) -> WorkerObserver:
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
        self._states = {s: StreamState() for s in self.streams}
        await self._round()  # the baseline: reports nothing

    async def _stop(self) -> None:
        """Nothing to release: the client is the caller's."""

    def pending(self) -> list[WorkerDelivery]:
        """The entries tracked as delivered and not acked yet, as last seen."""
        return [
            tracked_delivery(stream, sid, entry, acked_ms=None)
            for stream, state in self._states.items()
            for sid, entry in sorted(state.tracked.items())
        ]

    async def poll_once(self) -> list[WorkerDelivery]:
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

    async def _round(self) -> list[WorkerDelivery]:
        async with self._round_lock:
            reported: list[WorkerDelivery] = []
            for stream in self.streams:
                records = await self._observe(stream, self._states[stream])
                for record in records:
                    await self._notify(record)
                reported += records
            return reported

    async def _notify(self, record: WorkerDelivery) -> None:
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

    async def _observe(self, stream: str, state: StreamState) -> list[WorkerDelivery]:
        try:
            return await self._observe_group(stream, state)
        except GroupGone:
            # Gone between XINFO and XPENDING: change nothing, the next round sees it missing.
            return []

    async def _observe_group(self, stream: str, state: StreamState) -> list[WorkerDelivery]:
        reader = GroupReader(
            self.client, self.group, self._where, self._page_size, self._max_per_round
        )
        info = await reader.group_info(stream)
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
        ranges: list[IdRange] = []
        pending: dict[StreamId, Pending] = {}
        if int(info.get("pending") or 0) == 0:
            ranges.append((None, None))  # pending count and last id are one snapshot
            state.scan_from = None
        else:
            found, covered_to = await reader.scan_pending(stream, state.scan_from, None)
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
            delivered, complete = await reader.delivered_between(stream, cursor, last)
            new_cursor = last if complete or not delivered else delivered[-1]
            if delivered and not in_ranges_all(cursor, delivered[-1], ranges):
                found, covered_to = await reader.scan_pending(stream, cursor, delivered[-1])
                pending.update(found)
                ranges.append((cursor, covered_to))
                if covered_to is not None and covered_to < delivered[-1]:
                    new_cursor = min(new_cursor, covered_to)
                    delivered = [sid for sid in delivered if sid <= covered_to]
        else:
            new_cursor = cursor

        now = now_ms()
        records: list[WorkerDelivery] = []
        for sid in delivered:
            if sid in state.tracked or sid in state.reported_ahead or sid in pending:
                continue
            # Delivered and acked between two rounds: only the cursor moving shows it.
            records.append(inferred_delivery(stream, sid, now))
        for sid, seen in pending.items():
            self._track(stream, state, sid, seen)
        for sid in [s for s in state.tracked if s not in pending and in_ranges(s, ranges)]:
            entry = state.tracked.pop(sid)
            records.append(tracked_delivery(stream, sid, entry, acked_ms=now))
            if sid > new_cursor:
                state.reported_ahead.add(sid)
        state.cursor = new_cursor
        state.reported_ahead = {sid for sid in state.reported_ahead if sid > new_cursor}
        records.sort(key=lambda r: parse_stream_id(r.entry_id))
        return records

    def _track(self, stream: str, state: StreamState, sid: StreamId, seen: Pending) -> None:
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
        state.tracked[sid] = Tracked(
            delivered_ms=max(seen.delivered_ms, sid[0]),
            consumer=seen.consumer,
            deliveries=seen.deliveries,
        )


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
