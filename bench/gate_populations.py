"""The populations the gate's calibration benches draw from (gate_calibration.py,
watch_calibration.py): processing times, queue waits, and documents, whose tasks share one
path and one fate."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

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


@dataclass(frozen=True)
class RolloutPopulation:
    """A site as bench/gate_defaults.py's whole rollouts draw it: per document a task count,
    a fate, a processing time and a queue wait; per minute the load, the drift and the batches.

    ``covariate`` is the slope of ln(processing time) on ln(task count): a document of more
    tasks (more page ranges, in RAGFlow) takes longer, and that part of the spread is known
    when the document is enqueued. ``processing_sigma`` is the total spread, the covariate's
    part included, so two populations of one total spread differ only in what it explains."""

    name: str
    size_power: float  # P(k tasks) ~ k^-power, k in 1..60
    broken: float  # documents that fail whatever their size
    alone: float  # each task failing on its own
    processing_ms: float  # median processing time of a document of typical size
    processing_sigma: float  # total spread of ln(processing time)
    covariate: float  # slope of ln(processing time) on ln(tasks)
    queue_ms: float
    queue_sigma: float
    swing: float  # daily swing of the load, +- fraction
    drift: tuple[float, float]  # hourly drift amplitude: failures and processing, queue wait
    batches_a_day: float  # scanned-PDF batches
    batch_min: tuple[int, int]  # their length, minutes (inclusive)
    batch_factors: tuple[float, float, float]  # processing, queue wait, failures, in a batch
    crashes_a_min: float  # executor crashes handing tasks back at once
    crash_tasks: int  # 1 to this many tasks a crash
    retry_alone: float  # tasks retried on their own

    @property
    def sizes(self) -> tuple[Array, Array]:
        sizes = np.arange(1, 61, dtype=float)
        p = sizes**-self.size_power
        return sizes, p / p.sum()

    def failure_of(self, sizes: Array) -> Array:
        """A document's chance to fail, by its task count: broken, or a task failing alone."""
        return self.broken + (1 - self.broken) * (1 - (1 - self.alone) ** sizes)

    def document_failure(self) -> float:
        sizes, p = self.sizes
        return float((p * self.failure_of(sizes)).sum())

    def log_size_spread(self) -> tuple[float, float]:
        """Mean and variance of ln(tasks) over documents."""
        sizes, p = self.sizes
        mean = float((p * np.log(sizes)).sum())
        return mean, float((p * (np.log(sizes) - mean) ** 2).sum())

    @property
    def residual_sigma(self) -> float:
        """The spread of ln(processing time) that the task count leaves unexplained."""
        _, var = self.log_size_spread()
        return math.sqrt(max(self.processing_sigma**2 - self.covariate**2 * var, 0.01))

    def explained(self) -> float:
        """The share of ln(processing time)'s variance the task count explains."""
        return 1 - self.residual_sigma**2 / self.processing_sigma**2


# What the gate's defaults were tuned on (issue 36's first commits, bench/gate_defaults.py as
# it was): no covariate, the processing spread all unexplained. Kept to reproduce those numbers.
TUNED = RolloutPopulation(
    name="tuned",
    size_power=1.6,
    broken=0.01,
    alone=0.006,
    processing_ms=20_000.0,
    processing_sigma=1.1,
    covariate=0.0,
    queue_ms=3_000.0,
    queue_sigma=1.5,
    swing=0.3,
    drift=(0.4, 0.6),
    batches_a_day=4.0,
    batch_min=(30, 90),
    batch_factors=(3.0, 4.0, 2.0),
    crashes_a_min=0.2,
    crash_tasks=5,
    retry_alone=0.002,
)

# Held out: every parameter moved from what the gate was tuned on, and a document's task
# count explaining part of its processing time (time ~ tasks^0.7, about 44 % of the
# variance), as RAGFlow's page ranges do. Larger documents, a wider spread, stronger drift,
# more and longer batches, more crashes of more tasks.
HELD_OUT = RolloutPopulation(
    name="held-out",
    size_power=1.4,
    broken=0.008,
    alone=0.004,
    processing_ms=30_000.0,
    processing_sigma=1.25,
    covariate=0.7,
    queue_ms=5_000.0,
    queue_sigma=1.7,
    swing=0.4,
    drift=(0.5, 0.7),
    batches_a_day=6.0,
    batch_min=(20, 120),
    batch_factors=(2.5, 5.0, 2.5),
    crashes_a_min=0.3,
    crash_tasks=8,
    retry_alone=0.003,
)

ROLLOUT_POPULATIONS = {p.name: p for p in (TUNED, HELD_OUT)}
