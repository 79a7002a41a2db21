"""Messages handed back with ``nack(delay_ms)``, waiting for their time to be delivered again."""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class DelayedRedeliveries(Generic[T]):
    """A time-ordered queue of items that become due after a delay (monotonic clock)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._heap: list[tuple[float, int, T]] = []
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, item: T, delay_ms: int) -> None:
        """Make ``item`` due ``delay_ms`` from now."""
        due = self._clock() + max(delay_ms, 0) / 1000
        heapq.heappush(self._heap, (due, next(self._order), item))

    def pop_due(self, limit: int) -> list[T]:
        """Up to ``limit`` items whose time has come, earliest first."""
        now = self._clock()
        items: list[T] = []
        while self._heap and len(items) < limit and self._heap[0][0] <= now:
            items.append(heapq.heappop(self._heap)[2])
        return items

    def seconds_until_next(self) -> float | None:
        """How long until the earliest item is due (0 when one already is), or ``None``."""
        if not self._heap:
            return None
        return max(self._heap[0][0] - self._clock(), 0.0)

    def discard(self, predicate: Callable[[T], bool]) -> None:
        """Drop every waiting item for which ``predicate`` is true."""
        kept = [entry for entry in self._heap if not predicate(entry[2])]
        heapq.heapify(kept)
        self._heap = kept
