"""The autopilot's table of transitions: every row is reachable, no move happens outside it,
and docs/operations.md shows it as it is (no services)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator

import pytest

from dashboards import served_share
from sidecar.config.rollout import RolloutSettings
from sidecar.rollout import machine
from sidecar.rollout.machine import GateView, RolloutState, command, decide
from sidecar.rollout.transitions import (
    ACTIONS,
    COMMANDS,
    PHASES,
    TRANSITIONS,
    TRIGGERS,
    Phase,
    Transition,
    Trigger,
    transition,
)
from tools import rollout_table

PLAN = RolloutSettings(steps=(1.0, 25.0, 100.0), dwell_s=60.0, min_documents=10)
STEP_SINCE_MS = 1_000
# Turns before and after the step's dwell (60 s from STEP_SINCE_MS).
NOWS_MS = (STEP_SINCE_MS + 30_000, STEP_SINCE_MS + 120_000)


def _gates() -> Iterator[GateView | None]:
    yield None
    for decision, documents in itertools.product(("promote", "hold", "rollback"), (0, 4, 10)):
        yield GateView(decision, ("a reason",), documents, documents)  # type: ignore[arg-type]
    yield GateView("promote", (), 10, 0)  # a path short: Redis


def _states() -> Iterator[RolloutState]:
    """Every phase at every kind of step, paused over every other phase."""
    for phase, step in itertools.product(PHASES, (-1, 0, 1, 2)):
        share = 0.0 if step < 0 else PLAN.steps[step]
        base = RolloutState(
            phase=phase, step=step, share=share, step_since_ms=STEP_SINCE_MS, last_good=1.0
        )
        if phase == "paused":
            for before in PHASES:
                if before != "paused":
                    yield dataclasses.replace(base, paused_phase=before)
        elif phase != "watching" or step == len(PLAN.steps) - 1:
            yield base


def _walk(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Phase, Trigger, str, Phase]]:
    """Every turn and every order from every state: (phase from, the table's row taken, the
    action recorded, the phase to)."""
    taken: list[Trigger] = []

    def spy(phase: Phase, trigger: Trigger) -> Transition:
        taken.append(trigger)
        return transition(phase, trigger)

    monkeypatch.setattr(machine, "transition", spy)
    for state in _states():
        moves = [decide(PLAN, state, gate, now) for gate in _gates() for now in NOWS_MS]
        moves += [command(PLAN, state, order, NOWS_MS[0], by="ops") for order in COMMANDS]
        assert len(taken) == len(moves)
        for new, decision in moves:
            assert new.phase == decision.phase, decision
            yield state.phase, taken.pop(0), decision.action, decision.phase


def test_every_move_is_a_row_of_the_table_and_every_row_is_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = {
        (phase, row.action, row.target or phase): row.trigger
        for row in TRANSITIONS
        for phase in row.source
    }
    reached: set[Trigger] = set()
    for phase, trigger, action, to in _walk(monkeypatch):
        row = transition(phase, trigger)
        # What happened is what the row says, independently of how the machine chose it.
        assert (action, to) == (row.action, row.target or phase), (phase, trigger)
        assert (phase, action, to) in rows, f"{phase} -[{action}]-> {to} is not in the table"
        reached.add(trigger)
    assert set(TRIGGERS) - reached == set(), "rows never taken"


def test_each_trigger_has_exactly_one_row_and_a_row_outside_its_phases_is_refused() -> None:
    assert sorted(row.trigger for row in TRANSITIONS) == sorted(TRIGGERS)
    assert all(row.when and row.source for row in TRANSITIONS)
    with pytest.raises(ValueError, match="no transition 'gate_promotes' from phase 'watching'"):
        transition("watching", "gate_promotes")


def test_the_docs_show_the_table_as_it_is() -> None:
    text = rollout_table.DOC.read_text(encoding="utf-8")
    assert rollout_table.replaced(text) == text, "run `python -m tools.rollout_table`"
    block = rollout_table.render()
    for phase in PHASES:
        assert phase in block
    for row in TRANSITIONS:
        assert f"`{row.trigger}`" in block and row.when in block


def test_the_metrics_catalogue_and_the_dashboard_name_every_phase_and_action() -> None:
    """The phase and action labels come from the Literal types; what lists them by hand says
    the same, so a new phase or action cannot be left out of either."""
    catalogue = (rollout_table.DOC.parent / "metrics.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip(" `"): line for line in catalogue.splitlines()
            if line.startswith("| `ragflow_sidecar_rollout_")}  # fmt: skip
    for metric, names in (("phase", PHASES), ("decisions_total", ACTIONS)):
        listed = rows[f"ragflow_sidecar_rollout_{metric}"].split("|")[3]
        assert listed.count("`") // 2 - 1 == len(names), listed
        assert all(f"`{name}`" in listed for name in names), (metric, listed)
    assert {phase for phase, _ in served_share._PHASE_COLORS} - {"none"} == set(PHASES)
