"""The judge: joins each task's control, candidate and primary records and publishes a verdict.

Both the mirror (control) and the shadow consumer (candidate) hand their records to a judge;
whichever completes the pair decides (see :mod:`sidecar.verdicts.join`). A sweeper decides entries
left open past ``SHADOW_COMPARE_TIMEOUT_S``. What counts as a mismatch: a difference in the payload,
the handler's outcome (under ``COMPARE_RULES``, less noise), the routing, or per-key order.
Delivery timing differences are reported in the verdict but do not make it a mismatch: a slow
path is a finding, not a wrong answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import valkey.asyncio as valkey

from comparators import (
    CompareRules,
    DeliveryComparator,
    Difference,
    NoiseBaseline,
    OutcomeComparator,
    PayloadComparator,
    RoutingComparator,
    RulesError,
    load_rules,
    outcome_digest,
)
from sidecar.config import Settings
from sidecar.errors import ConfigError, SidecarError
from sidecar.lifecycle import Lifecycle
from sidecar.telemetry.tracing import Tracing
from sidecar.transport.base import OutgoingMessage
from sidecar.transport.kafka import KafkaProducer
from sidecar.transport.topics import TASK_TOPICS, VERDICTS_TOPIC
from sidecar.transport.valkey_client import create_client, translate_valkey_errors
from sidecar.verdicts.join import Arrival, EntryRef, JoinStore, RecordOutcome, Side
from sidecar.verdicts.model import VerdictRecord, capped
from sidecar.verdicts.progress import ShadowProgress
from sidecar.verdicts.reader import read_verdicts
from sidecar.verdicts.trace import compare_span

logger = logging.getLogger(__name__)

SWEEP_BATCH = 200
# An entry open this many compare timeouts is decided even if the shadow group has not been
# seen to read past its copy (no shadow running, Kafka not answering offset requests).
GIVE_UP_TIMEOUTS = 10


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


def load_compare_rules(path: str | None) -> CompareRules:
    """``COMPARE_RULES`` as rules; a bad file stops the sidecar naming the variable."""
    if path is None:
        return CompareRules()
    try:
        return load_rules(path)
    except RulesError as exc:
        raise ConfigError("COMPARE_RULES", str(exc)) from exc


class Judge(Lifecycle):
    """Records sides in the join and publishes verdicts to ``ragflow.shadow.verdicts``."""

    def __init__(self, settings: Settings, *, tracing: Tracing | None = None) -> None:
        """Without ``tracing`` the judge has its own, from ``settings.tracing``; the control
        and shadow sides use the judge's."""
        super().__init__()
        self.settings = settings
        self.tracing = tracing or Tracing(settings.tracing, settings.shadow.instance)
        self._own_tracing = tracing is None
        shadow = settings.shadow
        self.stats = JudgeStats()
        self.rules = load_compare_rules(shadow.rules_file)
        self._outcomes = OutcomeComparator(self.rules)
        self._payloads = PayloadComparator()
        self._delivery = DeliveryComparator(shadow.latency_tolerance_ms)
        self._client = create_client(settings.redis)
        self._where = settings.redis.display_url
        self.join = JoinStore(self._client, ttl_s=shadow.join_ttl_s)
        self._producer = KafkaProducer(settings.kafka)
        # The topics the shadow consumer reads (its commits are the evidence).
        self._progress = ShadowProgress(settings.kafka, shadow.group, TASK_TOPICS)
        # A claim older than this belonged to an instance that died before publishing: a live
        # one gives up on Kafka after twice its request timeout (KafkaProducer's bound).
        self._stale_claim_ms = max(
            int(shadow.compare_timeout_s * 1000), 2 * settings.kafka.request_timeout_ms + 1000
        )

    async def _start(self) -> None:
        try:
            with translate_valkey_errors("PING", self._where):
                await self._client.ping()
            await self._producer.start()
            await self._progress.start()
        except BaseException:
            # A failed start is retried by the supervisor with a new judge: close all of this
            # one's clients (stop() does nothing on a judge that never started).
            await self._close()
            raise
        if self._own_tracing:
            await self.tracing.start()

    async def _stop(self) -> None:
        try:
            await self._close()
        finally:
            if self._own_tracing:
                await self.tracing.stop()

    async def _close(self) -> None:
        try:
            await self._progress.stop()
        finally:
            try:
                await self._producer.stop()
            finally:
                await self._client.aclose()

    @property
    def join_client(self) -> valkey.Valkey:
        """The judge's Valkey client, shared by the control and shadow sides."""
        return self._client

    def _token(self, now_ms: int) -> str:
        return f"{self.settings.shadow.instance}@{now_ms}"

    async def record(self, side: Side, arrivals: Sequence[Arrival]) -> list[RecordOutcome]:
        """Store one side of each entry; decide and publish the entries this completed."""
        now_ms = int(time.time() * 1000)
        token = self._token(now_ms)
        with translate_valkey_errors(f"record the {side} side", self._where):
            outcomes = await self.join.record(side, arrivals, token, now_ms)
        ready = [a.ref for a, o in zip(arrivals, outcomes, strict=True) if o == "decide"]
        duplicates = [a for a, o in zip(arrivals, outcomes, strict=True) if o == "duplicate"]
        if ready:
            await self._decide(ready, token, timed_out=False)
        if duplicates:
            await self._publish_duplicates(duplicates, token)
        return outcomes

    async def sweep(self, now_ms: int | None = None) -> int:
        """Decide entries open past the compare timeout; returns how many were decided."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        token = self._token(now_ms)
        older_than = await self._sweep_cutoff(now_ms)
        with translate_valkey_errors("sweep open entries", self._where):
            claimed = await self.join.claim_expired(
                older_than, token, now_ms, self._stale_claim_ms, SWEEP_BATCH
            )
        taken_over = [at for _, at in claimed if at is not None]
        already: dict[str, str] = {}
        if taken_over:
            # A dead claimer may have published before it could mark the entry: look for
            # its verdicts rather than publish a second one.
            published = await read_verdicts(
                self.settings.kafka, since_ms=min(taken_over), verdicts=None, task_types=None
            )
            already = {str(v["verdict_id"]): str(v["verdict"]) for v in published}
        fresh: list[EntryRef] = []
        done: list[tuple[EntryRef, str, str, str]] = []
        for ref, _ in claimed:
            verdict = already.get(f"{ref.stream}/{ref.entry_id}/final")
            if verdict is None:
                fresh.append(ref)
            else:
                done.append((ref, token, verdict, "final"))
        self.stats.taken_over += len(taken_over)
        if taken_over:
            logger.info(
                "took over %d decisions of a dead instance; %d of them were already published",
                len(taken_over),
                len(done),
            )
        if done:
            with translate_valkey_errors("mark verdicts published", self._where):
                await self.join.finish(done)
        if fresh:
            await self._decide(fresh, token, timed_out=True)
        return len(claimed)

    async def _sweep_cutoff(self, now_ms: int) -> int:
        """Entries opened before this are decided: past the compare timeout, and (within the
        give-up bound) only once the shadow group has read past where their copies are."""
        timeout_ms = int(self.settings.shadow.compare_timeout_s * 1000)
        cutoff = now_ms - timeout_ms
        give_up = now_ms - GIVE_UP_TIMEOUTS * timeout_ms
        try:
            read_up_to = await self._progress.read_up_to_ms()
        except SidecarError as exc:
            logger.debug(
                "shadow progress unknown (%s); deciding only what is past %d ms",
                exc,
                GIVE_UP_TIMEOUTS * timeout_ms,
            )
            read_up_to = None
        if read_up_to is None:
            return give_up
        return max(min(cutoff, read_up_to), give_up)

    async def run_sweeper(self, stop: asyncio.Event, interval_s: float = 1.0) -> None:
        """Sweep every ``interval_s`` until ``stop``; a failing round is retried, not fatal."""
        while not stop.is_set():
            try:
                while await self.sweep() == SWEEP_BATCH:
                    pass
            except SidecarError as exc:
                if exc.needs_new_client:
                    raise  # retrying with the same producer cannot help: rebuild
                logger.warning("verdict sweep failed, retrying: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=interval_s)

    async def _decide(self, refs: list[EntryRef], token: str, *, timed_out: bool) -> None:
        with translate_valkey_errors("load joined records", self._where):
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
        with translate_valkey_errors("mark verdicts published", self._where):
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
        differences = self._differences(control, candidate, fields, record)
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

    def _differences(
        self,
        control: dict[str, Any],
        candidate: dict[str, Any],
        fields: dict[str, bytes],
        record: VerdictRecord,
    ) -> list[Difference]:
        task_type = record.task_type or "parse"
        found: dict[str, list[Difference]] = {}
        if candidate.get("decode_error"):
            found["payload"] = [Difference("", "undecodable", None, candidate["decode_error"])]
        elif control.get("value_sha") != candidate.get("value_sha"):
            found["payload"] = self._payloads.compare(
                fields.get("control_value", b""), fields.get("candidate_value", b"")
            )
        if not candidate.get("decode_error"):
            outcome = self._outcomes.compare(
                control.get("outcome"), candidate.get("outcome"), task_type
            )
            real, noise = NoiseBaseline(frozenset(control.get("noise_paths", ()))).split(outcome)
            if noise:
                record.noise = {"count": len(noise), "paths": sorted({d.path for d in noise})}
                self.stats.noise += len(noise)
            found["outcome"] = real
        routed_to = control.get("topic")
        found["routing"] = RoutingComparator(lambda _type, _priority: str(routed_to)).compare(
            control, candidate
        )
        if candidate.get("order_violation"):
            violation = candidate["order_violation"]
            found["ordering"] = [
                Difference("order", "order", violation.get("after"), record.entry_id)
            ]
        timings = record.timings
        delivery = self._delivery.compare(
            {
                "deliveries": timings.get("redis", {}).get("deliveries"),
                "latency_ms": timings.get("redis", {}).get("queue_wait_ms"),
            },
            {"deliveries": None, "latency_ms": timings.get("kafka", {}).get("queue_wait_ms")},
        )
        record.comparators = {name: len(items) for name, items in found.items()}
        record.comparators["delivery"] = len(delivery)
        record.findings = [d.to_dict() for d in delivery]
        return [d for items in found.values() for d in items]


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


def digest_or_none(outcome: Any) -> str | None:
    """The outcome's digest, or ``None`` for an outcome that is not JSON (an error)."""
    try:
        return outcome_digest(outcome)
    except (TypeError, ValueError):
        return None
