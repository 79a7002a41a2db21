"""RAGFlow's own ``RedisMsg`` as ``queue_consumer`` hands it out under ``install()``: the same
object to RAGFlow, its hand-out and ack timed for the evidence."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class RedisTask:
    """Wraps RAGFlow's message; ``on_ack("redis", task)`` once, at its first ack."""

    def __init__(self, message: Any, on_ack: Callable[[str, RedisTask], None]) -> None:
        self._message = message
        self._on_ack = on_ack
        self.handed_out_s = time.time()
        self.queue_wait_ms: float | None = None  # from its stream entry's id, when it has one
        self._acked = False

    def get_message(self) -> Any:
        return self._message.get_message()

    def get_msg_id(self) -> Any:
        return self._message.get_msg_id()

    @property
    def task_id(self) -> str | None:
        """The task's id as ``KafkaTask.task_id`` reads it; ``None`` for a message that is
        not a task (no JSON object)."""
        message = self.get_message()
        return str(message.get("id")) if isinstance(message, dict) else None

    @property
    def acked(self) -> bool:
        return self._acked

    def ack(self) -> bool:
        ok = bool(self._message.ack())
        if not self._acked:
            self._acked = True
            self._on_ack("redis", self)
        return ok

    def __getattr__(self, name: str) -> Any:
        return getattr(self._message, name)
