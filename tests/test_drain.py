"""``drain-to-redis`` against real Valkey and Kafka, on topics, streams and a group of each
test's own: every served record moved once, byte for byte, in per-key order; a crash moves
nothing twice; a live executor group is refused; bad records reach the DLQ; reconcile checks
the moves."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import valkey.asyncio as avalkey
from aiokafka import AIOKafkaProducer

from ragflow_mq.producer import served_headers
from sidecar.cli.reconcile import reconcile, render_report
from sidecar.config import Settings
from sidecar.config.routing import DEFAULT_ROUTES, PRIORITY_PARSE, RouteTable
from sidecar.dev.samples import ragflow_tasks
from sidecar.serve.drain import DRAIN_SCRIPT, DrainRefused, drain_to_redis
from sidecar.transport import KafkaConsumer, KafkaProducer
from sidecar.transport.base import OutgoingMessage, SendResult
from sidecar.transport.topic_reader import read_topics
from sidecar.transport.topics import DLQ_TOPIC, init_topics
from sidecar.wire.contract import Keys

pytestmark = pytest.mark.kafka39

MakeTopic = Callable[[int], Awaitable[str]]


def drain_config(
    base: Settings, unique: str, topic: str, priority_topic: str
) -> tuple[dict[str, str], Settings]:
    """Every route to ``topic`` but the priority parse one; streams, group, keys of our own: the
    environment (the CLI's) and the settings made from it."""
    routes = {pattern: topic for pattern in DEFAULT_ROUTES} | {PRIORITY_PARSE: priority_topic}
    env = {
        "REDIS_URL": f"redis://{base.redis.host}:{base.redis.port}/1",
        "KAFKA_BOOTSTRAP_SERVERS": ",".join(base.kafka.bootstrap_servers),
        "KAFKA_LINGER_MS": "1",
        "KAFKA_CONSUMER_GROUP": f"executors-{unique}",
        "MIRROR_STREAMS": f"{unique}.1,{unique}.0",
        "MIRROR_PRIORITY_STREAMS": f"{unique}.1",
        "MIRROR_ROUTES": json.dumps(routes),
        "SERVE_KEY_PREFIX": f"test:{unique}",
        # The shortest allowed: a killed drain's member leaves the group after this.
        "SERVE_SESSION_TIMEOUT_MS": "6000",
    }
    return env, Settings.from_env(env)


def run_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    own = ("KAFKA_", "MIRROR_", "REDIS_", "SERVE_")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(own)}
    return subprocess.run(
        [sys.executable, "-m", "sidecar", "--log-level", "WARNING", *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def served_record(s: Settings, queue: str, task: dict[str, Any]) -> OutgoingMessage:
    """A served task as ``queue_product`` sends it under ``MQ_BACKEND=split``: the value is
    ``json.dumps(message).encode()``, topic and key from the route table, the seed's headers
    plus ``x-served: 1`` and ``x-ragflow-queue: <queue>``."""
    priority = 1 if queue in s.mirror.priority_streams else 0
    route = RouteTable(s.mirror.routes).route(task, priority)
    headers = served_headers(queue, task, route)
    return OutgoingMessage(route.topic, json.dumps(task).encode(), key=route.key, headers=headers)


def mirror_copy(s: Settings, stream: str, entry_id: str, task: dict[str, Any]) -> OutgoingMessage:
    """The mirror's copy of a stream entry: no ``x-served``, it names its entry."""
    route = RouteTable(s.mirror.routes).route(task, 0)
    headers = [("x-redis-stream", stream.encode()), ("x-redis-id", entry_id.encode())]
    return OutgoingMessage(route.topic, json.dumps(task).encode(), key=route.key, headers=headers)


def workload(docs: int, rounds: int) -> list[dict[str, Any]]:
    """Several tasks for each of ``docs`` documents (parse, per-document raptor, dataflow),
    the documents interleaved, plus dataset-wide raptors and memory tasks (non-ASCII text)."""
    shapes = ragflow_tasks(5)
    names = [uuid.uuid4().hex for _ in range(docs)]
    tasks = []
    for n in range(rounds):
        for doc in names:
            shape = shapes[(0, 2, 3)[n % 3]]
            task = {**shape, "id": uuid.uuid1().hex, "doc_id": doc, "create_time": n}
            if "doc_ids" in task:
                task["doc_ids"] = [doc]
            tasks.append(task)
        tasks.append({**shapes[1], "id": uuid.uuid1().hex})
        tasks.append({**shapes[4], "id": uuid.uuid1().hex, "memory_id": f"mem-{n % 2}"})
    return tasks


async def stream_values(client: avalkey.Valkey, stream: str) -> list[tuple[str, bytes]]:
    return [(i.decode(), fields[b"message"]) for i, fields in await client.xrange(stream)]


async def produce(s: Settings, records: list[OutgoingMessage]) -> list[SendResult]:
    async with KafkaProducer(s.kafka) as producer:
        results = await producer.send_many(records)
    assert all(isinstance(r, SendResult) for r in results), results
    return [r for r in results if isinstance(r, SendResult)]


def assert_per_key_order(s: Settings, stream: str, moved: list[bytes], sent: list[bytes]) -> None:
    """Within ``stream``, each routing key's tasks are in the order they were produced."""
    routes = RouteTable(s.mirror.routes)
    priority = 1 if stream in s.mirror.priority_streams else 0

    def by_key(values: list[bytes]) -> dict[str, list[str]]:
        keyed: dict[str, list[str]] = defaultdict(list)
        for value in values:
            task = json.loads(value)
            keyed[routes.route(task, priority).key].append(task["id"])
        return dict(keyed)

    assert by_key(moved) == by_key(sent)


async def test_every_served_record_is_moved_once_in_order_and_reconciled(
    settings: Settings, valkey_client: avalkey.Valkey, unique: str, make_topic: MakeTopic
) -> None:
    env, s = drain_config(settings, unique, await make_topic(3), await make_topic(2))
    high, low = s.mirror.streams
    # Entries RAGFlow executes from Redis, and their mirror copies in the same topics.
    redis_tasks = ragflow_tasks(5)
    copies = []
    for task in redis_tasks:
        entry_id = (await valkey_client.xadd(low, {"message": json.dumps(task)})).decode()
        copies.append(mirror_copy(s, low, entry_id, task))
    high_tasks, low_tasks = workload(3, 4), workload(4, 4)
    served = [served_record(s, high, t) for t in high_tasks]
    served += [served_record(s, low, t) for t in low_tasks]
    results = await produce(s, [*copies[:2], *served, *copies[2:]])
    placed = results[2 : 2 + len(served)]

    report = await drain_to_redis(s, timeout_s=60)

    assert report.complete and report.absent_topics == []
    assert report.moved == {high: len(high_tasks), low: len(low_tasks)}
    assert (report.already_moved, report.skipped_mirror, report.dead_lettered) == (0, 5, {})
    for stream, tasks in ((high, high_tasks), (low, low_tasks)):
        sent = [json.dumps(t).encode() for t in tasks]
        entries = await stream_values(valkey_client, stream)
        values = [value for _, value in entries]
        # Byte-identical, each once; the mirror copies were not moved (their entries are once).
        assert Counter(values) == Counter(
            sent + ([v.value for v in copies] if stream == low else [])
        )
        assert_per_key_order(s, stream, [v for v in values if v in set(sent)], sent)
    # Each drained key names the entry its record became, and never expires.
    keys = Keys(s.serve.key_prefix)
    for record, where in zip(served, placed, strict=True):
        drained = keys.drained(where.destination, where.partition, where.offset)
        entry_id = await valkey_client.get(drained)
        assert entry_id is not None and await valkey_client.ttl(drained) == -1
        queue = dict(record.headers)["x-ragflow-queue"].decode()
        [(_, fields)] = await valkey_client.xrange(queue, min=entry_id, max=entry_id)
        assert fields[b"message"] == record.value

    # Committed: a second run finds nothing left, neither served records nor copies.
    again = await drain_to_redis(s, timeout_s=60)
    assert (again.moved, again.already_moved, again.skipped_mirror) == ({}, 0, 0)

    checked = await reconcile(s)
    print("\n" + render_report(checked))
    assert checked.ok
    assert checked.served.records == checked.served.drained == len(served)
    assert checked.served.by_queue == {high: len(high_tasks), low: len(low_tasks)}
    assert checked.streams[low].found == 5 and checked.streams[low].drained == len(low_tasks)
    assert checked.streams[high].drained == len(high_tasks)
    assert checked.streams[low].missing == checked.streams[high].missing == []
    ok = run_cli(env, "reconcile")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert f"drained back to Redis and verified: {len(served)}" in ok.stdout

    # A drained entry lost from its stream is a problem, named, and exit 1.
    lost_id = (await stream_values(valkey_client, high))[0][0]
    await valkey_client.xdel(high, lost_id)
    failed = run_cli(env, "reconcile")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert f"-> {high} {lost_id}: entry missing" in failed.stdout
    assert "NOT OK: 1 drained records not in Redis as moved" in failed.stdout
    body = json.loads(run_cli(env, "reconcile", "--json").stdout)
    assert body["ok"] is False
    assert [p["entry_id"] for p in body["served"]["drained_problems"]] == [lost_id]


async def test_a_crash_after_moving_and_before_committing_moves_nothing_twice(
    settings: Settings, valkey_client: avalkey.Valkey, unique: str, make_topic: MakeTopic
) -> None:
    env, s = drain_config(settings, unique, await make_topic(3), await make_topic(2))
    high, low = s.mirror.streams
    sent: dict[str, list[dict[str, Any]]] = {high: workload(3, 3), low: workload(3, 3)}
    first = [served_record(s, q, t) for q in (high, low) for t in sent[q]]
    placed = await produce(s, first)

    # A drain killed right after its script ran for these five, before it committed them.
    script = valkey_client.register_script(DRAIN_SCRIPT)
    keys = Keys(s.serve.key_prefix)
    for record, where in list(zip(first, placed, strict=True))[:5]:
        drained = keys.drained(where.destination, where.partition, where.offset)
        queue = dict(record.headers)["x-ragflow-queue"].decode()
        await script(keys=[drained, queue], args=[record.value_bytes()])

    # Out of time before it read anything: nothing moved, exit 2 from the command line.
    stopped = await drain_to_redis(s, timeout_s=0)
    assert not stopped.complete and stopped.short_partitions and not stopped.moved
    cli = run_cli(env, "drain-to-redis", "--timeout-s", "0")
    assert cli.returncode == 2 and "run it again" in cli.stderr
    assert "NOT COMPLETE" in cli.stdout

    report = await drain_to_redis(s, timeout_s=60)
    assert report.complete and report.already_moved == 5
    assert sum(report.moved.values()) == len(first) - 5

    # A real crash: the command killed (SIGKILL) once it has moved some of a larger load.
    more = {high: workload(10, 15), low: workload(20, 15)}
    await produce(s, [served_record(s, q, t) for q in (high, low) for t in more[q]])
    for queue in (high, low):
        sent[queue] += more[queue]
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "sidecar", "drain-to-redis"),
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while process.returncode is None and time.monotonic() < deadline:
            if await valkey_client.xlen(high) + await valkey_client.xlen(low) >= len(first) + 150:
                break
            await asyncio.sleep(0.005)
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGKILL)
        await process.wait()
    there = await valkey_client.xlen(high) + await valkey_client.xlen(low)

    # Its member holds the group until its session times out: refused until then.
    deadline = time.monotonic() + 60
    while True:
        try:
            final = await drain_to_redis(s, timeout_s=60)
            break
        except DrainRefused:
            assert time.monotonic() < deadline
            await asyncio.sleep(1)
    print(f"\nkilled with {there} of {len(first) + 510} moved; then {final}")
    assert final.complete
    assert sum(final.moved.values()) == len(first) + 510 - there
    for stream in (high, low):
        values = Counter(value for _, value in await stream_values(valkey_client, stream))
        assert values == Counter(json.dumps(t).encode() for t in sent[stream])  # each once
    assert (await drain_to_redis(s, timeout_s=60)).already_moved == 0


async def test_drain_refuses_while_the_executor_group_has_a_member(
    settings: Settings, valkey_client: avalkey.Valkey, unique: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic(1)
    env, s = drain_config(settings, unique, topic, await make_topic(1))
    high, low = s.mirror.streams
    await produce(s, [served_record(s, low, t) for t in workload(2, 2)])

    async with KafkaConsumer(s.kafka, [topic], s.kafka.consumer_group) as executor:
        await executor.wait_for_assignment()
        with pytest.raises(DrainRefused, match="has 1 active member"):
            await drain_to_redis(s, timeout_s=60)
        cli = run_cli(env, "drain-to-redis")
        assert cli.returncode == 2
        [line] = cli.stderr.strip().splitlines()
        assert line.startswith(f"ragflow-sidecar: error: the executor group 'executors-{unique}'")
        assert await valkey_client.exists(high, low) == 0  # nothing was moved

    report = await drain_to_redis(s, timeout_s=60)
    assert report.moved == {low: 8}


async def test_a_bad_served_record_is_dead_lettered_with_its_bytes_and_reason(
    settings: Settings, valkey_client: avalkey.Valkey, unique: str, make_topic: MakeTopic
) -> None:
    await init_topics(settings.kafka)  # the DLQ
    topic = await make_topic(1)
    _, s = drain_config(settings, unique, topic, await make_topic(1))
    low = s.mirror.streams[-1]
    started_ms = int(time.time() * 1000)
    good, no_queue, elsewhere = ragflow_tasks(3)
    no_queue_record = served_record(s, low, no_queue)
    no_queue_record = no_queue_record._replace(
        headers=[(k, v) for k, v in no_queue_record.headers if k != "x-ragflow-queue"]
    )
    # A queue RAGFlow's executors do not know: they serve it as the lowest priority, so it
    # goes back to the last of MIRROR_STREAMS.
    odd_queue = served_record(s, "te.9.unknown", elsewhere)
    await produce(s, [served_record(s, low, good), no_queue_record, odd_queue])
    producer = AIOKafkaProducer(**s.kafka.client_kwargs())
    await producer.start()
    try:
        tombstone = served_record(s, low, good)
        await producer.send_and_wait(topic, None, key=b"doc", headers=list(tombstone.headers))
    finally:
        await producer.stop()

    report = await drain_to_redis(s, timeout_s=60)
    assert report.complete
    assert report.moved == {low: 2}
    assert report.dead_lettered == {"no_queue": 1, "no_value": 1}
    assert [v for _, v in await stream_values(valkey_client, low)] == [
        json.dumps(good).encode(),
        json.dumps(elsewhere).encode(),
    ]

    dead: list[Any] = []

    def take(record: Any) -> None:
        headers = dict(record.headers)
        if headers.get("x-source-topic") == topic.encode():
            dead.append((headers, record.value))

    await read_topics(s.kafka, [DLQ_TOPIC], take, since_ms=started_ms)
    by_reason = {headers["x-error"]: (headers, value) for headers, value in dead}
    assert len(dead) == 2 and set(by_reason) == {b"no_queue", b"no_value"}
    headers, value = by_reason[b"no_queue"]
    assert value == no_queue_record.value and headers["x-stage"] == b"drain"
    assert headers["x-task-id"] == no_queue["id"].encode()  # the record's own headers kept
    headers, value = by_reason[b"no_value"]
    assert value == b"" and headers["x-has-message-field"] == b"false"

    again = await drain_to_redis(s, timeout_s=60)
    assert (again.moved, again.dead_lettered) == ({}, {})
    checked = await reconcile(s)
    assert checked.ok
    assert (checked.served.records, checked.served.drained) == (4, 2)
    assert checked.streams[low].drained == 2
