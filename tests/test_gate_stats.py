"""The gate's sequential tests on evidence made in memory (no services): calibrated on A/A,
decisive on a clear regression, and reading the histograms older builds wrote."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pytest

from ragflow_mq.recorder import Recorder
from sidecar.serve.gate_stats import TESTS, SequentialResult, run_tests
from sidecar.serve.sequential import (
    COUNT_MIXTURE,
    TILT_MIXTURE,
    count_log_ratios,
    log_e_value,
    shares,
    tilt_log_ratios,
)
from sidecar.wire.contract import LEGACY_BUCKETS_MS
from sidecar.wire.evidence import SHARED_BUCKETS_MS, Evidence

ALPHA = 0.01
FLOOR_MS = 1000.0


def minute_of(
    rng: np.random.Generator,
    tasks: Mapping[str, int],
    failure: Mapping[str, float],
    median_ms: Mapping[str, float],
) -> Evidence:
    """One minute bucket as RAGFlow's processes would record it: per path, ``tasks`` finished,
    each failing with ``failure``, retried 1 %, lognormal times (sigma 1) around ``median_ms``;
    each task a document of its own (so its first events are its document's)."""
    recorder = Recorder()
    for path, n in tasks.items():
        for event in ("produced", "started", "finished", "document_started", "document_finished"):
            recorder.count(path, event, n, at_s=0)
        failed = int(rng.binomial(n, failure[path]))
        recorder.count(path, "failed", failed, at_s=0)
        recorder.count(path, "document_failed", failed, at_s=0)
        recorder.count(path, "retried", int(rng.binomial(n, 0.01)), at_s=0)
        for ms in rng.lognormal(math.log(median_ms[path]), 1.0, n):
            recorder.observe(path, "processing", float(ms), at_s=0)
            recorder.observe(path, "document_processing", float(ms), at_s=0)
        for ms in rng.lognormal(math.log(3000), 1.5, n):
            recorder.observe(path, "queue_wait", float(ms), at_s=0)
            recorder.observe(path, "document_queue_wait", float(ms), at_s=0)
    [counts] = recorder.drain().counts.values()
    return Evidence.from_hashes([dict(counts)])


def rollout(
    seed: int, minutes: int, kafka_failure: float = 0.04, slowdown: float = 1.0
) -> list[SequentialResult]:
    """``minutes`` of 100 tasks, the Kafka share stepping 1, 5, 25, 50 % along the way."""
    rng = np.random.default_rng(seed)
    evidence = []
    for m in range(minutes):
        share = (0.01, 0.05, 0.25, 0.5)[4 * m // minutes]
        k = int(rng.poisson(100 * share))
        evidence.append(
            minute_of(
                rng,
                {"kafka": k, "redis": int(rng.poisson(100 * (1 - share)))},
                {"kafka": kafka_failure, "redis": 0.04},
                {"kafka": 20_000 * slowdown, "redis": 20_000},
            )
        )
    return run_tests(evidence, ALPHA, FLOOR_MS)


def by_name(results: list[SequentialResult]) -> dict[str, SequentialResult]:
    return {result.name: result for result in results}


def test_alpha_is_split_evenly_over_the_five_tests() -> None:
    results = rollout(seed=1, minutes=8)
    assert [r.name for r in results] == list(TESTS)
    for result in results:
        assert result.alpha == pytest.approx(ALPHA / 5)
        assert result.threshold == pytest.approx(500)
        assert result.hold_level == pytest.approx(math.sqrt(500))


def test_a_healthy_rollout_is_not_rolled_back() -> None:
    """A/A: the same population on both paths, 400 minutes through the steps."""
    results = rollout(seed=7, minutes=400)
    for result in results:
        assert result.verdict == "ok", (result.name, result.e_value, result.effect)
        assert result.e_value < result.hold_level
        assert result.needed is None
    failed = by_name(results)["failed"]
    assert failed.details["kafka_finished_documents"] > 2000
    assert failed.details["redis_finished_documents"] > 20000


def test_a_clear_regression_is_rolled_back_with_its_effect() -> None:
    results = by_name(rollout(seed=3, minutes=200, kafka_failure=0.10, slowdown=2.0))
    failed, processing = results["failed"], results["processing"]
    assert failed.verdict == processing.verdict == "rollback"
    assert failed.e_value >= failed.threshold
    assert 1.8 < failed.details["rate_ratio"] < 3.5, failed.effect
    assert 1.5 < processing.details["p50_ratio"] < 2.6, processing.effect
    assert processing.details["kafka_slower_probability"] > 0.6
    assert processing.details["tilt"] > 0
    assert results["queue_wait"].verdict == results["retried"].verdict == "ok"


def test_kafka_better_is_no_regression() -> None:
    """One-sided: fewer failures and faster tasks on Kafka never roll back."""
    results = by_name(rollout(seed=4, minutes=200, kafka_failure=0.0, slowdown=0.5))
    assert results["failed"].verdict == results["processing"].verdict == "ok"
    assert results["failed"].details["rate_ratio"] < 0.1
    assert results["processing"].details["p50_ratio"] < 1.0


def test_leaning_evidence_holds_with_the_tasks_that_would_decide() -> None:
    rng = np.random.default_rng(0)
    minute = minute_of(
        rng,
        {"kafka": 400, "redis": 400},
        {"kafka": 0.0, "redis": 0.0},
        {"kafka": 500.0, "redis": 500.0},
    )
    minute["kafka"].counts["document_failed"], minute["redis"].counts["document_failed"] = 14, 1
    failed = by_name(run_tests([minute], ALPHA, FLOOR_MS))["failed"]
    assert failed.verdict == "hold", failed.e_value
    assert failed.hold_level <= failed.e_value < failed.threshold
    # At the estimated 14x rate ratio, 3.3 % of tasks failing, half of them on Kafka.
    assert failed.needed is not None
    assert 20 < failed.needed["kafka"] < 500 and failed.needed["kafka"] == failed.needed["redis"]


def test_every_minute_ratio_averages_at_most_one_when_the_paths_are_alike() -> None:
    """The supermartingale property the error rate rests on, for every node of the mixtures:
    whatever the share, a minute's likelihood ratio has mean <= 1 (up to Monte Carlo noise)."""
    rng = np.random.default_rng(11)
    for share in (0.01, 0.2, 0.5, 0.9):
        n = rng.poisson(150, 40_000)
        kafka = rng.binomial(n, share)
        redis = n - kafka
        failed_k, failed_r = rng.binomial(kafka, 0.05), rng.binomial(redis, 0.05)
        pi = shares(kafka.astype(float), redis.astype(float))
        counts = count_log_ratios(failed_k, failed_k + failed_r, pi, COUNT_MIXTURE.nodes[::20])
        assert (np.exp(counts).mean(axis=0) < 1.02).all(), share
        probs = np.full(8, 1 / 8)
        scores = np.log(np.geomspace(100, 1e6, 8))
        hist_k, hist_r = rng.multinomial(kafka, probs), rng.multinomial(redis, probs)
        tilts = tilt_log_ratios(hist_k, hist_r, scores, TILT_MIXTURE.nodes[::20])
        assert (np.exp(tilts).mean(axis=0) < 1.02).all(), share
    # So is the mixture of a minute's ratios, the e-value after one minute.
    one_minute = count_log_ratios(failed_k, failed_k + failed_r, pi, COUNT_MIXTURE.nodes)
    assert np.exp(log_e_value(one_minute, COUNT_MIXTURE)).mean() < 1.02


def legacy_minute(kafka_ms: float, redis_ms: float, n: int) -> dict[str, str]:
    """A minute hash as a build before issue 23 wrote it: b<index> fields of the old bounds."""
    fields = {}
    for path, ms in (("kafka", kafka_ms), ("redis", redis_ms)):
        index = next(i for i, bound in enumerate(LEGACY_BUCKETS_MS) if ms <= bound)
        fields[f"{path}:processing:b{index}"] = str(n)
        fields[f"{path}:finished"] = str(n)
        fields[f"{path}:started"] = str(n)
    return fields


def test_old_bucket_fields_are_read_and_merged_onto_the_shared_bounds() -> None:
    old = Evidence.from_hashes([legacy_minute(kafka_ms=40_000, redis_ms=7_000, n=50)])
    bounds, counts = old["kafka"].histogram("processing")
    assert bounds == SHARED_BUCKETS_MS
    assert counts[bounds.index(60_000)] == 50  # old (30 s, 60 s]
    assert old["kafka"].quantile_ms("processing", 0.5) == 60_000
    assert old["redis"].samples("processing") == 50
    # A window with minutes of both builds: every task counts, on the shared bounds.
    recorder = Recorder()
    for _ in range(30):
        recorder.observe("kafka", "processing", 45_000.0, at_s=0)  # new (30 s, 45 s]
    [new] = recorder.drain().counts.values()
    window = Evidence.from_hashes([legacy_minute(40_000, 7_000, 50), dict(new)])
    bounds, counts = window["kafka"].histogram("processing")
    assert bounds == SHARED_BUCKETS_MS and counts[bounds.index(60_000)] == 80
    # The tests take one sample a document, which those builds never recorded: their tasks,
    # however slow, are shown but do not decide.
    minutes = [Evidence.from_hashes([legacy_minute(40_000, 7_000, 20)]) for _ in range(5)]
    processing = by_name(run_tests(minutes, ALPHA, FLOOR_MS))["processing"]
    assert processing.verdict == "ok" and processing.details["kafka_samples"] == 0


def test_an_unknown_bucket_field_is_skipped() -> None:
    evidence = Evidence.from_hashes(
        [{"kafka:processing:v9b3": "5", "kafka:processing:b99": "5", "kafka:processing:v2b": "1"}]
    )
    assert evidence["kafka"].samples("processing") == 0


def test_times_under_the_floor_compare_as_equal() -> None:
    rng = np.random.default_rng(5)
    minutes = [
        minute_of(
            rng, {"kafka": 50, "redis": 50}, {"kafka": 0, "redis": 0}, {"kafka": 30.0, "redis": 3.0}
        )
        for _ in range(10)
    ]
    assert by_name(run_tests(minutes, ALPHA, FLOOR_MS))["processing"].verdict == "ok"
    assert by_name(run_tests(minutes, ALPHA, 0.0))["processing"].verdict == "rollback"


def _dead_letters(n_minutes: int, consumed: int, dead: int) -> list[Evidence]:
    """Minutes at 100 %: every record on Kafka, ``dead`` of ``consumed`` dead-lettered."""
    recorder = Recorder()
    for minute in range(n_minutes):
        recorder.count("kafka", "started", consumed - dead, at_s=60.0 * minute)
        recorder.count("kafka", "dead_lettered", dead, at_s=60.0 * minute)
    return [
        Evidence.from_hashes([dict(counts)])
        for _, counts in sorted(recorder.drain().counts.items())
    ]


def test_the_dead_letter_test_fires_at_100_percent() -> None:
    """Nothing is left on Redis to compare with; the test holds Kafka to a fixed rate."""
    bad = by_name(run_tests(_dead_letters(30, 100, 2), ALPHA, FLOOR_MS))["dead_lettered"]
    assert bad.verdict == "rollback", bad
    assert "kafka 2.000 % of consumed vs 0.1 % allowed" in bad.effect
    fine = by_name(run_tests(_dead_letters(30, 1000, 0), ALPHA, FLOOR_MS))["dead_lettered"]
    assert fine.verdict == "ok"
