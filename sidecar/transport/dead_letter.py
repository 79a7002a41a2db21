"""Dead-letter records: what could not be mirrored or processed, with its bytes and the reason."""

from __future__ import annotations

from sidecar.transport.base import OutgoingMessage
from sidecar.transport.topics import DLQ_TOPIC

# Room left for the record's framing under the producer's max_request_size.
_FRAMING_BYTES = 16 * 1024
# What one header costs beyond its name and value (length varints, attributes), rounded up.
_HEADER_OVERHEAD = 16
DETAIL_LIMIT = 1000
# A stream name or entry id longer than this is not one (they come from record headers too).
NAME_LIMIT = 512


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
    whole from Redis; the streams are never trimmed. The value comes first; ``extra_headers``
    get the room it leaves, in order, the first that does not fit cut short and the rest left
    out (``x-headers-truncated``), so the record always fits ``max_value_bytes``.
    """
    original = value if value is not None else b""
    stream, entry_id = stream[:NAME_LIMIT], entry_id[:NAME_LIMIT]
    key = f"{stream}/{entry_id}"
    headers = [
        ("x-error", reason.encode()),
        ("x-error-detail", detail[:DETAIL_LIMIT].encode("utf-8", "replace")),
        ("x-stage", stage.encode()),
        ("x-redis-stream", stream.encode("utf-8", "surrogateescape")),
        ("x-redis-id", entry_id.encode("utf-8", "surrogateescape")),
        ("x-original-size", str(len(original)).encode()),
        ("x-has-message-field", b"false" if value is None else b"true"),
    ]
    # What is left for the value and the extra headers once the key, the headers above and
    # the two truncation flags are counted.
    room = max_value_bytes - _FRAMING_BYTES - len(key.encode("utf-8", "surrogateescape"))
    room -= sum(_header_size(name, data) for name, data in headers)
    room -= 2 * _header_size("x-headers-truncated", b"false")
    limit = max(room, 0)
    truncated = len(original) > limit
    kept_value = original[:limit] if truncated else original
    kept, headers_cut = _fit(extra_headers, room - len(kept_value))
    headers += [
        ("x-truncated", b"true" if truncated else b"false"),
        ("x-headers-truncated", b"true" if headers_cut else b"false"),
    ]
    # Ours after the copied ones: a copied header of the same name (a record's own "x-error")
    # then loses to ours wherever the last header of a name is read.
    return OutgoingMessage(destination=topic, value=kept_value, key=key, headers=[*kept, *headers])


def _header_size(name: str, value: bytes) -> int:
    return len(name.encode("utf-8", "surrogateescape")) + len(value) + _HEADER_OVERHEAD


def _fit(headers: tuple[tuple[str, bytes], ...], room: int) -> tuple[list[tuple[str, bytes]], bool]:
    """The headers that fit in ``room`` bytes; whether any was cut short or left out."""
    kept: list[tuple[str, bytes]] = []
    for name, value in headers:
        size = _header_size(name, value)
        if size <= room:
            kept.append((name, value))
            room -= size
            continue
        spare = room - _header_size(name, b"")
        if spare > 0:
            kept.append((name, value[:spare]))
        return kept, True
    return kept, False
