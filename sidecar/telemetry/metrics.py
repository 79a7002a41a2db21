"""The sidecar's metrics: OpenTelemetry instruments, scraped by Prometheus and sent over OTLP.

Counters are observable: their callbacks read the components' own stats objects at collection
time, so the data path pays nothing for them. Histograms are recorded where the value appears
(per mirrored batch, per shadow task, per RAGFlow delivery seen). Gauges that need I/O (Redis
lag) are refreshed by :meth:`SidecarMetrics.refresh`, which the sidecar runs every few seconds.
Every name is listed, with its labels, in ``docs/metrics.md``.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry

logger = logging.getLogger(__name__)

PREFIX = "ragflow_sidecar_"
# Buckets in ms for the latency histograms: a mirror hop is milliseconds, a RAGFlow task can
# wait and run for minutes.
LATENCY_BUCKETS_MS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 15000, 60000, 300000)
# Mismatched-field labels beyond this many distinct paths are reported as "other".
MAX_FIELD_LABELS = 100

Stats = Callable[[], Iterable[tuple[Mapping[str, str], float]]]


@dataclass
class GaugeValues:
    """Values the refresher computes with I/O, read by the gauges' callbacks."""

    redis_lag: dict[str, int] = field(default_factory=dict)  # stream -> entries
    kafka_lag: dict[tuple[str, int], int] = field(default_factory=dict)  # (topic, p) -> records
    up: dict[str, int] = field(default_factory=dict)  # component -> 1/0


def counts(counter: Counter[Any], *labels: str) -> list[tuple[Mapping[str, str], float]]:
    """A counter's items as labelled values; tuple keys give one label per element."""
    return [
        (dict(zip(labels, key if isinstance(key, tuple) else (key,), strict=True)), float(n))
        for key, n in counter.items()
    ]


class SidecarMetrics:
    """All instruments of one sidecar process, on a meter provider of its own."""

    def __init__(self, *, otlp: bool = False) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        readers: list[MetricReader] = [
            PrometheusMetricReader(registry=self.registry, disable_target_info=True)
        ]
        if otlp:
            readers.append(PeriodicExportingMetricReader(_otlp_exporter()))
        self._provider = MeterProvider(
            metric_readers=readers,
            resource=Resource.create({"service.name": "ragflow-kafka-sidecar"}),
        )
        self._meter = self._provider.get_meter("ragflow_kafka_sidecar")
        self.gauges = GaugeValues()
        self._field_labels: set[str] = set()
        meter = self._meter
        self.mirror_latency = meter.create_histogram(
            PREFIX + "mirror_latency",
            unit="ms",
            description="XADD of a task to Kafka's ack of its copy",
            explicit_bucket_boundaries_advisory=LATENCY_BUCKETS_MS,
        )
        self.queue_wait = meter.create_histogram(
            PREFIX + "queue_wait",
            unit="ms",
            description="enqueue (XADD) to the start of processing, per path (redis|kafka)",
            explicit_bucket_boundaries_advisory=LATENCY_BUCKETS_MS,
        )
        self.processing = meter.create_histogram(
            PREFIX + "processing",
            unit="ms",
            description="start to end of processing, per path (redis|kafka)",
            explicit_bucket_boundaries_advisory=LATENCY_BUCKETS_MS,
        )

    def observe_counter(self, name: str, description: str, read: Stats) -> None:
        """A monotonic counter whose values ``read`` returns at collection time."""
        self._meter.create_observable_counter(
            PREFIX + name, callbacks=[_callback(read)], description=description
        )

    def observe_gauge(self, name: str, description: str, read: Stats) -> None:
        """A gauge whose values ``read`` returns at collection time."""
        self._meter.create_observable_gauge(
            PREFIX + name, callbacks=[_callback(read)], description=description
        )

    def field_label(self, path: str) -> str:
        """A mismatched field's label, bounded in cardinality."""
        if path in self._field_labels:
            return path
        if len(self._field_labels) < MAX_FIELD_LABELS:
            self._field_labels.add(path)
            return path
        return "other"

    def shutdown(self) -> None:
        try:
            self._provider.shutdown()
        except Exception as exc:  # telemetry never breaks shutdown
            logger.warning("metrics shutdown failed: %s", exc)


def _callback(read: Stats) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def callback(options: CallbackOptions) -> Iterable[Observation]:
        try:
            return [Observation(value, dict(labels)) for labels, value in read()]
        except Exception as exc:  # a broken callback must not break the scrape of the rest
            logger.warning("metric callback failed: %s", exc)
            return []

    return callback


def _otlp_exporter() -> OTLPMetricExporter:
    # The exporter reads the standard OTEL_EXPORTER_OTLP_* variables (endpoint, headers, TLS)
    # itself, as every OpenTelemetry SDK does; gRPC is what the collector in compose/ takes.
    return OTLPMetricExporter()
