"""The message model shared by both backends."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sidecar.errors import MessageDecodeError
from sidecar.transport import fastjson


class MessageSettler(Protocol):
    """What a message needs from the consumer it came from to be acked or handed back."""

    async def ack(self, message: QueueMessage) -> None: ...

    async def nack(self, message: QueueMessage, delay_ms: int = 0) -> None: ...


# Not frozen: the mirror builds one per entry, and frozen init costs a setattr call per field.
@dataclass(eq=False)
class QueueMessage:
    """One message as read from a Redis stream or a Kafka topic.

    ``value`` is the raw bytes as stored: for Redis the entry's ``message`` field (``None``
    when the entry has none), for Kafka the record value. For Redis, ``headers`` holds the
    entry's other fields; for Kafka, the record headers. ``partition`` and ``offset`` are -1
    for Redis. ``ack()`` and ``nack()`` act on the consumer that delivered the message.
    """

    id: str
    value: bytes | None
    topic: str
    partition: int = -1
    offset: int = -1
    timestamp_ms: int = 0
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    # A Redis entry delivered out of its stream's order: taken over from another consumer
    # (XAUTOCLAIM) or handed back and read again (XCLAIM after a nack). Newer entries of the
    # stream may have gone before it.
    claimed: bool = False
    settler: MessageSettler | None = field(default=None, repr=False, compare=False)
    # Made on first use and kept, by hand: Python 3.11's cached_property takes a lock per
    # first read, which cost more than the parse of a header map (twice a message).
    _payload: dict[str, Any] | None = field(default=None, init=False, repr=False, compare=False)
    _header_map: dict[str, bytes] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    @property
    def payload(self) -> dict[str, Any]:
        """The value parsed as a JSON object; raises :class:`MessageDecodeError` otherwise."""
        payload = self._payload
        if payload is None:
            payload = self._payload = decode_task(self.value)
        return payload

    def header(self, name: str) -> bytes | None:
        """The last header (or Redis field) of that name, or ``None``."""
        by_name = self._header_map
        if by_name is None:
            by_name = self._header_map = dict(self.headers)  # the last of a name wins
        return by_name.get(name)

    def header_text(self, name: str) -> str | None:
        """The last header (or Redis field) of that name as text, or ``None``."""
        found = self.header(name)
        return found.decode("utf-8", "replace") if found is not None else None

    async def ack(self) -> None:
        """Mark the message done (XACK / offset commit up to the lowest unfinished)."""
        await self._settler().ack(self)

    async def nack(self, delay_ms: int = 0) -> None:
        """Hand the message back: it is delivered again after ``delay_ms``, and after a crash."""
        await self._settler().nack(self, delay_ms)

    def _settler(self) -> MessageSettler:
        if self.settler is None:
            raise RuntimeError(f"message {self.id} was not delivered by a consumer")
        return self.settler


def header_text(headers: Sequence[tuple[str, bytes]], name: str) -> str | None:
    """The last header (or Redis field) of that name as text, or ``None``."""
    found = None
    for key, value in headers:
        if key == name:
            found = value
    return found.decode("utf-8", "replace") if found is not None else None


def encode_task(task: Mapping[str, Any]) -> bytes:
    """Serialise a task exactly as RAGFlow's ``queue_product`` does (``json.dumps`` defaults)."""
    return json.dumps(task).encode("ascii")


def decode_task(value: bytes | None) -> dict[str, Any]:
    """Parse a message value into a task dict, naming what is wrong with it if it is not one."""
    if value is None:
        raise MessageDecodeError("no_message_field", "the entry has no 'message' field")
    try:
        task = fastjson.loads(value)
    except UnicodeDecodeError as exc:
        raise MessageDecodeError("not_utf8", f"invalid UTF-8 at byte {exc.start}") from exc
    except json.JSONDecodeError as exc:
        raise MessageDecodeError("not_json", f"{exc.msg} at position {exc.pos}") from exc
    except RecursionError as exc:
        raise MessageDecodeError("not_json", "nesting too deep") from exc
    except ValueError as exc:
        # Valid JSON past a limit of Python's parser (RAGFlow's too): an integer of more than
        # sys.get_int_max_str_digits() digits. Not caught, it stopped the mirror on the entry.
        raise MessageDecodeError("not_json", f"beyond Python's JSON limits: {exc}") from exc
    if not isinstance(task, dict):
        raise MessageDecodeError("not_object", f"JSON {type(task).__name__}, not an object")
    return task
