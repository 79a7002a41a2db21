"""RAGFlow's task kinds: one row per task_type, read by routing and by the dry run alike.

A row says, for one ``task_type`` pattern (an exact name, or a prefix ending in ``*``): the
Kafka topic it goes to, its kind, whether RAGFlow queues it per dataset (the fake doc id
``graph_raptor_x`` and a ``doc_ids`` list), the message field that keys it, and which dry-run
check reads it. :mod:`sidecar.config.routing` builds its built-in routes, the task types known
by name and the kind of each topic from :data:`TASK_KINDS`; :mod:`sidecar.shadow.dry_run`
builds its kinds, its dataset-wide set and its checks from it. A new kind is one row here plus
its sample in ``tests/test_task_kinds.py``; docs/changing.md lists the rest.

Choices, read from upstream RAGFlow (api/db/__init__.py, rag/svr/task_executor.py,
api/db/services/document_service.py, api/db/services/task_service.py):

- Exact names for the dataset-wide jobs. ``collect()`` re-reads a fake-doc message through
  ``TaskService.get_task`` only when ``task_type`` is *in* ``PIPELINE_SPECIAL_PROGRESS_FREEZE_
  TASK_TYPES``, ``queue_raptor_o_graphrag_tasks`` asserts one of the same eleven names, and the
  refactored executor's ``is_structure_merge_task`` is set membership too. So ``structure*``
  and ``session_*``, prefixes in the routing before this table, are the exact names
  ``structure_graph``, ``structure_mindmap``, ``structure``, ``session_graph`` and
  ``session_essence``: each is now a task type known by name (its mismatch counter exported at
  0), and a name under those prefixes that RAGFlow does not know is an unknown type, carried
  on the parse topic and counted, as the dry run already flagged it.
- A prefix for dataflow. ``collect()`` and ``do_handle_task`` test ``task_type[:8] ==
  "dataflow"``, so ``dataflow*`` stays a prefix; the names RAGFlow writes under it are rows of
  their own so that they are known by name.
- ``unknown`` for a task of no row. The dry run called it so; the routing said ``other`` for a
  topic outside the table, which no caller read. Both now say ``unknown``.
- ``parse`` is the sidecar's name for a task without ``task_type`` (``queue_tasks`` writes
  none); RAGFlow never writes it, so the dry run flags a message that carries it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar, get_args

from sidecar.transport.topics import (
    DATAFLOW_TOPIC,
    GRAPHRAG_TOPIC,
    MEMORY_TOPIC,
    PARSE_PRIORITY_TOPIC,
    PARSE_TOPIC,
)

Kind = Literal["parse", "dataflow", "dataset", "memory"]
# A task of no row (or, to the routing, on a topic of no row).
TaskKind = Literal[Kind, "unknown"]
# The message field that keys a task, when it is a real one: a fake doc id (FAKE_DOC_ID,
# CANVAS_DEBUG_DOC_ID) or a missing field falls back to the task id.
KeyField = Literal["doc_id", "memory_id"]
# What the dry run checks: the page range of a parse task, the doc_ids of a dataset-wide job,
# the ids a dataflow run needs, a memory task's memory_id and message_dict.
DryRunCheck = Literal["pages", "doc_ids", "dataflow", "memory"]

PARSE = "parse"  # what a task without task_type is
FAKE_DOC_ID = "graph_raptor_x"
# RAGFlow's CANVAS_DEBUG_DOC_ID: one doc id for every canvas debug run, not a document.
CANVAS_DEBUG_DOC_ID = "dataflow_x"


@dataclass(frozen=True)
class TaskKindRow:
    """One RAGFlow task_type and what the sidecar does with it."""

    pattern: str  # an exact task_type, or a prefix ending in "*"
    topic: str
    kind: Kind
    dataset_wide: bool  # queued per dataset with the fake doc id and doc_ids
    key: KeyField
    check: DryRunCheck

    @property
    def is_prefix(self) -> bool:
        return self.pattern.endswith("*")


def _row(pattern: str, topic: str, kind: Kind, key: KeyField, check: DryRunCheck) -> TaskKindRow:
    return TaskKindRow(pattern, topic, kind, False, key, check)


def _dataset(pattern: str) -> TaskKindRow:
    return TaskKindRow(pattern, GRAPHRAG_TOPIC, "dataset", True, "doc_id", "doc_ids")


TASK_KINDS: tuple[TaskKindRow, ...] = (
    _row(PARSE, PARSE_TOPIC, "parse", "doc_id", "pages"),
    _row("dataflow", DATAFLOW_TOPIC, "dataflow", "doc_id", "dataflow"),
    # queue_dataflow(rerun=True), from POST /agents/rerun: one document's pipeline again.
    _row("dataflow_rerun", DATAFLOW_TOPIC, "dataflow", "doc_id", "dataflow"),
    _row("dataflow*", DATAFLOW_TOPIC, "dataflow", "doc_id", "dataflow"),
    # queue_raptor_o_graphrag_tasks's eleven; raptor is also queued per document, with its
    # real doc id (queue_per_doc_raptor_task).
    _dataset("graphrag"),
    _dataset("raptor"),
    _dataset("mindmap"),
    _dataset("wiki"),
    _dataset("skill"),
    _dataset("structure_graph"),
    _dataset("structure_mindmap"),
    _dataset("structure"),
    _dataset("timeline"),
    _dataset("session_graph"),
    _dataset("session_essence"),
    _row("memory", MEMORY_TOPIC, "memory", "memory_id", "memory"),
)

V = TypeVar("V")


class PatternMap(Generic[V]):
    """Task type patterns to values: the exact name first, then the longest matching prefix."""

    def __init__(self, items: Iterable[tuple[str, V]]) -> None:
        self._exact: dict[str, V] = {}
        prefixes: list[tuple[str, V]] = []
        for pattern, value in items:
            if pattern.endswith("*"):
                prefixes.append((pattern[:-1], value))
            else:
                self._exact[pattern] = value
        self._prefixes = sorted(prefixes, key=lambda item: -len(item[0]))

    def get(self, task_type: str) -> V | None:
        if task_type in self._exact:
            return self._exact[task_type]
        for prefix, value in self._prefixes:
            if task_type.startswith(prefix):
                return value
        return None


def checked_rows(rows: tuple[TaskKindRow, ...]) -> tuple[TaskKindRow, ...]:
    """The rows, or a ValueError naming the first one that contradicts another."""
    patterns = [row.pattern for row in rows]
    if len(set(patterns)) != len(patterns):
        raise ValueError(f"task kinds: a pattern is listed twice in {patterns}")
    for row in rows:
        if "*" in row.pattern[:-1] or row.pattern in ("", "*"):
            raise ValueError(f"task kinds: {row.pattern!r} is neither a name nor a prefix*")
        if row.dataset_wide and (row.is_prefix or row.kind != "dataset"):
            raise ValueError(f"task kinds: {row.pattern!r} is dataset-wide, so a dataset name")
    for by, attribute in (("topic", "kind"), ("kind", "key")):
        seen: dict[object, object] = {}
        for row in rows:
            one, other = getattr(row, by), getattr(row, attribute)
            if seen.setdefault(one, other) != other:
                raise ValueError(f"task kinds: {by} {one} has two {attribute}s ({row.pattern!r})")
    if {row.kind for row in rows} != set(get_args(Kind)):
        raise ValueError("task kinds: every Kind needs a row, and every row a Kind")
    if PARSE not in patterns:
        raise ValueError(f"task kinds: no {PARSE!r} row")
    return rows


checked_rows(TASK_KINDS)

ROW_OF_TYPE: PatternMap[TaskKindRow] = PatternMap((row.pattern, row) for row in TASK_KINDS)
# The names RAGFlow queues per dataset (its PIPELINE_SPECIAL_PROGRESS_FREEZE_TASK_TYPES).
DATASET_WIDE_TYPES = frozenset(row.pattern for row in TASK_KINDS if row.dataset_wide)
# Every task topic of the table, and the priority parse topic, with the kind of its tasks.
KIND_OF_TOPIC: dict[str, Kind] = {
    PARSE_PRIORITY_TOPIC: "parse",
    **{row.topic: row.kind for row in TASK_KINDS},
}
KEY_OF_KIND: dict[Kind, KeyField] = {row.kind: row.key for row in TASK_KINDS}
