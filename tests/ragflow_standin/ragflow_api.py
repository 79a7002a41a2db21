"""Stand-in of RAGFlow's API side of the queue: ``queue_tasks`` (api/db/services/task_service.py).

``python -m ragflow_api --docs N --tasks-per-doc M [--priority-every K] [--rate R] --out FILE``
queues N documents of M parse tasks each, in order, through
``REDIS_CONN.queue_product(get_svr_queue_name(priority), message=task)``, and writes one JSON line
per task to FILE: ``{"task_id", "doc_id", "from_page", "priority", "queue", "ok", "took_s",
"at"}`` (``took_s``: how long ``queue_product`` held RAGFlow's caller; ``at``: when it
returned, epoch seconds). Document i
(from 0) is at priority 1 when K > 0 and i % K == 0. ``--rate`` is tasks per second, 0 = as fast
as possible. Exit 0, or 1 when a ``queue_product`` returned False (after writing its line);
SIGTERM stops it after the line of the task in hand, exit 0.

The task shape is RAGFlow's (shape 1 of docs ragflow-queue.md): page ranges of
``PAGE_SIZE`` (RAGFlow's default task_page_size for PDFs, 12) in increasing order, a 16-hex digest
(RAGFlow: xxhash64 of the chunking config and doc_id/from_page/to_page; blake2b-64 here), and the
create/update times that RAGFlow's bulk_insert_into_db adds before the task is queued.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import signal
import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any
from uuid import uuid1

from common import settings
from rag.utils.redis_conn import REDIS_CONN

PAGE_SIZE = 12

Task = dict[str, Any]
OnQueued = Callable[[Task, str, bool, float], None]


def _date(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S")


def build_tasks(doc_id: str, n: int, priority: int) -> list[Task]:
    """``n`` parse tasks of one document, as queue_tasks builds them for a PDF."""
    tasks: list[Task] = []
    now_ms = int(time.time() * 1000)
    begin_at = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    for i in range(n):
        from_page, to_page = i * PAGE_SIZE, (i + 1) * PAGE_SIZE
        digest = hashlib.blake2b(digest_size=8)
        for value in ("naive", doc_id, from_page, to_page):
            digest.update(str(value).encode("utf-8"))
        created = now_ms + i
        tasks.append(
            {
                "id": uuid1().hex,
                "doc_id": doc_id,
                "progress": 0.0,
                "from_page": from_page,
                "to_page": to_page,
                "begin_at": begin_at,
                "digest": digest.hexdigest(),
                "priority": priority,
                "create_time": created,
                "create_date": _date(created),
                "update_time": created,
                "update_date": _date(created),
            }
        )
    return tasks


def queue_tasks(
    doc_id: str, n: int, priority: int, on_queued: OnQueued | None = None
) -> list[Task]:
    """Queue ``n`` tasks of ``doc_id`` in page order; raises AssertionError as RAGFlow's assert.

    ``on_queued(task, queue, ok, took_s)`` is called after each ``queue_product``, before the check.
    """
    tasks = build_tasks(doc_id, n, priority)
    for task in tasks:
        queue = settings.get_svr_queue_name(priority)
        started = time.monotonic()
        ok = REDIS_CONN.queue_product(queue, message=task)
        if on_queued is not None:
            on_queued(task, queue, ok, time.monotonic() - started)
        if not ok:
            raise AssertionError("Can't access Redis. Please check the Redis' status.")
    return tasks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ragflow_api", description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, required=True)
    parser.add_argument("--tasks-per-doc", type=int, required=True)
    parser.add_argument("--priority-every", type=int, default=0)
    parser.add_argument("--rate", type=float, default=0.0, help="tasks per second, 0 = no limit")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    interval = 1.0 / args.rate if args.rate > 0 else 0.0
    started = time.monotonic()
    sent = 0
    # SIGTERM ends the run between two tasks, never between a queue_product and its line:
    # a task queued and not written down would look like one executed but never produced.
    stopping: list[bool] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(True))
    with open(args.out, "w", encoding="utf-8") as out:

        def on_queued(task: Task, queue: str, ok: bool, took_s: float) -> None:
            nonlocal sent
            line = {
                "task_id": task["id"],
                "doc_id": task["doc_id"],
                "from_page": task["from_page"],
                "priority": task["priority"],
                "queue": queue,
                "ok": ok,
                "took_s": round(took_s, 4),
                "at": round(time.time(), 4),
            }
            out.write(json.dumps(line) + "\n")
            out.flush()
            sent += 1
            if stopping:
                raise SystemExit(0)
            if interval:
                delay = started + sent * interval - time.monotonic()
                if delay > 0:
                    time.sleep(delay)

        for i in range(args.docs):
            priority = 1 if args.priority_every > 0 and i % args.priority_every == 0 else 0
            try:
                queue_tasks(uuid1().hex, args.tasks_per_doc, priority, on_queued)
            except AssertionError as e:
                print(f"ragflow_api: {e}", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
