"""Non-inferiority: a step is promoted on evidence that the Kafka path is not worse than Redis
by more than a margin, never on the silence of the tests that look for harm.

Three checks (the tests of ``gate_tests`` with a margin), each a time-uniform upper bound on
Kafka's excess over Redis, per Kafka document:

- ``failed``: failed documents, in points (``GATE_FAILED_MARGIN_POINTS``);
- ``processing`` and ``queue_wait``: the log of the ratio of typical (geometric-mean) times,
  from the histograms' buckets under the latency floor merged (``GATE_*_MARGIN_RATIO``).

Drift is taken out minute by minute: each minute compares the Kafka documents' mean with the
Redis documents' mean of that minute (a mix that drifts, a batch of scanned PDFs, moves both
alike), weighted by ``w_t = n_k n_r / (n_k + n_r)``, the inverse of the difference's variance in
units of one document's: ``E = sum_t w_t (mean_k_t - mean_r_t)``, ``W = sum_t w_t`` (the
*effective documents*). At a few documents a minute the split is uneven by chance, and a minute
of 3 Kafka documents beside 1 Redis one weighs 0.75, what its difference tells; weighted by
Kafka's documents it weighed 3, and such minutes added more noise than evidence. ``E`` is a sum
of independent terms of variance ``s^2 W`` (``s^2`` the window's pooled variance of one
document's value), and the normal mixture boundary (Robbins; Howard et al. 2021, eq. (14))
bounds it at every minute at once with probability ``1 - alpha``: ``E <= sqrt(2 (V + rho)
ln(sqrt((V + rho) / rho) / alpha))``. The excess ``E / W`` is below the margin when that bound
is: checked as often as the gate looks, the chance of showing a worse path non-inferior stays
``alpha`` (asymptotically: the variance is estimated, and counts are taken as sub-Gaussian).
``rho`` is set where the boundary is tightest for the margin at hand: about a tenth of the
variance at which it is expected to be shown (``crossing``), so a step whose margin is wide is
shown on a few documents and one whose margin is narrow on the thousands it needs, each near the
least a time-uniform bound allows.

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
from numpy.typing import NDArray

from sidecar.serve import histograms as hist
from sidecar.serve.gate_tests import BY_NAME, COUNTED, MARGIN_TESTS, SAMPLED, margin_of
from sidecar.serve.sequential import Array
from sidecar.wire.evidence import Evidence, histograms

# rho as a fraction of the variance at the expected crossing: (1 + r)(ln(1/alpha) +
# ln((1 + r) / r) / 2), what the boundary costs over a fixed-horizon one, is least near 0.1 for
# the alphas a gate uses (0.001 to 0.05), and flat around it.
RHO_FRACTION: Final = 0.1
# A stratum (the documents compared together) is consecutive minutes until each path has this
# many documents in it. At a few documents a minute a single minute often has none on one path
# (its documents then tell nothing) or one beside several; strata of 3 a path keep ~95 % of the
# evidence at 5 documents a minute where single minutes kept ~80 %, a drift moving both paths
# alike hardly moves while one fills, and at 25 documents a minute or more a stratum is a
# minute, as before. A stratum still filling is left out: its weight would still change, and
# the bound is for a sum of finished terms.
STRATUM_DOCUMENTS: Final = 3


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
    effective: float = 0.0  # W: the documents' weight so far (see the module's docstring)

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


def crossing(variance: Array | float, allowed: Array | float, alpha: float) -> Array:
    """The effective documents ``W`` at which the boundary (tuned by ``rho_for``) reaches
    ``allowed`` per document when the true excess is 0: ``2 s^2 (1 + r)(ln(1/alpha) +
    ln((1 + r)/r)/2) / allowed^2``. About half of healthy rollouts show the margin by then."""
    r = RHO_FRACTION
    cost = (1 + r) * (math.log(1 / alpha) + 0.5 * math.log((1 + r) / r))
    return np.asarray(2 * cost * np.asarray(variance) / np.asarray(allowed) ** 2, dtype=float)


def rho_for(variance: Array | float, allowed: Array | float, alpha: float) -> Array:
    """The boundary's ``rho`` for a margin: ``RHO_FRACTION`` of the variance at its expected
    crossing. It depends on the margin at hand and the pooled variance only, never on the
    excess seen, so the bound keeps its level."""
    v = np.asarray(variance, dtype=float)
    return np.maximum(RHO_FRACTION * v * crossing(v, allowed, alpha), 1e-12)


def mixture_radius(v: Array | float, rho: Array | float, alpha: float) -> tuple[Array, Array]:
    """The normal mixture boundary on a sum of variance ``v``, time-uniform at ``alpha``,
    tightest about ``rho``; and its log term. Arrays broadcast: the calibration bench bounds
    thousands of rollouts at once."""
    rho = np.asarray(rho, dtype=float)
    total = np.asarray(v, dtype=float) + rho
    log_term = np.log(np.sqrt(total / rho) / alpha)
    return np.sqrt(2 * total * log_term), log_term


def weighed(n_k: Array, s_k: Array, n_r: Array, s_r: Array) -> tuple[Array, Array]:
    """Per minute (any leading axes): ``w (mean_k - mean_r)`` and ``w``, 0 in a minute without
    documents on both paths; from the documents and the sums of their values."""
    both = (n_k > 0) & (n_r > 0)
    safe_k, safe_r = np.where(both, n_k, 1.0), np.where(both, n_r, 1.0)
    weight = np.where(both, safe_k * safe_r / (safe_k + safe_r), 0.0)
    return weight * (s_k / safe_k - s_r / safe_r), weight


def strata(n_k: Array, n_r: Array) -> NDArray[np.intp]:
    """Which stratum each minute is in (``STRATUM_DOCUMENTS``), and -1 for the minutes of the
    one still filling; by the documents alone, never by what they tell."""
    out = np.full(len(n_k), -1, dtype=np.intp)
    stratum, k, r, start = 0, 0.0, 0.0, 0
    for i, (a, b) in enumerate(zip(n_k, n_r, strict=True)):
        k, r = k + a, r + b
        if k >= STRATUM_DOCUMENTS and r >= STRATUM_DOCUMENTS:
            out[start : i + 1] = stratum
            stratum, k, r, start = stratum + 1, 0.0, 0.0, i + 1
    return out


def _summed(values: Array, which: NDArray[np.intp]) -> Array:
    whole = which >= 0
    sums = np.bincount(which[whole], weights=values[whole], minlength=int(whole.sum() > 0))
    return np.asarray(sums, dtype=float)


@dataclass(frozen=True)
class _Check:
    name: str
    variance: float  # of one document's value, pooled over the window
    margin: float
    alpha: float


def _bound(check: _Check, n_k: Array, s_k: Array, n_r: Array, s_r: Array) -> MarginResult:
    """Kafka's weighted excess over its own stratum's Redis mean and its mixture bound; per
    minute the documents and the sum of their values, Kafka's then Redis's."""
    name, variance, margin, alpha = check.name, check.variance, check.margin, check.alpha
    which = strata(n_k, n_r)
    n_k, s_k, n_r, s_r = (_summed(np.asarray(a, dtype=float), which) for a in (n_k, s_k, n_r, s_r))
    both = (n_k > 0) & (n_r > 0)
    documents = int(n_k[both].sum())
    if not documents:
        return MarginResult(name, alpha, None, None, margin, 0)
    terms, weights = weighed(n_k, s_k, n_r, s_r)
    excess, effective = float(terms.sum()), float(weights.sum())
    rho = rho_for(variance, margin, alpha)
    radius, _ = mixture_radius(effective * variance, rho, alpha)
    estimate = excess / effective
    upper = float((excess + radius) / effective)
    needed = None
    if upper >= margin and estimate < margin:
        # The weight that would show it were the estimate to stay, found on the boundary
        # itself (it grows a little faster than linearly); Kafka's documents per unit of
        # weight so far turn it into documents.
        wanted = _weight_to_show(variance, margin - estimate, rho, alpha, effective)
        needed = max(math.ceil((wanted - effective) * documents / effective), 1)
    return MarginResult(name, alpha, estimate, upper, margin, documents, needed, effective)


def _weight_to_show(variance: float, gap: float, rho: Array, alpha: float, start: float) -> float:
    """The least weight ``W >= start`` with ``radius(W) / W < gap``: doubling, then bisection."""

    def fits(w: float) -> bool:
        return float(mixture_radius(w * variance, rho, alpha)[0]) / w < gap

    high = max(start, 1.0)
    while not fits(high):
        high *= 2
    low = high / 2
    for _ in range(40):
        mid = (low + high) / 2
        low, high = (low, mid) if fits(mid) else (mid, high)
    return high
