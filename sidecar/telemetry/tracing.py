"""OpenTelemetry traces of the data path: Redis read, Kafka send, shadow process, verdict.

The spans (names are ``{operation} {destination}``), each made beside its stage:

- ``receive <stream>`` (CLIENT, ``messaging.system=redis``) and ``send <topic>`` (PRODUCER):
  the mirror's batch and the entries of it sent to Kafka (:mod:`sidecar.mirror.trace`).
- ``process <topic>`` (CONSUMER): one per record the shadow consumer handles
  (:mod:`sidecar.shadow.trace`).
- ``compare`` (INTERNAL): one per verdict, a mismatch with its redacted ``diff`` event
  (:mod:`sidecar.verdicts.trace`).

This module holds the :class:`Tracing` lifecycle (the provider and its tracer); the rest of
telemetry is the attribute names (:mod:`~sidecar.telemetry.semconv`), the ``traceparent``
header (:mod:`~sidecar.telemetry.propagation`), sampling (:mod:`~sidecar.telemetry.sampler`)
and export (:mod:`~sidecar.telemetry.export`).

Cost. With tracing off (the default) nothing of this runs: every call site checks
``Tracing.enabled`` (or a ``None`` batch trace) first, and the exporters (gRPC or HTTP) are not
even imported. With tracing on, an unsampled batch costs its one span and, per entry, a shared
header; the shadow and the judge see the unsampled flag in that header and make no span at all
(a few microseconds per task). Spans are made on the event loop (some 30 µs each with the SDK)
and exported from the batch processors' threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from typing import Final

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter

from sidecar.config import TracingSettings
from sidecar.lifecycle import Lifecycle
from sidecar.telemetry.export import span_processor
from sidecar.telemetry.propagation import is_unsampled
from sidecar.telemetry.sampler import build_sampler, follows_links
from sidecar.version import __version__

logger = logging.getLogger(__name__)

__all__ = ["MAX_ATTRIBUTE_CHARS", "SHUTDOWN_GRACE_S", "Tracing"]

# The longest attribute value kept: twice the longest the sidecar writes (a diff event's JSON).
MAX_ATTRIBUTE_CHARS: Final = 8192
SHUTDOWN_GRACE_S: Final = 5.0

_NO_TRACER: Final = trace.NoOpTracer()


class Tracing(Lifecycle):
    """The sidecar's tracer provider, and what every stage's spans need of it.

    ``enabled`` is true between ``start()`` and ``stop()`` when the settings turn tracing on;
    the stages make spans only then (they check it, which is all that runs when tracing is off).
    """

    def __init__(self, settings: TracingSettings, instance: str = "") -> None:
        super().__init__()
        self.settings = settings
        self.enabled = False
        self.tracer: trace.Tracer = _NO_TRACER
        self._instance = instance
        self._provider: TracerProvider | None = None
        self._exporters: list[SpanExporter] = []
        self._names: dict[tuple[str, str], str] = {}
        # Under parentbased_* a linked span follows the link (VerdictSampler): an unsampled
        # producer context means no span, which is known before making one.
        self._follow_links = follows_links(settings.sampler)

    async def _start(self) -> None:
        if not self.settings.enabled:
            return
        settings = self.settings
        processor, self._exporters = span_processor(settings)
        resource = {
            "service.version": __version__,
            **({"service.instance.id": self._instance} if self._instance else {}),
            **dict(settings.resource_attributes),
            "service.name": settings.service_name,
        }
        # Everything explicit: the SDK reads OTEL_* itself for whatever it is not given.
        provider = TracerProvider(
            sampler=build_sampler(settings.sampler, settings.sampler_ratio),
            resource=Resource(resource),
            span_limits=SpanLimits(
                max_attributes=64,
                max_events=16,
                max_links=1024,  # a batch's entries with a traceparent each
                max_span_attributes=64,
                max_event_attributes=16,
                max_link_attributes=8,
                max_attribute_length=MAX_ATTRIBUTE_CHARS,
                max_span_attribute_length=MAX_ATTRIBUTE_CHARS,
            ),
        )
        provider.add_span_processor(processor)
        self._provider = provider
        self.tracer = provider.get_tracer("sidecar", __version__)
        self.enabled = True
        logger.info(
            "tracing to %s over %s, sampler %s%s",
            settings.endpoint,
            settings.protocol,
            settings.sampler,
            f" {settings.sampler_ratio:g}" if settings.sampler.endswith("ratio") else "",
        )

    async def _stop(self) -> None:
        provider, self._provider = self._provider, None
        self.enabled = False
        self.tracer = _NO_TRACER
        if provider is None:
            return
        # Flushes what is queued; bounded, so a collector that is away cannot hold the stop.
        # Not asyncio.to_thread: the loop's executor is waited for when the loop closes.
        loop = asyncio.get_running_loop()
        done = asyncio.Event()

        def shutdown() -> None:
            try:
                provider.shutdown()
            finally:
                with contextlib.suppress(RuntimeError):  # the loop may be gone by then
                    loop.call_soon_threadsafe(done.set)

        threading.Thread(target=shutdown, name="tracing-shutdown", daemon=True).start()
        try:
            await asyncio.wait_for(done.wait(), SHUTDOWN_GRACE_S)
        except TimeoutError:
            logger.warning(
                "traces not flushed within %.0f s; the rest are dropped", SHUTDOWN_GRACE_S
            )
            for exporter in self._exporters:
                exporter.shutdown()  # ends the exporters' retries

    def span_name(self, operation: str, destination: str) -> str:
        """``{operation} {destination}`` (``operation`` alone without one), made once."""
        name = self._names.get((operation, destination))
        if name is None:
            name = self._names[operation, destination] = f"{operation} {destination}".strip()
        return name

    def drops_linked(self, traceparent: bytes | str | None) -> bool:
        """Whether the sampler would drop a root span that continues ``traceparent`` through a
        link (its sampled flag off, under ``parentbased_*``): then make no span at all."""
        return self._follow_links and is_unsampled(traceparent)
