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


def outcome_digest(outcome: Any) -> str:
    """SHA-256 of the canonical JSON, hex; raises ``ValueError``/``TypeError`` if not JSON."""
    return hashlib.sha256(canonical_json(outcome)).hexdigest()
