"""Kafka ACLs enforced per component: a broker of this module's own with ``StandardAuthorizer``
and one SCRAM principal per component, allowed what docs/security.md's ``kafka-acls.sh``
commands grant (read from the page, so the two cannot drift apart). Each component does its job
as its principal; each is refused the rest with an error naming the principal and the ACL."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator, Awaitable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import valkey.asyncio as avalkey
from aiokafka import errors as kafka_errors

from ragflow_mq.factory import create_consumer, create_producer
from sidecar.app.service import Sidecar
from sidecar.config import Settings
from sidecar.dev.local_stack import LocalKafka
from sidecar.dev.local_stack.acls import AclBinding, create_acls, parse_acl_command
from sidecar.errors import AuthorizationError, MessageQueueError
from sidecar.transport.base import OutgoingMessage
from sidecar.transport.kafka import KafkaConsumer, KafkaProducer, translate_kafka_error
from sidecar.transport.message import QueueMessage
from sidecar.transport.topic_reader import read_topics
from sidecar.transport.topics import DLQ_TOPIC, PARSE_TOPIC, VERDICTS_TOPIC, init_topics
from sidecar.verdicts.reader import read_verdicts as read_verdicts_topic
from tests import tiers
from tests.conftest import free_port, kafka_version
from tests.mirror_support import RAGFLOW_GROUP, ragflow_worker
from tests.shadow_support import read_verdicts, sidecar_settings
from tests.test_security import (
    command_env,
    enqueue,
    error_lines,
    mirror_env,
    run_command,
)

pytestmark = pytest.mark.kafka39

DOC = Path(__file__).parent.parent / "docs" / "security.md"
MIRROR, SHADOW, MQ, READER = "ragflow-mirror", "ragflow-shadow", "ragflow-mq", "ragflow-reader"
SHADOW_GROUP = "ragflow-shadow"
EXECUTOR_GROUP = "ragflow-task-executor"


def documented_acls() -> list[AclBinding]:
    """Every ``kafka-acls.sh --add`` command of docs/security.md, continuation lines joined."""
    text = DOC.read_text().replace("\\\n", " ")
    commands = [line for line in text.splitlines() if line.startswith("kafka-acls.sh ")]
    assert len(commands) >= 8, "docs/security.md lost its kafka-acls.sh commands"
    return [binding for command in commands for binding in parse_acl_command(command)]


def test_the_documented_commands_grant_each_principal_what_it_needs() -> None:
    granted = {(b.principal, b.operation, b.resource_type, b.name, b.pattern) for b in documented_acls()}  # fmt: skip
    assert ("User:ragflow-mirror", "write", "topic", "ragflow.task.", "prefixed") in granted
    assert ("User:ragflow-shadow", "read", "group", SHADOW_GROUP, "literal") in granted
    assert ("User:ragflow-mq", "read", "group", EXECUTOR_GROUP, "literal") in granted
    assert not any(p == "User:ragflow-reader" and op == "write" for p, op, *_ in granted)
    with pytest.raises(ValueError, match="--producer is not understood"):
        parse_acl_command("kafka-acls.sh --add --allow-principal User:x --producer --topic t")


@pytest.fixture(scope="module")
@tiers.starts_servers
async def acl_broker(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalKafka]:
    """One broker with the authorizer, the topics made and the documented ACLs in force."""
    root = tmp_path_factory.mktemp("acl-kafka")
    broker = LocalKafka(
        root, free_port(), free_port(), kafka_version(),
        sasl_ssl_port=free_port(), principals=(MIRROR, SHADOW, MQ, READER), authorizer=True,
    )  # fmt: skip
    try:
        await asyncio.to_thread(broker.start)
        # As the super user (the PLAINTEXT listener): init-topics is an administrator's job.
        admin = Settings.from_env(
            {
                "REDIS_URL": "redis://127.0.0.1:1/1",
                "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
            }
        )
        await init_topics(admin.kafka)
        await create_acls(broker.bootstrap_servers, documented_acls())
        yield broker
    finally:
        await asyncio.to_thread(broker.stop)


def as_principal(base: Settings, broker: LocalKafka, principal: str, **extra: str) -> Settings:
    """The session's Valkey, this module's broker over SASL_SSL as ``principal``."""
    return Settings.from_env(
        {
            "REDIS_URL": f"redis://{base.redis.host}:{base.redis.port}/1",
            **broker.secured_client_env(principal),
            "KAFKA_LINGER_MS": "1",
            **extra,
        }
    )


def super_user(base: Settings, broker: LocalKafka) -> Settings:
    return Settings.from_env(
        {
            "REDIS_URL": f"redis://{base.redis.host}:{base.redis.port}/1",
            "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
        }
    )


async def until_done(work: Awaitable[Any], *loops: asyncio.Task[Any]) -> Any:
    """``work``'s result; a component loop that dies first (refused, say) fails the test."""
    waiting = asyncio.ensure_future(work)
    done, _ = await asyncio.wait({waiting, *loops}, return_when=asyncio.FIRST_COMPLETED)
    if waiting not in done:
        waiting.cancel()
        for loop in done:
            loop.result()  # raises what stopped it
        raise AssertionError("a component stopped early")
    return waiting.result()


async def test_the_mirror_and_the_shadow_do_their_jobs_each_as_its_own_principal(
    settings: Settings, valkey_client: avalkey.Valkey, unique: str, acl_broker: LocalKafka
) -> None:
    high, low = f"te.{unique}.1", f"te.{unique}.0"
    for stream, count in ((high, 3), (low, 9)):
        await enqueue(valkey_client, stream, count)
        await valkey_client.xgroup_create(stream, RAGFLOW_GROUP, id="0")
    streams = [high, low]

    def component(principal: str) -> Settings:
        secured = acl_broker.secured_client_env(principal)
        config = sidecar_settings(settings, streams, unique, SHADOW_GROUP=SHADOW_GROUP, **secured)
        # No stable instance name: the shadow leaves its group when it stops, so the group is
        # free at once for the tests below (a static member keeps it for a session timeout).
        return replace(config, shadow=replace(config.shadow, stable_instance=False))

    stop = asyncio.Event()
    # The split deployment: `mirror --compare` (it records the Redis run) and `shadow`.
    async with Sidecar(component(SHADOW), mirror=False) as shadow:
        assert shadow.shadow is not None
        await shadow.shadow.wait_ready()
        async with Sidecar(component(MIRROR), shadow=False, observer=False) as mirror:
            loops = [asyncio.create_task(s.run(stop)) for s in (shadow, mirror)]
            try:
                handled = await until_done(
                    asyncio.gather(
                        ragflow_worker(valkey_client, high, 3),
                        ragflow_worker(valkey_client, low, 9),
                    ),
                    *loops,
                )
                verdicts = await until_done(
                    read_verdicts(super_user(settings, acl_broker), set(streams), expected=12),
                    *loops,
                )
            finally:
                stop.set()
                await asyncio.wait_for(asyncio.gather(*loops), timeout=60)
    assert [len(h) for h in handled] == [3, 9]
    finals = {(v["stream"], v["entry_id"]): v["verdict"] for v in verdicts}
    assert len(finals) == 12 and set(finals.values()) == {"match"}, verdicts


async def test_ragflow_and_the_operators_commands_do_their_jobs_each_as_its_own_principal(
    settings: Settings, unique: str, acl_broker: LocalKafka
) -> None:
    # RAGFlow's processes (ragflow_mq, the seed's Kafka backend): enqueue, consume in their
    # group, commit.
    executors = as_principal(settings, acl_broker, MQ, MQ_BACKEND="kafka")
    task = {"id": f"task-{unique}", "doc_id": unique, "task_type": "parse"}
    producer = create_producer(executors)
    async with producer:
        [sent] = await producer.send_many([OutgoingMessage(PARSE_TOPIC, task, unique)])
    assert not isinstance(sent, Exception), sent
    got: list[QueueMessage] = []
    async with create_consumer(executors, [PARSE_TOPIC], consumer_name=unique) as consumer:
        while not any(m.key == unique.encode() for m in got):
            batch = await asyncio.wait_for(consumer.poll_batch(100, 500), 60)
            got += batch
            for message in batch:
                await consumer.ack(message)
    # drain-to-redis takes the executors' place, with their principal: nothing served to move.
    drain_env = command_env(
        REDIS_URL=f"redis://{settings.redis.host}:{settings.redis.port}/1",
        **acl_broker.secured_client_env(MQ),
        MIRROR_STREAMS=f"te.{unique}.1,te.{unique}.0",
    )
    drained = await asyncio.to_thread(run_command, ["drain-to-redis", "--json"], drain_env)
    assert drained.returncode == 0, drained.stderr
    # gate and diffs read the verdicts, reconcile the task topics and the DLQ, status offsets.
    reader = as_principal(settings, acl_broker, READER)
    await read_verdicts_topic(reader.kafka, since_ms=None, verdicts=None, task_types=None)
    seen: list[Any] = []
    outcome = await read_topics(
        reader.kafka, [PARSE_TOPIC, DLQ_TOPIC], lambda *record: seen.append(record)
    )
    assert outcome.complete and outcome.records >= 1
    status_env = {**drain_env, **acl_broker.secured_client_env(READER)}
    status = await asyncio.to_thread(run_command, ["status"], status_env)
    assert status.returncode in (0, 1) and "refused" not in status.stderr, status.stderr


def refusal(principal: str, acl: str) -> re.Pattern[str]:
    """The one-line error for ``principal`` lacking ``acl``."""
    return re.compile(
        rf"^Kafka at 127\.0\.0\.1:\d+ as User:{principal} refused to let us .+: "
        rf"no ACL allows {re.escape(acl)} \((Topic|Group|Cluster)AuthorizationFailed\); "
        r"see docs/security\.md$"
    )


async def send(settings: Settings, topic: str) -> None:
    async with KafkaProducer(settings.kafka) as producer:
        [result] = await producer.send_many([OutgoingMessage(topic, b"{}", b"k")])
    if isinstance(result, Exception):
        raise result


async def join(settings: Settings, topic: str, group: str) -> None:
    async with KafkaConsumer(settings.kafka, [topic], group) as consumer:
        await consumer.poll_batch(1, 100)


# principal, what it tries, the ACL named in the refusal
REFUSALS = [
    (MIRROR, "join", PARSE_TOPIC, EXECUTOR_GROUP, f"READ on group {EXECUTOR_GROUP}"),
    (MIRROR, "join", PARSE_TOPIC, SHADOW_GROUP, f"READ on group {SHADOW_GROUP}"),
    (SHADOW, "send", PARSE_TOPIC, None, f"WRITE on topic {PARSE_TOPIC}"),
    (SHADOW, "join", PARSE_TOPIC, EXECUTOR_GROUP, f"READ on group {EXECUTOR_GROUP}"),
    # Its own group, a topic it may describe and write but not read.
    (SHADOW, "join", VERDICTS_TOPIC, SHADOW_GROUP, f"READ on topic {VERDICTS_TOPIC}"),
    (MQ, "send", VERDICTS_TOPIC, None, f"WRITE on topic {VERDICTS_TOPIC}"),
    (MQ, "join", PARSE_TOPIC, SHADOW_GROUP, f"READ on group {SHADOW_GROUP}"),
    # Allowed to write nowhere, its idempotent producer gets no producer id.
    (READER, "send", DLQ_TOPIC, None, "IDEMPOTENT_WRITE on the cluster (or WRITE on a topic)"),
    (READER, "join", VERDICTS_TOPIC, SHADOW_GROUP, f"READ on group {SHADOW_GROUP}"),
]  # fmt: skip


@pytest.mark.parametrize(("principal", "action", "topic", "group", "acl"), REFUSALS)
async def test_each_principal_is_refused_the_rest_naming_the_missing_acl(
    settings: Settings,
    acl_broker: LocalKafka,
    principal: str,
    action: str,
    topic: str,
    group: str | None,
    acl: str,
) -> None:
    config = as_principal(settings, acl_broker, principal)
    with pytest.raises(AuthorizationError) as refused:
        if group is None:
            await asyncio.wait_for(send(config, topic), 60)
        else:
            await asyncio.wait_for(join(config, topic, group), 60)
    assert refusal(principal, acl).match(str(refused.value)), str(refused.value)
    assert not refused.value.retriable


async def test_a_topic_hidden_by_the_acls_is_not_only_called_missing(
    settings: Settings, acl_broker: LocalKafka
) -> None:
    executors = as_principal(settings, acl_broker, MQ)
    with pytest.raises(MessageQueueError) as hidden:
        await read_topics(executors.kafka, [VERDICTS_TOPIC], lambda *record: None)
    assert str(hidden.value).startswith(
        f"topic {VERDICTS_TOPIC} does not exist in Kafka at {acl_broker.secured_bootstrap_servers}"
        f" as User:{MQ} or no ACL allows DESCRIBE on it (run init-topics;"
    ), str(hidden.value)


async def test_a_mirror_run_as_the_wrong_principal_stops_with_one_line_and_acks_nothing(
    settings: Settings, valkey_client: avalkey.Valkey, unique: str, acl_broker: LocalKafka
) -> None:
    stream, group = f"te.{unique}.0", f"mirror-{uuid.uuid4().hex[:8]}"
    await enqueue(valkey_client, stream, 4)
    env = mirror_env(
        f"redis://{settings.redis.host}:{settings.redis.port}/1",
        acl_broker.secured_client_env(SHADOW),
        stream,
        group,
    )
    ran = await asyncio.to_thread(run_command, ["mirror"], env)
    assert ran.returncode == 2, ran.stderr
    # Its log lines, then one line that says it all, and no traceback.
    line = error_lines(ran.stderr)[-1]
    assert line.startswith("ragflow-sidecar: error: "), ran.stderr
    assert refusal(SHADOW, f"WRITE on topic {PARSE_TOPIC}").match(line.split(": error: ", 1)[1])
    assert "Traceback" not in ran.stderr, ran.stderr
    # Stopped with every entry it read unacked: nothing lost, nothing dead-lettered.
    assert (await valkey_client.xpending(stream, group))["pending"] == 4


@pytest.mark.parametrize(
    ("error", "action", "acl"),
    [
        (kafka_errors.TopicAuthorizationFailedError("t"), "send to t", "WRITE on topic t"),
        (kafka_errors.TopicAuthorizationFailedError({"b", "a"}), "fetch", "READ on topic a, b"),
        (kafka_errors.TopicAuthorizationFailedError("t"), "read offsets", "DESCRIBE on topic t"),
        (kafka_errors.TopicAuthorizationFailedError("t"), "create topics", "CREATE on topic t"),
        (kafka_errors.GroupAuthorizationFailedError("g"), "commit 3 offsets", "READ on group g"),
        (kafka_errors.GroupAuthorizationFailedError("g"), "describe the group g", "DESCRIBE on group g"),
        (kafka_errors.ClusterAuthorizationFailedError(), "start a producer", "IDEMPOTENT_WRITE on the cluster (or WRITE on a topic)"),
        (kafka_errors.ClusterAuthorizationFailedError(), "create topics", "CREATE on the cluster (or on the topics)"),
    ],
)  # fmt: skip
def test_every_kind_of_refusal_names_the_operation_and_the_resource(
    error: kafka_errors.KafkaError, action: str, acl: str
) -> None:
    translated = translate_kafka_error(error, action, "k:9094 as User:p")
    assert isinstance(translated, AuthorizationError) and not translated.retriable
    assert str(translated) == (
        f"Kafka at k:9094 as User:p refused to let us {action}: no ACL allows {acl} "
        f"({type(error).__name__.removesuffix('Error')}); see docs/security.md"
    )
