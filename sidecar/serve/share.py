"""``ragflow-sidecar shift``: set the live share, show it, and log every change of it.

The live share (``ragflow_mq.share``) is the served share as set in the state store; every
RAGFlow process follows it within ``SERVE_SHARE_REFRESH_S``, without a restart, never above its
``KAFKA_SERVE_PERCENT`` (the ceiling, the operator's word in the env). ``shift --to P`` sets it,
``gate --apply`` sets it to 0 on a roll-back; both go through :func:`set_share`, which writes
the value and a log entry (from, to, by, who, why) in one script, so no change goes unrecorded
and a later autopilot reads the same history ``shift --status`` prints.

Through a state-store outage every RAGFlow process serves 0 by itself (it cannot read the
share: ``ragflow_mq.share``), so a roll-back is in effect before anyone writes it; the
operator's ``shift --to``/``rollout abort`` waits for the store (:func:`while_store_is_down`,
``--wait-s``) and writes the value when it answers, within the processes' hold after an
outage, so the old share is never served again in between.
"""

from __future__ import annotations

import asyncio
import getpass
import json
import logging
import math
import socket
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

from sidecar.config import Settings
from sidecar.errors import ConfigError, SidecarError
from sidecar.transport.valkey_client import create_client, translate_valkey_errors
from sidecar.wire.contract import Keys
from sidecar.wire.share import ShareValues, parse_percent, share_keys

logger = logging.getLogger(__name__)

T = TypeVar("T")
WAIT_RETRY_S: Final = 1.0  # well within ragflow_mq.share.RECOVERED_HOLD_S
STORE_WAIT_S: Final = 600.0  # --wait-s by default: an outage a restart or a failover ends

LOG_LENGTH: Final = 1000  # entries the log keeps (exactly: a few hundred bytes each)
STATUS_ENTRIES: Final = 10  # shown by `shift --status`
CEILING: Final = "KAFKA_SERVE_PERCENT"

# One atomic step: the value, the old cap folded in and the log entry, so two writers at once
# (an operator and a gate) each leave their entry, in the order their values took effect.
# The old cap is set to 100 (its no-cap value), not deleted: a RAGFlow process that sees a key
# vanish takes it for an eviction and keeps its last value.
SHIFT_SCRIPT: Final = """
local previous = redis.call('GET', KEYS[1])
local cap = redis.call('GET', KEYS[2])
local folded = false
if cap and tonumber(cap) ~= 100 then
  redis.call('SET', KEYS[2], '100')
  folded = cap
end
if not folded and previous and tonumber(previous) == tonumber(ARGV[1]) then
  return {previous, false, false}
end
redis.call('SET', KEYS[1], ARGV[1])
local entry = {'from', previous or '', 'to', ARGV[1], 'by', ARGV[2], 'actor', ARGV[3],
               'ceiling', ARGV[4], 'reason', ARGV[5], 'old_cap', folded or ''}
local id = redis.call('XADD', KEYS[3], 'MAXLEN', ARGV[6], '*', unpack(entry))
return {previous or false, folded, id}
"""


async def while_store_is_down(
    settings: Settings, write: Callable[[], Awaitable[T]], wait_s: float
) -> T:
    """``write()``, tried again every second for up to ``wait_s`` while the state store does
    not answer; says once, on stderr's log, that RAGFlow serves 0 meanwhile."""
    give_up = asyncio.get_running_loop().time() + wait_s
    told = False
    while True:
        try:
            return await write()
        except SidecarError as exc:
            if not exc.retriable or asyncio.get_running_loop().time() >= give_up:
                raise
            if not told:
                told = True
                logger.warning(
                    "the state store at %s does not answer (%s): RAGFlow's processes serve 0 %% "
                    "from Kafka while they cannot read it; writing when it answers (up to "
                    "--wait-s=%g s)",
                    settings.state.display_url,
                    exc,
                    wait_s,
                )
            await asyncio.sleep(WAIT_RETRY_S)


def parse_target(text: str, ceiling: float) -> float:
    """``--to``: a percentage from 0 to the ceiling, decimals allowed."""
    try:
        value = float(text)
    except ValueError:
        raise ConfigError("--to", f"{text!r} is not a number (a percentage, 0 to 100)") from None
    if math.isnan(value) or not 0 <= value <= 100:
        raise ConfigError("--to", f"{text} is out of range (a percentage, 0 to 100)")
    if value > ceiling:
        raise ConfigError(
            CEILING,
            f"--to {value:g} is above the ceiling {CEILING}={ceiling:g}: raise {CEILING} in "
            "both .env files (RAGFlow's and the sidecar's) and restart both first",
        )
    return value


@dataclass(frozen=True)
class Shift:
    """What one write of the live share did."""

    previous: float | None  # the live share before; None: never set (the ceiling was served)
    to: float
    old_cap: float | None  # the old cap this write folded in, if one was set
    logged: bool  # False: the value was already ``to`` and nothing was written


def actor() -> str:
    """Who runs this command, for the log: ``user@host``."""
    try:
        user = getpass.getuser()
    except Exception:  # no name for this uid (a container's): the number will do
        user = "?"
    return f"{user}@{socket.gethostname()}"


async def set_share(
    settings: Settings, to: float, *, by: str, reason: str = "", client: Any = None
) -> Shift:
    """Set the live share to ``to`` (already checked against the ceiling) and log the change,
    on ``client`` (left open) or a client of its own."""
    keys = Keys(settings.serve.key_prefix)
    own = client is None
    client = create_client(settings.state) if own else client
    args = (f"{to:g}", by, actor(), f"{settings.serve.percent:g}", reason, str(LOG_LENGTH))
    where = settings.state.display_url
    try:
        with translate_valkey_errors(f"set the live share {keys.share}", where):
            # valkey-py types eval as sync-or-async; on the asyncio client it awaits.
            reply = await client.eval(SHIFT_SCRIPT, 3, *share_keys(keys), keys.share_log, *args)
    finally:
        if own:
            await client.aclose()
    previous, folded, entry = reply
    shift = Shift(parse_percent(previous), to, parse_percent(folded), entry is not None)
    if shift.logged:
        logger.info("%s set the live share %s from %s to %g %%", by, keys.share, previous, to)
    return shift


def describe(settings: Settings, shift: Shift) -> str:
    """One line for the operator: what changed and when RAGFlow follows."""
    keys = Keys(settings.serve.key_prefix)
    was = "unset" if shift.previous is None else f"{shift.previous:g} %"
    done = f"set to {shift.to:g} % (was {was})" if shift.logged else f"already {shift.to:g} %"
    line = (
        f"live share {keys.share} {done}: RAGFlow serves "
        f"{ShareValues(shift.to).served(settings.serve.percent):g} % from Kafka within "
        f"SERVE_SHARE_REFRESH_S={settings.serve.share_refresh_s:g} s "
        f"(ceiling {CEILING}={settings.serve.percent:g} %)"
    )
    if shift.old_cap is not None:
        line += f"; the old cap {keys.old_cap} ({shift.old_cap:g}) is folded in (set to 100)"
    return line


@dataclass(frozen=True)
class LogEntry:
    """One change of the live share, as the log keeps it."""

    at: str  # ISO time, from the entry's id (the state store's clock)
    previous: float | None  # "from"; None: unset
    to: float | None
    by: str
    actor: str
    ceiling: float | None
    reason: str
    old_cap: float | None  # an old cap folded in by this change

    @classmethod
    def parse(cls, entry_id: bytes | str, fields: dict[bytes, bytes]) -> LogEntry:
        def text(name: str) -> str:
            return fields.get(name.encode(), b"").decode("utf-8", "replace")

        ms = int((entry_id.decode() if isinstance(entry_id, bytes) else entry_id).split("-")[0])
        return cls(
            at=datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            previous=parse_percent(text("from") or None),
            to=parse_percent(text("to") or None),
            by=text("by"),
            actor=text("actor"),
            ceiling=parse_percent(text("ceiling") or None),
            reason=text("reason"),
            old_cap=parse_percent(text("old_cap") or None),
        )


@dataclass
class ShareStatus:
    """The ceiling, what the store holds, what RAGFlow serves, and the last changes."""

    ceiling: float
    values: ShareValues
    refresh_s: float
    keys: Keys
    log: list[LogEntry] = field(default_factory=list)  # newest first

    @property
    def served(self) -> float:
        return self.values.served(self.ceiling)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ceiling": self.ceiling,
            "live": self.values.live,
            "old_cap": self.values.old_cap,
            "served": self.served,
            "refresh_s": self.refresh_s,
            "keys": {"live": self.keys.share, "log": self.keys.share_log},
            "log": [asdict(entry) for entry in self.log],
        }


async def read_status(settings: Settings, entries: int = STATUS_ENTRIES) -> ShareStatus:
    keys = Keys(settings.serve.key_prefix)
    client = create_client(settings.state)
    try:
        with translate_valkey_errors("read the live share", settings.state.display_url):
            pipe = client.pipeline(transaction=False)
            for key in share_keys(keys):
                pipe.get(key)
            pipe.xrevrange(keys.share_log, count=entries)
            live, old_cap, log = await pipe.execute()
    finally:
        await client.aclose()
    return ShareStatus(
        ceiling=settings.serve.percent,
        values=ShareValues.parse(live, old_cap),
        refresh_s=settings.serve.share_refresh_s,
        keys=keys,
        log=[LogEntry.parse(entry_id, fields) for entry_id, fields in log],
    )


def render_status(status: ShareStatus) -> str:
    live, old_cap = status.values.live, status.values.old_cap
    lines = [
        f"ceiling       {status.ceiling:g} % ({CEILING}; RAGFlow's processes read theirs at "
        "start: keep both .env files equal)",
        f"live share    {'unset: the ceiling is served' if live is None else f'{live:g} %'} "
        f"({status.keys.share})",
    ]
    if old_cap is not None and old_cap < 100:
        lines.append(
            f"old cap       {old_cap:g} % ({status.keys.old_cap}, from an earlier build: the "
            "lower wins until the next shift folds it in)"
        )
    lines += [
        f"served share  {status.served:g} %: RAGFlow's processes follow within "
        f"SERVE_SHARE_REFRESH_S={status.refresh_s:g} s",
        "",
        f"changes, newest first ({status.keys.share_log}, the last {LOG_LENGTH} kept):",
    ]
    if not status.log:
        lines.append("  none")
    for entry in status.log:
        was = "unset" if entry.previous is None else f"{entry.previous:g}"
        to = "?" if entry.to is None else f"{entry.to:g}"
        line = f"  {entry.at}  {was} -> {to} %  by {entry.by} ({entry.actor})"
        if entry.old_cap is not None:
            line += f", old cap {entry.old_cap:g} folded in"
        if entry.reason:
            line += f": {entry.reason}"
        lines.append(line)
    return "\n".join(lines)


def render_json(status: ShareStatus) -> str:
    return json.dumps(status.to_dict(), indent=2, sort_keys=True)
