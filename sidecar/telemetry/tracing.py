"""OpenTelemetry traces of the data path: Redis read, Kafka send, shadow process, verdict.

The spans (names are ``{operation} {destination}``):

- ``receive <stream>`` (CLIENT, ``messaging.system=redis``): one per batch the mirror read with
  XREADGROUP (``receive`` alone when the batch spans streams), from the read's start to its end,
  linked to the context of every entry that carries a ``traceparent`` field.
- ``send <topic>`` (PRODUCER, ``messaging.system=kafka``): one per entry mirrored to a task
  topic, a child of its batch's span, from routing to Kafka's ack (partition and offset set then).
  Its context goes into the record as the W3C ``traceparent`` header, unless the entry already
  carries one: then the span links to that context and the header is the entry's, unchanged.
- ``process <topic>`` (CONSUMER): one per record the shadow consumer handles, a root span linked
  to the producer context in the record's ``traceparent`` header.
- ``compare`` (INTERNAL): one per verdict, with ``verdict``, ``task.type``, ``task.id``; a root
  span linked to the task's producer context and to its ``process`` span. A mismatch carries a
  ``diff`` event: the differences as JSON, at most :data:`MAX_DIFF_CHARS`, with the left and right
  of any difference under a ``TRACE_REDACT_FIELDS`` field replaced by ``[redacted]``.

Sampling. ``OTEL_TRACES_SAMPLER``/``_ARG`` decide per batch: a batch's ``send`` spans are its
children, so a batch is traced whole or not at all. Under the ``parentbased_*`` samplers a root
span that continues a message through a link (``process``, ``compare``) follows the link's
sampled flag, so a task is traced from Redis to its verdict or not at all; records of unsampled
batches carry the batch span's context with the sampled flag off, which keeps that decision
downstream. A ``compare`` span whose verdict is ``mismatch``, ``error``, ``missing_in_kafka`` or
``missing_primary`` is always sampled: its sampler sees the ``verdict`` attribute at start (the
span is started once the verdict is known, with the comparison's start time), and forces the
decision on, whatever the ratio. It is its own trace (the producer's may not have been
sampled), linked to the producer's context; it goes through an export queue of its own, so a
flood of ordinary spans cannot push it out.

Cost. With tracing off (the default) nothing of this runs: every call site checks
``Tracing.enabled`` (or a ``None`` batch trace) first, and the exporters (gRPC or HTTP) are not
even imported. With tracing on, an unsampled batch costs its one span and, per entry, a shared
header; the shadow and the judge see the unsampled flag in that header and make no span at all
(a few microseconds per task). Spans are made on the event loop (some 30 µs each with the SDK)
and exported from the batch processors' threads. The ``traceparent`` of each record is written
and read directly (the propagator's rules, a fifth of its cost); :data:`KAFKA_HEADERS_GETTER`
and :data:`KAFKA_HEADERS_SETTER` let the standard propagator work on Kafka headers too. An
exporter that fails is logged once (and once more when it recovers); spans that do not fit in
the queue are dropped: telemetry never blocks the data path.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import threading
import time
from collections.abc import Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter, Setter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import (
    ReadableSpan,
    Span,
    SpanLimits,
    SpanProcessor,
    TracerProvider,
)
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.semconv._incubating.attributes.messaging_attributes import (
    MESSAGING_BATCH_MESSAGE_COUNT,
    MESSAGING_CONSUMER_GROUP_NAME,
    MESSAGING_DESTINATION_NAME,
    MESSAGING_DESTINATION_PARTITION_ID,
    MESSAGING_KAFKA_OFFSET,
    MESSAGING_MESSAGE_ID,
    MESSAGING_OPERATION_NAME,
    MESSAGING_OPERATION_TYPE,
    MESSAGING_SYSTEM,
)
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.util.types import Attributes

from sidecar import __version__
from sidecar.config import TracingSettings
from sidecar.lifecycle import Lifecycle
from sidecar.transport.message import QueueMessage, header_text

if TYPE_CHECKING:
    from sidecar.transport.base import SendResult
    from sidecar.verdicts.model import VerdictRecord

logger = logging.getLogger(__name__)

__all__ = [
    "ALWAYS_EXPORTED_VERDICTS",
    "KAFKA_HEADERS_GETTER",
    "KAFKA_HEADERS_SETTER",
    "MirrorBatchTrace",
    "Tracing",
    "VerdictSampler",
    "diff_json",
    "format_traceparent",
    "parse_traceparent",
]

# Semantic conventions: the messaging ones come from opentelemetry.semconv (incubating there);
# the rest are the sidecar's own.
SYSTEM: Final = MESSAGING_SYSTEM  # messaging.system
OPERATION_NAME: Final = MESSAGING_OPERATION_NAME  # messaging.operation.name
OPERATION_TYPE: Final = MESSAGING_OPERATION_TYPE  # messaging.operation.type
DESTINATION: Final = MESSAGING_DESTINATION_NAME  # messaging.destination.name
CONSUMER_GROUP: Final = MESSAGING_CONSUMER_GROUP_NAME  # messaging.consumer.group.name
PARTITION: Final = MESSAGING_DESTINATION_PARTITION_ID  # messaging.destination.partition.id
KAFKA_OFFSET: Final = MESSAGING_KAFKA_OFFSET  # messaging.kafka.offset
MESSAGE_ID: Final = MESSAGING_MESSAGE_ID  # messaging.message.id: the Redis entry id throughout
BATCH_COUNT: Final = MESSAGING_BATCH_MESSAGE_COUNT  # messaging.batch.message_count
SYSTEM_REDIS: Final = "redis"  # not among the semconv's messaging.system values
SYSTEM_KAFKA: Final = "kafka"
VERDICT: Final = "verdict"
VERDICT_ID: Final = "verdict.id"
VERDICT_ERROR: Final = "verdict.error"
TASK_TYPE: Final = "task.type"
TASK_ID: Final = "task.id"
DIFF_EVENT: Final = "diff"
DIFF_DIFFERENCES: Final = "differences"
DIFF_TOTAL: Final = "differences.total"
TRACEPARENT: Final = "traceparent"
REDACTED: Final = "[redacted]"
MAX_DIFF_CHARS: Final = 4096  # the diff event's JSON (ASCII, so also bytes)
MAX_ERROR_CHARS: Final = 300

# Verdicts whose compare span is exported whatever the sampler says.
ALWAYS_EXPORTED_VERDICTS: Final = frozenset(
    {"mismatch", "error", "missing_in_kafka", "missing_primary"}
)

# Export: a batch every second (or each 512 spans), at most this many spans waiting.
QUEUE_SIZE: Final = 8192
VERDICT_QUEUE_SIZE: Final = 2048
SCHEDULE_DELAY_MS: Final = 1000
EXPORT_BATCH: Final = 512
EXPORT_TIMEOUT_S: Final = 10.0
SHUTDOWN_GRACE_S: Final = 5.0
_EXPORT_THREAD_PREFIX: Final = "OtelBatchSpanRecordProcessor"
_EXPORTER_LOGGERS: Final = (
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http._common",
)

_ROOT: Final = Context()  # no parent: the span starts a trace of its own
_TRACEPARENT_FORMAT: Final = re.compile(
    r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-[^-]*)?$"
)
_NO_TRACER: Final = trace.NoOpTracer()


# --- W3C trace context in Kafka headers ------------------------------------------------------


class KafkaHeadersGetter(Getter[Sequence[tuple[str, bytes]]]):
    """Reads trace context headers from Kafka record headers, a sequence of (str, bytes)."""

    def get(self, carrier: Sequence[tuple[str, bytes]], key: str) -> list[str] | None:
        found = [value.decode("ascii", "replace") for name, value in carrier if name == key]
        return found or None

    def keys(self, carrier: Sequence[tuple[str, bytes]]) -> list[str]:
        return [name for name, _ in carrier]


class KafkaHeadersSetter(Setter[list[tuple[str, bytes]]]):
    """Writes trace context headers into a list of (str, bytes), replacing any of that name."""

    def set(self, carrier: list[tuple[str, bytes]], key: str, value: str) -> None:
        carrier[:] = [(name, old) for name, old in carrier if name != key]
        carrier.append((key, value.encode("ascii")))


KAFKA_HEADERS_GETTER: Final = KafkaHeadersGetter()
KAFKA_HEADERS_SETTER: Final = KafkaHeadersSetter()


def format_traceparent(context: SpanContext) -> bytes:
    """The W3C ``traceparent`` of a span context (what the propagator writes, without it)."""
    return b"00-%032x-%016x-%02x" % (context.trace_id, context.span_id, context.trace_flags)


def parse_traceparent(value: bytes | str | None) -> SpanContext | None:
    """The remote span context of a ``traceparent`` value; ``None`` when absent or invalid.

    The W3C rules the propagator applies, at a fifth of its cost (it runs per record)."""
    match = _match(value)
    if match is None:
        return None
    context = SpanContext(
        int(match[2], 16),
        int(match[3], 16),
        is_remote=True,
        trace_flags=TraceFlags(int(match[4], 16)),
    )
    return context if context.is_valid else None


def _match(value: bytes | str | None) -> re.Match[str] | None:
    if not value:
        return None
    text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
    match = _TRACEPARENT_FORMAT.match(text.strip())
    if match is None or match[1] == "ff" or (match[1] == "00" and match[5]):
        return None
    return match


def _unsampled(value: bytes | str | None) -> bool:
    """A well-formed ``traceparent`` with the sampled flag off (cheaper than parsing it)."""
    match = _match(value)
    return match is not None and not int(match[4], 16) & 1 and int(match[2], 16) != 0


def _links(*traceparents: bytes | str | None) -> list[Link]:
    return [Link(context) for value in traceparents if (context := parse_traceparent(value))]


# --- sampling ---------------------------------------------------------------------------------


class VerdictSampler(Sampler):
    """The configured sampler, plus: bad verdicts always sampled, linked roots follow the link.

    - A span whose ``verdict`` attribute is in :data:`ALWAYS_EXPORTED_VERDICTS` is sampled.
    - With ``follow_links`` (the ``parentbased_*`` samplers), a root CONSUMER or INTERNAL span
      with links is sampled if one of the linked contexts was: it continues that message.
    - Anything else is the ``delegate``'s decision.
    """

    def __init__(self, delegate: Sampler, *, follow_links: bool) -> None:
        self._delegate = delegate
        self._follow_links = follow_links

    def should_sample(  # noqa: PLR0917 - the SDK's signature
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: trace.TraceState | None = None,
    ) -> SamplingResult:
        if attributes and attributes.get(VERDICT) in ALWAYS_EXPORTED_VERDICTS:
            return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)
        if (
            self._follow_links
            and links
            and kind in (SpanKind.CONSUMER, SpanKind.INTERNAL)
            and not trace.get_current_span(parent_context).get_span_context().is_valid
        ):
            if any(link.context.trace_flags.sampled for link in links):
                return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)
            return SamplingResult(Decision.DROP)
        return self._delegate.should_sample(
            parent_context, trace_id, name, kind, attributes, links, trace_state
        )

    def get_description(self) -> str:
        return f"VerdictSampler{{{self._delegate.get_description()}}}"


def build_sampler(name: str, ratio: float) -> VerdictSampler:
    """The sampler ``OTEL_TRACES_SAMPLER``/``OTEL_TRACES_SAMPLER_ARG`` name, as a VerdictSampler."""
    base = name.removeprefix("parentbased_")
    root: Sampler = {"always_on": ALWAYS_ON, "always_off": ALWAYS_OFF}.get(base) or (
        TraceIdRatioBased(ratio)
    )
    parent_based = base != name
    return VerdictSampler(ParentBased(root) if parent_based else root, follow_links=parent_based)


# --- the diff event ---------------------------------------------------------------------------


def _under(path: str, field: str) -> bool:
    """Whether ``path`` is ``field`` or inside it (readable paths: ``a.b``, ``a[0]``)."""
    return path == field or (path.startswith(field) and path[len(field)] in ".[")


def is_redacted(path: str, fields: Sequence[str]) -> bool:
    """A difference at ``path`` may show a redacted field's value: it is at or under one, or
    (the root, a parent) holds one."""
    return any(_under(path, field) or path == "" or _under(field, path) for field in fields)


def diff_json(
    differences: Sequence[Mapping[str, Any]],
    redact: Sequence[str],
    limit: int = MAX_DIFF_CHARS,
) -> str:
    """The differences as a JSON array of at most ``limit`` characters (ASCII), redacted.

    Whole differences are kept in order while they fit; what did not is counted in a last
    ``{"omitted": n}`` element.
    """
    items = []
    for difference in differences:
        item = dict(difference)
        if redact and is_redacted(str(item.get("path", "")), redact):
            item["left"] = item["right"] = REDACTED
        items.append(json.dumps(item, separators=(",", ":"), default=repr))
    text = "[" + ",".join(items) + "]"
    if len(text) <= limit:
        return text
    kept: list[str] = []
    size = 2 + len('{"omitted":}') + len(str(len(items)))  # brackets and the trailer
    for piece in items:
        if size + len(piece) + 1 > limit:
            break
        kept.append(piece)
        size += len(piece) + 1
    kept.append(json.dumps({"omitted": len(items) - len(kept)}, separators=(",", ":")))
    return "[" + ",".join(kept) + "]"


# --- export -----------------------------------------------------------------------------------


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


# --- the Tracing object -----------------------------------------------------------------------


class Tracing(Lifecycle):
    """The sidecar's tracer provider and the spans of the data path.

    ``enabled`` is true between ``start()`` and ``stop()`` when the settings turn tracing on;
    every helper below must only be called then (callers check it, which is all that runs when
    tracing is off).
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
        self._follow_links = settings.sampler.startswith("parentbased_")

    async def _start(self) -> None:
        if not self.settings.enabled:
            return
        settings = self.settings
        for name in _EXPORTER_LOGGERS:
            logging.getLogger(name).addFilter(_QUIET)  # a set: adding it again does nothing
        self._exporters = [_exporter(settings), _exporter(settings)]
        ordinary, verdicts = (
            BatchSpanProcessor(
                exporter,
                max_queue_size=size,
                schedule_delay_millis=SCHEDULE_DELAY_MS,
                max_export_batch_size=EXPORT_BATCH,
                export_timeout_millis=EXPORT_TIMEOUT_S * 1000,
            )
            for exporter, size in zip(
                self._exporters, (QUEUE_SIZE, VERDICT_QUEUE_SIZE), strict=True
            )
        )
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
                max_attribute_length=MAX_DIFF_CHARS * 2,
                max_span_attribute_length=MAX_DIFF_CHARS * 2,
            ),
        )
        provider.add_span_processor(_VerdictsApart(ordinary, verdicts))
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

    def _name(self, operation: str, destination: str) -> str:
        name = self._names.get((operation, destination))
        if name is None:
            name = self._names[operation, destination] = f"{operation} {destination}".strip()
        return name

    # --- mirror ---

    def mirror_batch(
        self, batch: Sequence[QueueMessage], group: str, read_ns: tuple[int, int] | None
    ) -> MirrorBatchTrace:
        """The ``receive`` span of a batch the mirror read (``read_ns``: when the read started
        and ended), and the tracker of its entries' ``send`` spans."""
        streams = {message.topic for message in batch}
        stream = next(iter(streams)) if len(streams) == 1 else ""
        attributes: dict[str, Any] = {
            SYSTEM: SYSTEM_REDIS,
            OPERATION_NAME: "receive",
            OPERATION_TYPE: "receive",
            CONSUMER_GROUP: group,
            BATCH_COUNT: len(batch),
        }
        if stream:
            attributes[DESTINATION] = stream
        upstream = [m.header(TRACEPARENT) for m in batch]
        started_ns, ended_ns = read_ns or (time.time_ns(), None)
        span = self.tracer.start_span(
            self._name("receive", stream),
            context=_ROOT,
            kind=SpanKind.CLIENT,
            attributes=attributes,
            links=_links(*upstream) if any(upstream) else None,
            start_time=started_ns,
        )
        span.end(end_time=ended_ns)
        return MirrorBatchTrace(self, span)

    # --- shadow ---

    async def process(
        self, message: QueueMessage, group: str, work: Coroutine[Any, Any, None]
    ) -> None:
        """Run ``work`` (the shadow's handling of ``message``) in its ``process`` span."""
        headers = message.headers
        header = header_text(headers, TRACEPARENT)
        if self._follow_links and _unsampled(header):
            await work  # the sampler would drop the span: do not make one
            return
        producer = parse_traceparent(header)
        attributes: dict[str, Any] = {
            SYSTEM: SYSTEM_KAFKA,
            OPERATION_NAME: "process",
            OPERATION_TYPE: "process",
            DESTINATION: message.topic,
            CONSUMER_GROUP: group,
            PARTITION: str(message.partition),
            KAFKA_OFFSET: message.offset,
        }
        for attribute, header in ((MESSAGE_ID, "x-redis-id"), (TASK_ID, "x-task-id")):
            value = header_text(headers, header)
            if value is not None:
                attributes[attribute] = value
        attributes[TASK_TYPE] = header_text(headers, "x-task-type") or ""
        span = self.tracer.start_span(
            self._name("process", message.topic),
            context=_ROOT,
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            links=[Link(producer)] if producer is not None else None,
        )
        with trace.use_span(span, end_on_exit=True):
            await work

    def candidate_facts(self, message: QueueMessage) -> dict[str, str]:
        """What the judge needs to link a verdict: the record's producer context and, within
        a ``process`` span being recorded, that span's context."""
        facts = {}
        producer = header_text(message.headers, TRACEPARENT)
        if producer is not None:
            facts[TRACEPARENT] = producer
        span = trace.get_current_span()
        if span.is_recording():
            facts["process_traceparent"] = format_traceparent(span.get_span_context()).decode()
        return facts

    # --- judge ---

    def compare(
        self,
        record: VerdictRecord,
        started_ns: int,
        facts: Sequence[Mapping[str, Any]],
    ) -> None:
        """The ``compare`` span of one verdict, from ``started_ns`` to now; ``facts`` are the
        joined sides (candidate first), which hold the contexts to link to."""
        producer = next((f[TRACEPARENT] for f in facts if f.get(TRACEPARENT)), None)
        if (
            self._follow_links
            and record.verdict not in ALWAYS_EXPORTED_VERDICTS
            and _unsampled(producer)
        ):
            return  # the sampler would drop the span: do not make one
        process = next(
            (f["process_traceparent"] for f in facts if f.get("process_traceparent")), None
        )
        attributes: dict[str, Any] = {
            VERDICT: record.verdict,
            VERDICT_ID: record.verdict_id,
            TASK_TYPE: record.task_type,
            TASK_ID: record.task_id,
            MESSAGE_ID: record.entry_id,
        }
        if record.error:
            attributes[VERDICT_ERROR] = record.error[:MAX_ERROR_CHARS]
        span = self.tracer.start_span(
            "compare",
            context=_ROOT,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            links=_links(producer, process) or None,
            start_time=started_ns,
        )
        if record.verdict == "mismatch" and span.is_recording():
            span.add_event(
                DIFF_EVENT,
                {
                    DIFF_DIFFERENCES: diff_json(record.differences, self.settings.redact_fields),
                    DIFF_TOTAL: record.differences_total,
                },
            )
        span.end()


class MirrorBatchTrace:
    """The ``send`` spans of one mirrored batch, children of its ``receive`` span."""

    __slots__ = ("_context", "_header", "_recording", "_spans", "_tracing")

    def __init__(self, tracing: Tracing, batch_span: trace.Span) -> None:
        self._tracing = tracing
        self._recording = batch_span.get_span_context().trace_flags.sampled  # span has ended
        self._context = trace.set_span_in_context(batch_span, _ROOT)
        # An unsampled batch makes no span per entry: its records carry the batch's context,
        # sampled flag off, so the shadow and the judge keep the decision.
        self._header = format_traceparent(batch_span.get_span_context())
        self._spans: dict[int, trace.Span] = {}

    def send(
        self,
        message: QueueMessage,
        topic: str,
        task_id: str,
        task_type: str,
        upstream: bytes | None,
    ) -> bytes:
        """Start the entry's ``send`` span; returns the record's ``traceparent`` header."""
        if not self._recording:
            return upstream if upstream is not None else self._header
        tracing = self._tracing
        span = tracing.tracer.start_span(
            tracing._name("send", topic),
            context=self._context,
            kind=SpanKind.PRODUCER,
            attributes={
                SYSTEM: SYSTEM_KAFKA,
                OPERATION_NAME: "send",
                OPERATION_TYPE: "send",
                DESTINATION: topic,
                MESSAGE_ID: message.id,
                TASK_ID: task_id,
                TASK_TYPE: task_type,
            },
            links=_links(upstream) or None,
        )
        self._spans[id(message)] = span
        if upstream is not None:
            return upstream
        return format_traceparent(span.get_span_context())

    def sent(self, message: QueueMessage, result: SendResult) -> None:
        """Kafka has the entry's record: the span ends, with where it went."""
        span = self._spans.pop(id(message), None)
        if span is not None:
            span.set_attribute(PARTITION, str(result.partition))
            span.set_attribute(KAFKA_OFFSET, result.offset)
            span.end()

    def finish(self) -> None:
        """End the spans of entries Kafka did not take (dropped, or the mirror stopping)."""
        for span in self._spans.values():
            span.set_status(Status(StatusCode.ERROR, "no record acknowledged by Kafka"))
            span.end()
        self._spans.clear()
