"""Reconcile's account of served records: tasks RAGFlow executed from Kafka (``x-served: 1``).

A served record names no stream entry, so it is neither missing nor extra: it is counted
apart. One that ``drain-to-redis`` moved back has a drained key naming the entry it became;
that entry must be in its stream with the record's bytes exactly, or the move lost the task.
The entries ``drain-to-redis`` wrote are in the task streams like RAGFlow's own, but their
Kafka record is the served one, never a mirror copy: :func:`drained_entry_ids` lets the stream
side count them as drained rather than missing.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import valkey.asyncio as avalkey

from sidecar.transport.redis_streams import MESSAGE_FIELD
from sidecar.transport.served import served_queue, target_stream
from sidecar.wire.contract import Keys

# Keys per MGET and entries per pipeline: bounded round trips without one huge reply.
_CHUNK = 500


@dataclass
class DrainedProblem:
    """A served record whose drained key names an entry that is not as it should be."""

    topic: str
    partition: int
    offset: int
    stream: str
    entry_id: str
    problem: str  # "entry missing", "message differs", "no x-ragflow-queue"


@dataclass
class _Served:
    topic: str
    partition: int
    offset: int
    stream: str | None
    digest: bytes  # sha256 of the value: the whole values of a long window need not be held


@dataclass
class ServedAccount:
    """Served records of the window, by the queue they name, and the check of those drained."""

    since_ms: int | None = None  # record timestamps of the window, inclusive
    until_ms: int | None = None
    streams: tuple[str, ...] = ()  # MIRROR_STREAMS, to find where drain put a record
    records: int = 0
    by_queue: Counter[str] = field(default_factory=Counter)
    drained: int = 0  # moved back by drain-to-redis and found byte-identical in their stream
    problems: list[DrainedProblem] = field(default_factory=list)
    _pending: list[_Served] = field(default_factory=list, repr=False)

    def take(self, record: Any) -> None:
        """Count one served record of a task topic (if its timestamp is in the window)."""
        stamp = record.timestamp
        if (self.since_ms is not None and stamp < self.since_ms) or (
            self.until_ms is not None and stamp > self.until_ms
        ):
            return
        queue = served_queue(record.headers or ())
        self.records += 1
        self.by_queue[queue or "(none)"] += 1
        stream = target_stream(queue, self.streams) if queue is not None else None
        digest = hashlib.sha256(record.value or b"").digest()
        self._pending.append(_Served(record.topic, record.partition, record.offset, stream, digest))

    async def verify(self, client: avalkey.Valkey, keys: Keys) -> None:
        """Look up each record's drained key and the entry it names."""
        pending, self._pending = self._pending, []
        for start in range(0, len(pending), _CHUNK):
            chunk = pending[start : start + _CHUNK]
            ids = await client.mget([keys.drained(s.topic, s.partition, s.offset) for s in chunk])
            drained = [(s, raw.decode()) for s, raw in zip(chunk, ids, strict=True) if raw]
            pipe = client.pipeline(transaction=False)
            for served, entry_id in drained:
                if served.stream is not None:
                    pipe.xrange(served.stream, min=entry_id, max=entry_id)
            replies = iter(await pipe.execute())
            for served, entry_id in drained:
                if served.stream is None:
                    self._problem(served, entry_id, "no x-ragflow-queue")
                    continue
                entries = next(replies)
                message = entries[0][1].get(MESSAGE_FIELD) if entries else None
                if not entries:
                    self._problem(served, entry_id, "entry missing")
                elif hashlib.sha256(message or b"").digest() != served.digest:
                    self._problem(served, entry_id, "message differs")
                else:
                    self.drained += 1

    def _problem(self, served: _Served, entry_id: str, problem: str) -> None:
        self.problems.append(
            DrainedProblem(
                served.topic,
                served.partition,
                served.offset,
                served.stream or "",
                entry_id,
                problem,
            )
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "by_queue": dict(self.by_queue),
            "drained_verified": self.drained,
            "drained_problems": [asdict(p) for p in self.problems],
        }

    def lines(self) -> list[str]:
        """The served part of the table's report."""
        queues = ", ".join(f"{q} {n}" for q, n in sorted(self.by_queue.items()))
        lines = [
            f"served records (RAGFlow's tasks on Kafka, no stream entry): {self.records}"
            + (f" ({queues})" if queues else ""),
            f"drained back to Redis and verified: {self.drained}; "
            f"drained but not as moved: {len(self.problems)}",
        ]
        lines += [
            f"drained {p.topic}[{p.partition}]@{p.offset} -> {p.stream} {p.entry_id}: {p.problem}"
            for p in self.problems[:20]
        ]
        return lines


async def drained_entry_ids(client: avalkey.Valkey, keys: Keys) -> set[str]:
    """Every entry id a drained key names: entries drain-to-redis wrote.

    The keys hold the id only, not the stream; two task streams sharing an id (same
    millisecond and sequence) is the one case where an entry could be taken for drained.
    """
    found: set[str] = set()
    names: list[bytes] = []
    async for name in client.scan_iter(match=keys.drained_pattern, count=1000):
        names.append(name)
    for start in range(0, len(names), _CHUNK):
        found.update(
            raw.decode() for raw in await client.mget(names[start : start + _CHUNK]) if raw
        )
    return found
