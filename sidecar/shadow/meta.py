"""What the runner tells a handler about the task copy it runs on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class TaskMeta:
    """Where a task copy came from and what the runner looked up for it."""

    path: Literal["redis", "kafka"]
    stream: str
    entry_id: str
    topic: str | None
    partition: int | None
    offset: int | None
    attempt: int  # 1-based delivery count on this path
    cancelled: bool  # the ``{task_id}-cancel`` key existed when the runner looked
