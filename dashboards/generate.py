"""Grafana dashboards of the sidecar, as code (Grafana's grafana-foundation-sdk).

    python dashboards/generate.py          # writes the JSON files beside this script
    python dashboards/generate.py --check  # exits 1 if the committed JSON is not what this makes

Every Prometheus query names only metrics from ``docs/metrics.md`` (``tests/test_dashboards.py``
checks the names, ``tests/test_prometheus.py`` runs each query against a real Prometheus fed by
a real sidecar). Data sources are referenced by uid: ``prometheus`` and ``tempo``, the uids the
compose provisioning gives them.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

from grafana_foundation_sdk.builders import (
    bargauge,
    prometheus,
    stat,
    table,
    tempo,
    text,
    timeseries,
)
from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as builders
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.variants import Dataquery
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models.prometheus import PromQueryFormat
from grafana_foundation_sdk.models.tempo import SearchTableType
from grafana_foundation_sdk.models.text import TextMode

HERE = Path(__file__).resolve().parent

PROMETHEUS = model.DataSourceRef(type_val="prometheus", uid="prometheus")
TEMPO = model.DataSourceRef(type_val="tempo", uid="tempo")

OVERVIEW_UID = "ragflow-sidecar-overview"
DRILL_DOWN_UID = "ragflow-sidecar-diff-drill-down"
OVERVIEW_FILE = "shadow-migration-overview.json"
DRILL_DOWN_FILE = "diff-drill-down.json"
TAGS = ["ragflow-kafka-sidecar"]

# The match rate a migration step must hold before the share goes up (a line on the panels).
MATCH_RATE_TARGET = 99.9
MISMATCH_TRACES = '{ span.verdict = "mismatch" }'

RATE = "$__rate_interval"
RANGE = "$__range"
# Final verdicts only: a duplicate verdict comes in addition to its entry's final verdict.
FINAL = 'verdict!="duplicate"'
VERDICTS = "ragflow_sidecar_verdicts_total"


def rate(metric: str, window: str = RATE) -> str:
    return f"rate({metric}[{window}])"


def increase(metric: str, window: str = RANGE) -> str:
    return f"increase({metric}[{window}])"


def quantile(q: float, histogram: str, by: str = "") -> str:
    """``histogram_quantile`` over a histogram's ``_bucket`` series, per ``by`` labels."""
    labels = ", ".join(["le", *([by] if by else [])])
    return f"histogram_quantile({q}, sum by ({labels}) ({rate(histogram + '_bucket')}))"


def p50_p99(histogram: str, by: str = "") -> list[Builder[Dataquery]]:
    """The p50 (A) and p99 (B) targets of a histogram, per ``by`` label."""
    suffix = f" {{{{{by}}}}}" if by else ""
    return [
        query(quantile(0.5, histogram, by), f"p50{suffix}"),
        query(quantile(0.99, histogram, by), f"p99{suffix}", "B"),
    ]


def match_rate(window: Callable[[str], str]) -> str:
    """Per cent of final verdicts that are ``match``; 0 (not no data) when there is none."""
    matches = window(VERDICTS + '{verdict="match"}')
    finals = window(VERDICTS + "{" + FINAL + "}")
    return f"100 * (sum({matches}) or vector(0)) / sum({finals})"


def query(
    expr: str, legend: str = "__auto", ref: str = "A", *, instant: bool = False, table: bool = False
) -> prometheus.Dataquery:
    """A Prometheus target; ``instant`` for a value over the range, ``table`` for a table."""
    target = (
        prometheus.Dataquery().datasource(PROMETHEUS).ref_id(ref).expr(expr).legend_format(legend)
    )
    if table:
        return target.instant().format(PromQueryFormat.TABLE)
    return target.instant() if instant else target.range()


def thresholds(*steps: tuple[float | None, str]) -> builders.ThresholdsConfig:
    return (
        builders.ThresholdsConfig()
        .mode(model.ThresholdsMode.ABSOLUTE)
        .steps([model.Threshold(value=value, color=color) for value, color in steps])
    )


def match_thresholds() -> builders.ThresholdsConfig:
    return thresholds((None, "red"), (99.0, "orange"), (MATCH_RATE_TARGET, "green"))


def count_thresholds() -> builders.ThresholdsConfig:
    """Green at zero, red from the first one: for things that should never happen."""
    return thresholds((None, "green"), (1, "red"))


def link(title: str, url: str, tooltip: str = "") -> builders.DashboardLink:
    built = (
        builders.DashboardLink(title)
        .type(model.DashboardLinkType.LINK)
        .url(url)
        .keep_time(True)
        .target_blank(False)
        .as_dropdown(False)
        .include_vars(False)
        .icon("dashboard")
        .tags([])
    )
    return built.tooltip(tooltip) if tooltip else built


def explore_url(datasource: model.DataSourceRef, tempo_query: str, start: str, end: str) -> str:
    """A Grafana Explore URL running ``tempo_query``; Grafana's ``${...}`` variables in it
    are left unescaped, so a data link interpolates them."""
    pane = {
        "datasource": datasource.uid,
        "queries": [
            {
                "refId": "A",
                "datasource": {"type": datasource.type_val, "uid": datasource.uid},
                "queryType": "traceql",
                "query": tempo_query,
            }
        ],
        "range": {"from": start, "to": end},
    }
    panes = quote(json.dumps({"trace": pane}, separators=(",", ":")), safe="")
    for variable in ("${__value.raw}", "${__from}", "${__to}"):
        panes = panes.replace(quote(variable, safe=""), variable)
    return f"/explore?schemaVersion=1&orgId=1&panes={panes}"


class Layout:
    """Panel ids in order, and a common size per panel kind."""

    def __init__(self) -> None:
        self._next = 0

    def id(self) -> int:
        self._next += 1
        return self._next


def timeseries_panel(
    ids: Layout,
    title: str,
    description: str,
    targets: list[Builder[Dataquery]],
    unit: str,
    *,
    width: int = 12,
    height: int = 8,
    stacked: bool = False,
) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .id(ids.id())
        .title(title)
        .description(description)
        .datasource(PROMETHEUS)
        .targets(targets)
        .unit(unit)
        .span(width)
        .height(height)
        .fill_opacity(10)
        .line_width(1)
        .legend(
            common_builders.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        .tooltip(
            common_builders.VizTooltipOptions()
            .mode(common.TooltipDisplayMode.MULTI)
            .sort(common.SortOrder.DESCENDING)
        )
    )
    if stacked:
        panel = panel.stacking(
            common_builders.StackingConfig().mode(common.StackingMode.NORMAL).group("A")
        ).fill_opacity(40)
    return panel


def stat_panel(
    ids: Layout,
    title: str,
    description: str,
    targets: list[prometheus.Dataquery],
    *,
    unit: str,
    steps: builders.ThresholdsConfig,
    width: int = 4,
    height: int = 5,
) -> stat.Panel:
    # A value over the chosen range: one instant query, not a series per step.
    instant: list[Builder[Dataquery]] = [target.instant() for target in targets]
    return (
        stat.Panel()
        .id(ids.id())
        .title(title)
        .description(description)
        .datasource(PROMETHEUS)
        .targets(instant)
        .unit(unit)
        .thresholds(steps)
        .color_mode(common.BigValueColorMode.VALUE)
        .graph_mode(common.BigValueGraphMode.NONE)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .span(width)
        .height(height)
    )


def top_panel(
    ids: Layout, title: str, description: str, expr: str, legend: str, *, width: int = 8
) -> bargauge.Panel:
    """A horizontal bar per series of an instant query (the top N over the chosen range)."""
    return (
        bargauge.Panel()
        .id(ids.id())
        .title(title)
        .description(description)
        .datasource(PROMETHEUS)
        .with_target(
            prometheus.Dataquery()
            .datasource(PROMETHEUS)
            .ref_id("A")
            .expr(expr)
            .legend_format(legend)
            .instant()
        )
        .unit("short")
        .decimals(0)
        .min(0)
        .orientation(common.VizOrientation.HORIZONTAL)
        .display_mode(common.BarGaugeDisplayMode.GRADIENT)
        .show_unfilled(True)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .thresholds(thresholds((None, "orange"), (10, "red")))
        .span(width)
        .height(9)
    )


def to_drill_down(title: str, extra: str = "") -> builders.DashboardLink:
    """A data link from a mismatch series to the drill-down, on the same time range."""
    return (
        builders.DashboardLink(title)
        .url(f"/d/{DRILL_DOWN_UID}?${{__url_time_range}}{extra}")
        .target_blank(False)
    )


def overview() -> builders.Dashboard:
    ids = Layout()
    verdicts = VERDICTS
    mismatch = increase(VERDICTS + '{verdict="mismatch"}')
    missing_in_kafka = increase(VERDICTS + '{verdict="missing_in_kafka"}')
    missing = rate(VERDICTS + '{verdict=~"missing_in_kafka|missing_primary"}')
    mismatch_rate = rate(VERDICTS + '{verdict="mismatch"}')
    mirrored, skipped = "ragflow_sidecar_mirrored_total", "ragflow_sidecar_skipped_total"
    dash = (
        builders.Dashboard("RAGFlow Kafka sidecar: shadow migration overview")
        .uid(OVERVIEW_UID)
        .description(
            "Redis Streams to Kafka shadow migration: share of traffic on Kafka, verdicts, "
            "latency of both paths, lag, dead letters and component health."
        )
        .tags(TAGS)
        .editable()
        .timezone("browser")
        .time("now-1h", "now")
        .refresh("30s")
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .link(
            link(
                "Diff drill-down",
                f"/d/{DRILL_DOWN_UID}",
                "Which fields, task types and comparators mismatch, with traces",
            )
        )
    )

    dash = dash.with_row(builders.Row("Migration state").id(ids.id()))
    dash = (
        dash.with_panel(
            stat_panel(
                ids,
                "Traffic on Kafka",
                "KAFKA_TRAFFIC_PERCENT: the share of documents the mirror carries over Kafka.",
                [query("max(ragflow_sidecar_traffic_percent)", "configured")],
                unit="percent",
                steps=thresholds((None, "blue")),
            )
        )
        .with_panel(
            stat_panel(
                ids,
                "Match rate",
                "Final verdicts that are `match`, over the chosen range. The share should only "
                f"go up while this stays at or above {MATCH_RATE_TARGET} %.",
                [query(match_rate(increase), "match rate")],
                unit="percent",
                steps=match_thresholds(),
            ).decimals(2)
        )
        .with_panel(
            stat_panel(
                ids,
                "Mismatches",
                "Tasks whose Kafka outcome differed from the Redis one, over the chosen range.",
                [
                    query(
                        f"sum({mismatch}) or vector(0)",
                        "mismatches",
                    )
                ],
                unit="short",
                steps=count_thresholds(),
            )
            .decimals(0)
            .data_links([to_drill_down("Diff drill-down")])
        )
        .with_panel(
            stat_panel(
                ids,
                "Missing in Kafka",
                "Tasks RAGFlow got from Redis whose Kafka copy never arrived, over the range.",
                [
                    query(
                        f"sum({missing_in_kafka}) or vector(0)",
                        "missing in Kafka",
                    )
                ],
                unit="short",
                steps=count_thresholds(),
            ).decimals(0)
        )
        .with_panel(
            stat_panel(
                ids,
                "Dead-lettered",
                "Records sent to ragflow.task.dlq over the chosen range (mirror and shadow).",
                [
                    query(
                        f"sum({increase('ragflow_sidecar_dead_lettered_total')}) or vector(0)",
                        "dead-lettered",
                    )
                ],
                unit="short",
                steps=count_thresholds(),
            ).decimals(0)
        )
        .with_panel(
            stat_panel(
                ids,
                "Components up",
                "1 while a component's loop runs (mirror, shadow, observer, sweeper); the "
                "lowest over the sidecar's instances.",
                [query("min by (component) (ragflow_sidecar_up)", "{{component}}")],
                unit="none",
                steps=thresholds((None, "red"), (1, "green")),
            ).mappings(
                [
                    model.ValueMap(
                        options={
                            "0": model.ValueMappingResult(text="down", color="red", index=0),
                            "1": model.ValueMappingResult(text="up", color="green", index=1),
                        }
                    )
                ]
            )
        )
    )

    dash = dash.with_row(builders.Row("Verdicts").id(ids.id()))
    dash = (
        dash.with_panel(
            timeseries_panel(
                ids,
                "Match rate",
                "Per cent of final verdicts that are `match`; the dashed line is the target "
                f"({MATCH_RATE_TARGET} %).",
                [query(match_rate(rate), "match rate")],
                "percent",
            )
            .max(100)
            .decimals(2)
            .thresholds(match_thresholds())
            .thresholds_style(
                common_builders.GraphThresholdsStyleConfig().mode(
                    common.GraphThresholdsStyleMode.DASHED
                )
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Verdicts by kind",
                "Verdicts published per second: match, mismatch, missing_in_kafka, "
                "missing_primary, error, and duplicate (a second Kafka copy of an entry).",
                [query(f"sum by (verdict) ({rate(verdicts)})", "{{verdict}}")],
                "ops",
                stacked=True,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Mismatches by task type",
                "Mismatch verdicts per second by task type. Click a series for the drill-down.",
                [
                    query(
                        f"sum by (task_type) ({mismatch_rate})",
                        "{{task_type}}",
                    )
                ],
                "ops",
                width=8,
            ).data_links(
                [
                    to_drill_down(
                        "Drill down on this task type", "&var-task_type=${__field.labels.task_type}"
                    )
                ]
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Mismatches by field",
                "Differences per second by top-level field of the outcome (at most 100 "
                "fields, then `other`).",
                [
                    query(
                        f"sum by (field) ({rate('ragflow_sidecar_mismatched_fields_total')})",
                        "{{field}}",
                    )
                ],
                "ops",
                width=8,
            ).data_links([to_drill_down("Diff drill-down")])
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Missing in Kafka / missing primary",
                "missing_in_kafka: Redis had the task, Kafka's copy never came. "
                "missing_primary: Kafka had a task Redis never had.",
                [
                    query(
                        f"sum by (verdict) ({missing})",
                        "{{verdict}}",
                    )
                ],
                "ops",
                width=8,
            )
        )
    )

    dash = dash.with_row(builders.Row("Latency: Redis path beside Kafka path").id(ids.id()))
    dash = (
        dash.with_panel(
            timeseries_panel(
                ids,
                "Queue wait p50 / p99",
                "XADD to the start of processing, per path (redis: RAGFlow's workers as the "
                "observer sees them; kafka: the shadow consumer).",
                p50_p99("ragflow_sidecar_queue_wait_milliseconds", "path"),
                "ms",
                width=8,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Processing p50 / p99",
                "Processing time per path. Redis-path tasks taken and acked between two "
                "observer rounds have no processing time and are not counted.",
                p50_p99("ragflow_sidecar_processing_milliseconds", "path"),
                "ms",
                width=8,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Mirror latency p50 / p99",
                "XADD of a task to Kafka's acknowledgement of its copy.",
                p50_p99("ragflow_sidecar_mirror_latency_milliseconds"),
                "ms",
                width=8,
            )
        )
    )

    dash = dash.with_row(builders.Row("Lag, dead letters, throughput").id(ids.id()))
    dash = (
        dash.with_panel(
            timeseries_panel(
                ids,
                "Redis lag",
                "Stream entries not yet read by the mirror's consumer group.",
                [query("max by (stream) (ragflow_sidecar_redis_lag)", "{{stream}}")],
                "short",
                width=8,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Kafka consumer lag",
                "Records behind the shadow group's commits, per topic (summed over partitions).",
                [query("sum by (topic) (ragflow_sidecar_kafka_lag)", "{{topic}}")],
                "short",
                width=8,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "DLQ rate by reason",
                "Records sent to ragflow.task.dlq per second, by stage and reason.",
                [
                    query(
                        f"sum by (stage, reason) ({rate('ragflow_sidecar_dead_lettered_total')})",
                        "{{stage}}: {{reason}}",
                    )
                ],
                "ops",
                width=8,
                stacked=True,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Mirror throughput per stream and topic",
                "Entries read from the streams, mirrored per stream and topic, and left out of "
                "Kafka (outside the traffic share).",
                [
                    query(f"sum by (stream, topic) ({rate(mirrored)})", "{{stream}} → {{topic}}"),
                    query(
                        f"sum({rate('ragflow_sidecar_mirror_read_total')})",
                        "read from Redis",
                        "B",
                    ),
                    query(f"sum by (reason) ({rate(skipped)})", "skipped: {{reason}}", "C"),
                ],
                "ops",
                width=8,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Shadow throughput per topic",
                "Kafka records processed by the shadow consumer, and tasks in flight.",
                [
                    query(
                        f"sum by (topic) ({rate('ragflow_sidecar_shadow_processed_total')})",
                        "{{topic}}",
                    ),
                    query("sum(ragflow_sidecar_in_flight)", "in flight", "B"),
                ],
                "ops",
                width=8,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Carried over Kafka vs configured",
                "Share of the tasks read that were mirrored to Kafka, beside "
                "KAFKA_TRAFFIC_PERCENT.",
                [
                    query(
                        f"100 * sum({rate(mirrored)}) / (sum({rate(mirrored)}) + "
                        f"(sum({rate(skipped)}) or vector(0)))",
                        "carried",
                    ),
                    query("max(ragflow_sidecar_traffic_percent)", "configured", "B"),
                ],
                "percent",
                width=8,
            ).max(100)
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Retries and duplicates",
                "Produce batches Kafka did not take at once, shadow handler retries, and "
                "second copies of an entry seen by the shadow.",
                [
                    query(f"sum({rate('ragflow_sidecar_produce_retries_total')})", "produce"),
                    query(f"sum({rate('ragflow_sidecar_shadow_retries_total')})", "handler", "B"),
                    query(
                        f"sum({rate('ragflow_sidecar_shadow_duplicates_total')})",
                        "duplicates",
                        "C",
                    ),
                ],
                "ops",
                width=12,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Components up",
                "1 while a component's loop runs, per instance.",
                [query("ragflow_sidecar_up", "{{component}} {{instance}}")],
                "none",
                width=12,
            )
            .min(0)
            .max(1)
        )
    )
    return served_share(dash, ids)


def served_share(dash: builders.Dashboard, ids: Layout) -> builders.Dashboard:
    """What RAGFlow itself executes from Kafka (MQ_BACKEND=split), beside Redis. The values are
    the whole deployment's, read from Valkey by every sidecar instance alike: ``max``, not sum."""
    served_tasks = "ragflow_sidecar_served_tasks_total" + '{event=~"started|finished|failed"}'
    p99 = 'ragflow_sidecar_served_latency_ms{latency="processing", quantile="0.99"}'
    dash = dash.with_row(builders.Row("Served share: RAGFlow executing from Kafka").id(ids.id()))
    return (
        dash.with_panel(
            timeseries_panel(
                ids,
                "Served vs judged share",
                "KAFKA_SERVE_PERCENT (served: RAGFlow executes these documents' tasks from "
                "Kafka) beside KAFKA_TRAFFIC_PERCENT (judged), and the served share under the "
                "cap that `ragflow-sidecar gate --apply` lowers.",
                [query("max by (share) (ragflow_sidecar_serve_percent)", "{{share}}")],
                "percent",
                width=6,
            )
            .min(0)
            .max(100)
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Failure rate per path",
                "Failed over finished served tasks per path, over the last 5 minutes (0 when "
                "none finished). The gate rolls back when kafka exceeds redis by more than "
                "GATE_MAX_FAILURE_DELTA_PP.",
                [query("max by (path) (ragflow_sidecar_served_failure_percent)", "{{path}}")],
                "percent",
                width=6,
            ).min(0)
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Processing p99 per path",
                "p99 of served tasks' processing time per path over the last 5 minutes, as "
                "coarse as ragflow_mq's buckets (0 without a sample). The gate rolls back "
                "above GATE_MAX_P99_RATIO times redis's.",
                [query(f"max by (path) ({p99})", "{{path}}")],
                "ms",
                width=6,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Served tasks per path",
                "Tasks RAGFlow started, finished and failed per second, per path.",
                [query(f"max by (path, event) ({rate(served_tasks)})", "{{path}}: {{event}}")],
                "ops",
                width=6,
            )
        )
    )


def drill_down() -> builders.Dashboard:
    ids = Layout()
    task_type = 'task_type=~"$task_type"'
    mismatches = "ragflow_sidecar_mismatches_total{" + task_type + "}"
    mismatch_verdicts = 'ragflow_sidecar_verdicts_total{verdict="mismatch", ' + task_type + "}"
    fields = "ragflow_sidecar_mismatched_fields_total"
    dash = (
        builders.Dashboard("RAGFlow Kafka sidecar: diff drill-down")
        .uid(DRILL_DOWN_UID)
        .description(
            "Where the Kafka path differs from the Redis path: fields, task types and "
            "comparators over the chosen range, and the traces of mismatching tasks."
        )
        .tags(TAGS)
        .editable()
        .timezone("browser")
        .time("now-6h", "now")
        .refresh("1m")
        .with_variable(
            builders.QueryVariable("task_type")
            .label("Task type")
            .description("Task types with verdicts (the field panels cover every type).")
            .datasource(PROMETHEUS)
            .query("label_values(ragflow_sidecar_verdicts_total, task_type)")
            .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(model.VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(".*")
            .current(model.VariableOption(selected=True, text="All", value="$__all"))
        )
        .link(link("Shadow migration overview", f"/d/{OVERVIEW_UID}"))
        .link(
            link(
                "Mismatch traces in Explore",
                explore_url(TEMPO, MISMATCH_TRACES, "now-1h", "now"),
                f"Tempo: {MISMATCH_TRACES}",
            ).icon("external link")
        )
    )

    dash = dash.with_row(builders.Row("Over the chosen range").id(ids.id()))
    dash = (
        dash.with_panel(
            stat_panel(
                ids,
                "Mismatches",
                "Mismatch verdicts over the chosen range.",
                [query(f"sum({increase(mismatch_verdicts)}) or vector(0)", "mismatches")],
                unit="short",
                steps=count_thresholds(),
                width=8,
            ).decimals(0)
        )
        .with_panel(
            stat_panel(
                ids,
                "Match rate",
                "Final verdicts that are `match`, over the chosen range (every task type).",
                [query(match_rate(increase), "match rate")],
                unit="percent",
                steps=match_thresholds(),
                width=8,
            ).decimals(2)
        )
        .with_panel(
            stat_panel(
                ids,
                "Differences excluded as noise",
                "Differences the noise baseline (SHADOW_NOISE_RUNS) set aside as volatile: "
                "not mismatches.",
                [
                    query(
                        f"sum({increase('ragflow_sidecar_noise_differences_total')}) or vector(0)",
                        "noise",
                    )
                ],
                unit="short",
                steps=thresholds((None, "blue")),
                width=8,
            ).decimals(0)
        )
        .with_panel(
            top_panel(
                ids,
                "Top mismatching fields",
                "The ten top-level fields with the most differences over the chosen range.",
                f"topk(10, sum by (field) ({increase(fields)}))",
                "{{field}}",
            )
        )
        .with_panel(
            top_panel(
                ids,
                "Top mismatching task types",
                "The ten task types with the most mismatch verdicts over the chosen range.",
                f"topk(10, sum by (task_type) ({increase(mismatch_verdicts)}))",
                "{{task_type}}",
            )
        )
        .with_panel(
            top_panel(
                ids,
                "Mismatches by comparator",
                "Which comparator found the mismatches (payload, outcome, routing, ordering); "
                "one task can be found by several.",
                f"sum by (comparator) ({increase(mismatches)})",
                "{{comparator}}",
            )
        )
        .with_panel(
            table.Panel()
            .id(ids.id())
            .title("Mismatches by comparator and task type")
            .description("Over the chosen range.")
            .datasource(PROMETHEUS)
            .with_target(
                query(
                    f"sum by (comparator, task_type) ({increase(mismatches)})",
                    "{{comparator}} {{task_type}}",
                    table=True,
                )
            )
            .with_transformation(
                model.DataTransformerConfig(
                    id_val="organize",
                    options={
                        "excludeByName": {"Time": True},
                        "renameByName": {"Value": "mismatches"},
                    },
                )
            )
            .sort_by(
                [common_builders.TableSortByFieldState().display_name("mismatches").desc(True)]
            )
            .span(24)
            .height(8)
        )
    )

    dash = dash.with_row(builders.Row("Over time").id(ids.id()))
    dash = dash.with_panel(
        timeseries_panel(
            ids,
            "Mismatches by comparator over time",
            "Mismatches found per second, by comparator.",
            [query(f"sum by (comparator) ({rate(mismatches)})", "{{comparator}}")],
            "ops",
        )
    ).with_panel(
        timeseries_panel(
            ids,
            "Mismatched fields",
            "Differences per second, by top-level field.",
            [query(f"sum by (field) ({rate(fields)})", "{{field}}")],
            "ops",
        )
    )

    trace_link = explore_url(TEMPO, "${__value.raw}", "${__from}", "${__to}")
    dash = dash.with_row(builders.Row("From a mismatch to its trace").id(ids.id()))
    dash = dash.with_panel(
        table.Panel()
        .id(ids.id())
        .title("Mismatch traces")
        .description(
            f"Tempo, TraceQL `{MISMATCH_TRACES}`: the traces of tasks judged a mismatch in "
            "the chosen range. Click a trace id to open the trace."
        )
        .datasource(TEMPO)
        .with_target(
            tempo.TempoQuery()
            .datasource(TEMPO)
            .ref_id("A")
            .query_type("traceql")
            .query(MISMATCH_TRACES)
            .table_type(SearchTableType.TRACES)
            .limit(50)
        )
        .override_by_name(
            "traceID",
            [
                model.DynamicConfigValue(
                    id_val="links",
                    value=[{"title": "Open this trace", "url": trace_link, "targetBlank": False}],
                )
            ],
        )
        .span(16)
        .height(12)
    ).with_panel(
        text.Panel()
        .id(ids.id())
        .title("Reading a mismatch")
        .mode(TextMode.MARKDOWN)
        .content(
            "Each row of **Mismatch traces** is a task whose Kafka outcome differed from the "
            'Redis one (`span.verdict = "mismatch"`); its trace id opens the `compare` span '
            "with the diff event. A mismatch is exported whatever the sampling, so that span "
            "is a trace of its own: its links lead to the task's `send` (mirror) and "
            "`process` (shadow) spans.\n\n"
            "The diff itself is in the verdict, on `ragflow.shadow.verdicts`:\n\n"
            "```\nragflow-sidecar diffs --since 1h --verdict mismatch\n```\n\n"
            "The **Mismatch traces in Explore** link at the top runs the same TraceQL query in "
            "Explore; **Shadow migration overview** goes back."
        )
        .span(8)
        .height(12)
    )
    return dash


DASHBOARDS: dict[str, Callable[[], Builder[model.Dashboard]]] = {
    OVERVIEW_FILE: overview,
    DRILL_DOWN_FILE: drill_down,
}


def render(make: Callable[[], Builder[model.Dashboard]]) -> str:
    return json.dumps(make().build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the committed JSON is out of date"
    )
    parser.add_argument("--out", type=Path, default=HERE, help="directory of the JSON files")
    args = parser.parse_args(argv)
    stale = []
    for name, make in DASHBOARDS.items():
        path: Path = args.out / name
        wanted = render(make)
        if not args.check:
            path.write_text(wanted, encoding="utf-8")
            print(f"wrote {path}")
            continue
        have = path.read_text(encoding="utf-8") if path.exists() else ""
        if have != wanted:
            stale.append(name)
            diff = difflib.unified_diff(
                have.splitlines(),
                wanted.splitlines(),
                f"{name} (committed)",
                f"{name} (generated)",
                lineterm="",
                n=1,
            )
            print("\n".join(list(diff)[:40]), file=sys.stderr)
    if stale:
        print(
            f"out of date: {', '.join(stale)}; run `python dashboards/generate.py`",
            file=sys.stderr,
        )
        return 1
    if args.check:
        print("dashboards are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
