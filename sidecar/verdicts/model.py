"""Verdicts: what the sidecar concluded about one task, as published to ``ragflow.shadow.verdicts``.

A verdict is a JSON object, keyed in Kafka by the task id. Each mirrored entry gets at most one
final verdict (``match``, ``mismatch``, ``missing_in_kafka``, ``missing_in_redis``, ``error``) and
at most one ``duplicate`` verdict when Kafka carried it more than once; ``verdict_id`` names
the pair, so readers can count or drop anything seen twice.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from sidecar.transport import fastjson

Verdict = Literal["match", "mismatch", "missing_in_kafka", "missing_in_redis", "duplicate", "error"]
VERDICTS: Final[tuple[Verdict, ...]] = (
    "match",
    "mismatch",
    "missing_in_kafka",
    "missing_in_redis",
    "duplicate",
    "error",
)
# Names of the previous release, kept readable for one release (docs/metrics.md, "Renamed"):
# readers map an old verdict name to its new one, and records still carry the old keys.
RENAMED_VERDICTS: Final[dict[str, Verdict]] = {"missing_primary": "missing_in_redis"}
RENAMED_KEYS: Final = {"control_digest": "redis_run_digest", "candidate_digest": "kafka_run_digest"}
RENAMED_TIMINGS: Final = {"control": "redis_run"}
SCHEMA_VERSION: Final = 1
# A mismatch diff is capped so one pathological task cannot make a huge record.
MAX_DIFFERENCES: Final = 50
MAX_VALUE_CHARS: Final = 300
# Valkey hash of verdict kind -> count, kept by whoever publishes verdicts (read by `status`).
VERDICT_COUNTS_KEY: Final = "ragflow_sidecar:verdicts:counts"


@dataclass
class VerdictRecord:
    """One verdict; ``to_json()`` is what goes to Kafka."""

    verdict: Verdict
    stream: str
    entry_id: str
    task_id: str
    task_type: str
    decided_at_ms: int
    sidecar: str
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None
    redis_run_digest: str | None = None
    kafka_run_digest: str | None = None
    differences: list[dict[str, Any]] = field(default_factory=list)
    differences_total: int = 0
    comparators: dict[str, int] = field(default_factory=dict)
    noise: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    timings: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Differences that do not make a mismatch (delivery latency beyond the tolerance).
    findings: list[dict[str, Any]] = field(default_factory=list)
    deliveries: int = 1
    # The compare span's trace (32 hex digits) when it was sampled: a bad verdict's always is.
    trace_id: str | None = None

    @property
    def verdict_id(self) -> str:
        """Unique per entry and kind of verdict: a final verdict and a duplicate verdict."""
        kind = "duplicate" if self.verdict == "duplicate" else "final"
        return f"{self.stream}/{self.entry_id}/{kind}"

    def to_dict(self) -> dict[str, Any]:
        body = {
            "schema": SCHEMA_VERSION,
            "verdict_id": self.verdict_id,
            "verdict": self.verdict,
            "stream": self.stream,
            "entry_id": self.entry_id,
            "task_id": self.task_id,
            "task_type": self.task_type,
            "decided_at_ms": self.decided_at_ms,
            "sidecar": self.sidecar,
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
            "redis_run_digest": self.redis_run_digest,
            "kafka_run_digest": self.kafka_run_digest,
            "differences": self.differences[:MAX_DIFFERENCES],
            "differences_total": self.differences_total,
            "comparators": self.comparators,
            "noise": self.noise,
            "error": self.error,
            "timings": self.timings,
            "findings": self.findings,
            "deliveries": self.deliveries,
            "trace_id": self.trace_id,
        }
        for old, new in RENAMED_KEYS.items():
            body[old] = body[new]
        for old, new in RENAMED_TIMINGS.items():
            if new in self.timings:
                body["timings"] = {**self.timings, old: self.timings[new]}
        return body

    def to_json(self) -> bytes:
        return fastjson.dumps(self.to_dict(), default=repr)


def capped(value: Any) -> Any:
    """A diff side as stored in a verdict: JSON scalars as they are, the rest as capped text."""
    if value is None or isinstance(value, bool | int | float):
        return value
    text = value if isinstance(value, str) else json.dumps(value, default=repr)
    return text if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS] + "…"


def canonical_verdict(name: str) -> str:
    """``name`` under this release's vocabulary (an old name maps to its new one)."""
    return RENAMED_VERDICTS.get(name, name)


def parse_verdict(value: bytes) -> dict[str, Any]:
    """A verdict record read back from Kafka, in this release's names (a record of the previous
    release, ``missing_primary`` or ``control_digest``, reads as its renamed self); raises
    ``ValueError`` when it is not one."""
    body = json.loads(value)
    if not isinstance(body, dict):
        raise ValueError("not a verdict record")
    verdict = body.get("verdict")
    if isinstance(verdict, str):
        body["verdict"] = canonical_verdict(verdict)
    if body.get("verdict") not in VERDICTS:
        raise ValueError("not a verdict record")
    for old, new in RENAMED_KEYS.items():
        if old in body and new not in body:
            body[new] = body[old]
    return body
