"""Comparators: how the outcomes of the Redis path and the Kafka path are judged alike."""

from comparators.base import Comparator, Difference
from comparators.delivery import DeliveryComparator
from comparators.digest import canonical_digest, canonical_json, outcome_digest
from comparators.errors import RulesError
from comparators.noise import NoiseBaseline
from comparators.ordering import OrderingComparator, OrderTracker, parse_entry_id
from comparators.outcome import OutcomeComparator, OutcomeComparison
from comparators.paths import readable_path, to_deepdiff_path
from comparators.payload import PayloadComparator
from comparators.registry import (
    COMPARATORS,
    COMPARATORS_BY_NAME,
    MISMATCH_NAMES,
    ComparatorRow,
    CompareContext,
    build_comparators,
)
from comparators.routing import RoutingComparator
from comparators.rules import CompareRules, TypeRules, load_rules

__all__ = [
    "COMPARATORS",
    "COMPARATORS_BY_NAME",
    "MISMATCH_NAMES",
    "Comparator",
    "ComparatorRow",
    "CompareContext",
    "CompareRules",
    "DeliveryComparator",
    "Difference",
    "NoiseBaseline",
    "OrderTracker",
    "OrderingComparator",
    "OutcomeComparator",
    "OutcomeComparison",
    "PayloadComparator",
    "RoutingComparator",
    "RulesError",
    "TypeRules",
    "build_comparators",
    "canonical_digest",
    "canonical_json",
    "load_rules",
    "outcome_digest",
    "parse_entry_id",
    "readable_path",
    "to_deepdiff_path",
]
