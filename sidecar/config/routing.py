"""Which Kafka topic and key a RAGFlow task goes to (seed design 3.2).

The built-in routes are data, the patterns and topics of RAGFlow's task kinds
(:mod:`sidecar.config.task_kinds`), which ``MIRROR_ROUTES`` can extend or override. Keys keep
per-document order: ``doc_id`` for document tasks, the task ``id`` for dataset-wide jobs (whose
``doc_id`` is the shared fake id ``graph_raptor_x``) and canvas debug runs (all of which carry
``doc_id`` ``dataflow_x``), ``memory_id`` for memory tasks: each document, memory and run its
own place in the shares and the partitions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from sidecar.config.task_kinds import (
    CANVAS_DEBUG_DOC_ID,
    FAKE_DOC_ID,
    KEY_OF_KIND,
    KIND_OF_TOPIC,
    PARSE,
    TASK_KINDS,
    PatternMap,
    TaskKind,
)
from sidecar.transport.topics import PARSE_PRIORITY_TOPIC

# Not a task type: the key of MIRROR_ROUTES that moves the priority parse topic.
PRIORITY_PARSE = "parse.priority"
# The task type whose topic takes a dataset-wide job without a task_type.
_DATASET_TYPE = "graphrag"

DEFAULT_ROUTES: dict[str, str] = {row.pattern: row.topic for row in TASK_KINDS}

# The task types known by name (the exact patterns): the labels whose counters are exported at
# 0 before their first task.
KNOWN_TASK_TYPES: tuple[str, ...] = tuple(row.pattern for row in TASK_KINDS if not row.is_prefix)


# A NamedTuple, not a frozen dataclass: the mirror builds one per task on its hot path.
class Route(NamedTuple):
    """Where one task goes and why."""

    topic: str
    key: str
    task_type: str
    kind: TaskKind
    known_type: bool


class RouteTable:
    """Task type to topic: ``MIRROR_ROUTES`` first, then the built-in table; in each, the exact
    name first, then the longest matching prefix. An override thus wins over every built-in
    name it covers: ``structure*`` takes ``structure_graph`` too."""

    def __init__(
        self,
        overrides: Iterable[tuple[str, str]] = (),
        priority_parse_topic: str = PARSE_PRIORITY_TOPIC,
    ) -> None:
        chosen = dict(overrides)
        priority_parse_topic = chosen.pop(PRIORITY_PARSE, priority_parse_topic)
        self._overrides = PatternMap(chosen.items())
        self._defaults = PatternMap(DEFAULT_ROUTES.items())
        self._all_topics = {*{**DEFAULT_ROUTES, **chosen}.values(), priority_parse_topic}
        self._priority_parse_topic = priority_parse_topic
        self._parse_topic = self._topic_for(PARSE) or DEFAULT_ROUTES[PARSE]
        self._dataset_topic = self._topic_for(_DATASET_TYPE) or DEFAULT_ROUTES[_DATASET_TYPE]

    @property
    def topics(self) -> set[str]:
        return set(self._all_topics)

    @property
    def priority_parse_topic(self) -> str:
        return self._priority_parse_topic

    def ordered_topics(self) -> list[str]:
        """Every task topic, the priority parse topic first (served before the others)."""
        rest = sorted(self.topics - {self._priority_parse_topic})
        return [self._priority_parse_topic, *rest]

    def _topic_for(self, task_type: str) -> str | None:
        return self._overrides.get(task_type) or self._defaults.get(task_type)

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
        if kind != "unknown" and KEY_OF_KIND[kind] == "memory_id":
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


def _kind(topic: str, dataset_wide: bool) -> TaskKind:
    return "dataset" if dataset_wide else KIND_OF_TOPIC.get(topic, "unknown")
