"""The autopilot on ``/metrics``: its record in the state store, read back by the sidecar.

The autopilot (``ragflow-sidecar rollout run``) is a process of its own without an HTTP port,
and every sidecar process already reads the state store; so ``run`` and ``shadow`` export the
rollout: the state (phase, step, share), the decisions by action, the time of the newest one,
and what the current step still needs before it can be promoted. A poller of its own reads the
record every ``POLL_INTERVAL_S`` in one round trip (:meth:`RolloutStore.snapshot`), off the
scrape path; a failed read keeps the last values (and says so once per outage).

The values are the deployment's, not this process's: every sidecar instance on the same state
store reports the same, so dashboards take ``max``, never ``sum``, across instances.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Final

import valkey.asyncio as avalkey

from sidecar.config import Settings
from sidecar.errors import SidecarError
from sidecar.lifecycle import Poller
from sidecar.rollout.machine import ACTIONS, PHASES, evidence_needed
from sidecar.rollout.store import RolloutRecord, RolloutStore
from sidecar.telemetry.metrics import SidecarMetrics

# As the served evidence's poller: a decision shows within this plus a scrape interval.
POLL_INTERVAL_S: Final = 10.0
# The paths a step's evidence counts, the ``path`` label's values.
PATHS: Final = ("kafka", "redis")

Sample = tuple[dict[str, str], float]


class RolloutPoller(Poller):
    """Reads the autopilot's record from the state store every ``interval_s``."""

    def __init__(
        self, settings: Settings, *, client: avalkey.Valkey, interval_s: float = POLL_INTERVAL_S
    ) -> None:
        """``client`` is the caller's (the composition root's state store client): used
        between start and stop, never closed here."""
        super().__init__(interval_s, "rollout-poller")
        self._store = RolloutStore(client, settings.serve.key_prefix, settings.state.display_url)
        self.values = RolloutRecord()

    async def poll(self) -> bool:
        """One read of the record; ``False`` if it failed (the values stay as they were)."""
        try:
            record = await self._store.snapshot()
        except (SidecarError, ValueError) as exc:
            return self.failed("rollout metrics keep their last values", exc)
        self.answered("rollout metrics read from the state store again")
        self.values = record
        return True


def register_rollout_metrics(
    metrics: SidecarMetrics, poller: RolloutPoller, settings: Settings
) -> None:
    """The rollout's instruments, read from ``poller.values`` at collection time. Every phase,
    action and path is exported from the start (at 0 before the autopilot's first decision):
    a series that appears later loses its first increase, and annotations on a change of
    ``decisions_total`` need the 0 before it."""
    plan = settings.rollout

    def share() -> list[Sample]:
        state = poller.values.state
        return [({}, state.share if state is not None else 0.0)]

    def step() -> list[Sample]:
        state = poller.values.state  # its step counts from 0, and is -1 before the first
        return [({}, float(state.step + 1) if state is not None else 0.0)]

    def phases() -> list[Sample]:
        state = poller.values.state
        current = state.phase if state is not None else None
        return [({"phase": phase}, 1.0 if phase == current else 0.0) for phase in PHASES]

    def decisions() -> list[Sample]:
        # Every action at 0 first; an action of a later build in the same hash is shown too.
        counts: dict[str, int] = {**dict.fromkeys(ACTIONS, 0), **poller.values.counts}
        return [({"action": action}, float(n)) for action, n in counts.items()]

    def last_decision() -> list[Sample]:
        last = poller.values.last
        return [({}, last.at_ms / 1000 if last is not None else 0.0)]

    def step_documents() -> dict[str, int]:
        # The step's own documents as the newest decision's gate look counted them; a decision
        # without a look (a start, a promotion to the next step, an order) has none: 0.
        last = poller.values.last
        evidence = last.evidence if last is not None else {}
        return {path: int(evidence.get(f"{path}_documents", 0)) for path in PATHS}

    def needed() -> tuple[float, dict[str, int]]:
        state = poller.values.state
        if state is None or state.phase != "ramping":
            # Nothing to wait for: not started, watching the last step, or standing still.
            return 0.0, dict.fromkeys(PATHS, 0)
        documents = step_documents()
        now_ms = int(time.time() * 1000)
        lacking = evidence_needed(plan, state, documents["kafka"], documents["redis"], now_ms)
        return lacking.dwell_s, lacking.documents

    def expected() -> tuple[float, float]:
        # The current step's Kafka documents in the plan kept at the start (about M) and the
        # hours the rest takes at the plan's rate; 0 with no plan or when not ramping.
        state, planned = poller.values.state, poller.values.plan
        if state is None or planned is None or state.phase != "ramping" or state.step < 0:
            return 0.0, 0.0
        steps = planned.get("steps", [])
        if state.step >= len(steps):
            return 0.0, 0.0
        wanted = float(steps[state.step]["kafka_documents"])
        per_min = float(planned["documents_per_min"]) * float(steps[state.step]["share"]) / 100
        left = max(wanted - step_documents()["kafka"], 0.0)
        return wanted, (left / per_min / 60 if per_min > 0 else 0.0)

    def per_path(values: dict[str, int]) -> Iterable[Sample]:
        return [({"path": path}, float(values.get(path, 0))) for path in PATHS]

    metrics.observe_gauge(
        "rollout_share",
        "the served share the autopilot's record stands for, in per cent (0 before it started)",
        share,
    )
    metrics.observe_gauge(
        "rollout_step",
        "the step of ROLLOUT_STEPS the rollout is at, from 1 (0 before the autopilot "
        "started); after a roll-back or an abort, the step it left",
        step,
    )
    metrics.observe_gauge(
        "rollout_phase",
        "1 for the autopilot's current phase, 0 for the others (all 0 before it started)",
        phases,
    )
    metrics.observe_counter(
        "rollout_decisions", "the autopilot's decisions by action (rollout:counts)", decisions
    )
    metrics.observe_gauge(
        "rollout_last_decision_timestamp_seconds",
        "Unix time of the autopilot's newest decision (one every ROLLOUT_INTERVAL_S while it "
        "acts; 0: none)",
        last_decision,
    )
    metrics.observe_gauge(
        "rollout_step_documents",
        "documents each path finished in the current step, as the newest decision counted them",
        lambda: per_path(step_documents()),
    )
    metrics.observe_gauge(
        "rollout_dwell_left_seconds",
        "dwell (ROLLOUT_DWELL_S) the current step still needs before a promotion (0: none, "
        "or not ramping)",
        lambda: [({}, needed()[0])],
    )
    metrics.observe_gauge(
        "rollout_documents_needed",
        "finished documents (ROLLOUT_MIN_DOCUMENTS) each path still needs in the current step "
        "before "
        "a promotion (0: enough, or not ramping)",
        lambda: per_path(needed()[1]),
    )
    metrics.observe_gauge(
        "rollout_step_documents_expected",
        "Kafka documents the current step is expected to need (about M, `rollout plan`'s p50 as "
        "`rollout run` printed it at its start; 0: no plan kept, or not ramping)",
        lambda: [({}, expected()[0])],
    )
    metrics.observe_gauge(
        "rollout_step_hours_expected",
        "hours the current step is expected to take still, at the site's rate when the plan "
        "was made (0: no plan kept, or not ramping)",
        lambda: [({}, expected()[1])],
    )
