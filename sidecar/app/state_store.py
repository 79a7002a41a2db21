"""The state store (``SIDECAR_STATE_URL``): whether it can lose the sidecar's keys, and saying so.

The join hashes, dedup and liveness keys carry TTLs and the open index and verdict counts do
not; an evicted one becomes a false ``missing_*`` verdict or a task run twice. A store whose
``maxmemory-policy`` evicts (``allkeys-*``, ``volatile-*``) at a ``maxmemory`` is warned about,
twice over when it is RAGFlow's own Valkey, where the sidecar's keys also push out RAGFlow's.
``noeviction`` refuses writes instead, which the sidecar rides out (:class:`ServerFullError`).
"""

from __future__ import annotations

import logging

from sidecar.config import Settings
from sidecar.errors import SidecarError
from sidecar.transport.valkey_client import create_client
from sidecar.transport.valkey_memory import ValkeyMemory, human_bytes, read_memory

logger = logging.getLogger(__name__)

GUIDE = "docs/operations.md, 'The state store'"


def shares_ragflows_valkey(settings: Settings) -> bool:
    """Whether the state store is RAGFlow's Valkey server: the same host and port as REDIS_URL.

    Any db: ``maxmemory`` and its eviction are the whole server's, not one database's."""
    return (settings.state.host, settings.state.port) == (settings.redis.host, settings.redis.port)


def eviction_warnings(settings: Settings, memory: ValkeyMemory) -> list[str]:
    """One line per reason the state store may drop the sidecar's keys (none: it cannot)."""
    if not memory.can_evict:
        return []
    where = settings.state.display_url
    lines = [
        f"the state store {where} evicts keys at its limit (maxmemory "
        f"{human_bytes(memory.maxmemory)}, maxmemory-policy {memory.policy}, "
        f"{memory.evicted_keys} evicted so far): an evicted join or dedup key becomes a false "
        f"missing_* verdict or a task run twice; give it maxmemory-policy noeviction ({GUIDE})"
    ]
    if shares_ragflows_valkey(settings):
        lines.append(
            f"the state store {where} is RAGFlow's own Valkey (REDIS_URL): under a backlog the "
            "sidecar's keys can evict RAGFlow's (its queue, its locks), or be evicted by them; "
            f"point SIDECAR_STATE_URL at a Valkey of the sidecar's own ({GUIDE})"
        )
    return lines


async def state_memory(settings: Settings) -> ValkeyMemory:
    """The state store's memory figures, on a client of its own (closed before returning)."""
    client = create_client(settings.state)
    try:
        return await read_memory(client, settings.state.display_url)
    finally:
        await client.aclose()


async def warn_if_evicting(settings: Settings) -> list[str]:
    """Log :func:`eviction_warnings` (once, at the start of ``run``/``shadow``); returns them.

    A store that does not answer yet is not an error here: the sidecar's start retries it."""
    try:
        memory = await state_memory(settings)
    except SidecarError as exc:
        logger.info("state store's memory settings not checked: %s", exc)
        return []
    warnings = eviction_warnings(settings, memory)
    for line in warnings:
        logger.warning("%s", line)
    return warnings
