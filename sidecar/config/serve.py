"""Settings of the served share (what RAGFlow executes from Kafka) and of the canary gate.

Part of :class:`~sidecar.config.Settings`, read by the same reader in the same place; kept in
a module of its own so that ``settings.py`` does not grow past a reader's patience.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sidecar.config import _Reader

SERVE_VARIABLES: tuple[str, ...] = (
    "KAFKA_SERVE_PERCENT",
    "SERVE_PREFETCH",
    "SERVE_MAX_ATTEMPTS",
    "SERVE_PRODUCE_TIMEOUT_MS",
    "SERVE_CAP_REFRESH_S",
    "SERVE_COMMIT_INTERVAL_MS",
    "SERVE_SESSION_TIMEOUT_MS",
    "SERVE_REVOKE_WAIT_S",
    "SERVE_STICKY_S",
    "SERVE_EVIDENCE_FLUSH_S",
    "SERVE_KEY_PREFIX",
)
GATE_VARIABLES: tuple[str, ...] = (
    "GATE_MIN_SAMPLE",
    "GATE_MIN_MATCH_PERCENT",
    "GATE_MAX_MISSING",
    "GATE_MAX_FAILURE_DELTA_PP",
    "GATE_WARN_FAILURE_DELTA_PP",
    "GATE_MAX_P99_RATIO",
    "GATE_WARN_P99_RATIO",
    "GATE_P99_FLOOR_MS",
)


@dataclass(frozen=True)
class ServeSettings:
    """How ``ragflow_mq.install()`` shares RAGFlow's own execution between Redis and Kafka.

    ``percent`` is the share of routing keys (documents) whose tasks RAGFlow executes from
    Kafka; the same sticky hash as the judged share (``KAFKA_TRAFFIC_PERCENT``) and never above
    it, so every served document is one the sidecar judged before it was served.
    """

    percent: float = 0.0  # KAFKA_SERVE_PERCENT; 100 with MQ_BACKEND=kafka
    # Records fetched from Kafka and not yet handed to RAGFlow, at most; bounded by the
    # executor's concurrency (MAX_CONCURRENT_TASKS) so that a crash strands little.
    prefetch: int = 5
    max_attempts: int = 3  # deliveries of one record before it goes to the DLQ
    produce_timeout_ms: int = 10000  # one try of queue_product; RAGFlow tries 3 times
    cap_refresh_s: float = 2.0  # how often the cap kept in Valkey is read
    # Finished work is committed at this pace, not per ack: RAGFlow's executor calls ack()
    # synchronously, and a commit round trip per task would halve its rate. A crash redelivers
    # at most this much finished work (at-least-once, as Redis pending entries are).
    commit_interval_ms: int = 100
    session_timeout_ms: int = 15000  # a killed executor's partitions move on after this
    revoke_wait_s: float = 30.0  # at a rebalance, wait this long for tasks in hand to be acked
    sticky_s: float = 60.0  # a key's path is kept this long after its last task
    evidence_flush_s: float = 2.0  # per-path counts are written to Valkey at this pace
    key_prefix: str = "ragflow_mq"  # of the cap, evidence and attempt keys in Valkey


@dataclass(frozen=True)
class GateSettings:
    """Thresholds of ``ragflow-sidecar gate`` (canary analysis of the served share)."""

    min_sample: int = 200  # tasks per path, and judged verdicts, below which it holds
    min_match_percent: float = 99.9  # judged tasks matching; below: roll back
    max_missing: int = 0  # missing_in_kafka + missing_primary verdicts; above: roll back
    max_failure_delta_pp: float = 1.0  # Kafka failure rate minus Redis, points; above: roll back
    warn_failure_delta_pp: float = 0.5  # above: hold
    max_p99_ratio: float = 2.0  # Kafka processing p99 over Redis's; above: roll back
    warn_p99_ratio: float = 1.5  # above: hold
    # p99s under this compare as equal: a 5 ms task is not 2.5x slower than a 2 ms one in any
    # way that matters, and the histogram's buckets cannot tell them apart better anyway.
    p99_floor_ms: float = 1000.0


def build_serve(
    reader: _Reader, *, backend: str, traffic_percent: float, concurrency: int
) -> ServeSettings:
    """The served share's settings; ``KAFKA_SERVE_PERCENT`` may not exceed the judged share."""
    if backend == "kafka":
        percent = reader.number("KAFKA_SERVE_PERCENT", 100.0, 0.0, 100.0)
        if percent != 100.0:
            raise reader.error(
                "KAFKA_SERVE_PERCENT",
                f"{percent:g} with MQ_BACKEND=kafka, which serves every task from Kafka: "
                "leave it unset (or 100), or use MQ_BACKEND=split for a share",
            )
    else:
        percent = reader.number("KAFKA_SERVE_PERCENT", 0.0, 0.0, 100.0)
        if percent > traffic_percent:
            raise reader.error(
                "KAFKA_SERVE_PERCENT",
                f"{percent:g} is above KAFKA_TRAFFIC_PERCENT={traffic_percent:g}: "
                "only tasks the sidecar judges may be served from Kafka",
            )
        if percent > 0 and backend != "split":
            raise reader.error(
                "KAFKA_SERVE_PERCENT", f"{percent:g} needs MQ_BACKEND=split (it is {backend})"
            )
    prefetch = reader.integer("SERVE_PREFETCH", concurrency, minimum=1, maximum=concurrency)
    return ServeSettings(
        percent=percent,
        prefetch=prefetch,
        max_attempts=reader.integer("SERVE_MAX_ATTEMPTS", 3, minimum=1, maximum=100),
        produce_timeout_ms=reader.integer("SERVE_PRODUCE_TIMEOUT_MS", 10000, minimum=100),
        cap_refresh_s=reader.number("SERVE_CAP_REFRESH_S", 2.0, 0.05, 3600.0),
        commit_interval_ms=reader.integer("SERVE_COMMIT_INTERVAL_MS", 100, minimum=0),
        session_timeout_ms=reader.integer(
            "SERVE_SESSION_TIMEOUT_MS", 15000, minimum=6000, maximum=300000
        ),
        revoke_wait_s=reader.number("SERVE_REVOKE_WAIT_S", 30.0, 0.0, 3600.0),
        sticky_s=reader.number("SERVE_STICKY_S", 60.0, 0.0, 86400.0),
        evidence_flush_s=reader.number("SERVE_EVIDENCE_FLUSH_S", 2.0, 0.05, 3600.0),
        key_prefix=reader.required_text("SERVE_KEY_PREFIX", "ragflow_mq"),
    )


def build_gate(reader: _Reader) -> GateSettings:
    """The gate's thresholds; a warning level above its roll-back level is refused."""
    gate = GateSettings(
        min_sample=reader.integer("GATE_MIN_SAMPLE", 200, minimum=1),
        min_match_percent=reader.number("GATE_MIN_MATCH_PERCENT", 99.9, 0.0, 100.0),
        max_missing=reader.integer("GATE_MAX_MISSING", 0, minimum=0),
        max_failure_delta_pp=reader.number("GATE_MAX_FAILURE_DELTA_PP", 1.0, 0.0, 100.0),
        warn_failure_delta_pp=reader.number("GATE_WARN_FAILURE_DELTA_PP", 0.5, 0.0, 100.0),
        max_p99_ratio=reader.number("GATE_MAX_P99_RATIO", 2.0, 1.0, 1000.0),
        warn_p99_ratio=reader.number("GATE_WARN_P99_RATIO", 1.5, 1.0, 1000.0),
        p99_floor_ms=reader.number("GATE_P99_FLOOR_MS", 1000.0, 0.0, 3_600_000.0),
    )
    if gate.warn_failure_delta_pp > gate.max_failure_delta_pp:
        raise reader.error(
            "GATE_WARN_FAILURE_DELTA_PP", "must not be above GATE_MAX_FAILURE_DELTA_PP"
        )
    if gate.warn_p99_ratio > gate.max_p99_ratio:
        raise reader.error("GATE_WARN_P99_RATIO", "must not be above GATE_MAX_P99_RATIO")
    return gate
