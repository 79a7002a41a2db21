"""A Valkey server's memory limit and eviction policy, as ``INFO memory`` and ``INFO stats`` say."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import valkey.asyncio as valkey

from sidecar.text import as_text
from sidecar.transport.valkey_client import translate_valkey_errors

# Policies that evict at maxmemory: allkeys-* any key, volatile-* any key with a TTL.
EVICTING_PREFIXES = ("allkeys-", "volatile-")


@dataclass(frozen=True)
class ValkeyMemory:
    """How full a Valkey server is and what it does when it is full."""

    used_memory: int  # bytes
    maxmemory: int  # bytes; 0: no limit
    policy: str  # maxmemory-policy: noeviction, allkeys-lru, volatile-ttl, ...
    evicted_keys: int  # since the server started

    @property
    def can_evict(self) -> bool:
        """Whether keys are dropped at the limit (rather than writes refused).

        ``volatile-*`` counts: every key the sidecar writes per task carries a TTL."""
        return self.maxmemory > 0 and self.policy.startswith(EVICTING_PREFIXES)


async def read_memory(client: valkey.Valkey, where: str) -> ValkeyMemory:
    """The server's memory figures (the INFO command, allowed by docs/security.md's ACL)."""
    with translate_valkey_errors("read INFO memory and stats", where):
        memory: dict[str, Any] = await client.info("memory")
        stats: dict[str, Any] = await client.info("stats")
    return ValkeyMemory(
        used_memory=int(memory.get("used_memory") or 0),
        maxmemory=int(memory.get("maxmemory") or 0),
        policy=as_text(memory.get("maxmemory_policy") or "noeviction"),
        evicted_keys=int(stats.get("evicted_keys") or 0),
    )


def human_bytes(count: int) -> str:
    """``1.5 MiB``: the way INFO's ``*_human`` fields write sizes."""
    if count < 1024:
        return f"{count} B"
    size = count / 1024
    for unit in ("KiB", "MiB"):
        if size < 1024:
            return f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"
