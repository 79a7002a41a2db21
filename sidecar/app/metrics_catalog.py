"""Every metric the sidecar exports, read from its components' stats at collection time.

The names below gain Prometheus's suffixes on the scrape endpoint (``_total`` for counters,
``_milliseconds`` for the histograms in ms): ``docs/metrics.md`` lists them as scraped, and the
dashboards query those names (a test checks each panel's query against a real Prometheus).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from sidecar.config.routing import KNOWN_TASK_TYPES
from sidecar.errors import DECODE_REASONS
from sidecar.mirror.mirror import Mirror
from sidecar.shadow.shadow import ShadowConsumer
from sidecar.telemetry.health import Health
from sidecar.telemetry.metrics import SidecarMetrics, counts
from sidecar.verdicts.compare import MISMATCH_COMPARATORS
from sidecar.verdicts.judge import JudgeStats
from sidecar.verdicts.model import RENAMED_VERDICTS

# The label sets known in advance, exported at 0 from start-up: a dashboard shows 0, not
# "No data", before the first dead letter or skipped task (and a rate() has a start point).
MIRROR_DEAD_REASONS: tuple[str, ...] = (*DECODE_REASONS, "too_large")
SHADOW_DEAD_REASONS: tuple[str, ...] = (*DECODE_REASONS, "handler_failed")
SKIP_REASONS: tuple[str, ...] = ("outside_share",)
# Every comparator x known task type: a healthy run has no mismatch at all, and its panels
# must read 0. Fields are an open set: their panels fall back to 0 in the query instead.
MISMATCH_LABELS: tuple[tuple[str, str], ...] = tuple(
    (comparator, task_type) for comparator in MISMATCH_COMPARATORS for task_type in KNOWN_TASK_TYPES
)


def register_metrics(
    metrics: SidecarMetrics,
    *,
    traffic_percent: float,
    judge_stats: JudgeStats,
    health: Health,
    mirror: Mirror | None,
    shadow: ShadowConsumer | None,
) -> None:
    """Create the observable instruments of a sidecar's parts on its meter provider
    (``metrics``); ``mirror`` and ``shadow`` are ``None`` when that part does not run."""
    if mirror is not None:
        stats = mirror.stats
        metrics.observe_counter(
            "mirrored", "tasks mirrored to Kafka", lambda: counts(stats.routes, "stream", "topic")
        )
        metrics.observe_counter(
            "skipped",
            "tasks left out of Kafka",
            lambda: counts(Counter({**dict.fromkeys(SKIP_REASONS, 0), **stats.skipped}), "reason"),
        )
        metrics.observe_counter(
            "mirror_read", "stream entries read by the mirror", lambda: [({}, stats.read)]
        )
        metrics.observe_counter(
            "produce_retries",
            "batches Kafka did not take at once",
            lambda: [({}, stats.produce_retries)],
        )
    metrics.observe_gauge(
        "traffic_percent", "share of tasks carried over Kafka", lambda: [({}, traffic_percent)]
    )
    metrics.observe_counter(
        "dead_lettered", "records sent to the DLQ", lambda: _dead(mirror, shadow)
    )
    metrics.observe_counter(
        "verdicts",
        "verdicts published",
        lambda: _with_renamed(counts(judge_stats.by_type, "verdict", "task_type")),
    )
    metrics.observe_counter(
        "mismatches",
        "mismatches by the comparator that found them",
        lambda: counts(
            Counter({**dict.fromkeys(MISMATCH_LABELS, 0), **judge_stats.mismatch_comparators}),
            "comparator",
            "task_type",
        ),
    )
    metrics.observe_counter(
        "mismatched_fields",
        "differences by top-level field (at most 100 fields, then 'other')",
        lambda: counts(_bounded(metrics, judge_stats.mismatched_fields), "field"),
    )
    metrics.observe_counter(
        "noise_differences",
        "differences excluded as noise by the baseline",
        lambda: [({}, judge_stats.noise)],
    )
    if shadow is not None:
        shadow_stats = shadow.stats
        metrics.observe_counter(
            "shadow_processed",
            "Kafka records processed by the shadow",
            lambda: counts(shadow_stats.processed, "topic"),
        )
        metrics.observe_counter(
            "shadow_duplicates",
            "second copies of an entry seen by the shadow",
            lambda: [({}, shadow_stats.duplicates)],
        )
        metrics.observe_counter(
            "shadow_retries", "handler retries", lambda: [({}, shadow_stats.retries)]
        )
        metrics.observe_gauge(
            "in_flight",
            "tasks being processed now",
            lambda: [({"component": "shadow"}, shadow_stats.in_flight)],
        )
        metrics.observe_gauge(
            "kafka_lag",
            "records behind the shadow group's commit",
            lambda: [
                ({"topic": topic, "partition": str(partition)}, lag)
                for (topic, partition), lag in shadow.consumer_lag().items()
            ],
        )
    gauges = metrics.gauges
    metrics.observe_gauge(
        "redis_lag",
        "stream entries not yet read by the mirror's group",
        lambda: [({"stream": s}, lag) for s, lag in gauges.redis_lag.items()],
    )
    metrics.observe_gauge(
        "up",
        "1 while a component's loop runs",
        lambda: [({"component": c}, 1.0 if up else 0.0) for c, up in health.running.items()],
    )


def _dead(
    mirror: Mirror | None, shadow: ShadowConsumer | None
) -> list[tuple[dict[str, str], float]]:
    found: dict[tuple[str, str], int] = {}
    if mirror is not None:
        found.update(dict.fromkeys((("mirror", r) for r in MIRROR_DEAD_REASONS), 0))
        found.update({("mirror", r): n for r, n in mirror.stats.dead_lettered.items()})
    if shadow is not None:
        found.update(dict.fromkeys((("shadow", r) for r in SHADOW_DEAD_REASONS), 0))
        found.update({("shadow", r): n for r, n in shadow.stats.dead_lettered.items()})
    return [({"stage": stage, "reason": reason}, float(n)) for (stage, reason), n in found.items()]


def _bounded(metrics: SidecarMetrics, fields: Counter[str]) -> Counter[str]:
    bounded: Counter[str] = Counter()
    for path, n in fields.items():
        bounded[metrics.field_label(path)] += n
    return bounded


def _with_renamed(
    series: list[tuple[Mapping[str, str], float]],
) -> list[tuple[Mapping[str, str], float]]:
    """Each renamed verdict also under its old name, for one release (docs/metrics.md): a
    dashboard or alert on ``verdict="missing_primary"`` keeps working meanwhile."""
    old_names: dict[str, str] = {new: old for old, new in RENAMED_VERDICTS.items()}
    aliases = [
        ({**labels, "verdict": old_names[labels["verdict"]]}, value)
        for labels, value in series
        if labels.get("verdict") in old_names
    ]
    return series + aliases
