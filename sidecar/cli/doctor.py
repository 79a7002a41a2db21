"""``ragflow-sidecar doctor``: reads the deployment the sidecar joins and prints one line per
finding; exit 0 (fine), 1 (a risk) or 2 (cannot tell). ``--requeue-orphans`` (opt-in) puts the
orphaned pending entries back on their streams first (sidecar/doctor/requeue.py)."""

from __future__ import annotations

import re
from typing import Final

from sidecar.app.state_store import shares_ragflows_valkey
from sidecar.config import Settings
from sidecar.doctor.executors import consumer_findings, lag_findings, read_consumers
from sidecar.doctor.findings import Finding, exit_code, render
from sidecar.doctor.requeue import REQUEUED_KEY, requeue_orphans
from sidecar.doctor.stores import store_findings
from sidecar.errors import ConfigError, SidecarError
from sidecar.transport.valkey_client import create_client

# Twice RAGFlow's longest task timeout (do_handle_task, 3 h): a consumer silent this long with
# entries in hand is not working on them.
DEFAULT_OLDER_THAN: Final = "6h"
_DURATION: Final = re.compile(r"^([0-9]+)\s*(s|m|h|d)$")
_UNIT_MS: Final = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_older_than(text: str) -> int:
    """``--older-than``: ``90s``, ``30m``, ``6h``, ``1d``, in milliseconds."""
    match = _DURATION.match(text.strip().lower())
    if not match or int(match.group(1)) == 0:
        raise ConfigError("--older-than", f"{text!r} is not a duration above 0 (90s, 30m, 6h, 1d)")
    return int(match.group(1)) * _UNIT_MS[match.group(2)]


async def doctor(settings: Settings, older_than_ms: int, requeue: bool) -> int:
    ragflow = create_client(settings.redis)
    shared = shares_ragflows_valkey(settings)
    state = None if shared else create_client(settings.state)
    where = settings.redis.display_url
    try:
        findings = await store_findings("ragflow-valkey", ragflow, where, shared=shared)
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
            findings += await store_findings("state-store", state, settings.state.display_url)
        streams = settings.mirror.streams
        try:
            consumers, groups = await read_consumers(ragflow, streams, where)
            if requeue:
                moves, refused = await requeue_orphans(ragflow, consumers, older_than_ms, where)
                for move in moves:
                    print(
                        f"requeued {move.stream} {move.from_id} of {move.consumer} as "
                        f"{move.to_id or '(entry gone: acked only)'}"
                    )
                print(f"requeued {len(moves)} entries (recorded in {REQUEUED_KEY})")
                findings += refused
                consumers, groups = await read_consumers(ragflow, streams, where)
            findings += consumer_findings(consumers, older_than_ms)
            findings += await lag_findings(ragflow, groups, where)
        except SidecarError as exc:
            findings.append(Finding("executors.reachable", "unknown", where, str(exc)))
    finally:
        await ragflow.aclose()
        if state is not None:
            await state.aclose()
    print(render(findings))
    return exit_code(findings)
