"""Mirror throughput and latency, measured side by side in one run on a local stack.

1. Sustained rate: the mirror versus a bare loop with the same clients (XREADGROUP COUNT 500 ->
   aiokafka batch produce -> one XACK), each draining an identical pre-filled stream; they are
   run alternately, three times each, and the best of each is compared. Target: ratio >= 0.8.
   The bare loop runs twice per round: with aiokafka's defaults (the issue's baseline), and with
   the mirror's own key partitioner (``sidecar.transport.partitioner``, same placement, half the
   cost), so the second ratio shows the mirror's own per-task overhead with that saving taken out.
2. Backlog drain: MIRROR_START=earliest over a stream of --backlog entries (default 1,000,000).
3. Latency: XADD (entry id time) to Kafka's ack, p50 and p99, with tasks arriving at --rate/s.

Usage: .venv/bin/python bench/mirror_throughput.py [--entries 200000] [--backlog 1000000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

import valkey
import valkey.asyncio as avalkey
from aiokafka import AIOKafkaProducer
from bench_common import alternating, bench_stack, loadavg, mirror_rate

from sidecar.app.wiring import running_mirror
from sidecar.cli.roundtrip import sample_parse_task
from sidecar.config import Settings
from sidecar.dev.local_stack import LocalStack
from sidecar.transport.message import encode_task
from sidecar.transport.partitioner import KeyPartitioner
from sidecar.transport.topics import PARSE_TOPIC, init_topics

BATCH = 500


def task() -> bytes:
    return encode_task(sample_parse_task())


def fill(url: str, stream: str, count: int) -> None:
    client = valkey.Valkey.from_url(url)
    for start in range(0, count, 5000):
        pipe = client.pipeline(transaction=False)
        for _ in range(min(5000, count - start)):
            pipe.xadd(stream, {"message": task()})
        pipe.execute()
    client.close()


async def bare_loop(
    settings: Settings, stream: str, count: int, *, fast_partitioner: bool = False
) -> float:
    """The least a mirror can do with these clients; returns entries per second.

    It parses each task and sends the same key and headers the mirror must send (the issue's
    record shape), so the ratio measures the mirror's own overhead, not the record format's.
    """
    client = avalkey.Valkey(**settings.redis.client_kwargs())
    await client.xgroup_create(stream, "bare", id="0")
    producer = AIOKafkaProducer(
        **settings.kafka.client_kwargs(),
        acks="all",
        enable_idempotence=True,
        compression_type=settings.kafka.compression_type,
        linger_ms=settings.kafka.linger_ms,
        **({"partitioner": KeyPartitioner()} if fast_partitioner else {}),
    )
    await producer.start()
    stream_name = stream.encode()
    stream_source = b"redis:" + stream_name
    done = 0
    started = time.perf_counter()
    while done < count:
        reply = await client.xreadgroup("bare", "b1", {stream: ">"}, count=BATCH, block=1000)
        entries = reply[0][1] if reply else []
        futures = []
        for entry_id, fields in entries:
            value = fields[b"message"]
            doc = json.loads(value)  # routing needs the task, as the mirror's does
            headers = [
                ("x-task-type", b"parse"),
                ("x-task-id", doc["id"].encode()),
                ("x-tenant-id", b""),
                ("x-priority", b"0"),
                ("x-source", stream_source),
                ("x-timestamp", entry_id.split(b"-")[0]),
                ("x-retry-count", b"0"),
                ("x-schema-version", b"1"),
                ("x-redis-stream", stream_name),
                ("x-redis-id", entry_id),
            ]
            futures.append(
                await producer.send(PARSE_TOPIC, value, key=doc["doc_id"].encode(), headers=headers)
            )
        await asyncio.gather(*futures)
        if entries:
            await client.xack(stream, "bare", *[entry_id for entry_id, _ in entries])
        done += len(entries)
    elapsed = time.perf_counter() - started
    await producer.stop()
    await client.aclose()
    return count / elapsed


def mirror_settings(stack: LocalStack, stream: str) -> Settings:
    return Settings.from_env(
        {
            "REDIS_URL": stack.valkey.url,
            "KAFKA_BOOTSTRAP_SERVERS": stack.kafka.bootstrap_servers,
            "MIRROR_STREAMS": stream,
            "MIRROR_START": "earliest",
            "MIRROR_BATCH": str(BATCH),
            "MIRROR_BLOCK_MS": "200",
        }
    )


async def latency(stack: LocalStack, rate: int, seconds: int) -> list[int]:
    stream = f"bench.latency.{uuid.uuid4().hex[:6]}"
    url = stack.valkey.url
    total = rate * seconds

    def paced() -> None:
        client = valkey.Valkey.from_url(url)
        started = time.perf_counter()
        for n in range(total):
            delay = started + n / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            client.xadd(stream, {"message": task()})
        client.close()

    valkey.Valkey.from_url(url).xadd(stream, {"message": task()})  # the stream must exist
    settings = mirror_settings(stack, stream)
    stop = asyncio.Event()
    async with running_mirror(settings) as mirror:
        running = asyncio.create_task(mirror.run(stop))
        writer = threading.Thread(target=paced)
        writer.start()
        while mirror.stats.read < total + 1:  # noqa: ASYNC110 - polls a counter
            await asyncio.sleep(0.01)
        stop.set()
        await running
        writer.join()
        return list(mirror.stats.latency_ms)[1:]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=200_000)
    parser.add_argument("--backlog", type=int, default=1_000_000)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=int, default=15)
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="sidecar-bench-"))
    stack = bench_stack(root)
    stack.up()
    try:
        base = mirror_settings(stack, "unused")
        await init_topics(base.kafka)
        kinds = ("bare", "bare+partitioner", "mirror")
        rates: dict[str, list[float]] = {kind: [] for kind in kinds}
        for round_no, kind in alternating(3, kinds):
            stream = f"bench.{kind}.{round_no}"
            fill(stack.valkey.url, stream, args.entries)
            if kind == "mirror":
                rate = await mirror_rate(mirror_settings(stack, stream), args.entries)
            else:
                rate = await bare_loop(base, stream, args.entries, fast_partitioner=kind != "bare")
            rates[kind].append(rate)
            print(f"round {round_no + 1} {kind:16}: {rate:10,.0f} entries/s "
                  f"(load {loadavg()})", flush=True)  # fmt: skip
        bare, fast, mirror = (max(rates[kind]) for kind in kinds)
        print(
            f"sustained: bare loop {bare:,.0f}/s, mirror {mirror:,.0f}/s, ratio {mirror / bare:.2f}"
            f" (target >= 0.8)"
        )
        print(
            f"mirror overhead alone: bare loop with the mirror's partitioner {fast:,.0f}/s, "
            f"ratio {mirror / fast:.2f}"
        )

        fill(stack.valkey.url, "bench.backlog", args.backlog)
        started = time.perf_counter()
        await mirror_rate(mirror_settings(stack, "bench.backlog"), args.backlog)
        drain_s = time.perf_counter() - started
        print(f"backlog: {args.backlog:,} entries drained in {drain_s:.1f} s "
              f"({args.backlog / drain_s:,.0f}/s; load {loadavg()})", flush=True)  # fmt: skip

        samples = sorted(await latency(stack, args.rate, args.seconds))
        p50 = statistics.median(samples)
        p99 = samples[int(len(samples) * 0.99) - 1]
        print(f"latency at {args.rate}/s over {len(samples):,} tasks: p50 {p50:.0f} ms, "
              f"p99 {p99:.0f} ms (XADD to Kafka ack; load {loadavg()})")  # fmt: skip
    finally:
        stack.down()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
