"""Where spans go: OTLP (gRPC or HTTP) from batch processors' threads, never blocking the loop.

Spans are made on the event loop and exported from the batch processors' threads, a batch
every second (or each :data:`EXPORT_BATCH` spans). Spans of always-exported verdicts
(:data:`~sidecar.telemetry.sampler.ALWAYS_EXPORTED_VERDICTS`) have a processor and queue of their
own. An exporter that fails is logged once (and once more when it recovers); spans that do not
fit in the queue are dropped: telemetry never blocks the data path. The exporters are imported
only when tracing is on.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Final

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from sidecar.config import TracingSettings
from sidecar.telemetry.sampler import ALWAYS_EXPORTED_VERDICTS
from sidecar.telemetry.semconv import VERDICT

logger = logging.getLogger(__name__)

__all__ = ["span_processor"]

# A batch every second (or each 512 spans), at most this many spans waiting.
QUEUE_SIZE: Final = 8192
VERDICT_QUEUE_SIZE: Final = 2048
SCHEDULE_DELAY_MS: Final = 1000
EXPORT_BATCH: Final = 512
EXPORT_TIMEOUT_S: Final = 10.0
_EXPORT_THREAD_PREFIX: Final = "OtelBatchSpanRecordProcessor"
_EXPORTER_LOGGERS: Final = (
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http._common",
)


def span_processor(settings: TracingSettings) -> tuple[SpanProcessor, list[SpanExporter]]:
    """The provider's span processor for ``settings``, and its exporters (which a stop that
    runs out of time shuts down, to end their retries)."""
    for name in _EXPORTER_LOGGERS:
        logging.getLogger(name).addFilter(_QUIET)  # a set: adding it again does nothing
    exporters = [_exporter(settings), _exporter(settings)]
    ordinary, verdicts = (
        BatchSpanProcessor(
            exporter,
            max_queue_size=size,
            schedule_delay_millis=SCHEDULE_DELAY_MS,
            max_export_batch_size=EXPORT_BATCH,
            export_timeout_millis=EXPORT_TIMEOUT_S * 1000,
        )
        for exporter, size in zip(exporters, (QUEUE_SIZE, VERDICT_QUEUE_SIZE), strict=True)
    )
    return _VerdictsApart(ordinary, verdicts), exporters


class _ReportingExporter(SpanExporter):
    """Never raises; logs the first failure of an outage, and the recovery, once each."""

    def __init__(self, inner: SpanExporter, endpoint: str) -> None:
        self._inner = inner
        self._endpoint = endpoint
        self._failing = False
        self._closed = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self._inner.export(spans)
        except Exception as exc:  # an exporter bug must not end the export thread
            logger.debug("trace export raised: %r", exc)
            result = SpanExportResult.FAILURE
        if result is SpanExportResult.FAILURE and not self._failing:
            self._failing = True
            logger.warning(
                "cannot export traces to %s; dropping spans until it answers", self._endpoint
            )
        elif result is SpanExportResult.SUCCESS and self._failing:
            self._failing = False
            logger.info("exporting traces to %s again", self._endpoint)
        return result

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._inner.shutdown()
        except Exception as exc:
            logger.debug("trace exporter shutdown raised: %r", exc)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)


class _QuietExportThreads(logging.Filter):
    """Drops the OTLP exporters' own warnings from the export threads: _ReportingExporter
    says it once, where theirs repeat every 20 s for as long as the collector is away."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.WARNING or not (record.threadName or "").startswith(
            _EXPORT_THREAD_PREFIX
        )


_QUIET = _QuietExportThreads()


def _exporter(settings: TracingSettings) -> SpanExporter:
    headers = {name: value.reveal() for name, value in settings.headers}
    # Imported here: nothing of gRPC or the HTTP exporter is loaded while tracing is off.
    if settings.protocol == "grpc":
        from grpc import Compression  # type: ignore[import-untyped]  # noqa: PLC0415
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # noqa: PLC0415
            OTLPSpanExporter as GrpcExporter,
        )

        inner: SpanExporter = GrpcExporter(
            endpoint=settings.endpoint,
            insecure=settings.endpoint.startswith("http://"),
            headers=tuple(headers.items()),
            timeout=EXPORT_TIMEOUT_S,
            compression=Compression.NoCompression,
        )
    else:
        from opentelemetry.exporter.otlp.proto.http import (  # noqa: PLC0415
            Compression as HttpCompression,
        )
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
            OTLPSpanExporter as HttpExporter,
        )

        inner = HttpExporter(
            endpoint=settings.endpoint,
            headers=headers,
            timeout=EXPORT_TIMEOUT_S,
            compression=HttpCompression.NoCompression,
        )
    return _ReportingExporter(inner, settings.endpoint)


class _VerdictsApart(SpanProcessor):
    """Spans of always-exported verdicts go to a batch processor (and queue) of their own."""

    def __init__(self, ordinary: SpanProcessor, verdicts: SpanProcessor) -> None:
        self._ordinary = ordinary
        self._verdicts = verdicts

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        attributes = span.attributes
        if attributes and attributes.get(VERDICT) in ALWAYS_EXPORTED_VERDICTS:
            self._verdicts.on_end(span)
        else:
            self._ordinary.on_end(span)

    def shutdown(self) -> None:
        self._verdicts.shutdown()
        self._ordinary.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        flushed = self._verdicts.force_flush(timeout_millis)
        return self._ordinary.force_flush(timeout_millis) and flushed
