"""The share of tasks carried over Kafka, decided per routing key and sticky.

A key's bucket is a fixed number in [0, 100) from a hash of the key; a task is in the share
when its bucket is below the percentage. So a document is wholly in or out, and raising the
percentage only adds documents: whatever is in at 30 % is in at 60 %.
"""

from __future__ import annotations

import hashlib

_SCALE = 2**64


def traffic_bucket(key: str) -> float:
    """Where ``key`` falls in [0, 100); the same on every host and every run."""
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") * 100 / _SCALE


def in_traffic_share(key: str, percent: float) -> bool:
    """Whether the task keyed by ``key`` rides Kafka at ``percent`` (0 to 100)."""
    if percent >= 100:
        return True
    if percent <= 0:
        return False
    return traffic_bucket(key) < percent
