"""Traces over the wire: a real OTLP/gRPC receiver in the test, a real sidecar on real Valkey and
Kafka, and the span graph it receives (Redis read -> Kafka send -> shadow process -> compare)."""

from __future__ import annotations

import asyncio
import http.server
import json
import logging
import socket
import threading
import time
from typing import Any

import pytest
import valkey.asyncio as avalkey
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, Decision
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from sidecar.config import Settings
from sidecar.errors import ConfigError
from sidecar.telemetry import export as export_module
from sidecar.telemetry import tracing as tracing_module
from sidecar.telemetry.propagation import (
    KAFKA_HEADERS_GETTER,
    KAFKA_HEADERS_SETTER,
    format_traceparent,
    parse_traceparent,
)
from sidecar.telemetry.sampler import VerdictSampler
from sidecar.telemetry.tracing import Tracing
from sidecar.transport.base import OutgoingMessage
from sidecar.transport.message import QueueMessage, encode_task
from sidecar.transport.topics import init_topics
from sidecar.verdicts.model import VerdictRecord
from sidecar.verdicts.trace import MAX_DIFF_CHARS, REDACTED, compare_span, diff_json
from tests.mirror_support import ragflow_tasks, read_mirrored
from tests.otlp_support import Collector, SpanView
from tests.shadow_support import read_verdicts, running_sidecar, sidecar_settings

UPSTREAM = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
SECRET_TEXT = "my bank PIN is 4321"


def _sampled(traceparent: bytes) -> bool:
    return bool(int(traceparent[-2:], 16) & 1)  # the SDK also sets 0x02, "random"


def _context(traceparent: bytes | str) -> tuple[str, str]:
    text = traceparent.decode() if isinstance(traceparent, bytes) else traceparent
    _, trace_id, span_id, _ = text.split("-")
    return trace_id, span_id


async def _enqueue(
    client: avalkey.Valkey, stream: str, tasks: list[dict[str, Any]], extra: dict[int, Any]
) -> list[str]:
    ids = []
    for n, task in enumerate(tasks):
        entry_id = await client.xadd(stream, {"message": encode_task(task), **extra.get(n, {})})
        ids.append(entry_id.decode())
    return ids


def _changing(plan: dict[str, str]) -> Any:
    """A mirror transform: ``plan`` maps entry ids to to_page (+1), message_dict or drop."""

    def transform(message: QueueMessage, record: OutgoingMessage) -> list[OutgoingMessage]:
        change = plan.get(message.id)
        if change is None:
            return [record]
        if change == "drop":
            return []
        task = json.loads(record.value_bytes())
        if change == "to_page":
            task["to_page"] += 1
        else:
            task["message_dict"]["user_input"] = SECRET_TEXT
        return [record._replace(value=json.dumps(task).encode())]

    return transform


# --- end to end ---------------------------------------------------------------------------------


async def test_span_graph_from_the_redis_read_to_the_verdict(
    settings: Settings, valkey_client: avalkey.Valkey, unique: str, collector: Collector
) -> None:
    await init_topics(settings.kafka)
    stream = f"{unique}.0"
    tasks = ragflow_tasks(10)  # parse, raptor, raptor, dataflow, memory, parse, ...
    assert tasks[4]["task_type"] == "memory" and "to_page" in tasks[0]
    ids = await _enqueue(valkey_client, stream, tasks, {3: {"traceparent": UPSTREAM}})
    changed, memory, carried = ids[0], ids[4], ids[3]
    config = sidecar_settings(
        settings,
        [stream],
        unique,
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=collector.endpoint,
        OTEL_TRACES_SAMPLER="parentbased_always_on",
    )
    transform = _changing({changed: "to_page", memory: "message_dict"})
    async with running_sidecar(config, transform=transform) as sidecar:
        assert sidecar.tracing.enabled
        verdicts = {v["entry_id"]: v for v in await read_verdicts(settings, {stream}, 10)}
    records = {
        r.headers["x-redis-id"].decode(): r for r in await read_mirrored(settings, {stream}, 10)
    }
    assert set(records) == set(ids) == set(verdicts)
    assert {e: v["verdict"] for e, v in verdicts.items() if v["verdict"] != "match"} == {
        changed: "mismatch",
        memory: "mismatch",
    }

    spans = collector.spans()
    by_id = {span.span_id: span for span in spans}
    assert {span.resource["service.name"] for span in spans} == {"ragflow-kafka-sidecar"}
    assert {span.resource["service.instance.id"] for span in spans} == {f"sidecar-{unique}"}
    receives = [s for s in spans if s.kind == ProtoSpan.SPAN_KIND_CLIENT]
    assert receives and {s.name for s in receives} == {f"receive {stream}"}
    for receive in receives:
        assert receive.parent == ""
        assert receive.attributes["messaging.system"] == "redis"
        assert receive.attributes["messaging.consumer.group.name"] == f"mirror-{unique}"
    # The entry that came with a trace context: its batch span links to it.
    assert any(_context(UPSTREAM) in r.links for r in receives)

    def one(kind: int, entry_id: str, name: str = "compare") -> SpanView:
        found = [
            s
            for s in spans
            if s.kind == kind
            and s.attributes.get("messaging.message.id") == entry_id
            and (kind != ProtoSpan.SPAN_KIND_INTERNAL or s.name == name)
        ]
        assert len(found) == 1, (kind, entry_id, found)
        return found[0]

    for entry_id, record in records.items():
        header = record.headers["traceparent"]
        send = one(ProtoSpan.SPAN_KIND_PRODUCER, entry_id)
        assert send.name == f"send {record.topic}"
        # Redis read span -> Kafka send span.
        assert by_id[send.parent] in receives and send.trace_id == by_id[send.parent].trace_id
        assert send.attributes["messaging.destination.partition.id"] == str(record.partition)
        assert send.attributes["messaging.kafka.offset"] == record.offset
        assert send.attributes["task.id"] == tasks[ids.index(entry_id)]["id"]
        if entry_id == carried:
            # The entry's own context travels unchanged; the send span links to it.
            assert header == UPSTREAM.encode()
            assert send.links == [_context(UPSTREAM)]
        else:
            # The record's traceparent is the send span's context, sampled.
            assert _context(header) == send.context and _sampled(header)
        process = one(ProtoSpan.SPAN_KIND_CONSUMER, entry_id)
        # The kafka run and the verdict continue the record's producer context (sampled): one
        # trace per task, from the Redis read (or upstream's context) to the verdict.
        assert process.name == f"process {record.topic}"
        assert (process.trace_id, process.parent) == _context(header)
        assert process.links == [_context(header)]
        assert process.attributes["messaging.destination.name"] == record.topic
        assert process.attributes["messaging.consumer.group.name"] == f"shadow-{unique}"
        assert process.attributes["messaging.kafka.offset"] == record.offset
        compare = one(ProtoSpan.SPAN_KIND_INTERNAL, entry_id)
        assert compare.name == "compare"
        assert (compare.trace_id, compare.parent) == _context(header)
        assert compare.attributes["verdict"] == verdicts[entry_id]["verdict"]
        assert compare.attributes["task.type"] == verdicts[entry_id]["task_type"]
        assert compare.attributes["task.id"] == tasks[ids.index(entry_id)]["id"]
        assert set(compare.links) == {_context(header), process.context}
        # The redis run: a child of the record's producer context (the send, or upstream's).
        run = one(ProtoSpan.SPAN_KIND_INTERNAL, entry_id, "run redis")
        assert (run.trace_id, run.parent) == _context(header)
        assert run.attributes["task.path"] == "redis" and process.attributes["task.path"] == "kafka"
        assert run.attributes["task.id"] == compare.attributes["task.id"]
        assert (
            compare.attributes["verdict"] != "mismatch"
            or compare.attributes["verdict.difference_kinds"]
        )
        if compare.attributes["verdict"] == "match":
            assert compare.events == []

    diff = one(ProtoSpan.SPAN_KIND_INTERNAL, changed).events
    assert [name for name, _ in diff] == ["diff"]
    differences = json.loads(diff[0][1]["differences"])
    assert diff[0][1]["differences.total"] == len(differences) >= 1
    assert {"path": "to_page", "kind": "value_changed", "left": 12, "right": 13} in [
        {k: d[k] for k in ("path", "kind", "left", "right")} for d in differences
    ]
    # The memory task's user text differs, and stays out of the trace.
    [(name, event)] = one(ProtoSpan.SPAN_KIND_INTERNAL, memory).events
    assert name == "diff"
    memory_differences = json.loads(event["differences"])
    paths = {d["path"] for d in memory_differences}
    assert "message_dict.user_input" in paths
    for difference in memory_differences:
        if difference["path"].startswith("message_dict"):
            assert difference["left"] == difference["right"] == REDACTED
    assert SECRET_TEXT not in event["differences"] and "quoted" not in event["differences"]
    # ... while the verdict record itself still has it (redaction is the trace's business).
    assert SECRET_TEXT in json.dumps(verdicts[memory]["differences"])


@pytest.mark.parametrize("sampler", ["parentbased_traceidratio", "traceidratio"])
async def test_bad_verdicts_are_exported_at_sampling_ratio_zero(
    settings: Settings,
    valkey_client: avalkey.Valkey,
    unique: str,
    collector: Collector,
    sampler: str,
) -> None:
    await init_topics(settings.kafka)
    stream = f"{unique}.0"
    ids = await _enqueue(valkey_client, stream, ragflow_tasks(6), {})
    changed, dropped = ids[0], ids[1]
    config = sidecar_settings(
        settings,
        [stream],
        unique,
        # The general endpoint (the metrics stay off it) and the ratio sampler at 0.
        OTEL_EXPORTER_OTLP_ENDPOINT=collector.endpoint,
        OTEL_METRICS_EXPORTER="none",
        OTEL_TRACES_SAMPLER=sampler,
        OTEL_TRACES_SAMPLER_ARG="0",
    )
    async with running_sidecar(config, transform=_changing({changed: "to_page", dropped: "drop"})):
        verdicts = {v["entry_id"]: v["verdict"] for v in await read_verdicts(settings, {stream}, 6)}
    assert verdicts[changed] == "mismatch" and verdicts[dropped] == "missing_in_kafka"
    assert sorted(verdicts.values()).count("match") == 4
    records = {
        r.headers["x-redis-id"].decode(): r for r in await read_mirrored(settings, {stream}, 5)
    }

    spans = collector.spans()
    exported = {(s.name, s.attributes.get("messaging.message.id")): s for s in spans}
    assert len(exported) == len(spans)
    assert set(exported) == {("compare", changed), ("compare", dropped)}
    mismatch, missing = exported["compare", changed], exported["compare", dropped]
    assert mismatch.attributes["verdict"] == "mismatch"
    assert [name for name, _ in mismatch.events] == ["diff"]
    assert missing.attributes["verdict"] == "missing_in_kafka"
    # Unsampled records still carry a context (sampled flag off); the verdict links to it.
    header = records[changed].headers["traceparent"]
    assert not _sampled(header) and _context(header) in mismatch.links
    assert not any(_sampled(r.headers["traceparent"]) for r in records.values())
    # The dropped record never reached Kafka: the link is to the context its record had.
    assert len(missing.links) == 1 and missing.trace_id != missing.links[0][0]


async def test_tracing_off_sends_nothing_and_adds_no_header(
    settings: Settings,
    valkey_client: avalkey.Valkey,
    unique: str,
    collector: Collector,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Were anything to read the process environment behind the settings' back, it would
    # find the receiver here.
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.setenv(name, collector.endpoint)
    await init_topics(settings.kafka)
    stream = f"{unique}.0"
    ids = await _enqueue(valkey_client, stream, ragflow_tasks(4), {})
    config = sidecar_settings(
        settings,
        [stream],
        unique,
        OTEL_TRACES_EXPORTER="none",
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=collector.endpoint,
    )
    assert not config.tracing.enabled
    async with running_sidecar(config, transform=_changing({ids[0]: "to_page"})) as sidecar:
        assert not sidecar.tracing.enabled
        assert sidecar.judge.tracing is sidecar.tracing
        verdicts = await read_verdicts(settings, {stream}, 4)
    assert sorted(v["verdict"] for v in verdicts) == ["match"] * 3 + ["mismatch"]
    records = await read_mirrored(settings, {stream}, 4)
    assert len(records) == 4 and all("traceparent" not in r.headers for r in records)
    await asyncio.sleep(1.5)  # longer than the export interval
    assert collector.requests == []


# --- the pieces -------------------------------------------------------------------------------


def test_tracing_settings_follow_the_otel_variables() -> None:
    assert not Settings.from_env({}).tracing.enabled
    assert Settings.from_env({}).tracing.redact_fields == ("message_dict",)
    on = Settings.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}).tracing
    assert on.enabled and on.endpoint == "http://collector:4317" and on.protocol == "grpc"
    assert on.service_name == "ragflow-kafka-sidecar" and on.sampler == "parentbased_always_on"
    http = Settings.from_env(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector:4318/",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20abc,x-team=ml",
            "OTEL_RESOURCE_ATTRIBUTES": "service.name=other,deployment.environment.name=prod",
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "0.1",
            "TRACE_REDACT_FIELDS": "message_dict, doc_ids",
        }
    ).tracing
    assert http.endpoint == "https://collector:4318/v1/traces"
    assert [(k, v.reveal()) for k, v in http.headers] == [
        ("authorization", "Bearer abc"),
        ("x-team", "ml"),
    ]
    assert "abc" not in repr(http)
    assert http.service_name == "other"
    assert ("deployment.environment.name", "prod") in http.resource_attributes
    assert (http.sampler, http.sampler_ratio) == ("parentbased_traceidratio", 0.1)
    assert http.redact_fields == ("message_dict", "doc_ids")
    specific = Settings.from_env(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://b:4318/traces",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_SERVICE_NAME": "mine",
            "TRACE_REDACT_FIELDS": "none",
        }
    ).tracing
    assert specific.endpoint == "http://b:4318/traces" and specific.service_name == "mine"
    assert specific.redact_fields == ()
    exporter_only = Settings.from_env({"OTEL_TRACES_EXPORTER": "otlp"}).tracing
    assert exporter_only.enabled and exporter_only.endpoint == "http://localhost:4317"
    for off in (
        {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"},
        {"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"},
    ):
        assert not Settings.from_env(off).tracing.enabled, off


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("OTEL_TRACES_EXPORTER", "jaeger"),
        ("OTEL_TRACES_SAMPLER", "sometimes"),
        ("OTEL_TRACES_SAMPLER_ARG", "1.5"),
        ("OTEL_TRACES_SAMPLER_ARG", "ten percent"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4317"),
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "ftp://collector"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "no-value"),
        ("OTEL_SDK_DISABLED", "maybe"),
    ],
)
def test_bad_tracing_values_name_their_variable(variable: str, value: str) -> None:
    env = {"OTEL_TRACES_SAMPLER": "traceidratio", variable: value}
    with pytest.raises(ConfigError) as caught:
        Settings.from_env(env)
    assert variable in str(caught.value)


def test_traceparent_in_kafka_headers() -> None:
    propagator = TraceContextTextMapPropagator()
    headers: list[tuple[str, bytes]] = [("x-task-id", b"t1"), ("traceparent", b"old")]
    upstream = parse_traceparent(UPSTREAM)
    assert upstream is not None and upstream.is_remote and upstream.trace_flags.sampled
    context = trace.set_span_in_context(trace.NonRecordingSpan(upstream), Context())
    propagator.inject(headers, context, setter=KAFKA_HEADERS_SETTER)
    assert headers == [("x-task-id", b"t1"), ("traceparent", UPSTREAM.encode())]
    extracted = trace.get_current_span(propagator.extract(headers, getter=KAFKA_HEADERS_GETTER))
    assert extracted.get_span_context() == upstream
    assert format_traceparent(upstream) == UPSTREAM.encode()
    assert KAFKA_HEADERS_GETTER.keys(headers) == ["x-task-id", "traceparent"]
    for bad in (None, b"", b"garbage", "00-" + "0" * 32 + "-b7ad6b7169203331-01"):
        assert parse_traceparent(bad) is None


def test_diff_event_is_redacted_and_capped() -> None:
    differences = [
        {"path": "message_dict.user_input", "kind": "value_changed", "left": "a", "right": "b"},
        {"path": "message_dict", "kind": "type_changes", "left": {"x": 1}, "right": None},
        {"path": "message_dictionary", "kind": "value_changed", "left": 1, "right": 2},
        {"path": "", "kind": "undecodable", "left": "raw bytes", "right": "raw"},
        {"path": "to_page", "kind": "value_changed", "left": 12, "right": 13},
    ]
    shown = json.loads(diff_json(differences, ("message_dict",)))
    assert [(d["left"], d["right"]) for d in shown] == [
        (REDACTED, REDACTED),
        (REDACTED, REDACTED),
        (1, 2),
        (REDACTED, REDACTED),
        (12, 13),
    ]
    assert json.loads(diff_json(differences, ())) == differences
    many = [
        {"path": f"chunks[{n}]", "kind": "value_changed", "left": "x" * 250, "right": "y" * 250}
        for n in range(50)
    ]
    text = diff_json(many, ("message_dict",))
    assert len(text) <= MAX_DIFF_CHARS
    capped = json.loads(text)
    assert capped[:-1] == many[: len(capped) - 1] and len(capped) > 1
    assert capped[-1] == {"omitted": 50 - (len(capped) - 1)}


def test_sampler_forces_bad_verdicts_and_follows_links() -> None:
    never = VerdictSampler(ALWAYS_OFF, follow_links=True)
    for verdict in ("mismatch", "error", "missing_in_kafka", "missing_in_redis"):
        result = never.should_sample(None, 1, "compare", SpanKind.INTERNAL, {"verdict": verdict})
        assert result.decision is Decision.RECORD_AND_SAMPLE, verdict
    for verdict in ("match", "duplicate"):
        result = never.should_sample(None, 1, "compare", SpanKind.INTERNAL, {"verdict": verdict})
        assert result.decision is Decision.DROP, verdict

    def link(sampled: bool) -> Link:
        flags = TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
        return Link(SpanContext(5, 6, is_remote=True, trace_flags=flags))

    follows = VerdictSampler(ALWAYS_OFF, follow_links=True)
    drops = VerdictSampler(ALWAYS_ON, follow_links=True)
    consumer = SpanKind.CONSUMER
    assert follows.should_sample(None, 1, "p", consumer, {}, [link(True)]).decision.is_sampled()
    assert not drops.should_sample(None, 1, "p", consumer, {}, [link(False)]).decision.is_sampled()
    # The mirror's batch span is the mirror's own decision, links or not.
    client = SpanKind.CLIENT
    assert drops.should_sample(None, 1, "r", client, {}, [link(False)]).decision.is_sampled()
    own = VerdictSampler(ALWAYS_OFF, follow_links=False)
    assert not own.should_sample(None, 1, "p", consumer, {}, [link(True)]).decision.is_sampled()


async def test_http_protobuf_export() -> None:
    received: list[tuple[str, str | None, bytes]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((self.path, self.headers.get("x-api-key"), body))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()
            self.wfile.write(trace_service_pb2.ExportTraceServiceResponse().SerializeToString())

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        settings = Settings.from_env(
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                "OTEL_EXPORTER_OTLP_HEADERS": "x-api-key=k1",
                "OTEL_TRACES_SAMPLER": "always_off",
            }
        ).tracing
        tracing = Tracing(settings)
        await tracing.start()
        record = VerdictRecord("missing_in_redis", "s", "1-0", "t", "parse", 0, "me")
        compare_span(tracing, record, time.time_ns(), ({"traceparent": UPSTREAM},))
        await tracing.stop()
    finally:
        server.shutdown()
    assert [(path, key) for path, key, _ in received] == [("/v1/traces", "k1")]
    request = trace_service_pb2.ExportTraceServiceRequest.FromString(received[0][2])
    [span] = request.resource_spans[0].scope_spans[0].spans
    assert span.name == "compare" and span.links[0].span_id.hex() == _context(UPSTREAM)[1]


async def test_a_collector_that_is_away_is_logged_once_and_costs_the_caller_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(export_module, "EXPORT_TIMEOUT_S", 0.5)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
        endpoint = f"http://127.0.0.1:{sock.getsockname()[1]}"
        settings = Settings.from_env({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint}).tracing
    caplog.set_level(logging.INFO, logger="sidecar.telemetry")
    tracing = Tracing(settings)
    await tracing.start()
    assert tracing.enabled
    record = VerdictRecord("mismatch", "s", "1-0", "t", "parse", 0, "me")
    started = time.perf_counter()
    for _ in range(3):
        for _ in range(2000):
            compare_span(tracing, record, time.time_ns(), ({},))
        await asyncio.sleep(1.5)  # export attempts fail meanwhile
    spent = time.perf_counter() - started - 4.5
    stopping = time.perf_counter()
    await tracing.stop()
    assert time.perf_counter() - stopping < tracing_module.SHUTDOWN_GRACE_S + 1
    assert not tracing.enabled
    assert spent < 2.0, spent
    warnings = [
        r for r in caplog.records if r.name.startswith("sidecar.telemetry.") and r.levelno >= 30
    ]
    assert len(warnings) == 1 and "cannot export traces" in warnings[0].getMessage()
