"""Reading the sidecar's traces back from a real Jaeger's query API (``/api/traces``)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from sidecar.dev.local_stack.jaeger import LocalJaeger
from sidecar.errors import LocalStackError

SERVICE = "ragflow-kafka-sidecar"


@dataclass(frozen=True)
class JaegerSpan:
    """One span as Jaeger's query API answers it: tags, references, logs and its service."""

    trace_id: str
    span_id: str
    name: str
    service: str
    resource: dict[str, Any]
    tags: dict[str, Any]
    parent: tuple[str, str] | None  # CHILD_OF: (trace id, span id)
    links: list[tuple[str, str]]  # FOLLOWS_FROM: OTLP span links
    events: list[dict[str, Any]]  # each log's fields, "event" being its name

    @classmethod
    def parse(cls, span: dict[str, Any], processes: dict[str, Any]) -> JaegerSpan:
        process = processes[span["processID"]]
        refs = span.get("references") or []
        parents = [(r["traceID"], r["spanID"]) for r in refs if r["refType"] == "CHILD_OF"]
        return cls(
            trace_id=span["traceID"],
            span_id=span["spanID"],
            name=span["operationName"],
            service=process["serviceName"],
            resource=_tags(process.get("tags")),
            tags=_tags(span.get("tags")),
            parent=parents[0] if parents else None,
            links=[(r["traceID"], r["spanID"]) for r in refs if r["refType"] == "FOLLOWS_FROM"],
            events=[_tags(log.get("fields")) for log in span.get("logs") or []],
        )

    @property
    def context(self) -> tuple[str, str]:
        return self.trace_id, self.span_id

    @property
    def references(self) -> set[tuple[str, str]]:
        """Every span it points at, parent or link."""
        return {*self.links, *([self.parent] if self.parent else [])}


def _tags(pairs: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {pair["key"]: pair["value"] for pair in pairs or []}


def _spans(answer: dict[str, Any]) -> list[JaegerSpan]:
    return [
        JaegerSpan.parse(span, trace["processes"])
        for trace in answer.get("data") or []
        for span in trace["spans"]
    ]


async def search(jaeger: LocalJaeger, **tags: str) -> list[JaegerSpan]:
    """Every span of every trace that holds a span with ``tags`` (Jaeger's trace search)."""
    answer = await asyncio.to_thread(
        jaeger.get,
        "/api/traces",
        service=SERVICE,
        tags=json.dumps(tags),
        lookback="1h",
        limit="100",
    )
    return _spans(answer)


async def fetch(jaeger: LocalJaeger, trace_id: str) -> list[JaegerSpan]:
    """The spans of one trace (``/api/traces/<id>``); none while Jaeger does not have it."""
    try:
        answer = await asyncio.to_thread(jaeger.get, f"/api/traces/{trace_id}")
    except LocalStackError as exc:
        if "404" in str(exc):
            return []
        raise
    return _spans(answer)
