"""The gate's checks: judged and served evidence against ``GateSettings``, each row ``ok``,
``hold``, ``rollback`` or ``n/a``; the worst row decides (``sidecar/serve/gate.py`` reads the
evidence).

Kept free of I/O so that every rule can be read, and tried, on its own.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from ragflow_mq.contract import PATHS
from ragflow_mq.evidence import Evidence, PathEvidence
from sidecar.config.serve import GateSettings

PROMOTE: Final = 0
HOLD: Final = 1
ROLLBACK: Final = 3
DECISIONS: Final = {PROMOTE: "promote", HOLD: "hold", ROLLBACK: "rollback"}
CheckVerdict = Literal["ok", "hold", "rollback", "n/a"]
FINAL_VERDICTS: Final = ("match", "mismatch", "missing_in_kafka", "missing_in_redis", "error")


@dataclass
class Judged:
    """Final verdicts of the window about this deployment's streams, by kind."""

    kinds: Counter[str] = field(default_factory=Counter)
    duplicates: int = 0
    complete: bool = True  # False: the verdicts topic was not read to its end

    @property
    def judged(self) -> int:
        return sum(self.kinds.values())

    @property
    def match_percent(self) -> float | None:
        return 100.0 * self.kinds["match"] / self.judged if self.judged else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "judged": self.judged,
            "match_percent": self.match_percent,
            **{kind: self.kinds[kind] for kind in FINAL_VERDICTS},
            "duplicate": self.duplicates,
            "complete": self.complete,
        }


@dataclass(frozen=True)
class Check:
    """One row of the table: what was measured, against what, and what it says."""

    name: str
    value: float | None
    shown: str
    threshold: str
    verdict: CheckVerdict
    reason: str = ""  # why it holds or rolls back; empty when ok

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.name,
            "value": self.value,
            "shown": self.shown,
            "threshold": self.threshold,
            "verdict": self.verdict,
            "reason": self.reason,
        }


def analyse(
    gate: GateSettings, judged: Judged, served: Evidence, *, served_active: bool
) -> list[Check]:
    """The checks, each ``ok``, ``hold``, ``rollback`` or ``n/a``; the worst one decides."""
    return [*_judged_checks(gate, judged), *_served_checks(gate, served, served_active)]


def _judged_checks(gate: GateSettings, judged: Judged) -> list[Check]:
    n, least = judged.judged, gate.min_sample
    enough = n >= least
    checks = [
        Check(
            "judged verdicts",
            n,
            str(n),
            f"≥ {least}",
            "ok" if enough else "hold",
            "" if enough else f"only {n} judged verdicts (GATE_MIN_SAMPLE={least})",
        )
    ]
    if not judged.complete:
        checks.append(
            Check(
                "verdicts topic read",
                None,
                "incomplete",
                "to its end",
                "hold",
                "the verdicts topic was not read to its end (Kafka stopped answering)",
            )
        )
    rate, floor = judged.match_percent, gate.min_match_percent
    threshold = f"≥ {floor:g} %"
    if rate is None:
        checks.append(Check("match rate", None, "-", threshold, "n/a"))
    elif rate >= floor:
        checks.append(Check("match rate", rate, f"{rate:.2f} %", threshold, "ok"))
    else:
        # Below the floor on a small sample is no proof either way: hold, do not roll back.
        checks.append(
            Check(
                "match rate",
                rate,
                f"{rate:.2f} %",
                threshold,
                "rollback" if enough else "hold",
                f"match rate {rate:.2f} % < {floor:g} % over {n} judged verdicts",
            )
        )
    missing_in_kafka = judged.kinds["missing_in_kafka"]
    missing_in_redis = judged.kinds["missing_in_redis"]
    missing = missing_in_kafka + missing_in_redis
    over = missing > gate.max_missing
    checks.append(
        Check(
            "missing_in_kafka + missing_in_redis",
            missing,
            f"{missing} ({missing_in_kafka} + {missing_in_redis})",
            f"≤ {gate.max_missing}",
            "rollback" if over else "ok",
            f"{missing_in_kafka} missing_in_kafka + {missing_in_redis} missing_in_redis > "
            f"GATE_MAX_MISSING={gate.max_missing}"
            if over
            else "",
        )
    )
    return checks


def _served_checks(gate: GateSettings, served: Evidence, active: bool) -> list[Check]:
    redis, kafka = served["redis"], served["kafka"]
    least = gate.min_sample
    if not active:
        idle = "n/a: nothing served from Kafka (KAFKA_SERVE_PERCENT=0, no Kafka tasks seen)"
        counts = [(path, served[path]["finished"]) for path in PATHS]
        return [
            *(Check(f"finished ({p})", n, str(n), f"≥ {least}", "n/a", idle) for p, n in counts),
            Check("failure rate delta (kafka - redis)", None, "-", "n/a", "n/a", idle),
            Check("processing p99 ratio (kafka / redis)", None, "-", "n/a", "n/a", idle),
        ]
    checks = []
    for path in PATHS:
        n = served[path]["finished"]
        if n >= least:
            checks.append(Check(f"finished ({path})", n, str(n), f"≥ {least}", "ok"))
        else:
            short = f"only {n} {path}-path tasks finished (GATE_MIN_SAMPLE={least})"
            checks.append(Check(f"finished ({path})", n, str(n), f"≥ {least}", "hold", short))
    checks.append(_failure_check(gate, redis, kafka))
    checks.append(_p99_check(gate, redis, kafka))
    return checks


def _failure_check(gate: GateSettings, redis: PathEvidence, kafka: PathEvidence) -> Check:
    name = "failure rate delta (kafka - redis)"
    limit, warn = gate.max_failure_delta_pp, gate.warn_failure_delta_pp
    threshold = f"≤ {limit:g} pp (warn {warn:g})"
    kafka_rate, redis_rate = kafka.failure_rate(), redis.failure_rate()
    if kafka_rate is None or redis_rate is None:
        return Check(name, None, "-", threshold, "hold", "no finished task on a path to compare")
    delta = 100.0 * (kafka_rate - redis_rate)
    shown = f"{delta:+.2f} pp ({100 * kafka_rate:.2f} % vs {100 * redis_rate:.2f} %)"
    if min(kafka["finished"], redis["finished"]) < gate.min_sample:
        return Check(name, delta, shown, threshold, "hold", "too few finished tasks to compare")
    told = f"kafka fails {delta:+.2f} pp more than redis"
    if delta > limit:
        return Check(name, delta, shown, threshold, "rollback", f"{told} (> {limit:g})")
    if delta > warn:
        return Check(name, delta, shown, threshold, "hold", f"{told} (> warn {warn:g})")
    return Check(name, delta, shown, threshold, "ok")


def _p99_check(gate: GateSettings, redis: PathEvidence, kafka: PathEvidence) -> Check:
    name = "processing p99 ratio (kafka / redis)"
    limit, warn = gate.max_p99_ratio, gate.warn_p99_ratio
    threshold = f"≤ {limit:g} (warn {warn:g})"
    kafka_p99, redis_p99 = (
        kafka.quantile_ms("processing", 0.99),
        redis.quantile_ms("processing", 0.99),
    )
    if kafka_p99 is None or redis_p99 is None or redis_p99 <= 0:
        return Check(name, None, "-", threshold, "hold", "no processing time on a path to compare")
    # Below the floor a difference is noise of the bucket bounds, not a regression: tasks of
    # a few milliseconds on both paths compare as equal.
    floor = gate.p99_floor_ms
    ratio = max(kafka_p99, floor) / max(redis_p99, floor)
    shown = f"{ratio:.2f} ({kafka_p99:g} / {redis_p99:g} ms)"
    if min(kafka.samples("processing"), redis.samples("processing")) < gate.min_sample:
        return Check(name, ratio, shown, threshold, "hold", "too few processing times to compare")
    told = f"kafka processing p99 is {ratio:.2f}x redis's"
    if ratio > limit:
        return Check(name, ratio, shown, threshold, "rollback", f"{told} (> {limit:g})")
    if ratio > warn:
        return Check(name, ratio, shown, threshold, "hold", f"{told} (> warn {warn:g})")
    return Check(name, ratio, shown, threshold, "ok")
