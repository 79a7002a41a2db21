"""Per-path evidence of the served share: counts and latency histograms, per minute, in Valkey.

RAGFlow's API server and executors record what their queue calls see (``Recorder``, cheap and
thread-safe, flushed every few seconds in one pipeline); the sidecar's ``gate`` and metrics
read a window back (``Evidence``). Minute buckets make any window up to two days answerable
without a time-series database; the ``total`` hash gives monotonic counters for Prometheus.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Final

from sidecar.wire.contract import (
    BUCKETS_MS,
    DOCUMENT_TTL_S,
    EVIDENCE_TTL_S,
    Event,
    Keys,
    Latency,
    bucket_field,
    count_field,
    sum_field,
)


@dataclass(frozen=True)
class First:
    """A task's event that counts for its document only if it is the document's first of that
    event on its path: decided in the state store when written (``write``)."""

    path: str
    event: str  # a task event: started, finished, failed
    document: str
    latency: str | None = None  # the document latency it is a sample of, with ``ms``
    ms: float = 0.0


@dataclass
class Pending:
    """What a recorder holds for one write, by minute: counts, and documents' first events."""

    counts: dict[int, Counter[str]] = field(default_factory=dict)
    firsts: dict[int, list[First]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.counts or self.firsts)


class Recorder:
    """Accumulates counts in memory; ``drain()`` hands them over for one write."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[int, Counter[str]] = {}
        self._firsts: dict[int, list[First]] = {}

    def count(self, path: str, event: Event, n: int = 1, at_s: float | None = None) -> None:
        with self._lock:
            self._minute(at_s)[count_field(path, event)] += n

    def observe(self, path: str, latency: Latency, ms: float, at_s: float | None = None) -> None:
        index = bisect.bisect_left(BUCKETS_MS, ms)
        with self._lock:
            counts = self._minute(at_s)
            counts[bucket_field(path, latency, index)] += 1
            counts[sum_field(path, latency)] += max(int(ms), 0)

    def first(
        self,
        path: str,
        event: str,
        document: str,
        *,
        latency: str | None = None,
        ms: float = 0.0,
        at_s: float | None = None,
    ) -> None:
        """A task's ``event`` (started, finished, failed) for its ``document``: counted as
        ``document_<event>``, and ``ms`` as a sample of ``document_<latency>``, if it is the
        document's first such event on ``path``."""
        with self._lock:
            minute = _minute_of(at_s)
            self._firsts.setdefault(minute, []).append(First(path, event, document, latency, ms))

    def _minute(self, at_s: float | None) -> Counter[str]:
        minute = _minute_of(at_s)
        counts = self._pending.get(minute)
        if counts is None:
            counts = self._pending[minute] = Counter()
        return counts

    def drain(self) -> Pending:
        """What was recorded since the last drain; the recorder starts empty."""
        with self._lock:
            pending = Pending(self._pending, self._firsts)
            self._pending, self._firsts = {}, {}
        return pending

    def restore(self, pending: Pending) -> None:
        """Put back a drained batch whose write failed, so the next flush carries it."""
        with self._lock:
            for minute, counts in pending.counts.items():
                self._pending.setdefault(minute, Counter()).update(counts)
            for minute, firsts in pending.firsts.items():
                self._firsts.setdefault(minute, []).extend(firsts)


def _minute_of(at_s: float | None) -> int:
    return int((time.time() if at_s is None else at_s) // 60)


# KEYS: the minute's hash, the totals' hash, then one document key per first event. ARGV: the
# documents' TTL, the minute's TTL, then per first event its field in the document's hash and
# the fields it adds to (its count; its bucket and sum or two empty strings) and its ms. A
# document's first events and the counts they add are written together or not at all.
_FIRSTS_SCRIPT: Final = """
local counted = 0
for i = 3, #KEYS do
  local a = 3 + (i - 3) * 5
  if redis.call('HSETNX', KEYS[i], ARGV[a], '1') == 1 then
    redis.call('EXPIRE', KEYS[i], ARGV[1])
    counted = counted + 1
    for _, key in ipairs({KEYS[1], KEYS[2]}) do
      redis.call('HINCRBY', key, ARGV[a + 1], 1)
      if ARGV[a + 2] ~= '' then
        redis.call('HINCRBY', key, ARGV[a + 2], 1)
        redis.call('HINCRBY', key, ARGV[a + 3], ARGV[a + 4])
      end
    end
  end
end
if counted > 0 then
  redis.call('EXPIRE', KEYS[1], ARGV[2])
end
return counted
"""


def write(pipe: object, keys: Keys, pending: Pending) -> None:
    """Queue the writes of ``pending`` on a valkey pipeline (sync or async alike)."""
    for minute, counts in pending.counts.items():
        key = keys.evidence(minute)
        for name, n in counts.items():
            pipe.hincrby(key, name, n)  # type: ignore[attr-defined]
            pipe.hincrby(keys.evidence_total, name, n)  # type: ignore[attr-defined]
        pipe.expire(key, EVIDENCE_TTL_S)  # type: ignore[attr-defined]
    for minute, firsts in pending.firsts.items():
        documents, args = [], []
        for first in firsts:
            documents.append(keys.document(first.document))
            args += [
                f"{first.path}:{first.event}",
                count_field(first.path, f"document_{first.event}"),
            ]
            if first.latency is None:
                args += ["", "", "0"]
            else:
                latency = f"document_{first.latency}"
                index = bisect.bisect_left(BUCKETS_MS, first.ms)
                args += [
                    bucket_field(first.path, latency, index),
                    sum_field(first.path, latency),
                    str(max(int(first.ms), 0)),
                ]
        pipe.eval(  # type: ignore[attr-defined]
            _FIRSTS_SCRIPT,
            2 + len(documents),
            keys.evidence(minute),
            keys.evidence_total,
            *documents,
            DOCUMENT_TTL_S,
            EVIDENCE_TTL_S,
            *args,
        )
