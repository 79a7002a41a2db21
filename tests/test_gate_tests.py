"""The table of gate tests is the one list: the gate runs its rows in order, each reads events
RAGFlow's processes record, each margin is a setting that reaches the margins, each panel is
on the overview, and the docs' table is the table's."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import numpy as np
import pytest

from dashboards.panels import Row
from dashboards.served_share import SERVED_SHARE
from sidecar.config import Settings
from sidecar.config.serve import GateSettings
from sidecar.serve.baseline import run_baseline_tests
from sidecar.serve.gate_checks import Judged, analyse
from sidecar.serve.gate_stats import run_tests
from sidecar.serve.gate_tests import (
    GATE_TESTS,
    MARGIN_NAMES,
    MARGIN_TESTS,
    TEST_NAMES,
    TESTS,
    GateTest,
    margin_of,
    markdown_table,
)
from sidecar.serve.margins import run_margins
from sidecar.wire.contract import DOCUMENT_EVENTS, EVENTS, Latency
from sidecar.wire.evidence import Evidence
from tests.test_gate_stats import minute_of

ROOT = Path(__file__).resolve().parent.parent


def _minutes(n: int = 60) -> list[Evidence]:
    rng = np.random.default_rng(7)
    both = {"kafka": n, "redis": n}
    return [minute_of(rng, both, {"kafka": 0.05, "redis": 0.05}, {"kafka": 2e4, "redis": 2e4})]


def test_the_gate_runs_every_row_in_order_against_redis_and_the_baseline() -> None:
    minutes = _minutes()
    assert [r.name for r in run_tests(minutes, 0.01, 1000.0)] == list(TESTS)
    baseline = Evidence.from_minutes(minutes)["redis"]
    assert [r.name for r in run_baseline_tests(baseline, minutes, 0.01, 1000.0)] == list(TESTS)
    margins = run_margins(minutes, GateSettings().margins, 1.0, 0.01, 1000.0)
    assert [r.name for r in margins] == list(MARGIN_TESTS)


def test_the_gate_table_names_each_row_by_its_label() -> None:
    gate = GateSettings()
    idle = analyse(gate, Judged(), Evidence.from_hashes([]), [], served_active=False)
    assert [c.name for c in idle][-len(TESTS) :] == [t.label for t in GATE_TESTS]
    minutes = _minutes()
    served = Evidence.from_minutes(minutes)
    names = [c.name for c in analyse(gate, Judged(), served, minutes, served_active=True)]
    assert [TEST_NAMES[t][0] for t in TESTS] == [n for n in names if n in _labels()]
    assert [MARGIN_NAMES[t] for t in MARGIN_TESTS] == [n for n in names if n.startswith("margin")]


def _labels() -> set[str]:
    return {t.label for t in GATE_TESTS}


@pytest.mark.parametrize("test", GATE_TESTS, ids=lambda t: t.name)
def test_a_row_reads_only_what_ragflow_records(test: GateTest) -> None:
    recorded = {*EVENTS, *DOCUMENT_EVENTS}
    if test.sampled is not None:
        assert test.counted is None and not test.exposures
        assert test.sampled in get_args(Latency)
    else:
        assert test.counted in recorded and test.exposures
        assert set(test.exposures) <= recorded and test.exposure_name


@pytest.mark.parametrize("name", MARGIN_TESTS)
def test_a_margin_row_names_the_setting_that_reaches_the_margins(name: str) -> None:
    margin = margin_of(name)
    assert GateSettings().margins[name] == getattr(GateSettings(), margin.field)
    gate = Settings.from_env({margin.variable: "7.5"}).gate
    assert gate.margins[name] == getattr(gate, margin.field) == 7.5
    assert set(GateSettings().margins) == set(MARGIN_TESTS)


def test_a_test_without_a_margin_says_so_by_name() -> None:
    with pytest.raises(KeyError, match="retried"):
        margin_of("retried")


def _titles(row: Row) -> set[str]:
    return {panel.title for panel in row.panels}


def test_every_panel_a_row_names_is_on_the_overview() -> None:
    named = {t.panel for t in GATE_TESTS if t.panel is not None}
    assert named and named <= _titles(SERVED_SHARE), named - _titles(SERVED_SHARE)


def test_the_docs_table_is_the_registry() -> None:
    assert markdown_table() in (ROOT / "docs" / "operations.md").read_text()
