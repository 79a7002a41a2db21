"""The judge: joins each task's redis run, kafka run and worker delivery and publishes a verdict.

Both the mirror (redis run) and the shadow consumer (kafka run) hand their records to a judge;
whichever completes the pair decides (see :mod:`sidecar.verdicts.join`), with the comparators
of :mod:`sidecar.verdicts.compare`. The sweeper (:mod:`sidecar.verdicts.sweeper`) decides
entries left open past ``SHADOW_COMPARE_TIMEOUT_S``. Delivery timing differences are reported
in the verdict but do not make it a mismatch: a slow path is a finding, not a wrong answer.
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import valkey.asyncio as valkey

from sidecar.config import Settings
from sidecar.errors import SidecarError
from sidecar.telemetry.tracing import Tracing
from sidecar.transport import fastjson
from sidecar.transport.base import OutgoingMessage
from sidecar.transport.coalesce import Coalescer
from sidecar.transport.kafka import KafkaProducer
from sidecar.transport.topics import VERDICTS_TOPIC
from sidecar.transport.valkey_client import translate_valkey_errors
from sidecar.verdicts.compare import Comparators, digest_or_none
from sidecar.verdicts.join import SIDES, Arrival, EntryRef, JoinStore, RecordOutcome, Side
from sidecar.verdicts.model import VerdictRecord, capped
from sidecar.verdicts.trace import compare_span

# digest_or_none: for the shadow and the replay, which import it from here too.
__all__ = ["Judge", "JudgeStats", "digest_or_none"]

# SHADOW_JOIN_BATCH's default: arrivals of one side recorded in one batch at most (a caller's
# own are never split); large enough for every task a shadow has in hand, small enough that
# one pipeline stays well under a second.
JOIN_BATCH_LIMIT = 500


@dataclass
class JudgeStats:
    """Counters since start; the metrics exporter reads these."""

    verdicts: Counter[str] = field(default_factory=Counter)
    by_type: Counter[tuple[str, str]] = field(default_factory=Counter)  # (verdict, task type)
    # (comparator, task type) of the comparators that found a mismatch
    mismatch_comparators: Counter[tuple[str, str]] = field(default_factory=Counter)
    mismatched_fields: Counter[str] = field(default_factory=Counter)  # by top-level path
    noise: int = 0
    taken_over: int = 0  # claims of dead instances the sweeper finished


class Judge:
    """Records sides in the join and publishes verdicts to ``ragflow.shadow.verdicts``."""

    def __init__(
        self,
        settings: Settings,
        *,
        join_client: valkey.Valkey,
        publisher: KafkaProducer,
        tracing: Tracing,
        comparators: Comparators | None = None,
        batch_limit: int = JOIN_BATCH_LIMIT,
    ) -> None:
        """The clients and ``tracing`` are the composition root's (:mod:`sidecar.app`), started
        before the judge is used and stopped after; ``comparators`` default to
        ``COMPARE_RULES``'s (a bad file raises :class:`ConfigError`)."""
        self.settings = settings
        self.tracing = tracing
        self.stats = JudgeStats()
        self.comparators = comparators or Comparators.from_settings(settings.shadow)
        self.where = settings.state.display_url  # the join lives in the state store
        self.join = JoinStore(join_client, ttl_s=settings.shadow.join_ttl_s)
        self._producer = publisher
        self._batches: dict[Side, Coalescer[Arrival, RecordOutcome]] = {
            side: Coalescer(functools.partial(self._record_now, side), batch_limit)
            for side in SIDES
        }

    def token(self, now_ms: int) -> str:
        """This instance's claim on the entries it decides at ``now_ms``."""
        return f"{self.settings.shadow.instance}@{now_ms}"

    async def record(self, side: Side, arrivals: Sequence[Arrival]) -> list[RecordOutcome]:
        """Store one side of each entry; decide and publish the entries this completed.

        Concurrent calls for a side share one batch (:class:`Coalescer`): one record call
        (which returns the hashes it completed), one Kafka send and one finish for all of them.
        """
        return await self._batches[side].submit(arrivals)

    async def _record_now(self, side: Side, arrivals: list[Arrival]) -> list[RecordOutcome]:
        now_ms = int(time.time() * 1000)
        token = self.token(now_ms)
        with translate_valkey_errors(f"record the {side.replace('_', ' ')}", self.where):
            recorded = await self.join.record(side, arrivals, token, now_ms)
        ready = [
            (a.ref, fields)
            for a, (outcome, fields) in zip(arrivals, recorded, strict=True)
            if outcome == "decide"
        ]
        duplicates = [
            a for a, (outcome, _) in zip(arrivals, recorded, strict=True) if outcome == "duplicate"
        ]
        if ready:
            await self._publish(
                [(ref, self.verdict_for(ref, f), "final") for ref, f in ready], token
            )
        if duplicates:
            await self._publish_duplicates(duplicates, token)
        return [outcome for outcome, _ in recorded]

    async def decide(self, refs: list[EntryRef], token: str) -> None:
        """Publish the verdicts of ``refs`` (timed out, claimed by the sweeper with ``token``)
        as their hashes hold them now, those ``token`` still holds."""
        with translate_valkey_errors("load joined records", self.where):
            loaded = await self.join.load(refs)
        decided: list[tuple[EntryRef, VerdictRecord]] = []
        for ref, fields in zip(refs, loaded, strict=True):
            if not fields:
                continue  # expired meanwhile: nothing left to judge
            if fields.get("state", b"").decode() != token:
                continue
            decided.append((ref, self.verdict_for(ref, fields)))
        await self._publish([(ref, record, "final") for ref, record in decided], token)

    async def _publish_duplicates(self, arrivals: list[Arrival], token: str) -> None:
        now_ms = int(time.time() * 1000)
        records = []
        for arrival in arrivals:
            facts = fastjson.loads(arrival.facts)
            records.append(
                (
                    arrival.ref,
                    VerdictRecord(
                        verdict="duplicate",
                        stream=arrival.ref.stream,
                        entry_id=arrival.ref.entry_id,
                        task_id=str(facts.get("task_id") or ""),
                        task_type=str(facts.get("task_type") or ""),
                        decided_at_ms=now_ms,
                        sidecar=self.settings.shadow.instance,
                        topic=facts.get("topic"),
                        partition=facts.get("partition"),
                        offset=facts.get("offset"),
                        deliveries=2,
                    ),
                    "duplicate",
                )
            )
            if self.tracing.enabled:
                compare_span(self.tracing, records[-1][1], time.time_ns(), (facts,))
        await self._publish(records, token)

    async def _publish(self, items: list[tuple[EntryRef, VerdictRecord, str]], token: str) -> None:
        if not items:
            return
        messages = [
            OutgoingMessage(VERDICTS_TOPIC, record.to_json(), key=record.task_id or None)
            for _, record, _ in items
        ]
        outcomes = await self._producer.send_many(messages)
        failed = [outcome for outcome in outcomes if isinstance(outcome, SidecarError)]
        published = [
            (ref, record, kind)
            for (ref, record, kind), outcome in zip(items, outcomes, strict=True)
            if not isinstance(outcome, SidecarError)
        ]
        with translate_valkey_errors("mark verdicts published", self.where):
            await self.join.finish(
                [(ref, token, record.verdict, kind) for ref, record, kind in published]
            )
        self.stats.verdicts.update(record.verdict for _, record, _ in published)
        self.stats.by_type.update((r.verdict, r.task_type or "parse") for _, r, _ in published)
        self.stats.mismatch_comparators.update(
            (name, record.task_type or "parse")
            for _, record, _ in published
            if record.verdict == "mismatch"
            for name, found in record.comparators.items()
            if found and name != "delivery"
        )
        if failed:
            # Left claimed: the sweeper takes them over once the claim is stale.
            raise failed[0]

    def verdict_for(self, ref: EntryRef, fields: dict[str, bytes]) -> VerdictRecord:
        """The verdict for one joined entry (public for tests and the bench); a ``compare``
        span when tracing is on."""
        redis_run = _facts(fields.get("redis_run"))
        kafka_run = _facts(fields.get("kafka_run"))
        started_ns = time.time_ns()
        record = self._verdict(ref, fields, redis_run, kafka_run)
        if self.tracing.enabled:
            compare_span(self.tracing, record, started_ns, (kafka_run, redis_run))
        return record

    def _verdict(
        self,
        ref: EntryRef,
        fields: dict[str, bytes],
        redis_run: dict[str, Any],
        kafka_run: dict[str, Any],
    ) -> VerdictRecord:
        worker = _facts(fields.get("worker"))
        either = redis_run or kafka_run or {}
        record = VerdictRecord(
            verdict="match",
            stream=ref.stream,
            entry_id=ref.entry_id,
            task_id=str(either.get("task_id") or ""),
            task_type=str(either.get("task_type") or ""),
            decided_at_ms=int(time.time() * 1000),
            sidecar=self.settings.shadow.instance,
            topic=kafka_run.get("topic") if kafka_run else redis_run.get("topic"),
            partition=kafka_run.get("partition") if kafka_run else None,
            offset=kafka_run.get("offset") if kafka_run else None,
            redis_run_digest=redis_run.get("digest") if redis_run else None,
            kafka_run_digest=kafka_run.get("digest") if kafka_run else None,
            deliveries=int(fields.get("kafka_deliveries", b"0") or 0),
            timings=_timings(redis_run, kafka_run, worker),
        )
        if redis_run and not kafka_run:
            record.verdict = "missing_in_kafka"
            return record
        if kafka_run and not redis_run:
            record.verdict = "missing_in_redis"
            return record
        errors = [
            f"{side}: {facts['error']}"
            for side, facts in (("redis", redis_run), ("kafka", kafka_run))
            if facts.get("error")
        ]
        if errors:
            record.verdict = "error"
            record.error = "; ".join(errors)
            return record
        differences = self.comparators.differences(redis_run, kafka_run, fields, record)
        self.stats.noise += record.noise.get("count", 0)
        if differences:
            record.verdict = "mismatch"
            record.differences_total = len(differences)
            record.differences = [
                {**d.to_dict(), "left": capped(d.left), "right": capped(d.right)}
                for d in differences
            ]
            for difference in differences:
                self.stats.mismatched_fields[difference.top_level] += 1
        return record


def _facts(raw: bytes | None) -> dict[str, Any]:
    if not raw:
        return {}
    value = fastjson.loads(raw)
    return value if isinstance(value, dict) else {}


def _timings(
    redis_run: dict[str, Any], kafka_run: dict[str, Any], worker: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    timings: dict[str, dict[str, Any]] = {}
    if worker:
        timings["redis"] = {
            "queue_wait_ms": worker.get("queue_wait_ms"),
            "processing_ms": worker.get("processing_ms"),
            "deliveries": worker.get("deliveries"),
            "consumer": worker.get("consumer"),
        }
    if kafka_run:
        timings["kafka"] = {
            "queue_wait_ms": kafka_run.get("queue_wait_ms"),
            "processing_ms": kafka_run.get("processing_ms"),
            "attempts": kafka_run.get("attempts"),
        }
    if redis_run:
        timings["redis_run"] = {
            "processing_ms": redis_run.get("processing_ms"),
            "mirror_latency_ms": redis_run.get("mirror_latency_ms"),
        }
    return timings
