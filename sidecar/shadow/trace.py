"""The shadow's span, one ``process <topic>`` per record it handles; and the mirror's
``run redis`` span, one per redis run.

``process <topic>`` (CONSUMER, ``messaging.system=kafka``) is a child of the producer context in
the record's ``traceparent`` header, and linked to it: one trace per task, from the mirror's
Redis read to the verdict. Under the ``parentbased_*`` samplers it follows that context's
sampled flag, and an unsampled one makes no span at all. Its context goes with
the record's facts to the judge, which links the verdict's ``compare`` span to it. Its
``task.path`` is ``kafka``.

``run redis`` (INTERNAL, ``task.path=redis``) is the handler's run on the Redis copy, a child
of the record's producer context (:func:`redis_run_span`).
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind

from sidecar.telemetry.propagation import (
    TRACEPARENT,
    continuing,
    format_traceparent,
    parse_traceparent,
)
from sidecar.telemetry.semconv import (
    CONSUMER_GROUP,
    DESTINATION,
    KAFKA_OFFSET,
    MESSAGE_ID,
    OPERATION_NAME,
    OPERATION_TYPE,
    PARTITION,
    SYSTEM,
    SYSTEM_KAFKA,
    TASK_ID,
    TASK_PATH,
    TASK_TYPE,
)
from sidecar.telemetry.tracing import Tracing
from sidecar.transport.message import QueueMessage, header_text
from sidecar.verdicts.trace import PROCESS_TRACEPARENT

__all__ = ["kafka_run_facts", "traced"]


async def traced(
    tracing: Tracing, message: QueueMessage, group: str, work: Coroutine[Any, Any, None]
) -> None:
    """Run ``work`` (the shadow's handling of ``message``) in its ``process`` span."""
    headers = message.headers
    header = header_text(headers, TRACEPARENT)
    if tracing.drops_linked(header):
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
    for attribute, name in ((MESSAGE_ID, "x-redis-id"), (TASK_ID, "x-task-id")):
        value = header_text(headers, name)
        if value is not None:
            attributes[attribute] = value
    attributes[TASK_TYPE] = header_text(headers, "x-task-type") or ""
    attributes[TASK_PATH] = "kafka"
    span = tracing.tracer.start_span(
        tracing.span_name("process", message.topic),
        context=continuing(producer),
        kind=SpanKind.CONSUMER,
        attributes=attributes,
        links=[Link(producer)] if producer is not None else None,
    )
    with trace.use_span(span, end_on_exit=True):
        await work


def redis_run_span(
    tracing: Tracing, traceparent: str | None, entry_id: str, task_id: str, task_type: str
) -> trace.Span | None:
    """The ``run redis`` span of a task's redis run (the mirror runs the handler on the Redis
    copy), a child of the context its Kafka record carries: the mirror's ``send`` span, so the
    Redis read, the produce and the redis run are one trace. ``None`` when that context was
    not sampled (a task is traced from Redis to its verdict or not at all); the caller ends it."""
    producer = parse_traceparent(traceparent)
    if producer is None or not producer.trace_flags.sampled:
        return None
    return tracing.tracer.start_span(
        "run redis",
        context=continuing(producer),
        kind=SpanKind.INTERNAL,
        attributes={
            MESSAGE_ID: entry_id,
            TASK_ID: task_id,
            TASK_TYPE: task_type,
            TASK_PATH: "redis",
        },
    )


def kafka_run_facts(message: QueueMessage) -> dict[str, str]:
    """What the judge needs to link a verdict: the record's producer context and, within
    a ``process`` span being recorded, that span's context."""
    facts = {}
    producer = message.header_text(TRACEPARENT)
    if producer is not None:
        facts[TRACEPARENT] = producer
    span = trace.get_current_span()
    if span.is_recording():
        facts[PROCESS_TRACEPARENT] = format_traceparent(span.get_span_context()).decode()
    return facts
