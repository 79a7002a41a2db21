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
    """Streaming order check: the highest entry id seen per key, in a bounded LRU map, and
    the entries seen below it, in a bounded FIFO.

    A record written twice (the mirror re-sends what Kafka did not confirm, a consumer reads
    again from its last commit) comes after later entries of its key by nature: a copy of an
    entry seen before is given its first copy's verdict, so it is never a new inversion, as
    :class:`OrderingComparator` ignores repeats. An entry below the latest that was never
    seen is a real inversion.

    A key evicted after ``max_keys`` newer keys is forgotten, so an inversion spanning that
    many other keys goes unseen. The entries of every key remembered below its latest are at
    most ``max_ids``; past them, an entry at or below the highest forgotten one of its key
    gets no verdict (a copy and a late entry cannot be told apart there, and a false
    ``order`` is worse than a missed one). Both bounds keep memory flat on an endless stream;
    a key with one entry (most parse tasks) costs nothing in the FIFO.
    """

    def __init__(self, max_keys: int = 100_000, max_ids: int = 100_000) -> None:
        if max_keys < 1:
            raise ValueError(f"max_keys must be >= 1, got {max_keys}")
        if max_ids < 1:
            raise ValueError(f"max_ids must be >= 1, got {max_ids}")
        self.max_keys = max_keys
        self.max_ids = max_ids
        # key -> (latest number, latest id, highest number forgotten from _earlier or None)
        self._latest: OrderedDict[str, tuple[tuple[int, int], str, tuple[int, int] | None]] = (
            OrderedDict()
        )
        # (key, entry id) seen below its key's latest -> (number, the later id it came after,
        # or None where it came in order)
        self._earlier: OrderedDict[tuple[str, str], tuple[tuple[int, int], str | None]] = (
            OrderedDict()
        )

    def __len__(self) -> int:
        return len(self._latest)

    def observe(self, key: str, entry_id: str) -> Difference | None:
        """A ``order`` Difference if ``entry_id`` comes after a later entry of ``key``; a copy
        of an entry seen before (a redelivery, a re-send) has its first copy's verdict."""
        number = parse_entry_id(entry_id)
        state = self._latest.get(key)
        if state is None:
            self._latest[key] = (number, entry_id, None)
            if len(self._latest) > self.max_keys:
                self._latest.popitem(last=False)
            return None
        self._latest.move_to_end(key)
        latest, latest_id, floor = state
        if number > latest:
            self._latest[key] = (number, entry_id, floor)
            self._remember(key, latest_id, latest, None)
            return None
        if number == latest:
            return None
        known = self._earlier.get((key, entry_id))
        if known is not None:
            after = known[1]
            return None if after is None else Difference(key, "order", entry_id, after)
        if floor is not None and number <= floor:
            return None
        self._remember(key, entry_id, number, latest_id)
        return Difference(key, "order", entry_id, latest_id)

    def _remember(
        self, key: str, entry_id: str, number: tuple[int, int], after: str | None
    ) -> None:
        self._earlier[key, entry_id] = (number, after)
        while len(self._earlier) > self.max_ids:
            (old_key, _), (old_number, _) = self._earlier.popitem(last=False)
            state = self._latest.get(old_key)
            if state is not None and (state[2] is None or state[2] < old_number):
                # Assigning an existing key keeps its place in the LRU order.
                self._latest[old_key] = (state[0], state[1], old_number)
