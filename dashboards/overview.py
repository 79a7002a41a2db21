"""The shadow migration overview: share of traffic on Kafka, verdicts, latency of both paths,
lag, dead letters, component health, the state store, and the share RAGFlow executes from Kafka
with the autopilot that moves it (its rows and annotations: ``served_share.py``)."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as builders
from grafana_foundation_sdk.models import dashboard as model

from dashboards.panels import (
    COUNT_STEPS,
    INFO_STEPS,
    MATCH_STEPS,
    UP_DOWN,
    Graph,
    Row,
    Stat,
    dashboard,
    link,
    to_drill_down,
    with_rows,
)
from dashboards.queries import (
    DRILL_DOWN_UID,
    KINDS,
    MATCH_RATE_TARGET,
    OVERVIEW_UID,
    VERDICTS,
    Query,
    increase,
    match_rate,
    or_none,
    or_zero,
    p50_p99,
    rate,
)
from dashboards.served_share import ROLLOUT, ROLLOUT_ANNOTATIONS, SERVED_SHARE

_MIRRORED = "ragflow_sidecar_mirrored_total"
_SKIPPED = "ragflow_sidecar_skipped_total"
_DEAD_LETTERED = "ragflow_sidecar_dead_lettered_total"
_MISMATCHES = VERDICTS + '{verdict="mismatch"}'
_MISSING = VERDICTS + '{verdict=~"missing_in_kafka|missing_in_redis"}'
_TRAFFIC = Query("max(ragflow_sidecar_traffic_percent)", "configured")

MIGRATION_STATE = Row(
    "Migration state",
    [
        Stat(
            "Traffic on Kafka",
            "KAFKA_TRAFFIC_PERCENT: the share of documents the mirror carries over Kafka.",
            (_TRAFFIC,),
            unit="percent",
            steps=INFO_STEPS,
        ),
        Stat(
            "Match rate",
            "Final verdicts that are `match`, over the chosen range. The share should only "
            f"go up while this stays at or above {MATCH_RATE_TARGET} %.",
            (Query(match_rate(increase), "match rate"),),
            unit="percent",
            steps=MATCH_STEPS,
            decimals=2,
        ),
        Stat(
            "Mismatches",
            "Tasks whose Kafka outcome differed from the Redis one, over the chosen range.",
            (Query(or_zero(increase(_MISMATCHES)), "mismatches"),),
            unit="short",
            steps=COUNT_STEPS,
            decimals=0,
            links=(to_drill_down("Diff drill-down"),),
        ),
        Stat(
            "Missing in Kafka",
            "Tasks RAGFlow got from Redis whose Kafka copy never arrived, over the range.",
            (
                Query(
                    or_zero(increase(VERDICTS + '{verdict="missing_in_kafka"}')),
                    "missing in Kafka",
                ),
            ),
            unit="short",
            steps=COUNT_STEPS,
            decimals=0,
        ),
        Stat(
            "Dead-lettered",
            "Records sent to ragflow.task.dlq over the chosen range (mirror and shadow).",
            (Query(or_zero(increase(_DEAD_LETTERED)), "dead-lettered"),),
            unit="short",
            steps=COUNT_STEPS,
            decimals=0,
        ),
        Stat(
            "Components up",
            "1 while a component's loop runs (mirror, shadow, observer, sweeper); the "
            "lowest over the sidecar's instances.",
            (Query("min by (component) (ragflow_sidecar_up)", "{{component}}"),),
            unit="none",
            steps=((None, "red"), (1, "green")),
            mappings=UP_DOWN,
        ),
    ],
)

VERDICT_ROW = Row(
    "Verdicts",
    [
        Graph(
            "Match rate",
            "Per cent of final verdicts that are `match`; the dashed line is the target "
            f"({MATCH_RATE_TARGET} %).",
            (Query(match_rate(rate), "match rate"),),
            "percent",
            max=100,
            decimals=2,
            steps=MATCH_STEPS,
        ),
        Graph(
            "Verdicts by kind",
            "Verdicts published per second: match, mismatch, missing_in_kafka, "
            "missing_in_redis, error, and duplicate (a second Kafka copy of an entry).",
            (Query(f"sum by (verdict) ({rate(KINDS)})", "{{verdict}}"),),
            "ops",
            stacked=True,
        ),
        Graph(
            "Mismatches by task type",
            "Mismatch verdicts per second by task type. Click a series for the drill-down.",
            (
                Query(
                    f"sum by (task_type) ({rate(_MISMATCHES)})",
                    "{{task_type}}",
                ),
            ),
            "ops",
            width=8,
            links=(
                to_drill_down(
                    "Drill down on this task type", "&var-task_type=${__field.labels.task_type}"
                ),
            ),
        ),
        Graph(
            "Mismatches by field",
            "Differences per second by top-level field of the outcome (at most 100 "
            "fields, then `other`; `none` at 0 before the first).",
            (
                Query(
                    or_none(
                        f"sum by (field) ({rate('ragflow_sidecar_mismatched_fields_total')})",
                        "field",
                    ),
                    "{{field}}",
                ),
            ),
            "ops",
            width=8,
            links=(to_drill_down("Diff drill-down"),),
        ),
        Graph(
            "Missing in Kafka / missing in Redis",
            "missing_in_kafka: Redis had the task, Kafka's copy never came. "
            "missing_in_redis: Kafka had a task Redis never had.",
            (Query(f"sum by (verdict) ({rate(_MISSING)})", "{{verdict}}"),),
            "ops",
            width=8,
        ),
    ],
)

LATENCY = Row(
    "Latency: Redis path beside Kafka path",
    [
        Graph(
            "Queue wait p50 / p99",
            "XADD to the start of processing, per path (redis: RAGFlow's workers as the "
            "observer sees them; kafka: the shadow consumer).",
            p50_p99("ragflow_sidecar_queue_wait_milliseconds", "path"),
            "ms",
            width=8,
        ),
        Graph(
            "Processing p50 / p99",
            "Processing time per path. Redis-path tasks taken and acked between two "
            "observer rounds have no processing time and are not counted.",
            p50_p99("ragflow_sidecar_processing_milliseconds", "path"),
            "ms",
            width=8,
        ),
        Graph(
            "Mirror latency p50 / p99",
            "XADD of a task to Kafka's acknowledgement of its copy.",
            p50_p99("ragflow_sidecar_mirror_latency_milliseconds"),
            "ms",
            width=8,
        ),
    ],
)

LAG_AND_THROUGHPUT = Row(
    "Lag, dead letters, throughput",
    [
        Graph(
            "Redis lag",
            "Stream entries not yet read by the mirror's consumer group.",
            (Query("max by (stream) (ragflow_sidecar_redis_lag)", "{{stream}}"),),
            "short",
            width=8,
        ),
        Graph(
            "Kafka consumer lag",
            "Records behind the shadow group's commits, per topic (summed over partitions).",
            (Query("sum by (topic) (ragflow_sidecar_kafka_lag)", "{{topic}}"),),
            "short",
            width=8,
        ),
        Graph(
            "DLQ rate by reason",
            "Records sent to ragflow.task.dlq per second, by stage and reason.",
            (Query(f"sum by (stage, reason) ({rate(_DEAD_LETTERED)})", "{{stage}}: {{reason}}"),),
            "ops",
            width=8,
            stacked=True,
        ),
        Graph(
            "Mirror throughput per stream and topic",
            "Entries read from the streams, mirrored per stream and topic, and left out of "
            "Kafka (outside the traffic share).",
            (
                Query(f"sum by (stream, topic) ({rate(_MIRRORED)})", "{{stream}} → {{topic}}"),
                Query(f"sum({rate('ragflow_sidecar_mirror_read_total')})", "read from Redis"),
                Query(f"sum by (reason) ({rate(_SKIPPED)})", "skipped: {{reason}}"),
            ),
            "ops",
            width=8,
        ),
        Graph(
            "Shadow throughput per topic",
            "Kafka records processed by the shadow consumer, and tasks in flight.",
            (
                Query(
                    f"sum by (topic) ({rate('ragflow_sidecar_shadow_processed_total')})",
                    "{{topic}}",
                ),
                Query("sum(ragflow_sidecar_in_flight)", "in flight"),
            ),
            "ops",
            width=8,
        ),
        Graph(
            "Carried over Kafka vs configured",
            "Share of the tasks read that were mirrored to Kafka, beside KAFKA_TRAFFIC_PERCENT.",
            (
                Query(
                    f"100 * sum({rate(_MIRRORED)}) / (sum({rate(_MIRRORED)}) + "
                    f"(sum({rate(_SKIPPED)}) or vector(0)))",
                    "carried",
                ),
                _TRAFFIC,
            ),
            "percent",
            width=8,
            max=100,
        ),
        Graph(
            "Retries and duplicates",
            "Produce batches Kafka did not take at once, shadow handler retries, and "
            "second copies of an entry seen by the shadow.",
            (
                Query(f"sum({rate('ragflow_sidecar_produce_retries_total')})", "produce"),
                Query(f"sum({rate('ragflow_sidecar_shadow_retries_total')})", "handler"),
                Query(f"sum({rate('ragflow_sidecar_shadow_duplicates_total')})", "duplicates"),
            ),
            "ops",
            width=12,
        ),
        Graph(
            "Components up",
            "1 while a component's loop runs, per instance.",
            (Query("ragflow_sidecar_up", "{{component}} {{instance}}"),),
            "none",
            width=12,
            min=0,
            max=1,
        ),
    ],
)

# The state store's figures are its server's, the same from every sidecar instance: ``max``.
_STATE = "ragflow_sidecar_state_store_"

STATE_STORE = Row(
    "State store",
    [
        Graph(
            "State store memory",
            "The state store's used_memory beside its maxmemory (no line: no limit). At the "
            "limit a noeviction store refuses the sidecar's writes (verdicts wait), an "
            "evicting one drops keys (SidecarStateStoreNearlyFull fires from 80 %).",
            (
                Query(f"max({_STATE}used_memory_bytes)", "used"),
                Query(f"max({_STATE}maxmemory_bytes > 0)", "maxmemory"),
            ),
            "bytes",
            min=0,
        ),
        Graph(
            "State store evictions",
            "Keys the state store evicted per second: flat zero, or evicted join and dedup "
            "keys turn into false missing_* verdicts (SidecarStateStoreEvicting).",
            (Query(f"max({rate(_STATE + 'evicted_keys_total')})", "evicted"),),
            "ops",
            min=0,
        ),
    ],
)

# What `ragflow-sidecar doctor` finds in the deployment, read by every sidecar instance: ``max``.
DEPLOYMENT = Row(
    "RAGFlow's deployment (doctor)",
    [
        Graph(
            "Orphaned pending entries",
            "Pending entries of RAGFlow's executors held by consumers with neither a heartbeat "
            "nor a read for 6 h (a pod gone in a rollout): no executor will run them. "
            "`ragflow-sidecar doctor --requeue-orphans --older-than 6h` puts them back "
            "(SidecarOrphanedPendingEntries).",
            (Query("max by (stream) (ragflow_sidecar_orphaned_pending_entries)", "{{stream}}"),),
            "short",
            min=0,
        ),
        Graph(
            "Doctor findings by severity",
            "What `ragflow-sidecar doctor` finds, every minute: a risk is a store that can lose "
            "tasks (eviction, no persistence) or orphaned entries; the command names each "
            "(SidecarDeploymentCanLoseTasks).",
            (
                Query(
                    "sum by (severity) (max by (check, severity) "
                    "(ragflow_sidecar_doctor_findings))",
                    "{{severity}}",
                ),
            ),
            "short",
            min=0,
        ),
    ],
)

ROWS = (
    MIGRATION_STATE,
    VERDICT_ROW,
    LATENCY,
    LAG_AND_THROUGHPUT,
    STATE_STORE,
    DEPLOYMENT,
    ROLLOUT,
    SERVED_SHARE,
)


def overview() -> builders.Dashboard:
    """The overview dashboard, Grafana's home dashboard in compose."""
    dash = (
        dashboard(
            "RAGFlow Kafka sidecar: shadow migration overview",
            OVERVIEW_UID,
            "Redis Streams to Kafka shadow migration: share of traffic on Kafka, verdicts, "
            "latency of both paths, lag, dead letters, component health, and the served share "
            "with its autopilot (whose decisions are marked on the graphs).",
            since="now-1h",
            refresh="30s",
        )
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .link(
            link(
                "Diff drill-down",
                f"/d/{DRILL_DOWN_UID}",
                "Which fields, task types and comparators mismatch, with traces",
            )
        )
    )
    for annotation in ROLLOUT_ANNOTATIONS:
        dash = dash.annotation(annotation)
    return with_rows(dash, ROWS)
