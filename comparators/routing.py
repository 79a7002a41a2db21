"""Routing: did the mirror put the task on the topic its stream, priority and type call for?"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from comparators.base import Difference


class RoutingComparator:
    """Redis-side facts ``{"stream", "priority", "task_type"}`` against Kafka-side facts
    ``{"topic", "priority", "task_type"}``; every difference is of kind ``routing``."""

    name: str = "routing"

    def __init__(self, expected_topic: Callable[[str, int], str]) -> None:
        self.expected_topic = expected_topic

    def compare(self, left: Mapping[str, Any], right: Mapping[str, Any]) -> list[Difference]:
        """Differences at ``topic`` (left is the expected topic), ``priority`` and ``task_type``."""
        differences = []
        task_type, priority = left.get("task_type"), left.get("priority")
        topic = right.get("topic")
        if isinstance(task_type, str) and isinstance(priority, int):
            expected: str | None = self.expected_topic(task_type, priority)
        else:
            # Without the Redis-side type and priority no topic is right.
            expected = None
        if topic != expected:
            differences.append(Difference("topic", "routing", expected, topic))
        # The priority of the stream read from must survive as the Kafka priority header.
        if priority != right.get("priority"):
            differences.append(Difference("priority", "routing", priority, right.get("priority")))
        if task_type != right.get("task_type"):
            differences.append(
                Difference("task_type", "routing", task_type, right.get("task_type"))
            )
        return differences
