"""The executed share: RAGFlow-like processes that load ``ragflow_mq.install()`` through
sitecustomize, against the session's real Valkey and Kafka."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import valkey.asyncio as avalkey

from sidecar.cli.reconcile import reconcile
from sidecar.dev.local_stack import LocalStack
from sidecar.serve.drain import drain_to_redis
from sidecar.transport.kafka import KafkaProducer
from sidecar.transport.message import encode_task
from sidecar.transport.topic_reader import read_topics
from sidecar.transport.topics import DLQ_TOPIC, init_topics
from sidecar.wire.contract import QUEUE_HEADER, SERVED_HEADER, Keys
from tests.ragflow_support import assert_exactly_once, pending_count, read_produced, wait_until
from tests.serve_support import ServeWorld, by_path, make_world

pytestmark = [pytest.mark.kafka39, pytest.mark.ragflow_pins]

RAGFLOW_GROUP = "rag_flow_svr_task_broker"


async def _stream_task_ids(client: avalkey.Valkey, world: ServeWorld) -> set[str]:
    ids = set()
    for stream in world.streams:
        for _entry_id, fields in await client.xrange(stream):
            ids.add(json.loads(fields[b"message"])["id"])
    return ids


async def _no_redis_pending(client: avalkey.Valkey, world: ServeWorld) -> None:
    async def none_pending() -> bool:
        return await pending_count(client, world.streams, RAGFLOW_GROUP) == 0

    await wait_until(none_pending, 30, what="no Redis entry pending")


def _order_key(msg_id: str) -> tuple[int, ...]:
    """Queue order of a message id: a Kafka offset, or a stream entry id's two numbers."""
    if ":" in msg_id:
        return (int(msg_id.rsplit(":", 1)[1]),)
    ms, _, seq = msg_id.partition("-")
    return int(ms), int(seq)


def _assert_each_document_in_order_on_one_path(records: list[dict[str, Any]]) -> None:
    """A document's tasks are all on one path, queued in page order in each place they were
    queued (the offsets of each partition its tasks were dealt to, or entry ids of one
    stream), whatever order concurrent slots then finished them in."""
    places: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    paths: dict[str, set[bool]] = defaultdict(set)
    for record in records:
        msg_id = str(record["msg_id"])
        place = msg_id.rsplit(":", 1)[0] if ":" in msg_id else "redis"
        places[str(record["doc_id"]), place].append(record)
        paths[str(record["doc_id"])].add(":" in msg_id)
    for doc, found in paths.items():
        assert len(found) == 1, f"document {doc} split across the paths"
    for (doc, place), tasks in places.items():
        queued = sorted(tasks, key=lambda r: _order_key(str(r["msg_id"])))
        pages = [int(r["from_page"]) for r in queued]
        assert pages == sorted(pages), f"document {doc} queued out of page order in {place}"


async def test_half_served_every_task_executed_exactly_once(
    stack: LocalStack, unique: str, tmp_path: Path, valkey_client: avalkey.Valkey
) -> None:
    world = await make_world(stack, unique, tmp_path, KAFKA_SERVE_PERCENT="50")
    with (
        world.executor("task_executor_common_a_0") as a,
        world.executor("task_executor_common_b_0") as b,
    ):
        await world.wait_members(2)
        api, out = world.api("produced.jsonl", docs=250, tasks_per_doc=20)
        with api:
            assert await api.await_exit(300) == 0, api.log_text()
        produced = read_produced(out)
        assert len(produced) == 5000 and all(p["ok"] for p in produced)
        ids = {str(p["task_id"]) for p in produced}
        records = await world.wait_executed(valkey_client, ids)
        # Anything still to come (a second execution) would show within a commit interval.
        await _no_redis_pending(valkey_client, world)
        a.terminate()
        b.terminate()
    records = await world.executed(valkey_client)
    assert_exactly_once(ids, records)
    _assert_each_document_in_order_on_one_path(records)
    paths = by_path(records)
    assert 0.3 < paths["kafka"] / len(ids) < 0.7, paths
    kafka_ids = {str(r["task_id"]) for r in records if ":" in str(r["msg_id"])}
    in_streams = await _stream_task_ids(valkey_client, world)
    assert not kafka_ids & in_streams, "a served task was also written to a Redis stream"
    assert in_streams == ids - kafka_ids
    assert {r["consumer"] for r in records} == {
        "task_executor_common_a_0",
        "task_executor_common_b_0",
    }
    # The evidence the gate reads agrees with what was executed.
    totals = await valkey_client.hgetall(Keys(unique).evidence_total)
    assert int(totals[b"kafka:finished"]) == paths["kafka"]
    assert int(totals[b"redis:finished"]) == paths["redis"]
    assert int(totals[b"kafka:produced"]) == paths["kafka"]


async def test_killed_executor_holding_kafka_tasks_loses_none(
    stack: LocalStack, unique: str, tmp_path: Path, valkey_client: avalkey.Valkey
) -> None:
    world = await make_world(stack, unique, tmp_path, KAFKA_SERVE_PERCENT="100")
    name = "task_executor_common_k_0"
    first = world.executor(name, STANDIN_WORK_MS="200")
    with first:
        await world.wait_members(1)
        api, out = world.api("produced.jsonl", docs=20, tasks_per_doc=10)
        with api:
            assert await api.await_exit(120) == 0, api.log_text()
        ids = {str(p["task_id"]) for p in read_produced(out)}

        async def working() -> bool:
            return len(await world.executed(valkey_client)) >= 30

        await wait_until(working, 120, what="30 executions before the kill")
        first.kill()
    before = await world.executed(valkey_client)
    assert by_path(before) == {"kafka": len(before)}
    with world.executor(name, STANDIN_WORK_MS="0") as second:
        records = await world.wait_executed(valkey_client, ids, timeout_s=180)
        second.terminate()
    records = await world.executed(valkey_client)
    counts = defaultdict(int)
    for record in records:
        counts[str(record["task_id"])] += 1
    assert set(counts) == ids, "a task was lost"
    doubled = sum(n - 1 for n in counts.values())
    # At-least-once: at most what the killed executor held (running + fetched ahead) plus
    # what it finished within one commit interval.
    assert doubled <= 5 + 5 + 5, f"{doubled} executed twice"
    print(f"kill -9 with Kafka tasks in hand: {len(ids)} tasks, 0 lost, {doubled} executed twice")


async def test_roll_back_mid_stream_then_drain_to_redis_loses_and_doubles_nothing(
    stack: LocalStack, unique: str, tmp_path: Path, valkey_client: avalkey.Valkey
) -> None:
    world = await make_world(stack, unique, tmp_path, KAFKA_SERVE_PERCENT="50")
    keys = Keys(unique)
    with world.executor("task_executor_common_r_0", STANDIN_WORK_MS="20") as executor:
        await world.wait_members(1)
        first, first_out = world.api("first.jsonl", docs=40, tasks_per_doc=10)
        with first:
            assert await first.await_exit(120) == 0, first.log_text()
        # Roll back to 0 % with the live share (what `gate --apply` writes): new documents go
        # to Redis, while the Kafka tasks already queued are still executed from Kafka.
        await valkey_client.set(keys.share, "0")
        second, second_out = world.api("second.jsonl", docs=40, tasks_per_doc=10)
        with second:
            assert await second.await_exit(120) == 0, second.log_text()
        # Stop the executor with served tasks still unconsumed in Kafka.
        executor.terminate()
    done_before = await world.executed(valkey_client)
    first_ids = {str(p["task_id"]) for p in read_produced(first_out)}
    second_ids = {str(p["task_id"]) for p in read_produced(second_out)}
    assert second_ids <= await _stream_task_ids(valkey_client, world), "roll-back not applied"

    # drain-to-redis refuses while the executors' group has a member: a stop whose LeaveGroup
    # did not go out in time (a loaded machine) leaves it until the session timeout.
    async def group_empty() -> bool:
        return not await world.member_ids()

    await wait_until(group_empty, 30, what="the executors' group empty")
    report = await drain_to_redis(world.settings(), timeout_s=60)
    assert report.complete
    moved = sum(report.moved.values())
    kafka_done = {str(r["task_id"]) for r in done_before if ":" in str(r["msg_id"])}
    assert moved > 0, "nothing was left in Kafka to drain: make the executor slower"
    print(f"roll-back: {len(kafka_done)} served tasks executed from Kafka, {moved} drained")
    # A second drain finds nothing left: each record moved once.
    again = await drain_to_redis(world.settings(), timeout_s=60)
    assert sum(again.moved.values()) == 0

    # Executors back on Redis alone (what MQ_BACKEND=redis gives after removing Kafka).
    with world.executor("task_executor_common_r_0", install=False) as executor:
        records = await world.wait_executed(valkey_client, first_ids | second_ids)
        await _no_redis_pending(valkey_client, world)
        executor.terminate()
    records = await world.executed(valkey_client)
    assert_exactly_once(first_ids | second_ids, records)
    result = await reconcile(world.settings(), traffic_percent=0)
    assert result.ok, result


async def test_records_the_executor_cannot_take_go_to_the_dlq_with_their_bytes(
    stack: LocalStack, unique: str, tmp_path: Path, valkey_client: avalkey.Valkey
) -> None:
    """Only undecodable records are dead-lettered; a task that was handed out before (three
    executors died on it) is RAGFlow's to judge by its retry_count, not the DLQ's."""
    world = await make_world(stack, unique, tmp_path, KAFKA_SERVE_PERCENT="100")
    settings = world.settings()
    await init_topics(settings.kafka)  # the DLQ
    topic, low = f"{unique}.tasks", world.streams[1]
    served = [(SERVED_HEADER, b"1"), (QUEUE_HEADER, low.encode())]
    good = {"id": f"{unique}good", "doc_id": "d1", "from_page": 0, "to_page": 12}
    tired = {"id": f"{unique}tired", "doc_id": "d2", "from_page": 0, "to_page": 12}
    copy = {"id": f"{unique}copy", "doc_id": "d3", "from_page": 0, "to_page": 12}
    started_ms = int(time.time() * 1000)
    async with KafkaProducer(settings.kafka) as producer:
        broken = await producer.send(topic, b"{not json", key="d0", headers=served)
        no_id = await producer.send(topic, b'{"doc_id": "d4"}', key="d4", headers=served)
        await producer.send(topic, encode_task(tired), key="d2", headers=served)
        await producer.send(topic, encode_task(copy), key="d3")  # the mirror's copy
        await producer.send(topic, encode_task(good), key="d1", headers=served)
    # Delivered twice before (its executors died): this delivery is its third, and it runs.
    await valkey_client.hset(f"{world.results}:retry_count", tired["id"], 2)
    with world.executor("task_executor_common_d_0") as executor:
        records = await world.wait_executed(valkey_client, {good["id"], tired["id"]}, timeout_s=120)
        dead: dict[bytes, tuple[dict[str, bytes], bytes | None]] = {}

        def take(record: Any) -> None:
            headers = dict(record.headers)
            if headers.get("x-source-topic") == topic.encode():
                dead[headers["x-error"]] = (headers, record.value)

        async def both_dead() -> bool:
            dead.clear()
            await read_topics(settings.kafka, [DLQ_TOPIC], take, since_ms=started_ms)
            return len(dead) == 2

        await wait_until(both_dead, 60, interval_s=0.5, what="two dead letters")
        executor.terminate()
    executed = sorted(r["task_id"] for r in await world.executed(valkey_client))
    assert executed == sorted([good["id"], tired["id"]])
    assert dead[b"not_json"][1] == b"{not json"
    assert dead[b"not_json"][0]["x-source-offset"] == f"{broken.partition}:{broken.offset}".encode()
    assert dead[b"no_task_id"][0]["x-source-offset"] == f"{no_id.partition}:{no_id.offset}".encode()
    assert dead[b"no_task_id"][0]["x-stage"] == b"serve"
    totals = await valkey_client.hgetall(Keys(unique).evidence_total)
    assert int(totals[b"kafka:dead_lettered"]) == 2
    assert len(records) == 2


async def test_an_executor_joining_and_leaving_mid_stream_runs_nothing_twice(
    stack: LocalStack, unique: str, tmp_path: Path, valkey_client: avalkey.Valkey
) -> None:
    """Two rebalances while tasks are in RAGFlow's hands: the member losing a partition runs
    its tasks in hand to their ack while the new owner parks their records, and a partition
    read again from its committed offset skips what was done since."""
    world = await make_world(stack, unique, tmp_path, KAFKA_SERVE_PERCENT="100")

    async def executed_at_least(count: int) -> None:
        async def enough() -> bool:
            return len(await world.executed(valkey_client)) >= count

        await wait_until(enough, 120, what=f"{count} executions")

    with world.executor("task_executor_common_j_0", STANDIN_WORK_MS="30"):
        await world.wait_members(1)
        api, out = world.api("produced.jsonl", docs=60, tasks_per_doc=10)
        with api:
            assert await api.await_exit(120) == 0, api.log_text()
        ids = {str(p["task_id"]) for p in read_produced(out)}
        await executed_at_least(100)
        with world.executor("task_executor_common_j_1", STANDIN_WORK_MS="30") as joining:
            await world.wait_members(2)
            await executed_at_least(350)
            joining.terminate()
        await world.wait_executed(valkey_client, ids)
    records = await world.executed(valkey_client)
    assert_exactly_once(ids, records)
    assert {r["consumer"] for r in records} == {
        "task_executor_common_j_0",
        "task_executor_common_j_1",
    }
    assert by_path(records) == {"kafka": len(ids)}
