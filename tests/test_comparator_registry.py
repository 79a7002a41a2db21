"""The comparator registry is the one list: every comparator has a row, every row builds what it
names and reports only the kinds it lists, and the lists written out in the docs agree."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import comparators
from comparators import Comparator, CompareRules
from comparators.registry import (
    COMPARATORS,
    COMPARATORS_BY_NAME,
    FINDING_NAMES,
    MISMATCH_NAMES,
    CompareContext,
    build_comparators,
)
from sidecar.app.metrics_catalog import MISMATCH_LABELS
from sidecar.verdicts.compare import Comparators
from sidecar.verdicts.model import VerdictRecord
from tests.test_comparators import REGISTRY_EXAMPLES

ROOT = Path(__file__).resolve().parent.parent
CONTEXT = CompareContext(CompareRules(), 10.0, lambda task_type, priority: f"topic.{task_type}")


def test_every_row_builds_the_comparator_it_names() -> None:
    for row in COMPARATORS:
        built = row.factory(CONTEXT)
        assert isinstance(built, Comparator)
        assert built.name == row.name


def test_every_comparator_class_of_the_package_has_a_row() -> None:
    # A comparator written without its row would never run, nor be counted or documented.
    modules = [
        importlib.import_module(f"comparators.{info.name}")
        for info in pkgutil.iter_modules(comparators.__path__)
    ]
    classes = {
        value.name
        for module in modules
        for _, value in inspect.getmembers(module, inspect.isclass)
        if value.__module__.startswith("comparators.")
        and isinstance(getattr(value, "name", None), str)
        and callable(getattr(value, "compare", None))
    }
    assert classes == set(COMPARATORS_BY_NAME)


@pytest.mark.parametrize("row", COMPARATORS, ids=lambda row: row.name)
def test_a_comparator_reports_only_the_kinds_its_row_lists(row: Any) -> None:
    built = row.factory(CONTEXT)
    pairs = REGISTRY_EXAMPLES[row.name]  # a row's example pairs stand beside its other tests
    found = {d.kind for left, right in pairs for d in built.compare(left, right)}
    assert found, "the example finds no difference: it tests nothing"
    assert found <= set(row.kinds)


def test_the_live_set_is_every_row_but_those_judged_elsewhere() -> None:
    assert set(build_comparators(CONTEXT)) == {row.name for row in COMPARATORS if row.live}
    assert set(build_comparators(CONTEXT, live_only=False)) == set(COMPARATORS_BY_NAME)
    assert not COMPARATORS_BY_NAME[
        "ordering"
    ].live  # the shadow's OrderTracker judges it (registry's doc)


def test_the_judge_counts_every_row_and_reports_the_kinds_they_list() -> None:
    record = VerdictRecord("mismatch", "te.0.common", "2-0", "t1", "parse", 0, "s")
    record.timings = {
        "redis": {"deliveries": 2, "queue_wait_ms": 0},
        "kafka": {"queue_wait_ms": 99},
    }
    redis_run = {"value_sha": "a", "outcome": {"a": 1}, "topic": "t", "priority": 1}
    kafka_run = {
        "value_sha": "b",
        "outcome": {"a": 2},
        "topic": "u",
        "priority": 1,
        "order_violation": {"after": "3-0"},
    }
    fields = {"redis_run_value": b'{"a": 1}', "kafka_run_value": b'{"a": 2}'}
    found = Comparators(CompareRules(), 10.0).differences(redis_run, kafka_run, fields, record)
    assert set(record.comparators) == set(COMPARATORS_BY_NAME)
    wired = {row.name for row in COMPARATORS if row.sides is None}
    assert {name for name, n in record.comparators.items() if n} >= wired
    assert {d.kind for d in found} <= {
        k for n in MISMATCH_NAMES for k in COMPARATORS_BY_NAME[n].kinds
    }
    assert {f["kind"] for f in record.findings} <= {
        k for n in FINDING_NAMES for k in COMPARATORS_BY_NAME[n].kinds
    }


def test_the_mismatch_metric_is_exported_for_every_mismatch_row() -> None:
    assert {comparator for comparator, _ in MISMATCH_LABELS} == set(MISMATCH_NAMES)


def test_the_docs_point_to_the_registry_instead_of_listing_it() -> None:
    # A list written out in the docs would have to change with every new comparator.
    places = {
        "docs/metrics.md": "| `comparator` (each row of `comparators/registry.py`",
        "dashboards/README.md": "mismatch row of `comparators/registry.py`",
        "README.md": "one row each in `comparators/registry.py`",
    }
    for path, pointer in places.items():
        text = (ROOT / path).read_text()
        assert pointer in text, path
        assert "payload, outcome, routing" not in text.replace("`", ""), path


def test_the_registry_prints_its_table() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "comparators"], capture_output=True, text=True,
        timeout=60, check=True, cwd=ROOT,
    )  # fmt: skip
    rows = [line for line in run.stdout.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == [row.name for row in COMPARATORS]
