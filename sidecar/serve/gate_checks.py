"""The gate's checks: judged and served evidence against ``GateSettings``, each row ``ok``,
``hold``, ``rollback`` or ``n/a``; the worst row decides (``sidecar/serve/gate.py`` reads the
evidence).

Judged verdicts are checked against fixed levels: a mismatch is a wrong result, not noise.
Served evidence goes through the sequential tests of ``gate_stats`` (Kafka's path worse than
Redis's), once each path has finished ``GATE_MIN_DOCUMENTS`` documents; with a baseline (the
watch at 100 %, ``sidecar/serve/baseline.py``) also through the same five questions of the
Kafka minutes after it against the baseline, ``GATE_ALPHA`` then split in halves between the
two kinds. Kept free of I/O so that every rule can be read, and tried, on its own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from sidecar.config.serve import GateSettings
from sidecar.serve.baseline import Baseline, run_baseline_tests
from sidecar.serve.gate_stats import SequentialResult, run_tests
from sidecar.serve.gate_tests import BASELINE_NAMES, MARGIN_NAMES, MARGIN_PREFIX, TEST_NAMES, TESTS
from sidecar.serve.margins import MarginResult, run_margins
from sidecar.wire.contract import PATHS
from sidecar.wire.evidence import Evidence

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
    effect: str = ""  # a sequential test's effect estimate
    # More documents per path that would decide a hold (an estimate; see gate_stats).
    needed: dict[str, int] | None = None
    test: SequentialResult | None = None  # the sequential test behind the row, if any

    def to_dict(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "check": self.name,
            "value": self.value,
            "shown": self.shown,
            "threshold": self.threshold,
            "verdict": self.verdict,
            "reason": self.reason,
            "needed": self.needed,
        }
        if self.test is not None:
            row["test"] = {
                "name": self.test.name,
                "e_value": self.test.e_value,
                "alpha": self.test.alpha,
                "threshold": self.test.threshold,
                "hold_level": self.test.hold_level,
                "effect": self.effect,
                **self.test.details,
            }
        return row


def analyse(
    gate: GateSettings,
    judged: Judged,
    served: Evidence,
    minutes: Sequence[Evidence],
    *,
    served_active: bool,
    baseline: Baseline | None = None,
    watched: Sequence[Evidence] = (),
    next_share: float | None = 1.0,
) -> list[Check]:
    """The checks, each ``ok``, ``hold``, ``rollback`` or ``n/a``; the worst one decides.
    ``minutes`` are the window's minute buckets in time order, ``served`` their sum; with a
    ``baseline``, ``watched`` are the minutes after it, whose Kafka path is tested against it;
    ``next_share`` (0-1]: the share a promotion would serve, which sets the margins
    (``margins.margin_at``); ``None`` at a plan's last step, which has no step after it: its
    margins, the harm at 100 %, were shown at the step before, and the harm tests go on."""
    return [
        *_judged_checks(gate, judged),
        *_served_checks(gate, served, minutes, served_active, baseline),
        *(
            _margin_checks(gate, minutes, next_share)
            if served_active and next_share is not None
            else []
        ),
        *(_baseline_checks(gate, baseline, watched, served_active) if baseline else []),
    ]


def split_alpha(alpha: float, baseline: bool) -> float:
    """The share of ``GATE_ALPHA`` of each kind of test (the paths' minutes, the baseline):
    all of it without a baseline, half with one. Raising the two-sample tests' threshold when a
    baseline comes in only makes them harder to cross, so their guarantee for the whole
    rollout stands."""
    return alpha / 2 if baseline else alpha


def _judged_checks(gate: GateSettings, judged: Judged) -> list[Check]:
    n, least = judged.judged, gate.min_verdicts
    enough = n >= least
    checks = [
        Check(
            "judged verdicts",
            n,
            str(n),
            f"≥ {least}",
            "ok" if enough else "hold",
            "" if enough else f"only {n} judged verdicts (GATE_MIN_VERDICTS={least})",
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


def _served_checks(
    gate: GateSettings,
    served: Evidence,
    minutes: Sequence[Evidence],
    active: bool,
    baseline: Baseline | None = None,
) -> list[Check]:
    least = gate.min_documents
    if not active:
        idle = "n/a: nothing served from Kafka (KAFKA_SERVE_PERCENT=0, no Kafka tasks seen)"
        counts = [(path, served[path]["document_finished"]) for path in PATHS]
        return [
            *(Check(f"finished ({p})", n, str(n), f"≥ {least}", "n/a", idle) for p, n in counts),
            *(Check(TEST_NAMES[t][0], None, "-", "n/a", "n/a", idle) for t in TESTS),
        ]
    checks = []
    for path in PATHS:
        n = served[path]["document_finished"]
        if n >= least:
            checks.append(Check(f"finished ({path})", n, str(n), f"≥ {least}", "ok"))
        elif path == "redis" and baseline is not None:
            # At 100 % the window has no Redis to speak of: the baseline's size is checked.
            checks.append(Check(f"finished ({path})", n, str(n), "baseline instead", "n/a"))
        else:
            short = (
                f"only {n} {path}-path documents finished (GATE_MIN_DOCUMENTS={least}): "
                f"{least - n} more needed"
            )
            needed: dict[str, int] = {path: least - n}
            checks.append(
                Check(f"finished ({path})", n, str(n), f"≥ {least}", "hold", short, "", needed)
            )
    alpha = split_alpha(gate.alpha, baseline is not None)
    tests = run_tests(
        minutes, alpha, gate.latency_floor_ms, dead_letter_rate=gate.dead_letter_percent / 100
    )
    checks += [_test_check(test) for test in tests]
    return checks


def _baseline_checks(
    gate: GateSettings, baseline: Baseline, watched: Sequence[Evidence], active: bool
) -> list[Check]:
    """The baseline's size, then the five tests of the watched Kafka minutes against it."""
    least, n = gate.min_documents, baseline.redis["document_finished"]
    label = f"finished (redis baseline, {len(watched)} min watched)"
    if not active:
        return []
    if n < least:
        # A baseline this small would move its margin so far the tests could not see much.
        short = f"only {n} redis documents finished in the baseline (GATE_MIN_DOCUMENTS={least})"
        return [Check(label, n, str(n), f"≥ {least}", "hold", short)]
    alpha = split_alpha(gate.alpha, True)
    tests = run_baseline_tests(baseline.redis, watched, alpha, gate.latency_floor_ms)
    return [Check(label, n, str(n), f"≥ {least}", "ok"), *map(_test_check, tests)]


def _test_check(test: SequentialResult) -> Check:
    name, told = (BASELINE_NAMES if test.against == "baseline" else TEST_NAMES)[test.name]
    shown = f"{test.e_value:.3g}"
    threshold = f"≥ {test.threshold:.3g} (hold ≥ {test.hold_level:.3g})"
    verdict = test.verdict
    if verdict == "rollback":
        reason = f"{told}: e-value {shown} ≥ {test.threshold:.3g}; {test.effect}"
    elif verdict == "hold":
        needed = (
            "; about "
            + " and ".join(f"{n} {path}" for path, n in test.needed.items())
            + " documents more would decide"
            if test.needed
            else ""
        )
        reason = (
            f"{told}, not yet proven: e-value {shown} ≥ {test.hold_level:.3g} of "
            f"{test.threshold:.3g}; {test.effect}{needed}"
        )
    else:
        reason = ""
    return Check(name, test.e_value, shown, threshold, verdict, reason, test.effect,
                 test.needed, test)  # fmt: skip


def _margin_checks(gate: GateSettings, minutes: Sequence[Evidence], share: float) -> list[Check]:
    """Non-inferiority, one row a margin: ``ok`` once shown, ``hold`` until then."""
    results = run_margins(minutes, gate.margins, share, gate.margin_alpha, gate.latency_floor_ms)
    return [_margin_check(result, share) for result in results]


def _margin_check(result: MarginResult, share: float) -> Check:
    name = MARGIN_NAMES[result.name]
    threshold = f"< {result.shown_as(result.margin)} (next share {100 * share:g} %)"
    shown = f"≤ {result.shown_as(result.upper)}"
    if result.shown:
        return Check(name, result.upper, shown, threshold, "ok")
    needed = {"kafka": result.needed} if result.needed else None
    more = (
        f"; about {result.needed} kafka documents more would show it"
        if result.needed
        else "; it cannot be shown while kafka's estimate is above the margin"
        if result.estimate is not None
        else ""
    )
    reason = (
        f"kafka not shown within the margin ({name.removeprefix(MARGIN_PREFIX)}): kafka - redis "
        f"{result.shown_as(result.estimate)}, at most {result.shown_as(result.upper)} over "
        f"{result.documents} kafka documents, margin {result.shown_as(result.margin)} at the "
        f"next share ({100 * share:g} %){more}"
    )
    return Check(name, result.upper, shown, threshold, "hold", reason, "", needed)
