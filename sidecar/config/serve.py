"""Settings of the served share (what RAGFlow executes from Kafka) and of the canary gate.

Part of :class:`~sidecar.config.Settings`, read by the same reader in the same place; kept in
a module of its own, with their variable tables, so that no module grows past a reader's
patience.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from sidecar.config.env import Reader, Table, Var, integer, number, text


@dataclass(frozen=True)
class ServeSettings:
    """How ``ragflow_mq.install()`` shares RAGFlow's own execution between Redis and Kafka.

    ``percent`` is the share of routing keys (documents) whose tasks RAGFlow executes from
    Kafka; the same sticky hash as the judged share (``KAFKA_TRAFFIC_PERCENT``) and never above
    it, so every served document is one the sidecar judged before it was served.
    """

    percent: float = 0.0  # KAFKA_SERVE_PERCENT; 100 with MQ_BACKEND=kafka
    # Records fetched from Kafka and not yet handed to RAGFlow, at most, counting the slots
    # RAGFlow's tasks already fill: records are fetched only when a slot can take them.
    prefetch: int = 5
    produce_timeout_ms: int = 10000  # the producer's request timeout (aiokafka's)
    # queue_product's bound on Kafka: a task not acknowledged by then goes to Redis, and the
    # breaker sends the next ones there too, so RAGFlow's event loop never waits on Kafka.
    enqueue_timeout_ms: int = 2000
    breaker_open_s: float = 30.0  # after a failed produce, Redis only; then one probe
    share_refresh_s: float = 2.0  # how often the live share is read from the state store
    # Finished work is committed at this pace, not per ack: RAGFlow's executor calls ack()
    # synchronously, and a commit round trip per task would halve its rate. Claims and done
    # markers (not commits) keep a redelivered record from running twice.
    commit_interval_ms: int = 100
    session_timeout_ms: int = 15000  # a killed executor's partitions move on after this
    # Kafka's max.poll.interval.ms; the member polls while its slots are busy, so only a
    # process whose loop is stuck this long leaves the group.
    max_poll_interval_ms: int = 3_600_000
    # A silent executor's claimed tasks go to another after this (its restart under the same
    # consumer name takes them back at once, as Redis replays its own pending entries). Also
    # the bound on a frozen process (SIGSTOP, docker pause, a VM stall, the GIL held): up to
    # it, its tasks are not run a second time, as Redis never hands a live consumer's pending
    # entry to another; past it they may be (docs/operations.md).
    lease_s: float = 300.0
    # How often a process refreshes its liveness and asserts its claims in hand again (a
    # store that restarted or evicted one has it back within this).
    claim_refresh_s: float = 10.0
    # How long a finished task's id skips later records of it: RAGFlow's longest task (3 h,
    # do_handle_task's timeout; a record behind it in its partition stays uncommitted that
    # long) and a night's executors' outage on top (docs/operations.md, "Sizing").
    done_ttl_s: int = 12 * 3600
    sticky_s: float = 10.0  # a key's path is kept this long from the decision (not refreshed)
    evidence_flush_s: float = 2.0  # per-path counts are written to Valkey at this pace
    key_prefix: str = "ragflow_mq"  # of the live share, evidence, claims and done markers


@dataclass(frozen=True)
class GateSettings:
    """What ``ragflow-sidecar gate`` requires of the served share (canary analysis)."""

    # Finished documents a path (and in the baseline) below which it holds: the tests count
    # documents, so their minimum does too (GATE_MIN_SAMPLE counted tasks until issue 30).
    min_documents: int = 50
    min_verdicts: int = 200  # judged verdicts (one a task) below which it holds
    min_match_percent: float = 99.9  # judged tasks matching; below: roll back
    max_missing: int = 0  # missing_in_kafka + missing_in_redis verdicts; above: roll back
    # The chance that the sequential tests roll back a healthy shift, for a whole rollout
    # whose window starts at a fixed time, however often the gate is asked; split evenly
    # over the five tests (sidecar/serve/gate_tests.py); with a baseline (the watch at 100 %),
    # half to those and half to the five against it (sidecar/serve/baseline.py).
    alpha: float = 0.01
    # Latencies under this compare as equal: a 5 ms task is not 2.5x slower than a 2 ms one in
    # any way that matters, and a path's own overhead of milliseconds is no regression.
    latency_floor_ms: float = 1000.0
    # Non-inferiority (sidecar/serve/margins.py): a step is promoted only once the evidence
    # shows Kafka no worse than this, as a cost to all documents at the next step's share.
    # Kafka's consumed records that may go to the dead-letter topic (Redis has none), percent.
    dead_letter_percent: float = 0.1
    # The margins are the harms the gate must not promote (a +2 point failure rate, x1.5
    # processing, x3 queue wait), not tighter ones: a transport cannot make a parser 20 %
    # slower, and a margin of x1.2 cost more evidence than catching x1.5 does.
    failed_margin_points: float = 2.0  # failed documents, points
    processing_margin_ratio: float = 1.5  # typical processing time, Kafka over Redis
    queue_wait_margin_ratio: float = 3.0  # typical queue wait, Kafka over Redis
    # The chance that a step is promoted while Kafka is worse than its margin by exactly the
    # margin, per margin, however often the gate looks: the error of promoting. GATE_ALPHA is
    # the other error, rolling back a healthy shift; the two are not one budget, so neither
    # is split by the other's tests. 0.04: issue 36's held-out bench at 5 documents a minute,
    # 300 healthy rollouts none rolled back and 14.6 / 35.5 h to 100 % (0.025: 17.5 / 48.5 h,
    # past the 48 h target), a +2 point regression promoted silently in 2 % of 200 runs, under
    # the 5 % target that 0.05 would have spent whole (docs/performance.md).
    margin_alpha: float = 0.04

    @property
    def margins(self) -> dict[str, float]:
        return {
            "failed": self.failed_margin_points,
            "processing": self.processing_margin_ratio,
            "queue_wait": self.queue_wait_margin_ratio,
        }


def _alpha(reader: Reader, name: str, default: float, _: Mapping[str, Any]) -> float:
    """A probability strictly between 0 and 0.5: 0 could never roll back, and from 0.5 on a
    roll-back would be no better than a coin."""
    text = reader.text(name, None)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise reader.error(name, f"{text!r} is not a number") from None
    if not 0.0 < value < 0.5:  # also refuses NaN
        raise reader.error(name, f"{text} is out of range (must be above 0 and below 0.5)")
    return value


SERVE = Table(
    ServeSettings,
    Var("KAFKA_SERVE_PERCENT", "percent"),
    Var("SERVE_PREFETCH", "prefetch"),
    Var("SERVE_PRODUCE_TIMEOUT_MS", "produce_timeout_ms", integer(100)),
    Var("SERVE_ENQUEUE_TIMEOUT_MS", "enqueue_timeout_ms", integer(50, 60000)),
    Var("SERVE_BREAKER_OPEN_S", "breaker_open_s", number(0.1, 3600.0)),
    Var("SERVE_SHARE_REFRESH_S", "share_refresh_s", number(0.05, 3600.0)),
    Var("SERVE_COMMIT_INTERVAL_MS", "commit_interval_ms", integer(0)),
    Var("SERVE_SESSION_TIMEOUT_MS", "session_timeout_ms", integer(6000, 300000)),
    Var("SERVE_MAX_POLL_INTERVAL_MS", "max_poll_interval_ms", integer(1000, 86_400_000)),
    Var("SERVE_LEASE_S", "lease_s", number(1.0, 3600.0)),
    Var("SERVE_CLAIM_REFRESH_S", "claim_refresh_s", number(0.1, 600.0)),
    Var("SERVE_DONE_TTL_S", "done_ttl_s", integer(600, 30 * 86400)),
    Var("SERVE_STICKY_S", "sticky_s", number(0.0, 86400.0)),
    Var("SERVE_EVIDENCE_FLUSH_S", "evidence_flush_s", number(0.05, 3600.0)),
    Var("SERVE_KEY_PREFIX", "key_prefix", text()),
)
GATE = Table(
    GateSettings,
    Var("GATE_MIN_DOCUMENTS", "min_documents", integer(1)),
    Var("GATE_MIN_VERDICTS", "min_verdicts", integer(1)),
    Var("GATE_MIN_MATCH_PERCENT", "min_match_percent", number(0.0, 100.0)),
    Var("GATE_MAX_MISSING", "max_missing", integer(0)),
    Var("GATE_ALPHA", "alpha", _alpha),
    Var("GATE_LATENCY_FLOOR_MS", "latency_floor_ms", number(0.0, 3_600_000.0)),
    Var("GATE_DEAD_LETTER_PERCENT", "dead_letter_percent", number(0.0001, 50.0)),
    Var("GATE_FAILED_MARGIN_POINTS", "failed_margin_points", number(0.01, 100.0)),
    Var("GATE_PROCESSING_MARGIN_RATIO", "processing_margin_ratio", number(1.01, 100.0)),
    Var("GATE_QUEUE_WAIT_MARGIN_RATIO", "queue_wait_margin_ratio", number(1.01, 100.0)),
    Var("GATE_MARGIN_ALPHA", "margin_alpha", _alpha),
)
SERVE_VARIABLES: tuple[str, ...] = SERVE.names
GATE_VARIABLES: tuple[str, ...] = GATE.names


def build_serve(
    reader: Reader, *, backend: str, traffic_percent: float, concurrency: int
) -> ServeSettings:
    """The served share's settings; ``KAFKA_SERVE_PERCENT`` may not exceed the judged share."""
    env = SERVE.reader(reader)
    if backend == "kafka":
        percent = env.number("KAFKA_SERVE_PERCENT", 100.0, 0.0, 100.0)
        if percent != 100.0:
            raise env.error(
                "KAFKA_SERVE_PERCENT",
                f"{percent:g} with MQ_BACKEND=kafka, which serves every task from Kafka: "
                "leave it unset (or 100), or use MQ_BACKEND=split for a share",
            )
    else:
        percent = env.number("KAFKA_SERVE_PERCENT", 0.0, 0.0, 100.0)
        if percent > traffic_percent:
            raise env.error(
                "KAFKA_SERVE_PERCENT",
                f"{percent:g} is above KAFKA_TRAFFIC_PERCENT={traffic_percent:g}: "
                "only tasks the sidecar judges may be served from Kafka",
            )
        if percent > 0 and backend != "split":
            raise env.error(
                "KAFKA_SERVE_PERCENT", f"{percent:g} needs MQ_BACKEND=split (it is {backend})"
            )
    prefetch = env.integer("SERVE_PREFETCH", concurrency, minimum=1, maximum=concurrency)
    serve = SERVE.build(reader, percent=percent, prefetch=prefetch)
    if env.text("SERVE_CLAIM_REFRESH_S", None) is None:
        serve = replace(serve, claim_refresh_s=min(serve.claim_refresh_s, serve.lease_s / 3))
    elif serve.claim_refresh_s * 3 > serve.lease_s:
        raise env.error(
            "SERVE_CLAIM_REFRESH_S",
            f"{serve.claim_refresh_s:g} is more than a third of SERVE_LEASE_S={serve.lease_s:g}: "
            "a live executor would lose its claims between two refreshes",
        )
    return serve


def build_gate(reader: Reader) -> GateSettings:
    """The gate's settings."""
    return GATE.build(reader)
