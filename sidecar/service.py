"""``ragflow-sidecar run``: the mirror, the shadow consumer, the primary observer and the judge's
sweeper in one process, the usual deployment beside RAGFlow.

The same class runs a part of it for a split deployment: ``mirror --compare`` (mirror, control
and sweeper) and ``shadow`` (shadow consumer, observer and sweeper), sharing one join in Valkey.

The four loops are supervised together: if one dies, the others are stopped and the error is
raised, so a supervisor (compose, systemd) restarts the whole sidecar rather than leaving half
of it running. Nothing is lost by that: unacked entries and uncommitted records are replayed.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import asdict

from sidecar.control import ControlRecorder
from sidecar.errors import SidecarError
from sidecar.handlers import NamedHandler, load_handler
from sidecar.join import Arrival, EntryRef
from sidecar.judge import Judge
from sidecar.mirror import Mirror, RecordTransform
from sidecar.mq.base import Lifecycle
from sidecar.observer import PrimaryDelivery, PrimaryObserver
from sidecar.settings import Settings
from sidecar.shadow import ShadowConsumer

logger = logging.getLogger(__name__)


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
    ) -> None:
        super().__init__()
        self.settings = settings
        handler = handler or load_handler(settings.shadow.handler)
        self.judge = Judge(settings)
        self.mirror = (
            Mirror(
                settings,
                after_produce=ControlRecorder(self.judge, handler, settings.shadow.noise_runs),
                transform=transform,
            )
            if mirror
            else None
        )
        self.shadow = ShadowConsumer(settings, self.judge, handler=handler) if shadow else None
        self.observer = (
            PrimaryObserver(
                settings.redis,
                settings.mirror.streams,
                interval_ms=settings.shadow.observer_interval_ms,
                on_delivery=self._record_primary,
            )
            if observer
            else None
        )
        self._parts: tuple[Lifecycle, ...] = tuple(
            part for part in (self.judge, self.mirror, self.shadow, self.observer) if part
        )

    async def _start(self) -> None:
        started: list[Lifecycle] = []
        try:
            for part in self._parts:
                await part.start()
                started.append(part)
        except BaseException:
            for part in reversed(started):
                await part.stop()
            raise

    async def _stop(self) -> None:
        errors: list[BaseException] = []
        for part in reversed(self._parts):
            try:
                await part.stop()
            except SidecarError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    async def run(self, stop: asyncio.Event) -> None:
        """Run every loop until ``stop`` is set; the first loop to fail stops the rest."""
        if self.shadow is not None:
            # A shadow starting at "latest" must be positioned before the mirror produces.
            await self.shadow.pin_start()
        try:
            async with asyncio.TaskGroup() as group:
                if self.mirror is not None:
                    group.create_task(self.mirror.run(stop), name="mirror")
                if self.shadow is not None:
                    group.create_task(self.shadow.run(stop), name="shadow")
                if self.observer is not None:
                    group.create_task(self.observer.run(stop), name="observer")
                group.create_task(self.judge.run_sweeper(stop), name="sweeper")
        except BaseExceptionGroup as group_error:
            # One component died: the CLI reports it as one error, as any other.
            first = group_error.exceptions[0]
            logger.error("a sidecar loop died: %s", first)
            raise first from group_error

    async def _record_primary(self, delivery: PrimaryDelivery) -> None:
        facts = {
            **asdict(delivery),
            "queue_wait_ms": delivery.queue_wait_ms,
            "processing_ms": delivery.processing_ms,
        }
        ref = EntryRef(delivery.stream, delivery.entry_id)
        await self.judge.record("primary", [Arrival(ref, json.dumps(facts).encode())])
