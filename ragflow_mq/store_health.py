"""What the state store can lose, read from the store itself.

The served path's claims, done markers and pending entries live there. A store that evicts
(any ``maxmemory-policy`` but ``noeviction`` once ``maxmemory`` is reached) or keeps nothing
across a restart (neither AOF nor RDB snapshots) can forget them. The executors survive that
(they assert their claims again, and never hand out twice what they hold), but a forgotten
done marker lets a late duplicate record of a finished task run again, and a forgotten pending
entry is a task lost. Said once at start, loudly, and on the sidecar's ``/metrics``/``status``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sidecar.text import as_text
from sidecar.transport.valkey_client import translate_valkey_errors
from sidecar.transport.valkey_memory import read_memory, read_persistence

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoreFacts:
    """The store's identity and durability; ``None`` where it would not say (an ACL may
    refuse CONFIG)."""

    run_id: str
    uptime_s: float
    policy: str | None = None  # maxmemory-policy
    maxmemory: int | None = None  # bytes, 0 for no limit
    aof: bool | None = None
    rdb: bool | None = None  # RDB snapshots configured (a non-empty ``save``)

    def risks(self) -> list[str]:
        """What the store can lose, one sentence each; empty for a durable store."""
        found: list[str] = []
        if self.policy is not None and self.policy != "noeviction" and self.maxmemory != 0:
            found.append(
                f"maxmemory-policy {self.policy} evicts keys when full: a done marker evicted "
                "lets a late duplicate record of a finished task run again, a pending entry "
                "evicted is a task lost"
            )
        if self.aof is False and self.rdb is False:
            found.append("no persistence (neither AOF nor RDB): a restart forgets every claim")
        elif self.aof is False:
            found.append("no AOF: a restart forgets what changed since the last RDB snapshot")
        return found


def _info_value(info: dict[str, Any], name: str) -> Any:
    value = info.get(name)
    return as_text(value) if isinstance(value, bytes) else value


async def read_identity(client: Any, where: str) -> tuple[str, float]:
    """The store's run id (new at each restart) and uptime, in one cheap call."""
    with translate_valkey_errors("read the state store's identity", where):
        info = await client.info("server")
    return str(_info_value(info, "run_id")), float(_info_value(info, "uptime_in_seconds") or 0)


async def read_facts(client: Any, where: str) -> StoreFacts:
    """Identity, eviction policy and persistence of the store. The policy comes from INFO
    (allowed by docs/security.md's ACL); RDB save points need CONFIG, which may be refused."""
    run_id, uptime_s = await read_identity(client, where)
    memory = await read_memory(client, where)
    persistence = await read_persistence(client, where, ("save",))
    return StoreFacts(
        run_id, uptime_s, memory.policy, memory.maxmemory, persistence.aof, persistence.rdb
    )


def say_risks(facts: StoreFacts, where: str) -> None:
    """Log what the store can lose, once, at the served path's start."""
    for risk in facts.risks():
        logger.warning(
            "the state store %s can lose the served path's keys: %s (docs/operations.md, "
            "'The state store'; SIDECAR_STATE_URL names one with noeviction and AOF)",
            where,
            risk,
        )
