"""``ragflow-sidecar doctor``: reads the deployment the sidecar joins and prints one line per
finding; exit 0 (fine), 1 (a risk) or 2 (cannot tell). ``--requeue-orphans`` (opt-in) puts the
orphaned pending entries back on their streams first (sidecar/doctor/requeue.py)."""

from __future__ import annotations

import argparse
import asyncio
import re
from typing import Any, Final

from sidecar.app.state_store import shares_ragflows_valkey
from sidecar.config import Settings
from sidecar.doctor.collect import read_executors, read_stores
from sidecar.doctor.executors import DEFAULT_OLDER_THAN
from sidecar.doctor.findings import exit_code, render
from sidecar.doctor.requeue import REQUEUED_KEY, requeue_orphans
from sidecar.errors import ConfigError
from sidecar.transport.valkey_client import create_client

__all__ = ["DEFAULT_OLDER_THAN", "add_parser", "doctor", "parse_older_than", "run"]

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
    state = None if shares_ragflows_valkey(settings) else create_client(settings.state)
    try:
        findings = await read_stores(settings, ragflow, state)
        reading = await read_executors(settings, ragflow, older_than_ms)
        if requeue:
            where = settings.redis.display_url
            moves, refused = await requeue_orphans(ragflow, reading.consumers, older_than_ms, where)
            for move in moves:
                print(
                    f"requeued {move.stream} {move.from_id} of {move.consumer} as "
                    f"{move.to_id or '(entry gone: acked only)'}"
                )
            print(f"requeued {len(moves)} entries (recorded in {REQUEUED_KEY})")
            findings += refused
            reading = await read_executors(settings, ragflow, older_than_ms)
        findings += reading.findings
    finally:
        await ragflow.aclose()
        if state is not None:
            await state.aclose()
    print(render(findings))
    return exit_code(findings)


def add_parser(commands: Any) -> None:
    doctor = commands.add_parser(
        "doctor",
        help="what RAGFlow's Valkey and the state store can lose, executors and orphaned "
        "entries; exit 0 fine, 1 risk, 2 cannot tell",
    )
    doctor.add_argument(
        "--older-than",
        default=DEFAULT_OLDER_THAN,
        help=f"a consumer silent this long holds orphans (90s, 30m, 6h; {DEFAULT_OLDER_THAN})",
    )
    doctor.add_argument(
        "--requeue-orphans",
        action="store_true",
        help="put each orphaned pending entry back on its stream (once, atomically) first",
    )


def run(settings: Settings, args: argparse.Namespace) -> int:
    return asyncio.run(doctor(settings, parse_older_than(args.older_than), args.requeue_orphans))
