"""A Valkey server's eviction policy and persistence, and what each lets it lose.

Read with ``INFO memory``, ``INFO stats``, ``INFO persistence`` and, where the ACL allows it,
``CONFIG GET save`` and ``appendfsync``: without CONFIG the RDB save points cannot be told from
a server that never snapshots, and the finding says so rather than guess.
"""

from __future__ import annotations

from typing import Final, Literal

import valkey.asyncio as avalkey

from sidecar.doctor.findings import Finding
from sidecar.errors import SidecarError
from sidecar.transport.valkey_memory import (
    ValkeyMemory,
    ValkeyPersistence,
    human_bytes,
    read_memory,
    read_persistence,
)

Role = Literal["ragflow-valkey", "state-store"]

# What each store holds, in the words of what a loss does.
HOLDS: Final[dict[Role, str]] = {
    "ragflow-valkey": "the task streams and their pending entries",
    "state-store": "the sidecar's joins and ragflow_mq's claims and done markers",
}
LOSS: Final[dict[Role, str]] = {
    "ragflow-valkey": "queued tasks vanish and never run",
    "state-store": "served tasks run twice and verdicts turn missing_*",
}


def eviction_finding(role: Role, where: str, memory: ValkeyMemory, shared: bool) -> Finding:
    """``shared``: the state store is RAGFlow's Valkey, so keys with a TTL are the sidecar's."""
    check = f"{role}.eviction"
    limit = human_bytes(memory.maxmemory)
    evicted = f"; {memory.evicted_keys} keys evicted so far" if memory.evicted_keys else ""
    if memory.maxmemory == 0:
        return Finding(check, "ok", where, f"no maxmemory: nothing is evicted{evicted}")
    if not memory.can_evict:
        return Finding(
            check,
            "ok",
            where,
            f"{memory.policy} at maxmemory {limit}: writes are refused at the limit, nothing is "
            f"dropped{evicted}",
        )
    if memory.policy.startswith("allkeys-"):
        return Finding(
            check,
            "risk",
            where,
            f"{memory.policy} at maxmemory {limit} evicts any key, {HOLDS[role]} included: "
            f"{LOSS[role]}{evicted}; set maxmemory-policy noeviction (or volatile-lru for "
            "RAGFlow's own, as its compose does since upstream #17707)",
        )
    if role == "ragflow-valkey" and not shared:
        return Finding(
            check,
            "note",
            where,
            f"{memory.policy} at maxmemory {limit}: the task streams carry no TTL and are never "
            f"evicted; keys with a TTL go at the limit (cancel markers <task_id>-cancel){evicted}",
        )
    return Finding(
        check,
        "risk",
        where,
        f"{memory.policy} at maxmemory {limit} evicts keys with a TTL, the sidecar's and "
        f"ragflow_mq's among them: {LOSS['state-store']}{evicted}; give the state store "
        "maxmemory-policy noeviction",
    )


def persistence_finding(role: Role, where: str, persistence: ValkeyPersistence) -> Finding:
    check = f"{role}.persistence"
    if persistence.aof:
        fsync = persistence.appendfsync or "unreadable"
        lost = {"always": "nothing acknowledged", "everysec": "at most the last second"}.get(
            fsync, "what the OS had not yet written"
        )
        return Finding(check, "ok", where, f"AOF on (appendfsync {fsync}): a restart loses {lost}")
    if persistence.save is None:
        # AOF off is a risk whatever the save points: a restart loses what changed since the
        # last snapshot, or everything without one; only which of the two is left untold.
        return Finding(
            check,
            "risk",
            where,
            "AOF off: a restart loses what changed since the last RDB snapshot, or all of "
            f"{HOLDS[role]} without save points (not read: CONFIG GET refused, or not asked; "
            f"`ragflow-sidecar doctor` asks): {LOSS[role]}; turn on appendonly yes",
        )
    if persistence.save.strip():
        return Finding(
            check,
            "risk",
            where,
            f"RDB snapshots only (save {persistence.save}): a restart loses what changed since "
            f"the last one ({persistence.changes_since_save} changes now): {LOSS[role]}; turn "
            "on appendonly yes",
        )
    return Finding(
        check,
        "risk",
        where,
        f"no persistence (AOF off, no RDB save points): a restart loses {HOLDS[role]}, so "
        f"{LOSS[role]} (RAGFlow #8575); turn on appendonly yes",
    )


async def store_findings(
    role: Role, client: avalkey.Valkey, where: str, shared: bool = False, read_config: bool = True
) -> list[Finding]:
    """Eviction and persistence of one server; one ``unknown`` finding when it cannot be read."""
    try:
        memory = await read_memory(client, where)
        # Without CONFIG, INFO only (run's poller, whose documented ACL grants no CONFIG, which
        # would show the server's password: each refusal would fill Valkey's ACL LOG).
        config = ("appendfsync", "save") if read_config else ()
        persistence = await read_persistence(client, where, config)
    except SidecarError as exc:
        return [Finding(f"{role}.reachable", "unknown", where, str(exc))]
    return [
        eviction_finding(role, where, memory, shared),
        persistence_finding(role, where, persistence),
    ]
