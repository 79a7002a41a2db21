"""The judge: joins each task's control, candidate and primary records and publishes a verdict.

Both the mirror (control) and the shadow consumer (candidate) hand their records to a judge;
whichever completes the pair decides (see :mod:`sidecar.verdicts.join`), with the comparators
of :mod:`sidecar.verdicts.compare`. The sweeper (:mod:`sidecar.verdicts.sweeper`) decides
entries left open past ``SHADOW_COMPARE_TIMEOUT_S``. Delivery timing differences are reported
in the verdict but do not make it a mismatch: a slow path is a finding, not a wrong answer.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import valkey.asyncio as valkey

from sidecar.config import Settings
from sidecar.errors import SidecarError
from sidecar.telemetry.tracing import Tracing
from sidecar.transport.base import OutgoingMessage
from sidecar.transport.kafka import KafkaProducer
from sidecar.transport.topics import VERDICTS_TOPIC
from sidecar.transport.valkey_client import translate_valkey_errors
from sidecar.verdicts.compare import Comparators, digest_or_none
from sidecar.verdicts.join import Arrival, EntryRef, JoinStore, RecordOutcome, Side
from sidecar.verdicts.model import VerdictRecord, capped
from sidecar.verdicts.trace import compare_span

# digest_or_none: for the shadow and control sides, which import it from here too.
__all__ = ["Judge", "JudgeStats", "digest_or_none"]


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
    ) -> None:
        """The clients and ``tracing`` are the composition root's (:mod:`sidecar.app`), started
        before the judge is used and stopped after; ``comparators`` default to
        ``COMPARE_RULES``'s (a bad file raises :class:`ConfigError`)."""
        self.settings = settings
        self.tracing = tracing
        self.stats = JudgeStats()
        self.comparators = comparators or Comparators.from_settings(settings.shadow)
        self.where = settings.redis.display_url
        self.join = JoinStore(join_client, ttl_s=settings.shadow.join_ttl_s)
        self._producer = publisher

    def token(self, now_ms: int) -> str:
        """This instance's claim on the entries it decides at ``now_ms``."""
        return f"{self.settings.shadow.instance}@{now_ms}"

    async def record(self, side: Side, arrivals: Sequence[Arrival]) -> list[RecordOutcome]:
        """Store one side of each entry; decide and publish the entries this completed."""
        now_ms = int(time.time() * 1000)
        token = self.token(now_ms)
        with translate_valkey_errors(f"record the {side} side", self.where):
            outcomes = await self.join.record(side, arrivals, token, now_ms)
        ready = [a.ref for a, o in zip(arrivals, outcomes, strict=True) if o == "decide"]
        duplicates = [a for a, o in zip(arrivals, outcomes, strict=True) if o == "duplicate"]
        if ready:
            await self.decide(ready, token, timed_out=False)
        if duplicates:
            await self._publish_duplicates(duplicates, token)
        return outcomes

    async def decide(self, refs: list[EntryRef], token: str, *, timed_out: bool) -> None:
        """Publish the verdicts of ``refs``; ``timed_out`` ones only while ``token`` holds them."""
        with translate_valkey_errors("load joined records", self.where):
            loaded = await self.join.load(refs)
        decided: list[tuple[EntryRef, VerdictRecord]] = []
        for ref, fields in zip(refs, loaded, strict=True):
            if not fields:
                continue  # expired meanwhile: nothing left to judge
            if timed_out and fields.get("state", b"").decode() != token:
                continue
            decided.append((ref, self.verdict_for(ref, fields)))
        await self._publish([(ref, record, "final") for ref, record in decided], token)

    async def _publish_duplicates(self, arrivals: list[Arrival], token: str) -> None:
        now_ms = int(time.time() * 1000)
        records = []
        for arrival in arrivals:
            facts = json.loads(arrival.facts)
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
        control = _facts(fields.get("control"))
        candidate = _facts(fields.get("candidate"))
        started_ns = time.time_ns()
        record = self._verdict(ref, fields, control, candidate)
        if self.tracing.enabled:
            compare_span(self.tracing, record, started_ns, (candidate, control))
        return record

    def _verdict(
        self,
        ref: EntryRef,
        fields: dict[str, bytes],
        control: dict[str, Any],
        candidate: dict[str, Any],
    ) -> VerdictRecord:
        primary = _facts(fields.get("primary"))
        either = control or candidate or {}
        record = VerdictRecord(
            verdict="match",
            stream=ref.stream,
            entry_id=ref.entry_id,
            task_id=str(either.get("task_id") or ""),
            task_type=str(either.get("task_type") or ""),
            decided_at_ms=int(time.time() * 1000),
            sidecar=self.settings.shadow.instance,
            topic=candidate.get("topic") if candidate else control.get("topic"),
            partition=candidate.get("partition") if candidate else None,
            offset=candidate.get("offset") if candidate else None,
            control_digest=control.get("digest") if control else None,
            candidate_digest=candidate.get("digest") if candidate else None,
            deliveries=int(fields.get("kafka_deliveries", b"0") or 0),
            timings=_timings(control, candidate, primary),
        )
        if control and not candidate:
            record.verdict = "missing_in_kafka"
            return record
        if candidate and not control:
            record.verdict = "missing_primary"
            return record
        errors = [
            f"{side}: {facts['error']}"
            for side, facts in (("redis", control), ("kafka", candidate))
            if facts.get("error")
        ]
        if errors:
            record.verdict = "error"
            record.error = "; ".join(errors)
            return record
        differences = self.comparators.differences(control, candidate, fields, record)
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
    value = json.loads(raw)
    return value if isinstance(value, dict) else {}


def _timings(
    control: dict[str, Any], candidate: dict[str, Any], primary: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    timings: dict[str, dict[str, Any]] = {}
    if primary:
        timings["redis"] = {
            "queue_wait_ms": primary.get("queue_wait_ms"),
            "processing_ms": primary.get("processing_ms"),
            "deliveries": primary.get("deliveries"),
            "consumer": primary.get("consumer"),
        }
    if candidate:
        timings["kafka"] = {
            "queue_wait_ms": candidate.get("queue_wait_ms"),
            "processing_ms": candidate.get("processing_ms"),
            "attempts": candidate.get("attempts"),
        }
    if control:
        timings["control"] = {
            "processing_ms": control.get("processing_ms"),
            "mirror_latency_ms": control.get("mirror_latency_ms"),
        }
    return timings
