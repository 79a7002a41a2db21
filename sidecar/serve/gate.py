"""``ragflow-sidecar gate``: canary analysis of the served share, and its roll-back.

Two kinds of evidence over one window decide whether the share may go up:

- judged: the final verdicts the sidecar published about the mirrored streams (``match`` rate,
  ``missing_*`` counts), read from the verdicts topic without a consumer group;
- served: what RAGFlow's own processes recorded per path (``ragflow_mq.recorder``) while they
  executed tasks from Redis and from Kafka, minute by minute: failed, retried and
  dead-lettered tasks, processing and queue-wait times, compared by sequential tests whose
  error rate (``GATE_ALPHA``) holds however often the gate is asked over a window that starts
  at a fixed time (``sidecar/serve/gate_stats.py``);
- with a baseline (the watch at 100 %, where no Redis is left to compare with): the Redis
  path's served evidence over a window before, against which the Kafka minutes after it are
  tested (``sidecar/serve/baseline.py``).

The decision is an exit code: 0 promote, 1 hold (not enough evidence, or a warning level
crossed), 3 roll back. ``--apply`` acts on a roll-back only, by setting the live share to 0
(``sidecar.serve.share``); it never raises anything. Raising is the operator's: ``shift --to``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sidecar.config import Settings
from sidecar.errors import ConfigError
from sidecar.serve.baseline import Baseline
from sidecar.serve.gate_checks import (
    DECISIONS,
    FINAL_VERDICTS,
    HOLD,
    PROMOTE,
    ROLLBACK,
    Check,
    Judged,
    analyse,
    split_alpha,
)
from sidecar.serve.gate_source import (
    GateSource,
    OneLook,
)
from sidecar.serve.gate_tests import BASELINE_NAMES, TEST_NAMES, TESTS
from sidecar.verdicts.reader import parse_since
from sidecar.wire.contract import EVENTS, EVIDENCE_TTL_S, PATHS
from sidecar.wire.evidence import Evidence, PathEvidence
from sidecar.wire.share import ShareValues

TESTED_NAMES = frozenset(
    name for names in (TEST_NAMES, BASELINE_NAMES) for name, _ in names.values()
)


@dataclass
class GateReport:
    """Everything the gate saw over one window, its checks and the decision they make."""

    since_ms: int
    until_ms: int
    judged_share: float  # KAFKA_TRAFFIC_PERCENT
    served_share: float  # KAFKA_SERVE_PERCENT: the ceiling
    share: ShareValues  # the live share (and an old cap) as stored
    judged: Judged
    served: Evidence
    served_active: bool
    alpha: float  # GATE_ALPHA, split evenly over the sequential tests
    checks: list[Check]
    action: str | None = None  # what --apply did
    baseline: Baseline | None = None  # the Redis path before the watch, when one is compared

    @property
    def per_test(self) -> float:
        """Each test's share of ``GATE_ALPHA`` (a baseline test's is half margin, half test)."""
        return split_alpha(self.alpha, self.baseline is not None) / len(TESTS)

    @property
    def decision(self) -> int:
        verdicts = {check.verdict for check in self.checks}
        return ROLLBACK if "rollback" in verdicts else HOLD if "hold" in verdicts else PROMOTE

    @property
    def reasons(self) -> list[str]:
        # Roll-back reasons first: they are what an operator must act on.
        order = {"rollback": 0, "hold": 1}
        failing = [check for check in self.checks if check.verdict in order]
        return [check.reason for check in sorted(failing, key=lambda c: order[c.verdict])]

    def to_dict(self) -> dict[str, Any]:
        return {
            "window": {
                "since_ms": self.since_ms,
                "until_ms": self.until_ms,
                "seconds": (self.until_ms - self.since_ms) / 1000,
            },
            "share": {
                "judged": self.judged_share,
                "ceiling": self.served_share,
                "live": self.share.live,
                "old_cap": self.share.old_cap,
                "served": self.share.served(self.served_share),
            },
            "judged": self.judged.to_dict(),
            "served": {
                "active": self.served_active,
                **{path: _path_dict(self.served[path]) for path in PATHS},
            },
            "baseline": None
            if self.baseline is None
            else {
                "since_ms": self.baseline.since_ms,
                "until_ms": self.baseline.until_ms,
                "redis": _path_dict(self.baseline.redis),
            },
            "alpha": {"total": self.alpha, "per_test": self.per_test},
            "checks": [check.to_dict() for check in self.checks],
            "decision": {
                "code": self.decision,
                "name": DECISIONS[self.decision],
                "reasons": self.reasons,
            },
            "action": self.action,
        }


def _path_dict(path: PathEvidence) -> dict[str, Any]:
    rate = path.failure_rate()
    return {
        **{event: path[event] for event in EVENTS},
        "failure_percent": None if rate is None else 100.0 * rate,
        **{
            f"{latency}_p{round(q * 100)}_ms": path.quantile_ms(latency, q)
            for latency in ("processing", "queue_wait")
            for q in (0.5, 0.99)
        },
        "processing_samples": path.samples("processing"),
    }


def parse_window(text: str, now_ms: int, option: str = "--window") -> int:
    """``--window`` (or ``--baseline``): the start of the window (``30m``, ``2h``, an ISO time,
    epoch ms)."""
    try:
        since_ms = parse_since(text, now_ms)
    except ConfigError as exc:
        raise ConfigError(option, exc.problem) from None
    if since_ms >= now_ms:
        raise ConfigError(option, f"{text!r} does not reach into the past")
    # Older minute buckets have expired: a longer window would claim evidence it lacks.
    if now_ms - since_ms > EVIDENCE_TTL_S * 1000:
        raise ConfigError(option, f"{text!r} is longer than the {EVIDENCE_TTL_S // 3600} h kept")
    return since_ms


def parse_next_share(text: str) -> float:
    """``--next-share``: a percentage above 0, up to 100, as a fraction."""
    try:
        percent = float(text)
    except ValueError:
        raise ConfigError("--next-share", f"{text!r} is not a percentage") from None
    if not 0.0 < percent <= 100.0:  # also refuses NaN
        raise ConfigError("--next-share", f"{text} is out of range (above 0, up to 100)")
    return percent / 100


def parse_baseline(text: str, now_ms: int, since_ms: int) -> tuple[int, int]:
    """``--baseline``: from its start (as ``--window``, counted back from now) until the
    window's start ``since_ms``, so that no task is judged against itself."""
    start_ms = parse_window(text, now_ms, "--baseline")
    if start_ms >= since_ms:
        raise ConfigError("--baseline", f"{text!r} does not start before --window")
    return start_ms, since_ms


async def collect(
    settings: Settings,
    since_ms: int,
    until_ms: int,
    baseline: tuple[int, int] | None = None,
    source: GateSource | None = None,
    *,
    next_share: float | None = 1.0,
) -> GateReport:
    """Read both kinds of evidence over ``[since_ms, until_ms]`` (from ``source``, by default
    afresh) and judge them; with ``baseline`` (its since and until, ms), also the Kafka minutes
    after it against the Redis path over it."""
    source = source if source is not None else OneLook(settings)
    minutes, share = await source.served(since_ms / 1000, until_ms / 1000)
    before = None
    if baseline is not None:
        b_minutes, _ = await source.served(baseline[0] / 1000, baseline[1] / 1000)
        before = Baseline.of(*baseline, b_minutes)
    served = Evidence.from_minutes(minutes)
    judged = await source.judged(since_ms)
    kafka = served["kafka"]
    # A share of 0 that served nothing has no population to compare; one that is set, or that
    # served something (a share lowered since), must show evidence before it can be promoted.
    # The share in force is the live one: a ceiling raised ahead of the first step serves none.
    served_active = share.served(settings.serve.percent) > 0 or any(
        kafka[event] for event in ("produced", "started", "finished")
    )
    return GateReport(
        since_ms=since_ms,
        until_ms=until_ms,
        judged_share=settings.mirror.traffic_percent,
        served_share=settings.serve.percent,
        share=share,
        judged=judged,
        served=served,
        served_active=served_active,
        alpha=settings.gate.alpha,
        checks=analyse(
            settings.gate,
            judged,
            served,
            minutes,
            served_active=served_active,
            baseline=before,
            watched=before.after(minutes, since_ms) if before else (),
            next_share=next_share,
        ),
        baseline=before,
    )


def render_json(report: GateReport) -> str:
    return json.dumps(report.to_dict(), indent=2, sort_keys=True)


def render_table(report: GateReport) -> str:
    """A header (window, shares, evidence), one row per check, and the decision."""
    judged, live = report.judged, report.share.live
    lines = [
        f"gate over {_time(report.since_ms)} → {_time(report.until_ms)}",
        f"share: judged {report.judged_share:g} % (KAFKA_TRAFFIC_PERCENT), ceiling "
        f"{report.served_share:g} % (KAFKA_SERVE_PERCENT), live share "
        f"{'unset' if live is None else f'{live:g} %'}, served now "
        f"{report.share.served(report.served_share):g} %",
        f"judged: {judged.judged} final verdicts, "
        + ", ".join(f"{judged.kinds[kind]} {kind}" for kind in FINAL_VERDICTS)
        + f"; {judged.duplicates} duplicate",
        "",
        *_served_table(report.served),
        "",
    ]
    if report.baseline is not None:
        b = report.baseline
        lines[-1:-1] = [
            "",
            f"baseline (the redis path before the watch) {_time(b.since_ms)} → "
            f"{_time(b.until_ms)}:",
            *_served_table_rows([("redis baseline", b.redis)]),
        ]
    # The sequential tests in a table of their own: they have an effect and tasks needed.
    tested = [check for check in report.checks if check.name in TESTED_NAMES]
    rows: list[tuple[str, ...]] = [("check", "value", "threshold", "verdict")]
    rows += [(c.name, c.shown, c.threshold, c.verdict) for c in report.checks if c not in tested]
    lines += _columns(rows)
    if tested:
        per_test = report.per_test
        split = (
            f"{per_test:g} each: roll back at e-value ≥ 1/{per_test:g}"
            if report.baseline is None
            else f"half to the tests against redis, {per_test:g} each; half to those against "
            f"the baseline, {per_test / 2:g} each for its margin and {per_test / 2:g} for the "
            "test"
        )
        lines += [
            "",
            f"sequential tests, kafka worse than redis (GATE_ALPHA={report.alpha:g}, {split}):",
        ]
        rows = [("test", "e-value", "threshold", "effect", "still needed", "verdict")]
        rows += [
            (c.name, c.shown, c.threshold, c.effect or "-", _needed(c.needed), c.verdict)
            for c in tested
        ]
        lines += _columns(rows)
    name = DECISIONS[report.decision]
    lines += ["", f"decision: {name.upper()} (exit {report.decision})"]
    lines += [f"  - {reason}" for reason in report.reasons]
    if report.action:
        lines += ["", report.action]
    return "\n".join(lines)


def _served_table(served: Evidence) -> list[str]:
    return _served_table_rows([(path, served[path]) for path in PATHS])


def _served_table_rows(paths: Sequence[tuple[str, PathEvidence]]) -> list[str]:
    heading = ("path", *EVENTS, "failure", "processing p50/p99", "queue wait p50/p99")
    rows: list[tuple[str, ...]] = [heading]
    for path, evidence in paths:
        rate = evidence.failure_rate()
        rows.append(
            (
                path,
                *(str(evidence[event]) for event in EVENTS),
                "-" if rate is None else f"{100 * rate:.2f} %",
                _quantiles(evidence, "processing"),
                _quantiles(evidence, "queue_wait"),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(heading))]
    # Names left-aligned, numbers right-aligned.
    return [
        "  ".join(
            cell.rjust(width) if i else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]


def _quantiles(evidence: PathEvidence, latency: str) -> str:
    p50, p99 = evidence.quantile_ms(latency, 0.5), evidence.quantile_ms(latency, 0.99)
    if p50 is None or p99 is None:
        return "-"
    return f"{p50:g}/{p99:g} ms"


def _time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _columns(rows: Sequence[tuple[str, ...]]) -> list[str]:
    """Left-aligned columns; the last (the verdict) is not padded, so a line ends with it
    (easy to grep)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return [
        "  ".join([*(cell.ljust(width) for cell, width in zip(row, widths, strict=False)), row[-1]])
        for row in rows
    ]


def _needed(needed: dict[str, int] | None) -> str:
    if not needed:
        return "-"
    return ", ".join(f"{path} +{n}" for path, n in needed.items())
