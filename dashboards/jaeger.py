"""The drill-down's Jaeger panel: a search on the data source the ``jaeger`` variable names,
whose trace ids open the trace from that data source (a Jaeger data link)."""

from __future__ import annotations

from dataclasses import dataclass

from grafana_foundation_sdk.builders import table
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.variants import Dataquery
from grafana_foundation_sdk.models import dashboard as model

from dashboards.queries import JAEGER, explore_url


class JaegerQuery(Dataquery):
    """A query of Grafana's jaeger data source (the SDK has no builder for that plugin): a
    ``search`` by service and tags, or, with ``query`` alone, one trace by id."""

    def __init__(self, ref_id: str, *, service: str = "", tags: str = "", limit: int = 0) -> None:
        self.ref_id, self.service, self.tags, self.limit = ref_id, service, tags, limit

    def to_json(self) -> dict[str, object]:
        return {
            "datasource": {"type": JAEGER.type_val, "uid": JAEGER.uid},
            "refId": self.ref_id,
            "queryType": "search",
            "service": self.service,
            "tags": self.tags,
            "limit": self.limit,
        }


class JaegerSearch(Builder[Dataquery]):
    """Builds a :class:`JaegerQuery` search (``with_target`` takes builders)."""

    def __init__(self, service: str, tags: str, limit: int) -> None:
        self._query = JaegerQuery("A", service=service, tags=tags, limit=limit)

    def build(self) -> Dataquery:
        return self._query


@dataclass(frozen=True)
class JaegerTraces:
    """Jaeger's search (the ``jaeger`` data source variable's) for a service's spans with
    ``tags``; a trace id opens that trace from Jaeger in Explore (a Jaeger data link)."""

    title: str
    description: str
    service: str
    tags: str
    link_title: str
    limit: int = 50
    width: int = 24
    height: int = 12

    def build(self, panel_id: int) -> table.Panel:
        trace_link = explore_url(JAEGER, "${__value.raw}", "${__from}", "${__to}", traceql=False)
        link = {"title": self.link_title, "url": trace_link, "targetBlank": False}
        return (
            table.Panel()
            .id(panel_id)
            .title(self.title)
            .description(self.description)
            .datasource(JAEGER)
            .with_target(JaegerSearch(self.service, self.tags, self.limit))
            .override_by_name("traceID", [model.DynamicConfigValue(id_val="links", value=[link])])
            .span(self.width)
            .height(self.height)
        )
