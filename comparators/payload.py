"""Task payloads: the JSON RAGFlow put on the Redis stream against the copy taken from Kafka."""

from __future__ import annotations

import json
from typing import Any

from comparators.base import Difference
from comparators.deepdiff_adapter import deepdiff_differences
from comparators.digest import canonical_or_none
from comparators.rules import TypeRules

_RAW = (bytes, bytearray, memoryview)


class _Undecodable(Exception):
    pass


def _decode(value: Any) -> Any:
    if not isinstance(value, _RAW):
        return value
    try:
        return json.loads(bytes(value))
    except ValueError:  # JSONDecodeError and UnicodeDecodeError alike
        raise _Undecodable from None


class PayloadComparator:
    """Compares two payloads, each raw JSON bytes or an already decoded object.

    Cheapest first, since almost every pair matches: equal bytes, then equal canonical JSON,
    and only then deepdiff. A ``str`` is taken as a decoded value, not as JSON text.
    """

    name: str = "payload"

    def __init__(self, rules: TypeRules | None = None) -> None:
        self.rules = rules

    def compare(self, left: Any, right: Any) -> list[Difference]:
        """Differences between the Redis-side payload ``left`` and the Kafka-side ``right``."""
        if isinstance(left, _RAW) and isinstance(right, _RAW) and left == right:
            return []
        try:
            left_value, right_value = _decode(left), _decode(right)
        except _Undecodable:
            return [Difference("", "undecodable", left, right)]
        left_canonical = canonical_or_none(left_value)
        if left_canonical is not None and left_canonical == canonical_or_none(right_value):
            return []
        return deepdiff_differences(left_value, right_value, self.rules)
