"""The mirror's spans: one ``receive`` per batch read from Redis, one ``send`` per entry.

- ``receive <stream>`` (CLIENT, ``messaging.system=redis``): one per batch the mirror read with
  XREADGROUP (``receive`` alone when the batch spans streams), from the read's start to its end,
  linked to the context of every entry that carries a ``traceparent`` field.
- ``send <topic>`` (PRODUCER, ``messaging.system=kafka``): one per entry mirrored to a task
  topic, a child of its batch's span, from routing to Kafka's ack (partition and offset set then).
  Its context goes into the record as the W3C ``traceparent`` header, unless the entry already
  carries one: then the span links to that context and the header is the entry's, unchanged.

A batch is sampled whole or not at all (:mod:`sidecar.telemetry.sampler`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from sidecar.telemetry.propagation import ROOT, TRACEPARENT, format_traceparent, links
from sidecar.telemetry.semconv import (
    BATCH_COUNT,
    CONSUMER_GROUP,
    DESTINATION,
    KAFKA_OFFSET,
    MESSAGE_ID,
    OPERATION_NAME,
    OPERATION_TYPE,
    PARTITION,
    SYSTEM,
    SYSTEM_KAFKA,
    SYSTEM_REDIS,
    TASK_ID,
    TASK_TYPE,
)
from sidecar.telemetry.tracing import Tracing
from sidecar.transport.message import QueueMessage

if TYPE_CHECKING:
    from sidecar.transport.base import SendResult

__all__ = ["MirrorBatchTrace", "trace_batch"]


def trace_batch(
    tracing: Tracing,
    batch: Sequence[QueueMessage],
    group: str,
    read_ns: tuple[int, int] | None,
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
    span = tracing.tracer.start_span(
        tracing.span_name("receive", stream),
        context=ROOT,
        kind=SpanKind.CLIENT,
        attributes=attributes,
        links=links(*upstream) if any(upstream) else None,
        start_time=started_ns,
    )
    span.end(end_time=ended_ns)
    return MirrorBatchTrace(tracing, span)


class MirrorBatchTrace:
    """The ``send`` spans of one mirrored batch, children of its ``receive`` span."""

    __slots__ = ("_context", "_header", "_recording", "_spans", "_tracing")

    def __init__(self, tracing: Tracing, batch_span: trace.Span) -> None:
        self._tracing = tracing
        self._recording = batch_span.get_span_context().trace_flags.sampled  # span has ended
        self._context = trace.set_span_in_context(batch_span, ROOT)
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
            tracing.span_name("send", topic),
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
            links=links(upstream) or None,
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
