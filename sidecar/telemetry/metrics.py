"""The sidecar's metrics: OpenTelemetry instruments, scraped by Prometheus and sent over OTLP.

Counters are observable: their callbacks read the components' own stats objects at collection
time, so the data path pays nothing for them. The latency histograms are recorded where the
value appears (per mirrored task, per shadow task, per RAGFlow delivery seen), three times a
task: they are ``prometheus_client`` histograms, under a microsecond a record where an
OpenTelemetry histogram takes about 7 (about 6 % of ``run``'s CPU per verdict, measured in
issue 13), and are copied to OpenTelemetry histograms only when the OTLP export is on. Gauges
that need I/O (Redis lag) are refreshed by :meth:`SidecarMetrics.refresh`, which the sidecar
runs every few seconds.
Every name is listed, with its labels, in ``docs/metrics.md``.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.metrics import Histogram as OtelHistogram
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, Histogram

logger = logging.getLogger(__name__)

PREFIX = "ragflow_sidecar_"
# Buckets in ms for the latency histograms: a mirror hop is milliseconds, a RAGFlow task can
# wait and run for minutes.
LATENCY_BUCKETS_MS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 15000, 60000, 300000)
# The paths a task takes, the ``path`` label's values.
PATHS = ("redis", "kafka")
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
        resource = Resource.create({"service.name": "ragflow-kafka-sidecar"})
        # The histograms' OpenTelemetry copies go to OTLP only: through the scrape endpoint's
        # reader they would be exported twice under one name.
        self._otlp_provider = (
            MeterProvider(
                metric_readers=[PeriodicExportingMetricReader(_otlp_exporter())], resource=resource
            )
            if otlp
            else None
        )
        if otlp:
            readers.append(PeriodicExportingMetricReader(_otlp_exporter()))
        self._provider = MeterProvider(metric_readers=readers, resource=resource)
        self._meter = self._provider.get_meter("ragflow_kafka_sidecar")
        self.gauges = GaugeValues()
        self._field_labels: set[str] = set()
        self.mirror_latency = self._histogram(
            "mirror_latency", "XADD of a task to Kafka's ack of its copy"
        )
        self.queue_wait = self._histogram(
            "queue_wait",
            "enqueue (XADD) to the start of processing, per path (redis|kafka)",
            path=PATHS,
        )
        self.processing = self._histogram(
            "processing", "start to end of processing, per path (redis|kafka)", path=PATHS
        )

    def _histogram(self, name: str, description: str, **labels: Sequence[str]) -> LatencyHistogram:
        otlp = (
            self._otlp_provider.get_meter("ragflow_kafka_sidecar").create_histogram(
                PREFIX + name,
                unit="ms",
                description=description,
                explicit_bucket_boundaries_advisory=LATENCY_BUCKETS_MS,
            )
            if self._otlp_provider is not None
            else None
        )
        return LatencyHistogram(
            Histogram(
                f"{PREFIX}{name}_milliseconds",
                description,
                labelnames=list(labels),
                registry=self.registry,
                buckets=LATENCY_BUCKETS_MS,
            ),
            labels,
            otlp,
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
        for provider in (self._provider, self._otlp_provider):
            if provider is None:
                continue
            try:
                provider.shutdown()
            except Exception as exc:  # telemetry never breaks shutdown
                logger.warning("metrics shutdown failed: %s", exc)


class LatencyHistogram:
    """A histogram in ms with at most one label, whose known values are exported at 0 from
    the start; ``record`` takes OpenTelemetry's arguments."""

    def __init__(
        self,
        histogram: Histogram,
        labels: Mapping[str, Sequence[str]],
        otlp: OtelHistogram | None,
    ) -> None:
        if len(labels) > 1:
            raise ValueError("a latency histogram has one label at most")
        self._label = next(iter(labels), None)
        self._histogram = histogram
        # By the label's value; an unlabelled histogram is its own only child.
        self._children: dict[str | None, Histogram] = (
            {None: histogram}
            if self._label is None
            else {value: histogram.labels(value) for value in labels[self._label]}
        )
        self._otlp = otlp

    def record(self, value: float, attributes: Mapping[str, str] | None = None) -> None:
        """Add one observation; ``attributes`` holds the label's value, if it has one."""
        label = None if self._label is None else (attributes or {})[self._label]
        child = self._children.get(label)
        if child is None:
            child = self._children[label] = self._histogram.labels(label)
        child.observe(value)
        if self._otlp is not None:
            self._otlp.record(value, attributes)


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
