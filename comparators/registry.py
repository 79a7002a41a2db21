"""The comparators, one row each: the one list the judge, the metrics and the docs read.

A row names the comparator (the ``comparator`` label of ``ragflow_sidecar_mismatches_total``
and the key of a verdict record's ``comparators``), builds it from the judge's settings, says
what it compares and which kinds of :class:`Difference` it can report, and whether those make a
``mismatch`` or only a finding. ``sidecar/verdicts/compare.py`` builds its comparators from
these rows, the metric's labels exported at 0 are the mismatch rows' names, and the docs and
the drill-down dashboard point here (``python -m comparators`` prints the table) rather than
list them (``tests/test_comparator_registry.py`` checks they do).
A new comparator is its module here, one row (with ``sides``: what it compares of the two runs'
recorded facts, so the judge runs it without a line of its own), and its test
(``tests/test_comparators.py``, with an example pair the registry's test runs).

The first five rows have no ``sides``: ``compare.py`` wires each by hand, for a reason of its
own (the payload's bytes and the digest shortcut, the outcome's task type and noise, the
routing's expected topic per entry, ordering's fact from the shadow, delivery's timings).

Ordering is judged live, but not by :class:`OrderingComparator`. The judge sees one joined
entry at a time, never a key's whole sequence on both paths, and the only order that matters
is the one the Kafka consumer hands tasks out in, before they run concurrently. So the shadow
checks it as it consumes (:class:`OrderTracker`, ``sidecar/shadow/shadow.py``), and only where
order was promised: one mirror consumer sent the key (``x-mirror-consumer``) and the entry was
not taken over or read again (``x-mirror-claimed``), ``sidecar/shadow/records.py``'s
``order_key``. It files the violation with the Kafka run (``order_violation``) and the judge
reports it under ``ordering``. :class:`OrderingComparator` is the same rule over two whole
sequences: what the streaming check is tested against (``tests/test_comparators.py``), and the
row's ``factory`` for a caller holding both (an offline replay); it stays out of the live path,
whose row says so (``live=False``).

``NoiseBaseline`` (which outcome differences are noise) and ``outcome_digest`` (a stable name
for an outcome) are no comparators: they return no differences of their own, so have no row.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from comparators.base import Comparator
from comparators.deepdiff_adapter import DIFFERENCE_KINDS
from comparators.delivery import DeliveryComparator
from comparators.error import ErrorComparator
from comparators.ordering import OrderingComparator
from comparators.outcome import OutcomeComparator
from comparators.payload import PayloadComparator
from comparators.routing import RoutingComparator
from comparators.rules import CompareRules


def _unrouted(task_type: str, priority: int) -> str:
    raise LookupError(f"no expected topic given for {task_type!r} at priority {priority}")


@dataclass(frozen=True)
class CompareContext:
    """What the comparators are built from: ``COMPARE_RULES``, ``COMPARE_LATENCY_TOLERANCE_MS``
    and the topic a task should be routed to (the judge gives the one the mirror recorded)."""

    rules: CompareRules = field(default_factory=CompareRules)
    latency_tolerance_ms: float = 0.0
    expected_topic: Callable[[str, int], str] = _unrouted


# From the Redis run's and the Kafka run's recorded facts, the comparator's left and right.
Sides = Callable[[Mapping[str, Any], Mapping[str, Any]], tuple[Any, Any]]


@dataclass(frozen=True)
class ComparatorRow:
    """One comparator: its name, how it is built, what it compares, what it reports."""

    name: str
    factory: Callable[[CompareContext], Comparator]
    compares: str  # for people: the docs' list
    kinds: tuple[str, ...]  # every Difference.kind it can report
    mismatch: bool  # True: a difference makes a mismatch; False: a finding only
    live: bool = True  # False: the live path judges this some other way (see the row)
    sides: Sides | None = None  # None: compare.py wires it by hand


COMPARATORS: Final[tuple[ComparatorRow, ...]] = (
    ComparatorRow(
        "payload",
        lambda _: PayloadComparator(),
        "the task's JSON as RAGFlow enqueued it on Redis, against the copy read from Kafka",
        ("undecodable", *DIFFERENCE_KINDS),
        mismatch=True,
    ),
    ComparatorRow(
        "outcome",
        lambda context: OutcomeComparator(context.rules),
        "what each path's handler produced, under the task type's rules, less the noise",
        DIFFERENCE_KINDS,
        mismatch=True,
    ),
    ComparatorRow(
        "routing",
        lambda context: RoutingComparator(context.expected_topic),
        "the topic, priority and task type the Kafka record carries, against Redis's",
        ("routing",),
        mismatch=True,
    ),
    ComparatorRow(
        "ordering",
        lambda _: OrderingComparator(),
        "per-key order: the Kafka consumer's against the Redis stream's",
        ("order",),
        mismatch=True,
        live=False,
    ),
    ComparatorRow(
        "delivery",
        lambda context: DeliveryComparator(context.latency_tolerance_ms),
        "deliveries (once each) and queue wait (within the tolerance) on each path",
        ("duplicate", "latency"),
        mismatch=False,
    ),
    ComparatorRow(
        "error",
        lambda _: ErrorComparator(),
        "the handler's error on each path: one failing alone, or each of another type",
        ("failed", "error_changed"),
        mismatch=True,
        sides=lambda redis_run, kafka_run: (redis_run.get("error"), kafka_run.get("error")),
    ),
)
COMPARATORS_BY_NAME: Final[Mapping[str, ComparatorRow]] = MappingProxyType(
    {r.name: r for r in COMPARATORS}
)
# The comparators whose differences make a mismatch: the metric's `comparator` label values.
MISMATCH_NAMES: Final[tuple[str, ...]] = tuple(r.name for r in COMPARATORS if r.mismatch)
FINDING_NAMES: Final[tuple[str, ...]] = tuple(r.name for r in COMPARATORS if not r.mismatch)


def markdown_table() -> str:
    """The comparators for people (``python -m comparators`` prints it)."""
    lines = ["| comparator | compares | kinds | makes |", "|---|---|---|---|"]
    for row in COMPARATORS:
        kinds = ", ".join(f"`{kind}`" for kind in row.kinds)
        makes = "mismatch" if row.mismatch else "finding"
        lines.append(f"| `{row.name}` | {row.compares} | {kinds} | {makes} |")
    return "\n".join(lines) + "\n"


def build_comparators(context: CompareContext, *, live_only: bool = True) -> dict[str, Comparator]:
    """Every row's comparator by name, built from ``context`` (the live ones by default)."""
    return {row.name: row.factory(context) for row in COMPARATORS if row.live or not live_only}
