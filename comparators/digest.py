"""A stable digest of an outcome, so verdict records can name outcomes without carrying them."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(outcome: Any) -> bytes:
    """Key-sorted, compact JSON: equal outcomes give equal bytes whatever their key order."""
    return json.dumps(
        outcome, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def canonical_or_none(outcome: Any) -> bytes | None:
    """``canonical_json``, or ``None`` for what JSON cannot hold (NaN, sets, custom objects)."""
    try:
        return canonical_json(outcome)
    except (TypeError, ValueError):
        return None


def digest_of_canonical(canonical: bytes) -> str:
    """SHA-256, hex, of ``canonical_json`` bytes: a caller holding them need not redo them."""
    return hashlib.sha256(canonical).hexdigest()


def canonical_digest(outcome: Any) -> tuple[bytes, str]:
    """Canonical JSON and its digest together, serialising the outcome once."""
    canonical = canonical_json(outcome)
    return canonical, digest_of_canonical(canonical)


def outcome_digest(outcome: Any) -> str:
    """SHA-256 of the canonical JSON, hex; raises ``ValueError``/``TypeError`` if not JSON."""
    return digest_of_canonical(canonical_json(outcome))
