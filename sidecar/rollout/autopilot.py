"""``ragflow-sidecar rollout run``: the served share stepped through a plan by the gate.

One autopilot acts at a time: it holds a lease in the state store, and a second one stands by
until the lease lapses (the first died) or is let go (it stopped). Every ``ROLLOUT_INTERVAL_S``
the acting one takes the operators' orders (``pause``, ``resume``, ``abort``), asks the gate
about the rollout so far, makes one transition of :mod:`sidecar.rollout.machine`, records it
and only then sets the live share: a crash in between is repaired when an autopilot next takes
the lease (it sets the share its record says), so a restart resumes the same step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable

from sidecar.config import Settings
from sidecar.config.rollout import check_plan
from sidecar.errors import SidecarError
from sidecar.rollout.machine import Decision, GateView, RolloutState, command, decide
from sidecar.rollout.store import RolloutStore
from sidecar.serve.gate import collect
from sidecar.serve.gate_checks import DECISIONS
from sidecar.serve.gate_source import Following, GateSource, OneLook
from sidecar.serve.share import set_share
from sidecar.transport.valkey_client import create_client
from sidecar.wire.evidence import Evidence

logger = logging.getLogger(__name__)

Look = Callable[[Settings, RolloutState, int], Awaitable[GateView]]


def autopilot_id() -> str:
    """Who holds the lease: host, pid and a random part (a restarted process is another)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def watch_baseline(state: RolloutState) -> tuple[int, int] | None:
    """At a share of 100 % (the plan's last step, ramping or watching) there is no Redis left
    to compare with: the Redis path from the rollout's start until this step began is the
    baseline the Kafka path is held to from then on (``sidecar/serve/baseline.py``)."""
    if state.share < 100.0 or not state.started_ms or state.step_since_ms <= state.started_ms:
        return None
    return state.started_ms, state.step_since_ms


async def look(
    settings: Settings, state: RolloutState, now_ms: int, source: GateSource | None = None
) -> GateView:
    """The gate over the whole rollout (its tests stay valid however often they are asked),
    at 100 % (no hold-back) also against the baseline, and the documents each path finished in
    the current step; ``source``: where the evidence is read (the autopilot's follows the
    rollout)."""
    source = source if source is not None else OneLook(settings)
    since_ms = state.started_ms or state.step_since_ms
    steps = settings.rollout.steps
    # The margins are the harm the next step may do. The last step has none after it: the
    # harm at 100 % was shown before it went into force (the step before it had 100 % next),
    # and showing it again across a 5 % hold-back would take twenty times the evidence for
    # nothing more; its harm tests go on.
    last = state.step + 1 >= len(steps)
    next_share = None if last else steps[state.step + 1] / 100
    report = await collect(
        settings, since_ms, now_ms, watch_baseline(state), source, next_share=next_share
    )
    minutes, _ = await source.served(state.step_since_ms / 1000, now_ms / 1000)
    step = Evidence.from_minutes(minutes)
    needed = "; ".join(
        f"{check.name}: " + ", ".join(f"{path} +{n}" for path, n in check.needed.items())
        for check in report.checks
        if check.verdict == "hold" and check.needed
    )
    return GateView(
        decision=DECISIONS[report.decision],  # type: ignore[arg-type]
        reasons=tuple(report.reasons),
        kafka_documents=step["kafka"]["document_finished"],
        redis_documents=step["redis"]["document_finished"],
        needed=needed,
    )


def _rollout_of(state: RolloutState) -> int:
    """Which rollout a state belongs to: its start (a record of an older build may lack it)."""
    return state.started_ms or state.step_since_ms


class Autopilot:
    """Start, ``run(stop)`` until ``stop`` is set, stop (letting the lease go)."""

    def __init__(
        self,
        settings: Settings,
        *,
        owner: str | None = None,
        gate: Look | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        check_plan(settings.rollout, settings.serve.percent)
        self._settings = settings
        self._plan = settings.rollout
        self.owner = owner or autopilot_id()
        self._clock = clock
        self._client = create_client(settings.state)
        # Each turn reads only what is new since the last (a rollout of days would otherwise
        # read every minute and every verdict since its start, every interval).
        self._source = Following(settings, self._client)
        self._gate = gate if gate is not None else self._look
        self.store = RolloutStore(
            self._client, settings.serve.key_prefix, settings.state.display_url
        )
        self.acting = False
        self._standing_by = False
        self._next_look_ms = 0

    async def _look(self, settings: Settings, state: RolloutState, now_ms: int) -> GateView:
        await self._source.follow(_rollout_of(state))
        return await look(settings, state, now_ms, self._source)

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    async def start(self) -> None:
        logger.info(
            "rollout autopilot %s: plan %s %%, dwell %g s, %d documents a path, every %g s",
            self.owner,
            ", ".join(f"{s:g}" for s in self._plan.steps),
            self._plan.dwell_s,
            self._plan.min_documents,
            self._plan.interval_s,
        )

    async def run(self, stop: asyncio.Event) -> None:
        # The lease is refreshed at a third of its time, the gate read every interval.
        pace_s = min(self._plan.interval_s, self._plan.lease_s / 3)
        while not stop.is_set():
            try:
                await self.turn()
            except SidecarError as exc:
                logger.warning("rollout: this turn failed (again in %g s): %s", pace_s, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), pace_s)

    async def turn(self) -> Decision | None:
        """One turn: the lease, then the orders, then the gate when it is due."""
        if not await self.store.hold_lease(self.owner, self._plan.lease_s):
            if self.acting or not self._standing_by:
                holder = await self.store.lease_holder()
                logger.info("rollout: %s stands by while %s acts", self.owner, holder)
            self.acting = False
            self._standing_by = True
            return None
        self._standing_by = False
        now_ms = self._now_ms()
        state = await self.store.load() or RolloutState()
        if not self.acting:
            self.acting = True
            self._next_look_ms = 0
            logger.info("rollout: %s acts (phase %s, share %g %%)", self.owner, state.phase,
                        state.share)  # fmt: skip
            if state.step >= 0 or state.phase == "aborted":
                # What the record says is in force, whatever a crash left half done.
                await self._set_share(state.share, "resumed by the rollout autopilot")
        decision = None
        for order in await self.store.take_orders():
            before = state
            state, decision = command(self._plan, state, order, now_ms, by="an operator")
            await self._apply(state, decision, before)
        if now_ms >= self._next_look_ms:
            self._next_look_ms = now_ms + int(self._plan.interval_s * 1000)
            view = None
            if state.phase in ("ramping", "watching") and state.step >= 0:
                view = await self._gate(self._settings, state, now_ms)
            before = state
            state, decision = decide(self._plan, state, view, now_ms)
            await self._apply(state, decision, before)
        return decision

    async def _apply(self, state: RolloutState, decision: Decision, before: RolloutState) -> None:
        await self.store.record(state, decision)
        if state.step >= 0 and _rollout_of(state) != _rollout_of(before):
            # A new rollout (the plan's start, or a resume after a roll-back or an abort):
            # its evidence starts now, before its share is set, not at a minute boundary.
            await self._source.begin(_rollout_of(state), previous_ms=_rollout_of(before))
        level = logging.INFO if decision.action != "rollback" else logging.WARNING
        logger.log(level, "rollout %s: %s", decision.action, decision.reason)
        if decision.share_to != decision.share_from:
            await self._set_share(decision.share_to, f"rollout {decision.action}")

    async def _set_share(self, share: float, reason: str) -> None:
        await set_share(
            self._settings, share, by=f"rollout {self.owner}", reason=reason, client=self._client
        )

    async def stop(self) -> None:
        try:
            if self.acting:
                await self.store.release_lease(self.owner)
        except SidecarError as exc:
            logger.warning("rollout: the lease lapses by itself: %s", exc)
        finally:
            self.acting = False
            await self._client.aclose()
