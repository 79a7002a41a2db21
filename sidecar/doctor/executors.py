"""RAGFlow's executors as Valkey sees them: consumers of ``rag_flow_svr_task_broker``, their
heartbeats, their pending entries, and the group lag RAGFlow shows as "tasks ahead".

A consumer looks alive while it heartbeats (RAGFlow's executor ZADDs ``<name>`` every 30 s,
busy or not) or reads (XINFO CONSUMERS ``idle``) within ``older_than_ms``. One that does
neither and holds pending entries is an orphan: RAGFlow never claims another consumer's entries
(upstream #15805), and its name changes with every pod, so no one will run them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import valkey.asyncio as avalkey
from valkey.exceptions import ResponseError

from sidecar.doctor.findings import Finding
from sidecar.observer.observer import RAGFLOW_GROUP
from sidecar.text import as_text
from sidecar.transport.valkey_client import translate_valkey_errors

# Twice RAGFlow's longest task timeout (do_handle_task, 3 h): a consumer silent this long with
# entries in hand is not working on them. The command's default and what /metrics uses.
DEFAULT_OLDER_THAN: Final = "6h"
DEFAULT_OLDER_THAN_MS: Final = 6 * 3_600_000
# Entries counted past the group's last-delivered id to check its lag; a longer backlog is
# reported as "at least" this many.
LAG_COUNT_LIMIT: Final = 10_000


@dataclass(frozen=True)
class Consumer:
    stream: str
    name: str
    pending: int
    idle_ms: int  # since its last read (XINFO CONSUMERS idle)
    heartbeat_age_ms: int | None  # since its last heartbeat; None: it never heartbeat
    oldest_pending_ms: int  # the longest an entry of its has been in hand; 0 without any

    def alive(self, older_than_ms: int) -> bool:
        heard = self.heartbeat_age_ms is not None and self.heartbeat_age_ms < older_than_ms
        return heard or self.idle_ms < older_than_ms

    def silence(self) -> str:
        heartbeat = (
            "never heartbeat"
            if self.heartbeat_age_ms is None
            else f"last heartbeat {duration(self.heartbeat_age_ms)} ago"
        )
        return f"last read {duration(self.idle_ms)} ago, {heartbeat}"


def duration(ms: int) -> str:
    seconds = ms / 1000
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172_800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


async def _heartbeat_age_ms(client: avalkey.Valkey, name: str, now_ms: int) -> int | None:
    try:
        last: list[Any] = await client.zrange(name, -1, -1, withscores=True)
    except ResponseError:  # a key of another type: not a heartbeat of RAGFlow's
        return None
    if not last:
        return None
    return max(0, now_ms - int(float(last[0][1]) * 1000))


async def _group(client: avalkey.Valkey, stream: str) -> dict[str, Any] | None:
    if not await client.exists(stream):
        return None
    groups: list[dict[str, Any]] = await client.xinfo_groups(stream)
    return next((g for g in groups if as_text(g["name"]) == RAGFLOW_GROUP), None)


async def read_consumers(
    client: avalkey.Valkey, streams: Sequence[str], where: str
) -> tuple[list[Consumer], dict[str, dict[str, Any]]]:
    """Every consumer of RAGFlow's group on ``streams`` and each stream's group entry
    (streams or groups that do not exist yet are left out: RAGFlow creates them on first use)."""
    now_ms = int(time.time() * 1000)
    consumers: list[Consumer] = []
    groups: dict[str, dict[str, Any]] = {}
    with translate_valkey_errors("read RAGFlow's consumer group", where):
        for stream in streams:
            group = await _group(client, stream)
            if group is None:
                continue
            groups[stream] = group
            for info in await client.xinfo_consumers(stream, RAGFLOW_GROUP):
                name = as_text(info["name"])
                pending = int(info["pending"])
                oldest = 0
                if pending:
                    entries = await client.xpending_range(
                        stream, RAGFLOW_GROUP, "-", "+", min(pending, 1000), consumername=name
                    )
                    # default: acked between XINFO CONSUMERS and XPENDING (a live executor).
                    oldest = max((int(e["time_since_delivered"]) for e in entries), default=0)
                consumers.append(
                    Consumer(
                        stream=stream,
                        name=name,
                        pending=pending,
                        idle_ms=int(info["idle"]),
                        heartbeat_age_ms=await _heartbeat_age_ms(client, name, now_ms),
                        oldest_pending_ms=oldest,
                    )
                )
    return consumers, groups


def consumer_findings(consumers: Sequence[Consumer], older_than_ms: int) -> list[Finding]:
    findings: list[Finding] = []
    for c in consumers:
        subject = f"{c.stream} {c.name}"
        if c.alive(older_than_ms):
            findings.append(
                Finding("executors.consumer", "ok", subject, f"{c.pending} pending, {c.silence()}")
            )
    orphans = [c for c in consumers if c.pending and not c.alive(older_than_ms)]
    for c in orphans:
        findings.append(
            Finding(
                "executors.orphans",
                "risk",
                f"{c.stream} {c.name}",
                f"{c.pending} pending entries, oldest delivered {duration(c.oldest_pending_ms)} "
                f"ago; {c.silence()}: no executor will run them (RAGFlow never claims another "
                "consumer's entries); `ragflow-sidecar doctor --requeue-orphans --older-than "
                f"{duration(older_than_ms).replace(' ', '')}` puts them back on the stream",
            )
        )
    if not orphans:
        findings.append(
            Finding(
                "executors.orphans",
                "ok",
                RAGFLOW_GROUP,
                f"no pending entries held by a consumer silent for {duration(older_than_ms)}",
            )
        )
    if not consumers:
        findings.append(
            Finding("executors.consumer", "note", RAGFLOW_GROUP, "no executor has read yet")
        )
    return findings


async def lag_findings(
    client: avalkey.Valkey, groups: dict[str, dict[str, Any]], where: str
) -> list[Finding]:
    """The group lag RAGFlow reads for "N tasks are ahead" against the entries actually past the
    group's last-delivered id (RAGFlow #16499: the lag can be stale or nil)."""
    findings: list[Finding] = []
    for stream, group in groups.items():
        last = as_text(group["last-delivered-id"])
        with translate_valkey_errors("count undelivered entries", where):
            after: list[Any] = await client.xrange(stream, f"({last}", "+", count=LAG_COUNT_LIMIT)
        counted = len(after)
        shown = f"at least {counted}" if counted == LAG_COUNT_LIMIT else str(counted)
        lag = group.get("lag")
        pending = int(group.get("pending") or 0)
        tail = f"; {pending} delivered and not yet acked are not counted in it"
        if lag is None:
            findings.append(
                Finding(
                    "ragflow-valkey.lag",
                    "note",
                    stream,
                    f"the group's lag is nil (entries were deleted or the server is older than "
                    f"7): RAGFlow shows no queue position; {shown} entries are undelivered{tail}",
                )
            )
        elif int(lag) != counted and counted < LAG_COUNT_LIMIT:
            findings.append(
                Finding(
                    "ragflow-valkey.lag",
                    "note",
                    stream,
                    f"the group's lag reads {int(lag)} (RAGFlow's 'tasks ahead') but {shown} "
                    f"entries are undelivered: the reading is stale{tail}",
                )
            )
        else:
            findings.append(
                Finding("ragflow-valkey.lag", "ok", stream, f"lag {lag} matches the backlog{tail}")
            )
    return findings
