"""How the shadow consumer reads a task record: the entry it names, its task, its numbers.

Apart from the consuming loop (``shadow.py``) so that each stays readable.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

from sidecar.errors import MessageDecodeError
from sidecar.transport.base import OutgoingMessage
from sidecar.transport.dead_letter import NAME_LIMIT, dead_letter
from sidecar.transport.message import QueueMessage, decode_task, header_text
from sidecar.verdicts.join import EntryRef

logger = logging.getLogger(__name__)

_ENTRY_ID = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")


def int_or_none(text: str | None) -> int | None:
    """A header's integer, or ``None`` unless it is one: ``str.isdigit`` passes "²" and other
    scripts' digits and ``int`` raises past 4300 digits, which used to stop the shadow."""
    if text is None or len(text) > 20:
        return None
    digits = text.removeprefix("-")
    return int(text) if digits.isascii() and digits.isdigit() else None


def decode_record(value: bytes | None) -> dict[str, Any]:
    """A record's task, as :func:`decode_task` reads it, less what the shadow cannot handle."""
    if value is None:
        # A null value (a tombstone): "no 'message' field" would send the reader to Redis.
        raise MessageDecodeError("no_value", "the record has no value (null)")
    task = decode_task(value)
    task_id = task.get("id")
    if isinstance(task_id, str) and not task_id.isascii():
        try:
            task_id.encode()
        except UnicodeEncodeError as exc:
            # The cancel key is built from the id, and Valkey keys are UTF-8: it stopped the
            # shadow. The mirror dead-letters such a task for the same reason.
            bad = exc.object[exc.start : exc.end]
            raise MessageDecodeError(
                "not_unicode", f"a lone surrogate {bad!r} in the task's id"
            ) from exc
    return task


def mirror_ref(message: QueueMessage) -> EntryRef | None:
    """The stream entry a record names in ``x-redis-stream`` and ``x-redis-id`` (the last of
    each), or ``None`` when it names none: absent, not UTF-8, or not a stream name and id."""
    stream = message.header("x-redis-stream")
    entry_id = message.header("x-redis-id")
    if not stream or entry_id is None or len(stream) > NAME_LIMIT:
        return None
    try:
        stream_text, id_text = stream.decode("utf-8"), entry_id.decode("ascii")
    except UnicodeDecodeError:
        return None
    return EntryRef(stream_text, id_text) if _ENTRY_ID.fullmatch(id_text) else None


def raise_failures(done: set[asyncio.Task[None]]) -> None:
    """Raise the first failure among ``done``; every one is retrieved, so that asyncio does
    not report the others as never retrieved."""
    failures = [task.exception() for task in done if not task.cancelled()]
    first = next((failure for failure in failures if failure is not None), None)
    if first is not None:
        raise first


def reap(tasks: set[asyncio.Task[None]]) -> None:
    """Drop the finished ones from ``tasks``, raising the first failure among them."""
    finished = {task for task in tasks if task.done()}
    tasks -= finished
    raise_failures(finished)


def retrieve(done: set[asyncio.Task[None]]) -> None:
    """Retrieve the failures of ``done`` without raising: after a loop failure the others in
    hand usually fail of the same cause, and asyncio would report them as never retrieved."""
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            logger.debug("a task in hand failed too: %s", task.exception())


def dead_letter_of(
    message: QueueMessage, reason: str, detail: str, attempts: int, max_value_bytes: int
) -> OutgoingMessage:
    """The DLQ record of a task record the shadow gives up on, with its original bytes and
    headers, the attempts made and where it was read."""
    kept = tuple(
        (name, value)
        for name, value in message.headers
        if name not in ("x-retry-count", "x-redis-stream", "x-redis-id")
    )
    return dead_letter(
        reason=reason,
        detail=detail,
        value=message.value,
        stream=header_text(message.headers, "x-redis-stream") or "",
        entry_id=header_text(message.headers, "x-redis-id") or "",
        stage="shadow",
        max_value_bytes=max_value_bytes,
        extra_headers=(
            *kept,
            ("x-retry-count", str(attempts).encode()),
            ("x-source-topic", message.topic.encode()),
            ("x-source-offset", f"{message.partition}:{message.offset}".encode()),
        ),
    )


def order_key(message: QueueMessage, stream: str) -> str | None:
    """Where per-key order is promised: one partition, one stream, one key, one mirror
    (``x-mirror-consumer``; two mirrors in one group each send their share of a document in
    stream order, not the document's entries between them). None where nothing promised it:
    an entry the mirror took over from another or read again (``x-mirror-claimed``) is sent
    after newer ones of its stream."""
    if message.header("x-mirror-claimed") is not None:
        return None
    key = str(message.key or b"", "utf-8", "replace")
    mirror = str(message.header("x-mirror-consumer") or b"", "utf-8", "replace")
    return f"{message.topic}[{message.partition}]\x00{stream}\x00{mirror}\x00{key}"
