"""The Grafana dashboards: generated JSON up to date, metric names from docs/metrics.md only,
and the panels each dashboard is meant to have. ``test_prometheus.py`` runs every query."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
DASHBOARDS = ROOT / "dashboards"
GENERATOR = DASHBOARDS / "generate.py"
METRICS_DOC = ROOT / "docs" / "metrics.md"
OVERVIEW = "shadow-migration-overview.json"
DRILL_DOWN = "diff-drill-down.json"
DASHBOARD_FILES = (OVERVIEW, DRILL_DOWN)

# The panels each dashboard must keep (by title).
REQUIRED_PANELS = {
    OVERVIEW: {
        "Traffic on Kafka",
        "Match rate",
        "Mismatches",
        "Missing in Kafka",
        "Dead-lettered",
        "Components up",
        "Verdicts by kind",
        "Mismatches by task type",
        "Mismatches by field",
        "Missing in Kafka / missing in Redis",
        "Queue wait p50 / p99",
        "Processing p50 / p99",
        "Mirror latency p50 / p99",
        "Redis lag",
        "Kafka consumer lag",
        "DLQ rate by reason",
        "Mirror throughput per stream and topic",
        "Shadow throughput per topic",
        "Carried over Kafka vs configured",
        "Retries and duplicates",
        "State store memory",
        "State store evictions",
        "Served vs judged share",
        "Failure rate per path",
        "Processing p99 per path",
        "Served tasks per path",
        "Rollout phase",
        "Rollout step",
        "Autopilot's share",
        "Dwell left",
        "Documents still needed",
        "Last decision",
        "Autopilot's share vs served",
        "Documents in this step",
        "Decisions by action",
    },
    DRILL_DOWN: {
        "Mismatches",
        "Match rate",
        "Differences excluded as noise",
        "Top mismatching fields",
        "Top mismatching task types",
        "Mismatches by comparator",
        "Mismatches by comparator and task type",
        "Mismatches by comparator over time",
        "Mismatched fields",
        "Mismatch traces",
        "Reading a mismatch",
    },
}

# PromQL words that look like names but are not metrics.
_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
}
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


@dataclass(frozen=True)
class Target:
    dashboard: str
    panel: str
    panel_type: str
    ref: str
    expr: str


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DASHBOARDS / name).read_text(encoding="utf-8"))
    return data


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows included."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def annotations(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    listed: list[dict[str, Any]] = dashboard.get("annotations", {}).get("list", [])
    return listed


def prometheus_targets() -> list[Target]:
    """Every Prometheus query of every panel of both dashboards, and of their annotations
    (panel: the annotation's name, type ``annotation``)."""
    found = []
    for name in DASHBOARD_FILES:
        for panel in panels(load(name)):
            for target in panel.get("targets", []):
                source = target.get("datasource") or panel.get("datasource") or {}
                if source.get("type") == "prometheus":
                    found.append(
                        Target(name, panel["title"], panel["type"], target["refId"], target["expr"])
                    )
        for annotation in annotations(load(name)):
            if annotation["datasource"]["type"] == "prometheus":
                found.append(
                    Target(name, annotation["name"], "annotation", "-", annotation["expr"])
                )
    return found


def variable_queries() -> list[tuple[str, str]]:
    """(dashboard, query) of each Prometheus template variable."""
    return [
        (name, variable["query"])
        for name in DASHBOARD_FILES
        for variable in load(name).get("templating", {}).get("list", [])
        if variable.get("datasource", {}).get("type") == "prometheus"
    ]


def label_values(query: str) -> tuple[str, str]:
    """(metric, label) of a Grafana ``label_values(metric, label)`` variable query."""
    match = re.fullmatch(r"label_values\(\s*(\w+)\s*,\s*(\w+)\s*\)", query)
    assert match is not None, f"not label_values(metric, label): {query}"
    return match.group(1), match.group(2)


def documented_metrics() -> set[str]:
    """Metric names as Prometheus scrapes them, from the table in docs/metrics.md; a
    histogram also brings its ``_bucket``, ``_sum`` and ``_count`` series."""
    names = set()
    for line in METRICS_DOC.read_text(encoding="utf-8").splitlines():
        row = re.match(r"^\|\s*`(ragflow_sidecar_\w+)`\s*\|\s*(\w+)\s*\|", line)
        if row is None:
            continue
        name, kind = row.groups()
        names.add(name)
        if kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return names


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (not functions, labels or keywords)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values and other strings
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range and subquery windows
    text = _GROUPING.sub(" ", text)  # label lists of by (...), on (...), ...
    names = set()
    for match in _NAME.finditer(text):
        word = match.group()
        start, end = match.span()
        if start > 0 and text[start - 1] in "$.0123456789":
            continue  # a Grafana variable, or part of a number such as 1e3
        if text[end:].lstrip().startswith("("):
            continue  # a function
        if word.lower() in _KEYWORDS:
            continue
        names.add(word)
    return names


def test_generated_json_is_up_to_date() -> None:
    run = subprocess.run(
        [sys.executable, str(GENERATOR), "--check"], capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}"


def test_check_mode_fails_on_a_stale_file(tmp_path: Path) -> None:
    written = subprocess.run(
        [sys.executable, str(GENERATOR), "--out", str(tmp_path)], capture_output=True, check=False
    )
    assert written.returncode == 0, written.stderr
    stale = tmp_path / OVERVIEW
    stale.write_text(stale.read_text().replace("ragflow_sidecar_up", "ragflow_sidecar_upp"))
    run = subprocess.run(
        [sys.executable, str(GENERATOR), "--check", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 1 and OVERVIEW in run.stderr, run.stderr


def test_the_docs_table_parses() -> None:
    names = documented_metrics()
    assert "ragflow_sidecar_verdicts_total" in names
    assert "ragflow_sidecar_queue_wait_milliseconds_bucket" in names
    assert len(names) >= 20


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (verdict) (rate(ragflow_sidecar_verdicts_total{verdict=~"a|b"}[$__rate_interval]))', {"ragflow_sidecar_verdicts_total"}),
        ("histogram_quantile(0.99, sum by (le, path) (rate(x_bucket[5m])))", {"x_bucket"}),
        ("100 * (sum(increase(a_total[$__range])) or vector(0)) / sum(b_total)", {"a_total", "b_total"}),
        ("topk(10, sum without (instance) (c)) > bool 1e3", {"c"}),
        ("max(ragflow_sidecar_upp)", {"ragflow_sidecar_upp"}),
    ],
)  # fmt: skip
def test_metric_names_of_an_expression(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_queries_name_only_documented_metrics() -> None:
    documented = documented_metrics()
    targets = prometheus_targets()
    assert len(targets) >= 30
    for target in targets:
        names = metric_names(target.expr)
        assert names, target
        unknown = names - documented
        assert not unknown, f"{target.dashboard} / {target.panel}: {sorted(unknown)} not in docs"
    for dashboard, query in variable_queries():
        metric, label = label_values(query)
        assert metric in documented, (dashboard, query)
        assert label in METRICS_DOC.read_text(encoding="utf-8"), (dashboard, query)


def test_a_typo_in_a_metric_name_is_caught() -> None:
    documented = documented_metrics()
    assert metric_names("sum(rate(ragflow_sidecar_verdict_total[1m]))") - documented


def test_each_dashboard_has_its_panels() -> None:
    for name, required in REQUIRED_PANELS.items():
        titles = {panel.get("title") for panel in panels(load(name)) if panel["type"] != "row"}
        assert not required - titles, f"{name} lacks {sorted(required - titles)}"


def test_ids_and_grid_positions() -> None:
    for name in DASHBOARD_FILES:
        ids = [panel["id"] for panel in panels(load(name))]
        assert len(ids) == len(set(ids)), name
        for panel in panels(load(name)):
            grid = panel["gridPos"]
            assert grid["x"] + grid["w"] <= 24, (name, panel["title"])


def test_data_sources_by_uid() -> None:
    uids = set()
    for name in DASHBOARD_FILES:
        for panel in panels(load(name)):
            for item in (panel, *panel.get("targets", [])):
                if "datasource" in item:
                    uids.add((item["datasource"]["type"], item["datasource"]["uid"]))
    # Jaeger's is the operator's: the drill-down's data source variable names it.
    assert uids == {("prometheus", "prometheus"), ("tempo", "tempo"), ("jaeger", "${jaeger}")}


def test_match_rate_has_a_threshold_line() -> None:
    overview = load(OVERVIEW)
    [series] = [
        p for p in panels(overview) if p["title"] == "Match rate" and p["type"] == "timeseries"
    ]
    defaults = series["fieldConfig"]["defaults"]
    assert defaults["custom"]["thresholdsStyle"]["mode"] in {"line", "dashed"}
    assert 99.9 in [step["value"] for step in defaults["thresholds"]["steps"]]


def test_mismatches_link_to_their_traces() -> None:
    drill_down = load(DRILL_DOWN)
    [traces] = [p for p in panels(drill_down) if p["title"] == "Mismatch traces"]
    [target] = traces["targets"]
    assert target["datasource"] == {"type": "tempo", "uid": "tempo"}
    assert target["queryType"] == "traceql"
    assert target["query"] == '{ span.verdict = "mismatch" }'
    links = [
        link
        for override in traces["fieldConfig"]["overrides"]
        if override["matcher"] == {"id": "byName", "options": "traceID"}
        for prop in override["properties"]
        if prop["id"] == "links"
        for link in prop["value"]
    ]
    assert links and "${__value.raw}" in links[0]["url"] and "/explore?" in links[0]["url"]
    titles = {link["title"] for link in drill_down["links"]}
    assert {"Mismatch traces in Explore", "Shadow migration overview"} <= titles
    overview = load(OVERVIEW)
    assert any("ragflow-sidecar-diff-drill-down" in link["url"] for link in overview["links"])
    by_type = [p for p in panels(overview) if p["title"] == "Mismatches by task type"]
    data_links = by_type[0]["fieldConfig"]["defaults"]["links"]
    assert "var-task_type=" in data_links[0]["url"]


def test_mismatches_link_to_their_traces_in_jaeger() -> None:
    """A Jaeger search for the mismatches' compare spans, on the data source the ``jaeger``
    variable names, whose trace ids open the trace from that same data source."""
    drill_down = load(DRILL_DOWN)
    [variable] = [v for v in drill_down["templating"]["list"] if v["name"] == "jaeger"]
    assert variable["type"] == "datasource" and variable["query"] == "jaeger"
    [traces] = [p for p in panels(drill_down) if p["title"] == "Mismatch traces in Jaeger"]
    [target] = traces["targets"]
    assert target["datasource"] == traces["datasource"] == {"type": "jaeger", "uid": "${jaeger}"}
    assert target["queryType"] == "search" and target["service"] == "ragflow-kafka-sidecar"
    assert target["tags"] == 'verdict="mismatch"'
    [link] = [
        link
        for override in traces["fieldConfig"]["overrides"]
        if override["matcher"] == {"id": "byName", "options": "traceID"}
        for prop in override["properties"]
        if prop["id"] == "links"
        for link in prop["value"]
    ]
    panes = json.loads(urllib.parse.unquote(link["url"].split("panes=", 1)[1]))
    [query] = panes["trace"]["queries"]
    assert panes["trace"]["datasource"] == "${jaeger}"
    assert query["datasource"] == {"type": "jaeger", "uid": "${jaeger}"}
    assert query["query"] == "${__value.raw}" and "queryType" not in query


def test_the_autopilots_decisions_are_annotations_on_the_overview() -> None:
    """Each decision but a hold marks the overview's graphs, titled with its action; roll-backs
    apart, in red. Prometheus's own fields are where Grafana's Prometheus data source reads
    them (``test_prometheus.py`` runs the queries)."""
    listed = {a["name"]: a for a in annotations(load(OVERVIEW))}
    assert set(listed) == {"Autopilot roll-backs", "Autopilot decisions"}
    for annotation in listed.values():
        assert annotation["datasource"] == {"type": "prometheus", "uid": "prometheus"}
        assert annotation["enable"] is True
        assert "changes(ragflow_sidecar_rollout_decisions_total{" in annotation["expr"]
        assert annotation["expr"].endswith("> 0")
        assert annotation["titleFormat"] == "rollout {{action}}"
        assert annotation["tagKeys"] == "action"
        assert annotation["step"] == "60s" and annotation["useValueForTime"] is False
    assert 'action="rollback"' in listed["Autopilot roll-backs"]["expr"]
    assert listed["Autopilot roll-backs"]["iconColor"] == "red"
    assert 'action!~"hold|rollback"' in listed["Autopilot decisions"]["expr"]
    assert not annotations(load(DRILL_DOWN))
