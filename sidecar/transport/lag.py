"""How far a consumer group is behind the end of a stream."""

from __future__ import annotations

import valkey.asyncio as valkey

# Beyond this many entries, the Redis < 7 fallback stops counting and reports "at least".
LAG_COUNT_CAP = 10_000


async def stream_lag(client: valkey.Valkey, stream: str, group: str) -> int | None:
    """Entries not yet delivered to ``group``; ``None`` if the stream or group is absent.

    Redis 7+ reports ``lag`` in XINFO GROUPS, but leaves it nil when it cannot tell (after
    deletions, or for a group created at an arbitrary id). Then, and on older servers that
    lack the field, the entries after ``last-delivered-id`` are counted, up to a cap.
    """
    try:
        groups = await client.xinfo_groups(stream)
    except valkey.ResponseError:
        return None
    for info in groups:
        name = info.get("name")
        if (name.decode() if isinstance(name, bytes) else name) != group:
            continue
        lag = info.get("lag")
        if isinstance(lag, int):
            return lag
        last = info.get("last-delivered-id") or b"0-0"
        last_text = last.decode() if isinstance(last, bytes) else str(last)
        after = await client.xrange(stream, min=f"({last_text}", count=LAG_COUNT_CAP)
        return len(after)
    return None
