"""What a Valkey server can lose: its memory limit and eviction policy (``INFO memory`` and
``INFO stats``), and its persistence (``INFO persistence``, and ``CONFIG GET`` where the ACL
allows it)."""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import valkey.asyncio as valkey

from sidecar.errors import SidecarError
from sidecar.text import as_text
from sidecar.transport.valkey_client import translate_valkey_errors

logger = logging.getLogger(__name__)

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


@dataclass(frozen=True)
class ValkeyPersistence:
    """What a restart keeps; a CONFIG value is ``None`` where it was not read or refused."""

    aof: bool
    appendfsync: str | None
    save: str | None  # RDB save points, "" for none
    changes_since_save: int

    @property
    def rdb(self) -> bool | None:
        """RDB snapshots configured (a non-empty ``save``); ``None`` where it is unknown."""
        return None if self.save is None else bool(self.save.strip())


async def read_persistence(
    client: valkey.Valkey, where: str, config: Collection[str] = ("appendfsync", "save")
) -> ValkeyPersistence:
    """INFO persistence, and the ``config`` values of ``appendfsync`` and ``save`` (each a
    CONFIG GET, which an ACL may refuse: docs/security.md grants none, and every refusal
    lands in Valkey's ACL LOG, so a caller reads only what it uses)."""
    with translate_valkey_errors("read INFO persistence", where):
        info: dict[str, Any] = await client.info("persistence")
    values = {name: await _config(client, name, where) for name in config}
    return ValkeyPersistence(
        aof=as_text(info.get("aof_enabled") or 0) == "1",
        appendfsync=values.get("appendfsync"),
        save=values.get("save"),
        changes_since_save=int(info.get("rdb_changes_since_last_save") or 0),
    )


async def _config(client: valkey.Valkey, name: str, where: str) -> str | None:
    try:
        with translate_valkey_errors(f"CONFIG GET {name}", where):
            reply: dict[Any, Any] = await client.config_get(name)
    except SidecarError as exc:
        logger.info("CONFIG %s left unknown: %s", name, exc)
        return None
    value = reply.get(name, reply.get(name.encode()))
    return None if value is None else as_text(value)


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
