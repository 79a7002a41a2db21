"""One processing of each stream entry, however often Kafka delivers its copy.

The first delivery takes a key per entry with NX and a TTL (``SHADOW_DEDUP_TTL_S``); a later
delivery finds the kafka run already recorded (a mirror replay: the join counts a duplicate),
or a live instance processing it now (left to it), or a holder that died before recording
(taken over). Liveness is each instance's ``ALIVE_PREFIX`` key, which the shadow refreshes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Literal

import valkey.asyncio as valkey
from valkey.commands.core import AsyncScript

from sidecar.transport.valkey_client import translate_valkey_errors
from sidecar.verdicts.join import ALIVE_PREFIX, SEEN_PREFIX, EntryRef

Claim = Literal["process", "recorded", "skip"]


# KEYS: a dedup key per entry. ARGV: the holder (this instance), ttl_s. One reply per key:
# 1 where this call took it (SET NX EX), 0 where someone holds it already.
_CLAIM = """
local replies = {}
for i = 1, #KEYS do
  if redis.call('SET', KEYS[i], ARGV[1], 'NX', 'EX', ARGV[2]) then
    replies[i] = 1
  else
    replies[i] = 0
  end
end
return replies
"""


def claim_script(client: valkey.Valkey) -> AsyncScript:
    """The claims' script on ``client``: registered once, called per batch by EVALSHA."""
    return client.register_script(_CLAIM)


async def claim_entries(
    client: valkey.Valkey,
    script: AsyncScript,
    entries: Sequence[tuple[EntryRef, str]],
    *,
    me: bytes,
    ttl_s: int,
    ragflow: tuple[valkey.Valkey, str] | None = None,
) -> list[tuple[Claim, bool]]:
    """For each ``(entry, cancel key)``: whether this delivery processes the entry
    (``process``), finds its kafka run already recorded (``recorded``), or leaves it to a live
    instance processing it now (``skip``); and whether RAGFlow cancelled the task. The usual
    case (every key free) is two commands for the whole batch, sent at once: one script for the
    claims and one MGET of the cancel keys (RAGFlow reads them with GET).

    ``client`` is the state store's, ``script`` its :func:`claim_script`. The cancel keys are
    RAGFlow's: on ``client`` too unless ``ragflow`` (RAGFlow's Valkey and its display URL) is
    given, a state store of its own."""
    if not entries:
        return []
    cancel_keys = [key for _, key in entries]
    taken, cancelled = await asyncio.gather(
        script(keys=[_seen_key(ref) for ref, _ in entries], args=[me, ttl_s]),
        cancel_keys_set(client, cancel_keys)
        if ragflow is None
        else _cancel_keys_in(ragflow, cancel_keys),
    )
    claims: list[tuple[Claim, bool]] = []
    for (ref, _), free, gone in zip(entries, taken, cancelled, strict=True):
        claim: Claim = "process" if free else await _contended(client, ref, me, ttl_s)
        claims.append((claim, gone))
    return claims


async def cancel_keys_set(client: valkey.Valkey, keys: Sequence[str]) -> list[bool]:
    """Whether each of RAGFlow's cancel ``keys`` is set, in one MGET (RAGFlow reads each with
    GET, so a key that is not a string does not count, as for RAGFlow)."""
    if not keys:
        return []
    return [value is not None for value in await client.mget(keys)]


async def _cancel_keys_in(ragflow: tuple[valkey.Valkey, str], keys: Sequence[str]) -> list[bool]:
    client, where = ragflow
    with translate_valkey_errors("look up the cancel keys", where):
        return await cancel_keys_set(client, keys)


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
