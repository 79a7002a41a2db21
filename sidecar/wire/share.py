"""The served share as stored: the values every reader parses the same way (RAGFlow's processes
through ``ragflow_mq.share.LiveShare``, the sidecar's ``shift``, ``gate`` and metrics)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from sidecar.wire.contract import Keys


def parse_percent(raw: str | bytes | None) -> float | None:
    """A stored percentage, or ``None`` when unset or unreadable (the reader logs the latter: a
    garbled key must not silently serve more than the ceiling says)."""
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    if math.isnan(value):
        return None
    return min(max(value, 0.0), 100.0)


@dataclass(frozen=True)
class ShareValues:
    """The live share and the old cap as stored; ``None``: not set."""

    live: float | None = None
    old_cap: float | None = None

    @classmethod
    def parse(cls, live: str | bytes | None, old_cap: str | bytes | None) -> ShareValues:
        return cls(parse_percent(live), parse_percent(old_cap))

    def served(self, ceiling: float) -> float:
        """What RAGFlow serves: the ceiling, lowered by the live share and the old cap."""
        return min([ceiling, *(v for v in (self.live, self.old_cap) if v is not None)])


def share_keys(keys: Keys) -> tuple[str, str]:
    """The keys a reader GETs, in :meth:`ShareValues.parse`'s order."""
    return keys.share, keys.old_cap
