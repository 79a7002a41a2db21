"""Metrics and health endpoint of a running sidecar, read over HTTP as Prometheus would."""

from __future__ import annotations

import asyncio
import re
import urllib.request
from urllib.error import HTTPError

import valkey.asyncio as avalkey
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from sidecar.config import Settings
from sidecar.dev.local_stack import LocalValkey
from sidecar.telemetry.health import Health, HealthServer
from sidecar.telemetry.metrics import LatencyHistogram, SidecarMetrics
from sidecar.transport.topics import init_topics
from tests.conftest import free_port
from tests.mirror_support import ragflow_tasks, ragflow_worker
from tests.shadow_support import metered_sidecar, read_verdicts, running_sidecar, sidecar_settings
from tests.test_shadow import enqueue


async def get(url: str) -> tuple[int, str]:
    def fetch() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return int(response.status), response.read().decode()
        except HTTPError as exc:
            return exc.code, exc.read().decode()

    return await asyncio.to_thread(fetch)


def sample(text: str, name: str, **labels: str) -> float:
    """The value of the one sample of ``name`` whose labels include ``labels``."""
    found = []
    for line in text.splitlines():
        match = re.match(rf"^{name}(\{{(.*)\}})? (\S+)$", line)
        if match is None:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            found.append(float(match.group(3)))
    assert len(found) == 1, (name, labels, found)
    return found[0]


async def test_probes_follow_the_components() -> None:
    health = Health(("mirror", "shadow"))
    metrics = SidecarMetrics()
    async with HealthServer("127.0.0.1", 0, health, metrics.registry) as server:
        base = f"http://127.0.0.1:{server.port}"
        assert (await get(base + "/healthz"))[0] == 200
        assert (await get(base + "/readyz"))[0] == 503  # nothing started yet
        health.set_running("mirror", True)
        health.set_running("shadow", True)
        assert (await get(base + "/readyz"))[0] == 200
        # A loop that turns is alive; one whose turn count stays put past the limit is wedged.
        health.note_turns("shadow", 7, now=100.0, wedged_after_s=30)
        health.note_turns("shadow", 8, now=140.0, wedged_after_s=30)
        assert (await get(base + "/healthz"))[0] == 200
        health.note_turns("shadow", 8, now=169.0, wedged_after_s=30)
        assert (await get(base + "/healthz"))[0] == 200
        health.note_turns("shadow", 8, now=171.0, wedged_after_s=30)
        status, body = await get(base + "/healthz")
        assert status == 503 and "shadow wedged for 31 s" in body
        assert (await get(base + "/readyz"))[0] == 503
        health.note_turns("shadow", 9, now=172.0, wedged_after_s=30)
        assert (await get(base + "/healthz"))[0] == 200
        # Kafka away: the loop died and the process rebuilds itself; alive, but not ready.
        health.set_died("shadow", "ServiceUnavailableError('Kafka gone')")
        assert (await get(base + "/healthz"))[0] == 200
        status, body = await get(base + "/readyz")
        assert status == 503 and "shadow died" in body
        assert (await get(base + "/nothing"))[0] == 404
    metrics.shutdown()


async def test_metrics_of_a_running_sidecar(
    settings: Settings, valkey_client: avalkey.Valkey, unique: str, state_valkey: LocalValkey
) -> None:
    # A state store of its own: in the shared one, this sidecar's sweeper would judge what
    # earlier tests' killed sidecars left open, and count those verdicts too.
    stream, port, config = await metered_sidecar(
        settings,
        valkey_client,
        unique,
        KAFKA_TRAFFIC_PERCENT="50",
        SIDECAR_STATE_URL=f"redis://127.0.0.1:{state_valkey.port}/0",
    )
    base = f"http://127.0.0.1:{port}"
    async with running_sidecar(config) as sidecar:
        assert (await get(base + "/readyz"))[0] == 200
        worker = asyncio.create_task(ragflow_worker(valkey_client, stream, 200))
        await enqueue(valkey_client, stream, ragflow_tasks(200))
        await worker
        assert sidecar.mirror is not None
        stats = sidecar.mirror.stats
        # The worker can be done before the mirror has put its last batch in Kafka.
        while sum(stats.mirrored.values()) + sum(stats.skipped.values()) < 200:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        mirrored = sum(stats.mirrored.values())
        await read_verdicts(settings, {stream}, expected=mirrored)
        while sum(sidecar.judge.stats.verdicts.values()) < mirrored:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        status, text = await get(base + "/metrics")
    assert status == 200
    skipped = 200 - mirrored
    assert 0 < mirrored < 200
    total = sum(
        sample(text, "ragflow_sidecar_mirrored_total", stream=stream, topic=topic)
        for topic in sidecar.mirror.stats.mirrored
    )
    assert total == mirrored
    assert sample(text, "ragflow_sidecar_skipped_total", reason="outside_share") == skipped
    matches = sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("ragflow_sidecar_verdicts_total{") and 'verdict="match"' in line
    )
    assert matches == mirrored
    assert sample(text, "ragflow_sidecar_mirror_latency_milliseconds_count") == mirrored
    assert sample(text, "ragflow_sidecar_queue_wait_milliseconds_count", path="kafka") == mirrored
    assert sample(text, "ragflow_sidecar_processing_milliseconds_count", path="kafka") == mirrored
    assert sample(text, "ragflow_sidecar_traffic_percent") == 50
    for component in ("mirror", "shadow", "observer", "sweeper"):
        assert sample(text, "ragflow_sidecar_up", component=component) == 1
    # The RAGFlow-like worker's deliveries, seen by the observer, are the Redis path.
    assert sample(text, "ragflow_sidecar_queue_wait_milliseconds_count", path="redis") > 0
    assert "ragflow_sidecar_kafka_lag{" in text


async def test_counters_are_exported_at_zero_before_their_first_increment(
    settings: Settings, unique: str
) -> None:
    await init_topics(settings.kafka)
    port = free_port()
    config = sidecar_settings(settings, [f"{unique}.0"], unique, SIDECAR_METRICS_PORT=str(port))
    async with running_sidecar(config):
        status, text = await get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200
    assert sample(text, "ragflow_sidecar_skipped_total", reason="outside_share") == 0
    for stage, reason in (("mirror", "not_json"), ("mirror", "too_large"),
                          ("shadow", "handler_failed"), ("shadow", "no_value")):  # fmt: skip
        assert sample(text, "ragflow_sidecar_dead_lettered_total", stage=stage, reason=reason) == 0
    assert sample(text, "ragflow_sidecar_mirror_latency_milliseconds_count") == 0
    for path in ("redis", "kafka"):
        for histogram in ("queue_wait", "processing"):
            name = f"ragflow_sidecar_{histogram}_milliseconds"
            assert sample(text, f"{name}_count", path=path) == 0
            assert sample(text, f"{name}_bucket", path=path, le="+Inf") == 0


def test_latency_histograms_are_copied_to_opentelemetry_for_otlp() -> None:
    reader = InMemoryMetricReader()
    otlp = MeterProvider(metric_readers=[reader]).get_meter("t").create_histogram("processing")
    registry = CollectorRegistry()
    histogram = LatencyHistogram(
        Histogram("processing_milliseconds", "d", ["path"], registry=registry),
        {"path": ("redis", "kafka")},
        otlp,
    )
    histogram.record(3.0, {"path": "kafka"})
    histogram.record(5.0, {"path": "kafka"})
    histogram.record(7.0, {"path": "elsewhere"})  # a value not known in advance
    text = generate_latest(registry).decode()
    assert sample(text, "processing_milliseconds_count", path="kafka") == 2
    assert sample(text, "processing_milliseconds_sum", path="kafka") == 8
    assert sample(text, "processing_milliseconds_count", path="redis") == 0
    assert sample(text, "processing_milliseconds_count", path="elsewhere") == 1
    data = reader.get_metrics_data()
    assert data is not None
    [points] = [
        metric.data.data_points
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    ]
    by_path = {dict(point.attributes or {})["path"]: point for point in points}
    assert (by_path["kafka"].count, by_path["kafka"].sum) == (2, 8.0)  # type: ignore[attr-defined]
    assert by_path["elsewhere"].count == 1  # type: ignore[attr-defined]
