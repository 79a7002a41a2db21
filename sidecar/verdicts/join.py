"""Where the records of one task meet: a Valkey hash per stream entry, completed atomically.

The redis run (the handler's run on the Redis copy, written by the mirror), the kafka run (its
run on the Kafka copy, written by the shadow consumer) and the worker's delivery (RAGFlow's own
worker, written by the observer) arrive in any order, from any sidecar instance. Each arrival
is one Lua script: it stores its side, and the arrival that completes redis run + kafka run also
claims the right to decide, so exactly one instance judges each entry. Entries still open after
the compare timeout are claimed by the sweeper (``missing_in_kafka`` / ``missing_in_redis``).

A claim is a token (instance and time). Deciding is claim, publish the verdict, then ``finish``;
a claim older than ``stale_claim_ms`` belonged to an instance that died before publishing, and
the sweeper takes it over, so a crash loses no verdict.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import valkey.asyncio as valkey
from valkey.commands.core import AsyncScript
from valkey.exceptions import NoScriptError

from sidecar.verdicts.model import VERDICT_COUNTS_KEY

JOIN_PREFIX: Final = "ragflow_sidecar:join:"
OPEN_KEY: Final = "ragflow_sidecar:join:open"
SEEN_PREFIX: Final = "ragflow_sidecar:seen:"
ALIVE_PREFIX: Final = "ragflow_sidecar:alive:"

Side = Literal["redis_run", "kafka_run", "worker"]
SIDES: Final[tuple[Side, ...]] = ("redis_run", "kafka_run", "worker")
RecordOutcome = Literal[
    "decide", "recorded", "exists", "redelivery", "duplicate", "duplicate_again"
]

# KEYS: hash, open zset. ARGV: side, facts, value, now_ms, ttl_s, member, claim token, origin.
# The origin (topic:partition:offset of a kafka run) tells a redelivery of the same Kafka record
# (a shadow restart before its commit) from a second copy of the entry (a mirror replay).
_RECORD = """
local side = ARGV[1]
local existed = redis.call('EXISTS', KEYS[1])
if redis.call('HEXISTS', KEYS[1], side) == 1 then
  if ARGV[8] ~= '' and redis.call('HGET', KEYS[1], side .. '_origin') == ARGV[8] then
    return 'redelivery'
  end
  if side == 'kafka_run' then
    redis.call('HINCRBY', KEYS[1], 'kafka_deliveries', 1)
    if redis.call('HSETNX', KEYS[1], 'dup_state', ARGV[7]) == 1 then
      return 'duplicate'
    end
    return 'duplicate_again'
  end
  return 'exists'
end
redis.call('HSET', KEYS[1], side, ARGV[2])
if ARGV[8] ~= '' then
  redis.call('HSET', KEYS[1], side .. '_origin', ARGV[8])
end
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[1], side .. '_value', ARGV[3])
end
if side == 'kafka_run' then
  redis.call('HINCRBY', KEYS[1], 'kafka_deliveries', 1)
end
if side ~= 'worker' and redis.call('HSETNX', KEYS[1], 'created_ms', ARGV[4]) == 1 then
  redis.call('ZADD', KEYS[2], ARGV[4], ARGV[6])
end
if redis.call('HEXISTS', KEYS[1], 'state') == 0 then
  if side == 'worker' and existed == 0 then
    -- RAGFlow's delivery of a task the mirror never carries (outside the traffic share).
    redis.call('EXPIRE', KEYS[1], 3600)
  else
    redis.call('EXPIRE', KEYS[1], ARGV[5])
  end
end
if side ~= 'worker'
   and redis.call('HEXISTS', KEYS[1], 'redis_run') == 1
   and redis.call('HEXISTS', KEYS[1], 'kafka_run') == 1
   and redis.call('HSETNX', KEYS[1], 'state', ARGV[7]) == 1 then
  return 'decide'
end
return 'recorded'
"""

# KEYS: hash, open zset, counts. ARGV: token, member, verdict, kind (final|duplicate), ttl_s.
_FINISH = """
local field = 'state'
if ARGV[4] == 'duplicate' then field = 'dup_state' end
if redis.call('HGET', KEYS[1], field) ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], field, 'done')
if ARGV[4] == 'final' then
  redis.call('ZREM', KEYS[2], ARGV[2])
  redis.call('HDEL', KEYS[1], 'redis_run_value', 'kafka_run_value')
  redis.call('EXPIRE', KEYS[1], ARGV[5])
end
redis.call('HINCRBY', KEYS[3], ARGV[3], 1)
return 1
"""

# KEYS: hash, open zset. ARGV: member, token, now_ms, stale_claim_ms.
# Claims an open entry for the sweeper: unclaimed (returns 1), or claimed by someone who died
# (returns the dead claim's time, so the sweeper can look for a verdict it already published).
_CLAIM_EXPIRED = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('ZREM', KEYS[2], ARGV[1])
  return 0
end
local state = redis.call('HGET', KEYS[1], 'state')
if state == 'done' then
  redis.call('ZREM', KEYS[2], ARGV[1])
  return 0
end
if state then
  local at = tonumber(string.match(state, '@(%d+)$') or '0')
  if tonumber(ARGV[3]) - at < tonumber(ARGV[4]) then
    return 0
  end
end
redis.call('HSET', KEYS[1], 'state', ARGV[2])
if state then
  return math.max(tonumber(string.match(state, '@(%d+)$') or '1'), 1)
end
return 1
"""


@dataclass(frozen=True, slots=True)
class EntryRef:
    """One stream entry, the unit everything is joined on."""

    stream: str
    entry_id: str

    @property
    def key(self) -> str:
        return f"{JOIN_PREFIX}{self.stream}:{self.entry_id}"

    @property
    def member(self) -> str:
        # Entry ids never hold '|', so the last '|' splits a member back into its parts.
        return f"{self.stream}|{self.entry_id}"

    @classmethod
    def from_member(cls, member: str) -> EntryRef:
        stream, _, entry_id = member.rpartition("|")
        return cls(stream, entry_id)


@dataclass(frozen=True, slots=True)
class Arrival:
    """One side's record for one entry: JSON facts, and the raw task bytes if it has them."""

    ref: EntryRef
    facts: bytes
    value: bytes = b""
    origin: str = ""  # where this copy was read (topic:partition:offset), for redeliveries


class JoinStore:
    """The join hashes and the index of open entries, on a raw-bytes Valkey client."""

    def __init__(self, client: valkey.Valkey, *, ttl_s: int, done_ttl_s: int = 3600) -> None:
        self._client = client
        self._ttl_s = ttl_s
        self._done_ttl_s = done_ttl_s
        self._record = client.register_script(_RECORD)
        self._finish = client.register_script(_FINISH)
        self._claim_expired = client.register_script(_CLAIM_EXPIRED)

    async def record(
        self, side: Side, arrivals: Sequence[Arrival], token: str, now_ms: int
    ) -> list[RecordOutcome]:
        """Store one side for each entry; one outcome per arrival, in order."""
        calls = [
            (
                [arrival.ref.key, OPEN_KEY],
                [
                    side,
                    arrival.facts,
                    arrival.value,
                    now_ms,
                    self._ttl_s,
                    arrival.ref.member,
                    token,
                    arrival.origin,
                ],
            )
            for arrival in arrivals
        ]
        return [_text(reply) for reply in await self._run(self._record, calls)]

    async def load(self, refs: Sequence[EntryRef]) -> list[dict[str, bytes]]:
        """Every field of each entry's hash (empty when it expired)."""
        pipe = self._client.pipeline(transaction=False)
        for ref in refs:
            pipe.hgetall(ref.key)
        replies = await pipe.execute()
        return [{_text(k): v for k, v in reply.items()} for reply in replies]

    async def finish(self, finished: Sequence[tuple[EntryRef, str, str, str]]) -> list[bool]:
        """Mark verdicts published: ``(ref, token, verdict, final|duplicate)`` each.

        False for an entry whose claim was taken over meanwhile (its verdict went out twice;
        readers drop the second by ``verdict_id``).
        """
        calls = [
            (
                [ref.key, OPEN_KEY, VERDICT_COUNTS_KEY],
                [token, ref.member, verdict, kind, self._done_ttl_s],
            )
            for ref, token, verdict, kind in finished
        ]
        return [bool(reply) for reply in await self._run(self._finish, calls)]

    async def _run(
        self, script: AsyncScript, calls: Sequence[tuple[list[Any], list[Any]]]
    ) -> list[Any]:
        """Run ``script`` once per ``(keys, args)`` in one round trip; the replies in order.

        EVALSHA straight away, in a pipeline when there are several: valkey-py's own pipelined
        scripts ask SCRIPT EXISTS before every execute, a second round trip per batch. The
        script is loaded only when the server answers NOSCRIPT (after a restart or a flush),
        and then just the calls it refused run again: a refused call did not run at all.
        """
        if not calls:
            return []
        if len(calls) == 1:
            keys, args = calls[0]
            return [await script(keys=keys, args=args)]
        replies = await self._evalsha_all(script, calls)
        refused = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if refused:
            await self._client.script_load(script.script)
            again = await self._evalsha_all(script, [calls[i] for i in refused])
            for i, reply in zip(refused, again, strict=True):
                replies[i] = reply
        for number, reply in enumerate(replies, 1):
            if isinstance(reply, Exception):
                # Worded as valkey-py words a pipeline's error, which the error translation
                # knows how to shorten (it names the command, never the arguments).
                raise type(reply)(
                    f"Command # {number} (EVALSHA {script.sha}) of pipeline caused error: {reply}"
                ) from reply
        return replies

    async def _evalsha_all(
        self, script: AsyncScript, calls: Sequence[tuple[list[Any], list[Any]]]
    ) -> list[Any]:
        pipe = self._client.pipeline(transaction=False)
        for keys, args in calls:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        return list(await pipe.execute(raise_on_error=False))

    async def claim_expired(
        self, older_than_ms: int, token: str, now_ms: int, stale_claim_ms: int, limit: int
    ) -> list[tuple[EntryRef, int | None]]:
        """Claim up to ``limit`` entries opened before ``older_than_ms`` and still undecided.

        Each comes with the time of the dead claim it took over, or ``None``.
        """
        members = await self._client.zrangebyscore(
            OPEN_KEY, "-inf", older_than_ms, start=0, num=limit
        )
        claimed: list[tuple[EntryRef, int | None]] = []
        for raw in members:
            ref = EntryRef.from_member(_text(raw))
            won = int(
                await self._claim_expired(
                    keys=[ref.key, OPEN_KEY], args=[ref.member, token, now_ms, stale_claim_ms]
                )
            )
            if won:
                claimed.append((ref, won if won > 1 else None))
        return claimed


def _text(value: Any) -> Any:
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value
