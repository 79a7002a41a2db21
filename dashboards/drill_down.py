"""The diff drill-down: where the Kafka path differs from the Redis path (fields, task types,
comparators) and the traces of mismatching tasks."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as builders
from grafana_foundation_sdk.models import dashboard as model

from dashboards.jaeger import JaegerTraces
from dashboards.panels import (
    COUNT_STEPS,
    INFO_STEPS,
    MATCH_STEPS,
    Graph,
    Row,
    Stat,
    Table,
    Text,
    Top,
    Traces,
    dashboard,
    link,
    with_rows,
)
from dashboards.queries import (
    DRILL_DOWN_UID,
    JAEGER_VARIABLE,
    MISMATCH_TAGS,
    MISMATCH_TRACES,
    OVERVIEW_UID,
    PROMETHEUS,
    SIDECAR_SERVICE,
    TEMPO,
    Query,
    explore_url,
    increase,
    match_rate,
    or_none,
    or_zero,
    rate,
)

_TASK_TYPE = 'task_type=~"$task_type"'
_MISMATCHES = "ragflow_sidecar_mismatches_total{" + _TASK_TYPE + "}"
_MISMATCH_VERDICTS = 'ragflow_sidecar_verdicts_total{verdict="mismatch", ' + _TASK_TYPE + "}"
_FIELDS = "ragflow_sidecar_mismatched_fields_total"

OVER_THE_RANGE = Row(
    "Over the chosen range",
    [
        Stat(
            "Mismatches",
            "Mismatch verdicts over the chosen range.",
            (Query(or_zero(increase(_MISMATCH_VERDICTS)), "mismatches"),),
            unit="short",
            steps=COUNT_STEPS,
            width=8,
            decimals=0,
        ),
        Stat(
            "Match rate",
            "Final verdicts that are `match`, over the chosen range (every task type).",
            (Query(match_rate(increase), "match rate"),),
            unit="percent",
            steps=MATCH_STEPS,
            width=8,
            decimals=2,
        ),
        Stat(
            "Differences excluded as noise",
            "Differences the noise baseline (SHADOW_NOISE_RUNS) set aside as volatile: "
            "not mismatches.",
            (Query(or_zero(increase("ragflow_sidecar_noise_differences_total")), "noise"),),
            unit="short",
            steps=INFO_STEPS,
            width=8,
            decimals=0,
        ),
        Top(
            "Top mismatching fields",
            "The ten top-level fields with the most differences over the chosen range "
            "(`none` at 0 before the first).",
            Query(or_none(f"topk(10, sum by (field) ({increase(_FIELDS)}))", "field"), "{{field}}"),
        ),
        Top(
            "Top mismatching task types",
            "The ten task types with the most mismatch verdicts over the chosen range.",
            Query(
                f"topk(10, sum by (task_type) ({increase(_MISMATCH_VERDICTS)}))", "{{task_type}}"
            ),
        ),
        Top(
            "Mismatches by comparator",
            "Which comparator found the mismatches (the mismatch rows of "
            "comparators/registry.py); one task can be found by several.",
            Query(f"sum by (comparator) ({increase(_MISMATCHES)})", "{{comparator}}"),
        ),
        Table(
            "Mismatches by comparator and task type",
            "Over the chosen range.",
            Query(
                f"sum by (comparator, task_type) ({increase(_MISMATCHES)})",
                "{{comparator}} {{task_type}}",
            ),
            value_name="mismatches",
        ),
    ],
)

OVER_TIME = Row(
    "Over time",
    [
        Graph(
            "Mismatches by comparator over time",
            "Mismatches found per second, by comparator.",
            (Query(f"sum by (comparator) ({rate(_MISMATCHES)})", "{{comparator}}"),),
            "ops",
        ),
        Graph(
            "Mismatched fields",
            "Differences per second, by top-level field (`none` at 0 before the first).",
            (Query(or_none(f"sum by (field) ({rate(_FIELDS)})", "field"), "{{field}}"),),
            "ops",
        ),
    ],
)

TO_THE_TRACE = Row(
    "From a mismatch to its trace",
    [
        Traces(
            "Mismatch traces",
            f"Tempo, TraceQL `{MISMATCH_TRACES}`: the traces of tasks judged a mismatch in "
            "the chosen range. Click a trace id to open the trace.",
            MISMATCH_TRACES,
            link_title="Open this trace",
            width=16,
        ),
        Text(
            "Reading a mismatch",
            "Each row of **Mismatch traces** is a task whose Kafka outcome differed from the "
            'Redis one (`span.verdict = "mismatch"`); its trace id opens the `compare` span '
            "with the diff event, in the task's trace beside its `send` (mirror), `run redis` "
            "and `process` (shadow) spans. A mismatch is exported whatever the sampling: when "
            "its task was not sampled, the span is a trace of its own, linked to the "
            "task's `send`.\n\n"
            "The diff itself is in the verdict, on `ragflow.shadow.verdicts`:\n\n"
            "```\nragflow-sidecar diffs --since 1h --verdict mismatch\n```\n\n"
            "The **Mismatch traces in Explore** link at the top runs the same TraceQL query in "
            "Explore; **Shadow migration overview** goes back.",
            width=8,
            height=12,
        ),
    ],
)

IN_JAEGER = Row(
    "From a mismatch to its trace, in Jaeger",
    [
        JaegerTraces(
            "Mismatch traces in Jaeger",
            f"Jaeger (the data source the `{JAEGER_VARIABLE}` variable names), search: service "
            f"`{SIDECAR_SERVICE}`, tags `{MISMATCH_TAGS}`. Click a trace id to open the trace.",
            SIDECAR_SERVICE,
            MISMATCH_TAGS,
            link_title="Open this trace from Jaeger",
            width=16,
        ),
        Text(
            "A mismatch's trace id",
            "Each verdict records the trace of its `compare` span (`trace_id`; a mismatch's "
            "is always exported), and `diffs` prints it:\n\n"
            "```\nragflow-sidecar diffs --since 1h --verdict mismatch\n```\n\n"
            "Paste it into Jaeger (or `GET /api/traces/<id>` on its query port): the task's "
            "trace, the Redis read, `send`, `run redis`, `process` and `compare` (an unsampled "
            "task's mismatch: `compare` alone, linked to its `send`). The `compare` span carries "
            "`verdict.comparators` and `verdict.difference_kinds`.",
            width=8,
            height=12,
        ),
    ],
)

ROWS = (OVER_THE_RANGE, OVER_TIME, TO_THE_TRACE, IN_JAEGER)


def drill_down() -> builders.Dashboard:
    """The drill-down dashboard, filtered by the ``task_type`` variable where a panel can be."""
    dash = (
        dashboard(
            "RAGFlow Kafka sidecar: diff drill-down",
            DRILL_DOWN_UID,
            "Where the Kafka path differs from the Redis path: fields, task types and "
            "comparators over the chosen range, and the traces of mismatching tasks.",
            since="now-6h",
            refresh="1m",
        )
        .with_variable(
            builders.QueryVariable("task_type")
            .label("Task type")
            .description("Task types with verdicts (the field panels cover every type).")
            .datasource(PROMETHEUS)
            .query("label_values(ragflow_sidecar_verdicts_total, task_type)")
            .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(model.VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(".*")
            .current(model.VariableOption(selected=True, text="All", value="$__all"))
        )
        .with_variable(
            builders.DatasourceVariable(JAEGER_VARIABLE)
            .label("Jaeger")
            .description("The Jaeger data source the sidecar's traces are in.")
            .type("jaeger")
        )
        .link(link("Shadow migration overview", f"/d/{OVERVIEW_UID}"))
        .link(
            link(
                "Mismatch traces in Explore",
                explore_url(TEMPO, MISMATCH_TRACES, "now-1h", "now"),
                f"Tempo: {MISMATCH_TRACES}",
            ).icon("external link")
        )
    )
    return with_rows(dash, ROWS)
