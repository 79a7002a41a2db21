"""The autopilot's evidence source reads only what is new at each look (real Valkey and
Kafka): settled minutes are not read again, verdicts not read twice, and a look still sees
every minute and every verdict of the window. A document's outcome is filed under the minute
it started on its path, and a follower sees it there."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

import valkey.asyncio as avalkey

from ragflow_mq.recorder import Recorder, write
from sidecar.config import Settings
from sidecar.dev.local_stack import LocalStack
from sidecar.serve.gate_source import SETTLED_MINUTES, Following, OneLook
from sidecar.transport import KafkaProducer
from sidecar.verdicts.model import VerdictRecord
from sidecar.verdicts.reader import VerdictFollower, VerdictReadStats
from sidecar.wire.contract import ATTRIBUTION_MINUTES, Keys


async def _hgetall_calls(client: avalkey.Valkey) -> int:
    stats = await client.info("commandstats")
    return int(cast(dict[str, Any], stats).get("cmdstat_hgetall", {}).get("calls", 0))


async def test_settled_minutes_are_read_once_and_the_window_stays_whole(
    stack: LocalStack, unique: str, valkey_client: avalkey.Valkey
) -> None:
    ours = Settings.from_env({"REDIS_URL": stack.valkey.url, "SERVE_KEY_PREFIX": unique})
    now_s = time.time()
    minutes = SETTLED_MINUTES + 7
    recorder = Recorder()
    for back in range(minutes):
        recorder.count("kafka", "finished", back + 1, at_s=now_s - 60 * back)
    pipe = valkey_client.pipeline(transaction=False)
    write(pipe, Keys(unique), recorder.drain())
    await pipe.execute()
    following = Following(ours, valkey_client)
    since_s = now_s - 60 * (minutes - 1)
    first, _ = await following.served(since_s, now_s)
    before = await _hgetall_calls(valkey_client)
    again, _ = await following.served(since_s, now_s)
    read = await _hgetall_calls(valkey_client) - before
    # Only the minutes too recent to be settled are read again; the window is still whole.
    assert read == SETTLED_MINUTES
    fresh, _ = await OneLook(ours).served(since_s, now_s)
    totals = [[m["kafka"]["finished"] for m in window] for window in (first, again, fresh)]
    assert totals[0] == totals[1] == totals[2] == list(range(minutes, 0, -1))
    await valkey_client.delete(*await valkey_client.keys(f"{unique}:*"))


async def _record(client: avalkey.Valkey, keys: Keys, recorder: Recorder) -> None:
    pipe = client.pipeline(transaction=False)
    write(pipe, keys, recorder.drain())
    await pipe.execute()


def _fields(raw: dict[bytes, bytes]) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in raw.items()}


async def test_a_documents_outcome_and_retries_are_filed_under_the_minute_it_started(
    stack: LocalStack, unique: str, valkey_client: avalkey.Valkey
) -> None:
    keys = Keys(unique)
    now_s = time.time()
    began_s = now_s - 600
    late_s = now_s - 60 * (ATTRIBUTION_MINUTES + 5)  # started before the horizon
    recorder = Recorder()
    recorder.first("kafka", "started", "doc-a", latency="queue_wait", ms=200.0, at_s=began_s)
    recorder.first("kafka", "started", "doc-old", at_s=late_s)
    recorder.first("redis", "started", "doc-r", at_s=began_s)  # started on the other path
    await _record(valkey_client, keys, recorder)
    # An older build stored '1' for a document's start: its outcome stays in the minute seen.
    await valkey_client.hset(keys.document("doc-legacy"), "kafka:started", "1")
    for document in ("doc-a", "doc-old", "doc-r", "doc-legacy"):
        recorder.first("kafka", "failed", document, at_s=now_s)
        recorder.first("kafka", "finished", document, latency="processing", ms=9000.0, at_s=now_s)
        recorder.of_document("kafka", "retried", document, at_s=now_s)
        recorder.of_document("kafka", "retried", document, at_s=now_s)  # counted every time
        recorder.first("kafka", "failed", document, at_s=now_s)  # a document's first only
    await _record(valkey_client, keys, recorder)

    began = _fields(await valkey_client.hgetall(keys.evidence(int(began_s // 60))))
    seen = _fields(await valkey_client.hgetall(keys.evidence(int(now_s // 60))))
    total = _fields(await valkey_client.hgetall(keys.evidence_total))
    assert began["kafka:document_started"] == 1 and began["redis:document_started"] == 1
    # doc-a's outcome and retries are paired with the minute doc-a started in...
    assert began["kafka:document_failed"] == 1 and began["kafka:document_finished"] == 1
    assert began["kafka:retried"] == 2
    assert began["kafka:document_processing:sum_ms"] == 9000
    # ...the others' (started too long ago, on the other path, or by an older build) with the
    # minute they were seen in; the totals count every one once.
    assert seen["kafka:document_failed"] == 3 and seen["kafka:document_finished"] == 3
    assert seen["kafka:retried"] == 6
    assert total["kafka:document_failed"] == 4 and total["kafka:retried"] == 8
    assert total["kafka:document_processing:sum_ms"] == 4 * 9000
    assert await valkey_client.ttl(keys.evidence(int(began_s // 60))) > 0
    await valkey_client.delete(*await valkey_client.keys(f"{unique}:*"))


async def test_a_follower_sees_an_outcome_filed_under_a_minute_it_read_before(
    stack: LocalStack, unique: str, valkey_client: avalkey.Valkey
) -> None:
    ours = Settings.from_env({"REDIS_URL": stack.valkey.url, "SERVE_KEY_PREFIX": unique})
    keys = Keys(unique)
    now_s = time.time()
    began_s = now_s - 600
    recorder = Recorder()
    recorder.first("kafka", "started", "doc-a", at_s=began_s)
    await _record(valkey_client, keys, recorder)
    following = Following(ours, valkey_client)
    since_s = now_s - 900
    first, _ = await following.served(since_s, now_s)
    assert sum(m["kafka"]["document_failed"] for m in first) == 0
    # Ten minutes after it started, the document fails: filed under its start, which the
    # follower read at its last look and must read again.
    recorder.first("kafka", "failed", "doc-a", at_s=now_s)
    await _record(valkey_client, keys, recorder)
    again, _ = await following.served(since_s, now_s)
    index = int(began_s // 60) - int(since_s // 60)
    assert again[index]["kafka"]["document_failed"] == 1
    assert sum(m["kafka"]["document_failed"] for m in again) == 1
    await valkey_client.delete(*await valkey_client.keys(f"{unique}:*"))


async def test_verdicts_are_read_from_where_the_last_read_stopped(
    settings: Settings, make_topic: Callable[[int], Awaitable[str]], unique: str
) -> None:
    topic = await make_topic(3)
    now_ms = int(time.time() * 1000)

    def verdict(n: int, decided_at_ms: int = now_ms) -> VerdictRecord:
        return VerdictRecord(
            verdict="match", stream=unique, entry_id=f"{now_ms}-{n}", task_id=f"task-{n}",
            task_type="parse", decided_at_ms=decided_at_ms, sidecar="test_gate_source",
        )  # fmt: skip

    async def produce(records: list[VerdictRecord]) -> None:
        async with KafkaProducer(settings.kafka) as producer:
            for record in records:
                await producer.send(topic, record.to_json(), key=record.task_id.encode())

    # One verdict decided before the window, three inside it.
    await produce([verdict(0, now_ms - 3_600_000), verdict(1), verdict(2), verdict(3)])
    follower = VerdictFollower(settings.kafka, now_ms - 1000, topic=topic)
    stats = VerdictReadStats()
    first = await follower.read_new(stats)
    assert sorted(r["task_id"] for r in first) == ["task-1", "task-2", "task-3"]
    # Two more, one of them a verdict read before (a producer's retry): only the new one is
    # returned, and only the two new records are read.
    await produce([verdict(2), verdict(4)])
    stats = VerdictReadStats()
    second = await follower.read_new(stats)
    assert [r["task_id"] for r in second] == ["task-4"]
    assert stats.records == 2 and stats.duplicates == 1 and stats.complete
    stats = VerdictReadStats()
    assert await follower.read_new(stats) == [] and stats.records == 0
