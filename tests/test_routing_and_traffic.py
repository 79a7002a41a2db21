"""Routing (seed 3.2) and the sticky traffic share."""

from __future__ import annotations

import uuid

import pytest

from sidecar.config.routing import KNOWN_TASK_TYPES, RouteTable
from sidecar.config.traffic import in_traffic_share, traffic_bucket

TABLE = RouteTable()


@pytest.mark.parametrize(
    ("task", "priority", "topic", "key", "task_type"),
    [
        ({"id": "t1", "doc_id": "d1"}, 0, "ragflow.task.parse", "d1", "parse"),
        ({"id": "t1", "doc_id": "d1"}, 1, "ragflow.task.parse.priority", "d1", "parse"),
        (
            {"id": "t2", "doc_id": "graph_raptor_x", "task_type": "raptor", "doc_ids": ["a"]},
            0,
            "ragflow.task.graphrag",
            "t2",
            "raptor",
        ),
        ({"id": "t3", "doc_id": "d9", "task_type": "raptor"}, 0, "ragflow.task.graphrag", "d9", "raptor"),
        ({"id": "t4", "doc_id": "graph_raptor_x", "task_type": "structure_mindmap"}, 0, "ragflow.task.graphrag", "t4", "structure_mindmap"),
        ({"id": "t5", "doc_id": "graph_raptor_x", "task_type": "session_essence"}, 1, "ragflow.task.graphrag", "t5", "session_essence"),
        ({"id": "t6", "doc_id": "d2", "task_type": "dataflow_rerun"}, 0, "ragflow.task.dataflow", "d2", "dataflow_rerun"),
        ({"id": "t7", "task_type": "memory", "memory_id": "m1"}, 0, "ragflow.task.memory", "m1", "memory"),
        ({"id": "t8", "doc_id": "graph_raptor_x"}, 0, "ragflow.task.graphrag", "t8", "parse"),
    ],
)  # fmt: skip
def test_routes(
    task: dict[str, object], priority: int, topic: str, key: str, task_type: str
) -> None:
    route = TABLE.route(task, priority)
    assert (route.topic, route.key, route.task_type) == (topic, key, task_type)
    assert route.known_type


def test_unknown_type_goes_to_parse_and_is_flagged() -> None:
    route = TABLE.route({"id": "t", "doc_id": "d", "task_type": "brand_new"}, 1)
    assert route.topic == "ragflow.task.parse" and not route.known_type and route.key == "d"


def test_overrides_are_data() -> None:
    table = RouteTable([("wiki", "custom.wiki"), ("brand_*", "custom.brand")])
    assert table.route({"id": "t", "task_type": "wiki"}, 0).topic == "custom.wiki"
    assert table.route({"id": "t", "task_type": "brand_x"}, 0).topic == "custom.brand"
    assert "custom.wiki" in table.topics


@pytest.mark.parametrize("percent", [1.0, 12.5, 30.0, 50.0, 77.7, 99.0])
def test_share_is_within_two_points_over_20000_tasks(percent: float) -> None:
    keys = [uuid.uuid1().hex for _ in range(20_000)]
    share = sum(in_traffic_share(k, percent) for k in keys) / len(keys) * 100
    assert abs(share - percent) <= 2.0


def test_share_is_monotone_and_sticky() -> None:
    keys = [uuid.uuid4().hex for _ in range(20_000)]
    at_30 = {k for k in keys if in_traffic_share(k, 30)}
    at_60 = {k for k in keys if in_traffic_share(k, 60)}
    assert at_30 <= at_60 and len(at_60) > len(at_30)
    assert {k for k in keys if in_traffic_share(k, 30)} == at_30  # same answer every time
    assert not any(in_traffic_share(k, 0) for k in keys)
    assert all(in_traffic_share(k, 100) for k in keys)
    assert traffic_bucket("doc-1") == traffic_bucket("doc-1")


def test_the_task_types_exported_at_0_are_ones_the_route_table_knows() -> None:
    """The mismatch counter's labels from start-up (docs/metrics.md): real task types, each
    routed by name, and labelled as the judge labels them."""
    assert len(set(KNOWN_TASK_TYPES)) == len(KNOWN_TASK_TYPES)
    assert {"parse", "dataflow", "raptor", "graphrag", "memory"} <= set(KNOWN_TASK_TYPES)
    for task_type in KNOWN_TASK_TYPES:
        route = RouteTable().route({"id": "t", "doc_id": "d", "task_type": task_type}, 0)
        assert route.known_type and route.task_type == task_type, route
