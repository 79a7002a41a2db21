"""The doctor's findings on ``run``'s /metrics: read every ``DOCTOR_POLL_S`` on a task of its
own, with the composition root's clients, so that orphans and a store that can lose tasks raise
an alert (compose/alerts.yml) instead of waiting for someone to run the command."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Final

import valkey.asyncio as avalkey

from sidecar.config import Settings
from sidecar.doctor.collect import Reading, read_executors, read_stores
from sidecar.doctor.executors import DEFAULT_OLDER_THAN_MS
from sidecar.errors import SidecarError
from sidecar.lifecycle import Poller
from sidecar.telemetry.metrics import SidecarMetrics, Stats

Samples = list[tuple[dict[str, str], float]]

# XINFO and XPENDING per consumer once a minute: nothing next to RAGFlow's own polling.
DOCTOR_POLL_S: Final = 60.0
POLL_TIMEOUT_S: Final = 10.0


class DoctorPoller(Poller):
    """Holds the last reading; None before the first and while Valkey does not answer (the
    series are then left out rather than kept at figures nobody can vouch for)."""

    def __init__(
        self,
        settings: Settings,
        ragflow: avalkey.Valkey,
        state: avalkey.Valkey | None,
        *,
        interval_s: float = DOCTOR_POLL_S,
        older_than_ms: int = DEFAULT_OLDER_THAN_MS,
    ) -> None:
        """``state`` None: the state store is RAGFlow's Valkey. The clients are the
        composition root's, never closed here."""
        super().__init__(interval_s, "doctor-poller")
        self._settings = settings
        self._ragflow = ragflow
        self._state = state
        self.older_than_ms = older_than_ms
        self.reading: Reading | None = None

    async def _stop(self) -> None:
        await super()._stop()
        self.reading = None

    async def poll(self) -> bool:
        try:
            async with asyncio.timeout(POLL_TIMEOUT_S):
                findings = await read_stores(
                    self._settings, self._ragflow, self._state, read_config=False
                )
                executors = await read_executors(self._settings, self._ragflow, self.older_than_ms)
        except (SidecarError, TimeoutError) as exc:
            self.reading = None
            return self.failed("the doctor's findings unknown until Valkey answers", exc)
        self.answered("the doctor's findings read again")
        self.reading = Reading(findings + executors.findings, executors.consumers, executors.groups)
        return True


def register_doctor_metrics(metrics: SidecarMetrics, poller: DoctorPoller) -> None:
    def sample(read: Callable[[Reading], Samples]) -> Stats:
        def samples() -> Samples:
            reading = poller.reading
            return [] if reading is None else read(reading)

        return samples

    def findings(reading: Reading) -> Samples:
        counts = Counter((f.check, f.severity) for f in reading.findings)
        return [({"check": c, "severity": s}, float(n)) for (c, s), n in sorted(counts.items())]

    def orphans(reading: Reading, value: Callable[[int, int], float]) -> Samples:
        samples = []
        for stream in reading.groups:
            held = [
                c
                for c in reading.consumers
                if c.stream == stream and c.pending and not c.alive(poller.older_than_ms)
            ]
            count = sum(c.pending for c in held)
            oldest = max((c.oldest_pending_ms for c in held), default=0)
            samples.append(({"stream": stream}, value(count, oldest)))
        return samples

    metrics.observe_gauge(
        "doctor_findings",
        "the doctor's findings by check and severity (ok, note, risk, unknown)",
        sample(findings),
    )
    metrics.observe_gauge(
        "orphaned_pending_entries",
        "pending entries of RAGFlow's group held by consumers silent for 6 h (no heartbeat, "
        "no read): nobody will run them",
        sample(lambda reading: orphans(reading, lambda count, _: float(count))),
    )
    metrics.observe_gauge(
        "orphaned_pending_oldest_seconds",
        "how long the oldest orphaned pending entry has been delivered and not acked",
        sample(lambda reading: orphans(reading, lambda _, oldest_ms: oldest_ms / 1000)),
    )
