"""What the judge compares a joined entry with: the comparator set, under ``COMPARE_RULES``.

The comparators are the rows of ``comparators.registry``. A mismatch is a difference in the
payload, the handler's outcome (less the noise the redis run side's extra runs found), the
routing, or per-key order (found by the shadow as it consumes, see the registry). Delivery
timing is compared too, but reported as findings: a slow path is a finding, not a wrong answer.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from comparators import (
    COMPARATORS,
    COMPARATORS_BY_NAME,
    MISMATCH_NAMES,
    CompareContext,
    CompareRules,
    Difference,
    NoiseBaseline,
    OutcomeComparator,
    RulesError,
    build_comparators,
    load_rules,
    outcome_digest,
)
from sidecar.config import ShadowSettings
from sidecar.errors import ConfigError
from sidecar.verdicts.model import VerdictRecord

# The comparators whose differences make a mismatch (delivery timing is only reported).
MISMATCH_COMPARATORS: tuple[str, ...] = MISMATCH_NAMES


def load_compare_rules(path: str | None) -> CompareRules:
    """``COMPARE_RULES`` as rules; a bad file stops the sidecar naming the variable."""
    if path is None:
        return CompareRules()
    try:
        return load_rules(path)
    except RulesError as exc:
        raise ConfigError("COMPARE_RULES", str(exc)) from exc


def digest_or_none(outcome: Any) -> str | None:
    """The outcome's digest, or ``None`` for an outcome that is not JSON (an error)."""
    try:
        return outcome_digest(outcome)
    except (TypeError, ValueError):
        return None


class Comparators:
    """The comparators of one judge; ``rules`` come from ``COMPARE_RULES``."""

    def __init__(self, rules: CompareRules, latency_tolerance_ms: float) -> None:
        self.rules = rules
        self._context = CompareContext(rules, latency_tolerance_ms)
        built = build_comparators(self._context)
        # The rows run from their sides alone (the others are wired below, each for a reason).
        self._generic = [
            (row.name, row.mismatch, row.sides, built[row.name])
            for row in COMPARATORS
            if row.sides is not None and row.name in built
        ]
        self._payloads, self._delivery = built["payload"], built["delivery"]
        outcomes = built["outcome"]
        if not isinstance(outcomes, OutcomeComparator):
            # It also takes the task type, which the Protocol has no room for.
            raise TypeError(f"the outcome row built a {type(outcomes).__name__}")
        self._outcomes = outcomes

    @classmethod
    def from_settings(cls, shadow: ShadowSettings) -> Comparators:
        """Rules from ``COMPARE_RULES``; a bad file raises :class:`ConfigError`."""
        return cls(load_compare_rules(shadow.rules_file), shadow.latency_tolerance_ms)

    def differences(
        self,
        redis_run: dict[str, Any],
        kafka_run: dict[str, Any],
        fields: dict[str, bytes],
        record: VerdictRecord,
    ) -> list[Difference]:
        """What makes the two sides a mismatch; fills in ``record``'s comparator counts, its
        noise and its (delivery) findings on the way."""
        task_type = record.task_type or "parse"
        found: dict[str, list[Difference]] = {}
        if kafka_run.get("decode_error"):
            found["payload"] = [Difference("", "undecodable", None, kafka_run["decode_error"])]
        elif redis_run.get("value_sha") != kafka_run.get("value_sha"):
            found["payload"] = self._payloads.compare(
                fields.get("redis_run_value", b""), fields.get("kafka_run_value", b"")
            )
        if not kafka_run.get("decode_error"):
            digest = redis_run.get("digest")
            if digest is not None and digest == kafka_run.get("digest"):
                # The digests are SHA-256 of the outcomes' canonical JSON: equal, so the
                # comparator would find them equal too, after serialising both again.
                outcome: list[Difference] = []
            else:
                outcome = self._outcomes.compare(
                    redis_run.get("outcome"), kafka_run.get("outcome"), task_type
                )
            real, noise = NoiseBaseline(frozenset(redis_run.get("noise_paths", ()))).split(outcome)
            if noise:
                record.noise = {"count": len(noise), "paths": sorted({d.path for d in noise})}
            found["outcome"] = real
        routed_to = redis_run.get("topic")
        # The mirror recorded the topic it routed to: that is the one the Kafka copy must be on.
        routing = COMPARATORS_BY_NAME["routing"].factory(
            replace(self._context, expected_topic=lambda _type, _priority: str(routed_to))
        )
        found["routing"] = routing.compare(redis_run, kafka_run)
        if kafka_run.get("order_violation"):
            violation = kafka_run["order_violation"]
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
        findings = {"delivery": delivery}
        if not kafka_run.get("decode_error"):
            # An undecodable Kafka copy ran no handler: there is nothing of its run to compare.
            for name, mismatch, sides, comparator in self._generic:
                differences = comparator.compare(*sides(redis_run, kafka_run))
                (found if mismatch else findings)[name] = differences
        record.comparators = {name: len(items) for name, items in found.items()}
        record.comparators.update((name, len(items)) for name, items in findings.items())
        record.findings = [d.to_dict() for items in findings.values() for d in items]
        return [d for items in found.values() for d in items]
