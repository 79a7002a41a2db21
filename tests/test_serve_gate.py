"""``gate`` on evidence made for real: RAGFlow-like processes through ``install()`` and, for the
judged share, the whole sidecar (``ragflow-sidecar run``) beside them."""

from __future__ import annotations

import time
from pathlib import Path

import valkey.asyncio as avalkey

from sidecar.config import Settings
from sidecar.dev.local_stack import LocalStack
from sidecar.serve.gate import collect
from sidecar.serve.gate_checks import HOLD, PROMOTE, ROLLBACK
from sidecar.transport.topics import init_topics
from sidecar.wire.contract import Keys
from tests.ragflow_support import read_produced, wait_until
from tests.serve_support import ServeWorld, by_path, make_world

# Test-sized: tens of documents a path. The margins are the harm to all documents at 100 %;
# tens of documents bound a failure rate to tens of points (tests/test_margins.py has the
# defaults'). Queue waits here are milliseconds, which vary by multiples from run to run: at 32
# Kafka documents a clean run's bound on their ratio came out x3.92 once, so its margin is x5.
GATE = {
    "GATE_MIN_DOCUMENTS": "20",
    "GATE_MIN_VERDICTS": "100",
    "GATE_FAILED_MARGIN_POINTS": "60",
    "GATE_PROCESSING_MARGIN_RATIO": "3",
    "GATE_QUEUE_WAIT_MARGIN_RATIO": "5",
}


async def _queue(world: ServeWorld, name: str, docs: int, tasks_per_doc: int) -> set[str]:
    # At a pace the two executors keep up with, as a healthy RAGFlow runs: a burst queued at
    # once waits seconds in either path's backlog, and the gate compares those queue waits
    # (they differ by how each path's backlog drains, which a clean run must not be judged on).
    api, out = world.api(name, docs=docs, tasks_per_doc=tasks_per_doc, rate=100)
    with api:
        assert await api.await_exit(180) == 0, api.log_text()
    return {str(p["task_id"]) for p in read_produced(out)}


async def test_gate_holds_below_the_sample_then_promotes_a_clean_run(
    stack: LocalStack, unique: str, tmp_path: Path, valkey_client: avalkey.Valkey
) -> None:
    world = await make_world(stack, unique, tmp_path, KAFKA_SERVE_PERCENT="50")
    settings = world.settings(**GATE)
    await init_topics(settings.kafka)  # the verdicts topic
    since_ms = int(time.time() * 1000)
    with (
        world.sidecar(tmp_path / "sidecar.log"),
        world.executor("task_executor_common_g_0"),
        world.executor("task_executor_common_g_1"),
    ):
        await world.wait_members(2)
        first = await _queue(world, "first.jsonl", docs=4, tasks_per_doc=5)
        await world.wait_executed(valkey_client, first)
        await _wait_judged(settings, since_ms, 1)
        report = await collect(settings, since_ms, int(time.time() * 1000) + 60_000)
        assert report.decision == HOLD, report.reasons
        assert any("judged" in reason for reason in report.reasons), report.reasons

        more = await _queue(world, "more.jsonl", docs=60, tasks_per_doc=10)
        records = await world.wait_executed(valkey_client, first | more)
        redis_tasks = by_path(records)["redis"]
        assert redis_tasks >= 100, "too few judged tasks for the gate's sample"
        await _wait_judged(settings, since_ms, redis_tasks)
        keys = Keys(unique)

        await _wait_flushed(valkey_client, keys, len(first | more))
        report = await collect(settings, since_ms, int(time.time() * 1000) + 60_000)
    assert report.judged.match_percent == 100.0, report.judged.kinds
    assert report.decision == PROMOTE, report.reasons


async def test_gate_rolls_back_when_the_kafka_path_fails_five_percent(
    stack: LocalStack, unique: str, tmp_path: Path, valkey_client: avalkey.Valkey
) -> None:
    world = await make_world(
        stack, unique, tmp_path, KAFKA_SERVE_PERCENT="50", STANDIN_FAIL_KAFKA_PERCENT="5"
    )
    settings = world.settings(**GATE)
    await init_topics(settings.kafka)
    since_ms = int(time.time() * 1000)
    with world.executor("task_executor_common_f_0"), world.executor("task_executor_common_f_1"):
        await world.wait_members(2)
        ids = await _queue(world, "produced.jsonl", docs=100, tasks_per_doc=10)
        records = await world.wait_executed(valkey_client, ids)
        keys = Keys(unique)

        await _wait_flushed(valkey_client, keys, len(ids))
    report = await collect(settings, since_ms, int(time.time() * 1000) + 60_000)
    kafka = report.served["kafka"]
    assert kafka["failed"] > 0 and report.served["redis"]["failed"] == 0
    assert kafka["finished"] == by_path(records)["kafka"]
    rate = kafka.failure_rate()
    assert rate is not None and 0.02 < rate < 0.10, rate
    assert report.decision == ROLLBACK, report.reasons
    assert any("kafka fails" in reason for reason in report.reasons), report.reasons


async def _wait_judged(settings: Settings, since_ms: int, count: int) -> None:
    async def judged() -> bool:
        report = await collect(settings, since_ms, int(time.time() * 1000) + 60_000)
        return report.judged.judged >= count

    await wait_until(judged, 120, interval_s=1.0, what=f"{count} verdicts")


async def _wait_flushed(client: avalkey.Valkey, keys: Keys, finished: int) -> None:
    """Evidence is written every SERVE_EVIDENCE_FLUSH_S by each process."""

    async def flushed() -> bool:
        totals = await client.hgetall(keys.evidence_total)
        done = sum(int(totals.get(f"{p}:finished".encode(), 0)) for p in ("kafka", "redis"))
        return done >= finished

    await wait_until(flushed, 30, what="the evidence flushed")
