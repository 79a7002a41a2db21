"""What ``reconcile`` finds: per stream, the entries accounted for, missing, duplicated and
out of order. A module of its own so that the accounting and its renderings both stand on it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from sidecar.cli.reconcile_served import ServedAccount


@dataclass
class OrderViolation:
    """``earlier`` (XADDed first) was found in ``topic[partition]`` after ``later``."""

    topic: str
    partition: int
    key: str
    earlier: str
    later: str


@dataclass
class StreamReconciliation:
    """The accounting of one stream's entries in the window."""

    stream: str
    written: int = 0  # entries in the window
    in_share: int = 0  # valid tasks whose key is in the traffic share
    undecodable: int = 0  # entries the mirror dead-letters (not a task)
    outside_share: int = 0  # valid tasks left on Redis only
    found: int = 0  # expected entries with at least one record in Kafka
    in_task_topics: int = 0
    dead_lettered: int = 0  # expected entries found in the DLQ
    missing: list[str] = field(default_factory=list)
    duplicated: dict[str, int] = field(default_factory=dict)  # entry id -> records
    unexpected: int = 0  # entries outside the share that are in Kafka all the same
    drained: int = 0  # expected entries written by drain-to-redis (their record is served)
    order_violations: list[OrderViolation] = field(default_factory=list)

    @property
    def expected(self) -> int:
        return self.in_share + self.undecodable

    @property
    def extra_records(self) -> int:
        """Records beyond the first per entry: what duplicates cost in Kafka."""
        return sum(count - 1 for count in self.duplicated.values())


@dataclass
class ReconcileReport:
    """Every stream's accounting; ``ok`` when nothing expected is missing."""

    streams: dict[str, StreamReconciliation]
    window: dict[str, str]
    traffic_percent: float
    kafka_complete: bool = True
    kafka_records: int = 0
    absent_topics: list[str] = field(default_factory=list)
    served: ServedAccount = field(default_factory=ServedAccount)

    @property
    def missing(self) -> int:
        return sum(len(s.missing) for s in self.streams.values())

    @property
    def ok(self) -> bool:
        return self.kafka_complete and self.missing == 0 and not self.served.problems

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "window": self.window,
            "traffic_percent": self.traffic_percent,
            "kafka_complete": self.kafka_complete,
            "kafka_records_read": self.kafka_records,
            "absent_topics": self.absent_topics,
            "served": self.served.to_dict(),
            "streams": {
                name: {
                    **asdict(s),
                    "expected": s.expected,
                    "extra_records": s.extra_records,
                }
                for name, s in self.streams.items()
            },
        }
