"""The autopilot as a small state machine: each look at the gate is one transition, recorded
with its reason. Pure (no I/O), so every rule can be read and tried on its own.

Phases: ``ramping`` (a step of the plan is in force; promoted once its dwell and its evidence
are in and the gate promotes), ``watching`` (the last step is in force; the gate keeps
judging it), ``paused`` (an operator froze the share where it is), ``rolled_back`` (the gate
said roll back: the share went to 0 or the last good step; stays until ``resume``) and
``aborted`` (an operator took the share to 0; stays until ``resume``).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from sidecar.config.rollout import RolloutSettings

Phase = Literal["ramping", "watching", "paused", "rolled_back", "aborted"]
PHASES: Final[tuple[Phase, ...]] = ("ramping", "watching", "paused", "rolled_back", "aborted")
Action = Literal["start", "promote", "hold", "rollback", "pause", "resume", "abort"]
ACTIONS: Final[tuple[Action, ...]] = (
    "start", "promote", "hold", "rollback", "pause", "resume", "abort",
)  # fmt: skip
Command = Literal["pause", "resume", "abort"]
COMMANDS: Final[tuple[Command, ...]] = ("pause", "resume", "abort")
GateDecision = Literal["promote", "hold", "rollback"]


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
    """The dwell left and the documents each path still needs in the current step. At 100 %
    no Redis document is needed: nothing is left on Redis to finish any. One rule for the autopilot
    and for ``/metrics``, so the dashboard shows what the autopilot waits for."""
    left_s = plan.dwell_s - (now_ms - state.step_since_ms) / 1000
    redis_needed = 0 if state.share >= 100.0 else max(plan.min_documents - redis_documents, 0)
    return EvidenceNeeded(
        dwell_s=max(left_s, 0.0),
        documents={"kafka": max(plan.min_documents - kafka_documents, 0), "redis": redis_needed},
    )


def decide(
    plan: RolloutSettings, state: RolloutState, gate: GateView | None, now_ms: int
) -> tuple[RolloutState, Decision]:
    """The next state and the decision that leads there; ``gate`` is ``None`` when the gate
    was not asked (a phase that does not move on its own)."""
    if state.phase in ("paused", "rolled_back", "aborted"):
        return _hold(state, now_ms, f"{state.phase}: waiting for `rollout resume`")
    if state.step < 0:
        return _move(
            state, "start", "ramping", 0, plan, now_ms=now_ms, reason="the plan's first step"
        )
    if gate is None:
        return _hold(state, now_ms, "the gate was not read")
    evidence = {
        "kafka_documents": gate.kafka_documents,
        "redis_documents": gate.redis_documents,
        "gate": gate.decision,
    }
    if gate.decision == "rollback":
        back = state.last_good if plan.on_rollback == "last_good" else 0.0
        reason = "the gate rolls back: " + "; ".join(gate.reasons or ("no reason given",))
        new = dataclasses.replace(
            state, phase="rolled_back", share=back, step_since_ms=now_ms, updated_ms=now_ms
        )
        return new, Decision(now_ms, "rollback", "rolled_back", state.share, back, reason, evidence)
    if state.phase == "watching":
        why = "; ".join(gate.reasons) if gate.reasons else "the gate finds no regression"
        return _hold(state, now_ms, f"watching at {state.share:g} %: {why}", evidence)
    needed = evidence_needed(plan, state, gate.kafka_documents, gate.redis_documents, now_ms)
    if needed.dwell_s > 0:
        reason = f"dwell: {needed.dwell_s:.0f} s left at {state.share:g} %"
        return _hold(state, now_ms, reason, evidence)
    short = [f"{path} {n} more" for path, n in needed.documents.items() if n > 0]
    if short:
        reason = f"evidence at {state.share:g} %: documents needed, " + ", ".join(short)
        return _hold(state, now_ms, reason, evidence)
    if gate.decision == "hold":
        reasons = "; ".join(gate.reasons) or "no reason given"
        estimate = f" (needs {gate.needed})" if gate.needed else ""
        return _hold(state, now_ms, f"the gate holds: {reasons}{estimate}", evidence)
    last = state.step + 1 >= len(plan.steps)
    if last:
        new = dataclasses.replace(state, phase="watching", updated_ms=now_ms)
        reason = f"the plan's last step ({state.share:g} %) passed the gate: watching"
        return new, Decision(
            now_ms, "promote", "watching", state.share, state.share, reason, evidence
        )
    return _move(
        state, "promote", "ramping", state.step + 1, plan, now_ms=now_ms, reason="the gate promotes"
    )


def command(
    plan: RolloutSettings, state: RolloutState, order: Command, now_ms: int, by: str
) -> tuple[RolloutState, Decision]:
    """An operator's ``pause``, ``resume`` or ``abort``."""
    reason = f"{order} by {by}"
    if order == "abort":
        new = dataclasses.replace(
            state, phase="aborted", share=0.0, paused_phase=None, updated_ms=now_ms
        )
        return new, Decision(now_ms, "abort", "aborted", state.share, 0.0, reason)
    if order == "pause":
        if state.phase == "paused":
            return _hold(state, now_ms, f"{reason}: already paused")
        new = dataclasses.replace(
            state, phase="paused", paused_phase=state.phase, updated_ms=now_ms
        )
        return new, Decision(now_ms, "pause", "paused", state.share, state.share, reason)
    # resume
    if state.phase == "paused" and state.paused_phase in ("ramping", "watching"):
        new = dataclasses.replace(
            state, phase=state.paused_phase, paused_phase=None, step_since_ms=now_ms,
            updated_ms=now_ms,
        )  # fmt: skip
        return new, Decision(now_ms, "resume", new.phase, state.share, state.share, reason)
    if state.phase in ("paused", "rolled_back", "aborted"):
        # From the top of the plan: a rolled-back or aborted shift starts over.
        fresh = RolloutState(started_ms=now_ms, updated_ms=now_ms, share=state.share)
        new, decision = _move(fresh, "resume", "ramping", 0, plan, now_ms=now_ms, reason=reason)
        return new, dataclasses.replace(decision, share_from=state.share)
    return _hold(state, now_ms, f"{reason}: not paused")


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
    share = plan.steps[step]
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
    text = f"{reason}: {state.share:g} % -> {share:g} % (step {step + 1} of {len(plan.steps)})"
    return new, Decision(now_ms, action, phase, state.share, share, text)


def _hold(
    state: RolloutState, now_ms: int, reason: str, evidence: dict[str, Any] | None = None
) -> tuple[RolloutState, Decision]:
    new = dataclasses.replace(state, updated_ms=now_ms)
    return new, Decision(
        now_ms, "hold", state.phase, state.share, state.share, reason, evidence or {}
    )
