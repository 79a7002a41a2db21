"""The overview's rows of the served share (what RAGFlow itself executes from Kafka) and of the
autopilot that moves it (``ragflow-sidecar rollout``), with the autopilot's decisions as
annotations on every time series of the dashboard."""

from __future__ import annotations

from grafana_foundation_sdk.models import common

from dashboards.annotations import Annotation
from dashboards.panels import INFO_STEPS, Graph, Row, Stat
from dashboards.queries import Query, increase, or_none, rate

# What RAGFlow itself executes from Kafka (MQ_BACKEND=split), beside Redis. The values are the
# whole deployment's, read from Valkey by every sidecar instance alike: ``max``, not sum.
_SERVED_TASKS = "ragflow_sidecar_served_tasks_total" + '{event=~"started|finished|failed"}'
_SERVED_P99 = 'ragflow_sidecar_served_latency_ms{latency="processing", quantile="0.99"}'

SERVED_SHARE = Row(
    "Served share: RAGFlow executing from Kafka",
    [
        Graph(
            "Served vs judged share",
            "served: what RAGFlow executes from Kafka, the live share (live: set by the "
            "autopilot, `ragflow-sidecar rollout`, or by `shift --to`; 0 after `gate --apply`) "
            "under the ceiling (KAFKA_SERVE_PERCENT); beside the judged share "
            "(KAFKA_TRAFFIC_PERCENT).",
            # served_effective: the old name of served, exported beside it for one release.
            (
                Query(
                    'max by (share) (ragflow_sidecar_serve_percent{share!="served_effective"})',
                    "{{share}}",
                ),
            ),
            "percent",
            width=6,
            min=0,
            max=100,
        ),
        Graph(
            "Failure rate per path",
            "Failed over finished served tasks per path, over the last 5 minutes (0 when "
            "none finished). The gate rolls back when its sequential test proves kafka's "
            "failures per finished task above redis's (GATE_ALPHA).",
            (Query("max by (path) (ragflow_sidecar_served_failure_percent)", "{{path}}"),),
            "percent",
            width=6,
            min=0,
        ),
        Graph(
            "Processing p99 per path",
            "p99 of served tasks' processing time per path over the last 5 minutes, as "
            "coarse as ragflow_mq's buckets (0 without a sample). The gate compares the "
            "whole distribution, and rolls back when it proves kafka's slower (GATE_ALPHA).",
            (Query(f"max by (path) ({_SERVED_P99})", "{{path}}"),),
            "ms",
            width=6,
        ),
        Graph(
            "Served tasks per path",
            "Tasks RAGFlow started, finished and failed per second, per path.",
            (Query(f"max by (path, event) ({rate(_SERVED_TASKS)})", "{{path}}: {{event}}"),),
            "ops",
            width=6,
        ),
    ],
)


# The autopilot's record, read from the state store by every sidecar instance alike: ``max``.
_ROLLOUT = "ragflow_sidecar_rollout_"
_DECISIONS = _ROLLOUT + "decisions_total"
_STATUS = "`ragflow-sidecar rollout status` has its reason and evidence"
# Every phase in a colour of its own: a roll-back must stand out from a ramp.
_PHASE_COLORS = (
    ("ramping", "blue"),
    ("watching", "green"),
    ("paused", "orange"),
    ("rolled_back", "red"),
    ("aborted", "orange"),
    ("none", "text"),
)

ROLLOUT = Row(
    "Rollout autopilot: the served share stepped by the gate",
    [
        Stat(
            "Rollout phase",
            "The autopilot's phase: ramping (a step of ROLLOUT_STEPS in force), watching (the "
            "last step; the gate keeps judging it), paused, rolled_back (by the gate, until "
            "`rollout resume`), aborted (by an operator); none: it never started.",
            (Query(or_none(f"max by (phase) ({_ROLLOUT}phase) == 1", "phase"), "{{phase}}"),),
            unit="none",
            steps=INFO_STEPS,
            width=5,
            text_mode=common.BigValueTextMode.NAME,
            colors=_PHASE_COLORS,
        ),
        Stat(
            "Rollout step",
            "The step of ROLLOUT_STEPS the rollout is at, from 1 (0: not started).",
            (Query(f"max({_ROLLOUT}step)", "step"),),
            unit="none",
            steps=INFO_STEPS,
            width=3,
            decimals=0,
        ),
        Stat(
            "Autopilot's share",
            "The served share the autopilot set (it sets the live share; RAGFlow serves it "
            "under KAFKA_SERVE_PERCENT).",
            (Query(f"max({_ROLLOUT}share)", "share"),),
            unit="percent",
            steps=INFO_STEPS,
            width=3,
        ),
        Stat(
            "Dwell left",
            "How long the step must still run (ROLLOUT_DWELL_S) before the gate can promote "
            "it, and how long its evidence is expected to take still at the site's rate "
            "(`rollout plan`'s p50, kept at the start); 0 once over, or when not ramping.",
            (
                Query(f"max({_ROLLOUT}dwell_left_seconds)", "dwell left"),
                Query(f"max({_ROLLOUT}step_hours_expected) * 3600", "evidence, expected"),
            ),
            unit="s",
            steps=INFO_STEPS,
            width=4,
        ),
        Stat(
            "Documents still needed",
            "Finished documents each path still needs in this step (ROLLOUT_MIN_DOCUMENTS), as of "
            "the autopilot's last look; 0 when enough, or when not ramping. The gate's own "
            f"estimate of what would decide a hold is in its reason: {_STATUS}.",
            (Query(f"max by (path) ({_ROLLOUT}documents_needed)", "{{path}}"),),
            unit="short",
            steps=INFO_STEPS,
            width=5,
            decimals=0,
        ),
        Stat(
            "Last decision",
            "When the autopilot last decided: one a ROLLOUT_INTERVAL_S (a hold, at least) while "
            "an autopilot acts, so an old time means none acts.",
            (Query(f"max({_ROLLOUT}last_decision_timestamp_seconds) * 1000", "last"),),
            unit="dateTimeFromNow",
            steps=INFO_STEPS,
            width=4,
            mappings=(("0", "never", "text"),),
        ),
        Graph(
            "Autopilot's share vs served",
            "The share the autopilot set, what RAGFlow serves, and the ceiling "
            "(KAFKA_SERVE_PERCENT). The annotations mark each decision but holds.",
            (
                Query(f"max({_ROLLOUT}share)", "autopilot"),
                Query(
                    'max by (share) (ragflow_sidecar_serve_percent{share=~"served|ceiling"})',
                    "{{share}}",
                ),
            ),
            "percent",
            width=8,
            min=0,
            max=100,
        ),
        Graph(
            "Documents in this step",
            "Documents each path finished in the current step, how many more it needs "
            "(ROLLOUT_MIN_DOCUMENTS), as the autopilot's last look counted them, and the Kafka "
            "documents the step is expected to need (about M: `rollout plan` at the start).",
            (
                Query(f"max by (path) ({_ROLLOUT}step_documents)", "{{path}} finished"),
                Query(f"max by (path) ({_ROLLOUT}documents_needed)", "{{path}} still needed"),
                Query(f"max({_ROLLOUT}step_documents_expected)", "kafka expected (about M)"),
            ),
            "short",
            width=8,
            min=0,
        ),
        Stat(
            "Decisions by action",
            "The autopilot's decisions over the chosen range: start, promote, hold (one a "
            f"turn while nothing moves), rollback, pause, resume, abort. {_STATUS}.",
            (Query(f"max by (action) ({increase(_DECISIONS)})", "{{action}}"),),
            unit="short",
            steps=INFO_STEPS,
            width=8,
            height=8,
            decimals=0,
        ),
    ],
)


def _decisions(matcher: str) -> str:
    # A window of the step plus a scrape ($__rate_interval), so a change between two windows'
    # samples is still seen; one caught by two windows makes one region, not two marks.
    return f"max by (action) (changes({_DECISIONS}{{{matcher}}}[$__rate_interval])) > 0"


ROLLOUT_ANNOTATIONS = (
    Annotation(
        "Autopilot roll-backs",
        _decisions('action="rollback"'),
        "rollout {{action}}",
        f"The autopilot rolled the served share back; {_STATUS}.",
        ("action",),
        "red",
    ),
    Annotation(
        "Autopilot decisions",
        _decisions('action!~"hold|rollback"'),
        "rollout {{action}}",
        f"The autopilot moved or was ordered; {_STATUS}.",
        ("action",),
        "blue",
    ),
)
