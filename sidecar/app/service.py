"""``ragflow-sidecar run``: the mirror, the shadow consumer, the worker observer and the
verdicts' sweeper in one process, the usual deployment beside RAGFlow.

The same class runs a part of it for a split deployment: ``mirror --compare`` (mirror, control
and sweeper) and ``shadow`` (shadow consumer, observer and sweeper), sharing one join in Valkey.

The four loops are supervised together: if one dies, the others are stopped and the error is
raised, so a supervisor (compose, systemd) restarts the whole sidecar rather than leaving half
of it running. Nothing is lost by that: unacked entries and uncommitted records are replayed.

:class:`Sidecar` is the composition root: it builds every client (:mod:`sidecar.app.wiring`)
and every part, hands each part the clients it uses, starts the clients before the parts and
stops them after.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from dataclasses import asdict
from typing import Any

from valkey.asyncio import Valkey
from valkey.exceptions import ValkeyError

from sidecar.app.metrics_catalog import register_metrics
from sidecar.app.state_store import (
    StateMemoryPoller,
    register_state_memory_metrics,
    shares_ragflows_valkey,
)
from sidecar.app.wiring import Assembly, CompareClients, MirrorClients, observer_client
from sidecar.config import Settings
from sidecar.doctor.poller import DoctorPoller, register_doctor_metrics
from sidecar.errors import SidecarError
from sidecar.lifecycle import Lifecycle
from sidecar.mirror.mirror import RecordTransform
from sidecar.observer import WorkerDelivery, WorkerObserver
from sidecar.rollout.rollout_metrics import RolloutPoller, register_rollout_metrics
from sidecar.serve.served_metrics import ServedEvidencePoller, register_served_metrics
from sidecar.shadow.handlers import NamedHandler, load_handler
from sidecar.shadow.replay import RedisRunRecorder
from sidecar.shadow.shadow import ShadowConsumer
from sidecar.telemetry.health import Health, HealthServer
from sidecar.telemetry.metrics import SidecarMetrics
from sidecar.telemetry.tracing import Tracing
from sidecar.transport import fastjson
from sidecar.transport.base import OutgoingMessage
from sidecar.transport.message import QueueMessage
from sidecar.verdicts.join import Arrival, EntryRef
from sidecar.verdicts.sweeper import Sweeper

logger = logging.getLogger(__name__)

GAUGE_REFRESH_S = 5.0
# Readiness: how often, and how patiently, Valkey and Kafka are asked whether they answer.
DEPENDENCY_CHECK_S = 3.0
DEPENDENCY_TIMEOUT_S = 2.0


class Sidecar(Lifecycle):
    """Every component of the sidecar, started and stopped together."""

    def __init__(
        self,
        settings: Settings,
        *,
        handler: NamedHandler | None = None,
        mirror: bool = True,
        shadow: bool = True,
        observer: bool = True,
        transform: RecordTransform | None = None,
        http: HealthServer | None = None,
    ) -> None:
        super().__init__()
        self.settings = settings
        handler = handler or load_handler(settings.shadow.handler)
        self.metrics = SidecarMetrics(otlp=settings.metrics.otlp)
        # One tracer provider for all parts, started first and stopped last.
        self.tracing = Tracing(settings.tracing, settings.shadow.instance)
        compared = CompareClients.build(settings)
        # The state store's (the join's) and RAGFlow's Valkey: one client when they are one.
        self.state_client = compared.state.client
        self.ragflow_client = compared.ragflow.client
        self._separate_state = compared.separate  # the readiness probe asks both
        self.judge = compared.judge(settings, self.tracing)
        self.sweeper = Sweeper(self.judge, compared.progress)
        self._control = RedisRunRecorder(
            self.judge, handler, settings.shadow.noise_runs, client=self.ragflow_client
        )
        mirrored = MirrorClients.build(settings) if mirror else None
        self.mirror = (
            mirrored.mirror(
                settings, self.tracing, after_produce=self._after_produce, transform=transform
            )
            if mirrored
            else None
        )
        self.shadow = (
            ShadowConsumer(
                settings,
                self.judge,
                client=self.state_client,
                ragflow_client=self.ragflow_client,
                dlq=compared.publisher,
                handler=handler,
                on_processed=self._kafka_task_done,
            )
            if shadow
            else None
        )
        observed = observer_client(settings.redis) if observer else None
        self.observer = (
            WorkerObserver(
                settings.redis,
                settings.mirror.streams,
                interval_ms=settings.shadow.observer_interval_ms,
                on_delivery=self._record_worker,
                client=observed.client,
            )
            if observed
            else None
        )
        # Reads what RAGFlow's processes record about the served share (in the state store,
        # as their claims), for /metrics only.
        self.served = ServedEvidencePoller(settings, client=self.state_client)
        # Reads the autopilot's record (`rollout run` has no port of its own), for /metrics.
        self.rollout = RolloutPoller(settings, client=self.state_client)
        # Reads the state store's memory and evictions, for /metrics only.
        self.state_memory = StateMemoryPoller(
            self.state_client, settings.state.display_url, interval_s=settings.metrics.state_poll_s
        )
        # Reads what RAGFlow's deployment can lose and the orphaned entries (`doctor`), for
        # /metrics only.
        self.doctor = DoctorPoller(
            settings,
            self.ragflow_client,
            None if shares_ragflows_valkey(settings) else self.state_client,
        )
        # The clients first, then the parts that use them: stopped in the reverse order.
        self._parts = Assembly(
            (
                self.tracing,
                *compared.parts,
                *(mirrored.parts if mirrored else ()),
                observed,
                self.mirror,
                self.shadow,
                self.observer,
                self.served,
                self.rollout,
                self.state_memory,
                self.doctor,
            )
        )
        loops = {"mirror": self.mirror, "shadow": self.shadow, "observer": self.observer}
        self.health = Health((*(name for name, part in loops.items() if part), "sweeper"))
        # A server given by the caller outlives this build (the supervisor's restarts); one of
        # our own lives and dies with it.
        self._own_http = http is None
        if http is not None:
            http.attach(self.health, self.metrics.registry)
        elif settings.metrics.port:
            http = HealthServer(
                settings.metrics.host, settings.metrics.port, self.health, self.metrics.registry
            )
        self.http = http
        register_metrics(
            self.metrics,
            traffic_percent=settings.mirror.traffic_percent,
            judge_stats=self.judge.stats,
            health=self.health,
            mirror=self.mirror,
            shadow=self.shadow,
        )
        register_served_metrics(self.metrics, self.served, settings)
        register_rollout_metrics(self.metrics, self.rollout, settings)
        register_state_memory_metrics(self.metrics, self.state_memory)
        register_doctor_metrics(self.metrics, self.doctor)

    async def _start(self) -> None:
        if self.http is not None and self._own_http:
            # First, so the probes answer (not ready) while the rest connects.
            await self.http.start()
        try:
            await self._parts.start()  # a failure stops what it started
        except BaseException:
            if self.http is not None and self._own_http:
                await self.http.stop()
            self.metrics.shutdown()  # its OTLP export thread, if any, dies with this build
            raise

    async def _stop(self) -> None:
        try:
            await self._parts.stop()
        finally:
            if self.http is not None and self._own_http:
                await self.http.stop()
            self.metrics.shutdown()

    async def run(self, stop: asyncio.Event) -> None:
        """Run every loop until ``stop`` is set; the first loop to fail stops the rest."""
        if self.shadow is not None:
            # A shadow starting at "latest" must be positioned before the mirror produces.
            await self.shadow.pin_start()
        # The loops watch ``halt``, set by ``stop`` or by the first loop to die. The task
        # group's cancellation alone is not enough: a cancel that lands in valkey-py's
        # connection check can be swallowed as a timeout, leaving a loop running for ever.
        halt = asyncio.Event()
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(_forward(stop, halt), name="stop-forwarder")
                if self.mirror is not None:
                    group.create_task(self._watched("mirror", self.mirror.run(halt), halt))
                if self.shadow is not None:
                    group.create_task(self._watched("shadow", self.shadow.run(halt), halt))
                if self.observer is not None:
                    group.create_task(self._watched("observer", self.observer.run(halt), halt))
                group.create_task(self._watched("sweeper", self.sweeper.run(halt), halt))
                group.create_task(_halting(self._refresh_gauges(halt), halt), name="metrics")
                group.create_task(_halting(self._watch_turns(halt), halt), name="watchdog")
        except BaseExceptionGroup as group_error:
            # One outage can fail several loops at once: the error told (and acted on by the
            # supervisor) is the one that retrying cannot fix, if any, not the fastest.
            first = min(group_error.exceptions, key=_severity)
            logger.error("a sidecar loop died: %s", first)
            raise first from group_error

    async def _watched(
        self, name: str, loop: Coroutine[Any, Any, None], halt: asyncio.Event
    ) -> None:
        """Run one component's loop, keeping the health probes told of its state; when it
        dies, ``halt`` tells the others to stop."""
        self.health.set_running(name, True)
        try:
            await loop
        except BaseException as exc:
            self.health.set_died(name, repr(exc))
            raise
        finally:
            halt.set()  # a loop that ends (stop requested or not) ends the others too
        self.health.set_running(name, False)

    async def _refresh_gauges(self, stop: asyncio.Event) -> None:
        """Gauges that need I/O, every few seconds; a failed round leaves the last values."""
        while not stop.is_set():
            if self.mirror is not None:
                try:
                    lags = await self.mirror.lag()
                    self.metrics.gauges.redis_lag = {
                        stream: lag for stream, lag in lags.items() if lag is not None
                    }
                except SidecarError as exc:
                    logger.debug("lag for metrics: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=GAUGE_REFRESH_S)

    async def _watch_turns(self, stop: asyncio.Event) -> None:
        """Tell the liveness probe how far the mirror's and the shadow's loops have turned
        (produce retries count: a mirror riding out a Kafka outage is not wedged), and the
        readiness probe whether Valkey and Kafka answer: an idle sidecar sends them nothing
        that would fail, so an outage would otherwise go unseen until work arrives."""
        wedged_s = self.settings.metrics.wedged_s
        next_check = 0.0
        while not stop.is_set():
            now = time.monotonic()
            if now >= next_check:
                next_check = now + DEPENDENCY_CHECK_S
                await self._check_dependencies()
            if self.mirror is not None:
                stats = self.mirror.stats
                self.health.note_turns("mirror", stats.turns + stats.produce_retries, now, wedged_s)
            if self.shadow is not None:
                self.health.note_turns("shadow", self.shadow.stats.turns, now, wedged_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=min(1.0, wedged_s / 4))

    async def _check_dependencies(self) -> None:
        await self._check_valkey("valkey", self.ragflow_client)
        if self._separate_state:
            await self._check_valkey("state store", self.state_client)
        problems = []
        for server in self.settings.kafka.bootstrap_servers:
            host, _, port = server.rpartition(":")
            try:
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection(host, int(port)), DEPENDENCY_TIMEOUT_S
                )
            except (TimeoutError, OSError) as exc:
                problems.append(f"{server} {type(exc).__name__}")
                continue
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            break
        else:
            self.health.set_reachable("kafka", ", ".join(problems))
            return
        self.health.set_reachable("kafka", None)

    async def _check_valkey(self, name: str, client: Valkey) -> None:
        try:
            await asyncio.wait_for(client.ping(), DEPENDENCY_TIMEOUT_S)
            self.health.set_reachable(name, None)
        except (TimeoutError, OSError, ValkeyError) as exc:
            self.health.set_reachable(name, type(exc).__name__)

    async def _after_produce(self, mirrored: list[tuple[QueueMessage, OutgoingMessage]]) -> None:
        now_ms = time.time() * 1000
        record = self.metrics.mirror_latency.record
        for message, _ in mirrored:
            record(now_ms - message.timestamp_ms)
        await self._control(mirrored)

    def _kafka_task_done(self, queue_wait_ms: float | None, processing_ms: float) -> None:
        path = {"path": "kafka"}
        if queue_wait_ms is not None:
            self.metrics.queue_wait.record(queue_wait_ms, path)
        self.metrics.processing.record(processing_ms, path)

    async def _record_worker(self, delivery: WorkerDelivery) -> None:
        path = {"path": "redis"}
        if delivery.queue_wait_ms is not None:
            self.metrics.queue_wait.record(delivery.queue_wait_ms, path)
        if delivery.processing_ms is not None:
            self.metrics.processing.record(delivery.processing_ms, path)
        facts = {
            **asdict(delivery),
            "queue_wait_ms": delivery.queue_wait_ms,
            "processing_ms": delivery.processing_ms,
        }
        ref = EntryRef(delivery.stream, delivery.entry_id)
        await self.judge.record("worker", [Arrival(ref, fastjson.dumps(facts))])


def _severity(exc: BaseException) -> int:
    """Lower first: errors retrying cannot fix, then retriable ones, then anything else."""
    if isinstance(exc, SidecarError):
        return 1 if exc.retriable else 0
    return 2


async def _halting(loop: Coroutine[Any, Any, None], halt: asyncio.Event) -> None:
    try:
        await loop
    finally:
        halt.set()


async def _forward(stop: asyncio.Event, halt: asyncio.Event) -> None:
    """Set ``halt`` once ``stop`` is set, or end quietly when ``halt`` is set first."""
    stopped = asyncio.create_task(stop.wait())
    halted = asyncio.create_task(halt.wait())
    try:
        await asyncio.wait({stopped, halted}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        halted.cancel()
    halt.set()
