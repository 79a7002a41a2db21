"""The served path through RAGFlow's routine failures, with Redis's pending-entries list as the
reference: a database error between ``queue_consumer`` and the ack, a frozen executor, and a
state store that restarts without persistence. RAGFlow stand-in executors (upstream's
``collect()``/``handle_task`` shape: one asyncio loop, 5 slots, the queue calls synchronous on
it) against the session's real Kafka and real Valkey servers."""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import valkey.asyncio as avalkey

from sidecar.dev.local_stack import LocalStack, LocalValkey
from sidecar.wire.contract import Keys
from tests import tiers
from tests.conftest import own_valkey
from tests.ragflow_support import assert_exactly_once, read_produced, wait_until
from tests.serve_support import ServeWorld, by_path, make_world

PERCENT = {"redis": "0", "kafka": "100"}


async def _executed_ids(client: avalkey.Valkey, world: ServeWorld) -> Counter[str]:
    return Counter(str(r["task_id"]) for r in await world.executed(client))


async def _enqueue(world: ServeWorld, name: str, docs: int) -> set[str]:
    api, out = world.api(f"{name}.jsonl", docs=docs, tasks_per_doc=1)
    with api:
        assert await api.await_exit(120) == 0, api.log_text()
    return {str(p["task_id"]) for p in read_produced(out)}


@pytest.mark.parametrize("path", ["redis", "kafka"])
async def test_collects_failing_after_queue_consumer_wedge_nothing_and_run_at_restart(
    stack: LocalStack, unique: str, tmp_path: Path, valkey_client: avalkey.Valkey, path: str
) -> None:
    """The first 5 collects raise in get_task (MySQL away), after queue_consumer, before any
    ack: the executor goes on with the next tasks, as on Redis; a second executor joining
    with every done marker gone re-runs no finished task; the 5 run once at the restart."""
    world = await make_world(stack, unique, tmp_path, KAFKA_SERVE_PERCENT=PERCENT[path])
    await valkey_client.set(f"{world.results}:db_down", 5)
    name = "task_executor_common_m_0"
    with world.supervised(name, STANDIN_WORK_MS="50") as executor:
        if path == "kafka":
            await world.wait_members(1)
        first = await _enqueue(world, "first", docs=12)

        async def seven_ran() -> bool:
            return len(await _executed_ids(valkey_client, world)) >= 7

        await wait_until(seven_ran, 60, what="the 7 tasks after the 5 failed collects")
        stranded = first - set(await _executed_ids(valkey_client, world))
        assert len(stranded) == 5, stranded
        # Not wedged: RAGFlow's five slots take new tasks.
        second = await _enqueue(world, "second", docs=10)
        await world.wait_executed(valkey_client, second, timeout_s=60)
        if path == "kafka":
            # Finished tasks' done markers expired (SERVE_DONE_TTL_S), then a rebalance: the
            # records behind the stranded ones were committed, nothing runs again.
            async for key in valkey_client.scan_iter(match=f"{unique}:done:*"):
                await valkey_client.delete(key)
            with world.executor("task_executor_common_n_0", STANDIN_WORK_MS="50"):
                await world.wait_members(2)
                await asyncio.sleep(5)
            again = {t: n for t, n in (await _executed_ids(valkey_client, world)).items() if n > 1}
            assert not again, f"finished tasks ran again after the rebalance: {again}"
        await asyncio.sleep(2)  # the last tasks acked (50 ms each): a kill leaves none in hand
        await executor.kill_executor()  # back in a second under its name
        records = await world.wait_executed(valkey_client, first | second, timeout_s=120)
        await asyncio.sleep(3)  # a second run would come now
        records = await world.executed(valkey_client)
        executor.terminate()
    assert_exactly_once(first | second, records)
    assert by_path(records) == {path: len(records)}

    totals = await valkey_client.hgetall(Keys(unique).evidence_total)
    assert int(totals.get(f"{path}:abandoned".encode(), 0)) == 5, totals


@pytest.mark.parametrize("path", ["redis", "kafka"])
async def test_an_executor_frozen_60_s_mid_task_keeps_its_tasks(
    stack: LocalStack, unique: str, tmp_path: Path, valkey_client: avalkey.Valkey, path: str
) -> None:
    """SIGSTOP for 60 s (docker pause, a VM stall, the GIL held). On Redis the frozen
    consumer's entries stay pending for it and it finishes them when it thaws. Served, 60 s is
    longer than the Kafka session, so its partitions move; its claims hold (SERVE_LEASE_S).
    Either way nothing runs twice."""
    world = await make_world(stack, unique, tmp_path, KAFKA_SERVE_PERCENT=PERCENT[path])
    with (
        world.executor("task_executor_common_f_0", STANDIN_WORK_MS="6000") as frozen,
        world.executor("task_executor_common_g_0", STANDIN_WORK_MS="6000"),
    ):
        if path == "kafka":
            await world.wait_members(2)
        ids = await _enqueue(world, "produced", docs=16)

        async def frozen_has_some() -> bool:
            records = await world.executed(valkey_client)
            return any(r["consumer"] == "task_executor_common_f_0" for r in records)

        await wait_until(frozen_has_some, 60, what="a task started on the executor to freeze")
        os.kill(frozen.pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(60)
        finally:
            os.kill(frozen.pid, signal.SIGCONT)
        await world.wait_executed(valkey_client, ids, timeout_s=180)
        await wait_until(world.kafka_settled, 60, what="every record committed")
        await asyncio.sleep(3)  # a second run would come now
        records = await world.executed(valkey_client)
    assert_exactly_once(ids, records)
    assert by_path(records) == {path: len(records)}


async def test_an_executor_frozen_past_the_lease_has_its_tasks_taken_over_and_run_twice(
    stack: LocalStack, unique: str, tmp_path: Path, valkey_client: avalkey.Valkey
) -> None:
    """The one case a served task runs twice (docs/operations.md, the frozen-process row): a
    freeze longer than SERVE_LEASE_S. The frozen executor's claims lapse, another executor
    takes its tasks over from their records, and the frozen one, thawed, finishes its own run
    too and says so. (Redis never gives a frozen consumer's entries to another: RAGFlow has
    no XCLAIM or XAUTOCLAIM.)"""
    world = await make_world(
        stack, unique, tmp_path, KAFKA_SERVE_PERCENT="100", SERVE_LEASE_S="6",
        SERVE_CLAIM_REFRESH_S="1",
    )  # fmt: skip
    frozen_name, other_name = "task_executor_common_f_0", "task_executor_common_g_0"
    with (
        world.executor(frozen_name, STANDIN_WORK_MS="15000") as frozen,
        world.executor(other_name, STANDIN_WORK_MS="15000"),
    ):
        await world.wait_members(2)
        ids = await _enqueue(world, "produced", docs=8)

        async def frozen_ones() -> set[str]:
            records = await world.executed(valkey_client)
            return {str(r["task_id"]) for r in records if r["consumer"] == frozen_name}

        async def frozen_has_some() -> bool:
            return bool(await frozen_ones())

        await wait_until(frozen_has_some, 60, what="a task started on the executor to freeze")
        os.kill(frozen.pid, signal.SIGSTOP)
        try:
            held = await frozen_ones()

            async def taken_over() -> bool:
                records = await world.executed(valkey_client)
                return held <= {str(r["task_id"]) for r in records if r["consumer"] == other_name}

            await wait_until(taken_over, 90, what="the frozen executor's tasks taken over")
        finally:
            os.kill(frozen.pid, signal.SIGCONT)
        await world.wait_executed(valkey_client, ids, timeout_s=120)
        await wait_until(world.kafka_settled, 90, what="every record committed")

        async def thawed_finished() -> bool:
            return "claimed by another executor" in frozen.log_text()

        await wait_until(thawed_finished, 30, what="the thawed executor's warning")
        records = await world.executed(valkey_client)
    runs = Counter(str(r["task_id"]) for r in records)
    assert set(runs) == ids, set(runs) ^ ids
    assert held and all(runs[t] == 2 for t in held), (held, runs)
    assert max(runs.values()) <= 2, runs


@pytest.fixture
@tiers.starts_servers
def state_store(tmp_path: Path) -> Iterator[LocalValkey]:
    """A state store of the test's own, without persistence (RAGFlow's compose runs so)."""
    with own_valkey(tmp_path / "state") as server:
        yield server


async def test_the_state_store_restarted_without_persistence_mid_task_runs_nothing_twice(
    stack: LocalStack,
    unique: str,
    tmp_path: Path,
    valkey_client: avalkey.Valkey,
    state_store: LocalValkey,
) -> None:
    """Every claim is forgotten while tasks run; an executor joins and reads their records
    again. The holder asserts its claims again and the young store is read with caution:
    each task runs once. The store's risk is said at start."""
    world = await make_world(
        stack, unique, tmp_path, KAFKA_SERVE_PERCENT="100", SIDECAR_STATE_URL=state_store.url
    )
    work = {"STANDIN_WORK_MS": "15000"}
    with world.executor("task_executor_common_s_0", **work) as holder:
        await world.wait_members(1)
        ids = await _enqueue(world, "produced", docs=6)

        async def all_started() -> bool:
            return len(await _executed_ids(valkey_client, world)) >= 5

        try:
            await wait_until(all_started, 60, what="5 tasks in the holder's hands")
        except AssertionError:
            raise AssertionError(holder.log_text()[-3000:]) from None
        state_store.stop()
        state_store.start()
        with world.executor("task_executor_common_t_0", **work):
            await world.wait_members(2)
            await world.wait_executed(valkey_client, ids, timeout_s=120)
            await wait_until(world.kafka_settled, 60, what="every record committed")
        records = await world.executed(valkey_client)
        holder.terminate()
    assert_exactly_once(ids, records)
    assert "can lose the served path's keys: no persistence" in holder.log_text()


async def _fill(client: avalkey.Valkey, start: int, count: int) -> None:
    """Keys with a TTL, as done markers are: what volatile-lru evicts when the store is full."""
    async with client.pipeline(transaction=False) as pipe:
        for n in range(start, start + count):
            pipe.set(f"filler:{n}", b"x" * 120, ex=3600)
        await pipe.execute()


async def test_a_state_store_that_evicts_under_running_tasks_runs_nothing_twice(
    stack: LocalStack,
    unique: str,
    tmp_path: Path,
    valkey_client: avalkey.Valkey,
    state_store: LocalValkey,
) -> None:
    """A 16 MB volatile-lru store kept full while executors hold tasks and another joins: the
    eviction may take any key with a TTL, claims too; nothing runs twice, and the risk is said
    at start."""
    store = avalkey.Valkey.from_url(state_store.url)
    await store.config_set("maxmemory", "16mb")
    await store.config_set("maxmemory-policy", "volatile-lru")
    world = await make_world(
        stack, unique, tmp_path, KAFKA_SERVE_PERCENT="100", SIDECAR_STATE_URL=state_store.url
    )
    filled = 0
    stop = asyncio.Event()

    async def keep_full() -> None:
        nonlocal filled
        while not stop.is_set():
            await _fill(store, filled, 5000)
            filled += 5000
            await asyncio.sleep(0.05)

    work = {"STANDIN_WORK_MS": "4000"}
    filler = asyncio.create_task(keep_full())
    try:
        with world.executor("task_executor_common_e_0", **work) as first:
            await world.wait_members(1)
            ids = await _enqueue(world, "produced", docs=30)
            with world.executor("task_executor_common_e_1", **work):
                await world.wait_members(2)
                await world.wait_executed(valkey_client, ids, timeout_s=180)
                await wait_until(world.kafka_settled, 60, what="every record committed")
            records = await world.executed(valkey_client)
            first.terminate()
    finally:
        stop.set()
        await filler
        evicted = int((await store.info("stats"))["evicted_keys"])
        await store.aclose()
    assert evicted > 0, "the store never evicted"
    assert_exactly_once(ids, records)
    assert "maxmemory-policy volatile-lru evicts keys" in first.log_text()
