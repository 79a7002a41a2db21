"""The wall clock in milliseconds: the clock verdicts, observations and timestamps use."""

from __future__ import annotations

import time


def now_ms() -> int:
    """Wall-clock milliseconds since the epoch, the clock ``decided_at_ms`` is written in."""
    return time.time_ns() // 1_000_000
