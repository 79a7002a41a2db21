"""``ragflow-sidecar diffs``: mismatches shown side by side (the verdicts are read by
:mod:`sidecar.verdicts.reader`)."""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, Final

from sidecar.verdicts.model import VERDICTS
from sidecar.verdicts.reader import int_or_minus_one

logger = logging.getLogger(__name__)

_BOLD: Final = "\x1b[1m"
_RED: Final = "\x1b[31m"
_GREEN: Final = "\x1b[32m"
_DIM: Final = "\x1b[2m"
_RESET: Final = "\x1b[0m"

REDIS_HEADING: Final = "redis run"
KAFKA_HEADING: Final = "kafka run"


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
            "  no field differences recorded; digest "
            f"{record.get('redis_run_digest')} (redis run), "
            f"{record.get('kafka_run_digest')} (kafka run)"
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
    total = int_or_minus_one(record.get("differences_total"))
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
    trace_id = record.get("trace_id")
    if trace_id:
        # The compare span's trace, as Jaeger's /api/traces/<id> and its UI take it.
        parts.append(f"trace {trace_id}")
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
