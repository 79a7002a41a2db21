"""The autopilot as a small state machine: each look at the gate is one transition, recorded
with its reason. Pure (no I/O), so every rule can be read and tried on its own.

The phases, the triggers and every move between them are one table,
:data:`~sidecar.rollout.transitions.TRANSITIONS`: :func:`decide` and :func:`command` name the
trigger, take its row and do what the row says; this module holds the state and the rules
that choose the trigger.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from sidecar.config.rollout import RolloutSettings
from sidecar.rollout.transitions import (
    ACTIONS,
    COMMANDS,
    PHASES,
    STOPPED,
    Action,
    Command,
    GateDecision,
    Phase,
    Transition,
    Trigger,
    transition,
)

# The vocabulary, whose single source is .transitions; then the machine.
__all__ = ["ACTIONS", "COMMANDS", "PHASES", "Action", "Command", "GateDecision", "Phase"]
__all__ += [
    "Decision",
    "EvidenceNeeded",
    "GateView",
    "RolloutState",
    "command",
    "decide",
    "evidence_needed",
]


@dataclass(frozen=True)
class GateView:
    """What the autopilot takes from one gate run over the current step."""

    decision: GateDecision
    reasons: tuple[str, ...] = ()
    # Documents finished on each path since the step began (the step's own evidence).
    kafka_documents: int = 0
    redis_documents: int = 0
    needed: str = ""  # the gate's estimate of the evidence still needed, when it holds


@dataclass(frozen=True)
class RolloutState:
    """Where the rollout is; persisted after every transition."""

    phase: Phase = "ramping"
    step: int = -1  # index in the plan; -1 before the first step
    share: float = 0.0  # the live share this state stands for
    step_since_ms: int = 0
    started_ms: int = 0
    last_good: float = 0.0  # the share of the last step promoted from
    paused_phase: Phase | None = None
    updated_ms: int = 0

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> RolloutState:
        data: dict[str, Any] = json.loads(text)
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class Decision:
    """One transition: what was done, from which share to which, and why."""

    at_ms: int
    action: Action
    phase: Phase
    share_from: float
    share_to: float
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_fields(self) -> dict[str, str]:
        return {
            "at_ms": str(self.at_ms),
            "action": self.action,
            "phase": self.phase,
            "share_from": f"{self.share_from:g}",
            "share_to": f"{self.share_to:g}",
            "reason": self.reason,
            "evidence": json.dumps(self.evidence, sort_keys=True),
        }

    @classmethod
    def from_fields(cls, fields: dict[str, str]) -> Decision:
        return cls(
            at_ms=int(fields["at_ms"]),
            action=fields["action"],  # type: ignore[arg-type]
            phase=fields["phase"],  # type: ignore[arg-type]
            share_from=float(fields["share_from"]),
            share_to=float(fields["share_to"]),
            reason=fields["reason"],
            evidence=json.loads(fields.get("evidence") or "{}"),
        )


@dataclass(frozen=True)
class EvidenceNeeded:
    """What a step still lacks before the gate's word can promote it: dwell and documents."""

    dwell_s: float  # 0 once the step's dwell is over
    documents: dict[str, int]  # path -> finished documents still needed in this step


def evidence_needed(
    plan: RolloutSettings,
    state: RolloutState,
    kafka_documents: int,
    redis_documents: int,
    now_ms: int,
) -> EvidenceNeeded:
    """The dwell left and the documents each path still needs in the current step. At the
    plan's last step no Redis document is needed: at 100 % nothing is left on Redis, and the
    hold-back is a control for the harm tests, with nothing left to promote on its evidence.
    One rule for the autopilot and for ``/metrics``, so the dashboard shows what the autopilot
    waits for."""
    left_s = plan.dwell_s - (now_ms - state.step_since_ms) / 1000
    last = state.step + 1 >= len(plan.steps)
    redis_needed = 0 if last else max(plan.min_documents - redis_documents, 0)
    return EvidenceNeeded(
        dwell_s=max(left_s, 0.0),
        documents={"kafka": max(plan.min_documents - kafka_documents, 0), "redis": redis_needed},
    )


def decide(
    plan: RolloutSettings, state: RolloutState, gate: GateView | None, now_ms: int
) -> tuple[RolloutState, Decision]:
    """The next state and the decision that leads there; ``gate`` is ``None`` when the gate
    was not asked (a phase that does not move on its own)."""
    trigger, reason, evidence = _turn(plan, state, gate, now_ms)
    return _apply(
        plan,
        state,
        transition(state.phase, trigger),
        now_ms=now_ms,
        reason=reason,
        evidence=evidence,
    )


def command(
    plan: RolloutSettings, state: RolloutState, order: Command, now_ms: int, by: str
) -> tuple[RolloutState, Decision]:
    """An operator's ``pause``, ``resume`` or ``abort``."""
    reason = f"{order} by {by}"
    trigger: Trigger
    if order == "abort":
        trigger = "abort"
    elif order == "pause":
        trigger = "already_paused" if state.phase == "paused" else "pause"
        reason += ": already paused" if state.phase == "paused" else ""
    elif state.phase == "paused" and state.paused_phase == "ramping":
        trigger = "resume_ramping"
    elif state.phase == "paused" and state.paused_phase == "watching":
        trigger = "resume_watching"
    elif state.phase in STOPPED:
        trigger = "resume_over"
    else:
        trigger, reason = "not_paused", f"{reason}: not paused"
    return _apply(
        plan, state, transition(state.phase, trigger), now_ms=now_ms, reason=reason, evidence={}
    )


def _turn(
    plan: RolloutSettings, state: RolloutState, gate: GateView | None, now_ms: int
) -> tuple[Trigger, str, dict[str, Any]]:
    """Which row of the table a turn takes, with its reason and the gate's evidence; the order
    of the checks is the order of the table's turn rows."""
    if state.phase in STOPPED:
        return "awaiting_resume", f"{state.phase}: waiting for `rollout resume`", {}
    if state.step < 0:
        return "first_turn", "the plan's first step", {}
    if gate is None:
        return "gate_unread", "the gate was not read", {}
    evidence: dict[str, Any] = {
        "kafka_documents": gate.kafka_documents,
        "redis_documents": gate.redis_documents,
        "gate": gate.decision,
    }
    if gate.decision == "rollback":
        reason = "the gate rolls back: " + "; ".join(gate.reasons or ("no reason given",))
        return "gate_rolls_back", reason, evidence
    if state.phase == "watching":
        why = "; ".join(gate.reasons) if gate.reasons else "the gate finds no regression"
        return "watch_goes_on", f"watching at {state.share:g} %: {why}", evidence
    needed = evidence_needed(plan, state, gate.kafka_documents, gate.redis_documents, now_ms)
    if needed.dwell_s > 0:
        reason = f"dwell: {needed.dwell_s:.0f} s left at {state.share:g} %"
        return "dwell_left", reason, evidence
    short = [f"{path} {n} more" for path, n in needed.documents.items() if n > 0]
    if short:
        reason = f"evidence at {state.share:g} %: documents needed, " + ", ".join(short)
        return "documents_short", reason, evidence
    if gate.decision == "hold":
        reasons = "; ".join(gate.reasons) or "no reason given"
        estimate = f" (needs {gate.needed})" if gate.needed else ""
        return "gate_holds", f"the gate holds: {reasons}{estimate}", evidence
    if state.step + 1 >= len(plan.steps):
        reason = f"the plan's last step ({state.share:g} %) passed the gate: watching"
        return "last_step_passes", reason, evidence
    return "gate_promotes", "the gate promotes", evidence


def _apply(
    plan: RolloutSettings,
    state: RolloutState,
    row: Transition,
    *,
    now_ms: int,
    reason: str,
    evidence: dict[str, Any],
) -> tuple[RolloutState, Decision]:
    """What the row does to the state; its action and phase are the ones recorded."""
    phase = row.target or state.phase
    if row.action == "hold":
        return _hold(state, now_ms, reason, evidence)
    if row.action in ("start", "promote") and row.trigger != "last_step_passes":
        step = 0 if row.action == "start" else state.step + 1
        return _move(state, row.action, phase, step, plan, now_ms=now_ms, reason=reason)
    share = state.share
    if row.trigger == "resume_over":
        # From the top of the plan: a rolled-back or aborted shift starts over.
        fresh = RolloutState(started_ms=now_ms, updated_ms=now_ms, share=state.share)
        new, decision = _move(fresh, row.action, phase, 0, plan, now_ms=now_ms, reason=reason)
        return new, dataclasses.replace(decision, share_from=state.share)
    if row.action == "rollback":
        share = state.last_good if plan.on_rollback == "last_good" else 0.0
        new = dataclasses.replace(
            state, phase=phase, share=share, step_since_ms=now_ms, updated_ms=now_ms
        )
    elif row.action == "abort":
        share = 0.0
        new = dataclasses.replace(
            state, phase=phase, share=share, paused_phase=None, updated_ms=now_ms
        )
    elif row.action == "pause":
        new = dataclasses.replace(state, phase=phase, paused_phase=state.phase, updated_ms=now_ms)
    elif row.action == "resume":
        new = dataclasses.replace(
            state, phase=phase, paused_phase=None, step_since_ms=now_ms, updated_ms=now_ms
        )
    else:  # the last step passed: watching, at the share in force
        new = dataclasses.replace(state, phase=phase, updated_ms=now_ms)
    return new, Decision(now_ms, row.action, phase, state.share, share, reason, evidence)


def _move(
    state: RolloutState,
    action: Action,
    phase: Phase,
    step: int,
    plan: RolloutSettings,
    *,
    now_ms: int,
    reason: str,
) -> tuple[RolloutState, Decision]:
    share = plan.share_of(step)
    new = dataclasses.replace(
        state,
        phase=phase,
        step=step,
        share=share,
        step_since_ms=now_ms,
        started_ms=state.started_ms or now_ms,
        last_good=state.share if action == "promote" else state.last_good,
        updated_ms=now_ms,
    )
    held = plan.steps[step] - share
    back = f", {held:g} % held back on redis" if held > 0 else ""
    text = (
        f"{reason}: {state.share:g} % -> {share:g} % (step {step + 1} of {len(plan.steps)}{back})"
    )
    return new, Decision(now_ms, action, phase, state.share, share, text)


def _hold(
    state: RolloutState, now_ms: int, reason: str, evidence: dict[str, Any] | None = None
) -> tuple[RolloutState, Decision]:
    new = dataclasses.replace(state, updated_ms=now_ms)
    return new, Decision(
        now_ms, "hold", state.phase, state.share, state.share, reason, evidence or {}
    )
