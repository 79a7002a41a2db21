"""The RAGFlow stand-in on its own (no ragflow_mq): it must queue and consume as RAGFlow does."""

from __future__ import annotations

import asyncio
import importlib
import json
import zlib
from pathlib import Path
from typing import Any

import pytest
import valkey.asyncio as avalkey

from sidecar.dev.local_stack import LocalStack
from tests.ragflow_support import (
    STANDIN_ROOT,
    StandinProcess,
    assert_doc_order,
    assert_exactly_once,
    executions,
    pending_count,
    progress,
    read_produced,
    standin_env,
    wait_until,
)

pytestmark = pytest.mark.timeout(300)

GROUP = "rag_flow_svr_task_broker"


def own_standin(stack: LocalStack, unique: str, **extra: str) -> tuple[str, dict[str, str]]:
    """The results key and the stand-in's environment on a test's own streams (``streams_of``)."""
    key = f"{unique}:results"
    return key, standin_env(stack, prefix=unique, results_key=key, install=False, extra=extra)


def streams_of(prefix: str) -> list[str]:
    return [f"{prefix}.te.1.common", f"{prefix}.te.0.common"]


async def produce(
    env: dict[str, str], tmp_path: Path, name: str, **kwargs: Any
) -> list[dict[str, Any]]:
    out = tmp_path / f"{name}.jsonl"
    api = StandinProcess.api(env, tmp_path, out, **kwargs).start()
    assert await api.await_exit(120) == 0, api.log_text()
    produced = read_produced(out)
    assert produced and all(line["ok"] for line in produced)
    return produced


def entry_order(entry_id: str) -> tuple[int, int]:
    ms, seq = entry_id.split("-")
    return int(ms), int(seq)


async def consumers_of(client: avalkey.Valkey, stream: str) -> set[str]:
    if not await client.exists(stream):
        return set()
    groups = await client.xinfo_groups(stream)
    if not any(g["name"] == GROUP.encode() for g in groups):
        return set()
    return {c["name"].decode() for c in await client.xinfo_consumers(stream, GROUP)}


async def test_two_executors_run_every_task_exactly_once(
    stack: LocalStack, valkey_client: avalkey.Valkey, unique: str, tmp_path: Path
) -> None:
    key, env = own_standin(stack, unique)
    streams = streams_of(unique)
    names = ["task_executor_common_hosta_0", "task_executor_common_hostb_0"]
    with (
        StandinProcess.executor(env, tmp_path, names[0], STANDIN_WORK_MS="2") as first,
        StandinProcess.executor(env, tmp_path, names[1], STANDIN_WORK_MS="2") as second,
    ):
        # Both are reading (each read registers the consumer) before anything is queued.
        async def both_reading() -> bool:
            return await consumers_of(valkey_client, streams[1]) == set(names)

        await wait_until(both_reading, 60, what="both executors reading")
        produced = await produce(env, tmp_path, "api", docs=50, tasks_per_doc=10, priority_every=5)
        assert len(produced) == 500
        assert {line["queue"] for line in produced} == set(streams)

        async def all_done() -> bool:
            return (
                len(await executions(valkey_client, key)) >= 500
                and await pending_count(valkey_client, streams, GROUP) == 0
            )

        await wait_until(all_done, 120, what="500 executions and nothing pending")
        for process in (first, second):
            assert await asyncio.to_thread(process.terminate) == 0, process.log_text()

    records = await executions(valkey_client, key)
    assert_exactly_once([line["task_id"] for line in produced], records)
    assert {r["consumer"] for r in records} == set(names)
    assert await pending_count(valkey_client, streams, GROUP) == 0
    for stream in streams:
        summary = await valkey_client.xpending(stream, GROUP)
        assert summary["pending"] == 0
    done = [p for p in await progress(valkey_client, key) if p["progress"] == 1.0]
    assert sorted(p["task_id"] for p in done) == sorted(line["task_id"] for line in produced)
    # Stream entry ids ("<ms>-<seq>"), unique per stream (the priority tells the stream).
    ids = {(r["priority"], r["msg_id"]) for r in records}
    assert len(ids) == 500 and all(entry_order(i) for _, i in ids)


async def test_priority_queue_is_taken_first(
    stack: LocalStack, valkey_client: avalkey.Valkey, unique: str, tmp_path: Path
) -> None:
    key, env = own_standin(stack, unique)
    normal = await produce(env, tmp_path, "normal", docs=2, tasks_per_doc=10)
    urgent = await produce(env, tmp_path, "urgent", docs=1, tasks_per_doc=5, priority_every=1)
    assert {line["priority"] for line in normal} == {0}
    assert {line["priority"] for line in urgent} == {1}

    with StandinProcess.executor(
        env, tmp_path, "task_executor_common_solo_0", MAX_CONCURRENT_TASKS="1"
    ) as executor:

        async def all_done() -> bool:
            return len(await executions(valkey_client, key)) >= 25

        await wait_until(all_done, 60, what="25 executions")
        assert await asyncio.to_thread(executor.terminate) == 0, executor.log_text()

    records = sorted(await executions(valkey_client, key), key=lambda r: r["t"])
    assert_exactly_once([line["task_id"] for line in normal + urgent], records)
    assert [r["task_id"] for r in records[:5]] == [line["task_id"] for line in urgent]
    assert all(r["priority"] == 0 for r in records[5:])
    assert_doc_order(records)


async def test_killed_executor_replays_its_pending_entries_on_restart(
    stack: LocalStack, valkey_client: avalkey.Valkey, unique: str, tmp_path: Path
) -> None:
    key, env = own_standin(stack, unique)
    streams = streams_of(unique)
    consumer = "task_executor_common_crashy_0"
    produced = await produce(env, tmp_path, "api", docs=4, tasks_per_doc=5)
    produced_ids = {line["task_id"] for line in produced}

    first = StandinProcess.executor(env, tmp_path, consumer, STANDIN_WORK_MS="600000").start()
    with first:

        async def five_in_hand() -> bool:
            return (
                len(await executions(valkey_client, key)) == 5
                and await pending_count(valkey_client, streams, GROUP) == 5
            )

        await wait_until(five_in_hand, 60, what="five tasks in hand")
        assert first.kill() == -9
    held = await executions(valkey_client, key)
    assert await pending_count(valkey_client, streams, GROUP) == 5
    pending = await valkey_client.xpending_range(streams[1], GROUP, "-", "+", 10)
    assert {p["consumer"].decode() for p in pending} == {consumer}

    with StandinProcess.executor(env, tmp_path, consumer, STANDIN_WORK_MS="0") as second:

        async def all_done() -> bool:
            executed = {r["task_id"] for r in await executions(valkey_client, key)}
            return (
                executed >= produced_ids and await pending_count(valkey_client, streams, GROUP) == 0
            )

        await wait_until(all_done, 60, what="every task executed and nothing pending")
        assert await asyncio.to_thread(second.terminate) == 0, second.log_text()

    records = await executions(valkey_client, key)
    assert {r["task_id"] for r in records} == produced_ids
    replayed = sorted((r for r in records if r["pid"] == second.pid), key=lambda r: r["t"])
    # The pending entries come back first, with their original stream ids, then the rest once.
    assert [(r["task_id"], r["msg_id"]) for r in replayed[:5]] == [
        (r["task_id"], r["msg_id"]) for r in sorted(held, key=lambda r: entry_order(r["msg_id"]))
    ]
    assert_exactly_once(produced_ids, replayed)


async def test_queue_product_writes_ragflows_exact_envelope(
    stack: LocalStack,
    valkey_client: avalkey.Valkey,
    unique: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("REDIS_URL", stack.valkey.url)
    monkeypatch.setenv("STANDIN_QUEUE_PREFIX", unique)
    monkeypatch.syspath_prepend(str(STANDIN_ROOT))
    redis_conn = importlib.import_module("rag.utils.redis_conn")
    ragflow_api = importlib.import_module("ragflow_api")
    conn = redis_conn.REDIS_CONN
    assert conn is redis_conn.RedisDB()  # RAGFlow's singleton: one per process

    task = ragflow_api.build_tasks("doc-é", 1, 0)[0] | {"name": "résumé 文档.pdf"}
    stream = f"{unique}.te.0.common"
    assert conn.queue_product(stream, message=task) is True
    [(entry_id, fields)] = await valkey_client.xrange(stream)
    assert fields == {b"message": json.dumps(task).encode()}
    assert b"\\u00e9" in fields[b"message"]  # ensure_ascii, as json.dumps' default

    # A missing stream: the group is created at 0 with MKSTREAM and nothing is handed out.
    priority = f"{unique}.te.1.common"
    assert conn.queue_consumer(priority, GROUP, "task_executor_common_x_0") is None
    assert await valkey_client.exists(priority) == 1
    msg = conn.queue_consumer(stream, GROUP, "task_executor_common_x_0")
    assert msg is not None
    assert msg.get_message() == task
    assert msg.get_msg_id() == entry_id.decode()
    info = conn.queue_info(stream, GROUP)
    assert info is not None and info["pending"] == 1
    assert msg.ack() is True
    assert conn.queue_info(stream, GROUP)["pending"] == 0
    assert conn.queue_info(stream, "no-such-group") is None

    queued = ragflow_api.queue_tasks("doc-2", 3, 1)
    entries = await valkey_client.xrange(priority)
    assert [json.loads(f[b"message"]) for _, f in entries] == queued
    assert [t["from_page"] for t in queued] == [0, 12, 24]


@pytest.mark.parametrize(("mode", "left_pending"), [("graceful", 0), ("ragflow", 5)])
async def test_sigterm_with_tasks_in_hand(
    stack: LocalStack,
    valkey_client: avalkey.Valkey,
    unique: str,
    tmp_path: Path,
    mode: str,
    left_pending: int,
) -> None:
    """Graceful: stop taking work, finish and ack what is in hand, exit 0. ``ragflow``: as
    RAGFlow's handler (exit 0 after 1 s), the tasks in hand stay pending."""
    key, env = own_standin(stack, unique)
    streams = streams_of(unique)
    produced = await produce(env, tmp_path, "api", docs=2, tasks_per_doc=5)
    work = {"graceful": "1500", "ragflow": "600000"}[mode]
    extra = {"STANDIN_WORK_MS": work, "STANDIN_STOP_MODE": mode}
    with StandinProcess.executor(env, tmp_path, "task_executor_common_stop_0", **extra) as ex:

        async def five_in_hand() -> bool:
            return len(await executions(valkey_client, key)) == 5

        await wait_until(five_in_hand, 60, what="five tasks in hand")
        assert await asyncio.to_thread(ex.terminate, 30) == 0, ex.log_text()

    assert len(await executions(valkey_client, key)) == 5  # nothing new taken after SIGTERM
    assert await pending_count(valkey_client, streams, GROUP) == left_pending
    done = [p for p in await progress(valkey_client, key) if p["progress"] == 1.0]
    assert len(done) == 5 - left_pending
    assert len(produced) == 10


async def test_failures_are_acked_and_reported_through_set_progress(
    stack: LocalStack, valkey_client: avalkey.Valkey, unique: str, tmp_path: Path
) -> None:
    key, env = own_standin(stack, unique, STANDIN_FAIL_PERCENT="50")
    streams = streams_of(unique)
    produced = await produce(env, tmp_path, "api", docs=4, tasks_per_doc=10)
    ids = [line["task_id"] for line in produced]
    failing = {i for i in ids if zlib.crc32(i.encode()) % 100 < 50}
    assert 0 < len(failing) < len(ids)
    with StandinProcess.executor(env, tmp_path, "task_executor_common_faulty_0") as executor:

        async def all_reported() -> bool:
            return len(await progress(valkey_client, key)) >= len(ids)

        await wait_until(all_reported, 60, what="a progress report per task")
        assert await asyncio.to_thread(executor.terminate) == 0, executor.log_text()

    assert_exactly_once(ids, await executions(valkey_client, key))
    reports = await progress(valkey_client, key)
    assert {r["task_id"] for r in reports if r["progress"] == -1} == failing
    assert {r["task_id"] for r in reports if r["progress"] == 1.0} == set(ids) - failing
    assert all("[ERROR]" in r["progress_msg"] for r in reports if r["progress"] == -1)
    assert await pending_count(valkey_client, streams, GROUP) == 0  # failed tasks are acked too


async def test_killing_the_restart_loop_kills_its_running_executor(
    stack: LocalStack, unique: str, tmp_path: Path
) -> None:
    """A test that fails kills its stand-ins with -9: under the entrypoint's loop, the running
    executor goes with it instead of running on, orphaned, for the rest of the session."""
    env = standin_env(stack, prefix=unique, results_key=f"{unique}:results")
    loop = StandinProcess.supervised_executor(env, tmp_path, "task_executor_common_z_0").start()
    children: list[int] = []

    def running() -> bool:
        child = loop.executor_pid()
        children[:] = [child] if child else []
        return bool(child)

    await wait_until(running, 30, what="the executor under the loop")
    loop.kill()

    def gone() -> bool:
        try:
            state = Path(f"/proc/{children[0]}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        return state in ("Z", "X")  # dead; reaped by whoever adopted it

    await wait_until(gone, 10, what=f"executor {children[0]} gone")
