"""The claims' upkeep in one executor process: what the state store may have forgotten, the
liveness refreshed with every claim in hand asserted again, and the pending lists (tasks
RAGFlow took and gave up on) written and taken back.

A store younger than twice ``SERVE_CLAIM_REFRESH_S`` (it restarted, maybe without persistence)
is read with caution: a task that nobody claims may still run in a holder that has not written
its claims back yet, so its record is parked rather than run.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from ragflow_mq.claims import Claims
from ragflow_mq.hand import Hand, KafkaTask, queue_of
from ragflow_mq.pending import decode_entry, encode_entry
from ragflow_mq.recorder import Recorder
from ragflow_mq.store_health import read_facts, read_identity, say_risks
from sidecar.config import Settings
from sidecar.errors import MessageDecodeError, SidecarError
from sidecar.transport.message import QueueMessage, decode_task

logger = logging.getLogger(__name__)


class Upkeep:
    """Liveness, claims in hand and pending lists of one executor process, on its loop."""

    def __init__(  # noqa: PLR0917
        self,
        settings: Settings,
        store: Any,
        claims: Claims,
        hand: Hand,
        recorder: Recorder,
        on_ack: Callable[[KafkaTask], None],
    ) -> None:
        self._settings = settings
        self._store = store
        self._claims = claims
        self._hand = hand
        self._recorder = recorder
        self._on_ack = on_ack
        self._where = settings.state.display_url
        self._given_up: asyncio.Queue[KafkaTask] = asyncio.Queue()
        self._store_run_id = ""
        self._cautious_until = 0.0  # monotonic: till then the store may have forgotten claims

    async def start(self) -> None:
        """Say what the store can lose, and be alive before any claim (a claim of ours must
        look alive)."""
        facts = await read_facts(self._store, self._where)
        say_risks(facts, self._where)
        self._note_store(facts.run_id, facts.uptime_s)
        await self._claims.keep_alive()

    def cautious(self) -> bool:
        return time.monotonic() < self._cautious_until

    def _note_store(self, run_id: str, uptime_s: float) -> bool:
        """Remember the store's run id; True when it changed (the store restarted)."""
        restarted = bool(self._store_run_id) and run_id != self._store_run_id
        self._store_run_id = run_id
        window_s = 2 * self._settings.serve.claim_refresh_s
        if uptime_s < window_s:
            self._cautious_until = max(self._cautious_until, time.monotonic() + window_s - uptime_s)
        return restarted

    async def refresh(self, room: int) -> None:
        """Liveness, the claims in hand asserted again, then pending tasks for ``room``."""
        if self._note_store(*await read_identity(self._store, self._where)):
            logger.warning(
                "the state store %s restarted: asserting the claims in hand", self._where
            )
        reasserted = await self._claims.keep_alive(sorted(self._hand.held()))
        if reasserted.restored:
            logger.warning(
                "the state store had lost %d claim(s) of tasks this executor holds (a restart "
                "or an eviction): written back",
                reasserted.restored,
            )
        if reasserted.lost:
            logger.error(
                "served task(s) %s held here were claimed by another executor after the state "
                "store lost their claims: they may run twice",
                ", ".join(reasserted.lost),
            )
        await self.adopt(room)

    async def adopt(self, room: int) -> None:
        """Pending tasks this process may run now: its consumer name's own (at its start, as
        Redis replays a consumer's pending entries), then those of gone holders."""
        if room <= 0:
            return
        held = self._hand.held()
        for task_id, entry in await self._claims.adopt(room):
            if task_id in held:
                continue  # this process gave it up: only its next start runs it again
            try:
                message = decode_entry(entry)
                task = decode_task(message.value)
            except (ValueError, KeyError, MessageDecodeError) as exc:
                logger.error("pending served task %s cannot be read, left as is: %s", task_id, exc)
                continue
            logger.info("served task %s taken back from its consumer's pending list", task_id)
            waiting = KafkaTask(message, task, self._on_ack, retaken=True, replayed=True)
            self._hand.wait(queue_of(message), waiting)

    def given_up(self, task: KafkaTask) -> bool:
        """RAGFlow let ``task`` go without an ack (its thread): its slot is free now. True when
        it is to be written to this consumer name's pending list (``put_given_up``)."""
        if not self._hand.give_up(task):
            return False
        self._recorder.count("kafka", "abandoned")
        logger.warning(
            "served task %s was handed out and never acked: kept pending for %s, which runs it "
            "again when it restarts",
            task.task_id,
            self._claims.consumer_name,
        )
        return True

    def put_given_up(self, task: KafkaTask) -> None:
        """On the loop: queue ``task`` for ``run_given_up``."""
        self._given_up.put_nowait(task)

    async def run_given_up(self, commit_past: Callable[[QueueMessage], object]) -> None:
        """Each given-up task written to its pending list, then its record committed past;
        until cancelled. Until written, its record stays uncommitted: nothing is lost if the
        process ends meanwhile."""
        while True:
            task = await self._given_up.get()
            while True:
                try:
                    await self._claims.pend(task.task_id, encode_entry(task.message))
                    break
                except SidecarError as exc:
                    logger.warning(
                        "could not keep task %s pending (again in 1 s): %s", task.task_id, exc
                    )
                    await asyncio.sleep(1)
            if not task.replayed:
                commit_past(task.message)
