"""The mirror's counters since start."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field


@dataclass
class MirrorStats:
    """Counters since start; the metrics exporter reads these."""

    read: int = 0
    mirrored: Counter[str] = field(default_factory=Counter)  # by topic
    routes: Counter[tuple[str, str]] = field(default_factory=Counter)  # by (stream, topic)
    skipped: Counter[str] = field(default_factory=Counter)  # by reason
    dead_lettered: Counter[str] = field(default_factory=Counter)  # by reason
    unknown_task_types: Counter[str] = field(default_factory=Counter)
    produce_retries: int = 0
    batches: int = 0
    turns: int = 0  # of the loop: the liveness probe's sign of life
    # XADD (the entry id's milliseconds) to Kafka's ack, for the latest records mirrored.
    latency_ms: deque[int] = field(default_factory=lambda: deque(maxlen=100_000))

    def summary(self) -> str:
        return (
            f"read={self.read} mirrored={sum(self.mirrored.values())} "
            f"skipped={sum(self.skipped.values())} "
            f"dead_lettered={sum(self.dead_lettered.values())} "
            f"unknown_types={sum(self.unknown_task_types.values())} retries={self.produce_retries}"
        )
