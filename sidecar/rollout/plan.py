"""``rollout plan``'s parts apart from I/O: a site's recent minutes as the forecast's evidence
(``site_evidence``), the plan from the settings, and the plan as people and scripts read it."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from sidecar.config import Settings
from sidecar.rollout.forecast import (
    WEEK_HOURS,
    Forecast,
    PlanSettings,
    SiteEvidence,
    fit_within,
    forecast,
)
from sidecar.serve import histograms as hist
from sidecar.serve.gate_tests import MARGIN_TESTS, SAMPLED, margin_of
from sidecar.wire.evidence import Evidence, histograms

MINUTES_A_DAY = 1440


def plan_settings(settings: Settings) -> PlanSettings:
    rollout, gate = settings.rollout, settings.gate
    return PlanSettings(
        steps=rollout.steps,
        dwell_min=rollout.dwell_s / 60,
        min_documents=rollout.min_documents,
        margins=gate.margins,
        margin_alpha=gate.margin_alpha,
        holdback_percent=rollout.holdback_percent,
    )


def site_evidence(minutes: Sequence[Evidence], first_minute: int, floor_ms: float) -> SiteEvidence:
    """The site's evidence from its minutes (``first_minute`` the first one's number, minutes
    since the epoch): documents a minute by hour of day (both paths: before a rollout all run
    on Redis), the Redis path's failure rate and the spreads the margins will see."""
    documents = np.zeros(24)
    minutes_seen = np.zeros(24)
    failed = finished = 0
    # A minute's key lapses after EVIDENCE_TTL_S (two days): the minutes before the first one
    # that holds anything are gone (or before ragflow_mq was installed), not minutes without
    # documents, and counted as such they would dilute the rate.
    held = [
        i for i, m in enumerate(minutes) if any(p.counts or p.buckets for p in m.paths.values())
    ]
    skip = held[0] if held else len(minutes)
    for offset, minute in enumerate(minutes[skip:], start=skip):
        hour = ((first_minute + offset) % MINUTES_A_DAY) // 60
        documents[hour] += (
            minute["redis"]["document_finished"] + minute["kafka"]["document_finished"]
        )
        minutes_seen[hour] += 1
        failed += minute["redis"]["document_failed"]
        finished += minute["redis"]["document_finished"]
    by_hour = np.divide(documents, minutes_seen, out=np.zeros(24), where=minutes_seen > 0)
    if minutes_seen.any() and not minutes_seen.all():  # an hour never seen: the day's mean
        by_hour[minutes_seen == 0] = documents.sum() / minutes_seen.sum()
    spreads = {name: _spread(minutes[skip:], SAMPLED[name], floor_ms) for name in SAMPLED}
    return SiteEvidence(
        documents_per_min_by_hour=tuple(float(x) for x in by_hour),
        failure_rate=failed / finished if finished else 0.0,
        processing_variance=spreads["processing"][0],
        queue_wait_variance=spreads["queue_wait"][0],
        processing_within=spreads["processing"][1],
        queue_wait_within=spreads["queue_wait"][1],
    )


def _spread(minutes: Sequence[Evidence], latency: str, floor_ms: float) -> tuple[float, float]:
    """The variance of a Redis document's score (ln ms, under the floor merged, as the margins
    score it), and the share of it left within a minute (drift between minutes taken out)."""
    rows = []
    for minute in minutes:
        bounds, [counts] = histograms([minute["redis"]], latency)
        if sum(counts):
            merged, merged_counts = hist.merge_floor(
                bounds, np.array(counts, dtype=float), floor_ms
            )
            rows.append((hist.scores(merged), merged_counts))
    n = sum(float(c.sum()) for _, c in rows)
    if n < 2:
        return 1.0, 1.0  # nothing to go by: a lognormal spread of about 1 (sigma)
    mean = sum(float(c @ s) for s, c in rows) / n
    total = sum(float(c @ (s - mean) ** 2) for s, c in rows) / (n - 1)
    inside, freedom = 0.0, 0.0
    for scores, tally in rows:
        k = float(tally.sum())
        inside += float(tally @ (scores - float(tally @ scores) / k) ** 2)
        freedom += k - 1
    within = inside / freedom / total if freedom > 0 and total > 0 else 1.0
    return total, within


def make_plan(
    site: SiteEvidence, plan: PlanSettings, within_hours: float | None, start_hour: int
) -> dict[str, Any]:
    """The plan as data (``--json``); ``render`` prints it."""
    result = forecast(site, plan, start_hour)
    out: dict[str, Any] = {
        "documents_per_min": round(site.documents_per_min, 3),
        "failure_rate": round(site.failure_rate, 5),
        "processing_variance": round(site.processing_variance, 3),
        "queue_wait_variance": round(site.queue_wait_variance, 3),
        "hours_p50": round(result.hours_p50, 1),
        "hours_p95": round(result.hours_p95, 1),
        "steps": [
            {
                "share": step.share,
                "kafka_documents": step.kafka_documents,
                "hours_p50": round(step.hours_p50, 1),
                "hours_p95": round(step.hours_p95, 1),
                "bound_by": step.binding,
            }
            for step in result.steps
        ],
        "beyond_week": result.beyond_week,
        "bound_beyond_week": result.bound_beyond_week,
    }
    if result.beyond_week:
        out["week_margins"] = _rounded(fit_within(site, plan, WEEK_HOURS, start_hour))
    if within_hours is not None:
        out["within_hours"] = within_hours
        out["within_margins"] = _rounded(fit_within(site, plan, within_hours, start_hour))
    return out


def step_targets(site: SiteEvidence, plan: PlanSettings, start_hour: int) -> Forecast:
    """The forecast ``rollout status`` shows each step's evidence against."""
    return forecast(site, plan, start_hour)


def _rounded(margins: dict[str, float]) -> dict[str, float | None]:
    return {n: (None if math.isinf(v) else round(v, 3)) for n, v in margins.items()}


def shown(name: str, value: float | None) -> str:
    """A margin setting for people: points or a ratio, as GATE_*_MARGIN_* takes it."""
    if value is None:
        return "none within it"
    return f"{value:.2f} points" if margin_of(name).unit == "points" else f"x{value:.2f}"


def render(plan: dict[str, Any], settings: PlanSettings) -> str:
    margins = ", ".join(f"{n} {shown(n, settings.margins[n])}" for n in MARGIN_TESTS)
    lines = [
        f"site: {plan['documents_per_min']:g} documents a minute, "
        f"{100 * plan['failure_rate']:.2f} % failing; spread (variance of ln ms) processing "
        f"{plan['processing_variance']:g}, queue wait {plan['queue_wait_variance']:g}",
        f"plan: steps {', '.join(f'{s:g}' for s in settings.steps)} %, margins {margins} "
        f"at alpha {settings.margin_alpha:g}",
        f"expected to reach 100 %: about {plan['hours_p50']:g} h (p50), "
        f"{plan['hours_p95']:g} h (p95)",
        "",
        f"  {'step':>6} {'Kafka documents':>16} {'done by (p50)':>14} {'(p95)':>8}  bound by",
    ]
    lines += [
        f"  {step['share']:>5g}% {'about ' + str(step['kafka_documents']):>16} "
        f"{step['hours_p50']:>12g} h {step['hours_p95']:>6g} h  {step['bound_by']}"
        for step in plan["steps"]
    ]
    if plan["beyond_week"]:
        week = ", ".join(f"{n} {shown(n, v)}" for n, v in plan["week_margins"].items())
        sooner = (
            "no test can show these margins sooner (even a fixed-horizon one needs longer)"
            if plan["bound_beyond_week"]
            else "the gate cannot show these margins sooner"
        )
        lines += ["", f"More than a week at this site's rate: {sooner}. A week can show: {week}."]
    if "within_margins" in plan:
        hours, fit = plan["within_hours"], plan["within_margins"]
        told = ", ".join(f"{n} {shown(n, v)}" for n, v in fit.items())
        # Scaled alike, the tightest fit can loosen the margin that binds while it tightens
        # the others: when the margins in force fit, that would read as advice to loosen one.
        if plan["hours_p50"] <= hours:
            lines += ["", f"within {hours:g} h (p50): the margins above fit"]
        else:
            lines += [
                "",
                f"within {hours:g} h (p50): the margins above do not fit; the tightest that "
                f"do, all scaled alike: {told}",
            ]
    return "\n".join(lines)


def start_hour_now() -> int:
    return time.gmtime().tm_hour
