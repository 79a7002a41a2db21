"""The latency histograms as the gate compares them: merged below a floor, scored, summarised.

The bucket layouts and their merging live with the evidence (``sidecar.wire.evidence``); this is
the sidecar's side: what a bucket counts for in a test (its score, ln of a typical time in it)
and the effect estimates shown beside a test (ratios of quantiles, and how often a Kafka task
is slower than a Redis one).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.float64]


def below_floor(bounds: Sequence[float], floor_ms: float) -> int:
    """How many buckets end at or below ``floor_ms``: they are counted as one, so that times
    under the floor compare as equal (``GATE_LATENCY_FLOOR_MS``)."""
    return sum(1 for bound in bounds if bound <= floor_ms)


def merge_floor(
    bounds: Sequence[float], counts: Array, floor_ms: float
) -> tuple[tuple[float, ...], Array]:
    """The bounds and counts (buckets on the last axis) with the buckets under the floor as
    one. Which buckets merge depends on the bounds only, never on which path a task took, so a
    test on the merged counts keeps its error rate."""
    merged = below_floor(bounds, floor_ms)
    if merged <= 1:
        return tuple(bounds), counts
    low = counts[..., :merged].sum(axis=-1, keepdims=True)
    return tuple(bounds[merged - 1 :]), np.concatenate([low, counts[..., merged:]], axis=-1)


def scores(bounds: Sequence[float]) -> Array:
    """ln of a bucket's typical time, ms: the geometric middle of its bounds; the first bucket
    is taken to start at half its bound and the open one to end at twice the last bound."""
    edges = np.array([bounds[0] / 2, *bounds, bounds[-1] * 2], dtype=float)
    return np.asarray(np.log(np.sqrt(edges[:-1] * edges[1:])))


def quantile(bounds: Sequence[float], counts: Sequence[float], q: float) -> float | None:
    """Quantile ``q`` interpolated within its bucket, linearly in ln(time) (geometric steps are
    how the buckets are laid out); ``None`` without a sample. The open bucket reports its bound."""
    total = float(sum(counts))
    if total <= 0:
        return None
    rank, seen = q * total, 0.0
    for index, n in enumerate(counts):
        if n and seen + n >= rank:
            if index >= len(bounds):
                return float(bounds[-1])
            upper = bounds[index]
            lower = bounds[index - 1] if index else upper / 2
            part = (rank - seen) / n
            return math.exp(math.log(lower) + part * (math.log(upper) - math.log(lower)))
        seen += n
    return float(bounds[-1])


def slower_probability(kafka: Sequence[float], redis: Sequence[float]) -> float | None:
    """The chance that a Kafka task takes longer than a Redis one (0.5: neither path slower),
    a tie within a bucket counted half; ``None`` when a path has no sample."""
    k, r = np.asarray(kafka, dtype=float), np.asarray(redis, dtype=float)
    if k.sum() <= 0 or r.sum() <= 0:
        return None
    k, r = k / k.sum(), r / r.sum()
    below = np.concatenate([[0.0], np.cumsum(r)[:-1]])
    return float((k * (below + r / 2)).sum())
