"""Redis (Valkey) Streams backend, wire-compatible with RAGFlow's task queue.

Produce is ``XADD <stream> * message <json>``, as RAGFlow's ``queue_product``. Consume is
XREADGROUP in a named group: the consumer's own pending entries are replayed first (as
RAGFlow's executor does after a restart), then streams are read in the order given, so
``te.1.common`` is served before ``te.0.common``. A stream that does not exist yet is normal:
it is looked for again every ``missing_stream_recheck_s`` and logged once, not every poll.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import valkey.asyncio as valkey

from sidecar.errors import MessageQueueError, SidecarError
from sidecar.text import as_text
from sidecar.transport.base import (
    MessageQueueConsumer,
    MessageQueueProducer,
    OutgoingMessage,
    SendResult,
)
from sidecar.transport.message import QueueMessage
from sidecar.transport.options import RedisSettings
from sidecar.transport.redelivery import DelayedRedeliveries
from sidecar.transport.valkey_client import ClientOwner

logger = logging.getLogger(__name__)

MESSAGE_FIELD = b"message"

Entry = tuple[bytes, dict[bytes, bytes] | None]


def entry_to_message(
    stream: str,
    entry_id: bytes,
    fields: dict[bytes, bytes],
    settler: RedisStreamConsumer | None,
    claimed: bool = False,
) -> QueueMessage:
    """A stream entry as a :class:`QueueMessage`; fields other than ``message`` become headers."""
    text_id = entry_id.decode("ascii")
    millis, _, _ = text_id.partition("-")
    # RAGFlow's entries hold one field; only others need turning into headers.
    headers = (
        ()
        if len(fields) == 1 and MESSAGE_FIELD in fields
        else tuple(
            # surrogateescape keeps field names that are not UTF-8 recoverable byte for byte.
            (name.decode("utf-8", "surrogateescape"), value)
            for name, value in fields.items()
            if name != MESSAGE_FIELD
        )
    )
    return QueueMessage(
        id=text_id,
        value=fields.get(MESSAGE_FIELD),
        topic=stream,
        timestamp_ms=int(millis) if millis.isdigit() else 0,
        headers=headers,
        claimed=claimed,
        settler=settler,
    )


class RedisStreamProducer(ClientOwner, MessageQueueProducer):
    """``XADD <stream> * message <value>`` plus any headers as further fields."""

    def __init__(
        self, client: valkey.Valkey | None = None, settings: RedisSettings | None = None
    ) -> None:
        ClientOwner.__init__(self, client, settings)
        MessageQueueProducer.__init__(self)

    async def _start(self) -> None:
        self._open()
        async with self._calls("PING"):
            await self.client.ping()

    async def _stop(self) -> None:
        await self._close()

    async def send_many(
        self, messages: Sequence[OutgoingMessage]
    ) -> list[SendResult | SidecarError]:
        outcomes: list[SendResult | SidecarError] = []
        for message in messages:
            fields: dict[bytes, bytes] = {MESSAGE_FIELD: message.value_bytes()}
            for name, value in message.headers:
                fields[name.encode("utf-8", "surrogateescape")] = value
            try:
                async with self._calls(f"XADD {message.destination}"):
                    entry_id = await self.client.xadd(message.destination, fields)
            except SidecarError as exc:
                outcomes.append(exc)
                continue
            outcomes.append(SendResult(message.destination, entry_id.decode("ascii")))
        return outcomes

    async def flush(self) -> None:
        """XADD is acknowledged when it returns; nothing is buffered."""


class RedisStreamConsumer(ClientOwner, MessageQueueConsumer):
    """XREADGROUP over several streams in priority order, in one consumer group.

    ``group_start_id`` is where a group that does not exist yet is created (``0``: all the
    history, ``$``: only new entries); an existing group is never recreated or moved. A stream
    that did not exist when the consumer started gets its group at ``0``: all of it is new.

    With ``claim_idle_ms``, entries pending on other consumers of the group (a dead instance)
    for longer than that are taken over with XAUTOCLAIM and delivered here.
    """

    def __init__(
        self,
        streams: Sequence[str],
        group: str,
        consumer: str,
        *,
        client: valkey.Valkey | None = None,
        settings: RedisSettings | None = None,
        group_start_id: str = "0",
        create_streams: bool = False,
        missing_stream_recheck_s: float = 5.0,
        claim_idle_ms: int | None = None,
    ) -> None:
        if not streams:
            raise ValueError("at least one stream is needed")
        ClientOwner.__init__(self, client, settings)
        MessageQueueConsumer.__init__(self)
        self.streams = tuple(streams)
        self.group = group
        self.consumer = consumer
        self._group_start_id = group_start_id
        self._claim_idle_ms = claim_idle_ms
        self._claim_every_s = max((claim_idle_ms or 0) / 2000, 0.5)
        self._next_claim = 0.0
        self._claim_cursor: dict[str, bytes] = {}
        self._create_streams = create_streams
        self._recheck_s = missing_stream_recheck_s
        self._ready: set[str] = set()  # streams whose group is known to exist
        self._next_check: dict[str, float] = {}
        self._reported_missing: set[str] = set()
        self._replay_from: dict[str, bytes] = {}  # own pending entries still to replay
        self._buffer: deque[QueueMessage] = deque()
        self._deleted: list[tuple[str, bytes]] = []  # pending entries gone from the stream
        self._redeliveries: DelayedRedeliveries[tuple[str, str]] = DelayedRedeliveries()
        # Entries handed to the caller (or buffered) and not acked or nacked yet: pending on
        # this consumer, and idle on the server however busy the caller is with them.
        self._in_hand: set[tuple[str, str]] = set()

    async def _start(self) -> None:
        self._open()
        self._ready.clear()
        self._next_check.clear()
        self._buffer.clear()
        self._replay_from = {stream: b"0" for stream in self.streams}
        async with self._calls("PING"):
            await self.client.ping()
        await self._ensure_groups()

    async def _stop(self) -> None:
        # Buffered entries stay pending in the group and are replayed on the next start.
        self._buffer.clear()
        self._in_hand.clear()
        await self._close()

    async def _ensure_groups(self) -> None:
        now = time.monotonic()
        for stream in self.streams:
            if stream in self._ready or self._next_check.get(stream, 0.0) > now:
                continue
            if await self._ensure_group(stream):
                self._ready.add(stream)
                self._next_check.pop(stream, None)
            else:
                self._next_check[stream] = now + self._recheck_s

    async def _ensure_group(self, stream: str) -> bool:
        try:
            async with self._calls(f"XGROUP CREATE {stream} {self.group}"):
                await self.client.xgroup_create(
                    stream,
                    self.group,
                    id="0" if stream in self._reported_missing else self._group_start_id,
                    mkstream=self._create_streams,
                )
            logger.info(
                "created consumer group %s on stream %s at %s",
                self.group,
                stream,
                "0" if stream in self._reported_missing else self._group_start_id,
            )
        except MessageQueueError as exc:
            text = str(exc)
            if "BUSYGROUP" in text:
                pass
            elif "requires the key to exist" in text:
                if stream not in self._reported_missing:
                    self._reported_missing.add(stream)
                    logger.info(
                        "stream %s does not exist yet; it will be read once created", stream
                    )
                return False
            else:
                raise
        if stream in self._reported_missing:
            self._reported_missing.discard(stream)
            logger.info("stream %s now exists; reading it", stream)
        return True

    def _ordered(self, streams: set[str]) -> list[str]:
        return [stream for stream in self.streams if stream in streams]

    async def _read(
        self, streams: dict[str, bytes], count: int, block_ms: int | None
    ) -> tuple[list[QueueMessage], int]:
        """Messages read, and how many entries the reply held (deleted ones included)."""
        try:
            async with self._calls(f"XREADGROUP {self.group}"):
                reply = await self.client.xreadgroup(
                    self.group,
                    self.consumer,
                    streams,
                    count=count,
                    block=block_ms,
                )
        except MessageQueueError as exc:
            if "NOGROUP" not in str(exc):
                raise
            # The stream or our group was deleted under us: look for both again.
            logger.warning("consumer group %s vanished from %s; recreating", self.group, streams)
            self._ready.difference_update(streams)
            return [], 0
        return self._convert(reply)

    def _convert(self, reply: Any) -> tuple[list[QueueMessage], int]:
        by_stream: dict[str, list[Entry]] = {}
        items = reply.items() if isinstance(reply, dict) else (reply or [])
        for name, raw_entries in items:
            stream = name.decode("utf-8") if isinstance(name, bytes) else str(name)
            entries = raw_entries
            if isinstance(entries, list) and entries and isinstance(entries[0], list):
                entries = entries[0]  # RESP3 nests the entry list once more
            by_stream[stream] = list(entries)
        messages: list[QueueMessage] = []
        for stream in self._ordered(set(by_stream)):
            for entry_id, fields in by_stream[stream]:
                if stream in self._replay_from:
                    self._replay_from[stream] = entry_id
                if fields is None:
                    # A pending entry deleted from the stream (XDEL): nothing to deliver.
                    logger.warning("pending entry %r of %s no longer exists", entry_id, stream)
                    self._deleted.append((stream, entry_id))
                    continue
                messages.append(entry_to_message(stream, entry_id, fields, self))
        return messages, sum(len(entries) for entries in by_stream.values())

    async def poll_batch(self, max_records: int, timeout_ms: int) -> list[QueueMessage]:
        if not self.started:
            raise RuntimeError("consumer is not started")
        batch = [self._buffer.popleft() for _ in range(min(max_records, len(self._buffer)))]
        if len(batch) < max_records:
            batch += await self._fill(max_records - len(batch), timeout_ms)
        self._in_hand.update((message.topic, message.id) for message in batch)
        while self._deleted:
            stream, entry_id = self._deleted.pop()
            async with self._calls(f"XACK {stream}"):
                await self.client.xack(stream, self.group, entry_id)
        return batch

    async def _fill(self, wanted: int, timeout_ms: int) -> list[QueueMessage]:
        await self._ensure_groups()
        # 1. Our own pending entries, left by a crash or a stop before ack.
        for stream in self._ordered(self._ready & set(self._replay_from)):
            replayed, seen = await self._read({stream: self._replay_from[stream]}, wanted, None)
            if replayed:
                return replayed
            if not seen and stream in self._ready:
                del self._replay_from[stream]
        # 2. Entries a dead consumer left pending for longer than claim_idle_ms.
        if self._claim_idle_ms is not None and time.monotonic() >= self._next_claim:
            claimed = await self._autoclaim(wanted)
            if claimed:
                return claimed
        # 3. Entries handed back with nack() whose delay is over.
        due = self._redeliveries.pop_due(wanted)
        if due:
            return await self._claim(due)
        # 4. New entries, highest priority first.
        batch: list[QueueMessage] = []
        for stream in self._ordered(self._ready):
            batch += (await self._read({stream: b">"}, wanted - len(batch), None))[0]
            if len(batch) >= wanted:
                return batch
        if batch:
            return batch
        # 5. Nothing waiting: block on every stream until one has something.
        wait_ms = timeout_ms
        next_due = self._redeliveries.seconds_until_next()
        if next_due is not None:
            wait_ms = min(wait_ms, int(next_due * 1000) + 1)
        if not self._ready:
            await asyncio.sleep(min(wait_ms / 1000, self._recheck_s))
            return []
        if wait_ms <= 0:
            return []
        arrived, _ = await self._read(
            {stream: b">" for stream in self._ordered(self._ready)}, wanted, wait_ms
        )
        buffered = arrived[wanted:]
        self._buffer.extend(buffered)
        self._in_hand.update((message.topic, message.id) for message in buffered)
        return arrived[:wanted]

    async def _claim(self, due: list[tuple[str, str]]) -> list[QueueMessage]:
        messages: list[QueueMessage] = []
        for stream, entry_id in due:
            async with self._calls(f"XCLAIM {stream}"):
                claimed = await self.client.xclaim(
                    stream, self.group, self.consumer, min_idle_time=0, message_ids=[entry_id]
                )
            for claimed_id, fields in claimed:
                if fields is not None:
                    messages.append(entry_to_message(stream, claimed_id, fields, self, True))
        return messages

    async def _autoclaim(self, wanted: int) -> list[QueueMessage]:
        assert self._claim_idle_ms is not None
        messages: list[QueueMessage] = []
        for stream in self._ordered(self._ready):
            cursor = self._claim_cursor.get(stream, b"0-0")
            async with self._calls(f"XAUTOCLAIM {stream}"):
                reply = await self.client.xautoclaim(
                    stream,
                    self.group,
                    self.consumer,
                    min_idle_time=self._claim_idle_ms,
                    start_id=cursor,
                    count=wanted - len(messages),
                )
            next_cursor, entries = reply[0], reply[1]
            self._claim_cursor[stream] = next_cursor
            # XAUTOCLAIM takes any entry idle that long, this consumer's own too: an entry in
            # hand (a batch waiting while Kafka is away) is not taken over a second time.
            entries = [
                (entry_id, fields)
                for entry_id, fields in entries
                if (stream, as_text(entry_id)) not in self._in_hand
            ]
            for entry_id, fields in entries:
                if fields is not None:
                    messages.append(entry_to_message(stream, entry_id, fields, self, True))
            if entries:
                logger.warning(
                    "took over %d entries of %s idle for over %d ms on another consumer",
                    len(entries),
                    stream,
                    self._claim_idle_ms,
                )
            if len(messages) >= wanted:
                return messages
        # A full pass over every stream with nothing left: rest until the next interval.
        if all(self._claim_cursor.get(s, b"0-0") in (b"0-0", "0-0") for s in self._ready):
            self._next_claim = time.monotonic() + self._claim_every_s
        return messages

    async def ack(self, message: QueueMessage) -> None:
        async with self._calls(f"XACK {message.topic}"):
            await self.client.xack(message.topic, self.group, message.id)
        self._in_hand.discard((message.topic, message.id))

    async def ack_many(self, messages: Sequence[QueueMessage]) -> None:
        """XACK a batch: one command per stream."""
        by_stream: dict[str, list[str]] = {}
        for message in messages:
            by_stream.setdefault(message.topic, []).append(message.id)
        for stream, ids in by_stream.items():
            async with self._calls(f"XACK {stream}"):
                await self.client.xack(stream, self.group, *ids)
            self._in_hand.difference_update((stream, entry_id) for entry_id in ids)

    async def nack(self, message: QueueMessage, delay_ms: int = 0) -> None:
        # The entry stays pending in the group, so a crash before redelivery loses nothing.
        self._in_hand.discard((message.topic, message.id))
        self._redeliveries.push((message.topic, message.id), delay_ms)
