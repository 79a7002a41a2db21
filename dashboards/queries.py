"""What the dashboards' panels ask: the data sources, PromQL and TraceQL helpers, Explore URLs.

Data sources are referenced by uid: ``prometheus`` and ``tempo``, the uids the compose
provisioning gives them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import NamedTuple
from urllib.parse import quote

from grafana_foundation_sdk.builders import prometheus
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.variants import Dataquery
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

PROMETHEUS = model.DataSourceRef(type_val="prometheus", uid="prometheus")
TEMPO = model.DataSourceRef(type_val="tempo", uid="tempo")
# Jaeger is the operator's own (Grafana's jaeger plugin, whatever its uid): the drill-down's
# ``jaeger`` data source variable names it, so no uid is assumed.
JAEGER_VARIABLE = "jaeger"
JAEGER = model.DataSourceRef(type_val="jaeger", uid="${" + JAEGER_VARIABLE + "}")
SIDECAR_SERVICE = "ragflow-kafka-sidecar"
# The compare spans of mismatches, as Jaeger's search takes tags (logfmt).
MISMATCH_TAGS = 'verdict="mismatch"'

OVERVIEW_UID = "ragflow-sidecar-overview"
DRILL_DOWN_UID = "ragflow-sidecar-diff-drill-down"

# The match rate a migration step must hold before the share goes up (a line on the panels).
MATCH_RATE_TARGET = 99.9
MISMATCH_TRACES = '{ span.verdict = "mismatch" }'

RATE = "$__rate_interval"
RANGE = "$__range"
# Final verdicts only: a duplicate verdict comes in addition to its entry's final verdict, and
# `missing_primary` is the old name of `missing_in_redis`, exported beside it for one release.
FINAL = 'verdict!~"duplicate|missing_primary"'
# Every verdict kind once (without the old name exported for one release).
VERDICTS = "ragflow_sidecar_verdicts_total"
KINDS = VERDICTS + '{verdict!="missing_primary"}'


class Query(NamedTuple):
    """A PromQL expression and the legend of its series."""

    expr: str
    legend: str


def rate(metric: str, window: str = RATE) -> str:
    return f"rate({metric}[{window}])"


def increase(metric: str, window: str = RANGE) -> str:
    return f"increase({metric}[{window}])"


def quantile(q: float, histogram: str, by: str = "") -> str:
    """``histogram_quantile`` over a histogram's ``_bucket`` series, per ``by`` labels."""
    labels = ", ".join(["le", *([by] if by else [])])
    return f"histogram_quantile({q}, sum by ({labels}) ({rate(histogram + '_bucket')}))"


def p50_p99(histogram: str, by: str = "") -> tuple[Query, Query]:
    """The p50 and p99 queries of a histogram, per ``by`` label."""
    suffix = f" {{{{{by}}}}}" if by else ""
    return (
        Query(quantile(0.5, histogram, by), f"p50{suffix}"),
        Query(quantile(0.99, histogram, by), f"p99{suffix}"),
    )


def match_rate(window: Callable[[str], str]) -> str:
    """Per cent of final verdicts that are ``match``; 0 (not no data) when there is none."""
    matches = window(VERDICTS + '{verdict="match"}')
    finals = window(VERDICTS + "{" + FINAL + "}")
    return f"100 * (sum({matches}) or vector(0)) / sum({finals})"


def or_zero(expr: str) -> str:
    """The sum of ``expr``, 0 (not no data) when it has no series."""
    return f"sum({expr}) or vector(0)"


def or_none(expr: str, label: str) -> str:
    """``expr`` (grouped by ``label``), or one series at 0 with ``label`` "none" when it has no
    series: a panel over an open set of labels (fields) reads 0, not "No data", before the
    first one. ``or on()`` matches any series, so the 0 is added only when ``expr`` is empty."""
    return f'{expr} or on() label_replace(vector(0), "{label}", "none", "", "")'


def target(
    query: Query, ref: str = "A", *, instant: bool = False, table: bool = False
) -> prometheus.Dataquery:
    """A Prometheus target; ``instant`` for a value over the range, ``table`` for a table."""
    built = (
        prometheus.Dataquery()
        .datasource(PROMETHEUS)
        .ref_id(ref)
        .expr(query.expr)
        .legend_format(query.legend)
    )
    if table:
        return built.instant().format(PromQueryFormat.TABLE)
    return built.instant() if instant else built.range()


def refs(queries: tuple[Query, ...], *, instant: bool = False) -> list[Builder[Dataquery]]:
    """The targets of a panel's queries, lettered A, B, C... in order."""
    return [
        target(query, chr(ord("A") + index), instant=instant) for index, query in enumerate(queries)
    ]


def explore_url(
    datasource: model.DataSourceRef, trace_query: str, start: str, end: str, *, traceql: bool = True
) -> str:
    """A Grafana Explore URL running ``trace_query`` (TraceQL, or for Jaeger a trace id);
    Grafana's ``${...}`` variables in it are left unescaped, so a data link interpolates them."""
    query: dict[str, object] = {
        "refId": "A",
        "datasource": {"type": datasource.type_val, "uid": datasource.uid},
        "query": trace_query,
    }
    if traceql:
        query["queryType"] = "traceql"
    pane = {
        "datasource": datasource.uid,
        "queries": [query],
        "range": {"from": start, "to": end},
    }
    panes = quote(json.dumps({"trace": pane}, separators=(",", ":")), safe="")
    variables = ("${__value.raw}", "${__from}", "${__to}", "${" + JAEGER_VARIABLE + "}")
    for variable in variables:
        panes = panes.replace(quote(variable, safe=""), variable)
    return f"/explore?schemaVersion=1&orgId=1&panes={panes}"
