"""A served-share world for one test: its own streams, topics, Kafka group and Valkey keys,
and the environment that a RAGFlow stand-in process and the sidecar's commands share."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import valkey.asyncio as avalkey
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from sidecar.config import Settings
from sidecar.config.routing import DEFAULT_ROUTES, PRIORITY_PARSE
from sidecar.dev.local_stack import LocalStack
from sidecar.transport.topics import MIN_INSYNC_REPLICAS
from tests.faults.support import SidecarProcess, sidecar_env
from tests.ragflow_support import StandinProcess, executions, standin_env, wait_until

__all__ = ["ServeWorld", "by_path", "make_world"]


@dataclass
class ServeWorld:
    """Names of one test's world and the environment built from them."""

    stack: LocalStack
    unique: str
    tmp: Path
    env: dict[str, str] = field(default_factory=dict)
    # A broker of the test's own (one it pauses or kills), else the session's.
    kafka: str | None = None

    @property
    def bootstrap(self) -> str:
        return self.kafka or self.stack.kafka.bootstrap_servers

    @property
    def streams(self) -> tuple[str, str]:
        return f"{self.unique}.te.1.common", f"{self.unique}.te.0.common"

    @property
    def results(self) -> str:
        return f"{self.unique}:results"

    @property
    def group(self) -> str:
        return f"{self.unique}-executors"

    def settings(self, **overrides: str) -> Settings:
        """The sidecar's settings in this world (as the compose .env would share them)."""
        names = (
            "REDIS_URL",
            "KAFKA_BOOTSTRAP_SERVERS",
            "MIRROR_STREAMS",
            "MIRROR_PRIORITY_STREAMS",
            "MIRROR_ROUTES",
            "KAFKA_CONSUMER_GROUP",
            "SERVE_KEY_PREFIX",
            "SERVE_CLAIM_REFRESH_S",
            "KAFKA_TRAFFIC_PERCENT",
            "KAFKA_SERVE_PERCENT",
            "MQ_BACKEND",
        )
        values = {name: self.env[name] for name in names if name in self.env}
        return Settings.from_env({**values, **overrides})

    def child_env(self, install: bool = True, **overrides: str) -> dict[str, str]:
        return {**standin_env(self.stack, prefix=self.unique, results_key=self.results,
                              install=install, extra=self.env), **overrides}  # fmt: skip

    def executor(self, name: str, install: bool = True, **overrides: str) -> StandinProcess:
        return StandinProcess.executor(self.child_env(install, **overrides), self.tmp, name)

    def supervised(self, name: str, install: bool = True, **overrides: str) -> StandinProcess:
        """An executor under the entrypoint's restart loop (RAGFlow's ``task_exe()``)."""
        env = self.child_env(install, **overrides)
        return StandinProcess.supervised_executor(env, self.tmp, name)

    def api(
        self,
        out: str,
        *,
        docs: int,
        tasks_per_doc: int,
        rate: float = 0.0,
        install: bool = True,
        **overrides: str,
    ) -> tuple[StandinProcess, Path]:
        path = self.tmp / out
        process = StandinProcess.api(
            self.child_env(install, **overrides), self.tmp, path, docs=docs,
            tasks_per_doc=tasks_per_doc, rate=rate,
        )  # fmt: skip
        return process, path

    def sidecar(self, log: Path) -> SidecarProcess:
        """``ragflow-sidecar run`` on this world's streams and topics: it judges the Redis
        path's tasks (a served task never reaches Redis) with the no-op handler."""
        env = sidecar_env(
            self.stack.valkey.url,
            self.bootstrap,
            ",".join(self.streams),
            self.unique,
            **{k: v for k, v in self.env.items() if k != "REDIS_URL"},
            SHADOW_HANDLER="noop",
            SHADOW_START="earliest",
        )
        return SidecarProcess(["run"], env, log)

    async def executed(self, client: avalkey.Valkey) -> list[dict[str, Any]]:
        return await executions(client, self.results)

    async def wait_executed(
        self, client: avalkey.Valkey, task_ids: set[str], timeout_s: float = 240.0
    ) -> list[dict[str, Any]]:
        """Wait until every task of ``task_ids`` was executed at least once."""
        records: list[dict[str, Any]] = []

        async def done() -> bool:
            nonlocal records
            records = await self.executed(client)
            return task_ids <= {str(r["task_id"]) for r in records}

        await wait_until(done, timeout_s, interval_s=0.25, what=f"{len(task_ids)} executions")
        return records

    async def wait_members(self, count: int, timeout_s: float = 60.0) -> None:
        """Wait until the executors' Kafka group is stable with ``count`` members."""
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:

            async def stable() -> bool:
                try:
                    responses = await admin.describe_consumer_groups([self.group])
                except Exception:  # no coordinator yet for a new group
                    return False
                for response in responses:
                    for group in response.to_object()["groups"]:
                        if group["state"] == "Stable" and len(group["members"]) == count:
                            return True
                return False

            await wait_until(stable, timeout_s, interval_s=0.2, what=f"{count} group members")
        finally:
            await admin.close()

    async def member_ids(self) -> set[str]:
        """The member ids of the executors' Kafka group now (a member that left and came
        back has a new one)."""
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            responses = await admin.describe_consumer_groups([self.group])
        finally:
            await admin.close()
        return {
            str(member["member_id"])
            for response in responses
            for group in response.to_object()["groups"]
            for member in group["members"]
        }

    async def kafka_settled(self) -> bool:
        """Whether the executor group has committed every record of the world's topics (no
        served record is left to hand out, or to hand out again)."""
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap)
        await admin.start()
        await consumer.start()
        try:
            committed = await admin.list_consumer_group_offsets(self.group)
            topics = (f"{self.unique}.tasks", f"{self.unique}.tasks.priority")
            tps = [
                TopicPartition(t, p) for t, n in zip(topics, (4, 2), strict=True) for p in range(n)
            ]
            ends = await consumer.end_offsets(tps)
        finally:
            await consumer.stop()
            await admin.close()
        return all(
            ends[tp] == 0 or (tp in committed and committed[tp].offset >= ends[tp]) for tp in tps
        )


async def make_world(
    stack: LocalStack,
    unique: str,
    tmp: Path,
    kafka: str | None = None,
    replication: int = 1,
    **env: str,
) -> ServeWorld:
    """Create the world's topics (priority 2 partitions, the rest 4) and its environment;
    ``kafka``: the bootstrap servers of a broker (or cluster) of the test's own, ``replication``
    its topics' replication factor (3: with ``min.insync.replicas`` 2, as init-topics makes)."""
    world = ServeWorld(stack, unique, tmp, kafka=kafka)
    tasks_topic, priority_topic = f"{unique}.tasks", f"{unique}.tasks.priority"
    routes = {pattern: tasks_topic for pattern in DEFAULT_ROUTES}
    routes[PRIORITY_PARSE] = priority_topic
    # RAGFlow's every collect() asks the (usually empty) priority stream with BLOCK 5, and
    # Valkey ends a blocked read on its timer tick: at the default hz 10 that is up to 100 ms
    # per task, which would make these tests time Valkey's clock rather than the queue.
    client = avalkey.Valkey.from_url(stack.valkey.url)
    try:
        await client.config_set("hz", 100)
    finally:
        await client.aclose()
    admin = AIOKafkaAdminClient(bootstrap_servers=world.bootstrap)
    await admin.start()
    try:
        configs = {"min.insync.replicas": str(MIN_INSYNC_REPLICAS)} if replication >= 3 else {}
        await admin.create_topics(
            [
                NewTopic(tasks_topic, 4, replication, topic_configs=configs),
                NewTopic(priority_topic, 2, replication, topic_configs=configs),
            ]
        )
    finally:
        await admin.close()
    high, low = world.streams
    world.env = {
        "MQ_BACKEND": "split",
        "KAFKA_TRAFFIC_PERCENT": "100",
        "KAFKA_SERVE_PERCENT": "50",
        "MIRROR_STREAMS": f"{high},{low}",
        "MIRROR_PRIORITY_STREAMS": high,
        "MIRROR_ROUTES": json.dumps(routes),
        "KAFKA_CONSUMER_GROUP": world.group,
        "SERVE_KEY_PREFIX": unique,
        "SERVE_SESSION_TIMEOUT_MS": "6000",
        # A store younger than twice this is read with caution (its claims may have been
        # lost): the session's Valkey is seconds old when the first tests run.
        "SERVE_CLAIM_REFRESH_S": "1",
        "REDIS_URL": stack.valkey.url,
        "KAFKA_BOOTSTRAP_SERVERS": world.bootstrap,
        **env,
    }
    return world


def by_path(records: list[Mapping[str, Any]]) -> Counter[str]:
    """Executions per path: a Kafka record's id is topic:partition:offset, a Redis one ms-seq."""
    return Counter("kafka" if ":" in str(r["msg_id"]) else "redis" for r in records)
