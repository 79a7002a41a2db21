"""Served tasks RAGFlow took and never acked, kept as their consumer name's pending entries.

RAGFlow's ``collect()`` loads a task's row right after ``queue_consumer``, outside any try: a
database error there drops the message unacked, and only RAGFlow's slot is freed. On Redis the
entry stays pending for its consumer name, which replays it when it starts again, and the
executor goes on with new entries meanwhile. A Kafka record cannot wait like that: it pins
its partition's commit, and with it every task finished behind it. So a served task given up
on is written to ``<prefix>:pending:<consumer name>`` in the state store (the record, byte for
byte) and its record is committed past. The same consumer name takes it back when it starts
again; another executor takes it once its holder is gone (``ragflow_mq.claim_scripts.ADOPT``).
"""

from __future__ import annotations

import base64
import json
from typing import Any

from sidecar.transport.message import QueueMessage


def encode_entry(message: QueueMessage) -> str:
    """The record as one hash field value, every byte kept."""

    def b64(value: bytes | None) -> str | None:
        return None if value is None else base64.b64encode(value).decode("ascii")

    return json.dumps(
        {
            "topic": message.topic,
            "partition": message.partition,
            "offset": message.offset,
            "timestamp_ms": message.timestamp_ms,
            "key": b64(message.key),
            "value": b64(message.value),
            "headers": [[name, b64(value)] for name, value in message.headers],
        },
        separators=(",", ":"),
    )


def decode_entry(entry: str | bytes) -> QueueMessage:
    """The record a pending entry holds; raises ``ValueError`` for one that is not an entry."""

    def raw(value: Any) -> bytes | None:
        return None if value is None else base64.b64decode(str(value))

    fields = json.loads(entry)
    if not isinstance(fields, dict):
        raise ValueError("a pending entry is a JSON object")
    topic, partition, offset = str(fields["topic"]), int(fields["partition"]), int(fields["offset"])
    headers = tuple((str(name), raw(value) or b"") for name, value in fields.get("headers", ()))
    return QueueMessage(
        id=f"{topic}:{partition}:{offset}",
        value=raw(fields.get("value")),
        topic=topic,
        partition=partition,
        offset=offset,
        timestamp_ms=int(fields.get("timestamp_ms", 0)),
        key=raw(fields.get("key")),
        headers=headers,
    )
