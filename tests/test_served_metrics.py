"""The served share's metrics: read from real Valkey by the poller, exported as Prometheus
scrapes them, present at 0 from start-up, and kept through a failed read."""

from __future__ import annotations

import asyncio
import time

import valkey.asyncio as avalkey
from prometheus_client import generate_latest

from ragflow_mq.recorder import Recorder, write
from sidecar.app.wiring import ValkeyClient
from sidecar.config import Settings
from sidecar.dev.local_stack import LocalStack
from sidecar.serve.served_metrics import ServedEvidencePoller, register_served_metrics
from sidecar.telemetry.metrics import SidecarMetrics
from sidecar.wire.contract import EVENTS, PATHS, Keys
from tests.conftest import free_port
from tests.test_metrics import sample


def served_settings(stack: LocalStack, prefix: str, redis_url: str | None = None) -> Settings:
    return Settings.from_env(
        {
            "REDIS_URL": redis_url or stack.valkey.url,
            "KAFKA_BOOTSTRAP_SERVERS": stack.kafka.bootstrap_servers,
            "MQ_BACKEND": "split",
            "KAFKA_TRAFFIC_PERCENT": "50",
            "KAFKA_SERVE_PERCENT": "20",
            "SERVE_KEY_PREFIX": prefix,
        }
    )


def scrape(metrics: SidecarMetrics) -> str:
    return generate_latest(metrics.registry).decode()


async def record(client: avalkey.Valkey, keys: Keys, at_s: float) -> None:
    """What RAGFlow's processes would record: 40 tasks on each path, 2 failed on Kafka."""
    recorder = Recorder()
    for path in PATHS:
        recorder.count(path, "started", 40, at_s=at_s)
        recorder.count(path, "finished", 40, at_s=at_s)
        for _ in range(40):
            recorder.observe(path, "processing", 90.0 if path == "redis" else 400.0, at_s=at_s)
            recorder.observe(path, "queue_wait", 7.0, at_s=at_s)
    recorder.count("kafka", "failed", 2, at_s=at_s)
    recorder.count("kafka", "retried", 1, at_s=at_s)
    pipe = client.pipeline(transaction=False)
    write(pipe, keys, recorder.drain())
    await pipe.execute()


async def test_the_poller_exports_the_evidence_of_ragflows_processes(
    stack: LocalStack, unique: str, valkey_client: avalkey.Valkey
) -> None:
    settings = served_settings(stack, unique)
    keys = Keys(unique)
    metrics = SidecarMetrics()
    own = ValkeyClient(settings.redis)
    poller = ServedEvidencePoller(settings, client=own.client, interval_s=0.05)
    register_served_metrics(metrics, poller, settings)

    # Before any read: every path x event at 0, the shares as configured, latencies at 0.
    text = scrape(metrics)
    for path in PATHS:
        for event in EVENTS:
            assert sample(text, "ragflow_sidecar_served_tasks_total", path=path, event=event) == 0
    assert sample(text, "ragflow_sidecar_serve_percent", share="judged") == 50
    for share in ("ceiling", "live", "served", "served_effective"):
        assert sample(text, "ragflow_sidecar_serve_percent", share=share) == 20
    p99 = {"latency": "processing", "quantile": "0.99"}
    assert sample(text, "ragflow_sidecar_served_latency_ms", path="kafka", **p99) == 0
    assert sample(text, "ragflow_sidecar_served_failure_percent", path="kafka") == 0

    # Ten minutes ago counts in the totals only; a minute ago in the last five minutes too.
    await record(valkey_client, keys, time.time() - 600)
    await record(valkey_client, keys, time.time() - 60)
    await valkey_client.set(keys.share, "5")
    async with own, poller:
        for _ in range(200):
            if poller.values.share.live == 5:
                break
            await asyncio.sleep(0.05)
        text = scrape(metrics)
    total = "ragflow_sidecar_served_tasks_total"
    assert sample(text, total, path="kafka", event="finished") == 80
    assert sample(text, total, path="kafka", event="failed") == 4
    assert sample(text, total, path="kafka", event="retried") == 2
    assert sample(text, total, path="redis", event="dead_lettered") == 0
    assert sample(text, "ragflow_sidecar_serve_percent", share="ceiling") == 20
    for share in ("live", "served", "served_effective"):
        assert sample(text, "ragflow_sidecar_serve_percent", share=share) == 5
    assert sample(text, "ragflow_sidecar_served_failure_percent", path="kafka") == 5.0
    assert sample(text, "ragflow_sidecar_served_failure_percent", path="redis") == 0.0
    # Bucket upper bounds: 90 ms in the 100 ms bucket, 400 in the 500, 7 in the 10.
    assert sample(text, "ragflow_sidecar_served_latency_ms", path="redis", **p99) == 100
    assert sample(text, "ragflow_sidecar_served_latency_ms", path="kafka", **p99) == 500
    wait = {"latency": "queue_wait", "quantile": "0.5"}
    assert sample(text, "ragflow_sidecar_served_latency_ms", path="kafka", **wait) == 10
    assert not poller.started
    await valkey_client.delete(*await valkey_client.keys(f"{unique}:*"))


async def test_a_failed_read_keeps_the_last_values(
    stack: LocalStack, unique: str, valkey_client: avalkey.Valkey
) -> None:
    keys = Keys(unique)
    await record(valkey_client, keys, time.time() - 60)
    settings = served_settings(stack, unique)
    async with (
        ValkeyClient(settings.redis) as own,
        ServedEvidencePoller(settings, client=own.client) as poller,
    ):
        assert await poller.poll()
        read = poller.values
        assert read.totals[("kafka", "failed")] == 2
    # The same poller pointed at nothing: the read fails, the values stay, stop still ends it.
    nowhere = served_settings(stack, unique, f"redis://127.0.0.1:{free_port()}/1")
    async with (
        ValkeyClient(nowhere.redis) as own,
        ServedEvidencePoller(nowhere, client=own.client, interval_s=0.05) as failing,
    ):
        failing.values = read
        assert not await failing.poll()
        assert failing.values is read
    await valkey_client.delete(*await valkey_client.keys(f"{unique}:*"))
