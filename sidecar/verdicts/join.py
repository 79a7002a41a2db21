"""Where the records of one task meet: a Valkey hash per stream entry, completed atomically.

The redis run (the handler's run on the Redis copy, written by the mirror), the kafka run (its
run on the Kafka copy, written by the shadow consumer) and the worker's delivery (RAGFlow's own
worker, written by the observer) arrive in any order, from any sidecar instance. Each batch of
arrivals of a side is one Lua script call, atomic per entry: it stores the side, and the arrival
that completes redis run + kafka run also claims the right to decide (and gets the whole hash
back), so exactly one instance judges each entry. Entries still open after
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

# One call per batch: KEYS open zset, then a hash per arrival. ARGV side, now_ms, ttl_s, claim
# token, then per arrival its facts, value, value's SHA-256, member and origin. The origin
# (topic:partition:offset of a kafka run) tells a redelivery of the same Kafka record (a shadow
# restart before its commit) from a second copy of the entry (a mirror replay). One reply per
# arrival: its outcome, or for ``decide`` the fields a verdict reads (flat pairs, as HGETALL
# gives), which saves the judge a load. A side's task bytes are kept only while they may be
# needed: not when the other side is there with the same bytes, and dropped once both are and
# agree; the reply carries them only when the two differ (the payload comparator's diff).
_RECORD = """
local side, now_ms, ttl, token = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local other = 'redis_run'
if side == 'redis_run' then other = 'kafka_run' end
local replies = {}
for i = 2, #KEYS do
  local key = KEYS[i]
  local at = 4 + (i - 2) * 5
  local facts, value, sha = ARGV[at + 1], ARGV[at + 2], ARGV[at + 3]
  local member, origin = ARGV[at + 4], ARGV[at + 5]
  local outcome = nil
  local existed = redis.call('EXISTS', key)
  local have = {}
  if existed == 1 then
    have = redis.call('HMGET', key, side, side .. '_origin', 'state', other, other .. '_sha')
  end
  if have[1] then
    if origin ~= '' and have[2] == origin then
      outcome = 'redelivery'
    elseif side == 'kafka_run' then
      redis.call('HINCRBY', key, 'kafka_deliveries', 1)
      if redis.call('HSETNX', key, 'dup_state', token) == 1 then
        outcome = 'duplicate'
      else
        outcome = 'duplicate_again'
      end
    else
      outcome = 'exists'
    end
  end
  if not outcome then
    local same = sha ~= '' and have[5] == sha
    -- This arrival completes the pair: it decides below, and the digests are no longer needed.
    local deciding = side ~= 'worker' and have[4] and not have[3]
    local fields = {side, facts}
    if origin ~= '' then
      fields[#fields + 1] = side .. '_origin'
      fields[#fields + 1] = origin
    end
    if sha ~= '' and not deciding then
      fields[#fields + 1] = side .. '_sha'
      fields[#fields + 1] = sha
    end
    if value ~= '' and not same then
      fields[#fields + 1] = side .. '_value'
      fields[#fields + 1] = value
    end
    if deciding then
      fields[#fields + 1] = 'state'
      fields[#fields + 1] = token
    end
    redis.call('HSET', key, unpack(fields))
    if side == 'kafka_run' then
      redis.call('HINCRBY', key, 'kafka_deliveries', 1)
    end
    if side ~= 'worker' and redis.call('HSETNX', key, 'created_ms', now_ms) == 1 then
      redis.call('ZADD', KEYS[1], now_ms, member)
    end
    if not have[3] then
      if side == 'worker' and existed == 0 then
        -- RAGFlow's delivery of a task the mirror never carries (outside the traffic share).
        redis.call('EXPIRE', key, 3600)
      else
        redis.call('EXPIRE', key, ttl)
      end
    end
    outcome = 'recorded'
    if deciding then
      local names = {'redis_run', 'kafka_run', 'worker', 'kafka_deliveries'}
      if same then
        redis.call('HDEL', key, other .. '_value', other .. '_sha')
      else
        redis.call('HDEL', key, other .. '_sha')
        names[5] = 'redis_run_value'
        names[6] = 'kafka_run_value'
      end
      local values = redis.call('HMGET', key, unpack(names))
      local found = {}
      for n = 1, #names do
        if values[n] then
          found[#found + 1] = names[n]
          found[#found + 1] = values[n]
        end
      end
      outcome = found
    end
  end
  replies[i - 1] = outcome
end
return replies
"""

# One call per batch: KEYS open zset, verdict counts, then a hash per item. ARGV done_ttl_s,
# then per item its claim token, member, verdict and kind (final|duplicate). One reply per
# item: 1, or 0 where the claim was taken over meanwhile.
_FINISH = """
local replies = {}
for i = 3, #KEYS do
  local key = KEYS[i]
  local at = 1 + (i - 3) * 4
  local token, member, verdict, kind = ARGV[at + 1], ARGV[at + 2], ARGV[at + 3], ARGV[at + 4]
  local field = 'state'
  if kind == 'duplicate' then field = 'dup_state' end
  if redis.call('HGET', key, field) ~= token then
    replies[i - 2] = 0
  else
    redis.call('HSET', key, field, 'done')
    if kind == 'final' then
      redis.call('ZREM', KEYS[1], member)
      redis.call('HDEL', key, 'redis_run_value', 'kafka_run_value', 'redis_run_sha',
                 'kafka_run_sha')
      redis.call('EXPIRE', key, ARGV[1])
    end
    redis.call('HINCRBY', KEYS[2], verdict, 1)
    replies[i - 2] = 1
  end
end
return replies
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
    """One side's record for one entry: JSON facts, and the raw task bytes if it has them,
    with their SHA-256 (hex), which tells the join whether both sides' bytes must be kept."""

    ref: EntryRef
    facts: bytes
    value: bytes = b""
    origin: str = ""  # where this copy was read (topic:partition:offset), for redeliveries
    value_sha: str = ""


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
    ) -> list[tuple[RecordOutcome, dict[str, bytes]]]:
        """Store one side for each entry, in one call; per arrival, in order, its outcome and,
        for ``decide``, every field of the completed hash (else an empty dict)."""
        if not arrivals:
            return []
        args: list[Any] = [side, now_ms, self._ttl_s, token]
        for arrival in arrivals:
            args += [
                arrival.facts,
                arrival.value,
                arrival.value_sha,
                arrival.ref.member,
                arrival.origin,
            ]
        keys = [OPEN_KEY, *(arrival.ref.key for arrival in arrivals)]
        replies = await self._record(keys=keys, args=args)
        return [
            ("decide", _fields(reply)) if isinstance(reply, list) else (_text(reply), {})
            for reply in replies
        ]

    async def load(self, refs: Sequence[EntryRef]) -> list[dict[str, bytes]]:
        """Every field of each entry's hash (empty when it expired)."""
        pipe = self._client.pipeline(transaction=False)
        for ref in refs:
            pipe.hgetall(ref.key)
        replies = await pipe.execute()
        return [{_text(k): v for k, v in reply.items()} for reply in replies]

    async def finish(self, finished: Sequence[tuple[EntryRef, str, str, str]]) -> list[bool]:
        """Mark verdicts published, in one call: ``(ref, token, verdict, final|duplicate)`` each.

        False for an entry whose claim was taken over meanwhile (its verdict went out twice;
        readers drop the second by ``verdict_id``).
        """
        if not finished:
            return []
        args: list[Any] = [self._done_ttl_s]
        for ref, token, verdict, kind in finished:
            args += [token, ref.member, verdict, kind]
        keys = [OPEN_KEY, VERDICT_COUNTS_KEY, *(ref.key for ref, _, _, _ in finished)]
        return [bool(reply) for reply in await self._finish(keys=keys, args=args)]

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


def _fields(pairs: list[Any]) -> dict[str, bytes]:
    """HGETALL's flat reply from inside a script, as valkey-py's ``hgetall`` gives it."""
    return {_text(pairs[i]): pairs[i + 1] for i in range(0, len(pairs), 2)}


def _text(value: Any) -> Any:
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value
