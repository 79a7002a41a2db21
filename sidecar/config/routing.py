"""Which Kafka topic and key a RAGFlow task goes to (seed design 3.2).

The table is data: task_type patterns (exact, or a prefix ending in ``*``) to topics, which
``MIRROR_ROUTES`` can extend or override. Keys keep per-document order: ``doc_id`` for
document tasks, the task ``id`` for dataset-wide jobs (whose ``doc_id`` is the shared fake id
``graph_raptor_x``) and canvas debug runs (all of which carry ``doc_id`` ``dataflow_x``),
``memory_id`` for memory tasks: each document, memory and run its own place in the shares and
the partitions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal, NamedTuple

from sidecar.transport.topics import (
    DATAFLOW_TOPIC,
    GRAPHRAG_TOPIC,
    MEMORY_TOPIC,
    PARSE_PRIORITY_TOPIC,
    PARSE_TOPIC,
)

FAKE_DOC_ID = "graph_raptor_x"
# RAGFlow's CANVAS_DEBUG_DOC_ID: one doc id for every canvas debug run, not a document.
CANVAS_DEBUG_DOC_ID = "dataflow_x"
PARSE = "parse"  # what a task without task_type is
# Not a task type: the key of MIRROR_ROUTES that moves the priority parse topic.
PRIORITY_PARSE = "parse.priority"

DEFAULT_ROUTES: dict[str, str] = {
    PARSE: PARSE_TOPIC,
    "dataflow*": DATAFLOW_TOPIC,
    "graphrag": GRAPHRAG_TOPIC,
    "raptor": GRAPHRAG_TOPIC,
    "mindmap": GRAPHRAG_TOPIC,
    "wiki": GRAPHRAG_TOPIC,
    "skill": GRAPHRAG_TOPIC,
    "structure*": GRAPHRAG_TOPIC,
    "timeline": GRAPHRAG_TOPIC,
    "session_*": GRAPHRAG_TOPIC,
    "memory": MEMORY_TOPIC,
}

# The task types known by name (the exact patterns, and dataflow, RAGFlow's own under its
# prefix): the labels whose counters are exported at 0 before their first task.
KNOWN_TASK_TYPES: tuple[str, ...] = (
    *(pattern for pattern in DEFAULT_ROUTES if not pattern.endswith("*")),
    "dataflow",
)

Kind = Literal["parse", "dataflow", "dataset", "memory", "other"]


# A NamedTuple, not a frozen dataclass: the mirror builds one per task on its hot path.
class Route(NamedTuple):
    """Where one task goes and why."""

    topic: str
    key: str
    task_type: str
    kind: Kind
    known_type: bool


class RouteTable:
    """Task type to topic; the first exact match wins, then the longest matching prefix."""

    def __init__(
        self,
        overrides: Iterable[tuple[str, str]] = (),
        priority_parse_topic: str = PARSE_PRIORITY_TOPIC,
    ) -> None:
        table = dict(DEFAULT_ROUTES)
        table.update(overrides)
        priority_parse_topic = table.pop(PRIORITY_PARSE, priority_parse_topic)
        self._exact = {k: v for k, v in table.items() if not k.endswith("*")}
        self._prefixes = sorted(
            ((k[:-1], v) for k, v in table.items() if k.endswith("*")),
            key=lambda item: -len(item[0]),
        )
        self._priority_parse_topic = priority_parse_topic
        self._parse_topic = self._exact.get(PARSE, PARSE_TOPIC)
        self._dataset_topic = self._exact.get("graphrag", GRAPHRAG_TOPIC)

    @property
    def topics(self) -> set[str]:
        return {*self._exact.values(), *(t for _, t in self._prefixes), self._priority_parse_topic}

    @property
    def priority_parse_topic(self) -> str:
        return self._priority_parse_topic

    def ordered_topics(self) -> list[str]:
        """Every task topic, the priority parse topic first (served before the others)."""
        rest = sorted(self.topics - {self._priority_parse_topic})
        return [self._priority_parse_topic, *rest]

    def _topic_for(self, task_type: str) -> str | None:
        if task_type in self._exact:
            return self._exact[task_type]
        for prefix, topic in self._prefixes:
            if task_type.startswith(prefix):
                return topic
        return None

    def route(self, task: Mapping[str, Any], priority: int) -> Route:
        """The route of a decoded task read from a stream of ``priority`` (0 or 1)."""
        raw_type = task.get("task_type")
        task_type = raw_type if raw_type and isinstance(raw_type, str) else PARSE
        doc_id = task.get("doc_id")
        dataset_wide = doc_id == FAKE_DOC_ID
        topic = self._topic_for(task_type)
        known = topic is not None
        if topic is None:
            # Unknown types are carried, not dropped, on the parse topic; the caller counts them.
            topic = self._parse_topic
        if dataset_wide and task_type == PARSE:
            topic = self._dataset_topic
        if topic == self._parse_topic and priority >= 1 and known:
            topic = self._priority_parse_topic
        kind = _kind(topic, dataset_wide)
        if kind == "memory":
            key = str(task.get("memory_id") or task.get("id"))
        elif (
            not doc_id
            or not isinstance(doc_id, str)
            or doc_id in (FAKE_DOC_ID, CANVAS_DEBUG_DOC_ID)
        ):
            key = str(task.get("id"))
        else:
            # A per-document raptor carries the real doc id: keyed by it, the document's tasks
            # stay in order and the document is wholly in or out of the traffic share.
            key = doc_id
        return Route(topic, key, task_type, kind, known)


_KIND_OF_TOPIC: dict[str, Kind] = {
    PARSE_TOPIC: "parse",
    PARSE_PRIORITY_TOPIC: "parse",
    DATAFLOW_TOPIC: "dataflow",
    GRAPHRAG_TOPIC: "dataset",
    MEMORY_TOPIC: "memory",
}


def _kind(topic: str, dataset_wide: bool) -> Kind:
    return "dataset" if dataset_wide else _KIND_OF_TOPIC.get(topic, "other")
