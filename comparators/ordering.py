"""Ordering: do entries of one key reach the Kafka consumer in the order Redis holds them?

RAGFlow relies on no order across tasks, but the entries of one key (a document, say) may
depend on each other; a partition keeps order only per key, which is what is checked.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Sequence

from comparators.base import Difference

_ENTRY_ID = re.compile(r"(\d+)-(\d+)")


def parse_entry_id(entry_id: str) -> tuple[int, int]:
    """``"1526919030474-55"`` → ``(1526919030474, 55)``, which orders as Redis does."""
    match = _ENTRY_ID.fullmatch(entry_id)
    if match is None:
        raise ValueError(f"not a Redis stream entry id: {entry_id!r}")
    return int(match[1]), int(match[2])


class OrderingComparator:
    """Redis order against Kafka consumption order, each a sequence of ``(key, entry_id)``.

    An entry is out of order when, on the Kafka side, it comes after an entry of the same
    key that the Redis side puts later; it is reported as ``Difference(path=key,
    kind="order", left=entry_id, right=<that later entry id>)``. Entries only one side has,
    and repeats on the Kafka side, are for the delivery comparator, not this one.
    """

    name: str = "ordering"

    def compare(
        self, left: Sequence[tuple[str, str]], right: Sequence[tuple[str, str]]
    ) -> list[Difference]:
        """Out-of-order entries of ``right`` (Kafka) relative to ``left`` (Redis)."""
        ranks: dict[str, dict[str, int]] = {}
        for key, entry_id in left:
            parse_entry_id(entry_id)
            per_key = ranks.setdefault(key, {})
            per_key.setdefault(entry_id, len(per_key))
        latest: dict[str, tuple[int, str]] = {}
        seen: set[tuple[str, str]] = set()
        differences = []
        for key, entry_id in right:
            parse_entry_id(entry_id)
            rank = ranks.get(key, {}).get(entry_id)
            if rank is None or (key, entry_id) in seen:
                continue
            seen.add((key, entry_id))
            previous = latest.get(key)
            if previous is not None and rank < previous[0]:
                differences.append(Difference(key, "order", entry_id, previous[1]))
            else:
                latest[key] = (rank, entry_id)
        return differences


class OrderTracker:
    """Streaming order check: the highest entry id seen per key, in a bounded LRU map.

    A key evicted after ``max_keys`` newer keys is forgotten, so an inversion spanning
    that many other keys goes unseen; that bound keeps memory flat on an endless stream.
    """

    def __init__(self, max_keys: int = 100_000) -> None:
        if max_keys < 1:
            raise ValueError(f"max_keys must be >= 1, got {max_keys}")
        self.max_keys = max_keys
        self._latest: OrderedDict[str, tuple[tuple[int, int], str]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._latest)

    def observe(self, key: str, entry_id: str) -> Difference | None:
        """A ``order`` Difference if ``entry_id`` comes after a later entry of ``key``; a
        repeat of the latest id (a redelivery) is not an inversion."""
        number = parse_entry_id(entry_id)
        previous = self._latest.get(key)
        if previous is None:
            self._latest[key] = (number, entry_id)
            if len(self._latest) > self.max_keys:
                self._latest.popitem(last=False)
            return None
        self._latest.move_to_end(key)
        if number < previous[0]:
            return Difference(key, "order", entry_id, previous[1])
        self._latest[key] = (number, entry_id)
        return None
