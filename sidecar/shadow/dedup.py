"""One processing of each stream entry, however often Kafka delivers its copy.

The first delivery takes a key per entry with NX and a TTL (``SHADOW_DEDUP_TTL_S``); a later
delivery finds the kafka run already recorded (a mirror replay: the join counts a duplicate),
or a live instance processing it now (left to it), or a holder that died before recording
(taken over). Liveness is each instance's ``ALIVE_PREFIX`` key, which the shadow refreshes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import valkey.asyncio as valkey

from sidecar.verdicts.join import ALIVE_PREFIX, SEEN_PREFIX, EntryRef

Claim = Literal["process", "recorded", "skip"]


async def claim_entries(
    client: valkey.Valkey, entries: Sequence[tuple[EntryRef, str]], me: bytes, ttl_s: int
) -> list[tuple[Claim, bool]]:
    """For each ``(entry, cancel key)``: whether this delivery processes the entry
    (``process``), finds its kafka run already recorded (``recorded``), or leaves it to a live
    instance processing it now (``skip``); and whether RAGFlow cancelled the task. The usual
    case (the key was free) takes one pipelined round trip for all of them."""
    pipe = client.pipeline(transaction=False)
    for ref, cancel_key in entries:
        pipe.set(_seen_key(ref), me, nx=True, ex=ttl_s)
        pipe.exists(cancel_key)
    replies = await pipe.execute()
    claims: list[tuple[Claim, bool]] = []
    for n, (ref, _) in enumerate(entries):
        taken, cancelled = replies[2 * n], bool(replies[2 * n + 1])
        claim: Claim = "process" if taken else await _contended(client, ref, me, ttl_s)
        claims.append((claim, cancelled))
    return claims


def _seen_key(ref: EntryRef) -> str:
    return f"{SEEN_PREFIX}{ref.stream}:{ref.entry_id}"


async def _contended(client: valkey.Valkey, ref: EntryRef, me: bytes, ttl_s: int) -> Claim:
    """The key was taken already: by a recorded run, a live instance, ourselves, or the dead."""
    if await client.hexists(ref.key, "kafka_run"):  # type: ignore[misc]
        return "recorded"
    key = _seen_key(ref)
    holder = await client.get(key)
    if holder == me:
        # A second copy while ours is in flight: the join keeps one, counts the other.
        return "process"
    if holder and await client.exists(f"{ALIVE_PREFIX}{holder.decode()}"):
        return "skip"
    # Its holder died before recording an outcome: this delivery takes it over.
    await client.set(key, me, ex=ttl_s)
    return "process"
