"""Where the gate's evidence comes from: read afresh for one look (the ``gate`` command), or
followed by a reader that looks again and again at a window with a fixed start (the rollout
autopilot), which reads only what is new each time."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, Final, Protocol

from sidecar.config import Settings
from sidecar.serve.gate_checks import FINAL_VERDICTS, Judged
from sidecar.transport.valkey_client import create_client, translate_valkey_errors
from sidecar.verdicts.reader import VerdictFollower, VerdictReadStats, read_verdicts
from sidecar.wire.contract import ATTRIBUTION_MINUTES, Keys
from sidecar.wire.evidence import Evidence
from sidecar.wire.share import ShareValues, share_keys

# A minute this far behind the newest is taken as complete: a document's outcome is filed under
# the minute it started for up to ATTRIBUTION_MINUTES, and RAGFlow's processes flush their
# evidence every few seconds (SERVE_EVIDENCE_FLUSH_S; 3 minutes leaves room for a slow one). A
# process that could not write for longer writes into older minutes when it can; a follower
# does not see that part. Until then a minute is read again at every look (an hour of minute
# hashes, a few hundred kilobytes).
SETTLED_MINUTES: Final = ATTRIBUTION_MINUTES + 3
MINUTE_MS: Final = 60_000


class GateSource(Protocol):
    """The served evidence and the judged verdicts of a window."""

    async def served(self, since_s: float, until_s: float) -> tuple[list[Evidence], ShareValues]:
        """The window's evidence, minute by minute, and the live share."""
        ...

    async def judged(self, since_ms: int) -> Judged:
        """The final verdicts decided since ``since_ms``."""
        ...


class OneLook:
    """Everything read afresh, with a client of its own per read."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings

    async def served(self, since_s: float, until_s: float) -> tuple[list[Evidence], ShareValues]:
        return await read_served(self._settings, since_s, until_s)

    async def judged(self, since_ms: int) -> Judged:
        return await read_judged(self._settings, since_ms)


class Following:
    """For the autopilot: the evidence of one rollout, followed from its exact start.

    Settled minutes are kept, and copied into the rollout's ledger in the state store
    (``<prefix>:rollout:evidence:<started ms>``, no expiry): the anytime-valid tests need
    every minute since the rollout began, and a minute's own key lapses after
    ``EVIDENCE_TTL_S`` (two days), so a long watch, or an autopilot restarted after a crash,
    reads its minutes from the ledger. The minute a rollout starts in is taken as it was at
    the start (``begin``) and only what was added after counts: the minutes of an aborted or
    rolled-back rollout before it are never judged again. Verdicts are read from where the
    last read stopped, on the state store client it is given (it is not closed here).
    """

    def __init__(self, settings: Settings, client: Any) -> None:
        self._settings = settings
        self._client = client
        self._keys = Keys(settings.serve.key_prefix)
        self._minutes: dict[int, Evidence] = {}
        self._follower: VerdictFollower | None = None
        self._judged = Judged()
        self._started_ms: int | None = None  # the rollout followed, if any
        self._start: tuple[int, Counter[str]] | None = None  # its first minute at its start

    def ledger(self, started_ms: int) -> str:
        return f"{self._settings.serve.key_prefix}:rollout:evidence:{started_ms}"

    async def begin(self, started_ms: int, previous_ms: int = 0) -> None:
        """A rollout starts at ``started_ms``: what its first minute holds now is not its own
        (kept once: a second call, after a crash, changes nothing); the ``previous_ms``
        rollout's ledger is dropped."""
        minute = started_ms // MINUTE_MS
        where = self._settings.state.display_url
        with translate_valkey_errors("take the rollout's first minute", where):
            raw = await self._client.hgetall(self._keys.evidence(minute))
            start = json.dumps({"minute": minute, "fields": _counts(raw)})
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.hsetnx(self.ledger(started_ms), "start", start)
                if previous_ms and previous_ms != started_ms:
                    pipe.delete(self.ledger(previous_ms))
                await pipe.execute()
        self._started_ms = None
        await self.follow(started_ms)

    async def follow(self, started_ms: int) -> None:
        """Judge the rollout that started at ``started_ms``: its ledger is read (once)."""
        if self._started_ms == started_ms:
            return
        where = self._settings.state.display_url
        with translate_valkey_errors("read the rollout's ledger", where):
            raw = await self._client.hgetall(self.ledger(started_ms))
        entries = {_text(k): json.loads(v) for k, v in raw.items()}
        if "start" not in entries:
            # Its start was never taken (a build before this one, or a crash in between):
            # taken now, later than the start, it can only leave out the rollout's own first
            # seconds, never count another's.
            await self.begin(started_ms)
            return
        self._started_ms = started_ms
        start = entries.pop("start")
        self._start = (int(start["minute"]), Counter(start["fields"]))
        self._minutes = {int(minute): _evidence(fields) for minute, fields in entries.items()}

    async def served(self, since_s: float, until_s: float) -> tuple[list[Evidence], ShareValues]:
        first, last = int(since_s // 60), int(until_s // 60)
        settled = last - SETTLED_MINUTES
        wanted = [m for m in range(first, last + 1) if m not in self._minutes]
        raw, share = await _read_raw(self._settings, self._client, wanted)
        fresh = {m: self._own(m, fields) for m, fields in zip(wanted, raw, strict=True)}
        keep = {m: fields for m, fields in fresh.items() if m <= settled}
        if keep and self._started_ms is not None:
            where = self._settings.state.display_url
            with translate_valkey_errors("keep the rollout's minutes", where):
                await self._client.hset(
                    self.ledger(self._started_ms),
                    mapping={str(m): json.dumps(fields) for m, fields in keep.items()},
                )
        self._minutes.update({m: _evidence(f) for m, f in keep.items()})
        got = {m: _evidence(fields) for m, fields in fresh.items()}
        return [self._minutes.get(m) or got[m] for m in range(first, last + 1)], share

    def _own(self, minute: int, fields: Counter[str]) -> Counter[str]:
        """A minute's counts, less what its first minute held when the rollout started."""
        if self._start is None:
            return fields
        start_minute, before = self._start
        if minute < start_minute:
            return Counter()
        if minute == start_minute:
            return Counter({k: n - before[k] for k, n in fields.items() if n > before[k]})
        return fields

    async def judged(self, since_ms: int) -> Judged:
        if self._follower is None or self._follower.since_ms != since_ms:
            self._follower = VerdictFollower(self._settings.kafka, since_ms)
            self._judged = Judged()
        stats = VerdictReadStats()
        records = await self._follower.read_new(stats)
        new = judged_of(records, self._settings.mirror.streams)
        self._judged.kinds.update(new.kinds)
        self._judged.duplicates += new.duplicates
        return Judged(Counter(self._judged.kinds), self._judged.duplicates, stats.complete)


async def read_served(
    settings: Settings, since_s: float, until_s: float
) -> tuple[list[Evidence], ShareValues]:
    """The window's evidence, minute by minute (one pipelined HGETALL per minute), and the
    live share, in one trip."""
    minutes = list(range(int(since_s // 60), int(until_s // 60) + 1))
    client = create_client(settings.state)
    try:
        return await _read_minutes(settings, client, minutes)
    finally:
        await client.aclose()


async def _read_minutes(
    settings: Settings, client: Any, minutes: list[int]
) -> tuple[list[Evidence], ShareValues]:
    raw, share = await _read_raw(settings, client, minutes)
    return [_evidence(fields) for fields in raw], share


async def _read_raw(
    settings: Settings, client: Any, minutes: list[int]
) -> tuple[list[Counter[str]], ShareValues]:
    keys = Keys(settings.serve.key_prefix)
    with translate_valkey_errors("read the served share's evidence", settings.state.display_url):
        pipe = client.pipeline(transaction=False)
        for minute in minutes:
            pipe.hgetall(keys.evidence(minute))
        for key in share_keys(keys):
            pipe.get(key)
        replies: list[Any] = await pipe.execute()
    return [_counts(reply) for reply in replies[:-2]], ShareValues.parse(*replies[-2:])


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _evidence(fields: Mapping[str, int]) -> Evidence:
    return Evidence.from_hashes([{name: str(n) for name, n in fields.items()}])


def _counts(raw: Mapping[Any, Any] | None) -> Counter[str]:
    """A minute's hash as counts (every field of it adds up: counts, buckets, sums)."""
    return Counter({_text(k): int(v) for k, v in (raw or {}).items()})


async def read_judged(settings: Settings, since_ms: int) -> Judged:
    """Final verdicts decided since ``since_ms`` about the streams this deployment mirrors
    (the verdicts topic may carry another deployment's, or an older stream layout's)."""
    stats = VerdictReadStats()
    records = await read_verdicts(
        settings.kafka, since_ms=since_ms, verdicts=None, task_types=None, stats=stats
    )
    judged = judged_of(records, settings.mirror.streams)
    judged.complete = stats.complete
    return judged


def judged_of(records: Iterable[Mapping[str, Any]], streams: Iterable[str]) -> Judged:
    wanted = set(streams)
    judged = Judged()
    for record in records:
        if record.get("stream") not in wanted:
            continue
        kind = str(record.get("verdict"))
        if kind == "duplicate":
            judged.duplicates += 1
        elif kind in FINAL_VERDICTS:
            judged.kinds[kind] += 1
    return judged
