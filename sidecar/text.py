"""Text from values that may come as bytes: replies of a client that does not decode them."""

from __future__ import annotations


def as_text(raw: object) -> str:
    """``raw`` as text: bytes decoded as UTF-8 (bad bytes replaced), anything else by ``str``."""
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
