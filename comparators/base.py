"""What every comparator returns, and what every comparator is."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from comparators.paths import parse_readable, render_readable

_FIRST_SEGMENT = re.compile(r"[^.\[]+|\[[^\]]*\]")


def _json_safe(value: Any) -> Any:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return repr(value)
    return value


@dataclass(frozen=True, slots=True)
class Difference:
    """One way two sides differ: where (readable path, ``""`` is the root), how, and the values."""

    path: str
    kind: str
    left: Any
    right: Any

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form: values JSON cannot hold are given as their ``repr``."""
        return {
            "path": self.path,
            "kind": self.kind,
            "left": _json_safe(self.left),
            "right": _json_safe(self.right),
        }

    @property
    def top_level(self) -> str:
        """First path segment, ``"(root)"`` for the root: a metric label of bounded cardinality."""
        if not self.path:
            return "(root)"
        try:
            segments = parse_readable(self.path)
        except ValueError:
            # Paths of non-payload comparators (stream keys, say) need not follow the grammar.
            match = _FIRST_SEGMENT.match(self.path)
            return match.group() if match else self.path
        return render_readable(segments[:1])


@runtime_checkable
class Comparator(Protocol):
    """Judges two sides alike or not; an empty list means alike."""

    name: str

    def compare(self, left: Any, right: Any) -> list[Difference]:
        """The differences between ``left`` (Redis path) and ``right`` (Kafka path)."""
        ...
