"""A finding of the doctor, and what a set of them means as an exit code."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Literal

Severity = Literal["ok", "note", "risk", "unknown"]
SEVERITIES: Final[tuple[Severity, ...]] = ("ok", "note", "risk", "unknown")

EXIT_FINE: Final = 0
EXIT_RISK: Final = 1
EXIT_CANNOT_TELL: Final = 2


@dataclass(frozen=True)
class Finding:
    """One line of the report: ``check`` names what was looked at (``ragflow-valkey.eviction``,
    ``executors.orphans``, ...), ``subject`` where (a server, a stream, a consumer)."""

    check: str
    severity: Severity
    subject: str
    text: str

    def line(self) -> str:
        return f"{self.severity.upper():7} {self.check} {self.subject}: {self.text}"


def exit_code(findings: Iterable[Finding]) -> int:
    """1 when any risk is known (whatever else could not be told), else 2 when something could
    not be told, else 0: a known risk is what an operator must act on first."""
    severities = {finding.severity for finding in findings}
    if "risk" in severities:
        return EXIT_RISK
    if "unknown" in severities:
        return EXIT_CANNOT_TELL
    return EXIT_FINE


def render(findings: Iterable[Finding]) -> str:
    return "\n".join(finding.line() for finding in findings)
