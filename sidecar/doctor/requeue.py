"""Orphaned pending entries back onto their stream, once: each copied to the stream's end and
the orphan acked in one Lua script, so that no crash between the two can lose the task or
queue it twice. The script moves an entry only while it is still pending with the same consumer
and idle past the threshold: a second run, or a consumer that came back and took it, finds
nothing to move. Each move is recorded in the stream ``REQUEUED_KEY``.

The copy is a new entry with the same fields: a live executor reads it as new work (RAGFlow's
``get_task`` counts it as one more delivery of the task).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import valkey.asyncio as avalkey

from sidecar.doctor.executors import Consumer, duration
from sidecar.doctor.findings import Finding
from sidecar.observer.observer import RAGFLOW_GROUP
from sidecar.text import as_text
from sidecar.transport.valkey_client import translate_valkey_errors

logger = logging.getLogger(__name__)

REQUEUED_KEY: Final = "ragflow_sidecar:doctor:requeued"
# Entries moved per consumer in one XPENDING page; the rest on the next page.
PAGE: Final = 500

# KEYS: stream, record stream. ARGV: group, entry id, consumer, minimum idle ms.
_MOVE: Final = """
local held = redis.call('XPENDING', KEYS[1], ARGV[1], 'IDLE', ARGV[4], ARGV[2], ARGV[2], 1, ARGV[3])
if #held == 0 then return false end
local entry = redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[2])
local copy = ''
if #entry == 1 then copy = redis.call('XADD', KEYS[1], '*', unpack(entry[1][2])) end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', '100000', '*', 'stream', KEYS[1], 'from_id', ARGV[2],
  'to_id', copy, 'consumer', ARGV[3], 'idle_ms', tostring(held[1][3]))
return copy
"""


@dataclass(frozen=True)
class Move:
    stream: str
    consumer: str
    from_id: str
    to_id: str  # "" when the entry itself was gone (trimmed): only the orphan was acked


async def requeue_orphans(
    client: avalkey.Valkey, consumers: Sequence[Consumer], older_than_ms: int, where: str
) -> tuple[list[Move], list[Finding]]:
    """Move the pending entries of every consumer silent for ``older_than_ms``; a consumer that
    still looks alive is refused, one finding each."""
    script = client.register_script(_MOVE)
    moves: list[Move] = []
    refused: list[Finding] = []
    for consumer in consumers:
        if not consumer.pending:
            continue
        if consumer.alive(older_than_ms):
            refused.append(
                Finding(
                    "requeue.refused",
                    "note",
                    f"{consumer.stream} {consumer.name}",
                    f"{consumer.pending} pending left in place: it still looks alive "
                    f"({consumer.silence()}, under {duration(older_than_ms)})",
                )
            )
            continue
        with translate_valkey_errors("requeue orphaned entries", where):
            while True:
                held: list[dict[str, Any]] = await client.xpending_range(
                    consumer.stream,
                    RAGFLOW_GROUP,
                    "-",
                    "+",
                    PAGE,
                    consumername=consumer.name,
                    idle=older_than_ms,
                )
                if not held:
                    break
                moved_any = False
                for entry in held:
                    entry_id = as_text(entry["message_id"])
                    copy = await script(
                        keys=[consumer.stream, REQUEUED_KEY],
                        args=[RAGFLOW_GROUP, entry_id, consumer.name, older_than_ms],
                    )
                    if copy is None:
                        continue  # taken back by its consumer, or moved by another doctor
                    move = Move(consumer.stream, consumer.name, entry_id, as_text(copy))
                    logger.info(
                        "requeued %s %s of %s as %s",
                        move.stream,
                        move.from_id,
                        move.consumer,
                        move.to_id or "(entry gone: acked only)",
                    )
                    moves.append(move)
                    moved_any = True
                # A page where nothing moved would come back the same: stop there.
                if len(held) < PAGE or not moved_any:
                    break
    return moves, refused
