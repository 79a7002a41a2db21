"""Calibration of the gate's sequential tests (issue 23): simulated rollouts, a look a minute.

Each run is a rollout through the plan's steps (--plan, per cent served from Kafka, --dwell-min
minutes each) at --tasks-per-min tasks a minute (a daily swing of +-30 %, Poisson arrivals).
The Kafka share of each minute wobbles around the step's (x e^N(0, 0.25): documents differ in
size). Every minute each path's finished tasks fail (4 %), are retried (1 %), and take a
processing time and a queue wait drawn from the scenario's populations, recorded in the
histograms ragflow_mq writes (the minute's counts, as the gate reads them). After every minute
the gate's tests (sidecar/serve/gate_stats.py's functions, on the window from the rollout's
start) decide: roll back when a test's e-value reaches 1/alpha_i; at the end of each step's
dwell, promote when each path has --min-sample finished tasks and no test is at its hold level.
The 100 % step is not simulated here: nothing is left on Redis to compare; its watch against a
baseline is bench/watch_calibration.py's.

Populations of processing time (queue wait: lognormal, median 3 s, sigma 1.5, on both paths):
- lognormal: median 20 s, sigma 1, and 5 % of tasks with a tail of minutes (median 5 min);
- heavy: 85 % lognormal (median 8 s, sigma 0.8), 15 % Pareto from 30 s (shape 1.2), to 3 h;
- bounds: every time within 0.3 % of one of the histogram's bounds from 1 s to 1 h;
- legacy: the lognormal one recorded by builds before issue 23 (the old bucket layout).

Scenarios per population: A/A (both paths alike), failures +2 points on Kafka (6 % vs 4 %),
Kafka's processing times 1.5x. Printed: false roll-backs (A/A, target <= GATE_ALPHA),
promotion at every step's dwell end (A/A, target >= 90 %), detection before the ramp ends
(A/B, target >= 95 %), and the tasks per path seen at the roll-back. Then, at a fixed share,
the tasks per path the tests need to detect each regression (median and 95th percentile).
Last, not a target: the failure test's false roll-backs when whole documents fail together
(their tasks all take one path), which the tests, counting tasks as independent, do not model.

Usage: .venv/bin/python bench/gate_calibration.py [--runs 400] [--tasks-per-min 100]
       [--dwell-min 240] [--plan 1,5,25,50] [--alpha 0.01] [--min-sample 200] [--seed 1]
Exit 0 when every target is met, 1 otherwise.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from bench_common import loadavg

from ragflow_mq.contract import BUCKETS_MS
from ragflow_mq.evidence import SHARED_BUCKETS_MS
from sidecar.serve import histograms as hist
from sidecar.serve.gate_stats import TESTS
from sidecar.serve.sequential import (
    COUNT_MIXTURE,
    TILT_MIXTURE,
    Array,
    Mixture,
    count_log_ratios,
    log_e_value,
    shares,
    tilt_log_ratios,
)

FAILURE, RETRY = 0.04, 0.01
FLOOR_MS = 1000.0  # GATE_LATENCY_FLOOR_MS's default
CHUNK = 32  # runs simulated at once, a block of minutes at a time: ~100 MB of floats
BLOCK = 240
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


POPULATIONS: dict[str, tuple[Sampler, tuple[float, ...]]] = {
    "lognormal": (lognormal, BUCKETS_MS),
    "heavy": (heavy, BUCKETS_MS),
    "bounds": (near_bounds, BUCKETS_MS),
    "legacy": (lognormal, SHARED_BUCKETS_MS),
}


def bucket_probabilities(
    rng: np.random.Generator, sampler: Sampler, bounds: tuple[float, ...], factor: float = 1.0
) -> Array:
    """Each bucket's probability (the open one last), as Recorder files a time (bisect_left)."""
    index = np.searchsorted(np.array(bounds), sampler(rng, DRAWS) * factor, side="left")
    return np.bincount(index, minlength=len(bounds) + 1) / DRAWS


@dataclass(frozen=True)
class Scenario:
    population: str
    kafka_failure: float = FAILURE
    kafka_slowdown: float = 1.0

    @property
    def name(self) -> str:
        if self.kafka_failure != FAILURE:
            return (
                f"{self.population}: failures {100 * FAILURE:g} -> {100 * self.kafka_failure:g} %"
            )
        if self.kafka_slowdown != 1.0:
            return f"{self.population}: processing x{self.kafka_slowdown:g}"
        return f"{self.population}: A/A"


@dataclass
class Outcome:
    """Per run: the minute of the first roll-back (-1: none), the tasks per path by then,
    and whether every step's dwell ended in a promotion."""

    rollback_minute: Array
    kafka_tasks: Array
    redis_tasks: Array
    on_schedule: Array


@dataclass(frozen=True)
class Plan:
    """What every run of a scenario shares: the share each minute, the step ends, the load."""

    schedule: Array  # the planned Kafka share, per minute
    step_ends: Array  # the minutes at which a step's dwell ends
    rate: Array  # tasks per minute
    alpha: float
    min_sample: int


@dataclass(frozen=True)
class Population:
    """A scenario's bucket probabilities: (Kafka's, Redis's) per latency, on ``bounds``."""

    bounds: tuple[float, ...]
    probs: dict[str, tuple[Array, Array]]


def simulate(rng: np.random.Generator, scenario: Scenario, plan: Plan, runs: int) -> Outcome:
    sampler, bounds = POPULATIONS[scenario.population]
    slower = bucket_probabilities(rng, sampler, bounds, scenario.kafka_slowdown)
    wait = bucket_probabilities(rng, queue_wait, bounds)
    population = Population(
        bounds,
        {
            "processing": (slower, bucket_probabilities(rng, sampler, bounds)),
            "queue_wait": (wait, wait),
        },
    )
    parts = [
        _chunk(rng, scenario, plan, population, min(CHUNK, runs - start))
        for start in range(0, runs, CHUNK)
    ]
    return Outcome(*(np.concatenate(column) for column in zip(*parts, strict=True)))


def _chunk(
    rng: np.random.Generator, scenario: Scenario, plan: Plan, population: Population, n: int
) -> tuple[Array, ...]:
    """``n`` runs, simulated a block of minutes at a time, up to every run's roll-back."""
    each = plan.alpha / len(TESTS)
    rollback, hold = math.log(1 / each), math.log(math.sqrt(1 / each))
    mixtures = (COUNT_MIXTURE, COUNT_MIXTURE, TILT_MIXTURE, TILT_MIXTURE)
    carried = [np.zeros((n, len(mixture.nodes))) for mixture in mixtures]
    first = np.full(n, -1)
    seen = np.zeros((n, 2))  # tasks per path (kafka, redis) up to the roll-back, or the end
    on_time = np.ones(n, dtype=bool)
    failure = np.array([scenario.kafka_failure, FAILURE])
    for begin in range(0, len(plan.schedule), BLOCK):
        minutes = np.arange(begin, min(begin + BLOCK, len(plan.schedule)))
        wobble = np.exp(rng.normal(0, 0.25, (n, len(minutes))))
        share = np.clip(plan.schedule[minutes] * wobble, 0, 1)
        rate = plan.rate[minutes]
        tasks = np.stack([rng.poisson(rate * share), rng.poisson(rate * (1 - share))])
        pi = shares(tasks[0].astype(float), tasks[1].astype(float))
        log_e = []
        for test, p in enumerate((failure, np.array([RETRY, RETRY]))):
            events = rng.binomial(tasks, p[:, None, None])
            ratios = count_log_ratios(events[0], events.sum(axis=0), pi, COUNT_MIXTURE.nodes)
            log_e.append(_accumulate(carried, test, ratios, COUNT_MIXTURE))
        for test, latency in enumerate(("processing", "queue_wait"), start=2):
            k, r = (rng.multinomial(tasks[i], population.probs[latency][i]) for i in (0, 1))
            counts = np.stack([k, r]).astype(float)
            merged, both = hist.merge_floor(population.bounds, counts, FLOOR_MS)
            ratios = tilt_log_ratios(both[0], both[1], hist.scores(merged), TILT_MIXTURE.nodes)
            log_e.append(_accumulate(carried, test, ratios, TILT_MIXTURE))
        # Dead letters: none on either path in these populations, so that e-value stays 1.
        stats = np.stack(log_e)  # (tests, runs, minutes)
        crossed = (stats >= rollback).any(axis=0) & (first < 0)[:, None]
        now = crossed.any(axis=1)
        first[now] = begin + crossed[now].argmax(axis=1)
        counted = np.where((first < 0)[:, None] | (minutes <= first[:, None]), tasks, 0)
        running = seen.T[:, :, None] + np.cumsum(counted, axis=2)  # (paths, runs, minutes)
        seen = running[:, :, -1].T
        for end in (end for end in plan.step_ends if begin <= end < begin + len(minutes)):
            calm = (stats[:, :, end - begin] < hold).all(axis=0)
            enough = running[:, :, end - begin].min(axis=0) >= plan.min_sample
            on_time &= calm & enough & (first < 0)
        if (first >= 0).all():
            break
    on_time &= first < 0
    return first, seen[:, 0], seen[:, 1], on_time


def _accumulate(carried: list[Array], test: int, ratios: Array, mixture: Mixture) -> Array:
    """ln e-value after each minute of the block, carrying the sums from earlier blocks."""
    running = np.cumsum(ratios, axis=1) + carried[test][:, None, :]
    carried[test] = running[:, -1, :]
    return log_e_value(running, mixture)


def percentiles(values: Array) -> str:
    if values.size == 0:
        return "-"
    p50, p95 = np.percentile(values, [50, 95])
    return f"{p50:,.0f} / {p95:,.0f}"


def plan_of(args: argparse.Namespace, schedule: Array, step_ends: Array) -> Plan:
    daily = 1 + 0.3 * np.sin(2 * np.pi * np.arange(len(schedule)) / 1440)
    return Plan(schedule, step_ends, args.tasks_per_min * daily, args.alpha, args.min_sample)


def ramp(args: argparse.Namespace, rng: np.random.Generator) -> bool:
    steps = [float(p) / 100 for p in args.plan.split(",")]
    schedule = np.repeat(steps, args.dwell_min)
    plan = plan_of(args, schedule, np.arange(1, len(steps) + 1) * args.dwell_min - 1)
    print(
        f"ramp {args.plan} %, {args.dwell_min} min a step, {args.tasks_per_min:g} tasks/min, "
        f"{args.runs} runs an A/A scenario ({args.runs // 2} an A/B one), "
        f"GATE_ALPHA={args.alpha:g}, GATE_MIN_SAMPLE={args.min_sample}"
    )
    print(
        f"{'scenario':<36} {'rolled back':>12} {'promoted on time':>17} "
        f"{'tasks kafka p50/p95':>20} {'tasks redis p50/p95':>22}"
    )
    ok = True
    for population in POPULATIONS:
        for scenario in (
            Scenario(population),
            Scenario(population, kafka_failure=0.06),
            Scenario(population, kafka_slowdown=1.5),
        ):
            aa = scenario.kafka_failure == FAILURE and scenario.kafka_slowdown == 1.0
            # A/A needs the runs: its false roll-backs are rare events; A/B half as many.
            out = simulate(rng, scenario, plan, args.runs if aa else args.runs // 2)
            hit = out.rollback_minute >= 0
            rate, promoted = hit.mean(), out.on_schedule.mean()
            met = (rate <= args.alpha and promoted >= 0.9) if aa else rate >= 0.95
            ok &= bool(met)
            shown = f"{100 * promoted:.1f}%" if aa else "-"
            print(
                f"{scenario.name:<36} {100 * rate:>11.2f}% {shown:>17} "
                f"{percentiles(out.kafka_tasks[hit]):>20} "
                f"{percentiles(out.redis_tasks[hit]):>22}  {'ok' if met else 'MISSED'}"
            )
    return ok


def fixed_shares(args: argparse.Namespace, rng: np.random.Generator) -> None:
    """Tasks per path seen when each regression is detected, at a share held fixed."""
    print(
        f"\nat a fixed share (lognormal population, {args.tasks_per_min:g} tasks/min, "
        f"{args.fixed_runs} runs): tasks per path at detection, p50 / p95"
    )
    print(f"{'share':>6} {'regression':<24} {'detected':>9} {'kafka':>18} {'redis':>20}")
    for percent in (1, 5, 25, 50):
        minutes = math.ceil(args.fixed_tasks / (args.tasks_per_min * percent / 100))
        plan = plan_of(args, np.full(minutes, percent / 100), np.array([minutes - 1]))
        for scenario in (
            Scenario("lognormal", kafka_failure=0.06),
            Scenario("lognormal", kafka_slowdown=1.5),
        ):
            out = simulate(rng, scenario, plan, args.fixed_runs)
            hit = out.rollback_minute >= 0
            label = scenario.name.split(": ")[1]
            print(
                f"{percent:>5}% {label:<24} {100 * hit.mean():>8.1f}% "
                f"{percentiles(out.kafka_tasks[hit]):>18} {percentiles(out.redis_tasks[hit]):>20}"
            )


def clustered(args: argparse.Namespace, rng: np.random.Generator) -> None:
    """Not a target: what the tests assume. A document's tasks all take one path (the sticky
    hash), and a broken document fails all of them; the tests count tasks as independent."""
    steps = [float(p) / 100 for p in args.plan.split(",")]
    schedule, size = np.repeat(steps, args.dwell_min), 10
    print(
        f"\nA/A with failures by whole documents of {size} tasks (failure test alone, "
        f"{args.runs} runs; 4 % of tasks fail in all):"
    )
    for whole in (0.0, 0.005, 0.01, 0.02):
        rolled = 0
        for start in range(0, args.runs, CHUNK):
            n = min(CHUNK, args.runs - start)
            share = np.clip(schedule * np.exp(rng.normal(0, 0.25, (n, len(schedule)))), 0, 1)
            docs = np.stack(
                [rng.poisson(args.tasks_per_min / size * s) for s in (share, 1 - share)]
            )
            failed = size * rng.binomial(docs, whole) + rng.binomial(size * docs, FAILURE - whole)
            pi = shares(docs[0].astype(float), docs[1].astype(float))
            ratios = count_log_ratios(failed[0], failed.sum(axis=0), pi, COUNT_MIXTURE.nodes)
            log_e = log_e_value(np.cumsum(ratios, axis=1), COUNT_MIXTURE)
            rolled += int((log_e.max(axis=1) >= math.log(len(TESTS) / args.alpha)).sum())
        print(
            f"  {100 * whole:>4g} % of documents fail whole: false roll-backs "
            f"{100 * rolled / args.runs:.1f} % (this test's share of GATE_ALPHA: "
            f"{100 * args.alpha / len(TESTS):g} %)"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=400, help="runs a ramp scenario")
    parser.add_argument("--tasks-per-min", type=float, default=100.0)
    parser.add_argument("--dwell-min", type=int, default=240, help="minutes a step")
    parser.add_argument("--plan", default="1,5,25,50", help="per cent served, the steps below 100")
    parser.add_argument("--alpha", type=float, default=0.01, help="GATE_ALPHA")
    parser.add_argument("--min-sample", type=int, default=200, help="GATE_MIN_SAMPLE")
    parser.add_argument("--fixed-runs", type=int, default=100, help="runs a fixed-share case")
    parser.add_argument("--fixed-tasks", type=int, default=10_000, help="kafka tasks at most")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    print(loadavg())
    started = time.monotonic()
    ok = ramp(args, rng)
    fixed_shares(args, rng)
    clustered(args, rng)
    print(f"\n{time.monotonic() - started:.0f} s; {loadavg()}")
    print("every target met" if ok else "a target was MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
