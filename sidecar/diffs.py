"""Reading verdicts back from ``ragflow.shadow.verdicts`` and showing mismatches side by side.

The topic is read from the beginning without a consumer group, so looking at verdicts never
moves anyone's committed offsets, and the read stops at the end offsets seen when it began.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from sidecar.errors import ConfigError
from sidecar.settings import KafkaSettings
from sidecar.topic_reader import read_topics
from sidecar.topics import VERDICTS_TOPIC
from sidecar.verdicts import VERDICTS, parse_verdict

logger = logging.getLogger(__name__)

_BOLD: Final = "\x1b[1m"
_RED: Final = "\x1b[31m"
_GREEN: Final = "\x1b[32m"
_DIM: Final = "\x1b[2m"
_RESET: Final = "\x1b[0m"

REDIS_HEADING: Final = "redis (control)"
KAFKA_HEADING: Final = "kafka (candidate)"


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
    selected.sort(key=lambda r: (_int(r.get("decided_at_ms")), str(r.get("verdict_id"))))
    return selected


def _take(record: Any, by_id: dict[str, dict[str, Any]], stats: VerdictReadStats) -> None:
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
    if verdict_id in by_id:
        stats.duplicates += 1
        return
    by_id[verdict_id] = body


def _wanted(
    record: Mapping[str, Any],
    since_ms: int | None,
    verdicts: set[str] | None,
    task_types: set[str] | None,
) -> bool:
    if since_ms is not None and _int(record.get("decided_at_ms")) < since_ms:
        return False
    if verdicts is not None and record.get("verdict") not in verdicts:
        return False
    return task_types is None or record.get("task_type") in task_types


def _int(value: Any) -> int:
    # A record from another writer may lack the field or carry junk: it sorts first.
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


def render_diff(record: Mapping[str, Any], *, color: bool, width: int = 100) -> str:
    """A mismatch as a header and a path | redis | kafka table; other verdicts as one line."""
    verdict = str(record.get("verdict", "?"))
    parts = _header_parts(record)
    if verdict != "mismatch":
        # One line, never cut: ids and the error text are what a reader searches for.
        line = "  ".join(parts)
        if verdict == "error" and record.get("error"):
            line += f": {_printable(str(record['error']))}"
        elif verdict == "duplicate":
            line += f" ({record.get('deliveries', '?')} deliveries)"
        return _style(line, _BOLD, color)

    lines = [_style(line, _BOLD, color) for line in _pack(parts, width)]
    differences = [d for d in record.get("differences") or [] if isinstance(d, Mapping)]
    if not differences:
        digests = (
            f"  no field differences recorded; digest {record.get('control_digest')} (redis), "
            f"{record.get('candidate_digest')} (kafka)"
        )
        return "\n".join([*lines, _cut(_printable(digests), width)])

    rows = [(_path_cell(d), *_value_cells(d)) for d in differences]
    path_width, value_width = _column_widths(rows, width)
    lines.append(
        _row(("path", REDIS_HEADING, KAFKA_HEADING), path_width, value_width, color, heading=True)
    )
    lines.append(
        _style(f"  {'─' * path_width}─┼─{'─' * value_width}─┼─{'─' * value_width}", _DIM, color)
    )
    lines += [_row(row, path_width, value_width, color) for row in rows]
    total = _int(record.get("differences_total"))
    if total > len(differences):
        lines.append(f"  … and {total - len(differences)} more not kept in the verdict")
    return "\n".join(lines)


def render_diffs(records: Iterable[Mapping[str, Any]], *, color: bool, width: int = 100) -> str:
    """Every record rendered, a blank line apart, and a count by verdict at the end."""
    records = list(records)
    blocks = [render_diff(record, color=color, width=width) for record in records]
    kinds = Counter(str(record.get("verdict", "?")) for record in records)
    noun = "verdict" if len(records) == 1 else "verdicts"
    summary = f"{len(records)} {noun}"
    if kinds:
        summary += ": " + ", ".join(f"{kinds[k]} {k}" for k in (*VERDICTS, "?") if kinds[k])
    return "\n\n".join([*blocks, summary])


def _header_parts(record: Mapping[str, Any]) -> list[str]:
    verdict = str(record.get("verdict", "?")).upper()
    parts = [
        verdict,
        str(record.get("task_type") or "-"),
        f"task {record.get('task_id') or '-'}",
        f"stream {record.get('stream') or '-'} {record.get('entry_id') or '-'}",
    ]
    topic = record.get("topic")
    if topic:
        parts.append(f"kafka {topic}[{record.get('partition')}]@{record.get('offset')}")
    else:
        parts.append("kafka -")
    return [_printable(part) for part in parts]


def _pack(parts: list[str], width: int) -> list[str]:
    """Parts two spaces apart on as few lines of ``width`` as they fit; none is cut short
    unless it alone is wider."""
    lines: list[str] = []
    for part in parts:
        if lines and len(lines[-1]) + 2 + len(part) <= width:
            lines[-1] += "  " + part
        else:
            lines.append(_cut(("  " if lines else "") + part, width))
    return lines


def _path_cell(difference: Mapping[str, Any]) -> str:
    path = str(difference.get("path") or "(root)")
    kind = str(difference.get("kind") or "")
    # value_changed is the usual case; any other kind changes how the values read.
    return _printable(path if kind in ("", "value_changed") else f"{path} [{kind}]")


def _value_cells(difference: Mapping[str, Any]) -> tuple[str, str]:
    kind = difference.get("kind")
    left = "(absent)" if kind == "added" else _show(difference.get("left"), kind)
    right = "(absent)" if kind == "removed" else _show(difference.get("right"), kind)
    return left, right


def _show(value: Any, kind: Any) -> str:
    if isinstance(value, str) and kind != "type_changed" and value:
        text = value
    else:
        # Quoted where the type is the point, so "1" and 1 do not look alike.
        text = json.dumps(value, ensure_ascii=False, default=repr)
    return _printable(text)


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _printable(text: str) -> str:
    # Values come from task payloads: an escape sequence in one must not drive the terminal,
    # and a newline must not break the one-row-per-difference layout.
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def _column_widths(rows: list[tuple[str, str, str]], width: int) -> tuple[int, int]:
    # Row layout: 2 indent + path + " │ " + redis + " │ " + kafka.
    usable = max(width - 2 - 6, 20)
    longest_path = max([len("path"), *(len(row[0]) for row in rows)])
    path_width = min(longest_path, max(usable // 3, 8))
    value_width = max((usable - path_width) // 2, 6)
    longest_value = max([len(KAFKA_HEADING), *(len(cell) for row in rows for cell in row[1:])])
    return path_width, min(value_width, longest_value)


def _row(
    cells: tuple[str, str, str],
    path_width: int,
    value_width: int,
    color: bool,
    heading: bool = False,
) -> str:
    path = _cut(cells[0], path_width).ljust(path_width)
    left = _cut(cells[1], value_width).ljust(value_width)
    right = _cut(cells[2], value_width)
    if heading:
        return _style(f"  {path} │ {left} │ {right}", _BOLD, color)
    return f"  {path} │ {_style(left, _RED, color)} │ {_style(right, _GREEN, color)}"


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def _style(text: str, code: str, color: bool) -> str:
    return f"{code}{text}{_RESET}" if color else text


def now_ms() -> int:
    """Wall-clock milliseconds, the clock ``decided_at_ms`` is written in."""
    return int(time.time() * 1000)
