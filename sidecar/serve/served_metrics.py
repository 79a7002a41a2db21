"""Metrics of the served share: what RAGFlow's own processes recorded in Valkey, per path.

RAGFlow's API server and executors write the evidence (``ragflow_mq.recorder``); the sidecar
only reads it back. The read is a poller of its own, every ``POLL_INTERVAL_S``, so a scrape
never waits on Valkey and the data path never pays for it; the instruments' callbacks read the
values the last poll left. A failed poll keeps the previous values (and says so once).

The numbers are the whole deployment's, not this process's: every sidecar instance reading the
same Valkey reports the same values, so dashboards take ``max``, never ``sum``, across instances.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import valkey.asyncio as avalkey

from sidecar.config import Settings
from sidecar.errors import SidecarError
from sidecar.lifecycle import Poller
from sidecar.telemetry.metrics import SidecarMetrics
from sidecar.transport.valkey_client import translate_valkey_errors
from sidecar.wire.contract import EVENTS, LATENCIES, PATHS, Keys
from sidecar.wire.evidence import Evidence, window_keys
from sidecar.wire.share import ShareValues, share_keys

POLL_INTERVAL_S: Final = 10.0
# The latency and failure gauges cover the minute buckets of this recent stretch.
RECENT_S: Final = 300.0
QUANTILES: Final = (0.5, 0.99)

Sample = tuple[Mapping[str, str], float]


@dataclass
class ServedValues:
    """What the last successful poll read; zeros (and no live share) before the first one."""

    totals: Counter[tuple[str, str]] = field(default_factory=Counter)  # (path, event) -> n
    recent: Evidence = field(default_factory=lambda: Evidence.from_hashes(()))
    share: ShareValues = field(default_factory=ShareValues)
    polled_at: float | None = None  # time.time() of the last successful poll


class ServedEvidencePoller(Poller):
    """Reads the served share's evidence and live share from Valkey every ``interval_s``."""

    def __init__(
        self, settings: Settings, *, client: avalkey.Valkey, interval_s: float = POLL_INTERVAL_S
    ) -> None:
        """``client`` is the caller's (the composition root's): used between start and stop,
        never closed here."""
        super().__init__(interval_s, "served-evidence-poller")
        self._settings = settings
        self._given_client = client
        self._keys = Keys(settings.serve.key_prefix)
        self.values = ServedValues()
        self._client: avalkey.Valkey | None = None

    async def _start(self) -> None:
        self._client = self._given_client
        await super()._start()

    async def _stop(self) -> None:
        await super()._stop()
        self._client = None

    async def poll(self) -> bool:
        """One read (totals, recent minutes, live share) in one pipeline; ``False`` if it
        failed."""
        if self._client is None:
            return False
        now = time.time()
        recent = window_keys(self._keys, now - RECENT_S, now)
        where = self._settings.state.display_url
        try:
            with translate_valkey_errors("read the served share's evidence", where):
                pipe = self._client.pipeline(transaction=False)
                pipe.hgetall(self._keys.evidence_total)
                for name in recent:
                    pipe.hgetall(name)
                for key in share_keys(self._keys):
                    pipe.get(key)
                replies: list[Any] = await pipe.execute()
        except SidecarError as exc:
            return self.failed("served-share metrics keep their last values", exc)
        self.answered("served-share metrics read from Valkey again")
        total = Evidence.from_hashes(replies[:1])
        self.values = ServedValues(
            totals=Counter({(p, e): total[p][e] for p in PATHS for e in EVENTS}),
            recent=Evidence.from_hashes(replies[1:-2]),
            share=ShareValues.parse(*replies[-2:]),
            polled_at=now,
        )
        return True


def register_served_metrics(
    metrics: SidecarMetrics, poller: ServedEvidencePoller, settings: Settings
) -> None:
    """The served share's instruments, read from ``poller.values`` at collection time."""
    judged, ceiling = settings.mirror.traffic_percent, settings.serve.percent

    def tasks() -> list[Sample]:
        totals = poller.values.totals
        # Every path x event from the start, at 0: a series that appears later loses its first
        # increase in rate(), and a missing one reads as "no data" rather than "none".
        return [({"path": p, "event": e}, float(totals[(p, e)])) for p in PATHS for e in EVENTS]

    def shares() -> list[Sample]:
        share = poller.values.share
        served = share.served(ceiling)
        return [
            ({"share": "judged"}, judged),
            ({"share": "ceiling"}, ceiling),
            # Never set: the ceiling is what RAGFlow follows.
            ({"share": "live"}, ceiling if share.live is None else share.live),
            ({"share": "served"}, served),
            # The name of `served` before the live share (docs/metrics.md), for one release.
            ({"share": "served_effective"}, served),
        ]

    metrics.observe_counter(
        "served_tasks",
        "tasks RAGFlow executed per path (redis|kafka) by event, from ragflow_mq's evidence",
        tasks,
    )
    metrics.observe_gauge(
        "serve_percent",
        "judged (KAFKA_TRAFFIC_PERCENT), ceiling (KAFKA_SERVE_PERCENT), live (shift --to) and "
        "served (what RAGFlow executes from Kafka: the lowest)",
        shares,
    )
    metrics.observe_gauge(
        "served_latency_ms",
        "p50/p99 of processing and queue wait per path over the last 5 minutes (0: none)",
        lambda: latency_samples(poller.values.recent),
    )
    metrics.observe_gauge(
        "served_failure_percent",
        "failed over finished tasks per path over the last 5 minutes (0: none finished)",
        lambda: failure_samples(poller.values.recent),
    )


def latency_samples(recent: Evidence) -> Iterable[Sample]:
    # 0 without a sample: OpenTelemetry drops a NaN observation (and warns on every scrape),
    # and a series that comes and goes reads as a broken panel. served_tasks_total tells an
    # idle path from a fast one.
    for path in PATHS:
        for latency in LATENCIES:
            for q in QUANTILES:
                value = recent[path].quantile_ms(latency, q)
                labels = {"path": path, "latency": latency, "quantile": f"{q:g}"}
                yield labels, 0.0 if value is None else value


def failure_samples(recent: Evidence) -> Iterable[Sample]:
    for path in PATHS:
        rate = recent[path].failure_rate()
        yield {"path": path}, 0.0 if rate is None else 100.0 * rate
