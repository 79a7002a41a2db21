"""Delivery: was the task delivered once on each path, and about as fast?"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from comparators.base import Difference


class DeliveryComparator:
    """Redis-path ``{"deliveries", "latency_ms"}`` against the same facts of the Kafka path."""

    name: str = "delivery"

    def __init__(self, latency_tolerance_ms: float) -> None:
        if not latency_tolerance_ms >= 0:  # also rejects NaN
            raise ValueError(f"latency_tolerance_ms must be >= 0, got {latency_tolerance_ms}")
        self.latency_tolerance_ms = latency_tolerance_ms

    def compare(self, left: Mapping[str, Any], right: Mapping[str, Any]) -> list[Difference]:
        """``duplicate`` at ``redis.deliveries``/``kafka.deliveries`` for a side that delivered
        more than once; ``latency`` at ``latency_ms`` when both are known and too far apart."""
        differences = []
        left_deliveries, right_deliveries = left.get("deliveries"), right.get("deliveries")
        for side, count in (("redis", left_deliveries), ("kafka", right_deliveries)):
            if isinstance(count, int) and count > 1:
                differences.append(
                    Difference(f"{side}.deliveries", "duplicate", left_deliveries, right_deliveries)
                )
        left_ms, right_ms = left.get("latency_ms"), right.get("latency_ms")
        if (
            left_ms is not None
            and right_ms is not None
            and abs(left_ms - right_ms) > self.latency_tolerance_ms
        ):
            differences.append(Difference("latency_ms", "latency", left_ms, right_ms))
        return differences
