"""Annotations from Prometheus: a mark on every time series panel where a query has a value.

The SDK's build for Grafana 11.3 models only the fields every data source shares (and ``expr``).
Grafana's Prometheus data source reads its own from the annotation itself: ``step`` (the
query's least step), ``titleFormat``, ``textFormat`` and ``tagKeys`` (legend formats and label
names of each mark); on load it moves ``expr`` and ``step`` into a target of its own. So
:class:`PrometheusAnnotation` writes them beside the shared fields.
"""

from __future__ import annotations

from dataclasses import dataclass

from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.models import dashboard as model

from dashboards.queries import PROMETHEUS


class _PrometheusAnnotationQuery(model.AnnotationQuery):
    """The SDK's annotation with Prometheus's own fields."""

    def __init__(self, spec: Annotation) -> None:
        super().__init__(
            name=spec.name,
            datasource=PROMETHEUS,
            enable=True,
            hide=False,
            icon_color=spec.color,
            expr=spec.expr,
        )
        self.spec = spec

    def to_json(self) -> dict[str, object]:
        return {
            **super().to_json(),
            "step": self.spec.step,
            "titleFormat": self.spec.title,
            "textFormat": self.spec.text,
            "tagKeys": ",".join(self.spec.tags),
            "useValueForTime": False,
        }


@dataclass(frozen=True)
class Annotation(Builder[model.AnnotationQuery]):
    """A Prometheus annotation, as ``Dashboard.annotation`` takes it: a mark at each step where
    ``expr`` returns a series (Grafana merges marks of one series a step apart or less into one
    region)."""

    name: str
    expr: str
    title: str  # legend format of a mark's title, e.g. "{{action}}"
    text: str  # legend format of its text
    tags: tuple[str, ...]  # labels whose values become its tags
    color: str
    step: str = "60s"  # the least step: one mark a minute at most, whatever the range

    def build(self) -> model.AnnotationQuery:
        return _PrometheusAnnotationQuery(self)
