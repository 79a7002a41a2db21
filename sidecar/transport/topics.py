"""The Kafka topics of the seed design, created idempotently with aiokafka's admin client."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from sidecar.errors import MessageQueueError
from sidecar.transport.kafka import kafka_where, translate_kafka_errors
from sidecar.transport.options import KafkaSettings

PARSE_TOPIC = "ragflow.task.parse"
PARSE_PRIORITY_TOPIC = "ragflow.task.parse.priority"
DATAFLOW_TOPIC = "ragflow.task.dataflow"
GRAPHRAG_TOPIC = "ragflow.task.graphrag"
MEMORY_TOPIC = "ragflow.task.memory"
DLQ_TOPIC = "ragflow.task.dlq"
VERDICTS_TOPIC = "ragflow.shadow.verdicts"
TASK_TOPICS: tuple[str, ...] = (
    PARSE_PRIORITY_TOPIC,  # first: the shadow serves it before the others
    PARSE_TOPIC,
    DATAFLOW_TOPIC,
    GRAPHRAG_TOPIC,
    MEMORY_TOPIC,
)

# Seed design section 5.2: topic -> partitions.
TOPIC_PLAN: dict[str, int] = {
    PARSE_TOPIC: 8,
    PARSE_PRIORITY_TOPIC: 4,
    DATAFLOW_TOPIC: 4,
    GRAPHRAG_TOPIC: 2,
    MEMORY_TOPIC: 2,
    DLQ_TOPIC: 2,
    # Ours, not the seed's: one verdict per mirrored task, keyed by task id.
    VERDICTS_TOPIC: 4,
}

_UNKNOWN_TOPIC = 3
_TOPIC_EXISTS = 36
# With three replicas or more, a write is acknowledged once two hold it (acks=all): one broker
# may die without losing it, and one may be down without stopping writes.
MIN_INSYNC_REPLICAS = 2


@dataclass
class TopicReport:
    """What ``init_topics`` found and did."""

    created: list[str] = field(default_factory=list)
    existed: list[str] = field(default_factory=list)
    # (topic, partitions it has, partitions the plan wants)
    under_partitioned: list[tuple[str, int, int]] = field(default_factory=list)
    # (topic, fewest replicas of its partitions, the replication factor asked for)
    under_replicated: list[tuple[str, int, int]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.under_partitioned and not self.under_replicated

    def lines(self) -> list[str]:
        out = [f"created {name}" for name in self.created]
        out += [f"exists  {name}" for name in self.existed]
        out += [
            f"PROBLEM {name} has {have} partitions, the plan wants {want}; "
            "add partitions by hand (kafka-topics --alter) after reading what it does to key order"
            for name, have, want in self.under_partitioned
        ]
        out += [
            f"PROBLEM {name} has {have} replica{'s' if have != 1 else ''} per partition, "
            f"{want} were asked for; raise it by hand (kafka-reassign-partitions) and set "
            f"min.insync.replicas={MIN_INSYNC_REPLICAS} (kafka-configs --alter)"
            for name, have, want in self.under_replicated
        ]
        return out


async def init_topics(
    settings: KafkaSettings,
    plan: dict[str, int] | None = None,
    replication_factor: int | None = None,
) -> TopicReport:
    """Create the topics of ``plan`` that are missing; report, never alter, existing ones.

    With a replication factor of 3 or more the topics are made with ``min.insync.replicas``
    2; a factor above the brokers the cluster has now is refused before anything is made.
    """
    plan = TOPIC_PLAN if plan is None else plan
    replication = replication_factor or settings.replication_factor
    where = kafka_where(settings)
    report = TopicReport()
    admin = AIOKafkaAdminClient(**settings.client_kwargs())
    try:
        with translate_kafka_errors("connect the admin client", where):
            await admin.start()
        with translate_kafka_errors("describe the cluster", where):
            brokers = len((await admin.describe_cluster())["brokers"])
        if replication > brokers:
            raise MessageQueueError(
                f"replication factor {replication} is more than the {brokers} live "
                f"broker{'s' if brokers != 1 else ''} of the cluster at {where}: start the "
                "missing brokers, or ask for a replication factor they can hold"
            )
        configs = {}
        if replication >= 3:
            configs["min.insync.replicas"] = str(MIN_INSYNC_REPLICAS)
        missing = await _describe(admin, where, plan, list(plan), report, replication=replication)
        if missing:
            new = [
                NewTopic(name, plan[name], replication, topic_configs=configs) for name in missing
            ]
            with translate_kafka_errors("create topics", where):
                response = await admin.create_topics(new)
            raced = []
            for name, code, message in response.topic_errors:
                if code == 0:
                    report.created.append(name)
                elif code == _TOPIC_EXISTS:
                    # Metadata lagged behind a topic that exists: check it like the others.
                    raced.append(name)
                else:
                    raise MessageQueueError(
                        f"creating {name} ({plan[name]} partitions, replication {replication}) "
                        f"failed: {message or f'error {code}'}"
                    )
            # The broker's metadata can trail the controller for a moment after a create.
            for _ in range(40):
                if not raced:
                    break
                await asyncio.sleep(0.25)
                raced = await _describe(admin, where, plan, raced, report, replication=replication)
            if raced:
                raise MessageQueueError(f"{', '.join(raced)} exist but cannot be described")
    finally:
        await admin.close()
    return report


async def _describe(
    admin: AIOKafkaAdminClient,
    where: str,
    plan: dict[str, int],
    names: list[str],
    report: TopicReport,
    *,
    replication: int,
) -> list[str]:
    """Record which of ``names`` exist (and whether they have fewer partitions or replicas than
    asked); return the missing ones."""
    with translate_kafka_errors("describe topics", where):
        described = await admin.describe_topics(names)
    missing = []
    for topic in described:
        name = topic["topic"]
        if topic["error_code"] == _UNKNOWN_TOPIC:
            missing.append(name)
            continue
        if topic["error_code"] != 0:
            raise MessageQueueError(f"describing {name} failed (error {topic['error_code']})")
        have = len(topic["partitions"])
        report.existed.append(name)
        if have < plan[name]:
            report.under_partitioned.append((name, have, plan[name]))
        replicas = min((len(p["replicas"]) for p in topic["partitions"]), default=replication)
        if replicas < replication:
            report.under_replicated.append((name, replicas, replication))
    return missing


async def missing_topics(settings: KafkaSettings, names: list[str]) -> list[str]:
    """Which of ``names`` do not exist (the broker never auto-creates them)."""
    where = kafka_where(settings)
    admin = AIOKafkaAdminClient(**settings.client_kwargs())
    try:
        with translate_kafka_errors("connect the admin client", where):
            await admin.start()
        with translate_kafka_errors("describe topics", where):
            described = await admin.describe_topics(sorted(names))
    finally:
        await admin.close()
    return [t["topic"] for t in described if t["error_code"] == _UNKNOWN_TOPIC]
