"""One processing of each stream entry, however often Kafka delivers its copy.

The first delivery takes a key per entry with NX and a TTL (``SHADOW_DEDUP_TTL_S``); a later
delivery finds the kafka run already recorded (a mirror replay: the join counts a duplicate),
or a live instance processing it now (left to it), or a holder that died before recording
(taken over). Liveness is each instance's ``ALIVE_PREFIX`` key, which the shadow refreshes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Literal

import valkey.asyncio as valkey

from sidecar.transport.valkey_client import translate_valkey_errors
from sidecar.verdicts.join import ALIVE_PREFIX, SEEN_PREFIX, EntryRef

Claim = Literal["process", "recorded", "skip"]


async def claim_entries(
    client: valkey.Valkey,
    entries: Sequence[tuple[EntryRef, str]],
    me: bytes,
    ttl_s: int,
    ragflow: tuple[valkey.Valkey, str] | None = None,
) -> list[tuple[Claim, bool]]:
    """For each ``(entry, cancel key)``: whether this delivery processes the entry
    (``process``), finds its kafka run already recorded (``recorded``), or leaves it to a live
    instance processing it now (``skip``); and whether RAGFlow cancelled the task. The usual
    case (the key was free) takes one pipelined round trip for all of them.

    ``client`` is the state store's. The cancel keys are RAGFlow's: on ``client`` too unless
    ``ragflow`` (RAGFlow's Valkey and its display URL) is given, a state store of its own; both
    servers are then asked at once, a round trip each."""
    pipe = client.pipeline(transaction=False)
    for ref, cancel_key in entries:
        pipe.set(_seen_key(ref), me, nx=True, ex=ttl_s)
        if ragflow is None:
            pipe.exists(cancel_key)
    if ragflow is None:
        replies = await pipe.execute()
        taken, cancelled = replies[0::2], replies[1::2]
    else:
        taken, cancelled = await asyncio.gather(
            pipe.execute(), _exist(ragflow, [key for _, key in entries])
        )
    claims: list[tuple[Claim, bool]] = []
    for (ref, _), free, gone in zip(entries, taken, cancelled, strict=True):
        claim: Claim = "process" if free else await _contended(client, ref, me, ttl_s)
        claims.append((claim, bool(gone)))
    return claims


async def _exist(ragflow: tuple[valkey.Valkey, str], keys: list[str]) -> list[Any]:
    """EXISTS of each of ``keys`` in RAGFlow's Valkey, in one pipeline."""
    client, where = ragflow
    with translate_valkey_errors("look up the cancel keys", where):
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.exists(key)
        return list(await pipe.execute())


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
