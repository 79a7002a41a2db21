"""Comparators: how the outcomes of the Redis path and the Kafka path are judged alike."""

from comparators.digest import canonical_json, outcome_digest

__all__ = ["canonical_json", "outcome_digest"]
