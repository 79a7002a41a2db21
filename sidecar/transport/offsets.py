"""Contiguous offset completion: what may be committed for a partition.

Committing a Kafka offset says "everything before it is done". With several records in
flight, finishing offset 5 while 3 still runs must not commit past 3, or a crash loses 3 and 4.
"""

from __future__ import annotations

import heapq


class PartitionOffsets:
    """Offsets of one partition handed out and not yet finished."""

    def __init__(self) -> None:
        self._unfinished: list[int] = []  # min-heap, with finished ones removed lazily
        self._finished: set[int] = set()
        self._next_fetch: int | None = None

    def delivered(self, offset: int) -> None:
        """Record that ``offset`` was handed to a worker."""
        if offset in self._finished:
            # Delivered again (e.g. after a seek): it is unfinished once more.
            self._finished.discard(offset)
        heapq.heappush(self._unfinished, offset)
        if self._next_fetch is None or offset + 1 > self._next_fetch:
            self._next_fetch = offset + 1

    def finished(self, offset: int) -> None:
        """Record that the worker is done with ``offset``."""
        self._finished.add(offset)
        while self._unfinished and self._unfinished[0] in self._finished:
            self._finished.discard(heapq.heappop(self._unfinished))

    @property
    def in_flight(self) -> int:
        """How many delivered offsets are not finished yet."""
        return len(self._unfinished) - len(self._finished)

    def committable(self) -> int | None:
        """The offset to commit: the lowest unfinished one, or one past the last delivered."""
        if self._unfinished:
            return self._unfinished[0]
        return self._next_fetch
