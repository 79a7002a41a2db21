"""The table of RAGFlow's task kinds, and everything that reads it or lists it.

Each row of ``TASK_KINDS`` has its sample message in ``SAMPLES`` (its test row): a new row
without one fails here, and with one it is routed and dry-run below, so it shows up in both.
The docs that name task topics are checked against the table, and the README's table is
written from it (``python -m tools.task_kinds_docs``).
"""

from __future__ import annotations

import re
from typing import Any, get_args

import pytest

from sidecar.config.routing import DEFAULT_ROUTES, KNOWN_TASK_TYPES, RouteTable
from sidecar.config.task_kinds import (
    CANVAS_DEBUG_DOC_ID,
    DATASET_WIDE_TYPES,
    FAKE_DOC_ID,
    KIND_OF_TOPIC,
    TASK_KINDS,
    DryRunCheck,
    Kind,
    TaskKind,
    TaskKindRow,
    checked_rows,
)
from sidecar.shadow.dry_run import CHECKS, ragflow_dry_run
from sidecar.shadow.meta import TaskMeta
from sidecar.transport.topics import (
    DLQ_TOPIC,
    PARSE_PRIORITY_TOPIC,
    TASK_TOPICS,
    TOPIC_PLAN,
)
from tools.task_kinds_docs import GENERATED, ROOT, rendered

META = TaskMeta("redis", "te.0.common", "1-0", None, None, None, 1, cancelled=False)
_DATASET = {"id": "t-ds", "doc_id": FAKE_DOC_ID, "doc_ids": ["d1", "d2"]}
_DATAFLOW = {"id": "t-df", "doc_id": "d3", "kb_id": "kb1", "tenant_id": "tn", "dataflow_id": "f1"}

# One well-formed message per row, as RAGFlow queues it (a prefix row's names one RAGFlow could
# write under it, which no exact row lists).
SAMPLES: dict[str, dict[str, Any]] = {
    "parse": {"id": "t-p", "doc_id": "d1", "from_page": 0, "to_page": 12},
    "dataflow": {**_DATAFLOW, "task_type": "dataflow", "file": None},
    "dataflow_rerun": {**_DATAFLOW, "task_type": "dataflow_rerun", "file": None},
    "dataflow*": {**_DATAFLOW, "task_type": "dataflow_preview"},
    "graphrag": {**_DATASET, "task_type": "graphrag"},
    "raptor": {"id": "t-r", "doc_id": "d5", "task_type": "raptor", "doc_ids": ["d5"]},
    "mindmap": {**_DATASET, "task_type": "mindmap"},
    "wiki": {**_DATASET, "task_type": "wiki"},
    "skill": {**_DATASET, "task_type": "skill"},
    "structure_graph": {**_DATASET, "task_type": "structure_graph"},
    "structure_mindmap": {**_DATASET, "task_type": "structure_mindmap"},
    "structure": {**_DATASET, "task_type": "structure"},
    "timeline": {**_DATASET, "task_type": "timeline"},
    "session_graph": {**_DATASET, "task_type": "session_graph"},
    "session_essence": {**_DATASET, "task_type": "session_essence"},
    "memory": {
        "id": "t-m",
        "task_id": "t-m",
        "task_type": "memory",
        "memory_id": "m1",
        "tenant_id": "tn",
        "source_id": 7,
        "message_dict": {"agent_id": "a", "session_id": "s", "user_input": "hi"},
    },
}
# A field in the dry run's outcome that only its check reports.
CHECK_FIELD: dict[DryRunCheck, str] = {
    "pages": "from_page",
    "doc_ids": "doc_ids_count",
    "dataflow": "dataflow_id",
    "memory": "message_keys",
}
ROWS = {row.pattern: row for row in TASK_KINDS}


def test_every_row_has_its_sample_and_every_sample_its_row() -> None:
    assert list(SAMPLES) == list(ROWS)
    for pattern, sample in SAMPLES.items():
        named = sample.get("task_type", "parse")
        if ROWS[pattern].is_prefix:
            assert named.startswith(pattern[:-1]) and named not in ROWS, pattern
        else:
            assert named == pattern


@pytest.mark.parametrize("row", TASK_KINDS, ids=lambda row: row.pattern)
@pytest.mark.parametrize("priority", [0, 1])
def test_a_row_is_routed_as_it_says(row: TaskKindRow, priority: int) -> None:
    sample = SAMPLES[row.pattern]
    route = RouteTable().route(sample, priority)
    topic = PARSE_PRIORITY_TOPIC if row.kind == "parse" and priority else row.topic
    key = sample[row.key] if sample.get(row.key) not in (None, FAKE_DOC_ID) else sample["id"]
    assert (route.topic, route.kind, route.key, route.known_type) == (topic, row.kind, key, True)
    assert (row.pattern in KNOWN_TASK_TYPES) == (not row.is_prefix)
    assert DEFAULT_ROUTES[row.pattern] == row.topic


@pytest.mark.parametrize("row", TASK_KINDS, ids=lambda row: row.pattern)
def test_a_row_is_dry_run_as_it_says(row: TaskKindRow) -> None:
    outcome = ragflow_dry_run(SAMPLES[row.pattern], META)
    assert (outcome["kind"], outcome["decision"], outcome["problems"]) == (row.kind, "process", [])
    assert CHECK_FIELD[row.check] in outcome
    assert all(CHECK_FIELD[other] not in outcome for other in CHECK_FIELD if other != row.check)


@pytest.mark.parametrize("row", [row for row in TASK_KINDS if row.dataset_wide])
def test_a_dataset_wide_row_without_doc_ids_is_what_collect_acks_as_unknown(
    row: TaskKindRow,
) -> None:
    """collect() re-reads exactly these names through get_task(id, doc_ids)."""
    outcome = ragflow_dry_run({**_DATASET, "task_type": row.pattern, "doc_ids": []}, META)
    assert (outcome["collect"], outcome["problems"]) == (
        "acks_unknown",
        ["fake_doc_id_without_doc_ids"],
    )
    assert row.pattern in DATASET_WIDE_TYPES


@pytest.mark.parametrize("task_type", ["structure_new", "session_", "parse", "evaluation"])
def test_a_name_no_row_lists_is_unknown_to_both(task_type: str) -> None:
    task = {**_DATASET, "task_type": task_type}
    route = RouteTable().route(task, 0)
    outcome = ragflow_dry_run(task, META)
    if task_type != "parse":  # the routing's own name for a task without task_type
        assert not route.known_type and route.topic == ROWS["parse"].topic
    assert (outcome["kind"], outcome["problems"]) == ("unknown", ["task_type:unknown"])


def test_the_kinds_are_one_vocabulary() -> None:
    assert set(get_args(Kind)) == {row.kind for row in TASK_KINDS}
    assert set(get_args(TaskKind)) == {*get_args(Kind), "unknown"}
    assert set(CHECKS) == set(get_args(DryRunCheck)) == {row.check for row in TASK_KINDS}
    assert RouteTable([("parse", "custom.parse")]).route({"id": "t"}, 0).kind == "unknown"


def test_the_task_topics_of_transport_are_the_tables() -> None:
    assert (
        set(TASK_TOPICS) == set(KIND_OF_TOPIC) == {*DEFAULT_ROUTES.values(), PARSE_PRIORITY_TOPIC}
    )
    assert TASK_TOPICS[0] == PARSE_PRIORITY_TOPIC  # served first
    assert set(TASK_TOPICS) <= set(TOPIC_PLAN)
    assert RouteTable().topics == set(TASK_TOPICS)


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda rows: (*rows, rows[1]), "listed twice"),
        (lambda rows: (*rows, TaskKindRow("x", rows[0].topic, "memory", False, "doc_id", "memory")), "two kinds"),
        (lambda rows: (*rows, TaskKindRow("y", "t.y", "memory", False, "doc_id", "memory")), "two keys"),
        (lambda rows: (*rows, TaskKindRow("z*", "t.z", "dataset", True, "doc_id", "doc_ids")), "dataset-wide"),
        (lambda rows: (*rows, TaskKindRow("a*b", "t.a", "parse", False, "doc_id", "pages")), "neither"),
        (lambda rows: tuple(r for r in rows if r.kind != "memory"), "every Kind"),
    ],
)  # fmt: skip
def test_a_table_that_contradicts_itself_is_refused(change: Any, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        checked_rows(change(TASK_KINDS))


def test_an_override_wins_over_the_built_in_names_it_covers() -> None:
    table = RouteTable([("structure*", "custom.structure"), ("dataflow*", "custom.flow")])
    assert table.route(SAMPLES["structure_graph"], 0).topic == "custom.structure"
    assert table.route(SAMPLES["dataflow"], 0).topic == "custom.flow"
    assert table.route(SAMPLES["session_graph"], 0).topic == ROWS["session_graph"].topic
    assert table.route({"id": "t", "doc_id": CANVAS_DEBUG_DOC_ID}, 0).key == "t"


# --- the docs -----------------------------------------------------------------------------

_TOPIC = re.compile(r"ragflow\.task\.[a-z_]+(?:\.[a-z_]+)*")
_NUMBERS = {"four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8}
_DOC_FILES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "compose" / ".env.example",
    *sorted(p for p in (ROOT / "compose").rglob("*") if p.suffix in (".yaml", ".yml", ".json")),
    *sorted((ROOT / "dashboards").glob("*.json")),
]


def _topics(text: str) -> set[str]:
    return set(_TOPIC.findall(text))


def test_the_readme_table_is_written_from_the_table() -> None:
    for path in GENERATED:
        text = path.read_text()
        assert rendered(text, path.name) == text, "run: python -m tools.task_kinds_docs"


def test_no_doc_names_a_task_topic_the_table_lacks() -> None:
    known = {*TASK_TOPICS, DLQ_TOPIC}
    for path in _DOC_FILES:
        assert _topics(path.read_text()) <= known, path


def test_the_docs_lists_of_task_topics_are_complete() -> None:
    """Each list that spells the task topics out names every one and no other."""
    security = (ROOT / "docs" / "security.md").read_text()
    (acl_row,) = [
        line for line in security.splitlines() if line.startswith("| topics `ragflow.task.")
    ]
    shadow_read = re.search(r"User:ragflow-shadow \\\n  --operation Read (?:.*\\\n)*.*\n", security)
    assert shadow_read is not None
    (count,) = re.findall(r"the (\w+) task topics", security)
    operations = (ROOT / "docs" / "operations.md").read_text()
    loop = re.search(r"for t in ((?:.*\\\n)*.*); do", operations)
    assert loop is not None
    plan = re.search(r"with the seed's plan that is (.*?), so about", operations, re.DOTALL)
    assert plan is not None
    short = {t.removeprefix("ragflow.task.") for t in TASK_TOPICS}
    assert _topics(acl_row) == set(TASK_TOPICS)
    assert _topics(shadow_read.group(0)) == set(TASK_TOPICS)
    assert _NUMBERS[count] == len(TASK_TOPICS)
    assert _topics(loop.group(1)) == {*TASK_TOPICS, DLQ_TOPIC}
    assert {
        n.removeprefix("ragflow.task.") for n in re.findall(r"`([\w.]+)`", plan.group(1))
    } == short


def test_the_example_routes_name_the_tables_task_types() -> None:
    env = (ROOT / "compose" / ".env.example").read_text()
    (example,) = re.findall(r"e\.g\. (\{.*?\}).*\nMIRROR_ROUTES=", env)
    assert set(re.findall(r'"([^"]+)": "ragflow\.task\.', example)) <= set(ROWS)
