"""The worker observer against the real Valkey: RAGFlow's group is watched, never touched."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import valkey.asyncio as avalkey
from valkey import exceptions as valkey_errors

from sidecar.app.wiring import ValkeyClient, observer_client
from sidecar.config import Secret, Settings
from sidecar.observer import COMMANDS_USED, WorkerDelivery, WorkerObserver
from tests.mirror_support import RAGFLOW_GROUP, group_state, ragflow_tasks

CONSUMER = "task_executor_x_0"
OTHER = "task_executor_y_0"

MakeObserver = Callable[..., Awaitable[WorkerObserver]]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def ms_of(entry_id: str) -> int:
    return int(entry_id.partition("-")[0])


async def enqueue(client: avalkey.Valkey, stream: str, n: int) -> list[str]:
    """``n`` tasks XADDed as RAGFlow's queue_product does."""
    return [
        (await client.xadd(stream, {"message": json.dumps(task)})).decode()
        for task in ragflow_tasks(n)
    ]


async def ragflow_stream(client: avalkey.Valkey, stream: str, n: int) -> list[str]:
    """A stream of ``n`` tasks with RAGFlow's group, created at 0 as its executor does."""
    ids = await enqueue(client, stream, n)
    await client.xgroup_create(stream, RAGFLOW_GROUP, id="0", mkstream=True)
    return ids


async def deliver(client: avalkey.Valkey, stream: str, consumer: str = CONSUMER) -> str:
    """One XREADGROUP COUNT 1 in RAGFlow's group, as its collect() does."""
    reply = await client.xreadgroup(RAGFLOW_GROUP, consumer, {stream: ">"}, count=1, block=5)
    assert reply, "nothing was delivered"
    return str(reply[0][1][0][0].decode())


async def ack(client: avalkey.Valkey, stream: str, entry_id: str) -> None:
    assert await client.xack(stream, RAGFLOW_GROUP, entry_id) == 1


def ids_of(records: list[WorkerDelivery]) -> list[str]:
    return [r.entry_id for r in records]


@pytest.fixture
async def observers(settings: Settings) -> AsyncIterator[MakeObserver]:
    """Started observers on the test's streams; stopped afterwards."""
    made: list[WorkerObserver] = []
    clients: list[ValkeyClient] = []

    async def make(streams: list[str], **kwargs: Any) -> WorkerObserver:
        kwargs.setdefault("interval_ms", 10)
        redis = kwargs.pop("redis", settings.redis)
        if "client" not in kwargs:
            clients.append(observer_client(redis))
            await clients[-1].start()
            kwargs["client"] = clients[-1].client
        observer = WorkerObserver(redis, streams, **kwargs)
        await observer.start()
        made.append(observer)
        return observer

    yield make
    for observer in made:
        await observer.stop()
    for client in clients:
        await client.stop()


async def test_a_ragflow_worker_s_entries_are_each_reported_once_with_consumer_and_times(
    valkey_client: avalkey.Valkey, unique: str, observers: MakeObserver
) -> None:
    ids = await ragflow_stream(valkey_client, unique, 6)
    called: list[WorkerDelivery] = []

    async def on_delivery(record: WorkerDelivery) -> None:
        called.append(record)

    observer = await observers([unique], on_delivery=on_delivery)
    seen_pending: set[str] = set()
    seen = asyncio.Condition()
    timing: dict[str, tuple[int, int, int]] = {}  # asked, got, ack sent (this host's ms)

    async def worker() -> None:
        for _ in ids:
            asked = now_ms()
            entry_id = await deliver(valkey_client, unique)
            got = now_ms()
            # Hold the task until the observer has seen it in flight, as a real task would.
            async with seen:
                await asyncio.wait_for(seen.wait_for(lambda e=entry_id: e in seen_pending), 10)
            acking = now_ms()
            await ack(valkey_client, unique, entry_id)
            timing[entry_id] = (asked, got, acking)

    working = asyncio.create_task(worker())
    reported: list[WorkerDelivery] = []
    deadline = time.monotonic() + 30
    while len(reported) < len(ids) or not working.done():
        assert time.monotonic() < deadline, f"reported {ids_of(reported)} of {ids}"
        reported += await observer.poll_once()
        async with seen:
            seen_pending.update(p.entry_id for p in observer.pending())
            seen.notify_all()
    await working

    assert ids_of(reported) == ids  # each once, in the order RAGFlow acked them
    assert called == reported
    assert observer.pending() == []
    for record in reported:
        asked, got, acking = timing[record.entry_id]
        assert record.stream == unique
        assert record.consumer == CONSUMER
        assert record.deliveries == 1
        assert record.exact
        assert record.enqueued_ms == ms_of(record.entry_id)
        assert record.delivered_ms is not None and record.acked_ms is not None
        assert record.acked_ms >= record.delivered_ms >= record.enqueued_ms
        # Delivery time comes from XPENDING's idle: within the worker's read, give or take.
        assert asked - 2 <= record.delivered_ms <= got + 100
        assert record.acked_ms >= acking  # seen acked only after the XACK was sent
        assert record.queue_wait_ms == record.delivered_ms - record.enqueued_ms
        assert record.processing_ms == record.acked_ms - record.delivered_ms
        assert record.processing_ms >= acking - got - 100
    assert await observer.poll_once() == []


async def test_entries_delivered_and_acked_between_two_rounds_are_inferred_once(
    valkey_client: avalkey.Valkey, unique: str, observers: MakeObserver
) -> None:
    ids = await ragflow_stream(valkey_client, unique, 4)
    observer = await observers([unique])
    before = now_ms()
    for _ in range(3):
        await ack(valkey_client, unique, await deliver(valkey_client, unique))
    held = await deliver(valkey_client, unique)

    reported = await observer.poll_once()
    after = now_ms()
    assert ids_of(reported) == ids[:3]
    for record in reported:
        assert not record.exact
        assert record.consumer is None
        assert record.deliveries == 1
        assert record.delivered_ms == record.acked_ms
        assert record.acked_ms is not None and before <= record.acked_ms <= after
        assert record.queue_wait_ms == record.acked_ms - ms_of(record.entry_id)
        assert record.processing_ms is None  # only known to be under one interval
    assert [(p.entry_id, p.consumer) for p in observer.pending()] == [(held, CONSUMER)]
    assert await observer.poll_once() == []


async def test_an_entry_held_pending_is_tracked_and_reported_only_once_acked(
    valkey_client: avalkey.Valkey, unique: str, observers: MakeObserver
) -> None:
    await valkey_client.xgroup_create(unique, RAGFLOW_GROUP, id="0", mkstream=True)
    observer = await observers([unique])
    (entry_id,) = await enqueue(valkey_client, unique, 1)
    delivering = now_ms()
    await deliver(valkey_client, unique, OTHER)
    delivered = now_ms()
    await asyncio.sleep(0.05)  # time passing is the point: the delivery time must not drift

    for _ in range(3):
        assert await observer.poll_once() == []
    (pending,) = observer.pending()
    assert pending.entry_id == entry_id
    assert pending.consumer == OTHER
    assert pending.deliveries == 1
    assert pending.acked_ms is None and pending.processing_ms is None
    assert pending.delivered_ms is not None
    assert delivering - 2 <= pending.delivered_ms <= delivered + 20  # from idle, not first sight
    assert pending.queue_wait_ms is not None and pending.queue_wait_ms >= 0

    acking = now_ms()
    await ack(valkey_client, unique, entry_id)
    (record,) = await observer.poll_once()
    assert record.entry_id == entry_id and record.consumer == OTHER and record.exact
    assert record.delivered_ms == pending.delivered_ms
    assert record.acked_ms is not None and record.acked_ms >= acking
    assert observer.pending() == []
    assert await observer.poll_once() == []


async def test_redeliveries_by_xclaim_and_replay_are_counted(
    valkey_client: avalkey.Valkey, unique: str, observers: MakeObserver
) -> None:
    first, second = await ragflow_stream(valkey_client, unique, 2)
    observer = await observers([unique])
    await deliver(valkey_client, unique, CONSUMER)
    assert await observer.poll_once() == []
    (seen,) = observer.pending()
    assert (seen.consumer, seen.deliveries) == (CONSUMER, 1)

    # RAGFlow itself never claims; here the test plays an operator moving the task over.
    await valkey_client.xclaim(unique, RAGFLOW_GROUP, OTHER, min_idle_time=0, message_ids=[first])
    assert await observer.poll_once() == []
    (claimed,) = observer.pending()
    assert (claimed.consumer, claimed.deliveries) == (OTHER, 2)
    assert claimed.delivered_ms == seen.delivered_ms  # the first delivery stays the start

    # A restarted executor replays its own pending entries from id 0: a third delivery.
    await valkey_client.xreadgroup(RAGFLOW_GROUP, OTHER, {unique: "0"}, count=1)
    await observer.poll_once()
    assert observer.pending()[0].deliveries == 3
    await ack(valkey_client, unique, first)
    (record,) = await observer.poll_once()
    assert (record.entry_id, record.consumer, record.deliveries) == (first, OTHER, 3)

    # Delivered and claimed before the observer looked: first seen with two deliveries.
    await deliver(valkey_client, unique, CONSUMER)
    await valkey_client.xclaim(unique, RAGFLOW_GROUP, OTHER, min_idle_time=0, message_ids=[second])
    await observer.poll_once()
    await ack(valkey_client, unique, second)
    (record,) = await observer.poll_once()
    assert (record.entry_id, record.consumer, record.deliveries) == (second, OTHER, 2)
    assert record.exact


async def test_the_baseline_skips_earlier_deliveries_but_reports_the_ack_of_pending_ones(
    valkey_client: avalkey.Valkey, unique: str, observers: MakeObserver
) -> None:
    ids = await ragflow_stream(valkey_client, unique, 4)
    await ack(valkey_client, unique, await deliver(valkey_client, unique))
    await deliver(valkey_client, unique, OTHER)
    starting = now_ms()

    observer = await observers([unique])
    (pending,) = observer.pending()
    assert (pending.entry_id, pending.consumer) == (ids[1], OTHER)
    assert pending.delivered_ms is not None and pending.delivered_ms <= starting + 2
    assert await observer.poll_once() == []

    await ack(valkey_client, unique, await deliver(valkey_client, unique))
    assert ids_of(await observer.poll_once()) == [ids[2]]
    await ack(valkey_client, unique, ids[1])
    (record,) = await observer.poll_once()
    assert (record.entry_id, record.consumer, record.exact) == (ids[1], OTHER, True)
    assert record.delivered_ms == pending.delivered_ms


async def state_of(client: avalkey.Valkey, stream: str) -> dict[str, Any]:
    """RAGFlow's group as XINFO GROUPS, XINFO CONSUMERS and XPENDING show it (idle aside)."""
    state = await group_state(client, stream, RAGFLOW_GROUP)
    state["summary"] = await client.xpending(stream, RAGFLOW_GROUP)
    state["consumer_pending"] = sorted(
        (c["name"], c["pending"]) for c in await client.xinfo_consumers(stream, RAGFLOW_GROUP)
    )
    return state


async def test_the_observer_changes_nothing_in_ragflow_s_group_and_needs_only_its_acl(
    settings: Settings, valkey_client: avalkey.Valkey, unique: str, observers: MakeObserver
) -> None:
    high, low = f"{unique}.te.1.common", f"{unique}.te.0.common"
    high_ids = await ragflow_stream(valkey_client, high, 3)
    low_ids = await ragflow_stream(valkey_client, low, 12)
    for _ in range(5):
        await ack(valkey_client, low, await deliver(valkey_client, low))
    await deliver(valkey_client, low, CONSUMER)
    await deliver(valkey_client, low, OTHER)
    await valkey_client.xclaim(low, RAGFLOW_GROUP, OTHER, min_idle_time=0, message_ids=[low_ids[5]])
    await deliver(valkey_client, high, CONSUMER)
    before = {s: await state_of(valkey_client, s) for s in (high, low)}
    assert before[low]["group"]["entries-read"] == 7
    assert before[low]["summary"]["pending"] == 2

    # A user that may run exactly COMMANDS_USED on these keys and nothing else.
    user, password = f"observer-{unique}", uuid.uuid4().hex
    rules = ["+" + command.lower().replace(" ", "|") for command in COMMANDS_USED]
    await valkey_client.execute_command(
        "ACL", "SETUSER", user, "reset", "on", f">{password}", f"~{unique}*", "-@all", *rules
    )
    try:
        limited = dataclasses.replace(settings.redis, username=user, password=Secret(password))
        forbidden = avalkey.Valkey(**limited.client_kwargs())
        with pytest.raises(valkey_errors.NoPermissionError):
            await forbidden.xreadgroup(RAGFLOW_GROUP, "probe", {low: ">"}, count=1)
        await forbidden.aclose()

        observer = await observers([high, low], redis=limited)
        for _ in range(3):
            assert await observer.poll_once() == []
        stop = asyncio.Event()
        running = asyncio.create_task(observer.run(stop))
        for _ in range(3):
            await observer.poll_once()  # run() and these take turns on the round lock
        stop.set()
        await asyncio.wait_for(running, 5)
        assert [(p.stream, p.entry_id, p.consumer, p.deliveries) for p in observer.pending()] == [
            (high, high_ids[0], CONSUMER, 1), (low, low_ids[5], OTHER, 2), (low, low_ids[6], OTHER, 1)
        ]  # fmt: skip
        await observer.stop()
    finally:
        await valkey_client.execute_command("ACL", "DELUSER", user)

    after = {s: await state_of(valkey_client, s) for s in (high, low)}
    assert after == before


async def test_missing_streams_and_groups_are_skipped_quietly_then_picked_up(
    valkey_client: avalkey.Valkey,
    unique: str,
    observers: MakeObserver,
    caplog: pytest.LogCaptureFixture,
) -> None:
    missing, no_group, other_group = f"{unique}.missing", f"{unique}.nogroup", f"{unique}.other"
    await enqueue(valkey_client, no_group, 2)
    await enqueue(valkey_client, other_group, 2)
    await valkey_client.xgroup_create(other_group, "someone_else", id="0")
    await valkey_client.xreadgroup("someone_else", "c", {other_group: ">"}, count=2)

    caplog.set_level(logging.INFO, logger="sidecar.observer.observer")
    observer = await observers([missing, no_group, other_group])
    for _ in range(3):
        assert await observer.poll_once() == []
    assert observer.pending() == []
    absent = [r for r in caplog.records if "does not exist" in r.getMessage()]
    assert sorted(r.getMessage().split()[1] for r in absent) == sorted(
        [missing, no_group, other_group]
    )  # once each, at INFO, however many rounds
    assert {r.levelno for r in absent} == {logging.INFO}

    # RAGFlow creates its group at 0 later: the first sight is a baseline, then it is watched.
    await valkey_client.xgroup_create(no_group, RAGFLOW_GROUP, id="0")
    first = await deliver(valkey_client, no_group)
    await ack(valkey_client, no_group, first)
    assert await observer.poll_once() == []
    second = await deliver(valkey_client, no_group)
    await ack(valkey_client, no_group, second)
    assert ids_of(await observer.poll_once()) == [second]


async def test_a_vanished_or_reset_group_drops_what_it_tracked_without_reporting_acks(
    valkey_client: avalkey.Valkey,
    unique: str,
    observers: MakeObserver,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ids = await ragflow_stream(valkey_client, unique, 3)
    observer = await observers([unique])
    await deliver(valkey_client, unique)
    await observer.poll_once()
    assert len(observer.pending()) == 1

    caplog.set_level(logging.INFO, logger="sidecar.observer.observer")
    await valkey_client.xgroup_destroy(unique, RAGFLOW_GROUP)
    assert await observer.poll_once() == []
    assert observer.pending() == []
    assert any("vanished" in r.getMessage() for r in caplog.records)

    # RAGFlow's executor recreates it at 0 and replays the history; replays are deliveries.
    await valkey_client.xgroup_create(unique, RAGFLOW_GROUP, id="0")
    assert await observer.poll_once() == []
    await ack(valkey_client, unique, await deliver(valkey_client, unique))
    assert ids_of(await observer.poll_once()) == [ids[0]]

    # SETID back to the start: last-delivered-id goes backwards, tracked entries are dropped.
    await deliver(valkey_client, unique)
    await observer.poll_once()
    assert ids_of(observer.pending()) == [ids[1]]
    await valkey_client.xgroup_setid(unique, RAGFLOW_GROUP, id="0")
    assert await observer.poll_once() == []
    assert ids_of(observer.pending()) == [ids[1]]  # still pending: baselined again
    assert any("went back" in r.getMessage() for r in caplog.records)


async def test_a_pending_list_over_the_cap_is_covered_over_several_rounds(
    valkey_client: avalkey.Valkey, unique: str, observers: MakeObserver
) -> None:
    ids = await ragflow_stream(valkey_client, unique, 14)
    for _ in range(7):  # a dead worker's entries, never acked
        await deliver(valkey_client, unique, "dead_worker")
    observer = await observers([unique], page_size=2, max_per_round=3)
    assert ids_of(observer.pending()) == ids[:3]
    assert await observer.poll_once() == []
    assert ids_of(observer.pending()) == ids[:6]
    assert await observer.poll_once() == []
    assert ids_of(observer.pending()) == ids[:7]

    await ack(valkey_client, unique, ids[0])
    await ack(valkey_client, unique, ids[4])
    # This round scans ids[1..3] only: ids[4] is out of sight and must not count as acked yet.
    assert ids_of(await observer.poll_once()) == [ids[0]]
    assert ids_of(await observer.poll_once()) == [ids[4]]

    # New deliveries beyond the scanned part are checked by a pending scan of their own.
    held = await deliver(valkey_client, unique, CONSUMER)
    done = await deliver(valkey_client, unique, CONSUMER)
    await ack(valkey_client, unique, done)
    reported = await observer.poll_once()
    assert [(r.entry_id, r.exact) for r in reported] == [(done, False)]
    assert held in ids_of(observer.pending())

    # More deliveries in one interval than the cap: the rest come next round, each once.
    burst = ids[9:14]
    await ack(valkey_client, unique, held)
    for _ in burst:
        await ack(valkey_client, unique, await deliver(valkey_client, unique))
    assert ids_of(await observer.poll_once()) == [held, *burst[:3]]
    assert ids_of(await observer.poll_once()) == burst[3:]
    assert await observer.poll_once() == []


async def test_an_entry_reported_ahead_of_the_xrange_cursor_is_not_reported_again(
    settings: Settings, unique: str, observers: MakeObserver, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = avalkey.Valkey(**settings.redis.client_kwargs())
    try:
        e0, e1, e2, e3, e4, e5 = await ragflow_stream(client, unique, 6)
        await deliver(client, unique, "holder")
        observer = await observers([unique], client=client, page_size=2, max_per_round=3)
        original = client.xpending_range
        race = {"armed": True}

        async def racing_xpending(*args: Any, **kwargs: Any) -> Any:
            # RAGFlow delivers between this round's XINFO GROUPS and its XPENDING.
            if race.pop("armed", False):
                for _ in range(4):
                    await ack(client, unique, await deliver(client, unique))
                await deliver(client, unique)
            return await original(*args, **kwargs)

        monkeypatch.setattr(client, "xpending_range", racing_xpending)
        assert await observer.poll_once() == []
        assert ids_of(observer.pending()) == [e0, e5]
        await ack(client, unique, e5)
        # XRANGE stops at the cap (e1..e3) while e5 is seen acked in the same round.
        assert ids_of(await observer.poll_once()) == [e1, e2, e3, e5]
        assert ids_of(await observer.poll_once()) == [e4]  # e5 reached by XRANGE: not again
        assert await observer.poll_once() == []
        assert ids_of(observer.pending()) == [e0]
    finally:
        await client.aclose()


async def test_run_reports_through_on_delivery_survives_a_blip_and_stops_promptly(
    settings: Settings,
    unique: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = avalkey.Valkey(**settings.redis.client_kwargs())
    ids = await ragflow_stream(client, unique, 3)
    got: list[WorkerDelivery] = []
    all_in = asyncio.Event()

    async def on_delivery(record: WorkerDelivery) -> None:
        got.append(record)
        if len(got) == len(ids):
            all_in.set()

    original = client.xinfo_groups
    calls = {"n": 0}
    hang, stuck = asyncio.Event(), asyncio.Event()

    async def flaky_xinfo_groups(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] in (2, 3):  # the first two rounds after the baseline
            raise valkey_errors.ConnectionError("connection reset by peer")
        if hang.is_set():
            stuck.set()
            await asyncio.Event().wait()  # a server that stopped answering
        return await original(*args, **kwargs)

    monkeypatch.setattr(client, "xinfo_groups", flaky_xinfo_groups)
    caplog.set_level(logging.DEBUG, logger="sidecar.observer.observer")
    observer = WorkerObserver(
        settings.redis, [unique], interval_ms=10, on_delivery=on_delivery, client=client
    )
    try:
        async with observer:
            for _ in ids:
                await ack(client, unique, await deliver(client, unique))
            stop = asyncio.Event()
            running = asyncio.create_task(observer.run(stop))
            await asyncio.wait_for(all_in.wait(), 10)
            assert sorted(ids_of(got)) == ids
            mine = [r for r in caplog.records if r.name == "sidecar.observer.observer"]
            warnings = [r for r in mine if r.levelno == logging.WARNING]
            assert len(warnings) == 1 and "failed" in warnings[0].getMessage()
            assert any("still fails" in r.getMessage() for r in mine)
            assert any("works again" in r.getMessage() for r in mine)

            hang.set()
            await asyncio.wait_for(stuck.wait(), 5)  # a round now waits on a silent server
            stop.set()
            await asyncio.wait_for(running, 2)
        assert not observer.started
    finally:
        await client.aclose()


def test_commands_used_are_read_only_and_never_touch_the_group() -> None:
    assert set(COMMANDS_USED) == {"XINFO GROUPS", "XPENDING", "XRANGE", "SELECT"}
    forbidden = {"XREADGROUP", "XACK", "XCLAIM", "XAUTOCLAIM", "XGROUP", "XDEL", "XTRIM"}
    assert not {c.split()[0] for c in COMMANDS_USED} & forbidden
