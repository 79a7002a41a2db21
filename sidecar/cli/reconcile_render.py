"""The text and JSON renderings of a :class:`~sidecar.cli.reconcile_report.ReconcileReport`.

Apart from the accounting so that ``reconcile.py`` stays readable; ``sidecar.cli.reconcile``
re-exports both functions.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from sidecar.cli.reconcile_report import ReconcileReport

SAMPLE_LIMIT = 20  # ids listed per kind in the table; --json lists every one


def render_report(report: ReconcileReport) -> str:
    """The per-stream table, then samples of missing ids, duplicates and order violations."""
    columns = (
        ("stream", lambda s: s.stream),
        ("written", lambda s: s.written),
        ("in share", lambda s: s.in_share),
        ("undecodable", lambda s: s.undecodable),
        ("outside", lambda s: s.outside_share),
        ("found", lambda s: s.found),
        ("in topics", lambda s: s.in_task_topics),
        ("dead-lettered", lambda s: s.dead_lettered),
        ("drained", lambda s: s.drained),
        ("missing", lambda s: len(s.missing)),
        ("duplicated", lambda s: len(s.duplicated)),
        ("extra records", lambda s: s.extra_records),
        ("order violations", lambda s: len(s.order_violations)),
    )
    rows = [[str(cell(s)) for _, cell in columns] for s in report.streams.values()]
    header = [title for title, _ in columns]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        f"window {report.window['from_id']} .. {report.window['to_id']}, "
        f"traffic share {report.traffic_percent:g} %, {report.kafka_records} Kafka records read",
        "  ".join(
            h.ljust(w) if i == 0 else h.rjust(w)
            for i, (h, w) in enumerate(zip(header, widths, strict=True))
        ),
    ]
    for row in rows:
        lines.append(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    for s in report.streams.values():
        lines += _samples(f"{s.stream}: missing", s.missing)
        lines += _samples(
            f"{s.stream}: duplicated (id x records)",
            (f"{entry_id} x{count}" for entry_id, count in s.duplicated.items()),
        )
        lines += _samples(
            f"{s.stream}: order violations",
            (
                f"{v.topic}[{v.partition}] key {v.key}: {v.earlier} after {v.later}"
                for v in s.order_violations
            ),
        )
    if report.absent_topics:
        lines.append(
            f"topics absent from Kafka: {', '.join(report.absent_topics)} (run init-topics); "
            "entries routed there count as missing"
        )
    if not report.kafka_complete:
        lines.append("Kafka did not answer to the end of its partitions: the count is incomplete")
    lines += report.served.lines()
    if report.ok:
        lines.append("OK: nothing missing")
        return "\n".join(lines)
    problems = []
    if report.missing or not report.kafka_complete:
        problems.append(
            f"{report.missing} entries missing"
            + ("" if report.kafka_complete else " (or not read)")
        )
    if report.served.problems:
        problems.append(f"{len(report.served.problems)} drained records not in Redis as moved")
    lines.append("NOT OK: " + "; ".join(problems))
    return "\n".join(lines)


def _samples(title: str, items: Iterable[str]) -> list[str]:
    listed = list(items)
    if not listed:
        return []
    more = (
        f" (and {len(listed) - SAMPLE_LIMIT} more; --json lists all)"
        if len(listed) > SAMPLE_LIMIT
        else ""
    )
    return [f"{title}: {', '.join(listed[:SAMPLE_LIMIT])}{more}"]


def render_json(report: ReconcileReport) -> str:
    return json.dumps(report.to_dict(), indent=2, sort_keys=True)
