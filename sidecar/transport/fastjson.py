"""JSON at the hot path's pace: orjson where it gives what :mod:`json` gives, :mod:`json` elsewhere.

A verdict parses and writes JSON about ten times (the task on each path, the facts of each run,
the verdict record); with the standard library that was an eighth of the sidecar's CPU. orjson
does the same work in a fraction of the time, but not always with the same result, so:

- :func:`loads` returns exactly what ``json.loads`` returns. orjson reads integers past 64 bits
  as floats and refuses what Python accepts (``NaN``, ``Infinity``, lone surrogates, numbers
  past a double's range); a text with a run of 19 digits or more, or one orjson refuses, is
  parsed by :mod:`json` instead, which then succeeds or raises its own ``JSONDecodeError``.
- :func:`dumps` writes compact UTF-8 JSON (a non-finite float as ``null``: the records it
  writes hold none). What orjson cannot write (integers past 64 bits, keys that are not
  strings, lone surrogates) is written by :mod:`json`, compact and ASCII. It is for the
  sidecar's own records (facts, verdicts), never for a digest: canonical JSON stays
  :func:`comparators.digest.canonical_json`, whose bytes must not change between releases.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson

__all__ = ["dumps", "loads"]

# 19 digits can exceed a signed 64-bit integer, which orjson would read as a float. Found by
# mapping every digit to "0" and anything else to " ", then a substring search: a tenth of what
# a regular expression's search costs on a task.
_DIGITS_ONLY = bytes(0x30 if 0x30 <= byte <= 0x39 else 0x20 for byte in range(256))
_LONG_DIGITS = b"0" * 19


def loads(data: bytes) -> Any:
    """``json.loads(data.decode())``, faster; raises as it does (``UnicodeDecodeError`` for
    bytes that are not UTF-8, :class:`json.JSONDecodeError` for text that is not JSON)."""
    if _LONG_DIGITS not in data.translate(_DIGITS_ONLY):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass  # json says what is wrong, or reads what orjson refuses
    # Decoded first: json.loads would take bytes for UTF-16 or UTF-32 from their zero bytes.
    return json.loads(data.decode("utf-8"))


def dumps(value: Any, default: Callable[[Any], Any] | None = None) -> bytes:
    """Compact JSON as UTF-8 bytes; ``default`` as for ``json.dumps``."""
    try:
        return orjson.dumps(value, default=default)
    except TypeError:  # orjson.JSONEncodeError: a big integer, a non-string key, ...
        return json.dumps(value, separators=(",", ":"), default=default).encode()
