"""The executed share on RAGFlow's real workload shape, with the Redis path as the reference.

Executors are stand-in processes with RAGFlow's shape: ``MAX_CONCURRENT_TASKS`` slots, tasks
that run for seconds (RAGFlow's run for minutes: scaled down here, with the settings scaled
alike), the ack after the whole task, ``get_task``'s ``retry_count`` (abandoned on the
fourth delivery) and the entrypoint's restart loop. What Redis's pending-entries list
guarantees is what each test asks of both paths.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import pytest
import valkey.asyncio as avalkey

from ragflow_mq.producer import served_headers
from sidecar.config.routing import RouteTable
from sidecar.dev.local_stack import LocalStack
from sidecar.transport.kafka import KafkaProducer
from sidecar.transport.message import encode_task
from sidecar.wire.contract import Keys
from tests.ragflow_support import pending_count, progress, read_produced, wait_until
from tests.serve_support import ServeWorld, by_path, make_world

pytestmark = [pytest.mark.timeout(600), pytest.mark.ragflow_pins]

RAGFLOW_GROUP = "rag_flow_svr_task_broker"
PERCENT = {"redis": "0", "kafka": "100"}


async def _settled(world: ServeWorld, client: avalkey.Valkey, path: str) -> bool:
    """Nothing of the path is left to hand out, or to hand out again."""
    if path == "redis":
        return await pending_count(client, world.streams, RAGFLOW_GROUP) == 0
    return await world.kafka_settled()


async def _done_at(client: avalkey.Valkey, world: ServeWorld) -> dict[str, float]:
    """Each task's first ``progress == 1`` (its finish), on the machine's monotonic clock."""
    done: dict[str, float] = {}
    for record in await progress(client, world.results):
        if record["progress"] == 1.0:
            done.setdefault(str(record["task_id"]), float(record["t"]))
    return done


async def _abandoned(client: avalkey.Valkey, world: ServeWorld) -> list[str]:
    raw = await client.lrange(f"{world.results}:abandoned", 0, -1)  # type: ignore[misc]
    return [json.loads(line)["task_id"] for line in raw]


@pytest.mark.parametrize("path", ["redis", "kafka"])
async def test_long_tasks_through_joins_leaves_and_a_kill_9_each_run_once(
    stack: LocalStack, unique: str, tmp_path: Path, valkey_client: avalkey.Valkey, path: str
) -> None:
    """Tasks of 4 s (RAGFlow's minutes, scaled with the session timeout and the lease):
    executors join, leave and one is killed with -9 mid-task and restarted by its loop. Every
    task runs exactly once, but for those in the killed executor's hands (at most once more);
    no finished task runs again, and none is abandoned."""
    world = await make_world(
        stack, unique, tmp_path, KAFKA_SERVE_PERCENT=PERCENT[path], SERVE_LEASE_S="3"
    )
    work = {"STANDIN_WORK_MS": "4000"}

    async def started(count: int) -> None:
        async def enough() -> bool:
            return len(await world.executed(valkey_client)) >= count

        await wait_until(enough, 180, what=f"{count} executions")

    with world.supervised("task_executor_common_a_0", **work) as a:
        await world.wait_members(1)
        api, out = world.api("produced.jsonl", docs=15, tasks_per_doc=3)
        with api:
            assert await api.await_exit(120) == 0, api.log_text()
        ids = {str(p["task_id"]) for p in read_produced(out)}
        await started(5)  # a's five slots are busy
        with world.supervised("task_executor_common_b_0", **work) as b:
            await world.wait_members(2)
            with world.executor("task_executor_common_c_0", **work) as c:
                await world.wait_members(3)
                await started(15)
                c.terminate()  # leaves: its tasks in hand finish and are acked first
            killed_pid = await a.kill_executor()
            killed_at = time.monotonic()
            await world.wait_executed(valkey_client, ids, timeout_s=240)

            async def quiet() -> bool:
                done = await _done_at(valkey_client, world)
                return ids <= done.keys() and await _settled(world, valkey_client, path)

            await wait_until(quiet, 120, interval_s=0.5, what="every task done and settled")
            b.terminate()
        a.terminate()

    records = await world.executed(valkey_client)
    done = await _done_at(valkey_client, world)
    counts = Counter(str(r["task_id"]) for r in records)
    in_hand_at_kill = {
        str(r["task_id"])
        for r in records
        if r["pid"] == killed_pid and float(r["t"]) <= killed_at
        and done.get(str(r["task_id"]), killed_at + 1) > killed_at
    }  # fmt: skip
    again = {task_id: n - 1 for task_id, n in counts.items() if n > 1}
    print(
        f"{path}: {len(ids)} tasks of 4 s, {len(records)} executions, killed with "
        f"{len(in_hand_at_kill)} in hand, run again: {sorted(again.values())}"
    )
    assert counts.keys() == ids, f"lost: {ids - counts.keys()}"
    assert again.keys() <= in_hand_at_kill, f"run again though not in the killed hands: {again}"
    assert max(counts.values()) <= 2, again
    rerun_after_done = [
        r["task_id"] for r in records if float(r["t"]) > done.get(str(r["task_id"]), float("inf"))
    ]
    assert not rerun_after_done, f"finished tasks ran again: {rerun_after_done}"
    assert not await _abandoned(valkey_client, world)
    assert by_path(records) == {path: len(records)}


async def test_five_tasks_past_the_poll_interval_keep_the_member_while_others_run(
    stack: LocalStack, unique: str, tmp_path: Path, valkey_client: avalkey.Valkey
) -> None:
    """Five tasks in hand for 8 s with a 3 s max.poll.interval.ms: the busy executor stays
    in the group (it polls its paused partitions), and the idle one runs the tasks of its own
    partitions meanwhile."""
    world = await make_world(
        stack, unique, tmp_path, KAFKA_SERVE_PERCENT="100", SERVE_MAX_POLL_INTERVAL_MS="3000"
    )
    with world.executor("task_executor_common_slow_0", STANDIN_WORK_MS="8000") as slow:
        await world.wait_members(1)
        first, first_out = world.api("first.jsonl", docs=5, tasks_per_doc=1)
        with first:
            assert await first.await_exit(60) == 0, first.log_text()
        long_ids = {str(p["task_id"]) for p in read_produced(first_out)}
        await world.wait_executed(valkey_client, long_ids, timeout_s=60)
        with world.executor("task_executor_common_idle_0") as idle:
            await world.wait_members(2)
            members = await world.member_ids()
            second, second_out = world.api("second.jsonl", docs=30, tasks_per_doc=1)
            with second:
                assert await second.await_exit(60) == 0, second.log_text()
            short_ids = {str(p["task_id"]) for p in read_produced(second_out)}

            async def idle_ran_some() -> bool:
                records = await world.executed(valkey_client)
                return any(r["consumer"] == "task_executor_common_idle_0" for r in records)

            await wait_until(idle_ran_some, 30, what="the idle executor to run tasks")
            started = {str(r["task_id"]): r for r in await world.executed(valkey_client)}
            assert not long_ids & (await _done_at(valkey_client, world)).keys(), (
                "the long tasks were already done: the test proves nothing"
            )
            # Past the poll interval twice over, the long tasks still in hand.
            records = await world.wait_executed(valkey_client, long_ids | short_ids, 120)
            assert await world.member_ids() == members, "a member left or joined meanwhile"
            idle.terminate()
        slow.terminate()
    counts = Counter(str(r["task_id"]) for r in records)
    assert counts == Counter(dict.fromkeys(long_ids | short_ids, 1))
    by_idle = [r for r in started.values() if r["consumer"] == "task_executor_common_idle_0"]
    print(f"while 5 long tasks ran: {len(by_idle)} tasks started on the idle executor")


@pytest.mark.parametrize("path", ["redis", "kafka"])
async def test_a_task_that_kills_its_executor_is_abandoned_by_retry_count(
    stack: LocalStack, unique: str, tmp_path: Path, valkey_client: avalkey.Valkey, path: str
) -> None:
    """A poison task kills its executor each time it runs; the entrypoint restarts it. RAGFlow
    abandons it on the fourth delivery (its own retry_count); nothing reaches a DLQ.

    The four tasks queued before it are running when it strikes. On Redis they are replayed
    with it after each restart and die with it each time, until RAGFlow abandons them too
    (printed, not asserted: that is RAGFlow's own behaviour). On Kafka, tasks taken over from
    a dead executor run one at a time, so they die beside the poison once at most, and run.
    """
    world = await make_world(stack, unique, tmp_path, KAFKA_SERVE_PERCENT=PERCENT[path])
    settings = world.settings()
    low = world.streams[1]
    tasks = [
        {"id": f"{unique}{i:03d}", "doc_id": f"{unique}doc", "from_page": 12 * i,
         "to_page": 12 * i + 12}
        for i in range(12)
    ]  # fmt: skip
    poison = tasks[4]["id"]
    neighbours = {t["id"] for t in tasks} - {poison}
    await valkey_client.sadd(f"{world.results}:poison", poison)  # type: ignore[misc]
    if path == "redis":
        for task in tasks:
            await valkey_client.xadd(low, {"message": json.dumps(task)})
    else:
        routes = RouteTable(settings.mirror.routes)
        async with KafkaProducer(settings.kafka) as producer:
            for task in tasks:
                route = routes.route(task, 0)
                headers = served_headers(low, task, route)
                await producer.send(route.topic, encode_task(task), key=route.key, headers=headers)
    with world.supervised("task_executor_common_p_0", STANDIN_WORK_MS="300") as executor:

        async def ended() -> bool:
            done = (await _done_at(valkey_client, world)).keys()
            abandoned = set(await _abandoned(valkey_client, world))
            return poison in abandoned and neighbours <= done | abandoned

        await wait_until(ended, 180, what="every task done or abandoned")
        await wait_until(lambda: _settled(world, valkey_client, path), 60, what="settled")
        executor.terminate()
    records = await world.executed(valkey_client)
    counts = Counter(str(r["task_id"]) for r in records)
    abandoned = await _abandoned(valkey_client, world)
    runs = sorted(counts[t] for t in neighbours)
    print(
        f"{path}: poison ran {counts[poison]} times; neighbours {runs}; abandoned "
        f"{len(abandoned)} ({len(set(abandoned) - {poison})} neighbours)"
    )
    assert counts[poison] == 3
    assert poison in abandoned
    totals = await valkey_client.hgetall(Keys(unique).evidence_total)
    assert int(totals.get(b"kafka:dead_lettered", 0)) == 0
    assert by_path(records) == {path: len(records)}
    if path == "kafka":
        assert abandoned == [poison]
        assert all(1 <= counts[t] <= 2 for t in neighbours), counts


async def test_a_second_record_of_a_finished_task_is_skipped(
    stack: LocalStack, unique: str, tmp_path: Path, valkey_client: avalkey.Valkey
) -> None:
    """A task id recorded twice in Kafka (a producer's retry after a lost acknowledgement, a
    copy written by hand) runs once; the second record is counted as a duplicate."""
    world = await make_world(stack, unique, tmp_path, KAFKA_SERVE_PERCENT="100")
    settings = world.settings()
    low = world.streams[1]
    routes = RouteTable(settings.mirror.routes)
    twice = {"id": f"{unique}twice", "doc_id": f"{unique}d1", "from_page": 0, "to_page": 12}
    once = {"id": f"{unique}once", "doc_id": f"{unique}d2", "from_page": 0, "to_page": 12}
    async with KafkaProducer(settings.kafka) as producer:
        for task in (twice, once, twice):
            route = routes.route(task, 0)
            headers = served_headers(low, task, route)
            await producer.send(route.topic, encode_task(task), key=route.key, headers=headers)
    with world.executor("task_executor_common_t_0") as executor:
        await world.wait_executed(valkey_client, {twice["id"], once["id"]}, timeout_s=60)
        await wait_until(world.kafka_settled, 60, interval_s=0.5, what="every record committed")
        executor.terminate()
    counts = Counter(str(r["task_id"]) for r in await world.executed(valkey_client))
    assert counts == {twice["id"]: 1, once["id"]: 1}
    totals = await valkey_client.hgetall(Keys(unique).evidence_total)
    assert int(totals[b"kafka:duplicate"]) == 1


@pytest.mark.parametrize("path", ["redis", "kafka"])
async def test_one_documents_tasks_run_on_every_idle_executor(
    stack: LocalStack, unique: str, tmp_path: Path, valkey_client: avalkey.Valkey, path: str
) -> None:
    """One document of 10 tasks of 2 s, two idle executors of 5 slots: on Redis each takes
    some; served, its tasks are dealt across both executors' partitions, not all on one."""
    world = await make_world(stack, unique, tmp_path, KAFKA_SERVE_PERCENT=PERCENT[path])
    names = ("task_executor_common_a_0", "task_executor_common_b_0")
    with (
        world.executor(names[0], STANDIN_WORK_MS="2000") as a,
        world.executor(names[1], STANDIN_WORK_MS="2000") as b,
    ):
        await world.wait_members(2)
        api, out = world.api("produced.jsonl", docs=1, tasks_per_doc=10)
        with api:
            assert await api.await_exit(60) == 0, api.log_text()
        ids = {str(p["task_id"]) for p in read_produced(out)}
        records = await world.wait_executed(valkey_client, ids, timeout_s=120)
        a.terminate()
        b.terminate()
    assert Counter(str(r["task_id"]) for r in records) == Counter(dict.fromkeys(ids, 1))
    assert by_path(records)[path] == 10
    per_executor = Counter(str(r["consumer"]) for r in records)
    print(f"{path}: tasks per executor {dict(per_executor)}")
    assert set(per_executor) == set(names), per_executor
