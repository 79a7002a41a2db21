"""Non-inferiority: a step is promoted on evidence that the Kafka path is not worse than Redis
by more than a margin, never on the silence of the tests that look for harm.

Three checks (the tests of ``gate_tests`` with a margin), each a time-uniform upper bound on
Kafka's excess over Redis, per Kafka document:

- ``failed``: failed documents, in points (``GATE_FAILED_MARGIN_POINTS``);
- ``processing`` and ``queue_wait``: the log of the ratio of typical (geometric-mean) times,
  from the histograms' buckets under the latency floor merged (``GATE_*_MARGIN_RATIO``).

Drift is taken out minute by minute: each Kafka document is compared with the Redis documents
of its own minute, ``E = sum_t (sum of Kafka's values_t - n_kafka_t * Redis's mean_t)`` over
the minutes both paths had documents in (a mix that drifts, a batch of scanned PDFs, moves both
alike). ``E`` is a sum of independent terms whose variance grows by ``s^2 n_k (1 + n_k / n_r)``
a minute (``s^2`` the window's pooled variance of one document's value), and the normal
mixture boundary (Robbins; Howard et al. 2021, eq. (14)) bounds it at every minute at once with
probability ``1 - alpha``: ``E <= sqrt(2 (V + rho) ln(sqrt((V + rho) / rho) / alpha))``. The
excess per document ``E / N`` is below the margin when that bound is: checked as often as the
gate looks, the chance of showing a worse path non-inferior stays ``alpha`` (asymptotically:
the variance is estimated, and counts are taken as sub-Gaussian).

The margin is the harm the next step may do to *all* documents: the allowed excess is the
margin divided by the next step's share (``margin_at``), so a small step is promoted on little
evidence and 100 % only on the full margin. A regression of twice the margin is held at the
step whose next share makes the allowed excess smaller than it, and the tests of
``gate_stats`` roll it back once they see it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from sidecar.serve import histograms as hist
from sidecar.serve.gate_tests import BY_NAME, COUNTED, MARGIN_TESTS, SAMPLED, margin_of
from sidecar.serve.sequential import Array
from sidecar.wire.evidence import Evidence, histograms

# The boundary is tightest about this many Kafka documents' worth of variance.
RHO_DOCUMENTS: Final = 500.0


@dataclass(frozen=True)
class MarginResult:
    """One check: Kafka's excess per document, its upper bound and the margin it must be
    under at the next step's share."""

    name: str  # one of MARGIN_TESTS
    alpha: float
    estimate: float | None  # excess per Kafka document (a fraction, or a log ratio)
    upper: float | None  # its time-uniform upper bound; None before any comparable minute
    margin: float  # the excess allowed at the next share (same unit)
    documents: int  # Kafka documents compared (in minutes with Redis documents too)
    needed: int | None = None  # Kafka documents more that would show it, if it can be shown

    @property
    def shown(self) -> bool:
        return self.upper is not None and self.upper < self.margin

    def shown_as(self, value: float | None) -> str:
        """A value of this check for people: points, or a ratio."""
        if value is None:
            return "-"
        if margin_of(self.name).unit == "points":
            return f"{100 * value:+.2f} pp"
        return f"x{math.exp(value):.2f}"


def margin_at(name: str, margin: float, next_share: float) -> float:
    """The excess per Kafka document allowed when the next step serves ``next_share`` (0-1]:
    ``margin`` (points for failures, a ratio for times) is what it may cost all documents."""
    share = min(max(next_share, 1e-6), 1.0)
    if margin_of(name).unit == "points":
        return margin / 100 / share
    return math.log1p((margin - 1.0) / share)


def run_margins(
    minutes: Sequence[Evidence],
    margins: dict[str, float],
    next_share: float,
    alpha: float,
    floor_ms: float,
) -> list[MarginResult]:
    """The checks over the window's minutes (in time order), one a test with a margin
    (``MARGIN_TESTS``); ``alpha`` is each one's."""
    results = []
    for name in MARGIN_TESTS:
        margin = margin_at(name, margins[name], next_share)
        if BY_NAME[name].sampled is None:
            results.append(_rate(name, minutes, margin, alpha))
        else:
            results.append(_latency(name, minutes, margin, alpha, floor_ms))
    return results


def _rate(name: str, minutes: Sequence[Evidence], margin: float, alpha: float) -> MarginResult:
    test = BY_NAME[name]
    table = np.array(
        [
            [value for path in ("kafka", "redis") for value in
             (sum(m[path][e] for e in test.exposures), m[path][COUNTED[name]])]
            for m in minutes
        ],
        dtype=float,
    ).reshape(-1, 4)  # fmt: skip
    n_k, x_k, n_r, x_r = table.T
    x_k, x_r = np.minimum(x_k, n_k), np.minimum(x_r, n_r)
    both = (n_k > 0) & (n_r > 0)
    pooled = (x_k[both].sum() + x_r[both].sum() + 1) / (n_k[both].sum() + n_r[both].sum() + 2)
    variance = pooled * (1 - pooled)
    return _bound(_Check(name, variance, margin, alpha), n_k, x_k, n_r, x_r)


def _latency(
    name: str, minutes: Sequence[Evidence], margin: float, alpha: float, floor_ms: float
) -> MarginResult:
    rows: list[tuple[float, float, float, float]] = []
    squares = [0.0, 0.0]  # sum of scores and of their squares, both paths, for the variance
    for minute in minutes:
        bounds, pair = histograms([minute["kafka"], minute["redis"]], SAMPLED[name])
        if not sum(map(sum, pair)):
            continue
        merged, counts = hist.merge_floor(bounds, np.array(pair, dtype=float), floor_ms)
        scores = hist.scores(merged)
        k, r = counts
        rows.append((k.sum(), float(k @ scores), r.sum(), float(r @ scores)))
        squares[0] += float((k + r) @ scores)
        squares[1] += float((k + r) @ scores**2)
    if not rows:
        return MarginResult(name, alpha, None, None, margin, 0)
    n_k, s_k, n_r, s_r = np.array(rows, dtype=float).T
    total = n_k.sum() + n_r.sum()
    mean = squares[0] / total
    # A floor: a window whose times all fall in one bucket still varies within it.
    variance = max(squares[1] / total - mean**2, 0.01)
    return _bound(_Check(name, variance, margin, alpha), n_k, s_k, n_r, s_r)


def mixture_radius(v: Array | float, variance: Array | float, alpha: float) -> tuple[Array, Array]:
    """The normal mixture boundary on a sum of variance ``v`` (time-uniform at ``alpha``),
    tightest about ``RHO_DOCUMENTS`` documents of ``variance`` each; and its log term.
    Arrays broadcast: the calibration bench bounds thousands of rollouts at once."""
    rho = RHO_DOCUMENTS * np.asarray(variance, dtype=float)
    total = np.asarray(v, dtype=float) + rho
    log_term = np.log(np.sqrt(total / rho) / alpha)
    return np.sqrt(2 * total * log_term), log_term


@dataclass(frozen=True)
class _Check:
    name: str
    variance: float  # of one document's value, pooled over the window
    margin: float
    alpha: float


def _bound(check: _Check, n_k: Array, s_k: Array, n_r: Array, s_r: Array) -> MarginResult:
    """Kafka's excess over its own minute's Redis mean, summed, and its mixture bound; per
    minute the documents and the sum of their values, Kafka's then Redis's."""
    name, variance, margin, alpha = check.name, check.variance, check.margin, check.alpha
    both = (n_k > 0) & (n_r > 0)
    documents = int(n_k[both].sum())
    if not documents:
        return MarginResult(name, alpha, None, None, margin, 0)
    n_k, s_k, n_r, s_r = n_k[both], s_k[both], n_r[both], s_r[both]
    excess = float((s_k - n_k * s_r / n_r).sum())
    spent = float((n_k * (1 + n_k / n_r)).sum())  # V / s^2
    radius, log_term = mixture_radius(spent * variance, variance, alpha)
    estimate = excess / documents
    upper = float((excess + radius) / documents)
    needed = None
    if upper >= margin and estimate < margin:
        # The radius per document shrinks as 1/sqrt(N): the N at which it fits the gap left.
        per_document = spent / documents
        wanted = 2 * per_document * variance * float(log_term) / (margin - estimate) ** 2
        needed = max(math.ceil(wanted - documents), 1)
    return MarginResult(name, alpha, estimate, upper, margin, documents, needed)
