"""Errors of the comparators package."""

from __future__ import annotations


class RulesError(ValueError):
    """Comparison rules that cannot be used: the message names the file and the key at fault."""

    def __init__(self, problem: str, *, key: str | None = None, source: str | None = None) -> None:
        self.problem = problem
        self.key = key
        self.source = source
        super().__init__(": ".join(part for part in (source, key, problem) if part))

    def located(self, *, source: str | None = None, prefix: str | None = None) -> RulesError:
        """The same problem, placed in a file and under a parent key."""
        key = self.key
        if prefix:
            if not key:
                key = prefix
            elif key.startswith("["):
                key = f"{prefix}{key}"
            else:
                key = f"{prefix}.{key}"
        return RulesError(self.problem, key=key, source=source or self.source)
