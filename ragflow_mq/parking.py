"""From a fetched served record to a task waiting for RAGFlow's slot: its claim decides.

A record whose task is held by another live process, or by this one (a duplicate record, a
redelivery), is parked, not run, until that task is done or its holder is gone. This process's
own hand wins over whatever the store says: a store that restarted or evicted the claim of a
task in hand answers ``new``, and the record is parked all the same. While the store cannot be
reached, nobody can tell whether a task runs elsewhere: the records are parked and the fetch
stops once as many are parked as RAGFlow has slots, with one log line for the outage.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ragflow_mq.claims import Claim, Claims
from ragflow_mq.hand import Hand, KafkaTask, queue_of
from ragflow_mq.recorder import Recorder
from sidecar.errors import SidecarError
from sidecar.transport.kafka import KafkaConsumer
from sidecar.transport.message import QueueMessage

logger = logging.getLogger(__name__)

Served = tuple[QueueMessage, dict[str, Any]]


class Parking:
    """The claiming of fetched records and the records parked, for one executor process."""

    def __init__(
        self,
        hand: Hand,
        claims: Claims,
        consumer: KafkaConsumer,
        recorder: Recorder,
        *,
        on_ack: Callable[[KafkaTask], None],
        cautious: Callable[[], bool],
        on_finished: Callable[[QueueMessage], object],
    ) -> None:
        """``cautious()``: the store may have forgotten claims lately; ``on_finished``: a record
        needs no run (its task ran already, or waits in a pending list)."""
        self._hand = hand
        self._claims = claims
        self._consumer = consumer
        self._recorder = recorder
        self._on_ack = on_ack
        self._cautious = cautious
        self._on_finished = on_finished
        self.parked: dict[str, Served] = {}  # message id -> record whose task is held elsewhere
        # Partitions revoked since the last fetch returned: records of theirs claimed meanwhile
        # are their new owner's, and are given back rather than handed out here.
        self.revoked_lately: set[tuple[str, int]] = set()
        self._store_away = False

    def _store_failed(self, what: str, exc: SidecarError) -> None:
        if not self._store_away:
            self._store_away = True
            logger.warning(
                "the state store cannot be reached (%s): served records are parked until it "
                "answers, at most as many as RAGFlow has slots: %s",
                what,
                exc,
            )

    def _store_answered(self) -> None:
        if self._store_away:
            self._store_away = False
            logger.warning("the state store answers again: parked served records are claimed")

    async def claim(self, records: list[Served]) -> None:
        """Claim the records' tasks and buffer, park or skip each by what the claim found."""
        if not records:
            return
        held = self._hand.held()  # and after: one acked meanwhile is ours, no longer held
        try:
            outcomes = await self._claims.claim(
                [str(task["id"]) for _, task in records], cautious=self._cautious()
            )
        except SidecarError as exc:
            # Nobody can tell whether they run elsewhere: wait, never guess.
            self._store_failed(f"claiming {len(records)} served task(s)", exc)
            for message, task in records:
                self.parked[message.id] = (message, task)
            return
        self._store_answered()
        # No await from here to the buffers: a rebalance that took a partition while its
        # records were claimed has run by now, and those records are the new owner's.
        here = held | self._hand.held()
        given_back: list[str] = []
        for (message, task), outcome in zip(records, outcomes, strict=True):
            task_id = str(task["id"])
            self.parked.pop(message.id, None)
            if (message.topic, message.partition) in self.revoked_lately:
                if outcome in (Claim.NEW, Claim.RETAKEN) and task_id not in here:
                    given_back.append(task_id)
            elif outcome is Claim.DONE:
                self._on_finished(message)
                self._recorder.count("kafka", "duplicate")
                logger.info("served record %s: task %s already ran, skipped", message.id, task_id)
            elif outcome is Claim.HELD or task_id in here:
                self.parked[message.id] = (message, task)
            else:
                if outcome is Claim.RETAKEN:
                    # Counted as retried when RAGFlow takes it (Runtime.handed_out).
                    logger.info("served task %s taken over from a gone executor", task_id)
                retaken = outcome is Claim.RETAKEN
                waiting = KafkaTask(message, task, self._on_ack, retaken=retaken)
                self._hand.wait(queue_of(message), waiting)
                here.add(task_id)  # a second record of it in this batch is parked
        if given_back:
            await self.release(given_back)

    async def recheck(self, room: int) -> None:
        """Claim the parked records the free slots can take (their task may be done, or its
        holder gone, by now); only a done marker can release the rest."""
        parked = list(self.parked.values())
        await self.claim(parked[: max(room, 0)])
        rest = parked[max(room, 0) :]
        if not rest:
            return
        try:
            done = await self._claims.done([str(task["id"]) for _, task in rest])
        except SidecarError as exc:
            self._store_failed(f"checking {len(rest)} parked served task(s)", exc)
            return
        self._store_answered()
        for (message, _), is_done in zip(rest, done, strict=True):
            if is_done and self.parked.pop(message.id, None) is not None:
                self._on_finished(message)
                self._recorder.count("kafka", "duplicate")

    async def release(self, task_ids: list[str]) -> None:
        try:
            await self._claims.release(task_ids)
        except SidecarError as exc:
            # Not lost: another process takes them once this one's liveness lapses.
            logger.warning("could not release %d claim(s): %s", len(task_ids), exc)

    def drop(self, revoked: Callable[[QueueMessage], bool]) -> None:
        """Forget the parked records of revoked partitions: their new owner reads them."""
        for message_id, (message, _) in list(self.parked.items()):
            if revoked(message):
                del self.parked[message_id]
