"""Served records: tasks RAGFlow executes from Kafka (``ragflow_mq``), not copies of entries.

They share the task topics with the mirror's copies of stream entries, which never carry
``x-served``. Whatever reads those topics (``drain-to-redis``, ``reconcile``, the shadow) tells
the two apart here, so that all of them draw the line where RAGFlow's executors draw it.
"""

from __future__ import annotations

from collections.abc import Sequence

from sidecar.transport.dead_letter import NAME_LIMIT
from sidecar.wire.contract import QUEUE_HEADER, SERVED_HEADER

Headers = Sequence[tuple[str, bytes]]


def _last(headers: Headers, name: str) -> bytes | None:
    found = None
    for key, value in headers:
        if key == name:
            found = value
    return found


def is_served(headers: Headers) -> bool:
    """Whether the record is one RAGFlow executes from Kafka: ``x-served: 1`` (the last
    header of that name, as everywhere else a header is read)."""
    return _last(headers, SERVED_HEADER) == b"1"


def served_queue(headers: Headers) -> str | None:
    """The stream RAGFlow named in ``queue_product`` (``x-ragflow-queue``), or ``None`` when
    the header is absent, empty, not UTF-8 or too long to be a stream name."""
    raw = _last(headers, QUEUE_HEADER)
    if not raw or len(raw) > NAME_LIMIT:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def target_stream(queue: str, streams: Sequence[str]) -> str:
    """Where a served record of ``queue`` belongs on Redis: that stream when it is one of
    ``MIRROR_STREAMS``, else the last (lowest priority) of them, the queue RAGFlow's executors
    serve such a record from; a header never makes us write to a key that is not a task
    stream."""
    return queue if queue in streams or not streams else streams[-1]
