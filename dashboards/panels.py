"""The panel kinds of the dashboards as specs (plain data), and what turns them into the SDK's
builders: a dashboard is a header and a table of rows, each row a list of specs."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from grafana_foundation_sdk.builders import bargauge, stat, table, tempo, text, timeseries
from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as builders
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models.tempo import SearchTableType
from grafana_foundation_sdk.models.text import TextMode

from dashboards.queries import (
    DRILL_DOWN_UID,
    MATCH_RATE_TARGET,
    PROMETHEUS,
    TEMPO,
    Query,
    explore_url,
    refs,
    target,
)

TAGS = ["ragflow-kafka-sidecar"]

# Threshold steps: (from value, None for the base, colour).
Steps = tuple[tuple[float | None, str], ...]
MATCH_STEPS: Steps = ((None, "red"), (99.0, "orange"), (MATCH_RATE_TARGET, "green"))
# Green at zero, red from the first one: for things that should never happen.
COUNT_STEPS: Steps = ((None, "green"), (1, "red"))
INFO_STEPS: Steps = ((None, "blue"),)
# Value mappings: (value, text, colour).
UP_DOWN = (("0", "down", "red"), ("1", "up", "green"))


class DataLink(NamedTuple):
    """A link from a panel's series, opened in the same tab."""

    title: str
    url: str


def to_drill_down(title: str, extra: str = "") -> DataLink:
    """A data link from a mismatch series to the drill-down, on the same time range."""
    return DataLink(title, f"/d/{DRILL_DOWN_UID}?${{__url_time_range}}{extra}")


def thresholds(steps: Steps) -> builders.ThresholdsConfig:
    return (
        builders.ThresholdsConfig()
        .mode(model.ThresholdsMode.ABSOLUTE)
        .steps([model.Threshold(value=value, color=color) for value, color in steps])
    )


def last_value() -> common_builders.ReduceDataOptions:
    """One value per series: its last one (an instant query has no other)."""
    return common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False)


def data_links(links: Sequence[DataLink]) -> list[Builder[model.DashboardLink]]:
    return [builders.DashboardLink(title).url(url).target_blank(False) for title, url in links]


def link(title: str, url: str, tooltip: str = "") -> builders.DashboardLink:
    """A link in a dashboard's header, keeping the time range."""
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


def dashboard(
    title: str, uid: str, description: str, *, since: str, refresh: str
) -> builders.Dashboard:
    """A dashboard's header: the settings both dashboards share."""
    return (
        builders.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(TAGS)
        .editable()
        .timezone("browser")
        .time(since, "now")
        .refresh(refresh)
    )


class PanelSpec(Protocol):
    """A panel as data, built once its id is known."""

    def build(self, panel_id: int) -> Builder[model.Panel]: ...


@dataclass(frozen=True)
class Row:
    """A row of a dashboard and the panels below it."""

    title: str
    panels: Sequence[PanelSpec]


def with_rows(dash: builders.Dashboard, rows: Sequence[Row]) -> builders.Dashboard:
    """``dash`` with the rows' panels, ids numbered in order from 1 (the rows' too)."""
    ids = itertools.count(1)
    for row in rows:
        dash = dash.with_row(builders.Row(row.title).id(next(ids)))
        for spec in row.panels:
            dash = dash.with_panel(spec.build(next(ids)))
    return dash


@dataclass(frozen=True)
class Graph:
    """A time series of Prometheus range queries; ``steps`` are drawn as a dashed line."""

    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str
    width: int = 12
    height: int = 8
    stacked: bool = False
    min: float | None = None
    max: float | None = None
    decimals: float | None = None
    steps: Steps = ()
    links: tuple[DataLink, ...] = ()

    def build(self, panel_id: int) -> timeseries.Panel:
        panel = (
            timeseries.Panel()
            .id(panel_id)
            .title(self.title)
            .description(self.description)
            .datasource(PROMETHEUS)
            .targets(refs(self.queries))
            .unit(self.unit)
            .span(self.width)
            .height(self.height)
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
        if self.stacked:
            panel = panel.stacking(
                common_builders.StackingConfig().mode(common.StackingMode.NORMAL).group("A")
            ).fill_opacity(40)
        if self.min is not None:
            panel = panel.min(self.min)
        if self.max is not None:
            panel = panel.max(self.max)
        if self.decimals is not None:
            panel = panel.decimals(self.decimals)
        if self.steps:
            panel = panel.thresholds(thresholds(self.steps)).thresholds_style(
                common_builders.GraphThresholdsStyleConfig().mode(
                    common.GraphThresholdsStyleMode.DASHED
                )
            )
        if self.links:
            panel = panel.data_links(data_links(self.links))
        return panel


@dataclass(frozen=True)
class Stat:
    """One value over the chosen range: an instant query each, not a series per step."""

    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str
    steps: Steps
    width: int = 4
    height: int = 5
    decimals: float | None = None
    links: tuple[DataLink, ...] = ()
    # (value, text, colour) of each value shown as text.
    mappings: tuple[tuple[str, str, str], ...] = ()
    # What each value shows: its number (None: Grafana's choice), or the name of its series.
    text_mode: common.BigValueTextMode | None = None
    # (series name, colour): a fixed colour for a series, over the thresholds.
    colors: tuple[tuple[str, str], ...] = ()

    def build(self, panel_id: int) -> stat.Panel:
        panel = (
            stat.Panel()
            .id(panel_id)
            .title(self.title)
            .description(self.description)
            .datasource(PROMETHEUS)
            .targets(refs(self.queries, instant=True))
            .unit(self.unit)
            .thresholds(thresholds(self.steps))
            .color_mode(common.BigValueColorMode.VALUE)
            .graph_mode(common.BigValueGraphMode.NONE)
            .reduce_options(last_value())
            .span(self.width)
            .height(self.height)
        )
        if self.decimals is not None:
            panel = panel.decimals(self.decimals)
        if self.links:
            panel = panel.data_links(data_links(self.links))
        if self.mappings:
            options = {
                value: model.ValueMappingResult(text=shown, color=color, index=index)
                for index, (value, shown, color) in enumerate(self.mappings)
            }
            panel = panel.mappings([model.ValueMap(options=options)])
        if self.text_mode is not None:
            panel = panel.text_mode(self.text_mode)
        for name, color in self.colors:
            fixed = {"mode": "fixed", "fixedColor": color}
            panel = panel.override_by_name(name, [model.DynamicConfigValue("color", fixed)])
        return panel


@dataclass(frozen=True)
class Top:
    """A horizontal bar per series of an instant query (the top N over the chosen range)."""

    title: str
    description: str
    query: Query
    width: int = 8

    def build(self, panel_id: int) -> bargauge.Panel:
        return (
            bargauge.Panel()
            .id(panel_id)
            .title(self.title)
            .description(self.description)
            .datasource(PROMETHEUS)
            .with_target(target(self.query, instant=True))
            .unit("short")
            .decimals(0)
            .min(0)
            .orientation(common.VizOrientation.HORIZONTAL)
            .display_mode(common.BarGaugeDisplayMode.GRADIENT)
            .show_unfilled(True)
            .reduce_options(last_value())
            .thresholds(thresholds(((None, "orange"), (10, "red"))))
            .span(self.width)
            .height(9)
        )


@dataclass(frozen=True)
class Table:
    """An instant query as a table without its time column; the value column is named
    ``value_name`` and sorted largest first."""

    title: str
    description: str
    query: Query
    value_name: str
    width: int = 24
    height: int = 8

    def build(self, panel_id: int) -> table.Panel:
        return (
            table.Panel()
            .id(panel_id)
            .title(self.title)
            .description(self.description)
            .datasource(PROMETHEUS)
            .with_target(target(self.query, table=True))
            .with_transformation(
                model.DataTransformerConfig(
                    id_val="organize",
                    options={
                        "excludeByName": {"Time": True},
                        "renameByName": {"Value": self.value_name},
                    },
                )
            )
            .sort_by(
                [common_builders.TableSortByFieldState().display_name(self.value_name).desc(True)]
            )
            .span(self.width)
            .height(self.height)
        )


@dataclass(frozen=True)
class Traces:
    """Tempo's traces matching a TraceQL query; a trace id opens its trace in Explore."""

    title: str
    description: str
    traceql: str
    link_title: str
    limit: int = 50
    width: int = 24
    height: int = 12

    def build(self, panel_id: int) -> table.Panel:
        trace_link = explore_url(TEMPO, "${__value.raw}", "${__from}", "${__to}")
        return (
            table.Panel()
            .id(panel_id)
            .title(self.title)
            .description(self.description)
            .datasource(TEMPO)
            .with_target(
                tempo.TempoQuery()
                .datasource(TEMPO)
                .ref_id("A")
                .query_type("traceql")
                .query(self.traceql)
                .table_type(SearchTableType.TRACES)
                .limit(self.limit)
            )
            .override_by_name(
                "traceID",
                [
                    model.DynamicConfigValue(
                        id_val="links",
                        value=[{"title": self.link_title, "url": trace_link, "targetBlank": False}],
                    )
                ],
            )
            .span(self.width)
            .height(self.height)
        )


@dataclass(frozen=True)
class Text:
    """Markdown."""

    title: str
    content: str
    width: int = 24
    height: int = 8

    def build(self, panel_id: int) -> text.Panel:
        return (
            text.Panel()
            .id(panel_id)
            .title(self.title)
            .mode(TextMode.MARKDOWN)
            .content(self.content)
            .span(self.width)
            .height(self.height)
        )
