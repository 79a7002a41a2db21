"""Kafka faults: the broker killed with -9 or away for longer than the producer's request
timeout, while the whole sidecar runs and RAGFlow works; then restarted on the same data."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
import valkey.asyncio as avalkey
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from sidecar.app.wiring import running_mirror
from sidecar.config import Settings
from sidecar.dev.local_stack import LocalKafka
from sidecar.errors import SidecarError
from sidecar.transport import KafkaConsumer, KafkaProducer, OutgoingMessage
from sidecar.transport.topics import init_topics
from tests.faults.support import (
    FaultRow,
    Share,
    SidecarProcess,
    assert_one_verdict_each,
    own_settings,
    wait_until,
)
from tests.mirror_support import ragflow_tasks, read_mirrored

pytestmark = [pytest.mark.faults, pytest.mark.timeout(420), pytest.mark.kafka39]

REQUEST_TIMEOUT_MS = 2000
MIRROR_GROUP = "ragflow_kafka_mirror"  # the default MIRROR_GROUP


@pytest.mark.parametrize("fault", ["kill -9", "outage"])
async def test_whole_sidecar_through_a_broker_fault(
    settings: Settings,
    valkey_client: avalkey.Valkey,
    unique: str,
    own_broker: LocalKafka,
    tmp_path: Path,
    fault_table: list[FaultRow],
    fault: str,
) -> None:
    """``kill -9``: the broker dies and is started again at once on the same data dir.
    ``outage``: the broker is stopped for four request timeouts, then started again."""
    own = own_settings(settings, unique, bootstrap=own_broker.bootstrap_servers)
    share = await Share.prepare(own, valkey_client, unique)
    total = 3000
    env = share.env(KAFKA_REQUEST_TIMEOUT_MS=str(REQUEST_TIMEOUT_MS))
    worker = share.worker(total)
    producer = share.producer(total, pause_s=0.2)
    with SidecarProcess(["run"], env, tmp_path / "sidecar.log") as sidecar:
        await wait_until(share.has_verdicts, "the first verdicts", 120, 1.0)
        if fault == "kill -9":
            await asyncio.to_thread(own_broker.kill)
        else:
            await asyncio.to_thread(own_broker.stop)
            await asyncio.sleep(4 * REQUEST_TIMEOUT_MS / 1000)
        await asyncio.to_thread(own_broker.start)
        restarted = time.monotonic()
        ids = await producer
        verdicts = await share.judged(total, timeout_s=240)
        recover_s = time.monotonic() - restarted
        assert sidecar.stop() == 0
    log = (tmp_path / "sidecar.log").read_text()
    kinds = assert_one_verdict_each(verdicts, ids)
    # One re-send per event: the batch in hand when the broker died, the one in hand at each
    # in-process restart (at least one: its verdicts could not be published), and each retry of
    # records Kafka did not confirm (a request the broker wrote but did not answer, around its
    # stop or its start, is written again by the retry: at least once, as documented).
    restarts = log.count("starting again in")
    retries = log.count("Kafka did not take")
    row = await share.assert_intact(total, ids, worker, crashes=1 + max(restarts, 1) + retries)
    fault_table.append(
        FaultRow.of(
            f"Kafka broker {fault} mid-stream",
            row,
            recover_s,
            f"verdicts {dict(kinds)}, in-process restarts {restarts}, produce retries {retries}",
        )
    )


async def test_kill_9_and_restart_keeps_every_acknowledged_record(own_broker: LocalKafka) -> None:
    settings = Settings.from_env(
        {"KAFKA_BOOTSTRAP_SERVERS": own_broker.bootstrap_servers, "KAFKA_LINGER_MS": "1"}
    )
    topic = "restart.test"
    admin = AIOKafkaAdminClient(**settings.kafka.client_kwargs())
    await admin.start()
    await admin.create_topics([NewTopic(topic, 3, 1)])
    await admin.close()

    acknowledged: set[str] = set()
    async with KafkaProducer(settings.kafka) as producer:
        for batch in range(10):
            outcomes = await producer.send_many(
                [
                    OutgoingMessage(topic, {"id": f"{batch}-{n}"}, key=f"doc{n % 7}")
                    for n in range(100)
                ]
            )
            assert not [o for o in outcomes if isinstance(o, SidecarError)]
            acknowledged.update(f"{batch}-{n}" for n in range(100))

    pid_before = own_broker.process.pid()
    await asyncio.to_thread(own_broker.kill)
    assert own_broker.process.pid() is None
    await asyncio.to_thread(own_broker.start)
    assert own_broker.process.pid() not in (None, pid_before)

    seen: list[str] = []
    async with KafkaConsumer(settings.kafka, [topic], "restart-check") as consumer:
        for _ in range(120):
            seen += [m.payload["id"] for m in await consumer.poll_batch(500, 500)]
            if len(seen) >= len(acknowledged):
                break
    assert set(seen) == acknowledged
    assert len(seen) == len(acknowledged)  # and nothing twice


async def test_nothing_is_acked_in_redis_while_kafka_is_away(
    settings: Settings, valkey_client: avalkey.Valkey, unique: str, own_broker: LocalKafka
) -> None:
    """Broker stopped, entries keep coming: nothing is acked until Kafka has it; then resume."""
    s = Settings.from_env(
        {
            "REDIS_URL": f"redis://{settings.redis.host}:{settings.redis.port}/1",
            "KAFKA_BOOTSTRAP_SERVERS": own_broker.bootstrap_servers,
            "KAFKA_REQUEST_TIMEOUT_MS": "2000",
            "KAFKA_LINGER_MS": "1",
            "MIRROR_STREAMS": unique,
            "MIRROR_START": "earliest",
            "MIRROR_BLOCK_MS": "100",
        }
    )
    await init_topics(s.kafka)
    tasks = ragflow_tasks(300)

    stop = asyncio.Event()
    async with running_mirror(s) as mirror:
        running = asyncio.create_task(mirror.run(stop))
        try:
            for task in tasks[:100]:
                await valkey_client.xadd(unique, {"message": json.dumps(task)})

            async def mirrored(n: int) -> bool:
                return sum(mirror.stats.mirrored.values()) >= n

            await wait_until(lambda: mirrored(100), "the first 100", 60)
            await asyncio.to_thread(own_broker.stop)
            for task in tasks[100:]:
                await valkey_client.xadd(unique, {"message": json.dumps(task)})

            async def retrying() -> bool:
                return mirror.stats.produce_retries >= 2

            await wait_until(retrying, "produce retries", 60)
            pending = (await valkey_client.xpending(unique, MIRROR_GROUP))["pending"]
            assert pending > 0  # read, not in Kafka, so not acked
            assert sum(mirror.stats.mirrored.values()) == 100
            # Everything read since is pending (a prefetched batch is read but not yet counted).
            assert pending >= mirror.stats.read - 100

            await asyncio.to_thread(own_broker.start)
            await wait_until(lambda: mirrored(300), "recovery after Kafka returned", 120)
        finally:
            stop.set()
            await running
    assert (await valkey_client.xpending(unique, MIRROR_GROUP))["pending"] == 0
    found = await read_mirrored(s, {unique}, 300)
    assert len({m.headers["x-redis-id"] for m in found}) == 300
