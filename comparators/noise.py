"""Noise baseline, after Twitter's Diffy: fields that differ between two runs of the same
path (timestamps, random ids) are noise, so a difference there between paths proves nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from comparators.base import Difference
from comparators.deepdiff_adapter import deepdiff_differences
from comparators.digest import canonical_or_none
from comparators.paths import is_under
from comparators.rules import TypeRules


@dataclass(frozen=True, slots=True)
class NoiseBaseline:
    """Readable paths known to differ between redis runs."""

    paths: frozenset[str] = frozenset()

    @classmethod
    def from_runs(cls, outcomes: Sequence[Any], rules: TypeRules | None = None) -> NoiseBaseline:
        """Paths differing between run 0 and each other run; with one run, none."""
        if len(outcomes) < 2:
            return cls()
        first = outcomes[0]
        first_canonical = canonical_or_none(first)
        paths: set[str] = set()
        for other in outcomes[1:]:
            if first_canonical is not None and first_canonical == canonical_or_none(other):
                continue
            paths.update(d.path for d in deepdiff_differences(first, other, rules))
        return cls(frozenset(paths))

    def is_noise(self, path: str) -> bool:
        """Whether ``path`` is a noisy path or below one."""
        return any(is_under(path, noisy) for noisy in self.paths)

    def split(self, differences: Iterable[Difference]) -> tuple[list[Difference], list[Difference]]:
        """``(real, noise)``, each in the order given."""
        real: list[Difference] = []
        noise: list[Difference] = []
        for difference in differences:
            (noise if self.is_noise(difference.path) else real).append(difference)
        return real, noise
