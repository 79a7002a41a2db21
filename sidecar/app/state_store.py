"""The state store (``SIDECAR_STATE_URL``): whether it can lose the sidecar's keys, and saying so.

The join hashes, dedup and liveness keys carry TTLs and the open index and verdict counts do
not; an evicted one becomes a false ``missing_*`` verdict or a task run twice. A store whose
``maxmemory-policy`` evicts (``allkeys-*``, ``volatile-*``) at a ``maxmemory`` is warned about,
twice over when it is RAGFlow's own Valkey, where the sidecar's keys also push out RAGFlow's.
``noeviction`` refuses writes instead, which the sidecar rides out (:class:`ServerFullError`).
While the sidecar runs, :class:`StateMemoryPoller` keeps its memory figures on ``/metrics``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Final

import valkey.asyncio as avalkey

from sidecar.config import Settings
from sidecar.errors import SidecarError
from sidecar.lifecycle import Poller
from sidecar.telemetry.metrics import SidecarMetrics, Stats
from sidecar.transport.valkey_client import create_client
from sidecar.transport.valkey_memory import ValkeyMemory, human_bytes, read_memory

logger = logging.getLogger(__name__)

GUIDE = "docs/operations.md, 'The state store'"
# A server that accepts the connection and never answers holds one read at most this long.
POLL_TIMEOUT_S: Final = 5.0


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


class StateMemoryPoller(Poller):
    """Reads the state store's memory figures (INFO) every ``interval_s`` for the metrics, on
    a task of its own: a scrape never waits on Valkey, and a failed read only leaves them
    unknown (:attr:`memory` ``None``), said once per outage; the data path never sees it."""

    def __init__(self, client: avalkey.Valkey, where: str, *, interval_s: float) -> None:
        """``client`` is the composition root's (the state store's): used between start and
        stop, never closed here. ``where`` names the store in the log."""
        super().__init__(interval_s, "state-memory-poller")
        self._client = client
        self._where = where
        # None before the first read and while reads fail: the series are left out rather
        # than kept at figures nobody can vouch for (docs/metrics.md).
        self.memory: ValkeyMemory | None = None

    async def _stop(self) -> None:
        await super()._stop()
        self.memory = None

    async def poll(self) -> bool:
        """One read; ``False`` (the figures unknown) when the store did not answer it."""
        try:
            async with asyncio.timeout(POLL_TIMEOUT_S):
                memory = await read_memory(self._client, self._where)
        except (SidecarError, TimeoutError) as exc:
            self.memory = None
            return self.failed("state store's memory unknown until it answers INFO", exc)
        self.answered("state store's memory read again")
        self.memory = memory
        return True


def register_state_memory_metrics(metrics: SidecarMetrics, poller: StateMemoryPoller) -> None:
    """The state store's instruments, read from ``poller.memory`` at collection time."""

    def sample(read: Callable[[ValkeyMemory], tuple[dict[str, str], float]]) -> Stats:
        def samples() -> list[tuple[dict[str, str], float]]:
            memory = poller.memory
            return [] if memory is None else [read(memory)]

        return samples

    metrics.observe_gauge(
        "state_store_used_memory_bytes",
        "the state store's used_memory (INFO memory)",
        sample(lambda memory: ({}, memory.used_memory)),
    )
    metrics.observe_gauge(
        "state_store_maxmemory_bytes",
        "the state store's maxmemory (0: no limit)",
        sample(lambda memory: ({}, memory.maxmemory)),
    )
    # A counter mirroring the server's own: a restart of the store takes it back to 0, which
    # increase() reads as a counter reset, not as a drop (a gauge's delta() would go negative).
    metrics.observe_counter(
        "state_store_evicted_keys",
        "keys the state store evicted since it started (INFO stats)",
        sample(lambda memory: ({}, memory.evicted_keys)),
    )
    # One series at a time: a policy changed with CONFIG SET replaces it, the old one goes stale.
    metrics.observe_gauge(
        "state_store_can_evict",
        "1 when the state store drops keys at its maxmemory (policy: its maxmemory-policy)",
        sample(lambda memory: ({"policy": memory.policy}, float(memory.can_evict))),
    )
