"""Task outcomes: what each path's consumer decided or produced for one task."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from comparators.base import Difference
from comparators.deepdiff_adapter import deepdiff_differences
from comparators.digest import canonical_json, canonical_or_none, digest_of_canonical
from comparators.rules import CompareRules


@dataclass(frozen=True, slots=True)
class OutcomeComparison:
    """Differences under the rules, and each side's digest for the verdict record."""

    differences: tuple[Difference, ...]
    left_digest: str
    right_digest: str

    @property
    def equal(self) -> bool:
        """No difference counts under the rules (excluded fields may still differ)."""
        return not self.differences

    @property
    def identical(self) -> bool:
        """Byte-equal canonical JSON: equal whatever the rules."""
        return self.left_digest == self.right_digest


class OutcomeComparator:
    """Compares outcomes under the rules of their task type.

    Equal canonical JSON is a match before any rule is looked at, so equality is JSON's: key
    order never counts, nor does a tuple against a list.
    """

    name: str = "outcome"

    def __init__(self, rules: CompareRules | None = None) -> None:
        self.rules = rules if rules is not None else CompareRules()

    def compare(self, left: Any, right: Any, task_type: str = "parse") -> list[Difference]:
        """Differences between the Redis-path outcome ``left`` and the Kafka-path ``right``."""
        left_canonical = canonical_or_none(left)
        if left_canonical is not None and left_canonical == canonical_or_none(right):
            return []
        return deepdiff_differences(left, right, self.rules.for_task_type(task_type))

    def compare_with_digests(
        self, left: Any, right: Any, task_type: str = "parse"
    ) -> OutcomeComparison:
        """``compare`` plus both digests, serialising each side once; both must be JSON
        (``ValueError``/``TypeError`` otherwise, as ``outcome_digest``)."""
        left_canonical = canonical_json(left)
        right_canonical = canonical_json(right)
        left_digest = digest_of_canonical(left_canonical)
        if left_canonical == right_canonical:
            return OutcomeComparison((), left_digest, left_digest)
        differences = deepdiff_differences(left, right, self.rules.for_task_type(task_type))
        return OutcomeComparison(
            tuple(differences), left_digest, digest_of_canonical(right_canonical)
        )
