"""Reading verdicts back from ``ragflow.shadow.verdicts``, for the commands, the gate and the judge.

The topic is read from the beginning without a consumer group, so looking at verdicts never
moves anyone's committed offsets, and the read stops at the end offsets seen when it began.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from sidecar.errors import ConfigError
from sidecar.transport.options import KafkaSettings
from sidecar.transport.topic_reader import read_topics
from sidecar.transport.topics import VERDICTS_TOPIC
from sidecar.verdicts.model import VERDICTS, canonical_verdict, parse_verdict

logger = logging.getLogger(__name__)


@dataclass
class VerdictReadStats:
    """What a ``read_verdicts`` pass saw besides the records it returned."""

    records: int = 0  # every record read, verdict or not
    not_verdicts: int = 0
    duplicates: int = 0  # records whose verdict_id was seen before
    filtered_out: int = 0
    complete: bool = True  # False: stopped on idle_timeout_ms short of the end offsets
    short_partitions: list[int] = field(default_factory=list)


async def read_verdicts(
    settings: KafkaSettings,
    *,
    since_ms: int | None,
    verdicts: set[str] | None,
    task_types: set[str] | None,
    topic: str = VERDICTS_TOPIC,
    idle_timeout_ms: int = 1500,
    stats: VerdictReadStats | None = None,
) -> list[dict[str, Any]]:
    """Verdicts in ``topic`` up to its end when the call began, once each, oldest first.

    Filters: ``decided_at_ms >= since_ms``, ``verdict`` in ``verdicts``, ``task_type`` in
    ``task_types`` (``None``: no filter). ``idle_timeout_ms`` only guards against a broker
    that stops answering: the read ends when every partition reaches its end offset.
    """
    if verdicts is not None:
        verdicts = {canonical_verdict(v) for v in verdicts}
        unknown = sorted(verdicts - set(VERDICTS))
        if unknown:
            raise ConfigError(
                "--verdict",
                f"unknown verdict {', '.join(unknown)}; expected one of {', '.join(VERDICTS)}",
            )
    stats = stats if stats is not None else VerdictReadStats()
    by_id: dict[str, dict[str, Any]] = {}
    outcome = await read_topics(
        settings,
        [topic],
        lambda record: _take(record, by_id, stats),
        since_ms=since_ms,
        idle_timeout_ms=idle_timeout_ms,
    )
    stats.complete = outcome.complete
    stats.short_partitions = [partition for _, partition in outcome.short_partitions]

    selected = [
        record for record in by_id.values() if _wanted(record, since_ms, verdicts, task_types)
    ]
    stats.filtered_out = len(by_id) - len(selected)
    if stats.not_verdicts:
        logger.info("skipped %d records in %s that are not verdicts", stats.not_verdicts, topic)
    selected.sort(
        key=lambda r: (int_or_minus_one(r.get("decided_at_ms")), str(r.get("verdict_id")))
    )
    return selected


class VerdictFollower:
    """The verdicts decided since a fixed time, for a reader that asks again and again (the
    rollout autopilot): each ``read_new()`` reads only what was written since the last one and
    returns the verdicts not returned before, once each."""

    def __init__(
        self,
        settings: KafkaSettings,
        since_ms: int,
        *,
        topic: str = VERDICTS_TOPIC,
        idle_timeout_ms: int = 1500,
    ) -> None:
        self.since_ms = since_ms
        self._settings = settings
        self._topic = topic
        self._idle_timeout_ms = idle_timeout_ms
        self._positions: dict[Any, int] = {}
        self._seen: set[str] = set()

    async def read_new(self, stats: VerdictReadStats | None = None) -> list[dict[str, Any]]:
        stats = stats if stats is not None else VerdictReadStats()
        by_id: dict[str, dict[str, Any]] = {}
        outcome = await read_topics(
            self._settings,
            [self._topic],
            lambda record: _take(record, by_id, stats, self._seen),
            since_ms=self.since_ms,
            idle_timeout_ms=self._idle_timeout_ms,
            start_offsets=self._positions,
        )
        stats.complete = outcome.complete
        self._positions.update(outcome.positions)
        self._seen.update(by_id)
        return [record for record in by_id.values() if _wanted(record, self.since_ms, None, None)]


def _take(
    record: Any,
    by_id: dict[str, dict[str, Any]],
    stats: VerdictReadStats,
    seen: set[str] | frozenset[str] = frozenset(),
) -> None:
    stats.records += 1
    try:
        body = parse_verdict(record.value) if record.value is not None else None
    except ValueError:  # JSONDecodeError and UnicodeDecodeError are ValueErrors too
        body = None
    if body is None:
        stats.not_verdicts += 1
        return
    verdict_id = body.get("verdict_id")
    if not isinstance(verdict_id, str):
        # No id to deduplicate on: the record's place in the log is unique at least.
        verdict_id = f"{record.topic}:{record.partition}:{record.offset}"
    if verdict_id in by_id or verdict_id in seen:
        stats.duplicates += 1
        return
    by_id[verdict_id] = body


def _wanted(
    record: Mapping[str, Any],
    since_ms: int | None,
    verdicts: set[str] | None,
    task_types: set[str] | None,
) -> bool:
    if since_ms is not None and int_or_minus_one(record.get("decided_at_ms")) < since_ms:
        return False
    if verdicts is not None and record.get("verdict") not in verdicts:
        return False
    return task_types is None or record.get("task_type") in task_types


def int_or_minus_one(value: Any) -> int:
    """``value`` if an int, else -1: a record from another writer may lack it or carry junk."""
    return value if isinstance(value, int) and not isinstance(value, bool) else -1


_RELATIVE = re.compile(r"^([0-9]+)\s*([smhd])$")
_UNIT_MS: Final = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_since(text: str, now_ms: int) -> int:
    """``--since``: ``30s``, ``10m``, ``2h``, ``1d`` ago; ISO-8601 (UTC if no zone); epoch ms."""
    value = text.strip()
    relative = _RELATIVE.match(value.lower())
    if relative:
        return now_ms - int(relative.group(1)) * _UNIT_MS[relative.group(2)]
    if value.isascii() and value.isdigit():  # str.isdigit() also takes '²'
        return int(value)
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ConfigError(
            "--since",
            f"{text!r} is not a duration (30s, 10m, 2h, 1d), an ISO-8601 time "
            "(2024-05-01T12:00:00Z) or epoch milliseconds",
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)
