"""The executor's Kafka side: served records fetched when a slot can take them, claimed, and
handed out by RAGFlow's queue name.

One group member per executor process reads every task topic, the priority parse topic first.
It fetches only what RAGFlow's free slots can take (``SERVE_PREFETCH`` less the tasks in hand
on either path) and keeps polling its paused partitions while they are busy, so an hour-long
task never makes the group think it is gone. Each served task is claimed by task id in the
state store before it is handed out (``ragflow_mq.claims``): a record of a task another live
executor holds is parked until that task is done or its holder is gone, so no rebalance,
duplicate record or producer retry runs a task twice while its executor lives. Not a static
member: aiokafka sends no LeaveGroup for one, so a clean stop would leave its partitions
unread for the session timeout, and the claims already make a restart's rebalance harmless.
``take(queue)`` never waits; ``ack()`` marks the task done, and finished offsets are committed
every ``SERVE_COMMIT_INTERVAL_MS``. A task RAGFlow gives up on (never acked) frees its slot and
is kept pending for this consumer name (``ragflow_mq.upkeep``), so its record no longer pins
the partition's commit. The mirror's copies (no ``x-served``) are skipped; only a
record RAGFlow cannot take (no JSON object with an id) goes to the DLQ.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from ragflow_mq.claims import Claims
from ragflow_mq.dead_letters import DeadLetters
from ragflow_mq.hand import Hand, KafkaTask, queue_of
from ragflow_mq.parking import Parking, Served
from ragflow_mq.recorder import Recorder
from ragflow_mq.upkeep import Upkeep
from sidecar.config import Settings
from sidecar.config.routing import RouteTable
from sidecar.errors import MessageDecodeError, SidecarError
from sidecar.transport.kafka import KafkaConsumer
from sidecar.transport.message import QueueMessage, decode_task
from sidecar.wire.contract import SERVED_HEADER, Keys

logger = logging.getLogger(__name__)

_FETCH_TIMEOUT_MS = 500
# While every slot is busy, paused partitions are polled at least this often (it keeps the
# member in the group); a slot that frees wakes the fetch at once.
_BUSY_POLL_S = 1.0
_RECHECK_S = 1.0  # parked records: is their task done, or its holder gone?


class ServeConsumer:
    """Owns the Kafka consumer, the claims and the buffers; ``take``/``finished`` are
    thread-safe (RAGFlow calls them from its own thread)."""

    def __init__(  # noqa: PLR0917
        self,
        settings: Settings,
        routes: RouteTable,
        keys: Keys,
        store: Any,
        recorder: Recorder,
        consumer_name: str,
        busy: Callable[[], int] = lambda: 0,
        on_finished: Callable[[KafkaTask], None] = lambda task: None,
    ) -> None:
        """``store``: the state store's asyncio client (the caller's, used on this loop);
        ``busy()``: RAGFlow's slots filled by Redis tasks (they leave less room to fetch)."""
        self._settings = settings
        self._routes = routes
        self._keys = keys
        self._store = store
        self._recorder = recorder
        self.consumer_name = consumer_name
        self._busy = busy
        self._on_finished = on_finished
        self._hand = Hand(settings.mirror.streams)
        self._parking: Parking | None = None
        self._done: asyncio.Queue[KafkaTask] = asyncio.Queue()
        self._marking: list[KafkaTask] = []  # acked, its done marker being written
        self._loop: asyncio.AbstractEventLoop | None = None
        self._consumer: KafkaConsumer | None = None
        self._claims: Claims | None = None
        self._dlq: DeadLetters | None = None
        self._stopping = asyncio.Event()
        self._slot_freed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._warned: set[str] = set()
        self._upkeep: Upkeep | None = None

    async def start(self) -> None:
        serve = self._settings.serve
        self._loop = asyncio.get_running_loop()
        self._done = asyncio.Queue()
        self._stopping = asyncio.Event()
        self._slot_freed = asyncio.Event()
        self._claims = Claims(
            self._store,
            self._keys,
            consumer_name=self.consumer_name,
            incarnation=uuid.uuid4().hex[:12],
            lease_s=serve.lease_s,
            done_ttl_s=serve.done_ttl_s,
            where=self._settings.state.display_url,
        )
        self._upkeep = Upkeep(
            self._settings, self._store, self._claims, self._hand, self._recorder, self.finished
        )
        await self._upkeep.start()
        self._consumer = KafkaConsumer(
            self._settings.kafka,
            self._routes.ordered_topics(),
            self._settings.kafka.consumer_group,
            commit_interval_ms=max(serve.commit_interval_ms, 1),
            on_revoke=self._revoked,
            client_id=f"{self._settings.kafka.client_id}-{self.consumer_name}",
            session_timeout_ms=serve.session_timeout_ms,
            heartbeat_interval_ms=min(3000, serve.session_timeout_ms // 3),
            max_poll_interval_ms=serve.max_poll_interval_ms,
        )
        await self._consumer.start()
        self._parking = Parking(
            self._hand,
            self._claims,
            self._consumer,
            self._recorder,
            on_ack=self.finished,
            cautious=self._upkeep.cautious,
            on_finished=self._consumer.finish,
        )
        self._dlq = DeadLetters(self._settings.kafka)
        await self._upkeep.adopt(self.room())  # this consumer name's pending tasks first
        self._tasks = [
            asyncio.create_task(self._keep_fetching(), name="ragflow-mq-fetch"),
            asyncio.create_task(self._run_commits(), name="ragflow-mq-commit"),
            asyncio.create_task(self._run_finisher(), name="ragflow-mq-finish"),
            asyncio.create_task(self._run_alive(), name="ragflow-mq-alive"),
            asyncio.create_task(
                self._upkeep.run_given_up(self._consumer.finish), name="ragflow-mq-pending"
            ),
        ]

    # -- fetching ----------------------------------------------------------------------------

    def room(self) -> int:
        """Records this executor could start now: free slots less what waits in the buffers,
        and never more parked records than RAGFlow has slots."""
        free = self._free_slots()
        if self._parking is None:
            return free
        return min(free, self._settings.serve.prefetch - len(self._parking.parked))

    def _free_slots(self) -> int:
        return self._settings.serve.prefetch - self._hand.filled() - self._busy()

    async def _keep_fetching(self) -> None:
        """``run_fetch`` until ``stop()``, through Kafka's passing failures: a broker away
        leaves the executor on Redis work meanwhile, not without a consumer for good."""
        while not self._stopping.is_set():
            try:
                await self.run_fetch()
            except SidecarError as exc:
                logger.warning("fetching served tasks failed (again in 1 s): %s", exc)
                await asyncio.sleep(1)

    async def run_fetch(self) -> None:
        """Fetch what the free slots can take, and re-check parked records, until ``stop()``."""
        next_recheck = 0.0
        while not self._stopping.is_set():
            consumer = self._consumer
            if consumer is None:
                return
            parking = self._parking
            now = time.monotonic()
            if parking is not None and parking.parked and now >= next_recheck:
                next_recheck = now + _RECHECK_S
                await parking.recheck(self._free_slots())
            self._slot_freed.clear()
            room = self.room()
            if room <= 0:
                # Paused, not idle: polling keeps the member in the group through hour-long
                # tasks, and the records wait for this member's next free slot in Kafka, not
                # in a buffer where nobody else could see them.
                consumer.pause_all_but(())
                batch = await consumer.poll_batch(1, 0)
                if not batch:
                    wait_s = min(_BUSY_POLL_S, self._settings.serve.max_poll_interval_ms / 4000)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._slot_freed.wait(), wait_s)
                    continue
            else:
                consumer.resume_all()
                batch = await consumer.poll_batch(room, _FETCH_TIMEOUT_MS)
            # Cleared when the fetch returns, not when it begins: a fetch that waited through a
            # rebalance returns records of the assignment that followed (aiokafka drops what
            # was fetched before), so a partition revoked meanwhile and given back is ours.
            if parking is not None:
                parking.revoked_lately.clear()
            if batch:
                await self._accept(batch)

    async def _run_commits(self) -> None:
        interval_s = max(self._settings.serve.commit_interval_ms, 1) / 1000
        while not self._stopping.is_set():
            await asyncio.sleep(interval_s)
            consumer = self._consumer
            if self._stopping.is_set() or consumer is None:
                return  # stop() makes the last commit
            try:
                await consumer.commit_due()
            except SidecarError as exc:
                logger.warning("could not commit finished tasks: %s", exc)

    async def _run_alive(self) -> None:
        """Liveness, the claims in hand asserted again, and pending tasks of gone holders
        taken for free slots, every ``SERVE_CLAIM_REFRESH_S``."""
        failing = False  # one warning an outage, not one a refresh
        while not self._stopping.is_set():
            await asyncio.sleep(self._settings.serve.claim_refresh_s)
            assert self._upkeep is not None
            try:
                await self._upkeep.refresh(self.room())
            except SidecarError as exc:
                if not failing:
                    logger.warning("could not refresh this executor's liveness: %s", exc)
                failing = True
            else:
                failing = False

    async def _accept(self, batch: list[QueueMessage]) -> None:
        assert self._consumer is not None and self._dlq is not None
        served: list[Served] = []
        for message in batch:
            if message.header(SERVED_HEADER) != b"1":
                self._consumer.finish(message)  # the mirror's copy: RAGFlow ran it from Redis
                continue
            try:
                task = decode_task(message.value)
                if not isinstance(task.get("id"), str):
                    raise MessageDecodeError("no_task_id", "the task has no string 'id'")
            except MessageDecodeError as exc:
                queue = queue_of(message)
                await self._dlq.send(message, queue, exc.reason, exc.detail, self._stopping)
                self._consumer.finish(message)
                self._recorder.count("kafka", "dead_lettered")
                logger.warning("served record %s dead-lettered: %s", message.id, exc)
                continue
            served.append((message, task))
        assert self._parking is not None
        await self._parking.claim(served)

    # -- RAGFlow's calls (its thread) ---------------------------------------------------------

    def wake(self) -> None:
        """A slot may have freed (any thread): fetch for it now rather than at the next poll."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._slot_freed.set)

    def take(self, queue: str) -> KafkaTask | None:
        """The next served task of ``queue``, or ``None`` at once when none is waiting."""
        if not self._hand.knows(queue):
            if queue not in self._warned:
                self._warned.add(queue)
                logger.warning("queue %s is not in MIRROR_STREAMS; no Kafka tasks for it", queue)
            return None
        task = self._hand.take(queue)
        if task is None:
            return None
        self._recorder.count("kafka", "started")
        self._recorder.observe("kafka", "queue_wait", task.queue_wait_ms)
        return task

    def finished(self, task: KafkaTask) -> None:
        """RAGFlow acked ``task`` (any thread)."""
        self._hand.acked(task)  # held until marked done: a duplicate read meanwhile is parked
        self.wake()
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._done.put_nowait, task)
        self._recorder.count("kafka", "finished")
        self._recorder.observe("kafka", "processing", (time.time() - task.handed_out_s) * 1000)
        self._on_finished(task)

    def given_up(self, task: KafkaTask) -> None:
        """RAGFlow let ``task`` go without an ack (any thread): its slot is free now, and the
        task stays pending for this consumer name, as a Redis entry would."""
        upkeep, loop = self._upkeep, self._loop
        if upkeep is None or not upkeep.given_up(task):
            return
        self.wake()
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(upkeep.put_given_up, task)

    def in_hand(self) -> int:
        return self._hand.in_hand()

    def parked(self) -> int:
        """Records parked: their task is held elsewhere, or the store cannot say."""
        return len(self._parking.parked) if self._parking is not None else 0

    async def _run_finisher(self) -> None:
        while True:
            self._marking = [await self._done.get()]
            while not self._done.empty():
                self._marking.append(self._done.get_nowait())
            await self._finish(self._marking, retry=True)
            self._marking = []

    async def _finish(self, batch: list[KafkaTask], *, retry: bool) -> None:
        """Done markers first, then the offsets: a record committed past is one that no
        redelivery can run again."""
        assert self._claims is not None
        while True:
            try:
                await self._claims.finish([task.task_id for task in batch])
                break
            except SidecarError as exc:
                if not retry:
                    logger.warning("%d finished task(s) not marked done: %s", len(batch), exc)
                    return
                logger.warning("could not mark %d task(s) done (again in 1 s): %s", len(batch), exc)
                await asyncio.sleep(1)
        consumer = self._consumer
        self._hand.marked_done(batch)
        if consumer is not None:
            for task in batch:
                if not task.replayed:  # False after a revoke: the new owner skips it
                    consumer.finish(task.message)

    # -- rebalances and stopping ---------------------------------------------------------------

    async def _revoked(self, partitions: set[tuple[str, int]]) -> None:
        """Records of the revoked partitions not handed out go back to their new owner, their
        claims released. Tasks in RAGFlow's hands stay claimed and run to their ack here; the
        new owner parks their records until they are done. Nothing waits for them."""

        def revoked(message: QueueMessage) -> bool:
            return (message.topic, message.partition) in partitions

        # A task taken from a pending list has no record of a partition: it stays.
        dropped = self._hand.drop_waiting(lambda t: revoked(t.message) and not t.replayed)
        parking = self._parking
        if parking is not None:
            parking.revoked_lately |= partitions
            parking.drop(revoked)
            if dropped:
                await parking.release(dropped)

    async def stop(self) -> None:
        """Stop fetching; release what was fetched ahead, mark what was acked done, commit,
        and let this process's claims lapse at once (a task still in RAGFlow's hands at exit
        will not be acked by a process that is ending: another executor runs it)."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        unused = self._hand.drop_waiting()
        if self._claims is not None and self._parking is not None:
            await self._parking.release(unused)
            # Also a batch whose marking the cancel cut short (marking again is harmless): a
            # task acked as the executor stops is done before the last commit, not redelivered.
            acked, self._marking = self._marking, []
            while not self._done.empty():
                acked.append(self._done.get_nowait())
            if acked:
                await self._finish(acked, retry=False)
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()
        if self._claims is not None:
            try:
                await self._claims.leave()
            except SidecarError as exc:
                logger.warning("claims of this executor lapse with its lease: %s", exc)
        dlq, self._dlq = self._dlq, None
        if dlq is not None:
            await dlq.stop()
