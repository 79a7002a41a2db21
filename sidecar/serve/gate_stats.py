"""The gate's sequential tests on served evidence: five questions (one row each in
``gate_tests.py``), one share of ``GATE_ALPHA`` each (Bonferroni), each answered with an
e-value, an effect estimate and the tasks it needs.

- ``failed``: Kafka's documents with a failed task, per finished document, above Redis's;
- ``retried``: tasks handed out again, per task started;
- ``dead_lettered``: records sent to the dead-letter topic, per record consumed (started or
  dead-lettered), against a fixed rate (``GATE_DEAD_LETTER_PERCENT``): Redis has none to
  compare with, so the test is one-sample and fires at any share, 100 % included;
- ``processing`` and ``queue_wait``: the whole latency distribution slower on Kafka, one
  sample a document (its first finished task's processing, its first started task's wait).

Failures and latencies are counted by document (``sidecar.wire.contract.DOCUMENT_EVENTS``):
a document's tasks all take one path and share its fate, a broken PDF failing every page
range, a large one slow in all of them. Counted by task, ten failures of one document on the
Kafka path read as ten independent ones, and the tests, built on independent units, rolled a
healthy shift back (6 % to 33 % of A/A rollouts with 0.5 % to 2 % of documents failing whole,
``bench/gate_calibration.py``). Retries and dead letters stay per task: a retry follows an
executor's death, not its document, and a dead letter has no decodable document. Outcomes and
retries are filed under the minute their document started on its path
(``sidecar.wire.contract.ATTRIBUTION_MINUTES``), so each minute's events are its own
documents'.

A test rolls back once its e-value reaches ``1 / alpha_i`` (``alpha_i = GATE_ALPHA / 5``): the
five together roll a healthy shift back with probability at most ``GATE_ALPHA``, however long
it runs and however often the gate is asked, provided its window starts at a fixed time (the
rollout's start), not a sliding one. It holds from ``sqrt(1 / alpha_i)`` (halfway, on a log
scale): the evidence leans towards a regression, so the share should not grow before it is
settled. ``sidecar/serve/sequential.py`` has the mathematics.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import numpy as np

from sidecar.serve import histograms as hist
from sidecar.serve.gate_tests import (
    BY_NAME,
    COUNTED,
    EXPOSURE_NAMES,
    EXPOSURES,
    GATE_TESTS,
    SAMPLED,
    TESTS,
    GateTest,
)
from sidecar.serve.sequential import (
    COUNT_MIXTURE,
    TILT_MIXTURE,
    Array,
    count_drift,
    count_estimate,
    count_log_ratios,
    log_e_value,
    shares,
    tilt_drift,
    tilt_estimate,
    tilt_log_ratios,
)
from sidecar.wire.evidence import Evidence, histograms

# Redis has no dead-letter topic, so Kafka's dead letters are tested against a fixed rate
# (GATE_DEAD_LETTER_PERCENT), one-sample: compared with Redis's none, the test could never
# fire once nothing was left on Redis (at 100 %).
DEAD_LETTER_RATE: Final = 0.001
# The share of tasks future tasks will have, for the tasks-needed estimate: the last minutes'.
RECENT_MINUTES: Final = 10
Verdict = Literal["ok", "hold", "rollback"]
Against = Literal["redis", "baseline"]


@dataclass(frozen=True)
class SequentialResult:
    """One test over the window: its e-value against ``1 / alpha``, and what it estimates."""

    name: str  # one of TESTS (sidecar/serve/gate_tests.py)
    alpha: float  # its share of GATE_ALPHA
    log_e: float  # ln of the e-value (the mixture likelihood ratio)
    effect: str  # the effect estimate, for people
    # More tasks per path that would take the e-value to 1 / alpha if the estimated effect is
    # the true one; only on a hold that the evidence leans towards (None otherwise).
    needed: dict[str, int] | None = None
    details: dict[str, Any] = field(default_factory=dict)  # the estimate's numbers (--json)
    # What Kafka is compared with: the Redis path of the same minutes, or the baseline (how
    # the Redis path ran before the share reached 100 %, sidecar/serve/baseline.py).
    against: Against = "redis"

    @property
    def e_value(self) -> float:
        return math.exp(min(self.log_e, 700.0))

    @property
    def threshold(self) -> float:
        return 1.0 / self.alpha

    @property
    def hold_level(self) -> float:
        return math.sqrt(self.threshold)

    @property
    def verdict(self) -> Verdict:
        if self.log_e >= math.log(self.threshold):
            return "rollback"
        return "hold" if self.log_e >= math.log(self.hold_level) else "ok"


def run_tests(
    minutes: Sequence[Evidence],
    alpha: float,
    floor_ms: float,
    *,
    dead_letter_rate: float = DEAD_LETTER_RATE,
) -> list[SequentialResult]:
    """The five tests over the window's minute buckets (in time order); ``dead_letter_rate``:
    the share of Kafka's consumed records that may go to the dead-letter topic."""
    each = alpha / len(TESTS)

    def run(test: GateTest) -> SequentialResult:
        if test.statistic == "count":
            return _count_test(test.name, minutes, each)
        if test.statistic == "fixed_rate":
            return _dead_letter_test(test.name, minutes, each, dead_letter_rate)
        return _latency_test(test.name, minutes, each, floor_ms)

    return [run(test) for test in GATE_TESTS]


def _count_arrays(name: str, minutes: Sequence[Evidence]) -> tuple[Array, ...]:
    """Per minute: Kafka's events, Redis's, Kafka's exposure, Redis's."""
    rows = []
    for minute in minutes:
        row = []
        for path in ("kafka", "redis"):
            events = minute[path][COUNTED[name]]
            # A flush may split an event from its exposure across minutes: never fewer exposed.
            exposure = max(sum(minute[path][e] for e in EXPOSURES[name]), events)
            row += [events, exposure]
        rows.append(row)
    table = np.array(rows, dtype=float).reshape(-1, 4)
    return table[:, 0], table[:, 2], table[:, 1], table[:, 3]


def _count_test(name: str, minutes: Sequence[Evidence], alpha: float) -> SequentialResult:
    x_kafka, x_redis, e_kafka, e_redis = _count_arrays(name, minutes)
    share = shares(e_kafka, e_redis)
    cluster = BY_NAME[name].cluster
    x_units, total = x_kafka / cluster, (x_kafka + x_redis) / cluster
    log_e = float(log_e_value(count_log_ratios(x_units, total, share, COUNT_MIXTURE.nodes)
                              .sum(axis=0), COUNT_MIXTURE)) if len(minutes) else 0.0  # fmt: skip
    d = count_estimate(x_units, total, share) if total.sum() > 0 else None
    k_events, r_events = int(x_kafka.sum()), int(x_redis.sum())
    k_exposed, r_exposed = int(e_kafka.sum()), int(e_redis.sum())
    k_rate = k_events / k_exposed if k_exposed else None
    r_rate = r_events / r_exposed if r_exposed else None
    details: dict[str, Any] = {
        "kafka": k_events,
        "redis": r_events,
        f"kafka_{EXPOSURE_NAMES[name]}": k_exposed,
        f"redis_{EXPOSURE_NAMES[name]}": r_exposed,
        "kafka_percent": None if k_rate is None else 100 * k_rate,
        "redis_percent": None if r_rate is None else 100 * r_rate,
        "rate_ratio": None if d is None else math.exp(d),
    }
    result = SequentialResult(name, alpha, log_e, _count_effect(name, details), None, details)
    if result.verdict != "hold" or d is None or d <= 0:
        return result
    recent = _recent_share(e_kafka, e_redis)
    rate = float(total.sum() / (e_kafka.sum() + e_redis.sum()))
    return _with_needed(result, count_drift(d, recent, rate), recent)


def _dead_letter_test(
    name: str, minutes: Sequence[Evidence], alpha: float, rate: float
) -> SequentialResult:
    """Kafka's dead letters per consumed record against ``rate``, minute by minute: the
    binomial likelihood ratio ``exp(d x) / (1 - p + p e^d)^n``, expectation at most 1 while
    Kafka dead-letters no more than ``rate``, whatever the share (100 % included)."""
    x_kafka, _, e_kafka, _ = _count_arrays(name, minutes)
    ratios = count_log_ratios(x_kafka, e_kafka, np.full_like(x_kafka, rate), COUNT_MIXTURE.nodes)
    log_e = float(log_e_value(ratios.sum(axis=0), COUNT_MIXTURE)) if len(minutes) else 0.0
    k_events, k_exposed = int(x_kafka.sum()), int(e_kafka.sum())
    percent = 100 * k_events / k_exposed if k_exposed else None
    details: dict[str, Any] = {
        "kafka": k_events,
        "kafka_consumed": k_exposed,
        "kafka_percent": percent,
        "allowed_percent": 100 * rate,
    }
    effect = (
        f"{k_events} on kafka"
        if percent is None
        else f"kafka {percent:.3f} % of consumed vs {100 * rate:g} % allowed "
        "(redis has no dead-letter topic)"
    )
    return SequentialResult(name, alpha, log_e, effect, None, details)


def _count_effect(name: str, details: dict[str, Any]) -> str:
    k, r = details["kafka_percent"], details["redis_percent"]
    if k is None or r is None:
        return f"{details['kafka']} on kafka, {details['redis']} on redis"
    ratio = details["rate_ratio"]
    shown = "-" if ratio is None else ">100" if ratio > 100 else f"{ratio:.2f}"
    return (
        f"kafka {k:.2f} % vs redis {r:.2f} % of {EXPOSURE_NAMES[name].replace('_', ' ')} "
        f"({k - r:+.2f} pp), "
        f"rate ratio {shown}"
    )


def _latency_groups(
    name: str, minutes: Sequence[Evidence], floor_ms: float
) -> list[tuple[Array, Array, Array]]:
    """The minutes' histograms (Kafka's, Redis's) merged under the floor, in one group per
    bucket layout, with that layout's scores."""
    by_bounds: dict[tuple[float, ...], list[list[list[int]]]] = {}
    for minute in minutes:
        bounds, pair = histograms([minute["kafka"], minute["redis"]], SAMPLED[name])
        if sum(map(sum, pair)):
            by_bounds.setdefault(bounds, []).append(pair)
    groups = []
    for bounds, pairs in by_bounds.items():
        merged, counts = hist.merge_floor(bounds, np.array(pairs, dtype=float), floor_ms)
        groups.append((counts[:, 0], counts[:, 1], hist.scores(merged)))
    return groups


def _latency_test(
    name: str, minutes: Sequence[Evidence], alpha: float, floor_ms: float
) -> SequentialResult:
    groups = _latency_groups(name, minutes, floor_ms)
    nodes = TILT_MIXTURE.nodes
    total = sum(tilt_log_ratios(k, r, s, nodes).sum(axis=0) for k, r, s in groups)
    log_e = float(log_e_value(np.asarray(total), TILT_MIXTURE)) if groups else 0.0
    window = Evidence.from_minutes(minutes)
    bounds, (kafka, redis) = histograms([window["kafka"], window["redis"]], SAMPLED[name])
    details = latency_details(bounds, kafka, redis, floor_ms)
    t = tilt_estimate(groups) if sum(kafka) and sum(redis) else None
    details["tilt"] = t
    result = SequentialResult(name, alpha, log_e, latency_effect(details), None, details)
    if result.verdict != "hold" or t is None or t <= 0:
        return result
    k_recent = np.concatenate([k.sum(axis=-1) for k, _, _ in groups])[-RECENT_MINUTES:]
    r_recent = np.concatenate([r.sum(axis=-1) for _, r, _ in groups])[-RECENT_MINUTES:]
    recent = _recent_share(k_recent, r_recent)
    merged, pooled = hist.merge_floor(bounds, np.array(kafka) + np.array(redis), floor_ms)
    return _with_needed(result, tilt_drift(t, recent, pooled, hist.scores(merged)), recent)


def latency_details(
    bounds: tuple[float, ...],
    kafka: list[int],
    other: list[int],
    floor_ms: float,
    against: str = "redis",
) -> dict[str, Any]:
    """Quantiles of both sides, their ratios and P(kafka slower); ``against`` names the other
    side (``redis``, or the watch's ``baseline``) in the keys."""
    details: dict[str, Any] = {"kafka_samples": sum(kafka), f"{against}_samples": sum(other)}
    for q in (0.5, 0.9):
        k, r = hist.quantile(bounds, kafka, q), hist.quantile(bounds, other, q)
        label = f"p{round(q * 100)}"
        details[f"kafka_{label}_ms"], details[f"{against}_{label}_ms"] = k, r
        # Under the floor, times compare as equal: the ratio of 5 ms to 2 ms is no slowdown.
        ratio = None if k is None or r is None else max(k, floor_ms) / max(r, floor_ms)
        details[f"{label}_ratio"] = ratio
    _, pair = hist.merge_floor(bounds, np.array([kafka, other], dtype=float), floor_ms)
    details["kafka_slower_probability"] = hist.slower_probability(pair[0], pair[1])
    return details


def _ms(ms: float) -> str:
    return f"{ms / 1000:.3g} s" if ms >= 1000 else f"{ms:.3g} ms"


def latency_effect(details: dict[str, Any], against: str = "redis") -> str:
    if details["p50_ratio"] is None:
        where = "on redis" if against == "redis" else f"in {against}"
        return f"{details['kafka_samples']} on kafka, {details[f'{against}_samples']} {where}"
    versus = "vs " if against == "redis" else f"vs {against} "
    return (
        f"p50 x{details['p50_ratio']:.2f} ({_ms(details['kafka_p50_ms'])} {versus}"
        f"{_ms(details[f'{against}_p50_ms'])}), p90 x{details['p90_ratio']:.2f}, "
        f"P(kafka slower) {details['kafka_slower_probability']:.2f}"
    )


def _recent_share(kafka: Array, redis: Array) -> float:
    """The Kafka share over the last minutes that had any exposure."""
    active = (kafka + redis) > 0
    k, r = kafka[active][-RECENT_MINUTES:].sum(), redis[active][-RECENT_MINUTES:].sum()
    return float(k / (k + r)) if k + r else 0.0


def _with_needed(result: SequentialResult, drift: float, share: float) -> SequentialResult:
    """``result`` with the tasks that would take its e-value to ``1 / alpha`` at ``drift``
    (the log e-value gained per task, all paths) and the Kafka ``share`` of tasks."""
    if drift <= 0 or not 0 < share < 1:
        return result
    tasks = (math.log(result.threshold) - result.log_e) / drift
    needed = {"kafka": math.ceil(tasks * share), "redis": math.ceil(tasks * (1 - share))}
    return SequentialResult(
        result.name, result.alpha, result.log_e, result.effect, needed, result.details
    )
