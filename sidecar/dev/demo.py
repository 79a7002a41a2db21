"""``make demo``: the sidecar beside a pretend RAGFlow on the local stack.

Starts real Valkey and Kafka, creates the topics, and then, as RAGFlow would, enqueues
RAGFlow-shaped tasks of every kind (some at priority 1, plus a few broken entries) while a
RAGFlow-like worker consumes them in RAGFlow's own group. The whole sidecar (mirror, shadow
consumer, worker observer, judge) runs in this process at ``KAFKA_TRAFFIC_PERCENT`` (default
50 here), with a live progress line, and the demo ends with a summary table and sample diffs.
``--inject-faults`` changes, drops or doubles a few Kafka copies so that every verdict kind
shows up.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
import uuid
from collections import Counter
from typing import Any

import valkey.asyncio as valkey

from sidecar.app.service import Sidecar
from sidecar.cli.diffs import render_diffs
from sidecar.cli.roundtrip import round_trip
from sidecar.config import Settings
from sidecar.dev.faults import FaultInjector
from sidecar.dev.local_stack import LocalStack
from sidecar.dev.local_stack.stack import TRACES_ENDPOINT
from sidecar.dev.samples import ragflow_tasks
from sidecar.observer.observer import RAGFLOW_GROUP
from sidecar.transport.topics import init_topics
from sidecar.verdicts.reader import read_verdicts

STREAMS = ("te.1.common", "te.0.common")
BROKEN_ENTRIES: tuple[dict[bytes, bytes], ...] = (
    {b"message": b"{not json"},
    {b"message": b'{"doc_id": "no id"}'},
    {b"payload": b"no message field"},
)
FAULT_PERCENT = 3.0
DEADLINE_S = 180.0


async def _produce(
    client: valkey.Valkey, tasks: list[dict[str, Any]], rate: int, summary: _Summary
) -> None:
    """RAGFlow's API server: XADD each task, one in ten at priority 1, at ``rate`` per second,
    counted in ``summary.produced`` as it goes (the live line reads it)."""
    started = time.monotonic()
    for n, task in enumerate(tasks):
        stream = STREAMS[0] if n % 10 == 0 else STREAMS[1]
        await client.xadd(stream, {"message": json.dumps(task)})
        summary.produced += 1
        delay = started + (n + 1) / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
    for fields in BROKEN_ENTRIES:
        await client.xadd(STREAMS[1], fields)
        summary.produced += 1


async def _ragflow_worker(client: valkey.Valkey, done: asyncio.Event, name: str) -> int:
    """RAGFlow's executor: XREADGROUP COUNT 1 (priority stream first), work a little, XACK."""
    handled = 0
    while not done.is_set():
        got = False
        for stream in STREAMS:
            reply = await client.xreadgroup(RAGFLOW_GROUP, name, {stream: ">"}, count=1)
            for _, entries in reply or []:
                for entry_id, _fields in entries:
                    await asyncio.sleep(random.uniform(0, 0.004))
                    await client.xack(stream, RAGFLOW_GROUP, entry_id)
                    handled += 1
                    got = True
            if got:
                break
        if not got:
            await asyncio.sleep(0.05)
    return handled


def _progress(sidecar: Sidecar, produced: int) -> str:
    assert sidecar.mirror is not None
    stats, verdicts = sidecar.mirror.stats, sidecar.judge.stats.verdicts
    kinds = " ".join(f"{kind} {count}" for kind, count in sorted(verdicts.items()))
    return (
        f"produced {produced:5}  mirrored {sum(stats.mirrored.values()):5}  "
        f"skipped {sum(stats.skipped.values()):5}  verdicts {sum(verdicts.values()):5} ({kinds})"
    )


async def run_demo(
    stack: LocalStack, tasks: int = 2000, *, inject_faults: bool = False, rate: int = 500
) -> int:
    """The demo on a started stack; returns the exit code."""
    run_id = uuid.uuid4().hex[:8]
    # Tracing as the shell says (OTEL_*), and to the stack's Jaeger when it has one.
    tracing = {name: value for name, value in os.environ.items() if name.startswith("OTEL_")}
    if stack.jaeger is not None:
        tracing[TRACES_ENDPOINT] = stack.jaeger.otlp_grpc_endpoint
    settings = Settings.from_env(
        {
            **tracing,
            "REDIS_URL": stack.valkey.url,
            "KAFKA_BOOTSTRAP_SERVERS": stack.kafka.bootstrap_servers,
            "MIRROR_START": "earliest",
            "MIRROR_BLOCK_MS": "200",
            "KAFKA_TRAFFIC_PERCENT": os.environ.get("KAFKA_TRAFFIC_PERCENT", "50"),
            # A demo run of its own: the stack and its topics may hold earlier runs.
            "MIRROR_GROUP": f"demo_mirror_{run_id}",
            "SHADOW_GROUP": f"demo-shadow-{run_id}",
            "SHADOW_START": "latest",
            "SIDECAR_INSTANCE": f"demo-{run_id}",
            "SHADOW_COMPARE_TIMEOUT_S": "20",
            "OBSERVER_INTERVAL_MS": "200",
            "SIDECAR_METRICS_PORT": "0",
        }
    )
    for line in (await init_topics(settings.kafka)).lines():
        print(line)
    for backend in ("redis", "kafka"):
        trip = await round_trip(settings, backend)
        print(f"round trip through {backend}: {'byte-identical' if trip.identical else 'DIFF'}")

    client = valkey.Valkey(**settings.redis.client_kwargs())
    injector = FaultInjector.share(FAULT_PERCENT, seed=run_id) if inject_faults else None
    try:
        # The local stack is ours: start from empty streams, as a fresh RAGFlow would.
        await client.delete(*STREAMS)
        for stream in STREAMS:
            await client.xgroup_create(stream, RAGFLOW_GROUP, id="0", mkstream=True)
        percent = settings.mirror.traffic_percent
        print(
            f"sidecar at {percent:g}% to Kafka{', injecting faults' if inject_faults else ''}; "
            f"{tasks} RAGFlow tasks at {rate}/s and {len(BROKEN_ENTRIES)} broken entries"
        )
        summary = await _run(settings, client, ragflow_tasks(tasks), rate, injector)
    finally:
        await client.aclose()
    print(summary.table())
    mismatches = await read_verdicts(
        settings.kafka, since_ms=summary.started_ms, verdicts={"mismatch"}, task_types=None
    )
    mine = [r for r in mismatches if r.get("sidecar") == settings.shadow.instance][:3]
    if mine:
        print("sample diffs:")
        print(render_diffs(mine, color=sys.stdout.isatty()))
    return 0 if summary.ok(inject_faults) else 1


class _Summary:
    def __init__(self, started_ms: int) -> None:
        self.started_ms = started_ms
        self.produced = 0
        self.ragflow_handled = 0
        self.mirrored: Counter[str] = Counter()
        self.skipped = 0
        self.dead_lettered: Counter[str] = Counter()
        self.verdicts: Counter[str] = Counter()
        self.injected: Counter[str] = Counter()
        self.elapsed_s = 0.0

    def ok(self, inject_faults: bool) -> bool:
        finals = sum(self.verdicts.values()) - self.verdicts["duplicate"]
        entries = sum(self.mirrored.values()) + self.injected["drop"] - self.injected["duplicate"]
        if finals != entries:
            return False
        if inject_faults:
            caught = ("mismatch", "missing_in_kafka", "duplicate")
            return all(self.verdicts[kind] for kind in caught if self.injected)
        return set(self.verdicts) <= {"match"}

    def table(self) -> str:
        rows = [
            ("produced (XADD on te.*.common)", self.produced),
            ("handled by the RAGFlow-like worker", self.ragflow_handled),
            *((f"mirrored to {topic}", n) for topic, n in sorted(self.mirrored.items())),
            ("skipped (outside the traffic share)", self.skipped),
            *((f"dead-lettered: {reason}", n) for reason, n in sorted(self.dead_lettered.items())),
            *((f"faults injected: {kind}", n) for kind, n in sorted(self.injected.items())),
            *((f"verdict {kind}", n) for kind, n in sorted(self.verdicts.items())),
        ]
        width = max(len(label) for label, _ in rows)
        lines = [f"  {label:<{width}}  {count:>7,}" for label, count in rows]
        return "\n".join(["summary:", *lines, f"  {'elapsed':<{width}}  {self.elapsed_s:>6.1f}s"])


async def _run(
    settings: Settings,
    client: valkey.Valkey,
    tasks: list[dict[str, Any]],
    rate: int,
    injector: FaultInjector | None,
) -> _Summary:
    summary = _Summary(int(time.time() * 1000))
    started = time.monotonic()
    stop, workers_done = asyncio.Event(), asyncio.Event()
    async with Sidecar(settings, transform=injector) as sidecar:
        assert sidecar.shadow is not None and sidecar.mirror is not None
        await sidecar.shadow.wait_ready()
        loops = asyncio.create_task(sidecar.run(stop), name="demo-sidecar")
        producer = asyncio.create_task(_produce(client, tasks, rate, summary), name="demo-producer")
        workers = [
            asyncio.create_task(_ragflow_worker(client, workers_done, f"task_executor_demo_{n}"))
            for n in range(2)
        ]
        try:
            while time.monotonic() - started < DEADLINE_S and not loops.done():
                await asyncio.sleep(0.5)
                print(f"\r{_progress(sidecar, summary.produced)}", end="", flush=True)
                stats = sidecar.mirror.stats
                faults = injector.injected if injector else Counter[str]()
                expected = sum(stats.mirrored.values()) + faults["drop"] - faults["duplicate"]
                finals = sum(sidecar.judge.stats.verdicts.values())
                finals -= sidecar.judge.stats.verdicts["duplicate"]
                if producer.done() and stats.read >= summary.produced and finals >= expected:
                    break
            print()
        finally:
            stop.set()
            workers_done.set()
            summary.ragflow_handled = sum(await asyncio.gather(*workers))
            await producer
            await asyncio.wait_for(loops, timeout=60)
        summary.mirrored = Counter(sidecar.mirror.stats.mirrored)
        summary.skipped = sum(sidecar.mirror.stats.skipped.values())
        summary.dead_lettered = Counter(sidecar.mirror.stats.dead_lettered)
        summary.verdicts = Counter(sidecar.judge.stats.verdicts)
        summary.injected = Counter(injector.injected) if injector else Counter()
    summary.elapsed_s = time.monotonic() - started
    return summary
