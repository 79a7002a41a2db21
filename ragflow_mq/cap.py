"""The served share's cap: a percentage kept in Valkey that can only lower the env's share.

``ragflow-sidecar gate --apply`` writes it; every RAGFlow process with ``install()`` reads it
every ``SERVE_CAP_REFRESH_S`` and serves ``min(KAFKA_SERVE_PERCENT, cap)``. It is never raised
above the env value by anyone: raising the share is an operator's change of the env.
"""

from __future__ import annotations

import math

# Lowering is one atomic step, so two gates applying at once keep the lower of their values.
LOWER_SCRIPT = """
local current = tonumber(redis.call('GET', KEYS[1]))
local wanted = tonumber(ARGV[1])
if current == nil or wanted < current then
  redis.call('SET', KEYS[1], ARGV[1])
  return ARGV[1]
end
return tostring(current)
"""


def parse_cap(raw: str | bytes | None) -> float | None:
    """The cap as a percentage, or ``None`` when unset or unreadable (then no cap applies,
    and the reader logs it: a garbled key must not silently serve more than the env says)."""
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    if math.isnan(value):
        return None
    return min(max(value, 0.0), 100.0)


def effective_percent(env_percent: float, cap: float | None) -> float:
    """What is served: the env's share, lowered by the cap when one is set."""
    return env_percent if cap is None else min(env_percent, cap)
