"""Deliberate faults on the Kafka copies, so a newcomer sees every verdict kind caught.

Used by ``make demo --inject-faults`` and by the tests, never by default. The injector sits in
the mirror between routing and producing: it may change one field of the Kafka copy (the
comparison must report a ``mismatch`` naming that field), drop the copy (``missing_in_kafka``)
or send it twice (``duplicate``). The Redis copy, and so the redis run, is never touched.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable
from typing import Literal

from sidecar.transport.base import OutgoingMessage
from sidecar.transport.message import QueueMessage

Fault = Literal["change", "drop", "duplicate"]
FAULTS: tuple[Fault, ...] = ("change", "drop", "duplicate")
# Fields changed, in order of preference: ones the ragflow handler's outcome carries.
_CHANGEABLE = ("to_page", "doc_id", "memory_id", "kb_id", "dataflow_id")


class FaultInjector:
    """Turns a record into zero, one (maybe changed) or two records, as ``choose`` says."""

    def __init__(self, choose: Callable[[QueueMessage], Fault | None]) -> None:
        self._choose = choose
        self.injected: Counter[str] = Counter()
        self.changed_fields: dict[tuple[str, str], str] = {}  # (stream, entry id) -> field

    @classmethod
    def share(cls, percent: float, seed: str = "demo") -> FaultInjector:
        """Faults on about ``percent`` % of entries, the three kinds in turn, stable per entry."""

        def choose(message: QueueMessage) -> Fault | None:
            name = f"{seed}/{message.topic}/{message.id}"
            digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
            bucket = int.from_bytes(digest, "big") % 30000 / 100  # [0, 300)
            if bucket >= percent * 3:
                return None
            return FAULTS[int(bucket // percent) % 3] if percent > 0 else None

        return cls(choose)

    def __call__(self, message: QueueMessage, record: OutgoingMessage) -> list[OutgoingMessage]:
        fault = self._choose(message)
        if fault is None:
            return [record]
        self.injected[fault] += 1
        if fault == "drop":
            return []
        if fault == "duplicate":
            return [record, record]
        changed, name = _change_one_field(record.value_bytes())
        self.changed_fields[message.topic, message.id] = name
        return [record._replace(value=changed)]


def _change_one_field(value: bytes) -> tuple[bytes, str]:
    task = json.loads(value)
    for name in _CHANGEABLE:
        current = task.get(name)
        if isinstance(current, int) and not isinstance(current, bool):
            task[name] = current + 1
            return json.dumps(task).encode(), name
        if isinstance(current, str) and current:
            task[name] = current[::-1] if current[::-1] != current else current + "x"
            return json.dumps(task).encode(), name
    task["injected"] = True
    return json.dumps(task).encode(), "injected"
