"""Anytime-valid tests of the served share: mixture likelihood ratios over minute buckets.

Each test asks one question, "is the Kafka path worse than the Redis path?", of the evidence
RAGFlow's processes record per minute (``ragflow_mq.recorder``). The Kafka share of tasks
changes from minute to minute (a ramp, documents of different sizes), so a test never pools
the paths' counts: it conditions on each minute's own split and multiplies the minutes'
likelihood ratios. Under "no difference" every minute's ratio has expectation at most 1,
whatever the share, the load or the base rates of that minute, so their running product is a
non-negative supermartingale; so is any mixture of them over the size of the effect (the
*e-value* below). Ville's inequality bounds the chance that it ever reaches ``1 / alpha`` by
``alpha``: the gate may look every minute, for the whole rollout, at no extra cost in false
roll-backs.

Two kinds of minute ratio:

- counts (failed, retried, dead-lettered tasks): of a minute's ``X`` events, the Kafka path's
  ``x`` against its share ``pi`` of the minute's exposure (tasks finished, or started). Given
  the minute's totals, ``x`` is hypergeometric when both paths share one rate, and a sample
  drawn without replacement is less spread than one drawn with it (Hoeffding, 1963), so
  ``exp(d x) / (pi e^d + 1 - pi)^X`` has expectation at most 1. ``d`` is the log of the rate
  ratio (Kafka's rate over Redis's), one number across minutes whatever their shares.
- latency distributions (processing, queue wait), from the histograms: the smaller path's
  tasks of the minute against the minute's pooled histogram, exponentially tilted towards
  slower buckets by ``t`` per unit of log latency. Given the bucket totals, the smaller path's
  tasks are a sample without replacement from the pooled ones, so the same bound holds. A
  lognormal slowed by a factor ``k`` is this tilt with ``t = ln k / sigma^2``.

At 100 % (no Redis left) the Kafka path's minutes are tested against a fixed baseline instead
(``sidecar/serve/baseline.py``): the same ratios with a fixed rate ``p`` in place of the
minute's share, ``exp(d x) / (1 - p + p e^d)^n``, the binomial likelihood ratio (expectation 1
at rate ``p``, less below it), and with fixed bucket probabilities in place of the minute's
pooled histogram (expectation at most 1 while Kafka's times are no slower than those).

The mixture over the effect is a discrete one, nodes evenly spaced in its logarithm with
trapezoid weights that sum to 1 (a log-uniform prior over two and a half decades or more):
a weighted average of supermartingales is one, so the grid's spacing changes the power only,
never the error rate. Everything here is numpy over leading axes, so that the calibration
bench runs thousands of rollouts through the same functions the gate uses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import minimize_scalar
from scipy.special import logsumexp, rel_entr
from scipy.stats import beta

Array = NDArray[np.float64]


@dataclass(frozen=True)
class Mixture:
    """The effects a test averages over (> 0: Kafka worse) and their log weights (sum 1)."""

    nodes: Array
    log_weights: Array

    @classmethod
    def log_uniform(cls, low: float, high: float, size: int = 200) -> Mixture:
        """Nodes evenly spaced in ``ln(effect)`` over ``[low, high]``, trapezoid weights."""
        weights = np.full(size, 1.0 / (size - 1))
        weights[[0, -1]] /= 2
        return cls(np.geomspace(low, high, size), np.log(weights))


# The log rate ratio: from 1.005x (a regression only a long rollout can see) to 150x (dead
# letters on Kafka and none on Redis, where a handful at a small share must be enough).
COUNT_MIXTURE = Mixture.log_uniform(0.005, 5.0)
# The tilt per unit of ln(ms): from 0.003 (a 1.05x slowdown of a tail as wide as sigma = 4) to
# 3 (a 2x slowdown of times within a factor of 1.6 of each other).
TILT_MIXTURE = Mixture.log_uniform(0.003, 3.0)


def log_e_value(log_ratios: Array, mixture: Mixture) -> Array:
    """ln of the mixture of likelihood ratios: ``log_ratios`` summed over minutes, with the
    mixture's nodes on the last axis."""
    return np.asarray(logsumexp(log_ratios + mixture.log_weights, axis=-1))


def count_log_ratios(kafka: Array, total: Array, share: Array, effects: Array) -> Array:
    """Per minute (the leading axes) and effect ``d`` (a new last axis): the log likelihood
    ratio of ``kafka`` of ``total`` events on the Kafka path, whose share of the exposure was
    ``share``: ``d x - X ln(1 + pi (e^d - 1))``. A minute without events counts 0."""
    d = effects.reshape((1,) * np.ndim(kafka) + (-1,))
    x, n, pi = (np.asarray(a, dtype=float)[..., None] for a in (kafka, total, share))
    return np.asarray(d * x - n * np.log1p(pi * np.expm1(d)))


def shares(kafka_exposure: Array, redis_exposure: Array) -> Array:
    """The Kafka path's share of each minute's exposure (0 in a minute without any)."""
    total = np.asarray(kafka_exposure + redis_exposure, dtype=float)
    out = np.zeros_like(total)
    np.divide(kafka_exposure, total, out=out, where=total > 0)
    return out


def tilt_log_ratios(kafka: Array, redis: Array, scores: Array, tilts: Array) -> Array:
    """Per minute (the leading axes of the histograms, buckets last) and tilt (a new last
    axis): the log likelihood ratio of the smaller path's bucket counts against the minute's
    pooled histogram tilted by ``t`` per unit of ``scores`` (ln ms), Kafka slower for t > 0."""
    kafka, redis = np.asarray(kafka, dtype=float), np.asarray(redis, dtype=float)
    # Centred: exp(t s) stays far from overflow; a constant shift cancels in the ratio.
    s = scores - (scores.max() + scores.min()) / 2
    pooled = kafka + redis
    size = pooled.sum(axis=-1)
    weights = np.divide(
        pooled, size[..., None], out=np.zeros_like(pooled), where=size[..., None] > 0
    )
    n_kafka, n_redis = kafka.sum(axis=-1), redis.sum(axis=-1)
    # The smaller path is the sample (it loses least to the bound); Redis's tasks being faster
    # than the pool is Kafka's being slower, hence the sign.
    on_kafka = (n_kafka <= n_redis)[..., None]
    sign = np.where(on_kafka, 1.0, -1.0)
    sample = np.where(on_kafka, n_kafka[..., None], n_redis[..., None])
    sums = np.where(on_kafka[..., 0], kafka @ s, redis @ s)[..., None]
    t = tilts.reshape((1,) * (np.ndim(kafka) - 1) + (-1,))
    up = weights @ np.exp(np.outer(s, tilts))
    down = weights @ np.exp(-np.outer(s, tilts))
    mgf = np.where(on_kafka, up, down)
    ratios = sign * t * sums - sample * np.log(np.where(mgf > 0, mgf, 1.0))
    return np.asarray(np.where(size[..., None] > 0, ratios, 0.0))


def upper_rate(events: float, exposure: float, alpha: float) -> float:
    """The one-sided Clopper-Pearson bound on a rate of which ``events`` of ``exposure`` were
    seen: at or above the true rate with probability at least ``1 - alpha``. 1 without any
    exposure (nothing is known), or when every exposed task had the event."""
    if exposure <= 0 or events >= exposure:
        return 1.0
    return float(beta.ppf(1.0 - alpha, events + 1, exposure - events))


def dominating(counts: Array, alpha: float) -> Array:
    """Bucket probabilities (buckets on the last axis) that are slower than the distribution
    behind the histogram ``counts`` with probability at least ``1 - alpha``: its empirical CDF
    lowered everywhere by the one-sided Dvoretzky-Kiefer-Wolfowitz margin (Massart's constant)
    ``sqrt(ln(1 / alpha) / 2n)``, the mass taken off moved to the open bucket. The inequality
    holds for any distribution, a bucketed one too; without a sample all mass is open."""
    counts = np.asarray(counts, dtype=float)
    n = counts.sum()
    if n <= 0:
        return np.asarray(np.eye(counts.shape[-1])[-1])
    margin = math.sqrt(math.log(1.0 / alpha) / (2.0 * n))
    cdf = np.clip(np.cumsum(counts) / n - margin, 0.0, None)
    cdf[-1] = 1.0
    return np.asarray(np.diff(cdf, prepend=0.0))


def baseline_tilt_log_ratios(kafka: Array, weights: Array, scores: Array, tilts: Array) -> Array:
    """Per minute (the leading axes of ``kafka``'s histograms, buckets last) and tilt (a new
    last axis): the log likelihood ratio of the Kafka path's bucket counts against the fixed
    bucket probabilities ``weights`` tilted by ``t`` per unit of ``scores`` (ln ms). Its
    expectation is at most 1 whenever Kafka's times are no slower than ``weights``' (for
    ``t > 0``, ``exp(t s)`` grows with the bucket)."""
    kafka = np.asarray(kafka, dtype=float)
    s = scores - (scores.max() + scores.min()) / 2  # centred, as in tilt_log_ratios
    t = tilts.reshape((1,) * (np.ndim(kafka) - 1) + (-1,))
    log_mgf = np.log(weights @ np.exp(np.outer(s, tilts)))
    return np.asarray(t * (kafka @ s)[..., None] - kafka.sum(axis=-1)[..., None] * log_mgf)


def count_estimate(kafka: Array, total: Array, share: Array) -> float:
    """The log rate ratio (Kafka over Redis) that best explains the minutes, by maximum
    likelihood over ``[-10, 10]`` (the bound when one path has no event at all)."""

    def loss(d: float) -> float:
        return -float(count_log_ratios(kafka, total, share, np.array([d])).sum())

    return float(minimize_scalar(loss, bounds=(-10.0, 10.0), method="bounded").x)


def tilt_estimate(groups: Sequence[tuple[Array, Array, Array]]) -> float:
    """The tilt that best explains the minutes (maximum likelihood over ``[-5, 5]``); minutes
    come in groups of one bucket layout each: (Kafka's counts, Redis's counts, scores)."""

    def loss(t: float) -> float:
        tilt = np.array([t])
        return -sum(float(tilt_log_ratios(k, r, s, tilt).sum()) for k, r, s in groups)

    return float(minimize_scalar(loss, bounds=(-5.0, 5.0), method="bounded").x)


def count_drift(d: float, share: float, rate: float) -> float:
    """What the log ratio gains per task, on average, if the rate ratio is ``e^d``, the Kafka
    share ``share`` and events come at ``rate`` per task: the events' rate times the
    Kullback-Leibler divergence of the Kafka path's share of events from its share of tasks."""
    theta = share * math.exp(d) / (share * math.exp(d) + 1 - share)
    kl = rel_entr(theta, share) + rel_entr(1 - theta, 1 - share)
    return float(rate * kl)


def tilt_drift(t: float, share: float, pooled: Array, scores: Array) -> float:
    """What the log ratio gains per task, on average, at tilt ``t``: the smaller path's share
    of tasks times the divergence of the tilted histogram from the pooled one."""
    total = pooled.sum()
    if total <= 0:
        return 0.0
    weights = pooled / total
    sign = 1.0 if share <= 0.5 else -1.0
    tilted = weights * np.exp(sign * t * (scores - scores.mean()))
    tilted /= tilted.sum()
    return float(min(share, 1 - share) * rel_entr(tilted, weights).sum())
