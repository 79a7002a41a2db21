"""Which of RAGFlow's coroutines holds which task, to see a task given up on.

Upstream's executor runs one asyncio task per slot (``handle_task`` under ``task_manager``), on
one loop, and calls the queue synchronously from it: ``collect()`` then loads the task's row
(``TaskService.get_task``) outside any try, so a database error there ends the coroutine with
the message unacked, and only RAGFlow's slot is freed. A coroutine that ends, or asks for
another task, without acking the one it was handed has given it up. Outside a coroutine (a
thread of RAGFlow's own, say) nothing is watched, and a task dropped unacked keeps its slot
until the process ends, as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol


class Handed(Protocol):
    """A task as RAGFlow holds it (``KafkaTask``, ``RedisTask``)."""

    @property
    def acked(self) -> bool: ...


class Callers:
    """RAGFlow's coroutine -> the task it was handed last; all on RAGFlow's loop thread."""

    def __init__(self, gave_up: Callable[[Any], None]) -> None:
        self._gave_up = gave_up
        self._last: dict[asyncio.Task[Any], Handed] = {}

    def handed(self, task: Handed) -> None:
        """``task`` was just returned to the coroutine running now, if any."""
        try:
            caller = asyncio.current_task()
        except RuntimeError:  # no running loop in this thread
            return
        if caller is None:
            return
        previous = self._last.get(caller)
        self._last[caller] = task
        if previous is None:
            caller.add_done_callback(self._ended)
        elif not previous.acked:
            self._gave_up(previous)

    def _ended(self, caller: asyncio.Task[Any]) -> None:
        task = self._last.pop(caller, None)
        if task is not None and not task.acked:
            self._gave_up(task)
