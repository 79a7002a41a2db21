"""Which Kafka topic and key a RAGFlow task goes to (seed design 3.2).

The table is data: task_type patterns (exact, or a prefix ending in ``*``) to topics, which
``MIRROR_ROUTES`` can extend or override. Keys keep per-document order: ``doc_id`` for
document tasks, the task ``id`` for dataset-wide jobs (whose ``doc_id`` is the shared fake id
``graph_raptor_x``), ``memory_id`` for memory tasks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from sidecar.topics import (
    DATAFLOW_TOPIC,
    GRAPHRAG_TOPIC,
    MEMORY_TOPIC,
    PARSE_PRIORITY_TOPIC,
    PARSE_TOPIC,
)

FAKE_DOC_ID = "graph_raptor_x"
PARSE = "parse"  # what a task without task_type is

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

Kind = Literal["parse", "dataflow", "dataset", "memory", "other"]


@dataclass(frozen=True)
class Route:
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
        self._exact = {k: v for k, v in table.items() if not k.endswith("*")}
        self._prefixes = sorted(
            ((k[:-1], v) for k, v in table.items() if k.endswith("*")),
            key=lambda item: -len(item[0]),
        )
        self._priority_parse_topic = priority_parse_topic

    @property
    def topics(self) -> set[str]:
        return {*self._exact.values(), *(t for _, t in self._prefixes), self._priority_parse_topic}

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
        task_type = raw_type if isinstance(raw_type, str) and raw_type else PARSE
        task_id = str(task.get("id"))
        doc_id = task.get("doc_id")
        dataset_wide = doc_id == FAKE_DOC_ID
        topic = self._topic_for(task_type)
        known = topic is not None
        if topic is None:
            # Unknown types are carried, not dropped, on the parse topic; the caller counts them.
            topic = self._exact.get(PARSE, PARSE_TOPIC)
        if dataset_wide and task_type == PARSE:
            topic = GRAPHRAG_TOPIC
        if topic == self._exact.get(PARSE, PARSE_TOPIC) and priority >= 1 and known:
            topic = self._priority_parse_topic
        kind = _kind(topic, dataset_wide)
        if kind == "memory":
            key = str(task.get("memory_id") or task_id)
        elif dataset_wide or not isinstance(doc_id, str) or not doc_id:
            key = task_id
        else:
            # A per-document raptor carries the real doc id: keyed by it, the document's tasks
            # stay in order and the document is wholly in or out of the traffic share.
            key = doc_id
        return Route(topic=topic, key=key, task_type=task_type, kind=kind, known_type=known)


def _kind(topic: str, dataset_wide: bool) -> Kind:
    if topic == GRAPHRAG_TOPIC or dataset_wide:
        return "dataset"
    if topic == DATAFLOW_TOPIC:
        return "dataflow"
    if topic == MEMORY_TOPIC:
        return "memory"
    if topic in (PARSE_TOPIC, PARSE_PRIORITY_TOPIC):
        return "parse"
    return "other"
