"""The executor's Kafka consumer (``ragflow_mq.consumer``) across a rebalance, in this process,
against the session's real Kafka and Valkey: no served task is skipped or handed out twice."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ragflow_mq import consumer as consumer_module
from ragflow_mq.consumer import ServeConsumer
from ragflow_mq.hand import KafkaTask
from ragflow_mq.producer import served_headers
from ragflow_mq.recorder import Recorder
from sidecar.config import Settings
from sidecar.config.routing import Route, RouteTable
from sidecar.dev.local_stack import LocalStack, LocalValkey
from sidecar.transport.kafka import KafkaProducer
from sidecar.transport.partitioner import key_partition
from sidecar.transport.valkey_client import create_client
from sidecar.wire.contract import Keys
from tests.conftest import free_port
from tests.ragflow_support import wait_until
from tests.serve_support import ServeWorld, make_world

pytestmark = [pytest.mark.kafka39, pytest.mark.ragflow_pins]


async def _one_task_per_partition(world: ServeWorld, settings: Settings) -> set[str]:
    """Queue, as ``queue_product`` does for a served document, one task on every partition of
    the world's two topics (priority 2 partitions, the rest 4); their ids."""
    routes = RouteTable(settings.mirror.routes)
    high, low = world.streams
    producer = KafkaProducer(settings.kafka, linger_ms=0)
    ids: set[str] = set()
    async with producer:
        for queue, priority, partitions in ((high, 1, 2), (low, 0, 4)):
            wanted = set(range(partitions))
            n = 0
            while wanted:
                n += 1
                task: dict[str, Any] = {"id": f"{world.unique}-{priority}-{n}", "priority": 0}
                task["doc_id"] = f"doc-{priority}-{n}"
                route = routes.route(task, priority)
                partition = key_partition(route.key.encode(), partitions)
                if partition not in wanted:
                    continue
                wanted.discard(partition)
                headers = served_headers(queue, task, route)
                await producer.send(route.topic, task, key=route.key, headers=headers)
                ids.add(task["id"])
    return ids


async def test_a_fetch_in_flight_across_a_rebalance_skips_no_task(
    stack: LocalStack, unique: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A member's fetch that was waiting when the group rebalanced returns records of the
    partitions it was given back: they are its own, to hand out, not a revoked owner's.

    The fetch waits 30 s here so that it certainly spans the second member's join; with the
    production 500 ms it does whenever tasks arrive within that much of a rebalance (a fresh
    executor pair, as in test_serve_gate, lost the first task of a document that way).
    """
    monkeypatch.setattr(consumer_module, "_FETCH_TIMEOUT_MS", 30_000)
    world = await make_world(stack, unique, tmp_path, KAFKA_SERVE_PERCENT="100")
    settings = world.settings(SERVE_SESSION_TIMEOUT_MS="6000")
    routes, keys = RouteTable(settings.mirror.routes), Keys(unique)
    store = create_client(settings.state)
    members = [
        ServeConsumer(settings, routes, keys, store, Recorder(), name)
        for name in ("task_executor_common_r_0", "task_executor_common_r_1")
    ]
    taken: Counter[str] = Counter()
    by_member: Counter[int] = Counter()

    def take_all() -> None:
        for index, member in enumerate(members):
            for queue in world.streams:
                while (task := member.take(queue)) is not None:
                    taken[task.task_id] += 1
                    by_member[index] += 1
                    task.ack()

    try:
        await members[0].start()
        await world.wait_members(1)
        await members[1].start()  # the first member's fetch is waiting: it spans the join
        await world.wait_members(2)
        ids = await _one_task_per_partition(world, settings)

        async def all_taken() -> bool:
            take_all()
            return ids <= taken.keys()

        try:
            await wait_until(all_taken, 20, interval_s=0.05, what=f"{len(ids)} tasks handed out")
        except AssertionError:
            missing = sorted(ids - taken.keys())
            raise AssertionError(f"never handed out: {missing} (taken: {dict(taken)})") from None
        take_all()  # a second copy of one would have been fetched with the rest
    finally:
        for member in members:
            await member.stop()
        await store.aclose()
    assert taken == Counter(dict.fromkeys(ids, 1)), taken
    assert by_member[0] and by_member[1], "the rebalance did not split the partitions"


def _one_task(unique: str, routes: RouteTable) -> tuple[dict[str, Any], Route]:
    task = {"id": f"{unique}-t", "doc_id": f"{unique}-d", "from_page": 0, "to_page": 12}
    return task, routes.route(task, 0)


async def _take_one(member: ServeConsumer, queue: str) -> KafkaTask:
    """The next served task of ``queue``, as RAGFlow's executor asks for it."""
    taken: list[KafkaTask] = []

    def handed_out() -> bool:
        got = member.take(queue)
        if got is not None:
            taken.append(got)
        return bool(taken)

    await wait_until(handed_out, 60, what="the task handed out")
    return taken[0]


async def test_a_task_acked_as_the_executor_stops_is_marked_done_and_committed(
    stack: LocalStack, unique: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RAGFlow's graceful stop acks the tasks in hand and exits: the stop cancels the task
    that writes done markers, and a batch it had in hand must still be marked and committed
    (else drain-to-redis moved the finished task back to Redis, and it ran twice)."""
    world = await make_world(stack, unique, tmp_path, KAFKA_SERVE_PERCENT="100")
    settings = world.settings()
    routes, keys = RouteTable(settings.mirror.routes), Keys(unique)
    task, route = _one_task(unique, routes)
    async with KafkaProducer(settings.kafka, linger_ms=0) as producer:
        headers = served_headers(world.streams[1], task, route)
        sent = await producer.send(route.topic, task, key=route.key, headers=headers)
    store = create_client(settings.state)
    member = ServeConsumer(settings, routes, keys, store, Recorder(), "task_executor_common_s_0")
    finish = consumer_module.Claims.finish
    marking = asyncio.Event()

    async def slow_finish(self: Any, task_ids: Any) -> None:
        marking.set()
        await asyncio.sleep(1)  # a slow state store: the stop comes while this waits
        await finish(self, task_ids)

    monkeypatch.setattr(consumer_module.Claims, "finish", slow_finish)
    try:
        await member.start()
        (await _take_one(member, world.streams[1])).ack()
        await asyncio.wait_for(marking.wait(), 10)
        await member.stop()
        assert await store.exists(keys.done(task["id"])) == 1, "acked, never marked done"
        assert await world.kafka_settled(), f"offset {sent.offset} left uncommitted"
    finally:
        await member.stop()
        await store.aclose()


async def test_a_record_claimed_while_its_task_is_marked_done_is_not_run_again(
    stack: LocalStack, unique: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second record of a task (a partition read again from its committed offset after a
    rebalance) is claimed while the task's done marker is being written: the claim still
    finds the task ours, and by the time it returns the task is no longer held. The record is
    parked (then skipped as done), not handed out again: a fresh-clone run of
    test_serve.py's joining-and-leaving test ran one task of 600 twice so."""
    world = await make_world(stack, unique, tmp_path, KAFKA_SERVE_PERCENT="100")
    settings = world.settings()
    routes, keys = RouteTable(settings.mirror.routes), Keys(unique)
    task, route = _one_task(unique, routes)
    headers = served_headers(world.streams[1], task, route)
    store = create_client(settings.state)
    member = ServeConsumer(settings, routes, keys, store, Recorder(), "task_executor_common_c_0")
    claim, finish = consumer_module.Claims.claim, consumer_module.Claims.finish
    claims_of_task = 0
    claimed_again = asyncio.Event()

    async def late_finish(self: Any, task_ids: Any) -> None:
        await claimed_again.wait()  # the done marker lands after the second record's claim
        await finish(self, task_ids)

    async def racing_claim(self: Any, task_ids: Any, **options: Any) -> Any:
        nonlocal claims_of_task
        outcomes = await claim(self, task_ids, **options)
        if task["id"] in task_ids:
            claims_of_task += 1
            if claims_of_task == 2:
                claimed_again.set()
                await wait_until(lambda: task["id"] not in member._hand.held(), 10,
                                 interval_s=0.01, what="the task marked done")  # fmt: skip
        return outcomes

    monkeypatch.setattr(consumer_module.Claims, "finish", late_finish)
    monkeypatch.setattr(consumer_module.Claims, "claim", racing_claim)
    try:
        await member.start()
        async with KafkaProducer(settings.kafka, linger_ms=0) as producer:
            await producer.send(route.topic, task, key=route.key, headers=headers)
            (await _take_one(member, world.streams[1])).ack()
            await producer.send(route.topic, task, key=route.key, headers=headers)
        # The second record is parked and claimed again once the task is done (skipped), or
        # (the bug) waits in the buffer to be handed out.
        await wait_until(lambda: claims_of_task >= 3 or member._hand.filled() > 0, 30,
                         interval_s=0.01, what="the second record dealt with")  # fmt: skip
        assert member.take(world.streams[1]) is None, "the task was handed out twice"
        await wait_until(lambda: not member.parked(), 10, what="the second record skipped")
        assert await store.exists(keys.done(task["id"])) == 1
    finally:
        await member.stop()
        await store.aclose()


@pytest.mark.parametrize("successor", ["task_executor_common_p_0", "task_executor_common_q_0"])
async def test_a_task_given_up_stays_pending_and_is_taken_back_once(
    stack: LocalStack, unique: str, tmp_path: Path, successor: str
) -> None:
    """RAGFlow gives a served task up (collect() raised after queue_consumer): its record is
    committed past, this process never hands it out again, and the next process takes it from
    the pending list once: the same consumer name started again, or another executor once
    the holder is gone."""
    world = await make_world(stack, unique, tmp_path, KAFKA_SERVE_PERCENT="100")
    settings = world.settings()
    routes, keys = RouteTable(settings.mirror.routes), Keys(unique)
    task, route = _one_task(unique, routes)
    queue = world.streams[1]
    async with KafkaProducer(settings.kafka, linger_ms=0) as producer:
        await producer.send(
            route.topic, task, key=route.key, headers=served_headers(queue, task, route)
        )
    store = create_client(settings.state)
    name = "task_executor_common_p_0"
    first = ServeConsumer(settings, routes, keys, store, Recorder(), name)
    second = ServeConsumer(settings, routes, keys, store, Recorder(), successor)
    try:
        await first.start()
        first.given_up(await _take_one(first, queue))

        async def pending() -> bool:
            return bool(await store.hexists(keys.pending(name), task["id"]))  # type: ignore[misc]

        await wait_until(pending, 10, what="the task in its consumer's pending list")
        await wait_until(world.kafka_settled, 30, what="its record committed past")
        await asyncio.sleep(2.5)  # two refreshes: neither hands it out here again
        assert first.take(queue) is None, "handed out again by the process that gave it up"
        await first.stop()
        await second.start()
        again = await _take_one(second, queue)
        assert again.task_id == task["id"] and again.retaken
        again.ack()

        async def finished() -> bool:
            return await store.exists(keys.done(task["id"])) == 1 and not await pending()

        await wait_until(finished, 10, what="the task done and out of the pending list")
        await asyncio.sleep(2.5)
        assert second.take(queue) is None, "taken back twice"
    finally:
        await first.stop()
        await second.stop()
        await store.aclose()


async def test_records_fetched_while_the_state_store_is_down_are_parked_within_the_slots(
    stack: LocalStack, unique: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Nobody can tell where a task runs while the store is away: the fetched records are
    parked, no more than RAGFlow's slots, with one warning for the outage; once the store is
    back every task is handed out once."""
    server = LocalValkey(tmp_path / "state", free_port())
    server.start()
    world = await make_world(
        stack, unique, tmp_path, KAFKA_SERVE_PERCENT="100", SIDECAR_STATE_URL=server.url
    )
    settings = world.settings(SIDECAR_STATE_URL=server.url)
    routes, keys = RouteTable(settings.mirror.routes), Keys(unique)
    queue = world.streams[1]
    store = create_client(settings.state)
    member = ServeConsumer(settings, routes, keys, store, Recorder(), "task_executor_common_o_0")
    taken: Counter[str] = Counter()
    try:
        await member.start()
        server.stop()
        ids: set[str] = set()
        async with KafkaProducer(settings.kafka, linger_ms=0) as producer:
            for n in range(20):
                task = {"id": f"{unique}-{n}", "doc_id": f"{unique}-d{n}", "from_page": 0}
                route = routes.route(task, 0)
                headers = served_headers(queue, task, route)
                await producer.send(route.topic, task, key=route.key, headers=headers)
                ids.add(task["id"])
        await asyncio.sleep(6)
        assert member.take(queue) is None
        assert member.parked() <= settings.serve.prefetch, member.parked()
        server.start()

        def take_all() -> bool:
            while (task := member.take(queue)) is not None:
                taken[task.task_id] += 1
                task.ack()
            return ids <= taken.keys()

        await wait_until(take_all, 60, interval_s=0.1, what="every task handed out")
    finally:
        await member.stop()
        await store.aclose()
        server.stop()
    assert taken == Counter(dict.fromkeys(ids, 1)), taken
    outage = [r for r in caplog.records if "cannot be reached" in r.getMessage()]
    assert len(outage) == 1, [r.getMessage() for r in outage]
