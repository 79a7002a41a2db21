"""Calibration of the gate's sequential tests (issues 23, 30): simulated rollouts, a look a
minute.

Headline (bench/gate_defaults.py, issues 30 and 36): the shipped defaults over whole rollouts,
the autopilot's rule (margins shown before each promotion), then 24 h at 100 % with the Redis
hold-back, on gate_populations' held-out rollout population (documents of 1-60 tasks whose task
count explains part of the processing time, clustered retries, hourly drift, a daily swing,
scanned-PDF batches). Targets: A/A rolled back in <= 1 % of runs in the ramp and in the 24 h;
+2 points, x1.5 processing and x3 queue wait reaching 100 % silently in <= 5 % of runs.
--headline-only stops there. Issue 36's own table (1 to 100 documents a minute, the hours to
100 %, where each step's time goes) is `bench/gate_defaults.py`'s, the bound
`bench/gate_bound.py`'s.

The tables after it (issue 23) are the tests on their own, at fixed step ends:

Each run is a rollout through the plan's steps (--plan, per cent served from Kafka, --dwell-min
minutes each) at --tasks-per-min tasks a minute (a daily swing of +-30 %, Poisson arrivals), in
documents of --tasks-a-document tasks on average (4; geometric: many small documents, a few
large ones). A document's tasks all take one path and share its fate, as RAGFlow's do: 1 % of
documents are broken and fail every task, and 3 % of the other tasks fail on their own (4 % of
tasks in all); each document is slower or faster as a whole (x e^N(0, 0.5)). The gate's
failure and latency tests count documents (ragflow_mq records each document's first started,
finished and failed task), so every minute each path's finished documents fail as above and
give one processing time and one queue wait, drawn from the scenario's populations and
recorded in the histograms ragflow_mq writes (the minute's counts, as the gate reads them);
tasks are retried (1 %) on their own. The Kafka share of each minute wobbles around the
step's (x e^N(0, 0.25)). After every minute the gate's tests (sidecar/serve/gate_stats.py's
functions, on the window from the rollout's start) decide: roll back when a test's e-value
reaches 1/alpha_i; at the end of each step's dwell, promote when each path has
--min-documents finished documents and no test is at its hold level. The 100 % step is not
simulated here (the headline's hold-back watch is; without a hold-back, the watch against a
baseline is bench/watch_calibration.py's).

Populations of processing time (queue wait: lognormal, median 3 s, sigma 1.5, on both paths):
- lognormal: median 20 s, sigma 1, and 5 % of tasks with a tail of minutes (median 5 min);
- heavy: 85 % lognormal (median 8 s, sigma 0.8), 15 % Pareto from 30 s (shape 1.2), to 3 h;
- bounds: every time within 0.3 % of one of the histogram's bounds from 1 s to 1 h;
- legacy: the lognormal one recorded by builds before issue 23 (the old bucket layout).

Scenarios per population: A/A (both paths alike), failures +2 points on Kafka (each Kafka
task fails on its own 5 % of the time, not 3 %: 6 % of tasks vs 4 %), Kafka's processing times
1.5x. Printed: false roll-backs (A/A, target <= GATE_ALPHA), promotion at every step's dwell
end (A/A, target >= 90 %), detection before the ramp ends (A/B, target >= 95 %), and the tasks
per path seen at the roll-back. Then, at a fixed share, the tasks per path the tests need to
detect each regression (median and 95th percentile). Last, not a target: why the unit is the
document. The same A/A rollouts with 0.5 to 2 % of documents failing whole, counted by task
(as the gate did before) and by document.

Usage: .venv/bin/python bench/gate_calibration.py [--runs 400] [--tasks-per-min 100]
       [--tasks-a-document 10] [--dwell-min 240] [--plan 1,5,25,50] [--alpha 0.01]
       [--min-documents 50] [--seed 1] [--headline-runs 200] [--documents-per-min 25,100]
       [--headline-only]
Exit 0 when every target is met, 1 otherwise.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass

import numpy as np
from bench_common import loadavg
from gate_defaults import headline, watched
from gate_populations import (
    ALONE,
    FLOOR_MS,
    POPULATIONS,
    RETRY,
    bucket_probabilities,
    document_failure,
    percentiles,
    queue_wait,
    task_failure,
)

from sidecar.serve import histograms as hist
from sidecar.serve.gate_tests import RETRY_CLUSTER, TESTS
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

CHUNK = 32  # runs simulated at once, a block of minutes at a time: ~100 MB of floats
BLOCK = 240


@dataclass(frozen=True)
class Scenario:
    population: str
    kafka_alone: float = ALONE  # Kafka's tasks failing on their own
    kafka_slowdown: float = 1.0

    @property
    def aa(self) -> bool:
        return self.kafka_alone == ALONE and self.kafka_slowdown == 1.0

    @property
    def name(self) -> str:
        if self.kafka_alone != ALONE:
            before, after = task_failure(ALONE), task_failure(self.kafka_alone)
            return f"{self.population}: failures {100 * before:.3g} -> {100 * after:.3g} %"
        if self.kafka_slowdown != 1.0:
            return f"{self.population}: processing x{self.kafka_slowdown:g}"
        return f"{self.population}: A/A"


@dataclass
class Outcome:
    """Per run: the minute of the first roll-back (-1: none), the documents per path by then,
    and whether every step's dwell ended in a promotion."""

    rollback_minute: Array
    kafka_documents: Array
    redis_documents: Array
    on_schedule: Array


@dataclass(frozen=True)
class Plan:
    """What every run of a scenario shares: the share each minute, the step ends, the load."""

    schedule: Array  # the planned Kafka share, per minute
    step_ends: Array  # the minutes at which a step's dwell ends
    rate: Array  # tasks per minute
    alpha: float
    min_documents: int  # per path
    tasks_a_document: float


@dataclass(frozen=True)
class Population:
    """A scenario's bucket probabilities: (Kafka's, Redis's) per latency, on ``bounds``."""

    bounds: tuple[float, ...]
    probs: dict[str, tuple[Array, Array]]


def simulate(rng: np.random.Generator, scenario: Scenario, plan: Plan, runs: int) -> Outcome:
    sampler, bounds, spread = POPULATIONS[scenario.population]
    slower = bucket_probabilities(rng, sampler, bounds, scenario.kafka_slowdown, spread=spread)
    wait = bucket_probabilities(rng, queue_wait, bounds)
    population = Population(
        bounds,
        {
            "processing": (
                slower,
                bucket_probabilities(rng, sampler, bounds, spread=spread),
            ),
            "queue_wait": (wait, wait),
        },
    )
    failure = np.array(
        [
            document_failure(rng, scenario.kafka_alone, plan.tasks_a_document),
            document_failure(rng, ALONE, plan.tasks_a_document),
        ]
    )
    parts = [
        _chunk(rng, failure, plan, population, min(CHUNK, runs - start))
        for start in range(0, runs, CHUNK)
    ]
    return Outcome(*(np.concatenate(column) for column in zip(*parts, strict=True)))


def _chunk(
    rng: np.random.Generator, failure: Array, plan: Plan, population: Population, n: int
) -> tuple[Array, ...]:
    """``n`` runs, simulated a block of minutes at a time, up to every run's roll-back;
    ``failure``: the chance that a document fails, (Kafka's, Redis's)."""
    each = plan.alpha / len(TESTS)
    rollback, hold = math.log(1 / each), math.log(math.sqrt(1 / each))
    mixtures = (COUNT_MIXTURE, COUNT_MIXTURE, TILT_MIXTURE, TILT_MIXTURE)
    carried = [np.zeros((n, len(mixture.nodes))) for mixture in mixtures]
    first = np.full(n, -1)
    seen = np.zeros((n, 2))  # documents per path (kafka, redis) to the roll-back, or the end
    on_time = np.ones(n, dtype=bool)
    for begin in range(0, len(plan.schedule), BLOCK):
        minutes = np.arange(begin, min(begin + BLOCK, len(plan.schedule)))
        wobble = np.exp(rng.normal(0, 0.25, (n, len(minutes))))
        share = np.clip(plan.schedule[minutes] * wobble, 0, 1)
        rate = plan.rate[minutes] / plan.tasks_a_document
        documents = np.stack([rng.poisson(rate * share), rng.poisson(rate * (1 - share))])
        # Retries are counted by task: the tasks of the minute's documents, on average.
        tasks = np.rint(documents * plan.tasks_a_document).astype(int)
        log_e = []
        for test, (units, p, cluster) in enumerate(
            ((documents, failure, 1.0), (tasks, np.array([RETRY, RETRY]), RETRY_CLUSTER))
        ):
            events = rng.binomial(units, p[:, None, None]) / cluster
            pi = shares(units[0].astype(float), units[1].astype(float))
            ratios = count_log_ratios(events[0], events.sum(axis=0), pi, COUNT_MIXTURE.nodes)
            log_e.append(_accumulate(carried, test, ratios, COUNT_MIXTURE))
        for test, latency in enumerate(("processing", "queue_wait"), start=2):
            k, r = (rng.multinomial(documents[i], population.probs[latency][i]) for i in (0, 1))
            counts = np.stack([k, r]).astype(float)
            merged, both = hist.merge_floor(population.bounds, counts, FLOOR_MS)
            ratios = tilt_log_ratios(both[0], both[1], hist.scores(merged), TILT_MIXTURE.nodes)
            log_e.append(_accumulate(carried, test, ratios, TILT_MIXTURE))
        # Dead letters: none on either path in these populations, so that e-value stays 1.
        stats = np.stack(log_e)  # (tests, runs, minutes)
        crossed = (stats >= rollback).any(axis=0) & (first < 0)[:, None]
        now = crossed.any(axis=1)
        first[now] = begin + crossed[now].argmax(axis=1)
        counted = np.where((first < 0)[:, None] | (minutes <= first[:, None]), documents, 0)
        running = seen.T[:, :, None] + np.cumsum(counted, axis=2)  # (paths, runs, minutes)
        seen = running[:, :, -1].T
        for end in (end for end in plan.step_ends if begin <= end < begin + len(minutes)):
            calm = (stats[:, :, end - begin] < hold).all(axis=0)
            enough = running[:, :, end - begin].min(axis=0) >= plan.min_documents
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


def plan_of(args: argparse.Namespace, schedule: Array, step_ends: Array) -> Plan:
    daily = 1 + 0.3 * np.sin(2 * np.pi * np.arange(len(schedule)) / 1440)
    return Plan(
        schedule,
        step_ends,
        args.tasks_per_min * daily,
        args.alpha,
        args.min_documents,
        args.tasks_a_document,
    )


def ramp(args: argparse.Namespace, rng: np.random.Generator) -> bool:
    steps = [float(p) / 100 for p in args.plan.split(",")]
    schedule = np.repeat(steps, args.dwell_min)
    plan = plan_of(args, schedule, np.arange(1, len(steps) + 1) * args.dwell_min - 1)
    print(
        f"ramp {args.plan} %, {args.dwell_min} min a step, {args.tasks_per_min:g} tasks/min in "
        f"documents of {args.tasks_a_document:g} tasks on average, {args.runs} runs an A/A "
        f"scenario ({args.runs // 2} an A/B one), GATE_ALPHA={args.alpha:g}, "
        f"GATE_MIN_DOCUMENTS={args.min_documents}"
    )
    print(
        f"{'scenario':<36} {'rolled back':>12} {'promoted on time':>17} "
        f"{'documents kafka p50/p95':>24} {'documents redis p50/p95':>24}"
    )
    ok = True
    for population in POPULATIONS:
        for scenario in (
            Scenario(population),
            Scenario(population, kafka_alone=ALONE + 0.02),
            Scenario(population, kafka_slowdown=1.5),
        ):
            # A/A needs the runs: its false roll-backs are rare events; A/B half as many.
            out = simulate(rng, scenario, plan, args.runs if scenario.aa else args.runs // 2)
            hit = out.rollback_minute >= 0
            rate, promoted = hit.mean(), out.on_schedule.mean()
            met = (rate <= args.alpha and promoted >= 0.9) if scenario.aa else rate >= 0.95
            ok &= bool(met)
            shown = f"{100 * promoted:.1f}%" if scenario.aa else "-"
            print(
                f"{scenario.name:<36} {100 * rate:>11.2f}% {shown:>17} "
                f"{percentiles(out.kafka_documents[hit]):>24} "
                f"{percentiles(out.redis_documents[hit]):>24}  {'ok' if met else 'MISSED'}"
            )
    return ok


def fixed_shares(args: argparse.Namespace, rng: np.random.Generator) -> None:
    """Documents per path seen when each regression is detected, at a share held fixed."""
    print(
        f"\nat a fixed share (lognormal population, {args.tasks_per_min:g} tasks/min, "
        f"{args.fixed_runs} runs): documents per path at detection, p50 / p95 "
        f"(x {args.tasks_a_document:g} for tasks)"
    )
    print(f"{'share':>6} {'regression':<24} {'detected':>9} {'kafka':>18} {'redis':>20}")
    for percent in (1, 5, 25, 50):
        minutes = math.ceil(args.fixed_tasks / (args.tasks_per_min * percent / 100))
        plan = plan_of(args, np.full(minutes, percent / 100), np.array([minutes - 1]))
        for scenario in (
            Scenario("lognormal", kafka_alone=ALONE + 0.02),
            Scenario("lognormal", kafka_slowdown=1.5),
        ):
            out = simulate(rng, scenario, plan, args.fixed_runs)
            hit = out.rollback_minute >= 0
            label = scenario.name.split(": ")[1]
            kafka, redis = out.kafka_documents[hit], out.redis_documents[hit]
            print(
                f"{percent:>5}% {label:<24} {100 * hit.mean():>8.1f}% "
                f"{percentiles(kafka):>18} {percentiles(redis):>20}"
            )


def clustered(args: argparse.Namespace, rng: np.random.Generator) -> None:
    """Not a target: why the unit is the document. A document's tasks all take one path (the
    sticky hash), and a broken one fails them all; counted by task, the failures of one
    document read as independent ones."""
    steps = [float(p) / 100 for p in args.plan.split(",")]
    schedule, size = np.repeat(steps, args.dwell_min), 10
    print(
        f"\nA/A, documents of {size} tasks, some failing whole (failure test alone, "
        f"{args.runs} runs; 4 % of tasks fail in all): false roll-backs counted"
    )
    level = math.log(len(TESTS) / args.alpha)
    for whole in (0.0, 0.005, 0.01, 0.02):
        by_task = by_document = 0
        alone = (0.04 - whole) / (1 - whole)
        for start in range(0, args.runs, CHUNK):
            n = min(CHUNK, args.runs - start)
            share = np.clip(schedule * np.exp(rng.normal(0, 0.25, (n, len(schedule)))), 0, 1)
            docs = np.stack(
                [rng.poisson(args.tasks_per_min / size * s) for s in (share, 1 - share)]
            )
            broken = rng.binomial(docs, whole)
            # The other documents' tasks fail on their own: how many, and in how many documents.
            failed_alone = rng.binomial(size * (docs - broken), alone)
            some = rng.binomial(docs - broken, 1 - (1 - alone) ** size)
            for failed, units, counter in (
                (size * broken + failed_alone, size * docs, "task"),
                (broken + some, docs, "document"),
            ):
                pi = shares(units[0].astype(float), units[1].astype(float))
                ratios = count_log_ratios(failed[0], failed.sum(axis=0), pi, COUNT_MIXTURE.nodes)
                log_e = log_e_value(np.cumsum(ratios, axis=1), COUNT_MIXTURE)
                rolled = int((log_e.max(axis=1) >= level).sum())
                if counter == "task":
                    by_task += rolled
                else:
                    by_document += rolled
        print(
            f"  {100 * whole:>4g} % of documents fail whole: by task "
            f"{100 * by_task / args.runs:.1f} %, by document "
            f"{100 * by_document / args.runs:.1f} % (this test's share of GATE_ALPHA: "
            f"{100 * args.alpha / len(TESTS):g} %)"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=400, help="runs a ramp scenario")
    parser.add_argument("--tasks-per-min", type=float, default=100.0)
    # RAGFlow splits a PDF into tasks of 12 pages (task_page_size) and parses other files in
    # one: 4 on average is a knowledge base of PDFs of some 40 pages among single-task files.
    parser.add_argument("--tasks-a-document", type=float, default=4.0, help="on average")
    parser.add_argument("--dwell-min", type=int, default=240, help="minutes a step")
    parser.add_argument("--plan", default="1,5,25,50", help="per cent served, the steps below 100")
    parser.add_argument("--alpha", type=float, default=0.01, help="GATE_ALPHA")
    parser.add_argument("--min-documents", type=int, default=50, help="GATE_MIN_DOCUMENTS")
    parser.add_argument("--headline-runs", type=int, default=200, help="runs a scenario")
    parser.add_argument("--documents-per-min", default="25,100", help="headline loads")
    parser.add_argument("--headline-only", action="store_true")
    parser.add_argument("--fixed-runs", type=int, default=100, help="runs a fixed-share case")
    parser.add_argument("--fixed-tasks", type=int, default=10_000, help="kafka tasks at most")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    print(loadavg())
    started = time.monotonic()
    ok = True
    for load in (float(x) for x in args.documents_per_min.split(",")):
        ok &= headline(rng, args.headline_runs, load)
        print()
    watched(rng, args.headline_runs // 2, max(float(x) for x in args.documents_per_min.split(",")))
    print()
    if args.headline_only:
        print(f"{time.monotonic() - started:.0f} s; {loadavg()}")
        print("every target met" if ok else "a target was MISSED")
        return 0 if ok else 1
    ok &= ramp(args, rng)
    fixed_shares(args, rng)
    clustered(args, rng)
    print(f"\n{time.monotonic() - started:.0f} s; {loadavg()}")
    print("every target met" if ok else "a target was MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
