"""The watch at 100 %: the Kafka path against a baseline of how the Redis path ran before, on
evidence made in memory (no services): calibrated on A/A, decisive on a regression, wired into
the gate's checks and into the autopilot's ``look()``."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from scipy.stats import binom

from sidecar.config import Settings
from sidecar.config.rollout import RolloutSettings
from sidecar.config.serve import GateSettings
from sidecar.errors import ConfigError
from sidecar.rollout import autopilot
from sidecar.rollout.machine import RolloutState, decide
from sidecar.serve import gate
from sidecar.serve.baseline import Baseline, run_baseline_tests
from sidecar.serve.gate_checks import Judged, analyse
from sidecar.serve.gate_stats import SequentialResult
from sidecar.serve.sequential import (
    COUNT_MIXTURE,
    TILT_MIXTURE,
    baseline_tilt_log_ratios,
    count_log_ratios,
    dominating,
    upper_rate,
)
from sidecar.wire.evidence import Evidence
from sidecar.wire.share import ShareValues
from tests.test_gate_stats import minute_of

ALPHA = 0.01
FLOOR_MS = 1000.0
MINUTE_MS = 60_000


def redis_minutes(rng: np.random.Generator, n: int) -> list[Evidence]:
    """The baseline: Redis tasks, 100 a minute, 4 % failing, lognormal times around 20 s."""
    return [minute_of(rng, {"redis": 100}, {"redis": 0.04}, {"redis": 20_000}) for _ in range(n)]


def kafka_minutes(
    rng: np.random.Generator, n: int, failure: float = 0.04, slowdown: float = 1.0
) -> list[Evidence]:
    """At 100 %: every task on Kafka, drawn like the baseline but for the regression."""
    return [
        minute_of(rng, {"kafka": 100}, {"kafka": failure}, {"kafka": 20_000 * slowdown})
        for _ in range(n)
    ]


def watch(seed: int, failure: float = 0.04, slowdown: float = 1.0) -> dict[str, SequentialResult]:
    rng = np.random.default_rng(seed)
    baseline = Baseline.of(0, 240 * MINUTE_MS, redis_minutes(rng, 240))
    minutes = kafka_minutes(rng, 240, failure, slowdown)
    results = run_baseline_tests(baseline.redis, minutes, ALPHA / 2, FLOOR_MS)
    return {result.name: result for result in results}


def test_kafka_drawn_like_the_baseline_is_not_rolled_back() -> None:
    """A/A at 100 %: 24,000 Kafka tasks against 24,000 Redis ones from before."""
    for result in watch(seed=7).values():
        assert result.against == "baseline"
        assert result.verdict == "ok", (result.name, result.e_value, result.effect)
        # Half of each test's share (GATE_ALPHA / 2 / 5) is the baseline's margin.
        assert result.alpha == pytest.approx(ALPHA / 20)
        assert result.details["margin_alpha"] == pytest.approx(ALPHA / 20)


def test_five_points_more_failures_on_kafka_are_rolled_back() -> None:
    results = watch(seed=3, failure=0.09)
    failed = results["failed"]
    assert failed.verdict == "rollback", failed.effect
    assert 8 < failed.details["kafka_percent"] < 10 and 3 < failed.details["baseline_percent"] < 5
    assert failed.details["baseline_bound_percent"] > failed.details["baseline_percent"]
    assert results["processing"].verdict == results["retried"].verdict == "ok"


def test_twice_the_processing_time_on_kafka_is_rolled_back() -> None:
    results = watch(seed=4, slowdown=2.0)
    processing = results["processing"]
    assert processing.verdict == "rollback", processing.effect
    assert 1.6 < processing.details["p50_ratio"] < 2.5
    assert results["failed"].verdict == results["queue_wait"].verdict == "ok"


def test_every_minute_ratio_averages_at_most_one_at_the_margin() -> None:
    """What the error rate rests on, computed exactly for every node of the mixtures: against
    a bound at or above Kafka's true rate, or slower than its true distribution, a minute's
    likelihood ratio has expectation at most 1 (exactly 1 at the bound itself)."""
    x = np.arange(101, dtype=float)
    ratios = np.exp(count_log_ratios(x, np.full_like(x, 100), np.full_like(x, 0.05),
                                     COUNT_MIXTURE.nodes))  # fmt: skip
    for rate in (0.05, 0.04, 0.01):
        mean = binom.pmf(x, 100, rate) @ ratios
        assert (mean <= 1 + 1e-9).all(), rate
    assert mean.max() < 1  # below the bound, strictly
    scores = np.log(np.geomspace(100, 1e6, 8))
    bound = np.array([0.05, 0.1, 0.15, 0.2, 0.2, 0.15, 0.1, 0.05])
    # One task per row, in each bucket: a minute's ratio is the product of its tasks'.
    one_task = np.exp(baseline_tilt_log_ratios(np.eye(8), bound, scores, TILT_MIXTURE.nodes))
    faster = np.array([0.3, 0.2, 0.15, 0.15, 0.1, 0.05, 0.03, 0.02])
    for truth in (bound, faster):
        assert (truth @ one_task <= 1 + 1e-9).all()
    slower = bound[::-1] * 0 + np.array([0.0, 0.05, 0.05, 0.1, 0.2, 0.2, 0.2, 0.2])
    assert (slower @ one_task > 1).all()  # what the test is there to see


def test_the_margins_lean_towards_the_baseline_being_worse() -> None:
    assert 0.04 < upper_rate(400, 10_000, 0.001) < 0.047
    assert upper_rate(0, 0, 0.001) == 1.0
    assert 0 < upper_rate(0, 10_000, 0.001) < 0.001  # no dead letters on Redis: a small bound
    slower = dominating(np.array([50.0, 30.0, 20.0]), 0.05)
    assert slower.sum() == pytest.approx(1.0) and (slower >= 0).all()
    assert slower[0] < 0.5 and slower[-1] > 0.2


def test_the_gate_splits_alpha_in_halves_and_holds_on_a_small_baseline() -> None:
    rng = np.random.default_rng(5)
    gate_settings = GateSettings(alpha=ALPHA, min_documents=200)
    ramp = redis_minutes(rng, 10)
    watched = kafka_minutes(rng, 10)
    served = Evidence.from_minutes([*ramp, *watched])
    judged = Judged()
    judged.kinds["match"] = 1000
    baseline = Baseline.of(0, 10 * MINUTE_MS, ramp)
    checks = analyse(gate_settings, judged, served, [*ramp, *watched], served_active=True,
                     baseline=baseline, watched=watched)  # fmt: skip
    tests = [c.test for c in checks if c.test is not None]
    assert [t.against for t in tests] == ["redis"] * 5 + ["baseline"] * 5
    assert [t.alpha for t in tests] == pytest.approx([ALPHA / 10] * 5 + [ALPHA / 20] * 5)
    # The margins (promotion's evidence, tests/test_margins.py) need minutes of both paths.
    tested = [c for c in checks if not c.name.startswith("margin: ")]
    assert all(c.verdict == "ok" for c in tested), [c.reason for c in tested if c.reason]
    small = Baseline.of(0, MINUTE_MS, ramp[:1])
    [size] = analyse(gate_settings, judged, served, watched, served_active=True,
                     baseline=small, watched=watched)[-1:]  # fmt: skip
    assert size.verdict == "hold" and "baseline" in size.reason


PLAN = RolloutSettings(
    steps=(50.0, 100.0), dwell_s=60.0, min_documents=10, interval_s=1.0, holdback_percent=0.0
)
STARTED_MS = 1_000 * MINUTE_MS
AT_100_MS = STARTED_MS + 240 * MINUTE_MS  # when the last step (100 %) began
NOW_MS = AT_100_MS + 120 * MINUTE_MS


class Minutes(dict[int, Evidence]):
    """The evidence minutes by minute number, read by the gate as from the state store."""

    async def served(self, since_s: float, until_s: float) -> tuple[list[Evidence], ShareValues]:
        span = range(int(since_s // 60), int(until_s // 60) + 1)
        return [self.get(m, Evidence.from_hashes([])) for m in span], ShareValues(100.0)

    async def judged(self, since_ms: int) -> Judged:
        judged = Judged()
        judged.kinds["match"] = 1000
        return judged


@pytest.fixture
def store() -> Minutes:
    return Minutes()


def fill(store: Minutes, failure_at_100: float, seed: int = 9) -> None:
    """A rollout: 240 minutes at 50 % (its Redis half the baseline), then 120 at 100 %."""
    rng = np.random.default_rng(seed)
    for m in range(STARTED_MS // MINUTE_MS, AT_100_MS // MINUTE_MS):
        store[m] = minute_of(
            rng, {"kafka": 50, "redis": 50}, {"kafka": 0.04, "redis": 0.04},
            {"kafka": 20_000, "redis": 20_000},
        )  # fmt: skip
    for m in range(AT_100_MS // MINUTE_MS, NOW_MS // MINUTE_MS + 1):
        store[m] = minute_of(rng, {"kafka": 100}, {"kafka": failure_at_100}, {"kafka": 20_000})


STATE = RolloutState(phase="watching", step=1, share=100.0, step_since_ms=AT_100_MS,
                     started_ms=STARTED_MS, last_good=50.0)  # fmt: skip


def settings() -> Settings:
    return Settings.from_env(
        {"MQ_BACKEND": "split", "KAFKA_TRAFFIC_PERCENT": "100", "KAFKA_SERVE_PERCENT": "100",
         "GATE_ALPHA": str(ALPHA)}
    )  # fmt: skip


async def test_watching_at_100_compares_with_the_rollouts_redis_before_and_stays(
    store: Minutes,
) -> None:
    assert autopilot.watch_baseline(STATE) == (STARTED_MS, AT_100_MS)
    fill(store, failure_at_100=0.04)
    view = await autopilot.look(settings(), STATE, NOW_MS, store)
    assert view.decision == "promote", view.reasons
    _, decision = decide(PLAN, STATE, view, NOW_MS)
    assert decision.action == "hold" and decision.share_to == 100.0


async def test_a_regression_while_watching_rolls_back(
    store: Minutes, monkeypatch: pytest.MonkeyPatch
) -> None:
    fill(store, failure_at_100=0.09)
    calls: list[Any] = []
    collect = gate.collect

    async def spy(*args: Any, **kwargs: Any) -> gate.GateReport:
        calls.append(args[3])
        return await collect(*args, **kwargs)

    monkeypatch.setattr(autopilot, "collect", spy)
    view = await autopilot.look(settings(), STATE, NOW_MS, store)
    assert calls == [(STARTED_MS, AT_100_MS)]
    assert view.decision == "rollback"
    assert any("kafka fails more than redis did before" in r for r in view.reasons), view.reasons
    _, decision = decide(PLAN, STATE, view, NOW_MS)
    assert decision.action == "rollback" and decision.share_to == 0.0


def test_below_100_there_is_no_baseline() -> None:
    ramping = RolloutState(phase="ramping", step=0, share=50.0, step_since_ms=STARTED_MS,
                           started_ms=STARTED_MS)  # fmt: skip
    assert autopilot.watch_baseline(ramping) is None
    # A plan of one step of 100 % has nothing before it.
    only = RolloutState(phase="watching", step=0, share=100.0, step_since_ms=STARTED_MS,
                        started_ms=STARTED_MS)  # fmt: skip
    assert autopilot.watch_baseline(only) is None
    assert math.isclose(STATE.share, 100.0)


def test_gate_baseline_ends_where_the_window_starts() -> None:
    now = NOW_MS
    since = gate.parse_window("2h", now)
    assert gate.parse_baseline("6h", now, since) == (now - 6 * 3_600_000, since)
    with pytest.raises(ConfigError, match="--baseline: '1h' does not start before --window"):
        gate.parse_baseline("1h", now, since)
    with pytest.raises(ConfigError, match="--baseline: '3d' is longer than the 48 h kept"):
        gate.parse_baseline("3d", now, since)
    # The watched minutes are those after the baseline's last one.
    minutes = [Evidence.from_hashes([]) for _ in range(5)]
    baseline = Baseline.of(0, 2 * MINUTE_MS + 5, minutes[:3])
    assert len(baseline.after(minutes, 0)) == 2
