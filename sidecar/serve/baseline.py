"""The watch at 100 %: the Kafka path against a baseline of how the Redis path ran before.

Once the served share is 100 %, every minute is all Kafka: the tests of ``gate_stats``, which
condition on each minute's split between the paths, gain nothing, and a regression that starts
then would go unseen. The baseline is the Redis path's evidence over a window before the share
got there (the autopilot takes the rollout's start until the step that reached 100 % began;
``gate --baseline``, the operator's), and the same five questions are asked of every Kafka
minute after it: does Kafka fail, retry or dead-letter more than the baseline, and are its
processing and queue-wait times slower than the baseline's histogram?

The baseline is a sample, not the truth, so each test spends half of its share of
``GATE_ALPHA`` on a margin around it, taken once (the baseline is fixed before the watch):

- counts: the rate's one-sided Clopper-Pearson upper bound at ``1 - alpha_i / 2``; each Kafka
  minute's ``x`` events of ``n`` exposed against that rate ``p``,
  ``exp(d x) / (1 - p + p e^d)^n``, the binomial likelihood ratio (``d`` the log odds ratio);
- latencies: the baseline's histogram made slower by the one-sided DKW margin (its empirical
  CDF lowered by ``sqrt(ln(2 / alpha_i) / 2n)``, that mass moved to the open bucket); each
  Kafka minute's counts against it, exponentially tilted towards slower buckets.

If the margin holds (probability ``1 - alpha_i / 2``), a Kafka path no worse than the
baseline's true rate or distribution makes every minute's ratio average at most 1, so the
mixture e-value reaches ``2 / alpha_i`` with probability at most ``alpha_i / 2`` however often
it is asked (Ville): a false roll-back of one test has probability at most ``alpha_i``. The
margin costs power (a small baseline moves its bound a long way) and never error rate; the
tests lose no power to a baseline's randomness a two-sample test would have to average over.

What this cannot guard against: a watch whose workload differs from the baseline's (larger
documents, another time of day than the baseline covered) looks like a regression, since
the baseline stands for Redis *then*; and, as in ``gate_stats``, tasks count as independent.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from sidecar.serve import histograms as hist
from sidecar.serve.gate_stats import SequentialResult, latency_details, latency_effect
from sidecar.serve.gate_tests import (
    COUNT_TESTS,
    COUNTED,
    EXPOSURE_NAMES,
    EXPOSURES,
    LATENCY_TESTS,
    SAMPLED,
    TESTS,
)
from sidecar.serve.sequential import (
    COUNT_MIXTURE,
    TILT_MIXTURE,
    Array,
    baseline_tilt_log_ratios,
    count_log_ratios,
    dominating,
    log_e_value,
    upper_rate,
)
from sidecar.wire.evidence import Evidence, PathEvidence, histograms

MINUTE_MS: Final = 60_000


@dataclass(frozen=True)
class Baseline:
    """How the Redis path ran over ``[since_ms, until_ms]``."""

    since_ms: int
    until_ms: int
    redis: PathEvidence

    @classmethod
    def of(cls, since_ms: int, until_ms: int, minutes: Sequence[Evidence]) -> Baseline:
        return cls(since_ms, until_ms, Evidence.from_minutes(minutes)["redis"])

    def after(self, minutes: Sequence[Evidence], since_ms: int) -> list[Evidence]:
        """The minutes of a window starting at ``since_ms`` that come after the baseline's last
        minute: the watched ones (none of the baseline's tasks is judged against itself)."""
        skip = self.until_ms // MINUTE_MS + 1 - since_ms // MINUTE_MS
        return list(minutes[max(0, skip) :])


def run_baseline_tests(
    baseline: PathEvidence, minutes: Sequence[Evidence], alpha: float, floor_ms: float
) -> list[SequentialResult]:
    """The five tests of the Kafka path's ``minutes`` (in time order) against the baseline;
    ``alpha`` is their share of ``GATE_ALPHA``, split evenly, each share half margin, half
    sequential test."""
    each = alpha / len(TESTS) / 2
    return [
        *(_count_test(name, baseline, minutes, each) for name in COUNT_TESTS),
        *(_latency_test(name, baseline, minutes, each, floor_ms) for name in LATENCY_TESTS),
    ]


def _exposure(path: PathEvidence, name: str) -> tuple[int, int]:
    """A path's events and their exposure (never fewer exposed than events: a flush may split
    an event from its exposure across minutes)."""
    events = path[COUNTED[name]]
    return events, max(sum(path[e] for e in EXPOSURES[name]), events)


def _count_test(
    name: str, baseline: PathEvidence, minutes: Sequence[Evidence], alpha: float
) -> SequentialResult:
    b_events, b_exposed = _exposure(baseline, name)
    bound = upper_rate(b_events, b_exposed, alpha)
    table = np.array([_exposure(m["kafka"], name) for m in minutes], dtype=float).reshape(-1, 2)
    events, exposed = table[:, 0], table[:, 1]
    totals = count_log_ratios(events, exposed, np.full_like(events, bound), COUNT_MIXTURE.nodes)
    totals = totals.sum(axis=0)
    log_e = float(log_e_value(totals, COUNT_MIXTURE)) if len(minutes) else 0.0
    k_events, k_exposed = int(events.sum()), int(exposed.sum())
    exposure = EXPOSURE_NAMES[name]
    details: dict[str, Any] = {
        "kafka": k_events,
        f"kafka_{exposure}": k_exposed,
        "baseline": b_events,
        f"baseline_{exposure}": b_exposed,
        "kafka_percent": 100 * k_events / k_exposed if k_exposed else None,
        "baseline_percent": 100 * b_events / b_exposed if b_exposed else None,
        "baseline_bound_percent": 100 * bound,
        "margin_alpha": alpha,
    }
    k, b = details["kafka_percent"], details["baseline_percent"]
    effect = (
        f"{k_events} on kafka, baseline {b_events} of {b_exposed}"
        if k is None or b is None
        else f"kafka {k:.2f} % vs baseline {b:.2f} % (bound {100 * bound:.2f} %) of "
        f"{exposure.replace('_', ' ')} "
        f"({k - b:+.2f} pp)"
    )
    result = SequentialResult(name, alpha, log_e, effect, None, details, "baseline")
    return _with_needed(result, totals, k_exposed)


def _latency_test(
    name: str, baseline: PathEvidence, minutes: Sequence[Evidence], alpha: float, floor_ms: float
) -> SequentialResult:
    # One group per bucket layout (an older build's minutes compare on the shared bounds).
    groups: dict[tuple[float, ...], tuple[list[list[int]], list[int]]] = {}
    for minute in minutes:
        bounds, (kafka, base) = histograms([minute["kafka"], baseline], SAMPLED[name])
        if sum(kafka):
            groups.setdefault(bounds, ([], base))[0].append(kafka)
    totals: Array = np.zeros(TILT_MIXTURE.nodes.shape)
    for bounds, (rows, base) in groups.items():
        merged, counts = hist.merge_floor(bounds, np.array(rows, dtype=float), floor_ms)
        _, base_counts = hist.merge_floor(bounds, np.array(base, dtype=float), floor_ms)
        # One margin for every layout: the DKW event is about the true distribution.
        weights = dominating(base_counts, alpha)
        ratios = baseline_tilt_log_ratios(counts, weights, hist.scores(merged), TILT_MIXTURE.nodes)
        totals = totals + ratios.sum(axis=0)
    log_e = float(log_e_value(totals, TILT_MIXTURE)) if groups else 0.0
    window = Evidence.from_minutes(minutes)["kafka"]
    bounds, (kafka, base) = histograms([window, baseline], SAMPLED[name])
    details = latency_details(bounds, kafka, base, floor_ms, against="baseline")
    details["margin_alpha"] = alpha
    effect = latency_effect(details, "baseline")
    result = SequentialResult(name, alpha, log_e, effect, None, details, "baseline")
    return _with_needed(result, totals, sum(kafka))


def _with_needed(result: SequentialResult, totals: Array, tasks: int) -> SequentialResult:
    """On a hold, the Kafka tasks that would take the e-value to its threshold if the best
    effect of the mixture is the true one: what it gained per task so far (the empirical
    Kullback-Leibler divergence) into the distance left, in logarithms."""
    best = float(np.max(totals)) if totals.size else 0.0
    if result.verdict != "hold" or best <= 0 or tasks <= 0:
        return result
    needed = math.ceil((math.log(result.threshold) - result.log_e) / (best / tasks))
    return dataclasses.replace(result, needed={"kafka": needed})
