"""The served evidence as the gate and the metrics read it back: per-path counts and latency
histograms, merged from the minute hashes RAGFlow's processes write (``ragflow_mq.recorder``).
Changing how a field is named or bucketed is changing a wire format (``contract``)."""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from sidecar.wire.contract import (
    BUCKET_FIELD,
    BUCKETS_MS,
    LEGACY_BUCKET_FIELD,
    LEGACY_BUCKETS_MS,
    PATHS,
    Keys,
)


def window_keys(keys: Keys, since_s: float, until_s: float) -> list[str]:
    """The minute keys covering ``[since_s, until_s]``."""
    return [keys.evidence(m) for m in range(int(since_s // 60), int(until_s // 60) + 1)]


# The bounds both histogram layouts share: a window holding fields of both compares on these.
SHARED_BUCKETS_MS: Final = tuple(bound for bound in LEGACY_BUCKETS_MS if bound in BUCKETS_MS)
_LAYOUTS: Final = {BUCKET_FIELD: BUCKETS_MS, LEGACY_BUCKET_FIELD: LEGACY_BUCKETS_MS}


@dataclass
class PathEvidence:
    """One path's counts and latency histograms over a window."""

    counts: Counter[str] = field(default_factory=Counter)
    # Per latency, then per layout (its field prefix): counts per bucket, the open one last.
    buckets: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    sums_ms: Counter[str] = field(default_factory=Counter)

    def __getitem__(self, event: str) -> int:
        return self.counts[event]

    def failure_rate(self) -> float | None:
        """Failed over finished, or ``None`` before anything finished."""
        finished = self.counts["finished"]
        return self.counts["failed"] / finished if finished else None

    def samples(self, latency: str) -> int:
        return sum(sum(counts) for counts in self.buckets.get(latency, {}).values())

    def histogram(self, latency: str) -> tuple[tuple[float, ...], list[int]]:
        """Upper bounds and counts (the open bucket last) on one layout: see ``histograms``."""
        bounds, [counts] = histograms([self], latency)
        return bounds, counts

    def quantile_ms(self, latency: str, q: float) -> float | None:
        """The upper bound of the bucket holding quantile ``q`` (the open bucket reports the
        last bound), or ``None`` with no sample."""
        bounds, counts = self.histogram(latency)
        total = sum(counts)
        if total == 0:
            return None
        rank = q * total
        seen = 0
        for index, n in enumerate(counts):
            seen += n
            if seen >= rank and n:
                return float(bounds[min(index, len(bounds) - 1)])
        return float(bounds[-1])


def histograms(
    paths: Sequence[PathEvidence], latency: str
) -> tuple[tuple[float, ...], list[list[int]]]:
    """The paths' histograms of ``latency`` on one layout, so that they compare bucket by
    bucket: ``BUCKETS_MS``, or ``SHARED_BUCKETS_MS`` when any holds fields an older build wrote
    (each bucket of either layout lies within one bucket of the shared bounds)."""
    legacy = any(LEGACY_BUCKET_FIELD in path.buckets.get(latency, {}) for path in paths)
    bounds = SHARED_BUCKETS_MS if legacy else BUCKETS_MS
    merged = []
    for path in paths:
        counts = [0] * (len(bounds) + 1)
        for prefix, layout_counts in path.buckets.get(latency, {}).items():
            layout = _LAYOUTS[prefix]
            for index, n in enumerate(layout_counts):
                # The open bucket (index len(layout)) stays open; bisect_left as Recorder.
                upper = layout[index] if index < len(layout) else math.inf
                counts[bisect.bisect_left(bounds, upper)] += n
        merged.append(counts)
    return bounds, merged


@dataclass
class Evidence:
    """Both paths over a window, merged from the minute hashes that cover it."""

    paths: dict[str, PathEvidence]

    @classmethod
    def from_hashes(cls, hashes: Iterable[Mapping[str | bytes, str | bytes] | None]) -> Evidence:
        paths: dict[str, PathEvidence] = {path: PathEvidence() for path in PATHS}
        for fields in hashes:
            for raw_name, raw_value in (fields or {}).items():
                name = raw_name.decode() if isinstance(raw_name, bytes) else raw_name
                path, _, rest = name.partition(":")
                evidence = paths.get(path)
                if evidence is None:
                    continue
                value = int(raw_value)
                latency, _, part = rest.partition(":")
                if not part:
                    evidence.counts[rest] += value
                elif part == "sum_ms":
                    evidence.sums_ms[latency] += value
                elif bucket := _bucket(part):
                    prefix, index = bucket
                    layouts = evidence.buckets.setdefault(latency, {})
                    counts = layouts.setdefault(prefix, [0] * (len(_LAYOUTS[prefix]) + 1))
                    counts[index] += value
        return cls(paths)

    @classmethod
    def from_minutes(cls, minutes: Iterable[Evidence]) -> Evidence:
        """The minutes (each read on its own, for the gate's tests) as one window."""
        paths: dict[str, PathEvidence] = {path: PathEvidence() for path in PATHS}
        for minute in minutes:
            for path, part in minute.paths.items():
                window = paths[path]
                window.counts.update(part.counts)
                window.sums_ms.update(part.sums_ms)
                for latency, layouts in part.buckets.items():
                    for prefix, counts in layouts.items():
                        into = window.buckets.setdefault(latency, {}).setdefault(
                            prefix, [0] * len(counts)
                        )
                        for index, n in enumerate(counts):
                            into[index] += n
        return cls(paths)

    def __getitem__(self, path: str) -> PathEvidence:
        return self.paths[path]


def _bucket(part: str) -> tuple[str, int] | None:
    """``v2b7`` → (``v2b``, 7); ``None`` for a layout or an index this build does not know."""
    prefix = part.rstrip("0123456789")
    digits = part[len(prefix) :]
    layout = _LAYOUTS.get(prefix)
    if layout is None or not digits or int(digits) > len(layout):
        return None
    return prefix, int(digits)
