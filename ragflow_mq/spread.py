"""Where a served task's record goes: a document's tasks dealt across the executors.

On Redis every idle executor slot takes the next entry, so a 30-task document is parsed by
every executor at once. A Kafka partition is read by one executor: one partition per document
would hand one executor all 30 while the others idle. So the share decision stays per document
(``ragflow_mq.producer``), but its tasks are dealt in turn to the members of the executors'
group, each member's partitions in turn, by the group's assignment as last described. Dealing
by member, not by partition: 8 partitions among 3 executors give one of them 3, and a
document dealt by partition would give that executor 3 tasks in 8, a third round of 6 s tasks
where Redis needs two. Until the assignment is known (or when no member reads the topic) the
tasks are dealt across the partitions in turn.

Nothing relies on one partition per document: each task is claimed by its id, a record is
handed out in its partition's order, and a document's tasks never ran in order on Redis
either (RAGFlow's executors take them concurrently). The record's key is the task id.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

from sidecar.config import Settings
from sidecar.errors import SidecarError
from sidecar.transport.kafka_errors import translate_kafka_errors
from sidecar.transport.partitioner import murmur2

logger = logging.getLogger(__name__)

_DOCUMENTS_LIMIT = 100_000  # documents whose turn is remembered at most; the oldest go first
# The first describe waits this long at most: it is inside the first queue_product's bound.
_FIRST_READ_S = 0.5
# The executors' assignment changes only at a rebalance; a stale one deals less evenly.
_REFRESH_S = 5.0

# topic -> the partitions of each member that reads it (members in id order, partitions sorted)
Layout = Mapping[str, tuple[tuple[int, ...], ...]]


def layout_of(groups: Sequence[Mapping[str, Any]]) -> dict[str, tuple[tuple[int, ...], ...]]:
    """The members' partitions per topic, from ``describe_consumer_groups``'s groups."""
    by_topic: dict[str, list[tuple[str, tuple[int, ...]]]] = {}
    for group in groups:
        for member in group.get("members") or ():
            raw = member.get("member_assignment")
            if not raw:
                continue  # a member joining, not yet given its partitions
            assignment = ConsumerProtocolMemberAssignment.decode(raw)
            for topic, partitions in assignment.assignment:
                if partitions:
                    by_topic.setdefault(topic, []).append(
                        (str(member["member_id"]), tuple(sorted(partitions)))
                    )
    return {topic: tuple(p for _, p in sorted(found)) for topic, found in by_topic.items()}


def dealt_partition(
    document: str, turn: int, topic: str, partitions: Sequence[int], layout: Layout
) -> int:
    """The partition of a document's ``turn``-th task: member after member, each member's
    partitions in turn, from where the document's hash says (documents start on different
    executors); across ``partitions`` in turn where no member of the topic is known."""
    start = murmur2(document.encode("utf-8", "replace")) & 0x7FFFFFFF
    existing = set(partitions)
    members = [
        kept for parts in layout.get(topic, ()) if (kept := [p for p in parts if p in existing])
    ]
    if not members:
        return partitions[(start + turn) % len(partitions)]
    member = members[(start + turn) % len(members)]
    return member[(start // len(members) + turn // len(members)) % len(member)]


class Spread:
    """The assignment as last described, and each document's next turn (thread-safe)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._where = ",".join(settings.kafka.bootstrap_servers)
        self.layout: Layout = {}
        self._turns: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()
        self._admin: AIOKafkaAdminClient | None = None
        self._failing = False
        self._tried = False

    async def first_read(self) -> None:
        """Describe the group before the first task is dealt, within ``_FIRST_READ_S`` (once:
        the refresher takes over after; until it succeeds the tasks are dealt by partition)."""
        if not self._tried:
            self._tried = True
            try:
                await asyncio.wait_for(self.refresh(), _FIRST_READ_S)
            except TimeoutError:
                await self.close()

    def partition(self, document: str, topic: str, partitions: Sequence[int]) -> int:
        with self._lock:
            turn = self._turns.pop(document, 0)
            self._turns[document] = turn + 1
            if len(self._turns) > _DOCUMENTS_LIMIT:
                self._turns.popitem(last=False)
        return dealt_partition(document, turn, topic, partitions, self.layout)

    async def refresh(self) -> None:
        """Describe the executors' group again; on failure the last layout stays (logged
        once): a stale layout only deals less evenly, never wrongly."""
        group = self._settings.kafka.consumer_group
        try:
            if self._admin is None:
                admin = AIOKafkaAdminClient(**self._settings.kafka.client_kwargs())
                try:
                    with translate_kafka_errors("connect", self._where):
                        await admin.start()
                except BaseException:  # failed, or cut short by first_read's bound
                    await admin.close()
                    raise
                self._admin = admin
            with translate_kafka_errors(f"describe the group {group}", self._where):
                responses = await self._admin.describe_consumer_groups([group])
        except SidecarError as exc:
            if not self._failing:
                logger.warning("ragflow_mq: executors' assignment kept as last read: %s", exc)
            self._failing = True
            await self.close()  # made afresh next time
            return
        self._failing = False
        self.layout = layout_of(
            [g for r in responses for g in r.to_object()["groups"] if not g["error_code"]]
        )

    async def keep_refreshing(self) -> None:
        """``refresh`` every ``_REFRESH_S`` until cancelled (the runtime's loop closing)."""
        try:
            while True:
                await self.refresh()
                await asyncio.sleep(_REFRESH_S)
        finally:
            await self.close()

    async def close(self) -> None:
        admin, self._admin = self._admin, None
        if admin is not None:
            await admin.close()
