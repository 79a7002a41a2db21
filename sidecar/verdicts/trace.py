"""The judge's span: one ``compare`` per verdict, a mismatch with its (redacted) differences.

``compare`` (INTERNAL) carries ``verdict``, ``task.type``, ``task.id`` (a mismatch also
``verdict.comparators`` and ``verdict.difference_kinds``); it is linked to the task's producer
context and to its ``process`` span, and a child of the producer context when that was sampled
(the task's one trace); a bad verdict of an unsampled task is a trace of its own. Its trace id,
when sampled, is recorded with the verdict (``trace_id``), which is how ``diffs`` and the
drill-down dashboard lead from a mismatch to its trace. A mismatch carries a ``diff`` event: the
differences as JSON, at most :data:`MAX_DIFF_CHARS`, with the left and right of any
difference under a ``TRACE_REDACT_FIELDS`` field replaced by :data:`REDACTED`. The span is
started once the verdict is known, with the comparison's start time, so the sampler sees the
verdict and keeps every bad one (:mod:`sidecar.telemetry.sampler`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from opentelemetry.trace import SpanKind

from sidecar.telemetry.propagation import TRACEPARENT, continuing, links, parse_traceparent
from sidecar.telemetry.sampler import ALWAYS_EXPORTED_VERDICTS
from sidecar.telemetry.semconv import MESSAGE_ID, TASK_ID, TASK_TYPE, VERDICT
from sidecar.telemetry.tracing import MAX_ATTRIBUTE_CHARS, Tracing

if TYPE_CHECKING:
    from sidecar.verdicts.model import VerdictRecord

__all__ = [
    "MAX_DIFF_CHARS",
    "PROCESS_TRACEPARENT",
    "REDACTED",
    "compare_span",
    "diff_json",
    "is_redacted",
]

VERDICT_ID: Final = "verdict.id"
VERDICT_ERROR: Final = "verdict.error"
# A mismatch's kinds, as attributes a trace search can name (the diff event holds the rest):
# the comparators that found it, and the kinds of its differences (value_changed, ...).
VERDICT_COMPARATORS: Final = "verdict.comparators"
VERDICT_KINDS: Final = "verdict.difference_kinds"
DIFF_EVENT: Final = "diff"
DIFF_DIFFERENCES: Final = "differences"
DIFF_TOTAL: Final = "differences.total"
REDACTED: Final = "[redacted]"
MAX_DIFF_CHARS: Final = MAX_ATTRIBUTE_CHARS // 2  # the diff event's JSON (ASCII, so also bytes)
MAX_ERROR_CHARS: Final = 300
# The fact (beside TRACEPARENT, the producer's) that holds the context of the record's
# ``process`` span: the shadow writes it, the compare span links to it.
PROCESS_TRACEPARENT: Final = "process_traceparent"


def compare_span(
    tracing: Tracing,
    record: VerdictRecord,
    started_ns: int,
    facts: Sequence[Mapping[str, Any]],
) -> None:
    """The ``compare`` span of one verdict, from ``started_ns`` to now; ``facts`` are the
    joined sides (the kafka run first), which hold the contexts to link to. A sampled span's
    trace id goes into ``record.trace_id``: the verdict names the trace that explains it."""
    producer = next((f[TRACEPARENT] for f in facts if f.get(TRACEPARENT)), None)
    if record.verdict not in ALWAYS_EXPORTED_VERDICTS and tracing.drops_linked(producer):
        return  # the sampler would drop the span: do not make one
    process = next((f[PROCESS_TRACEPARENT] for f in facts if f.get(PROCESS_TRACEPARENT)), None)
    attributes: dict[str, Any] = {
        VERDICT: record.verdict,
        VERDICT_ID: record.verdict_id,
        TASK_TYPE: record.task_type,
        TASK_ID: record.task_id,
        MESSAGE_ID: record.entry_id,
    }
    if record.error:
        attributes[VERDICT_ERROR] = record.error[:MAX_ERROR_CHARS]
    if record.verdict == "mismatch":
        # Only when there is something to name: a list attribute costs the SDK's validation.
        found = sorted(name for name, count in record.comparators.items() if count)
        if found:
            attributes[VERDICT_COMPARATORS] = found
        kinds = sorted({str(d["kind"]) for d in record.differences if d.get("kind")})
        if kinds:
            attributes[VERDICT_KINDS] = kinds
    span = tracing.tracer.start_span(
        "compare",
        # In the task's trace when its producer context was sampled; else (a bad verdict is
        # exported whatever the sampling) a trace of its own, linked.
        context=continuing(parse_traceparent(producer)),
        kind=SpanKind.INTERNAL,
        attributes=attributes,
        links=links(producer, process) or None,
        start_time=started_ns,
    )
    context = span.get_span_context()
    if context.trace_flags.sampled:
        record.trace_id = f"{context.trace_id:032x}"
    if record.verdict == "mismatch" and span.is_recording():
        span.add_event(
            DIFF_EVENT,
            {
                DIFF_DIFFERENCES: diff_json(record.differences, tracing.settings.redact_fields),
                DIFF_TOTAL: record.differences_total,
            },
        )
    span.end()


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
