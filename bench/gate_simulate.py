"""The gate's whole rollouts, simulated (bench/gate_defaults.py prints them): the shipped
settings (Defaults), the scenarios, and ``simulate``, which draws a population's documents minute
by minute and runs them through the gate's own tests, margins and the autopilot's rule.
bench/gate_defaults.py's docstring says what is drawn; the rollout's forecast is checked against
``simulate`` (bench/plan_accuracy.py) and so is the bound (bench/gate_bound.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from gate_populations import HELD_OUT, RolloutPopulation

from sidecar.config.rollout import RolloutSettings
from sidecar.config.serve import GateSettings
from sidecar.serve import histograms as hist
from sidecar.serve.gate_tests import BY_NAME, MARGIN_TESTS, RETRY_CLUSTER, TESTS, margin_of
from sidecar.serve.margins import STRATUM_DOCUMENTS, margin_at, mixture_radius, rho_for, weighed
from sidecar.serve.sequential import (
    COUNT_MIXTURE,
    TILT_MIXTURE,
    Array,
    count_log_ratios,
    log_e_value,
    shares,
    tilt_log_ratios,
)
from sidecar.wire.contract import BUCKETS_MS

FLOOR_MS = 1000.0
# Why a ramping run is held a minute, in the autopilot's order: the dwell, the documents, a
# harm test above its hold level, then each margin not yet shown.
HELD_REASONS = ("dwell", "documents", "harm", *MARGIN_TESTS)
# Tests.harm()'s rows: failed documents, retried tasks, processing, queue wait.
HARM_TESTS = ("failed", "retried", "processing", "queue_wait")


_ROLLOUT, _GATE = RolloutSettings(), GateSettings()


@dataclass(frozen=True)
class Defaults:
    """The shipped settings (sidecar/config), so a change of default is benched as shipped."""

    steps: tuple[float, ...] = _ROLLOUT.steps
    dwell_min: int = round(_ROLLOUT.dwell_s / 60)
    min_documents: int = _ROLLOUT.min_documents
    alpha: float = _GATE.alpha
    margin_alpha: float = _GATE.margin_alpha
    # The shipped margins: each test's GATE_*_MARGIN_* at its default.
    margins: dict[str, float] = field(
        default_factory=lambda: {
            name: getattr(GateSettings(), margin_of(name).field) for name in MARGIN_TESTS
        }
    )
    holdback: float = _ROLLOUT.holdback_percent  # per cent of documents kept on Redis at 100 %


@dataclass(frozen=True)
class Scenario:
    name: str
    extra_failed: float = 0.0  # points of documents, Kafka's
    slowdown: float = 1.0  # Kafka's processing
    in_watch: bool = False  # the regression starts once the run reached 100 %
    queue_slowdown: float = 1.0  # Kafka's queue wait

    @property
    def aa(self) -> bool:
        return self.extra_failed == 0 and self.slowdown == 1.0 and self.queue_slowdown == 1.0


# The must-show scenarios: A/A and each harm at exactly its shipped margin.
SCENARIOS = (
    Scenario("A/A"),
    Scenario("failed documents +2 pp", extra_failed=2.0),
    Scenario("processing x1.5", slowdown=1.5),
    Scenario("queue wait x3", queue_slowdown=3.0),
)


def _none() -> Array:
    return np.zeros((0, 0))


@dataclass
class Outcome:
    rolled_ramp: Array  # bool: rolled back before 100 %
    rolled_watch: Array  # bool: rolled back in the 24 h at 100 %
    reached_min: Array  # minute 100 % was reached (-1: never)
    rolled_min: Array  # minute of the roll-back (-1: none)
    # Per run and step: the minutes it took (NaN: not finished), the documents each path
    # had when it was promoted (runs, steps, 2), and the minutes held for each HELD_REASONS.
    step_min: Array = field(default_factory=_none)
    step_docs: Array = field(default_factory=_none)
    held: dict[str, Array] = field(default_factory=dict)
    rolled_by: Array = field(default_factory=_none)  # index in HARM_TESTS, -1: none


class Tests:
    """The harm tests' running sums and the margins' running sums, for ``n`` runs."""

    def __init__(self, n: int) -> None:
        self.count = {name: np.zeros((n, len(COUNT_MIXTURE.nodes))) for name in ("f", "r")}
        self.tilt = {name: np.zeros((n, len(TILT_MIXTURE.nodes))) for name in ("p", "q")}
        # Per margin: weighted excess, weight W, sum, sum of squares, count (for s^2).
        self.margin = {name: np.zeros((5, n)) for name in MARGIN_TESTS}
        # Per margin, the stratum being filled: Kafka's documents and sum, Redis's.
        self.stratum = {name: np.zeros((4, n)) for name in MARGIN_TESTS}

    def harm(self) -> Array:
        """ln e-values, (tests, runs)."""
        return np.stack(
            [log_e_value(self.count[k], COUNT_MIXTURE) for k in ("f", "r")]
            + [log_e_value(self.tilt[k], TILT_MIXTURE) for k in ("p", "q")]
        )

    def shown(self, margins: dict[str, float], next_share: Array, alpha: float) -> Array:
        ok = np.ones(next_share.shape, dtype=bool)
        for each in self.shown_each(margins, next_share, alpha).values():
            ok &= each
        return ok

    def shown_each(
        self, margins: dict[str, float], next_share: Array, alpha: float
    ) -> dict[str, Array]:
        """Per margin, whether it is shown at each run's next share."""
        out = {}
        for name, (excess, spent, total, squares, count) in self.margin.items():
            mean = np.divide(total, count, out=np.zeros_like(total), where=count > 0)
            var = np.divide(squares, count, out=np.zeros_like(total), where=count > 0) - mean**2
            if BY_NAME[name].sampled is None:  # a rate: binomial variance
                p = (total + 1) / (count + 2)
                var = p * (1 - p)
            else:
                var = np.maximum(var, 0.01)
            # margin_at per distinct share (a handful), not per run: it is called every minute.
            distinct, where = np.unique(next_share, return_inverse=True)
            allowed = np.array([margin_at(name, margins[name], s) for s in distinct])[where]
            radius, _ = mixture_radius(spent * var, rho_for(var, allowed, alpha), alpha)
            upper = np.divide(
                excess + radius, spent, out=np.full_like(excess, np.inf), where=spent > 0
            )
            out[name] = upper < allowed
        return out


def simulate(
    rng: np.random.Generator,
    scenario: Scenario,
    plan: Defaults,
    runs: int,
    *,
    documents_per_min: float,
    watch_min: int = 1440,
    population: RolloutPopulation = HELD_OUT,
) -> Outcome:
    pop = population
    bounds = np.array(BUCKETS_MS)
    buckets = len(bounds) + 1
    merged, _ = hist.merge_floor(tuple(BUCKETS_MS), np.zeros((1, buckets)), FLOOR_MS)
    scores = hist.scores(merged)
    each = plan.alpha / len(TESTS)
    last_step = len(plan.steps) - 1
    rollback, hold = math.log(1 / each), math.log(math.sqrt(1 / each))
    steps = np.array([min(s, 100 - plan.holdback) for s in plan.steps]) / 100
    next_of = np.array([*plan.steps[1:], 100.0]) / 100
    tests = Tests(runs)
    index = np.zeros(runs, dtype=int)
    since = np.zeros(runs, dtype=int)
    step_docs = np.zeros((2, runs))
    rolled_at = np.full(runs, -1)
    rolled_by = np.full(runs, -1)  # the harm test that rolled the run back (HARM_TESTS)
    reached = np.full(runs, -1)
    batch_left = np.zeros(runs, dtype=int)
    phase = rng.uniform(0, 2 * math.pi, runs)
    sizes_of, size_p = pop.sizes
    mean_log_size, _ = pop.log_size_spread()
    drift_f, drift_q = pop.drift
    batch_p, batch_q, batch_f = pop.batch_factors
    n_steps = len(plan.steps)
    step_min = np.full((runs, n_steps), np.nan)
    docs_at = np.full((runs, n_steps, 2), np.nan)
    held = {reason: np.zeros((runs, n_steps)) for reason in HELD_REASONS}
    horizon = 60 * 24 * 21  # three weeks at most to reach 100 %
    minute = 0
    while minute < horizon:
        live = rolled_at < 0
        watching_over = (reached >= 0) & (minute - reached >= watch_min)
        if not (live & ~watching_over).any():
            break
        share = steps[index]
        load = documents_per_min * (1 + pop.swing * math.sin(2 * math.pi * minute / 1440))
        mix = np.sin(2 * math.pi * minute / 60 + phase)
        start = rng.random(runs) < pop.batches_a_day / 1440
        lengths = rng.integers(pop.batch_min[0], pop.batch_min[1] + 1, runs)
        batch_left = np.where((batch_left == 0) & start, lengths, batch_left)
        pdf = batch_left > 0
        batch_left = np.maximum(batch_left - 1, 0)
        n = np.stack([rng.poisson(load * share), rng.poisson(load * (1 - share))]).astype(int)
        on = (reached >= 0) if scenario.in_watch else np.ones(runs, dtype=bool)
        fail_scale = np.exp(drift_f * mix) * np.where(pdf, batch_f, 1.0)
        p_shift = np.log(np.where(pdf, batch_p, 1.0)) + drift_f * mix
        q_shift = np.log(np.where(pdf, batch_q, 1.0)) + drift_q * mix
        # Each document drawn on its own: its task count sets its chance to fail and, through
        # the covariate, part of its processing time; the minute's drift and batch move both
        # paths alike, the scenario's regression Kafka's only.
        x = np.zeros((2, runs))
        started = np.zeros((2, runs))
        counts = {key: np.zeros((2, runs, buckets)) for key in ("p", "q")}
        for path in (0, 1):
            owner = np.repeat(np.arange(runs), n[path])
            if not owner.size:
                continue
            sizes = rng.choice(sizes_of, owner.size, p=size_p)
            kafka_on = on[owner] if path == 0 else np.zeros(owner.size, dtype=bool)
            p_fail = pop.failure_of(sizes) * fail_scale[owner]
            p_fail = np.clip(p_fail + np.where(kafka_on, scenario.extra_failed / 100, 0.0), 0, 1)
            failed = rng.random(owner.size) < p_fail
            x[path] = np.bincount(owner, weights=failed, minlength=runs)
            started[path] = np.bincount(owner, weights=sizes, minlength=runs)
            log_p = (
                math.log(pop.processing_ms)
                + p_shift[owner]
                + pop.covariate * (np.log(sizes) - mean_log_size)
                + pop.residual_sigma * rng.standard_normal(owner.size)
                + np.where(kafka_on, math.log(scenario.slowdown), 0.0)
            )
            log_q = (
                math.log(pop.queue_ms)
                + q_shift[owner]
                + pop.queue_sigma * rng.standard_normal(owner.size)
                + np.where(kafka_on, math.log(scenario.queue_slowdown), 0.0)
            )
            for key, log_t in (("p", log_p), ("q", log_q)):
                # Filed as Recorder files a time (bisect_left on the bounds).
                bucket = np.searchsorted(bounds, np.exp(log_t), side="left")
                flat = np.bincount(owner * buckets + bucket, minlength=runs * buckets)
                counts[key][path] = flat.reshape(runs, buckets)
        latency = {
            key: hist.merge_floor(tuple(BUCKETS_MS), c, FLOOR_MS)[1] for key, c in counts.items()
        }
        # Retries: crashes hand tasks of one path back at once, and a few on their own.
        # A retry is filed under the minute its document started (ragflow_mq's recorder), so a
        # crash's tasks land on each path as that minute's tasks did: drawn by the step's
        # share instead, a run at a few documents a minute filed retries on Kafka in minutes
        # Kafka started nothing, a harm no site can show (2 of 100 A/A runs rolled back at 5 a
        # minute). By tasks, not documents: an executor holds tasks, and once documents have
        # sizes of their own a minute's document share can be far from its task share (one
        # Kafka document of 1 task beside a Redis one of 40), which the retried test, by
        # tasks, would read as a harm.
        crashes = np.minimum(
            np.where(n.sum(axis=0) > 0, rng.poisson(pop.crashes_a_min, runs), 0), 8
        )
        on_kafka = rng.binomial(crashes, shares(started[0], started[1]))
        crash_sizes = rng.integers(1, pop.crash_tasks + 1, (runs, 8))
        ranks = np.arange(8)[None, :]
        r_k = (crash_sizes * (ranks < on_kafka[:, None])).sum(axis=1)
        r_r = (crash_sizes * ((ranks >= on_kafka[:, None]) & (ranks < crashes[:, None]))).sum(
            axis=1
        )
        retried = np.stack([r_k, r_r]) + rng.binomial(started.astype(int), pop.retry_alone)
        # Harm tests.
        pi = shares(n[0], n[1])
        total = x.sum(axis=0)
        tests.count["f"] += count_log_ratios(x[0], total, pi, COUNT_MIXTURE.nodes)
        pi_t = shares(started[0], started[1])
        tests.count["r"] += count_log_ratios(
            retried[0] / RETRY_CLUSTER, retried.sum(axis=0) / RETRY_CLUSTER, pi_t,
            COUNT_MIXTURE.nodes,
        )  # fmt: skip
        for key in ("p", "q"):
            k, r = latency[key]
            tests.tilt[key] += tilt_log_ratios(k, r, scores, TILT_MIXTURE.nodes)
        # Margins: Kafka's excess over its own stratum's Redis mean.
        values = {"failed": (x[0], x[1], total, total)}
        for name, key in (("processing", "p"), ("queue_wait", "q")):
            k, r = latency[key]
            values[name] = (k @ scores, r @ scores, (k + r) @ scores, (k + r) @ scores**2)
        for name, (s_k, s_r, s_all, sq_all) in values.items():
            m, stratum = tests.margin[name], tests.stratum[name]
            stratum += np.stack([n[0], s_k, n[1], s_r])
            whole = (stratum[0] >= STRATUM_DOCUMENTS) & (stratum[2] >= STRATUM_DOCUMENTS)
            terms, weights = weighed(*stratum)
            m[0] += np.where(whole, terms, 0.0)
            m[1] += np.where(whole, weights, 0.0)
            stratum[:, whole] = 0
            m[2] += s_all
            m[3] += sq_all
            m[4] += n[0] + n[1]
        step_docs += n
        # The autopilot's look, and why a ramping run is held this minute (for the bench's
        # "where the time goes": the first reason in the autopilot's order, every margin
        # not yet shown).
        harm = tests.harm()
        back = live & (harm >= rollback).any(axis=0)
        rolled_at[back] = minute
        rolled_by[back] = np.argmax(harm[:, back] - rollback >= 0, axis=0)
        ramping = live & ~back & (reached < 0)
        rows = np.flatnonzero(ramping)
        dwelt = minute - since + 1 >= plan.dwell_min
        due = ramping & dwelt
        last = index == last_step
        # The last step needs no Redis documents and shows no margin (sidecar/rollout).
        enough = (step_docs[0] >= plan.min_documents) & (
            last | (step_docs[1] >= plan.min_documents)
        )
        calm = (harm < hold).all(axis=0)
        held["dwell"][rows, index[rows]] += ~dwelt[rows]
        held["documents"][rows, index[rows]] += (dwelt & ~enough)[rows]
        held["harm"][rows, index[rows]] += (dwelt & enough & ~calm)[rows]
        due &= enough & calm
        if (due & ~last).any():
            each_shown = tests.shown_each(plan.margins, next_of[index], plan.margin_alpha)
            for name, ok in each_shown.items():
                held[name][rows, index[rows]] += (due & ~last & ~ok)[rows]
                due &= last | ok
        reached[due & last] = minute
        done = np.flatnonzero(due)
        step_min[done, index[done]] = minute + 1 - since[done]
        docs_at[done, index[done]] = step_docs[:, done].T
        up = due & ~last
        index[up] += 1
        since[up] = minute + 1
        step_docs[:, up] = 0
        minute += 1
    rolled_ramp = (rolled_at >= 0) & ((reached < 0) | (rolled_at <= reached))
    rolled_watch = (rolled_at >= 0) & (reached >= 0) & (rolled_at > reached)
    return Outcome(
        rolled_ramp, rolled_watch, reached, rolled_at, step_min, docs_at, held, rolled_by
    )
