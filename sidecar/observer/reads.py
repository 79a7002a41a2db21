"""The observer's reads of RAGFlow's consumer group: XINFO GROUPS, XPENDING and XRANGE, paged.

None of them changes the group; :data:`COMMANDS_USED` lists every command sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import valkey.asyncio as valkey

from sidecar.clock import now_ms
from sidecar.errors import MessageQueueError
from sidecar.observer.state import Pending
from sidecar.observer.stream_ids import StreamId, format_stream_id, parse_stream_id
from sidecar.text import as_text
from sidecar.transport.valkey_client import translate_valkey_errors

# Every command the observer's connection sends, for an ACL such as
# ``+xinfo|groups +xpending +xrange +select``. SELECT is the client's own: RAGFlow's queue is
# in db 1. valkey-py also tries CLIENT SETINFO on connect and ignores a refusal.
COMMANDS_USED: tuple[str, ...] = ("XINFO GROUPS", "XPENDING", "XRANGE", "SELECT")


class GroupGone(Exception):
    """The stream or group disappeared in the middle of a round."""


@dataclass(frozen=True, slots=True)
class GroupReader:
    """Reads of one group on ``client``; a scan stops at ``max_per_round`` entries."""

    client: valkey.Valkey
    group: str
    where: str
    page_size: int
    max_per_round: int

    async def group_info(self, stream: str) -> dict[str, Any] | None:
        """The group's XINFO GROUPS entry; None when the stream or the group does not exist."""
        try:
            with translate_valkey_errors(f"XINFO GROUPS {stream}", self.where):
                groups = await self.client.xinfo_groups(stream)
        except MessageQueueError as exc:
            if "no such key" in str(exc).lower():
                return None
            raise
        for info in groups:
            if as_text(info.get("name")) == self.group:
                return dict(info)
        return None

    async def scan_pending(
        self, stream: str, after: StreamId | None, upto: StreamId | None
    ) -> tuple[dict[StreamId, Pending], StreamId | None]:
        """Pending entries in (after, upto]; and how far that got: None when to ``upto``."""
        found: dict[StreamId, Pending] = {}
        start = "-" if after is None else f"({format_stream_id(after)}"
        end = "+" if upto is None else format_stream_id(upto)
        while True:
            count = min(self.page_size, self.max_per_round - len(found))
            try:
                with translate_valkey_errors(f"XPENDING {stream}", self.where):
                    page = await self.client.xpending_range(stream, self.group, start, end, count)
            except MessageQueueError as exc:
                if "NOGROUP" in str(exc):
                    raise GroupGone from exc
                raise
            replied_ms = now_ms()
            for item in page:
                sid = parse_stream_id(item["message_id"])
                found[sid] = Pending(
                    consumer=as_text(item["consumer"]),
                    deliveries=int(item["times_delivered"]),
                    delivered_ms=replied_ms - int(item["time_since_delivered"]),
                )
            if len(page) < count:
                return found, upto
            last = parse_stream_id(page[-1]["message_id"])
            if len(found) >= self.max_per_round:
                return found, last
            start = f"({format_stream_id(last)}"

    async def delivered_between(
        self, stream: str, after: StreamId, upto: StreamId
    ) -> tuple[list[StreamId], bool]:
        """Entry ids in (after, upto], and whether all of them fitted under the cap."""
        ids: list[StreamId] = []
        start = f"({format_stream_id(after)}"
        end = format_stream_id(upto)
        while True:
            count = min(self.page_size, self.max_per_round - len(ids))
            with translate_valkey_errors(f"XRANGE {stream}", self.where):
                page = await self.client.xrange(stream, min=start, max=end, count=count)
            ids += [parse_stream_id(entry_id) for entry_id, _ in page]
            if len(page) < count:
                return ids, True
            if len(ids) >= self.max_per_round:
                return ids, False
            start = f"({format_stream_id(ids[-1])}"
