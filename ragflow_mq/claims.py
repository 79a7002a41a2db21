"""Per-task claims in the state store: the served path's pending-entries list.

Kafka hands a partition's records to whichever member owns it now, and a rebalance moves
ownership while RAGFlow still runs tasks of it for an hour. Redis never does that: a pending
entry stays its consumer's until acked. So each served task is claimed, by task id, before it
is handed to RAGFlow, by its process (``<consumer name>|<incarnation>``); a record of a task
that another live process holds is parked, not run; an acked task leaves a ``done`` marker
that skips any later record of it (a redelivery, a producer retry, a record that landed after
``queue_product`` fell back to Redis).

A claim lapses when its process's ``alive`` key does (``SERVE_LEASE_S`` after its last
refresh), or at once for a process of the same consumer name, which is the restarted executor
(RAGFlow's entrypoint restarts it under its old name, and Redis hands it its own pending
entries back at once, too).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from enum import StrEnum
from typing import Any, Final

import valkey.asyncio as avalkey

from ragflow_mq.contract import Keys
from sidecar.transport.valkey_client import translate_valkey_errors

logger = logging.getLogger(__name__)

REDIS_MARKER: Final = "redis"


class Claim(StrEnum):
    """What claiming a served task found."""

    NEW = "new"  # nobody held it: ours now
    OURS = "ours"  # this process holds it already (a second record of a task in hand)
    RETAKEN = "retaken"  # its holder is gone (or restarted): ours now, a redelivery
    HELD = "held"  # another live process holds it: park the record
    DONE = "done"  # it ran (or went to Redis): skip the record


# KEYS: claim_1, done_1, claim_2, done_2, ...; ARGV: owner, "<consumer>|", alive prefix, ttl_s.
# The alive key is read by name (the holder is known only here): a single Valkey, not a
# cluster, as the sidecar's other scripts assume.
_CLAIM = """
local out = {}
for i = 1, #KEYS, 2 do
  local claim, done = KEYS[i], KEYS[i + 1]
  if redis.call('EXISTS', done) == 1 then
    out[#out + 1] = 'done'
  else
    local holder = redis.call('GET', claim)
    if not holder then
      redis.call('SET', claim, ARGV[1], 'EX', ARGV[4])
      out[#out + 1] = 'new'
    elseif holder == ARGV[1] then
      out[#out + 1] = 'ours'
    elseif string.sub(holder, 1, #ARGV[2]) == ARGV[2]
        or redis.call('EXISTS', ARGV[3] .. holder) == 0 then
      redis.call('SET', claim, ARGV[1], 'EX', ARGV[4])
      out[#out + 1] = 'retaken'
    else
      out[#out + 1] = 'held'
    end
  end
end
return out
"""
# KEYS: claim_1, done_1, ...; ARGV: owner, done ttl_s. Done whoever holds the claim now: the
# task ran to its ack here, and no record of it may run again.
_FINISH = """
for i = 1, #KEYS, 2 do
  redis.call('SET', KEYS[i + 1], ARGV[1], 'EX', ARGV[2])
  if redis.call('GET', KEYS[i]) == ARGV[1] then redis.call('DEL', KEYS[i]) end
end
return #KEYS / 2
"""
# KEYS: claims; ARGV: owner. Claims of records fetched ahead and never handed out.
_RELEASE = """
local n = 0
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then n = n + redis.call('DEL', KEYS[i]) end
end
return n
"""
# KEYS: claim, done; ARGV: marker, ttl_s. 1: the task is Redis's now; 0: Kafka's record of it
# was claimed or ran already (a try that timed out had landed), so it must not go to Redis too.
_DIVERT = """
if redis.call('EXISTS', KEYS[1]) == 1 or redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[2])
return 1
"""


class Claims:
    """The claim calls of one executor process (``owner``) on the state store."""

    def __init__(
        self,
        client: avalkey.Valkey,
        keys: Keys,
        *,
        consumer_name: str,
        incarnation: str,
        lease_s: float,
        done_ttl_s: int,
        where: str,
    ) -> None:
        self._client = client
        self._keys = keys
        self.consumer_name = consumer_name
        self.owner = f"{consumer_name}|{incarnation}"
        self._lease_ms = max(int(lease_s * 1000), 1)
        self._done_ttl_s = done_ttl_s
        self._where = where
        self._claim: Any = client.register_script(_CLAIM)
        self._finish: Any = client.register_script(_FINISH)
        self._release: Any = client.register_script(_RELEASE)
        self._divert: Any = client.register_script(_DIVERT)

    def _pairs(self, task_ids: Sequence[str]) -> list[str]:
        keys: list[str] = []
        for task_id in task_ids:
            keys += (self._keys.claim(task_id), self._keys.done(task_id))
        return keys

    async def claim(self, task_ids: Sequence[str]) -> list[Claim]:
        """Claim each task for this process; one outcome per id, in order."""
        if not task_ids:
            return []
        args = (self.owner, f"{self.consumer_name}|", self._keys.alive(""), self._done_ttl_s)
        with translate_valkey_errors("claim served tasks", self._where):
            replies = await self._claim(keys=self._pairs(task_ids), args=args)
        return [Claim(_text(reply)) for reply in replies]

    async def finish(self, task_ids: Sequence[str]) -> None:
        """Mark the tasks done (RAGFlow acked them) and drop this process's claims."""
        if task_ids:
            with translate_valkey_errors("mark served tasks done", self._where):
                await self._finish(keys=self._pairs(task_ids), args=(self.owner, self._done_ttl_s))

    async def release(self, task_ids: Sequence[str]) -> None:
        """Give back claims of tasks fetched ahead and never handed to RAGFlow."""
        if task_ids:
            keys = [self._keys.claim(task_id) for task_id in task_ids]
            with translate_valkey_errors("release served tasks", self._where):
                await self._release(keys=keys, args=(self.owner,))

    async def done(self, task_ids: Sequence[str]) -> list[bool]:
        """Whether each task ran already (or went to Redis)."""
        if not task_ids:
            return []
        with translate_valkey_errors("read done markers", self._where):
            async with self._client.pipeline(transaction=False) as pipe:
                for task_id in task_ids:
                    pipe.exists(self._keys.done(task_id))
                replies = await pipe.execute()
        return [bool(reply) for reply in replies]

    async def keep_alive(self) -> None:
        """Refresh this process's liveness (every third of the lease)."""
        with translate_valkey_errors("refresh liveness", self._where):
            await self._client.set(self._keys.alive(self.owner), b"1", px=self._lease_ms)

    async def leave(self) -> None:
        """This process is ending: its claims lapse now, not a lease later."""
        with translate_valkey_errors("drop liveness", self._where):
            await self._client.delete(self._keys.alive(self.owner))


async def divert(client: avalkey.Valkey, keys: Keys, task_id: str, ttl_s: int, where: str) -> bool:
    """Before a task meant for Kafka is enqueued on Redis: True when Redis may have it (no
    record of it was claimed or ran, and none ever will), False when Kafka's copy has it."""
    with translate_valkey_errors("divert a task to Redis", where):
        script: Any = client.register_script(_DIVERT)
        reply = await script(
            keys=[keys.claim(task_id), keys.done(task_id)], args=(REDIS_MARKER, ttl_s)
        )
    return int(reply) == 1


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
