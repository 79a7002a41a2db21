"""Dead-letter records: what could not be mirrored or processed, with its bytes and the reason."""

from __future__ import annotations

from sidecar.mq.base import OutgoingMessage
from sidecar.topics import DLQ_TOPIC

# Room left for headers and the record's framing under the producer's max_request_size.
_FRAMING_BYTES = 16 * 1024
DETAIL_LIMIT = 1000


def dead_letter(
    *,
    reason: str,
    detail: str,
    value: bytes | None,
    stream: str,
    entry_id: str,
    stage: str,
    max_value_bytes: int,
    extra_headers: tuple[tuple[str, bytes], ...] = (),
    topic: str = DLQ_TOPIC,
) -> OutgoingMessage:
    """A DLQ record holding ``value`` as read (as much as fits, flagged when truncated).

    ``x-redis-stream`` and ``x-redis-id`` name the entry, so a truncated value can be read back
    whole from Redis; the streams are never trimmed.
    """
    original = value if value is not None else b""
    limit = max(max_value_bytes - _FRAMING_BYTES, 0)
    truncated = len(original) > limit
    headers = [
        ("x-error", reason.encode()),
        ("x-error-detail", detail[:DETAIL_LIMIT].encode("utf-8", "replace")),
        ("x-stage", stage.encode()),
        ("x-redis-stream", stream.encode("utf-8", "surrogateescape")),
        ("x-redis-id", entry_id.encode()),
        ("x-original-size", str(len(original)).encode()),
        ("x-truncated", b"true" if truncated else b"false"),
        ("x-has-message-field", b"false" if value is None else b"true"),
        *extra_headers,
    ]
    return OutgoingMessage(
        destination=topic,
        value=original[:limit] if truncated else original,
        key=f"{stream}/{entry_id}",
        headers=headers,
    )
