"""What the mirror writes to Kafka for an entry besides the task: headers, or a DLQ record."""

from __future__ import annotations

from sidecar.transport.base import OutgoingMessage
from sidecar.transport.dead_letter import dead_letter
from sidecar.transport.message import QueueMessage

MAX_REQUEST_BYTES = 1_048_576  # aiokafka's default max_request_size, kept explicit
SCHEMA_VERSION = b"1"
MIRROR_CONSUMER_HEADER = "x-mirror-consumer"
# On a record of an entry the mirror took over or read again (QueueMessage.claimed): sent after
# newer entries of its stream, so no order is promised for it.
MIRROR_CLAIMED_HEADER = "x-mirror-claimed"


def per_stream_headers(
    stream: str, priority: int, mirror_consumer: str
) -> tuple[tuple[str, bytes], ...]:
    """The headers every record from ``stream`` carries, built once per stream.

    ``x-mirror-consumer`` names the mirror that read the entry: one mirror sends a stream's
    entries in its order, two in one group do not, so per-key order is judged per mirror."""
    return (
        (MIRROR_CONSUMER_HEADER, mirror_consumer.encode()),
        ("x-priority", str(priority).encode()),
        ("x-source", f"redis:{stream}".encode()),
        ("x-retry-count", b"0"),
        ("x-schema-version", SCHEMA_VERSION),
        ("x-redis-stream", stream.encode()),
    )


def entry_dead_letter(message: QueueMessage, reason: str, detail: str) -> OutgoingMessage:
    """The DLQ record for a stream entry the mirror cannot put in a task topic."""
    # An entry without a 'message' field keeps its other fields, byte for byte, as headers.
    # Header names are UTF-8: a field name that is not (kept by surrogateescape) is named
    # by its bytes' backslash escapes, as an unencodable name stopped the mirror.
    fields = tuple(
        (
            "x-redis-field-"
            + name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace"),
            value,
        )
        for name, value in message.headers
    )
    return dead_letter(
        reason=reason,
        detail=detail,
        value=message.value,
        stream=message.topic,
        entry_id=message.id,
        stage="mirror",
        max_value_bytes=MAX_REQUEST_BYTES,
        extra_headers=fields if message.value is None else (),
    )
