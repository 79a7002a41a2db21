"""The autopilot's transitions, one rule at a time (no services)."""

from __future__ import annotations

import dataclasses

import pytest

from sidecar.config import Settings
from sidecar.config.rollout import RolloutSettings, check_plan
from sidecar.errors import ConfigError
from sidecar.rollout.machine import GateView, RolloutState, command, decide

PLAN = RolloutSettings(
    steps=(1.0, 25.0, 100.0), dwell_s=60.0, min_documents=10, interval_s=1.0, holdback_percent=0.0
)
PROMOTE = GateView("promote", kafka_documents=10, redis_documents=10)


def _at_step(step: int, since_ms: int = 0, **changes: object) -> RolloutState:
    state = RolloutState(step=step, share=PLAN.steps[step], step_since_ms=since_ms, started_ms=1)
    return dataclasses.replace(state, **changes)  # type: ignore[arg-type]


def test_the_first_turn_starts_the_plan() -> None:
    state, decision = decide(PLAN, RolloutState(), None, 1_000)
    assert (state.phase, state.step, state.share) == ("ramping", 0, 1.0)
    assert (decision.action, decision.share_from, decision.share_to) == ("start", 0.0, 1.0)
    assert state.started_ms == state.step_since_ms == 1_000


def test_a_step_is_held_for_its_dwell_then_promoted() -> None:
    state = _at_step(0, since_ms=0)
    held, decision = decide(PLAN, state, PROMOTE, 59_000)
    assert decision.action == "hold" and "dwell" in decision.reason and held.step == 0
    promoted, decision = decide(PLAN, state, PROMOTE, 60_000)
    assert (decision.action, promoted.step, promoted.share, promoted.last_good) == (
        "promote", 1, 25.0, 1.0,
    )  # fmt: skip


def test_too_few_tasks_on_a_path_holds_and_says_how_many_more() -> None:
    view = GateView("promote", kafka_documents=4, redis_documents=10)
    _, decision = decide(PLAN, _at_step(0), view, 120_000)
    assert decision.action == "hold" and "kafka 6 more" in decision.reason


def test_the_gate_holding_holds_with_its_reasons() -> None:
    view = GateView("hold", ("failure rate: leaning",), 10, 10, needed="~300 tasks a path")
    _, decision = decide(PLAN, _at_step(0), view, 120_000)
    assert decision.action == "hold"
    assert "failure rate: leaning" in decision.reason and "~300 tasks" in decision.reason


@pytest.mark.parametrize(("on_rollback", "back"), [("zero", 0.0), ("last_good", 1.0)])
def test_a_roll_back_goes_to_zero_or_the_last_good_step_and_stays(
    on_rollback: str, back: float
) -> None:
    plan = dataclasses.replace(PLAN, on_rollback=on_rollback)  # type: ignore[arg-type]
    state = _at_step(1, last_good=1.0)
    view = GateView("rollback", ("kafka fails 5 % against 0 %",), 10, 10)
    state, decision = decide(plan, state, view, 5_000)
    assert (state.phase, state.share, decision.action) == ("rolled_back", back, "rollback")
    assert "kafka fails" in decision.reason
    # Even a promoting gate does not move it on: an operator resumes.
    state, decision = decide(plan, state, PROMOTE, 600_000)
    assert decision.action == "hold" and state.share == back


def test_the_last_step_watches_and_still_rolls_back() -> None:
    state, decision = decide(PLAN, _at_step(2), PROMOTE, 120_000)
    assert (state.phase, decision.action, state.share) == ("watching", "promote", 100.0)
    # At 100 % nothing is left on Redis to judge the step's evidence against: not a hold.
    state, decision = decide(PLAN, state, GateView("promote", kafka_documents=50), 180_000)
    assert decision.action == "hold" and "watching" in decision.reason
    state, decision = decide(PLAN, state, GateView("rollback", ("slower",), 50, 0), 240_000)
    assert (state.phase, state.share) == ("rolled_back", 0.0)


def test_pause_freezes_resume_goes_on_abort_takes_the_share_to_zero() -> None:
    state = _at_step(1)
    paused, decision = command(PLAN, state, "pause", 1_000, by="ops")
    assert paused.phase == "paused" and decision.share_to == 25.0
    _, held = decide(PLAN, paused, PROMOTE, 600_000)
    assert held.action == "hold"
    resumed, decision = command(PLAN, paused, "resume", 2_000, by="ops")
    assert (resumed.phase, resumed.step, resumed.step_since_ms) == ("ramping", 1, 2_000)
    aborted, decision = command(PLAN, resumed, "abort", 3_000, by="ops")
    assert (aborted.phase, aborted.share, decision.share_to) == ("aborted", 0.0, 0.0)
    again, decision = command(PLAN, aborted, "resume", 4_000, by="ops")
    assert (again.phase, again.step, again.share, decision.share_from) == (
        "ramping", 0, 1.0, 0.0,
    )  # fmt: skip


def test_the_state_survives_its_json() -> None:
    state = _at_step(1, paused_phase="ramping", phase="paused")
    assert RolloutState.from_json(state.to_json()) == state


def test_bad_plans_are_refused_naming_the_variable() -> None:
    for steps, problem in (
        ("1,x", "'x' is not a percentage"),
        ("5,1", "must rise"),
        ("0,5", "out of range"),
        ("1,101", "out of range"),
    ):
        with pytest.raises(ConfigError, match=problem) as caught:
            Settings.from_env({"ROLLOUT_STEPS": steps})
        assert caught.value.variable == "ROLLOUT_STEPS"
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"ROLLOUT_DWELL_S": "-1"})
    assert caught.value.variable == "ROLLOUT_DWELL_S"
    with pytest.raises(ConfigError, match="above the ceiling KAFKA_SERVE_PERCENT=50") as caught:
        check_plan(RolloutSettings(steps=(1.0, 50.0, 100.0)), ceiling=50.0)
    assert caught.value.variable == "ROLLOUT_STEPS"
    check_plan(RolloutSettings(steps=(1.0, 50.0)), ceiling=50.0)


def test_the_last_step_keeps_the_hold_back_on_redis_and_needs_only_kafkas_documents() -> None:
    """With ROLLOUT_HOLDBACK_PERCENT, 100 % serves 95 %: the watch keeps a concurrent Redis
    control for the harm tests, but there is nothing left to promote on the hold-back's
    evidence, so the last step waits for Kafka's documents only (at 5 documents a minute, 50
    Redis documents behind a 5 % hold-back were 200 minutes)."""
    plan = dataclasses.replace(PLAN, holdback_percent=5.0)
    state, decision = decide(plan, _at_step(1), PROMOTE, 120_000)
    assert (state.step, state.share, decision.share_to) == (2, 95.0, 95.0)
    assert "-> 95 % (step 3 of 3, 5 % held back on redis)" in decision.reason
    state, decision = decide(plan, state, GateView("promote", kafka_documents=4), 240_000)
    assert decision.action == "hold" and "kafka 6 more" in decision.reason
    assert "redis" not in decision.reason.split("documents needed")[1]
    state, decision = decide(plan, state, GateView("promote", kafka_documents=12), 300_000)
    assert (state.phase, state.share) == ("watching", 95.0)
