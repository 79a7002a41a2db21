"""Handlers the shadow tests load by ``SHADOW_HANDLER=tests.shadow_handlers:...``."""

from __future__ import annotations

import asyncio
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


# Task ids whose first kafka run is slow: a test adds them (the sidecar runs in its process).
SLOW_FIRST_KAFKA_RUN: set[str] = set()


async def slow_first_kafka_run(task: dict[str, Any], meta: TaskMeta) -> dict[str, Any]:
    """As ``ragflow``; the first kafka run of a task in ``SLOW_FIRST_KAFKA_RUN`` takes a second,
    so that a second copy of its entry is recorded first."""
    task_id = str(task.get("id"))
    if meta.path == "kafka" and task_id in SLOW_FIRST_KAFKA_RUN:
        SLOW_FIRST_KAFKA_RUN.discard(task_id)
        await asyncio.sleep(1.0)
    return ragflow_dry_run(task, meta)


# Tasks carrying this digest get a different kafka run: a mismatch on ``to_page``.
MISMATCH_MARKER = "kafka-differs"


def kafka_differs_on_marker(task: dict[str, Any], meta: TaskMeta) -> dict[str, Any]:
    """As ``ragflow``; on the kafka path, a task whose digest is the marker ends one page later
    (what a broken migration could do), so its verdict is a ``value_changed`` mismatch."""
    outcome = ragflow_dry_run(task, meta)
    if meta.path == "kafka" and task.get("digest") == MISMATCH_MARKER:
        outcome = {**outcome, "to_page": int(outcome.get("to_page") or 0) + 1}
    return outcome
