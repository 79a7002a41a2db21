"""How far the shadow group has read: the sweeper's evidence before it calls a copy missing.

An entry whose redis run is in the join but whose kafka run is not, past the compare
timeout, is ``missing_in_kafka`` only if the shadow consumer has read past the place its Kafka
copy would be. The redis run is recorded after Kafka acknowledged the copy, so the copy lies
below the end offsets sampled at any moment after that. Each sweep samples the task topics' end
offsets; once the group's committed offsets reach a sample taken at time ``t``, every entry
recorded before ``t`` has had its copy read. A shadow that is slow, restarting or rebalancing
thus delays verdicts instead of producing false ``missing_in_kafka`` ones.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from sidecar.lifecycle import Lifecycle
from sidecar.transport.admin import group_offsets, topic_partitions
from sidecar.transport.kafka import kafka_where, stop_consumer, translate_kafka_errors
from sidecar.transport.options import KafkaSettings

logger = logging.getLogger(__name__)

MAX_SAMPLES = 4096
# In a split deployment the redis run's time comes from the mirror's host and the samples'
# from the judge's: a sample counts only for entries recorded this long before it.
CLOCK_SKEW_MS = 5_000
PARTITIONS_REFRESH_S = 30.0


class ShadowProgress(Lifecycle):
    """Samples end offsets and the shadow group's commits; answers up to when all is read."""

    def __init__(self, settings: KafkaSettings, group: str, topics: Iterable[str]) -> None:
        super().__init__()
        self._settings = settings
        self._group = group
        self._topics = sorted(topics)
        self._where = kafka_where(settings)
        self._samples: deque[tuple[int, dict[TopicPartition, int]]] = deque(maxlen=MAX_SAMPLES)
        self._admin: AIOKafkaAdminClient | None = None
        self._partitions: list[TopicPartition] = []
        self._partitions_at = float("-inf")
        self._consumer: AIOKafkaConsumer | None = None

    async def _start(self) -> None:
        self._admin = AIOKafkaAdminClient(**self._settings.client_kwargs())
        self._consumer = AIOKafkaConsumer(
            **self._settings.client_kwargs(), group_id=None, enable_auto_commit=False
        )
        try:
            with translate_kafka_errors("connect", self._where):
                await self._admin.start()
                await self._consumer.start()
        except BaseException:
            await self._stop()
            raise

    async def _stop(self) -> None:
        admin, consumer, self._admin, self._consumer = self._admin, self._consumer, None, None
        try:
            if admin is not None:
                with translate_kafka_errors("close the admin client", self._where):
                    await admin.close()
        finally:
            if consumer is not None:
                with translate_kafka_errors("stop the offsets reader", self._where):
                    await stop_consumer(consumer)

    async def read_up_to_ms(self) -> int | None:
        """The latest time ``t`` such that the group has read everything produced before
        ``t``, or ``None`` while it has not reached any sample yet; raises ``SidecarError``
        when Kafka cannot tell."""
        assert self._admin is not None and self._consumer is not None, "not started"
        now_ms = int(time.time() * 1000)
        if time.monotonic() - self._partitions_at > PARTITIONS_REFRESH_S:
            # Metadata for every topic of the cluster: not on every sweep.
            existing = await topic_partitions(self._admin, self._where)
            self._partitions = [
                TopicPartition(t, p) for t in self._topics for p in existing.get(t, [])
            ]
            self._partitions_at = time.monotonic()
        tps = self._partitions
        if not tps:
            return now_ms
        with translate_kafka_errors("read end offsets", self._where):
            ends: dict[TopicPartition, int] = await self._consumer.end_offsets(tps)
        self._samples.append((now_ms, ends))
        answer = await group_offsets(self._admin, self._group, tps, self._where)
        committed: dict[TopicPartition, int] = {
            tp: int(meta.offset) for tp, meta in answer.items() if meta.offset >= 0
        }
        for sampled_ms, sample in reversed(self._samples):
            if all(committed.get(tp, 0) >= end for tp, end in sample.items() if end > 0):
                return int(sampled_ms) - CLOCK_SKEW_MS
        return None
