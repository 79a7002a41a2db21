"""An OTLP/gRPC trace receiver in the test process, and the spans it received."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


@dataclass
class SpanView:
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent: str
    attributes: dict[str, Any]
    links: list[tuple[str, str]]
    events: list[tuple[str, dict[str, Any]]]
    resource: dict[str, Any]
    status: int

    @property
    def context(self) -> tuple[str, str]:
        return self.trace_id, self.span_id


@dataclass
class Collector(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
    """An OTLP/gRPC trace receiver keeping every export request."""

    endpoint: str = ""
    requests: list[trace_service_pb2.ExportTraceServiceRequest] = field(default_factory=list)

    async def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        self.requests.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()

    @property
    def received(self) -> list[bytes]:
        """Each export request's bytes, as they came over the wire."""
        return [request.SerializeToString() for request in self.requests]

    def spans(self) -> list[SpanView]:
        """Every span received, in the order received."""
        found = []
        for request in self.requests:
            for resource_spans in request.resource_spans:
                resource = _attributes(resource_spans.resource.attributes)
                for scope in resource_spans.scope_spans:
                    for span in scope.spans:
                        found.append(
                            SpanView(
                                name=span.name,
                                kind=span.kind,
                                trace_id=span.trace_id.hex(),
                                span_id=span.span_id.hex(),
                                parent=span.parent_span_id.hex(),
                                attributes=_attributes(span.attributes),
                                links=[(ln.trace_id.hex(), ln.span_id.hex()) for ln in span.links],
                                events=[(e.name, _attributes(e.attributes)) for e in span.events],
                                resource=resource,
                                status=span.status.code,
                            )
                        )
        return found


@contextlib.asynccontextmanager
async def running_collector() -> AsyncIterator[Collector]:
    """A ``Collector`` served on a free port of 127.0.0.1 (its ``endpoint``) until the block ends."""
    server = grpc.aio.server()
    receiver = Collector()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    receiver.endpoint = f"http://127.0.0.1:{port}"
    try:
        yield receiver
    finally:
        await server.stop(None)
