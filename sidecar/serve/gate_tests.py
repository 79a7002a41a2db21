"""The gate's sequential tests, one row each: the one table the gate, its checks, its margins,
the overview dashboard, the benches and the docs read.

A row says what the test is called in the gate's table (and against the baseline, and as a
margin), which events of RAGFlow's processes it reads (``sidecar.wire.contract``: what it counts
and what that happens to, or the histogram it samples), its statistic, its non-inferiority
margin's setting if it has one, and the overview panel that shows its quantity. ``gate_stats``,
``baseline``, ``margins``, ``gate_checks``, ``gate`` and the benches derive their lists from
these rows; ``tests/test_gate_tests.py`` checks the margins' settings, the panels named (on the
overview, ``dashboards/served_share.py``) and the table in docs/operations.md against them. A
new test is a row here and its test, plus what docs/changing.md lists for what it needs more.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Literal

from sidecar.wire.contract import Event, Latency

# count: Kafka's rate of an event per exposure against Redis's, two-sample; fixed_rate: Kafka's
# against a fixed rate (Redis has no such event); latency: the whole distribution of a time.
Statistic = Literal["count", "fixed_rate", "latency"]
# Retries come in clusters: a crashed executor hands all its tasks in hand back at once (up to
# RAGFlow's 5 slots, often of one document, so of one path). The test divides retried tasks by
# the largest cluster, so that a crash weighs as one event at most, as the test's independent
# units must (an overdispersion correction; bench/gate_simulate.py simulates crashes of 1-8).
RETRY_CLUSTER: Final = 5.0


@dataclass(frozen=True)
class Margin:
    """A non-inferiority margin (``sidecar/serve/margins.py``): its variable, the field of
    ``GateSettings`` it sets, and its unit (points of a rate, or a ratio of typical times)."""

    variable: str
    field: str
    unit: Literal["points", "ratio"]


@dataclass(frozen=True)
class GateTest:
    """One sequential test of the served evidence, Kafka's path against Redis's."""

    name: str  # the test's name in --json (SequentialResult.name)
    label: str  # its row in the gate's table
    told: str  # what a roll-back says about Kafka
    statistic: Statistic
    # What a roll-back says against the baseline (the watch at 100 %): "<told> did before"
    # unless given.
    told_baseline: str = ""
    counted: Event | None = None  # count tests: the event counted
    exposures: tuple[Event, ...] = ()  # ... and what it happens to (summed)
    exposure_name: str = ""  # ... that exposure, in details' keys and for people
    sampled: Latency | None = None  # latency tests: the histogram read
    cluster: float = 1.0  # events that come together count as one unit at most
    margin: Margin | None = None
    panel: str | None = None  # the overview's served-share panel showing its quantity

    @property
    def told_against_baseline(self) -> str:
        return self.told_baseline or f"{self.told} did before"

    @property
    def reads(self) -> str:
        """What it reads, for people: ``counted per exposure``, or the histogram."""
        if self.sampled is not None:
            return f"histogram `{self.sampled}`"
        return f"`{self.counted}` per " + " + ".join(f"`{e}`" for e in self.exposures)

    @property
    def events(self) -> tuple[str, ...]:
        """What it reads of the evidence: events, or the histogram sampled."""
        if self.sampled is not None:
            return (self.sampled,)
        return tuple(e for e in (self.counted, *self.exposures) if e is not None)


GATE_TESTS: Final[tuple[GateTest, ...]] = (
    GateTest(
        "failed",
        "failed documents",
        "kafka fails more than redis",
        statistic="count",
        counted="document_failed",
        exposures=("document_finished",),
        exposure_name="finished_documents",
        margin=Margin("GATE_FAILED_MARGIN_POINTS", "failed_margin_points", "points"),
        panel="Failure rate per path",
    ),
    GateTest(
        "retried",
        "retried per started",
        "kafka retries more than redis",
        statistic="count",
        counted="retried",
        exposures=("started",),
        exposure_name="started",
        cluster=RETRY_CLUSTER,
    ),
    GateTest(
        "dead_lettered",
        "dead_lettered per consumed",
        "kafka dead-letters more than allowed",
        statistic="fixed_rate",
        told_baseline="kafka dead-letters more than redis did before",
        counted="dead_lettered",
        exposures=("started", "dead_lettered"),
        exposure_name="consumed",
    ),
    GateTest(
        "processing",
        "processing time",
        "kafka processes slower than redis",
        statistic="latency",
        sampled="document_processing",
        margin=Margin("GATE_PROCESSING_MARGIN_RATIO", "processing_margin_ratio", "ratio"),
        panel="Processing p99 per path",
    ),
    GateTest(
        "queue_wait",
        "queue wait",
        "kafka's tasks wait longer than redis's",
        statistic="latency",
        sampled="document_queue_wait",
        margin=Margin("GATE_QUEUE_WAIT_MARGIN_RATIO", "queue_wait_margin_ratio", "ratio"),
    ),
)
BY_NAME: Final[Mapping[str, GateTest]] = MappingProxyType({t.name: t for t in GATE_TESTS})

TESTS: Final = tuple(t.name for t in GATE_TESTS)
COUNT_TESTS: Final = tuple(t.name for t in GATE_TESTS if t.counted is not None)
LATENCY_TESTS: Final = tuple(t.name for t in GATE_TESTS if t.sampled is not None)
MARGIN_TESTS: Final = tuple(t.name for t in GATE_TESTS if t.margin is not None)
# The event each count test counts, what it happens to per path (its exposure), and its name.
COUNTED: Final[Mapping[str, Event]] = MappingProxyType(
    {t.name: t.counted for t in GATE_TESTS if t.counted is not None}
)
EXPOSURES: Final = MappingProxyType({t.name: t.exposures for t in GATE_TESTS if t.counted})
EXPOSURE_NAMES: Final = MappingProxyType({t.name: t.exposure_name for t in GATE_TESTS if t.counted})
# The histogram each latency test reads.
SAMPLED: Final[Mapping[str, Latency]] = MappingProxyType(
    {t.name: t.sampled for t in GATE_TESTS if t.sampled is not None}
)
# The table's rows: the test's name and what a roll-back says, against Redis and the baseline.
TEST_NAMES: Final = MappingProxyType({t.name: (t.label, t.told) for t in GATE_TESTS})
BASELINE_NAMES: Final = MappingProxyType(
    {t.name: (f"{t.label} vs baseline", t.told_against_baseline) for t in GATE_TESTS}
)
MARGIN_PREFIX: Final = "margin: "
MARGIN_NAMES: Final = MappingProxyType(
    {t.name: f"{MARGIN_PREFIX}{t.label}" for t in GATE_TESTS if t.margin is not None}
)


def margin_of(name: str) -> Margin:
    """The margin of test ``name``; a test without one is a ``KeyError`` naming it."""
    margin = BY_NAME[name].margin
    if margin is None:
        raise KeyError(f"the gate test {name!r} has no margin")
    return margin


def markdown_table() -> str:
    """The tests as docs/operations.md lists them (a test keeps the two the same)."""
    lines = [
        "| test | gate row | reads | statistic | margin | overview panel |",
        "|---|---|---|---|---|---|",
    ]
    for t in GATE_TESTS:
        margin = f"`{t.margin.variable}`" if t.margin else "-"
        lines.append(
            f"| `{t.name}` | {t.label} | {t.reads} | {t.statistic} | {margin} | {t.panel or '-'} |"
        )
    return "\n".join(lines) + "\n"
