"""The served backlog RAGFlow's "tasks ahead in the queue" reads through ``queue_info``.

RAGFlow's ``DocumentService`` takes the Redis group's ``lag`` as the number of tasks ahead
of a document. A served document's tasks are in Kafka, not in that lag: here the executor
group's records not yet committed (Kafka's end offsets less its commits) are added to it,
per queue by topic (the priority parse topic for the priority queues, the other task
topics for the rest). Read in the background every few seconds, so ``queue_info`` never
waits on Kafka. It counts a little more than Redis's lag would: records in RAGFlow's hands
until they are acked, and mirror copies the executors have not yet read past.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from sidecar.config import Settings
from sidecar.config.routing import RouteTable
from sidecar.errors import SidecarError
from sidecar.transport.admin import group_offsets, topic_partitions
from sidecar.transport.kafka_errors import translate_kafka_errors

logger = logging.getLogger(__name__)


class ServedBacklog:
    """Owns an admin client and a group-less consumer (for end offsets), made on first use."""

    def __init__(self, settings: Settings, routes: RouteTable) -> None:
        self._settings = settings
        self._routes = routes
        self._where = ",".join(settings.kafka.bootstrap_servers)
        self._admin: AIOKafkaAdminClient | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self.by_queue: Mapping[str, int] = {}
        self._failing = False

    async def refresh(self) -> None:
        """Read the backlog again; on failure the last figures stay (logged once)."""
        try:
            self.by_queue = await self._read()
        except SidecarError as exc:
            if not self._failing:
                logger.warning("ragflow_mq: served backlog kept at its last value: %s", exc)
            self._failing = True
            await self.close()  # made afresh next time
            return
        self._failing = False

    async def _read(self) -> dict[str, int]:
        kafka = self._settings.kafka
        if self._admin is None or self._consumer is None:
            self._admin = AIOKafkaAdminClient(**kafka.client_kwargs())
            self._consumer = AIOKafkaConsumer(**kafka.client_kwargs())
            with translate_kafka_errors("connect", self._where):
                await self._admin.start()
                await self._consumer.start()
        existing = await topic_partitions(self._admin, self._where)
        tps = [
            TopicPartition(topic, partition)
            for topic in self._routes.ordered_topics()
            for partition in existing.get(topic, [])
        ]
        if not tps:
            return {}
        with translate_kafka_errors("read offsets", self._where):
            begins = await self._consumer.beginning_offsets(tps)
            ends = await self._consumer.end_offsets(tps)
        committed = await group_offsets(self._admin, kafka.consumer_group, tps, self._where)
        priority_topic = self._routes.priority_parse_topic
        high = low = 0
        for tp in tps:
            done = committed.get(tp)
            # No commit yet: the executors start that partition at its beginning.
            start = done.offset if done is not None and done.offset >= 0 else int(begins[tp])
            behind = max(int(ends[tp]) - start, 0)
            if tp.topic == priority_topic:
                high += behind
            else:
                low += behind
        priority = set(self._settings.mirror.priority_streams)
        return {q: high if q in priority else low for q in self._settings.mirror.streams}

    async def close(self) -> None:
        admin, self._admin = self._admin, None
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()
        if admin is not None:
            await admin.close()
