"""Valkey stream entry ids as ordered pairs, and the id ranges a scan covered."""

from __future__ import annotations

from collections.abc import Sequence

StreamId = tuple[int, int]
# (exclusive low, inclusive high); None is an open end.
IdRange = tuple[StreamId | None, StreamId | None]


def parse_stream_id(raw: bytes | str) -> StreamId:
    """``b"1700000000000-3"`` as ``(1700000000000, 3)``, for ordering."""
    text = raw.decode("ascii") if isinstance(raw, bytes) else raw
    millis, _, seq = text.partition("-")
    return int(millis), int(seq or 0)


def format_stream_id(sid: StreamId) -> str:
    """``(1700000000000, 3)`` as ``"1700000000000-3"``."""
    return f"{sid[0]}-{sid[1]}"


def in_ranges(sid: StreamId, ranges: Sequence[IdRange]) -> bool:
    """Whether one of ``ranges`` holds ``sid``."""
    return any((lo is None or sid > lo) and (hi is None or sid <= hi) for lo, hi in ranges)


def in_ranges_all(after: StreamId, upto: StreamId, ranges: Sequence[IdRange]) -> bool:
    """Whether one of ``ranges`` holds all of (after, upto]."""
    return any((lo is None or lo <= after) and (hi is None or hi >= upto) for lo, hi in ranges)
