"""Per-task claims in the state store: the served path's pending-entries list.

Kafka hands a partition's records to whichever member owns it now, and a rebalance moves
ownership while RAGFlow still runs tasks of it for an hour. Redis never does that: a pending
entry stays its consumer's until acked. So each served task is claimed, by task id, before it
is handed to RAGFlow, by its process (``<consumer name>|<incarnation>``); a record of a task
that another live process holds is parked, not run; an acked task leaves a ``done`` marker
that skips any later record of it (a redelivery, a producer retry, a record that landed after
``queue_product`` fell back to Redis).

A claim lapses when its process's ``alive`` key does (``SERVE_LEASE_S`` after its last
refresh: minutes, so that a frozen process keeps its tasks as Redis keeps a live consumer's
pending entries), or at once when its consumer name starts again under a new incarnation,
which is the restarted executor (RAGFlow's entrypoint restarts it under its old name, and
Redis hands it its own pending entries back at once, too). The claims in a process's hands
are asserted again at every refresh, so a store that restarted without persistence or evicted
a claim has it back within ``SERVE_CLAIM_REFRESH_S``; until then a store younger than twice
that is read with caution (``cautious``): a task nobody claims may still be running.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import valkey.asyncio as avalkey

from ragflow_mq import claim_scripts
from sidecar.transport.valkey_client import translate_valkey_errors
from sidecar.wire.contract import REDIS_MARKER, Keys

logger = logging.getLogger(__name__)


class Claim(StrEnum):
    """What claiming a served task found."""

    NEW = "new"  # nobody held it: ours now
    OURS = "ours"  # this process holds it already (a second record of a task in hand)
    RETAKEN = "retaken"  # its holder is gone (or restarted): ours now, a redelivery
    HELD = "held"  # another live process holds it: park the record
    DONE = "done"  # it ran (or went to Redis): skip the record


@dataclass(frozen=True)
class Reasserted:
    """What a liveness refresh found of the claims in hand."""

    restored: int  # claims the store had lost, written back
    lost: list[str]  # task ids another process claimed meanwhile (the store forgot ours)


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
        self.incarnation = incarnation
        self._claim: Any = client.register_script(claim_scripts.CLAIM)
        self._finish: Any = client.register_script(claim_scripts.FINISH)
        self._release: Any = client.register_script(claim_scripts.RELEASE)
        self._keep_alive: Any = client.register_script(claim_scripts.KEEP_ALIVE)
        self._pend: Any = client.register_script(claim_scripts.PEND)
        self._adopt: Any = client.register_script(claim_scripts.ADOPT)

    def _pairs(self, task_ids: Sequence[str]) -> list[str]:
        keys: list[str] = []
        for task_id in task_ids:
            keys += (self._keys.claim(task_id), self._keys.done(task_id))
        return keys

    async def claim(self, task_ids: Sequence[str], *, cautious: bool = False) -> list[Claim]:
        """Claim each task for this process; one outcome per id, in order. ``cautious``: the
        store may have forgotten claims lately, so an unclaimed task is ``HELD``, not ``NEW``."""
        if not task_ids:
            return []
        args = (
            self.owner,
            f"{self.consumer_name}|",
            self._keys.alive(""),
            self._keys.incarnation(""),
            self._done_ttl_s,
            "1" if cautious else "0",
            self._keys.claim(""),
            self._keys.pending(""),
        )
        with translate_valkey_errors("claim served tasks", self._where):
            replies = await self._claim(keys=self._pairs(task_ids), args=args)
        return [Claim(_text(reply)) for reply in replies]

    async def finish(self, task_ids: Sequence[str]) -> None:
        """Mark the tasks done (RAGFlow acked them), drop this process's claims and their
        pending entries (a task taken back from the pending list)."""
        if task_ids:
            keys = [*self._pairs(task_ids), self._keys.pending(self.consumer_name)]
            with translate_valkey_errors("mark served tasks done", self._where):
                await self._finish(keys=keys, args=(self.owner, self._done_ttl_s, *task_ids))

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

    async def keep_alive(self, held: Sequence[str] = ()) -> Reasserted:
        """Refresh this process's liveness and assert its claims of ``held`` again."""
        keys = [
            self._keys.alive(self.owner),
            self._keys.incarnation(self.consumer_name),
            *(self._keys.claim(task_id) for task_id in held),
        ]
        args = (self.owner, self.incarnation, self._lease_ms, self._done_ttl_s, self._done_ttl_s)
        with translate_valkey_errors("refresh liveness", self._where):
            restored, lost = await self._keep_alive(keys=keys, args=args)
        prefix = len(self._keys.claim(""))
        return Reasserted(int(restored), [_text(key)[prefix:] for key in lost])

    async def pend(self, task_id: str, entry: str) -> None:
        """``task_id`` was given up on by RAGFlow: it is this consumer name's pending entry."""
        keys = [
            self._keys.pending(self.consumer_name),
            self._keys.pending_index,
            self._keys.claim(task_id),
        ]
        args = (self.consumer_name, task_id, entry, self.owner, self._done_ttl_s)
        with translate_valkey_errors("keep a served task pending", self._where):
            await self._pend(keys=keys, args=args)

    async def adopt(self, at_most: int) -> list[tuple[str, str]]:
        """Pending tasks this process may run now, claimed: its consumer name's own, then
        those of gone holders; (task id, entry) pairs."""
        if at_most <= 0:
            return []
        args = (
            self.owner,
            self.consumer_name,
            self._keys.alive(""),
            self._keys.incarnation(""),
            self._keys.claim(""),
            self._keys.done(""),
            self._keys.pending(""),
            self._done_ttl_s,
            at_most,
        )
        with translate_valkey_errors("take pending served tasks", self._where):
            reply = await self._adopt(keys=[self._keys.pending_index], args=args)
        return [(_text(reply[i]), _text(reply[i + 1])) for i in range(0, len(reply), 2)]

    async def leave(self) -> None:
        """This process is ending: its claims lapse now, not a lease later."""
        with translate_valkey_errors("drop liveness", self._where):
            await self._client.delete(self._keys.alive(self.owner))


async def divert(client: avalkey.Valkey, keys: Keys, task_id: str, ttl_s: int, where: str) -> bool:
    """Before a task meant for Kafka is enqueued on Redis: True when Redis may have it (no
    record of it was claimed or ran, and none ever will), False when Kafka's copy has it."""
    with translate_valkey_errors("divert a task to Redis", where):
        script: Any = client.register_script(claim_scripts.DIVERT)
        reply = await script(
            keys=[keys.claim(task_id), keys.done(task_id)], args=(REDIS_MARKER, ttl_s)
        )
    return int(reply) == 1


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
