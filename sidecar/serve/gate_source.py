"""Where the gate's evidence comes from: read afresh for one look (the ``gate`` command), or
followed by a reader that looks again and again at a window with a fixed start (the rollout
autopilot), which reads only what is new each time."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, Final, Protocol

from ragflow_mq.contract import Keys
from ragflow_mq.evidence import Evidence
from ragflow_mq.share import ShareValues, share_keys
from sidecar.config import Settings
from sidecar.serve.gate_checks import FINAL_VERDICTS, Judged
from sidecar.transport.valkey_client import create_client, translate_valkey_errors
from sidecar.verdicts.reader import VerdictFollower, VerdictReadStats, read_verdicts

# A minute this far behind the newest is taken as complete: RAGFlow's processes flush their
# evidence every few seconds (SERVE_EVIDENCE_FLUSH_S). A process that could not write for
# longer writes into older minutes when it can; a follower does not see that part.
SETTLED_MINUTES: Final = 3


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
    """For the autopilot: settled minutes are kept, verdicts read from where the last read
    stopped, on the state store client it is given (it is not closed here)."""

    def __init__(self, settings: Settings, client: Any) -> None:
        self._settings = settings
        self._client = client
        self._minutes: dict[int, Evidence] = {}
        self._follower: VerdictFollower | None = None
        self._judged = Judged()

    async def served(self, since_s: float, until_s: float) -> tuple[list[Evidence], ShareValues]:
        first, last = int(since_s // 60), int(until_s // 60)
        settled = last - SETTLED_MINUTES
        wanted = [m for m in range(first, last + 1) if m not in self._minutes]
        fresh, share = await _read_minutes(self._settings, self._client, wanted)
        for minute, evidence in zip(wanted, fresh, strict=True):
            if minute <= settled:
                self._minutes[minute] = evidence
        got = dict(zip(wanted, fresh, strict=True))
        return [self._minutes.get(m) or got[m] for m in range(first, last + 1)], share

    def forget_before(self, since_s: float) -> None:
        """Drop the minutes before ``since_s`` (a new rollout starts later)."""
        first = int(since_s // 60)
        for minute in [m for m in self._minutes if m < first]:
            del self._minutes[minute]

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
    keys = Keys(settings.serve.key_prefix)
    with translate_valkey_errors("read the served share's evidence", settings.state.display_url):
        pipe = client.pipeline(transaction=False)
        for minute in minutes:
            pipe.hgetall(keys.evidence(minute))
        for key in share_keys(keys):
            pipe.get(key)
        replies: list[Any] = await pipe.execute()
    evidence = [Evidence.from_hashes([reply]) for reply in replies[:-2]]
    return evidence, ShareValues.parse(*replies[-2:])


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
