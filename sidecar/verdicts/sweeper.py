"""The sweeper: decides the entries the join left open past ``SHADOW_COMPARE_TIMEOUT_S``.

An open entry is claimed (with the judge's token) once it is past the compare timeout and the
shadow group has read past where its Kafka copy would be (:mod:`sidecar.verdicts.progress`), so
a slow shadow delays verdicts instead of producing false ``missing_*`` ones. A claim left by an
instance that died is taken over; that instance may have published its verdict before it could
mark the entry, so the verdicts topic is read for it before a second one is published.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from sidecar.errors import SidecarError
from sidecar.transport.valkey_client import translate_valkey_errors
from sidecar.verdicts.join import EntryRef
from sidecar.verdicts.judge import Judge
from sidecar.verdicts.progress import ShadowProgress
from sidecar.verdicts.reader import read_verdicts

logger = logging.getLogger(__name__)

SWEEP_BATCH = 200
# An entry open this many compare timeouts is decided even if the shadow group has not been
# seen to read past its copy (no shadow running, Kafka not answering offset requests).
GIVE_UP_TIMEOUTS = 10


class Sweeper:
    """Claims expired and stale entries of the join and has ``judge`` decide them."""

    def __init__(self, judge: Judge, progress: ShadowProgress) -> None:
        """``progress`` is the root's (:mod:`sidecar.app`), started before the first sweep."""
        self._judge = judge
        self._progress = progress
        self.settings = settings = judge.settings
        # A claim older than this belonged to an instance that died before publishing: a live
        # one gives up on Kafka after twice its request timeout (KafkaProducer's bound).
        self._stale_claim_ms = max(
            int(settings.shadow.compare_timeout_s * 1000),
            2 * settings.kafka.request_timeout_ms + 1000,
        )

    async def sweep(self, now_ms: int | None = None) -> int:
        """Decide entries open past the compare timeout; returns how many were decided."""
        judge = self._judge
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        token = judge.token(now_ms)
        older_than = await self._cutoff(now_ms)
        with translate_valkey_errors("sweep open entries", judge.where):
            claimed = await judge.join.claim_expired(
                older_than, token, now_ms, self._stale_claim_ms, SWEEP_BATCH
            )
        taken_over = [at for _, at in claimed if at is not None]
        already: dict[str, str] = {}
        if taken_over:
            # A dead claimer may have published before it could mark the entry: look for
            # its verdicts rather than publish a second one.
            published = await read_verdicts(
                self.settings.kafka, since_ms=min(taken_over), verdicts=None, task_types=None
            )
            already = {str(v["verdict_id"]): str(v["verdict"]) for v in published}
        fresh: list[EntryRef] = []
        done: list[tuple[EntryRef, str, str, str]] = []
        for ref, _ in claimed:
            verdict = already.get(f"{ref.stream}/{ref.entry_id}/final")
            if verdict is None:
                fresh.append(ref)
            else:
                done.append((ref, token, verdict, "final"))
        judge.stats.taken_over += len(taken_over)
        if taken_over:
            logger.info(
                "took over %d decisions of a dead instance; %d of them were already published",
                len(taken_over),
                len(done),
            )
        if done:
            with translate_valkey_errors("mark verdicts published", judge.where):
                await judge.join.finish(done)
        if fresh:
            await judge.decide(fresh, token)
        return len(claimed)

    async def _cutoff(self, now_ms: int) -> int:
        """Entries opened before this are decided: past the compare timeout, and (within the
        give-up bound) only once the shadow group has read past where their copies are."""
        timeout_ms = int(self.settings.shadow.compare_timeout_s * 1000)
        cutoff = now_ms - timeout_ms
        give_up = now_ms - GIVE_UP_TIMEOUTS * timeout_ms
        try:
            read_up_to = await self._progress.read_up_to_ms()
        except SidecarError as exc:
            logger.debug(
                "shadow progress unknown (%s); deciding only what is past %d ms",
                exc,
                GIVE_UP_TIMEOUTS * timeout_ms,
            )
            read_up_to = None
        if read_up_to is None:
            return give_up
        return max(min(cutoff, read_up_to), give_up)

    async def run(self, stop: asyncio.Event, interval_s: float = 1.0) -> None:
        """Sweep every ``interval_s`` until ``stop``; a failing round is retried, not fatal."""
        while not stop.is_set():
            try:
                while await self.sweep() == SWEEP_BATCH:
                    pass
            except SidecarError as exc:
                if exc.needs_new_client:
                    raise  # retrying with the same producer cannot help: rebuild
                logger.warning("verdict sweep failed, retrying: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=interval_s)
