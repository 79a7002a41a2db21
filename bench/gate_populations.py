"""The populations the gate's calibration benches draw from (gate_calibration.py,
watch_calibration.py): processing times, queue waits, and documents, whose tasks share one
path and one fate."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from sidecar.serve.sequential import Array
from sidecar.wire.contract import BUCKETS_MS
from sidecar.wire.evidence import SHARED_BUCKETS_MS

# Per task: failing on its own (the rest of the 4 % are broken documents' tasks), retried.
ALONE, RETRY = 0.03, 0.01
BROKEN = 0.01  # documents that fail every task
DOCUMENT_SPREAD = 0.5  # sigma of a document's own speed factor, e^N(0, sigma)
FLOOR_MS = 1000.0  # GATE_LATENCY_FLOOR_MS's default
DRAWS = 400_000  # samples per population for its bucket probabilities
Sampler = Callable[[np.random.Generator, int], Array]


def lognormal(rng: np.random.Generator, n: int) -> Array:
    tail = rng.random(n) < 0.05
    return np.where(
        tail, rng.lognormal(math.log(300_000), 0.7, n), rng.lognormal(math.log(20_000), 1.0, n)
    )


def heavy(rng: np.random.Generator, n: int) -> Array:
    pareto = np.minimum(30_000 * (1 + rng.pareto(1.2, n)), 10_800_000)
    return np.where(rng.random(n) < 0.15, pareto, rng.lognormal(math.log(8_000), 0.8, n))


def near_bounds(rng: np.random.Generator, n: int) -> Array:
    bounds = np.array([b for b in BUCKETS_MS if 1000 <= b <= 3_600_000])
    return rng.choice(bounds, n) * np.exp(rng.normal(0, 0.003, n))


def queue_wait(rng: np.random.Generator, n: int) -> Array:
    return rng.lognormal(math.log(3000), 1.5, n)


# Per population: its sampler, its bucket layout, and the spread of a document's own factor
# (none for bounds: a document's tasks all near one bound, so that its sample stays there).
POPULATIONS: dict[str, tuple[Sampler, tuple[float, ...], float]] = {
    "lognormal": (lognormal, BUCKETS_MS, DOCUMENT_SPREAD),
    "heavy": (heavy, BUCKETS_MS, DOCUMENT_SPREAD),
    "bounds": (near_bounds, BUCKETS_MS, 0.0),
    "legacy": (lognormal, SHARED_BUCKETS_MS, DOCUMENT_SPREAD),
}


def bucket_probabilities(
    rng: np.random.Generator,
    sampler: Sampler,
    bounds: tuple[float, ...],
    factor: float = 1.0,
    spread: float = 0.0,
) -> Array:
    """Each bucket's probability (the open one last), as Recorder files a time (bisect_left),
    of a document's sample: a task's time times the document's own factor e^N(0, spread)."""
    times = sampler(rng, DRAWS) * factor * np.exp(rng.normal(0, spread, DRAWS))
    index = np.searchsorted(np.array(bounds), times, side="left")
    return np.bincount(index, minlength=len(bounds) + 1) / DRAWS


def document_sizes(rng: np.random.Generator, mean: float, n: int) -> Array:
    """Tasks a document: geometric from 1, ``mean`` on average."""
    return np.asarray(rng.geometric(1 / mean, n), dtype=float)


def document_failure(rng: np.random.Generator, alone: float, mean: float) -> float:
    """The chance that a document has a failed task: broken, or one of its tasks failing on
    its own (each ``alone``)."""
    sizes = document_sizes(rng, mean, DRAWS)
    return float(BROKEN + (1 - BROKEN) * (1 - np.mean((1 - alone) ** sizes)))


def task_failure(alone: float) -> float:
    """The share of tasks that fail: a broken document's (about ``BROKEN`` of tasks) and the
    others' own."""
    return BROKEN + (1 - BROKEN) * alone


def percentiles(values: Array) -> str:
    if values.size == 0:
        return "-"
    p50, p95 = np.percentile(values, [50, 95])
    return f"{p50:,.0f} / {p95:,.0f}"
