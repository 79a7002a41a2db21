"""Per-path evidence of the served share: counts and latency histograms, per minute, in Valkey.

RAGFlow's API server and executors record what their queue calls see (``Recorder``, cheap and
thread-safe, flushed every few seconds in one pipeline); the sidecar's ``gate`` and metrics
read a window back (``sidecar.wire.evidence``). Minute buckets make any window up to two days
answerable without a time-series database; the ``total`` hash gives monotonic counters for
Prometheus.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Final

from sidecar.wire.contract import (
    ATTRIBUTION_MINUTES,
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
class DocumentEvent:
    """An event of a document on its path, filed under the minute the document started there
    (``ATTRIBUTION_MINUTES``). A first event (started, finished, failed: ``once``) counts as
    ``document_<event>`` only if it is the document's first such event on its path, decided in
    the state store when written (``write``); a task event (retried) counts every time."""

    path: str
    event: str
    document: str
    latency: str | None = None  # the document latency it is a sample of, with ``ms``
    ms: float = 0.0
    once: bool = True

    def fields(self) -> tuple[str, str, str]:
        """The document's field that makes it count once ('' for every time), the field that
        holds the minute it started on its path, and the count it adds to."""
        start = f"{self.path}:started"
        if not self.once:
            return "", start, count_field(self.path, self.event)
        return f"{self.path}:{self.event}", start, count_field(self.path, f"document_{self.event}")


@dataclass
class Pending:
    """What a recorder holds for one write, by minute: counts, and documents' events."""

    counts: dict[int, Counter[str]] = field(default_factory=dict)
    documents: dict[int, list[DocumentEvent]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.counts or self.documents)


class Recorder:
    """Accumulates counts in memory; ``drain()`` hands them over for one write."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[int, Counter[str]] = {}
        self._documents: dict[int, list[DocumentEvent]] = {}

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
        document's first such event on ``path``; finished and failed under the minute the
        document started on ``path``."""
        self._document(DocumentEvent(path, event, document, latency, ms), at_s)

    def of_document(
        self, path: str, event: Event, document: str, at_s: float | None = None
    ) -> None:
        """A task's ``event`` (retried) counted under the minute its document started on
        ``path``, every time."""
        self._document(DocumentEvent(path, event, document, once=False), at_s)

    def _document(self, event: DocumentEvent, at_s: float | None) -> None:
        with self._lock:
            self._documents.setdefault(_minute_of(at_s), []).append(event)

    def _minute(self, at_s: float | None) -> Counter[str]:
        minute = _minute_of(at_s)
        counts = self._pending.get(minute)
        if counts is None:
            counts = self._pending[minute] = Counter()
        return counts

    def drain(self) -> Pending:
        """What was recorded since the last drain; the recorder starts empty."""
        with self._lock:
            pending = Pending(self._pending, self._documents)
            self._pending, self._documents = {}, {}
        return pending

    def restore(self, pending: Pending) -> None:
        """Put back a drained batch whose write failed, so the next flush carries it."""
        with self._lock:
            for minute, counts in pending.counts.items():
                self._pending.setdefault(minute, Counter()).update(counts)
            for minute, events in pending.documents.items():
                self._documents.setdefault(minute, []).extend(events)


def _minute_of(at_s: float | None) -> int:
    return int((time.time() if at_s is None else at_s) // 60)


# KEYS: the minute's hash, the totals' hash, then one document key per event. ARGV: the
# documents' TTL, the minutes' TTL, the minute keys' prefix, the minute, the oldest minute an
# event may be filed under, then per event its once-field ('' to count every time), the field
# holding the minute its document started on its path, the fields it adds to (its count; its
# bucket and sum or two empty strings) and its ms. A document's start is stored as its minute;
# an older build stored '1', which is outside any horizon. Evidence keys are named by the
# script (a standalone state store, as RAGFlow's is; not a cluster's hash slots).
_DOCUMENTS_SCRIPT: Final = """
local now, oldest = tonumber(ARGV[4]), tonumber(ARGV[5])
local counted = 0
for i = 3, #KEYS do
  local a = 6 + (i - 3) * 6
  local once, start = ARGV[a], ARGV[a + 1]
  local fresh = true
  if once ~= '' then
    local value = '1'
    if once == start then value = ARGV[4] end
    fresh = redis.call('HSETNX', KEYS[i], once, value) == 1
    if fresh then redis.call('EXPIRE', KEYS[i], ARGV[1]) end
  end
  if fresh then
    counted = counted + 1
    local minute = KEYS[1]
    if once ~= start then
      local began = tonumber(redis.call('HGET', KEYS[i], start))
      if began and began < now and began >= oldest then
        minute = ARGV[3] .. began
        redis.call('EXPIRE', minute, ARGV[2])
      end
    end
    for _, key in ipairs({minute, KEYS[2]}) do
      redis.call('HINCRBY', key, ARGV[a + 2], 1)
      if ARGV[a + 3] ~= '' then
        redis.call('HINCRBY', key, ARGV[a + 3], 1)
        redis.call('HINCRBY', key, ARGV[a + 4], ARGV[a + 5])
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
    for minute, events in pending.documents.items():
        documents: list[str] = []
        args: list[str] = []
        for event in events:
            documents.append(keys.document(event.document))
            args += event.fields()
            if event.latency is None:
                args += ["", "", "0"]
            else:
                latency = f"document_{event.latency}"
                index = bisect.bisect_left(BUCKETS_MS, event.ms)
                args += [
                    bucket_field(event.path, latency, index),
                    sum_field(event.path, latency),
                    str(max(int(event.ms), 0)),
                ]
        pipe.eval(  # type: ignore[attr-defined]
            _DOCUMENTS_SCRIPT,
            2 + len(documents),
            keys.evidence(minute),
            keys.evidence_total,
            *documents,
            DOCUMENT_TTL_S,
            EVIDENCE_TTL_S,
            keys.evidence_minute,
            minute,
            minute - ATTRIBUTION_MINUTES,
            *args,
        )
