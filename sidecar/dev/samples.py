"""RAGFlow-shaped tasks, as ../shared/ragflow-queue.md describes them: for the demo and tests."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from typing import Any


def ragflow_tasks(n: int) -> list[dict[str, Any]]:
    """``n`` tasks cycling through the five shapes: parse, dataset-wide raptor, per-document
    raptor, dataflow and memory (whose ``message_dict`` holds user text)."""
    return list(itertools.islice(ragflow_task_stream(), n))


def ragflow_task_stream() -> Iterator[dict[str, Any]]:
    """As :func:`ragflow_tasks`, one at a time and without end: a load that runs until told
    to stop takes what it uses (a million made up front took minutes of a busy CPU)."""
    for i in itertools.count():
        tid, doc = uuid.uuid1().hex, uuid.uuid1().hex
        common = {
            "begin_at": "2026-08-22 10:15:03",
            "digest": "9f3c1b2a7d4e6f80",
            "create_time": 1787379303123 + i,
            "create_date": "2026-08-22 10:15:03",
            "update_time": 1787379303123 + i,
            "update_date": "2026-08-22 10:15:03",
        }
        kind = i % 5
        if kind == 0:
            task = {
                "id": tid,
                "doc_id": doc,
                "progress": 0.0,
                "from_page": 0,
                "to_page": 12,
                "priority": 0,
                **common,
            }
        elif kind == 1:
            task = {
                "id": tid,
                "doc_id": "graph_raptor_x",
                "from_page": 100000000,
                "to_page": 100000000,
                "task_type": "raptor",
                "progress_msg": "10:20:00 created task raptor",
                **common,
                "doc_ids": ["d1", "d2"],
            }
        elif kind == 2:
            task = {
                "id": tid,
                "doc_id": doc,
                "from_page": 100000000,
                "to_page": 100000000,
                "task_type": "raptor",
                "progress_msg": "",
                **common,
                "doc_ids": [doc],
            }
        elif kind == 3:
            task = {
                "id": tid,
                "doc_id": doc,
                "task_type": "dataflow",
                "kb_id": "kb1",
                "tenant_id": "tenant-7",
                "dataflow_id": "df1",
                "file": None,
                **common,
            }
        else:
            task = {
                "id": tid,
                "task_id": tid,
                "task_type": "memory",
                "memory_id": f"mem{i % 3}",
                "tenant_id": "tenant-7",
                "source_id": 1042,
                "message_dict": {
                    "user_id": "",
                    "agent_id": "a1",
                    "session_id": "s1",
                    "user_input": 'Grüße, 你好 "quoted"\n',
                    "agent_response": "ok",
                },
            }
        yield task
