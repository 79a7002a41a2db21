"""Handlers the shadow tests load by ``SHADOW_HANDLER=tests.shadow_handlers:...``."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from sidecar.shadow.handlers import TaskMeta, ragflow_dry_run

EXPLODE_MARKER = "explode"


def noisy(task: dict[str, Any], meta: TaskMeta) -> dict[str, Any]:
    """The ragflow outcome plus a timestamp and a random id: noise between any two runs."""
    return {
        **ragflow_dry_run(task, meta),
        "finished_at": time.time_ns(),
        "run_id": uuid.uuid4().hex,
    }


def explode_on_marker(task: dict[str, Any], meta: TaskMeta) -> dict[str, Any]:
    """Raises for tasks whose digest is the marker, on both paths: an ``error`` verdict."""
    if task.get("digest") == EXPLODE_MARKER:
        raise RuntimeError(f"cannot handle task {task.get('id')}")
    return ragflow_dry_run(task, meta)


# Set by a test to let stall_until_released return (a handler that hangs is a wedged loop).
RELEASE = threading.Event()


def stall_until_released(task: dict[str, Any], meta: TaskMeta) -> dict[str, Any]:
    """Hangs until the test sets ``RELEASE`` (at most a minute), then answers as ``noop``."""
    RELEASE.wait(60)
    return {"id": task.get("id")}
