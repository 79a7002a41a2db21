"""Shadow consumer, join and verdicts against real Valkey and Kafka: each verdict kind from a
real scenario, the noise baseline, and a restart that loses and repeats no verdict."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import pytest
import valkey.asyncio as avalkey

from ragflow_mq.producer import served_headers
from sidecar.config import Settings
from sidecar.config.routing import RouteTable
from sidecar.dev.faults import Fault, FaultInjector
from sidecar.transport import KafkaProducer
from sidecar.transport.message import QueueMessage, encode_task
from sidecar.transport.topics import DLQ_TOPIC, PARSE_TOPIC, init_topics
from tests.mirror_support import (
    RAGFLOW_GROUP,
    group_state,
    ragflow_tasks,
    ragflow_worker,
    read_mirrored,
)
from tests.shadow_handlers import EXPLODE_MARKER
from tests.shadow_support import read_verdicts, running_sidecar, sidecar_settings

pytestmark = pytest.mark.kafka39


async def enqueue(client: avalkey.Valkey, stream: str, tasks: list[dict[str, object]]) -> list[str]:
    ids = []
    for task in tasks:
        entry_id = await client.xadd(stream, {"message": encode_task(task)})
        ids.append(entry_id.decode())
    return ids


def finals(verdicts: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """The final verdict of each (stream, entry id); fails if any entry has two."""
    by_entry: dict[tuple[str, str], dict[str, Any]] = {}
    for verdict in verdicts:
        if verdict["verdict"] == "duplicate":
            continue
        entry = (verdict["stream"], verdict["entry_id"])
        assert entry not in by_entry, f"two final verdicts for {verdict}"
        by_entry[entry] = verdict
    return by_entry


async def test_every_verdict_kind_from_a_real_scenario(
    settings: Settings, valkey_client: avalkey.Valkey, unique: str
) -> None:
    await init_topics(settings.kafka)
    high, low = f"{unique}.1", f"{unique}.0"
    tasks = ragflow_tasks(30)
    tasks[7]["digest"] = EXPLODE_MARKER
    high_ids = await enqueue(valkey_client, high, tasks[:5])
    low_ids = await enqueue(valkey_client, low, tasks[5:])
    for stream in (high, low):
        await valkey_client.xgroup_create(stream, RAGFLOW_GROUP, id="0")
    # tasks[5] (a parse task) has its Kafka copy changed, tasks[10] dropped, tasks[15] sent twice.
    changed, dropped, doubled, exploded = ((low, low_ids[n]) for n in (0, 5, 10, 2))
    plan: dict[tuple[str, str], Fault] = {changed: "change", dropped: "drop", doubled: "duplicate"}

    def choose(message: QueueMessage) -> Fault | None:
        return plan.get((message.topic, message.id))

    injector = FaultInjector(choose)
    config = sidecar_settings(
        settings, [high, low], unique, SHADOW_HANDLER="tests.shadow_handlers:explode_on_marker"
    )
    async with running_sidecar(config, transform=injector) as sidecar:
        # Kafka has a task that Redis never had.
        async with KafkaProducer(settings.kafka) as producer:
            await producer.send(
                PARSE_TOPIC,
                encode_task(ragflow_tasks(1)[0]),
                key=b"orphan",
                headers=[("x-redis-stream", low.encode()), ("x-redis-id", b"1-0")],
            )
        workers = [ragflow_worker(valkey_client, high, 5), ragflow_worker(valkey_client, low, 25)]
        handled = await asyncio.gather(*workers)
        verdicts = await read_verdicts(settings, {high, low}, expected=32)
        assert sidecar.shadow is not None and sidecar.shadow.stats.retries == 2

    assert [len(h) for h in handled] == [5, 25]
    by_entry = finals(verdicts)
    kinds = Counter(v["verdict"] for v in by_entry.values())
    assert kinds == {
        "match": 27,
        "mismatch": 1,
        "missing_in_kafka": 1,
        "missing_in_redis": 1,
        "error": 1,
    }, kinds
    expected = {(high, i) for i in high_ids} | {(low, i) for i in low_ids} | {(low, "1-0")}
    assert set(by_entry) == expected
    assert by_entry[dropped]["verdict"] == "missing_in_kafka"
    assert by_entry[low, "1-0"]["verdict"] == "missing_in_redis"
    assert by_entry[exploded]["verdict"] == "error"
    assert "cannot handle task" in str(by_entry[exploded]["error"])
    mismatch = by_entry[changed]
    assert mismatch["verdict"] == "mismatch"
    paths = {d["path"] for d in mismatch["differences"]}
    assert injector.changed_fields[changed] == "to_page" and "to_page" in paths, mismatch
    assert mismatch["comparators"]["payload"] >= 1
    duplicates = [v for v in verdicts if v["verdict"] == "duplicate"]
    assert [(d["stream"], d["entry_id"]) for d in duplicates] == [doubled]
    assert by_entry[doubled]["verdict"] == "match"
    assert len({v["verdict_id"] for v in verdicts}) == len(verdicts)
    for verdict in by_entry.values():
        if verdict["verdict"] == "match":
            assert verdict["redis_run_digest"] == verdict["kafka_run_digest"] is not None
    # The failing task went to the DLQ after its three attempts, with its bytes.
    dead = [m for m in await read_mirrored(settings, {low}, 1) if m.topic == DLQ_TOPIC]
    assert len(dead) == 1
    assert dead[0].headers["x-error"] == b"handler_failed"
    assert dead[0].headers["x-retry-count"] == b"3" and dead[0].headers["x-stage"] == b"shadow"
    assert json.loads(dead[0].value or b"")["digest"] == EXPLODE_MARKER


async def test_noise_baseline_turns_volatile_fields_into_noise(
    settings: Settings, valkey_client: avalkey.Valkey, unique: str
) -> None:
    await init_topics(settings.kafka)
    stream = f"{unique}.0"
    ids = await enqueue(valkey_client, stream, ragflow_tasks(10))
    noisy = {"SHADOW_HANDLER": "tests.shadow_handlers:noisy"}
    with_baseline = sidecar_settings(settings, [stream], unique, SHADOW_NOISE_RUNS="2", **noisy)
    async with running_sidecar(with_baseline):
        verdicts = finals(await read_verdicts(settings, {stream}, expected=10))
    assert set(verdicts) == {(stream, i) for i in ids}
    assert {v["verdict"] for v in verdicts.values()} == {"match"}
    for verdict in verdicts.values():
        assert verdict["noise"]["count"] == 2
        assert verdict["noise"]["paths"] == ["finished_at", "run_id"]

    # Without the baseline the same handler is a mismatch on exactly those two fields.
    other = f"{unique}.b"
    await enqueue(valkey_client, other, ragflow_tasks(3))
    without = sidecar_settings(settings, [other], unique + "b", **noisy)
    async with running_sidecar(without):
        plain = finals(await read_verdicts(settings, {other}, expected=3))
    assert {v["verdict"] for v in plain.values()} == {"mismatch"}
    for verdict in plain.values():
        paths = {d["path"] for d in verdict["differences"]}
        assert paths == {"finished_at", "run_id"}


async def test_restart_mid_run_loses_and_repeats_no_verdict(
    settings: Settings, valkey_client: avalkey.Valkey, unique: str
) -> None:
    await init_topics(settings.kafka)
    stream = f"{unique}.0"
    await valkey_client.xadd(stream, {"message": encode_task(ragflow_tasks(1)[0])})
    await valkey_client.xgroup_create(stream, RAGFLOW_GROUP, id="0")
    before = await group_state(valkey_client, stream, RAGFLOW_GROUP)
    config = sidecar_settings(settings, [stream], unique, MIRROR_BATCH="20")
    ids: list[str] = []
    async with running_sidecar(config) as sidecar:
        ids += await enqueue(valkey_client, stream, ragflow_tasks(300))
        # Stop while work is in flight: some verdicts published, others not yet.
        while sum(sidecar.judge.stats.verdicts.values()) < 50:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    first_run = sum(sidecar.judge.stats.verdicts.values())
    ids += await enqueue(valkey_client, stream, ragflow_tasks(100))
    async with running_sidecar(config):
        verdicts = await read_verdicts(settings, {stream}, expected=401)
    by_entry = finals(verdicts)
    assert len(by_entry) == 401 and {v["verdict"] for v in by_entry.values()} == {"match"}
    assert len({v["verdict_id"] for v in verdicts}) == len(verdicts)
    assert first_run < 401
    # RAGFlow's group never saw the sidecar (its lag grew by the 400 entries added, no more).
    after = await group_state(valkey_client, stream, RAGFLOW_GROUP)
    assert after["group"].pop("lag") == before["group"].pop("lag") + 400
    assert after == before


async def test_a_served_record_is_skipped_and_gets_no_verdict(
    settings: Settings, valkey_client: avalkey.Valkey, unique: str
) -> None:
    await init_topics(settings.kafka)
    stream = f"{unique}.0"
    config = sidecar_settings(settings, [stream], unique)
    served_task, redis_task = ragflow_tasks(2)
    route = RouteTable().route(served_task, 0)
    async with running_sidecar(config) as sidecar:
        assert sidecar.shadow is not None
        # RAGFlow's own task on Kafka (MQ_BACKEND=split): no stream entry to compare it with.
        async with KafkaProducer(settings.kafka) as producer:
            served = await producer.send(
                route.topic,
                encode_task(served_task),
                key=route.key,
                headers=served_headers(stream, served_task, route),
            )
        [entry_id] = await enqueue(valkey_client, stream, [redis_task])
        for _ in range(600):
            if sidecar.shadow.stats.skipped_served:
                break
            await asyncio.sleep(0.05)
        # Past the compare timeout (3 s): a record the shadow ran would be missing_in_redis.
        await asyncio.sleep(4)
        served_ref = (f"kafka:{served.destination}", f"{served.partition}-{served.offset}")
        verdicts = finals(await read_verdicts(settings, {stream, served_ref[0]}, expected=1))
        assert sidecar.shadow.stats.skipped_served == 1
    assert served_ref not in verdicts
    assert verdicts[stream, entry_id]["verdict"] == "match"
