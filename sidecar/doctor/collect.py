"""One reading of the deployment: every finding, and the consumers and groups behind them (the
requeue acts on those). Shared by the command and by ``run``'s poller for /metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import valkey.asyncio as avalkey

from sidecar.config import Settings
from sidecar.doctor.executors import Consumer, consumer_findings, lag_findings, read_consumers
from sidecar.doctor.findings import Finding
from sidecar.doctor.stores import store_findings
from sidecar.errors import SidecarError


@dataclass(frozen=True)
class Reading:
    findings: list[Finding]
    consumers: list[Consumer] = field(default_factory=list)
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)


async def read_stores(
    settings: Settings,
    ragflow: avalkey.Valkey,
    state: avalkey.Valkey | None,
    read_config: bool = True,
) -> list[Finding]:
    """``state`` None: the state store is RAGFlow's Valkey (one server, read once).
    ``read_config``: also CONFIG GET the RDB save points (see valkey_memory.read_persistence)."""
    where = settings.redis.display_url
    findings = await store_findings(
        "ragflow-valkey", ragflow, where, shared=state is None, read_config=read_config
    )
    if state is None:
        findings.append(
            Finding(
                "state-store.location",
                "note",
                where,
                "the state store is RAGFlow's Valkey (SIDECAR_STATE_URL unset or the same "
                "server): the claims can lose what RAGFlow's Valkey can",
            )
        )
    else:
        findings += await store_findings(
            "state-store", state, settings.state.display_url, read_config=read_config
        )
    return findings


async def read_executors(
    settings: Settings, ragflow: avalkey.Valkey, older_than_ms: int
) -> Reading:
    where = settings.redis.display_url
    try:
        consumers, groups = await read_consumers(ragflow, settings.mirror.streams, where)
        findings = consumer_findings(consumers, older_than_ms)
        findings += await lag_findings(ragflow, groups, where)
    except SidecarError as exc:
        return Reading([Finding("executors.reachable", "unknown", where, str(exc))])
    return Reading(findings, consumers, groups)
